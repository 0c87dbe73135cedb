#!/usr/bin/env bash
# Window serving vs rounds vs direct, in one run on one fresh local 5-node quorum (the
# matrix behind BENCHMARKS.md, "Window serving and client coalescing"): two idbrokers on
# the same nodes, one `--serve window`, one `--serve rounds`, and direct clients
# (`idctl bench --nodes`), at 1/64/256 callers (and 1024 as 4 idctl processes of 256),
# single IDs and ranges of 1000. Each row also gives the CPU used during it (% of one
# core, from /proc/<pid>/stat and /usr/bin/time) by the broker, the five redis-servers
# together, and the bench client(s), and the broker's wire requests per second (client
# coalescing: callers per wire request = requests/s / wire req/s). `rounds-single` is the
# rounds broker with a client that does not coalesce (`--in-flight 0`), as the rounds
# broker was measured before coalescing. The 1024 rows give the broker's own holes count
# (one bench process would count the other processes' IDs as its holes).
# Usage: scripts/bench-window.sh [SECONDS]   (default 5 per run)
set -euo pipefail
secs="${1:-5}"
bin="${CARGO_TARGET_DIR:-/var/tmp/qlist-target}/release"
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  "$bin/idctl" cluster down --dir "$dir/q" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
port=17601
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 10)); done
nodes=$("$bin/idctl" cluster up --dir "$dir/q" --nodes 5 --base-port "$port" 2>/dev/null)
redis_pids=$(grep -o '"pid": *[0-9]*' "$dir/q/cluster.json" | grep -o '[0-9]*$' | tr '\n' ' ')

start_broker() { # name serve
  "$bin/idbroker" --listen 127.0.0.1:0 --nodes "$nodes" --serve "$2" >"$dir/$1.out" 2>"$dir/$1.log" &
  pids+=($!)
  eval "${1}_pid=$!"
  for _ in $(seq 100); do grep -q "listening on" "$dir/$1.out" && break; sleep 0.1; done
  eval "${1}_addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$dir/$1.out" | head -n 1)"
}
start_broker window window
start_broker rounds rounds

ticks() { # CPU ticks (user + system) of the given pids together
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat")))
  done
  echo "$t"
}
hz=$(getconf CLK_TCK)
counters() { # addr: the broker's cumulative requests, holes and IDs, in one stats call
  local json
  json=$("$bin/idctl" broker-stats "$1" 2>/dev/null | tail -n 1)
  for name in requests holes ids; do
    echo "$json" | grep -o "\"$name\":[0-9]*" | cut -d: -f2
  done | tr '\n' ' '
}

echo "load before: $(uptime)"
echo
echo "| mode | callers | count | IDs/s | requests/s | p50 us | p99 us | max us | holes % | errors | wire req/s | broker CPU % | redis CPU % | client CPU % |"
echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
row() { # mode callers count procs
  local mode=$1 callers=$2 count=$3 procs=$4 target bpid="" baddr="" r0=0 r1=0 h0=0 h1=0 i0=0 i1=0
  case $mode in
    direct) target=(--nodes "$nodes") ;;
    window) target=(--broker "$window_addr"); bpid=$window_pid; baddr=$window_addr ;;
    rounds) target=(--broker "$rounds_addr"); bpid=$rounds_pid; baddr=$rounds_addr ;;
    # The client without coalescing (every call its own wire request): the rounds
    # broker as it was measured before client coalescing existed.
    rounds-single) target=(--broker "$rounds_addr" --in-flight 0); bpid=$rounds_pid; baddr=$rounds_addr ;;
  esac
  if [ -n "$baddr" ]; then
    read -r r0 h0 i0 <<<"$(counters "$baddr")"
  fi
  local b0 s0 i bench=()
  b0=$(ticks $bpid); s0=$(ticks $redis_pids)
  for i in $(seq "$procs"); do
    /usr/bin/time -f "%U %S" -o "$dir/time.$i" \
      "$bin/idctl" bench "${target[@]}" --clients "$callers" --count "$count" --seconds "$secs" \
      >"$dir/out.$i" 2>/dev/null &
    bench+=($!)
  done
  wait "${bench[@]}"
  local b1 s1
  b1=$(ticks $bpid); s1=$(ticks $redis_pids)
  if [ -n "$baddr" ]; then
    read -r r1 h1 i1 <<<"$(counters "$baddr")"
  fi
  # One process sees the IDs of the others as holes in its own: with several, the
  # broker's own count is the one that means something (none for direct clients).
  local holes_from=bench
  if [ "$procs" -gt 1 ]; then holes_from=$([ -n "$baddr" ] && echo broker || echo none); fi
  local client_s
  client_s=$(cat "$dir"/time.* | awk '{ s += $1 + $2 } END { print s }')
  rm -f "$dir"/time.*
  tail -q -n 1 "$dir"/out.* | awk -v m="$mode" -v c="$((callers * procs))" -v n="$count" \
    -v secs="$secs" -v hz="$hz" -v wire="$((r1 - r0))" -v b="$((b1 - b0))" -v s="$((s1 - s0))" \
    -v cl="$client_s" -v broker="$bpid" -v hf="$holes_from" -v bh="$((h1 - h0))" \
    -v bi="$((i1 - i0))" '{
      gsub(/[{}"]/, ""); split($0, kv, ",");
      for (i in kv) { split(kv[i], f, ":"); v[f[1]] = f[2] }
      ids += v["ids_per_sec"]; reqs += v["requests_per_sec"]; errs += v["errors"]
      if (v["p50_us"] > p50) p50 = v["p50_us"]; if (v["p99_us"] > p99) p99 = v["p99_us"]
      if (v["max_us"] > mx) mx = v["max_us"]; if (v["holes_pct"] > holes) holes = v["holes_pct"]
    } END {
      w = broker == "" ? "" : sprintf("%d", wire / secs)
      bc = broker == "" ? "" : sprintf("%d", 100 * b / hz / secs)
      h = sprintf("%.3f", holes)
      if (hf == "broker") h = sprintf("%.3f (broker)", bi + bh > 0 ? 100 * bh / (bi + bh) : 0)
      if (hf == "none") h = "-"
      printf "| %s | %d | %d | %d | %d | %d | %d | %d | %s | %d | %s | %s | %d | %d |\n",
        m, c, n, ids, reqs, p50, p99, mx, h, errs, w, bc, 100 * s / hz / secs, 100 * cl / secs }'
  rm -f "$dir"/out.*
}
for count in 1 1000; do
  for callers in 1 64 256; do
    for mode in direct rounds window; do row "$mode" "$callers" "$count" 1; done
  done
done
row rounds-single 256 1 1
# Direct last: 1024 direct clients saturate the nodes, and the window leader can miss its
# heartbeat and step down (its abandoned windows would count as holes of the next row).
for mode in rounds window direct; do row "$mode" 256 1 4; done
echo
echo "load after: $(uptime)"
echo
echo "window broker counters after the run:"
"$bin/idctl" broker-stats "$window_addr" 2>/dev/null | head -n 20
echo
echo "rounds broker counters after the run:"
"$bin/idctl" broker-stats "$rounds_addr" 2>/dev/null | head -n 20
