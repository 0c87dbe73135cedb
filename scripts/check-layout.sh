#!/usr/bin/env bash
# The layout rules README.md ("Layout") states, checked (run by `make lint`):
# - qformat, the on-disk layout, links neither RocksDB nor an object store;
# - qstore builds on qformat only (no RocksDB, no sublist);
# - no crate but qformat builds or parses a sublist's or a run's name.
# Each check prints what breaks the rule; the script exits 1 if any does.
set -uo pipefail
cd "$(dirname "$0")/.."
fail=0
check() {
  local what="$1" found="$2"
  if [ -n "$found" ]; then
    echo "check-layout: $what:" >&2
    echo "$found" >&2
    fail=1
  fi
}
tree() {
  cargo tree --offline -p "$1" -e normal 2>/dev/null || cargo tree -p "$1" -e normal
}
q=$(tree qformat) || { echo "check-layout: cargo tree -p qformat failed" >&2; exit 1; }
check "qformat links RocksDB or an object store" "$(grep -E 'rocksdb|object_store' <<<"$q")"
s=$(tree qstore) || { echo "check-layout: cargo tree -p qstore failed" >&2; exit 1; }
check "qstore links RocksDB or sublist" "$(grep -E 'rocksdb|sublist' <<<"$s")"
names=$(grep -rnE --include=*.rs '"shard-"|"\.creating-"|shard-\{|"\.bin"\)|"\.checkpoint"|"\.seg"' \
  */src benches | grep -v '^qformat/')
check "a sublist's, run's, checkpoint's or segment's name built or parsed outside qformat" "$names"
[ $fail -eq 0 ] && echo "check-layout: ok"
exit $fail
