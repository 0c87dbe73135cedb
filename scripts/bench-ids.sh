#!/usr/bin/env bash
# The idctl bench matrix behind BENCHMARKS.md, in one run on one fresh local quorum:
# direct fast (combining rounds when contended, the default) vs fast with every request
# in its own rounds (--combine never, the baseline) vs classic at 1/16/64 clients, then
# direct vs broker (--serve window, the default, and --serve rounds, two idbrokers) at
# 1/64/256 callers, single IDs and ranges of 1000. Prints one markdown table row per run,
# writes every run as one JSON line to OUT.jsonl and the single-ID runs as an SVG chart
# of IDs/s against callers to OUT.svg (`idctl chart`).
# Usage: scripts/bench-ids.sh [SECONDS [OUT]]   (default 5 s per run, OUT bench-ids)
set -euo pipefail
secs="${1:-5}"
out_prefix="${2:-bench-ids}"
bin="${CARGO_TARGET_DIR:-/var/tmp/qlist-target}/release"
dir=$(mktemp -d)
broker_pid=""
rounds_pid=""
cleanup() {
  [ -n "$broker_pid" ] && kill -TERM "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
  [ -n "$rounds_pid" ] && kill -TERM "$rounds_pid" 2>/dev/null && wait "$rounds_pid" 2>/dev/null
  "$bin/idctl" cluster down --dir "$dir/q" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
port=17501
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 10)); done
nodes=$("$bin/idctl" cluster up --dir "$dir/q" --nodes 5 --base-port "$port" 2>/dev/null)
# Starts an idbroker with args $@ in the background; sets started_pid and started_addr.
start_broker() {
  local name=$1; shift
  "$bin/idbroker" --listen 127.0.0.1:0 --nodes "$nodes" "$@" >"$dir/$name.out" 2>"$dir/$name.log" &
  started_pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$dir/$name.out" && break; sleep 0.1; done
  started_addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$dir/$name.out" | head -n 1)
  if [ -z "$started_addr" ]; then
    echo "bench-ids: idbroker $* did not start:" >&2; cat "$dir/$name.log" >&2
    kill -TERM "$started_pid" 2>/dev/null || true
    exit 1
  fi
}
start_broker window --serve window
broker_pid=$started_pid broker=$started_addr
# Its own register key, so the two brokers never take IDs from each other's windows.
start_broker rounds --serve rounds --key bench-rounds
rounds_pid=$started_pid rounds_broker=$started_addr
jsonl="$out_prefix.jsonl"
: >"$jsonl"

echo "| mode | protocol | callers | count | IDs/s | requests/s | p50 us | p99 us | max us | holes % | errors | mean batch | mean round us |"
echo "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
# The cumulative counters of broker $1 as "requests rounds total_round_us".
counters() {
  "$bin/idctl" broker-stats "$1" 2>/dev/null | tail -n 1 | awk '{
    gsub(/[{}"]/, ""); split($0, kv, ",");
    for (i in kv) { split(kv[i], f, ":"); v[f[1]] = f[2] }
    printf "%d %d %d\n", v["requests"], v["rounds"], v["rounds"] * v["mean_round_us"] }'
}
row() { # mode protocol callers count args...; broker rows name their broker with --broker
  local mode=$1 proto=$2 callers=$3 count=$4; shift 4
  local before after stats="$broker" series
  case "$mode" in
    "broker rounds") stats="$rounds_broker" ;;
  esac
  case "$mode" in
    direct) series="direct $proto" ;;
    *) series="$mode" ;;
  esac
  before=$(counters "$stats")
  out=$("$bin/idctl" bench "$@" --clients "$callers" --count "$count" --seconds "$secs" 2>/dev/null | tail -n 1)
  after=$(counters "$stats")
  echo "$out" | awk -v s="$series" '{ sub(/^[{]/, ""); printf "{\"series\":\"%s\",%s\n", s, $0 }' >>"$jsonl"
  echo "$out" | awk -v m="$mode" -v p="$proto" -v c="$callers" -v n="$count" -v b="$before" -v a="$after" '{
      split(b, x, " "); split(a, y, " "); rounds = y[2] - x[2]
      broker = (m ~ /^broker/ && rounds > 0)
      batch = broker ? sprintf("%.1f", (y[1] - x[1]) / rounds) : ""
      round = broker ? sprintf("%d", (y[3] - x[3]) / rounds) : ""
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
    row "broker window" fast "$callers" "$count" --broker "$broker"
    row "broker rounds" fast "$callers" "$count" --broker "$rounds_broker"
  done
done
"$bin/idctl" chart --in "$jsonl" --out "$out_prefix.svg" --count 1 \
  --title "Single IDs per second by concurrent callers ($secs s per run)"
echo
echo "runs: $jsonl; chart: $out_prefix.svg"
echo
echo "broker counters after the run (--serve window, then --serve rounds):"
"$bin/idctl" broker-stats "$broker" 2>/dev/null | head -n 20
"$bin/idctl" broker-stats "$rounds_broker" 2>/dev/null | head -n 20
