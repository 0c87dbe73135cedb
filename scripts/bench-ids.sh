#!/usr/bin/env bash
# The idctl bench matrix behind BENCHMARKS.md, in one run on one fresh local quorum:
# direct fast (combining rounds when contended, the default) vs fast with every request
# in its own rounds (--combine never, the baseline) vs classic at 1/16/64 clients, then
# direct vs broker at 1/64/256 callers, single IDs and ranges of 1000. Prints one
# markdown table row per run.
# Usage: scripts/bench-ids.sh [SECONDS]   (default 5 per run)
set -euo pipefail
secs="${1:-5}"
bin="${CARGO_TARGET_DIR:-/var/tmp/qlist-target}/release"
dir=$(mktemp -d)
broker_pid=""
cleanup() {
  [ -n "$broker_pid" ] && kill -TERM "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
  "$bin/idctl" cluster down --dir "$dir/q" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
port=17501
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 10)); done
nodes=$("$bin/idctl" cluster up --dir "$dir/q" --nodes 5 --base-port "$port" 2>/dev/null)
"$bin/idbroker" --listen 127.0.0.1:0 --nodes "$nodes" >"$dir/broker.out" 2>"$dir/broker.log" &
broker_pid=$!
for _ in $(seq 100); do grep -q "listening on" "$dir/broker.out" && break; sleep 0.1; done
broker=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$dir/broker.out" | head -n 1)

echo "| mode | protocol | callers | count | IDs/s | requests/s | p50 us | p99 us | max us | holes % | errors | mean batch | mean round us |"
echo "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
# The broker's cumulative counters as "requests rounds total_round_us".
counters() {
  "$bin/idctl" broker-stats "$broker" 2>/dev/null | tail -n 1 | awk '{
    gsub(/[{}"]/, ""); split($0, kv, ",");
    for (i in kv) { split(kv[i], f, ":"); v[f[1]] = f[2] }
    printf "%d %d %d\n", v["requests"], v["rounds"], v["rounds"] * v["mean_round_us"] }'
}
row() { # mode protocol callers count args...
  local mode=$1 proto=$2 callers=$3 count=$4; shift 4
  local before after
  before=$(counters)
  out=$("$bin/idctl" bench "$@" --clients "$callers" --count "$count" --seconds "$secs" 2>/dev/null | tail -n 1)
  after=$(counters)
  echo "$out" | awk -v m="$mode" -v p="$proto" -v c="$callers" -v n="$count" -v b="$before" -v a="$after" '{
      split(b, x, " "); split(a, y, " "); rounds = y[2] - x[2]
      batch = (m == "broker" && rounds > 0) ? sprintf("%.1f", (y[1] - x[1]) / rounds) : ""
      round = (m == "broker" && rounds > 0) ? sprintf("%d", (y[3] - x[3]) / rounds) : ""
      gsub(/[{}"]/, ""); split($0, kv, ",");
      for (i in kv) { split(kv[i], f, ":"); v[f[1]] = f[2] }
      printf "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %.3f | %d | %s | %s |\n", m, p, c, n, v["ids_per_sec"], v["requests_per_sec"], v["p50_us"], v["p99_us"], v["max_us"], v["holes_pct"], v["errors"], batch, round }'
}
for callers in 1 16 64; do
  row direct fast "$callers" 1 --nodes "$nodes"
  row direct "fast, uncombined" "$callers" 1 --nodes "$nodes" --combine never
  row direct classic "$callers" 1 --nodes "$nodes" --classic
done
for count in 1 1000; do
  for callers in 1 64 256; do
    row direct fast "$callers" "$count" --nodes "$nodes"
    row broker fast "$callers" "$count" --broker "$broker"
  done
done
echo
echo "broker counters after the run:"
"$bin/idctl" broker-stats "$broker" 2>/dev/null | head -n 20
