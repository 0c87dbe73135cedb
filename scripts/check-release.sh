#!/usr/bin/env bash
# What a release build must be, checked on the built files in $CARGO_TARGET_DIR/release
# (default /var/tmp/qlist-target):
#
#   - no binary carries the test hooks (the stall points and window mutants the tests
#     switch on with the `test-hooks` feature): `--version` says "test hooks" in a build
#     that has them (merger::VERSION, producer::VERSION, broker::VERSION);
#   - merger links no ID client: no `idclient::` symbol in the file, and no path from
#     merger to idclient in the workspace's dependency graph (`cargo tree`, all features
#     of a `--workspace` build unified).
#
#   bash scripts/check-release.sh            # after `cargo build --release --workspace --bins`
#   bash scripts/check-release.sh --hooked   # after `cargo test`: the test builds must have
#                                            # the hooks (shows the check can see them)
#
# `cargo test` builds the binaries with the hooks and leaves them in target/release, so
# `make build` (and `make test` before its demo) runs `cargo build` again, which links the
# release binaries back into place, then this check. Prints cargo's "test result:" line,
# which CI counts; exits 1 when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-/var/tmp/qlist-target}/release"
want=clean
case "${1:-}" in
  "") ;;
  --hooked) want=hooked ;;
  *) echo "usage: $0 [--hooked]" >&2; exit 2 ;;
esac

passed=0
failed=0
ok() { echo "check-release: ok: $*"; passed=$((passed + 1)); }
bad() { echo "check-release: FAILED: $*" >&2; failed=$((failed + 1)); }

# hooked_binary NAME: the newest test build of NAME (cargo test's deps/NAME-<hash> whose
# --version says "test hooks"), else nothing.
hooked_binary() {
  local f
  for f in $(ls -t "$bin"/deps/"$1"-* 2>/dev/null); do
    [[ $f == *.d ]] && continue
    [ -x "$f" ] || continue
    if "$f" --version 2>/dev/null | grep -q 'test hooks'; then
      echo "$f"
      return
    fi
  done
}

for b in idbroker producer merger idctl; do
  f="$bin/$b"
  if [ ! -x "$f" ]; then
    bad "$f is missing: run 'cargo build --release --workspace --bins' first"
    continue
  fi
  if ! v=$("$f" --version 2>&1); then
    bad "$f --version failed: $v"
    continue
  fi
  if [ "$want" = clean ]; then
    case "$v" in
      *"test hooks"*) bad "$f carries the test hooks ('$v'): run 'cargo build --release --workspace --bins' to put the release build back" ;;
      *) ok "$b has no test hooks ($v)" ;;
    esac
  elif [ "$b" != idctl ]; then
    h=$(hooked_binary "$b")
    if [ -n "$h" ]; then ok "the test build of $b has the hooks and says so ($h)"; else bad "no test build of $b says it has the test hooks: the check could not see them"; fi
  fi
done

if [ "$want" = clean ] && [ -x "$bin/merger" ]; then
  n=$(strings -a "$bin/merger" | grep -c 'idclient::')
  if [ "$n" -eq 0 ]; then ok "merger holds no idclient:: symbol"; else bad "merger holds $n idclient:: symbols: it links the ID client"; fi
  n=$(strings -a "$bin/producer" | grep -c 'idclient::')
  if [ "$n" -gt 0 ]; then ok "producer holds idclient:: symbols ($n): the symbol check can see the client"; else bad "producer holds no idclient:: symbol: the symbol check sees nothing"; fi
  if paths=$(cargo tree --offline --workspace --edges normal,build --invert idclient --prefix none 2>&1); then
    if grep -q '^merger ' <<<"$paths"; then
      bad "merger depends on idclient in a --workspace build: $(grep -v '^$' <<<"$paths" | sort -u | tr '\n' ' ')"
    else
      ok "no path from merger to idclient (cargo tree --invert idclient: $(awk '{print $1}' <<<"$paths" | sort -u | tr '\n' ' '))"
    fi
  else
    bad "cargo tree failed: $paths"
  fi
fi

echo "test result: $([ "$failed" -eq 0 ] && echo ok || echo FAILED). $passed passed; $failed failed; 0 ignored (scripts/check-release.sh${1:+ $1})"
[ "$failed" -eq 0 ]
