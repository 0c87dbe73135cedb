#!/usr/bin/env bash
# The no-stall regression benchmark (issue 47): `idctl bench` with many direct callers, run
# after run on one local 5-node quorum, counting per run the longest stall (time in the
# 5 s window with no request returning IDs), errors, p99 and holes, and the clients'
# rendezvous counters (why they left combining, and where they went).
#
#   scripts/bench-stall.sh [RUNS]          RUNS defaults to 30
#
# Environment (defaults in brackets):
#   BIN      where idctl and idbroker are [$CARGO_TARGET_DIR/release, else target/release]
#   CALLERS  caller counts, each one run per round [256 512]
#   MODES    per round and caller count, one run each [plain broker pause]:
#            plain   the callers alone on the nodes
#            broker  an idbroker (--serve window, the default key) elected on the same
#                    nodes, idle: its heartbeats and window reservations share the register
#            pause   the rendezvous node (the node whose URL sorts first) SIGSTOPped for
#                    PAUSE seconds from about 1 s into the timed window
#   SECONDS_RUN  the bench's --seconds [5]
#   PAUSE    seconds the rendezvous node stays stopped [2]
#   OUT      the per-run JSON lines go here [a temp file, named at the end]
#
# Prints one line per run and a summary table per (mode, callers); exits 1 when any run
# stalled more than 1 s or had an error.
set -euo pipefail

runs=${1:-30}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release}
callers_list=${CALLERS:-256 512}
modes=${MODES:-plain broker pause}
secs=${SECONDS_RUN:-5}
pause=${PAUSE:-2}
for b in idctl idbroker; do
  [ -x "$bin/$b" ] || { echo "bench-stall: no $bin/$b (cargo build --release -p idtools -p broker)" >&2; exit 2; }
done

dir=$(mktemp -d /tmp/qlist-bench-stall.XXXX)
out=${OUT:-$dir/runs.jsonl}
broker_pid=""
cleanup() {
  [ -n "$broker_pid" ] && kill -TERM "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
  [ -n "${rdv_pid:-}" ] && kill -CONT "$rdv_pid" 2>/dev/null
  "$bin/idctl" cluster down --dir "$dir/q" >/dev/null 2>&1 || true
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
nodes=$("$bin/idctl" cluster up --dir "$dir/q" --nodes 5 --base-port "$port" 2>/dev/null)
# The rendezvous node: the node whose URL sorts first (idclient's rule).
rdv_pid=$(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
nodes = s["nodes"] if isinstance(s, dict) else s
print(sorted(nodes, key=lambda r: r["url"])[0]["pid"])' "$dir/q/cluster.json")

start_broker() {
  "$bin/idbroker" --listen 127.0.0.1:0 --nodes "$nodes" >"$dir/broker.out" 2>"$dir/broker.log" &
  broker_pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$dir/broker.out" && break; sleep 0.1; done
  grep -q "listening on" "$dir/broker.out" || { echo "bench-stall: idbroker did not start" >&2; cat "$dir/broker.log" >&2; exit 2; }
  sleep 1 # elected (heartbeats at 50 ms, election timeout 200-400 ms)
}
stop_broker() {
  [ -n "$broker_pid" ] && kill -TERM "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null || true
  broker_pid=""
}

# Pauses the rendezvous node for $pause s once the bench's first progress line (1 s into
# the timed window) is in $1.
pause_rendezvous() {
  for _ in $(seq 600); do grep -q "^bench:" "$1" && break; sleep 0.05; done
  kill -STOP "$rdv_pid"; sleep "$pause"; kill -CONT "$rdv_pid"
}

one_run() { # round mode callers
  local round=$1 mode=$2 callers=$3 err="$dir/err.txt" json pauser=""
  [ "$mode" = broker ] && start_broker
  "$bin/idctl" bench --nodes "$nodes" --clients "$callers" --seconds "$secs" >"$dir/out.json" 2>"$err" &
  local bench=$!
  if [ "$mode" = pause ]; then pause_rendezvous "$err" & pauser=$!; fi
  wait "$bench" || true
  [ -n "$pauser" ] && wait "$pauser"
  [ "$mode" = broker ] && stop_broker
  json=$(tail -n 1 "$dir/out.json")
  if [ -z "$json" ]; then
    echo "bench-stall: run $round $mode $callers gave no summary:" >&2; tail -n 5 "$err" >&2
    json='{"ids_per_sec":0,"p99_us":0,"holes_pct":0,"stall_ms":99999,"errors":1,"counters":{}}'
  fi
  python3 -c '
import json, sys
r = json.loads(sys.argv[4]); r.update(round=int(sys.argv[1]), mode=sys.argv[2], callers=int(sys.argv[3]))
print(json.dumps(r))' "$round" "$mode" "$callers" "$json" >>"$out"
  tail -n 1 "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read()); c = r.get("counters", {})
print("run %3d %-6s %3d callers: %6d IDs/s, p99 %5.0f ms, stall %5d ms, %d errors, holes %5.1f%%; "
      "slow %d (alive %d), failed %d, stalls %d, left %d, to fallback %d, to own %d, uncombined %d" % (
      r["round"], r["mode"], r["callers"], r["ids_per_sec"], r["p99_us"] / 1000, r["stall_ms"],
      r["errors"], r["holes_pct"], c.get("rendezvous_slow", 0), c.get("rendezvous_slow_alive", 0), c.get("rendezvous_errors", 0),
      c.get("rendezvous_stalls", 0), c.get("rendezvous_left", 0), c.get("to_fallback", 0),
      c.get("to_own_rounds", 0), c.get("uncombined", 0)))'
}

echo "bench-stall: $runs rounds of callers [$callers_list] x modes [$modes], ${secs} s each; nodes $nodes; rendezvous pid $rdv_pid"
echo "bench-stall: load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores; runs to $out"
for round in $(seq "$runs"); do
  for callers in $callers_list; do
    for mode in $modes; do one_run "$round" "$mode" "$callers"; done
  done
done

python3 - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def pct(xs, q):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(round((len(xs) - 1) * q)))]
print("\n%-6s %7s %4s %9s %9s %9s %12s %7s %9s %8s %6s %6s %8s %6s %10s" % (
    "mode", "callers", "runs", "IDs/s p50", "IDs/s min", "p99 max", "stalls>1s", "errors",
    "stall max", "holes max", "slow", "alive", "fallback", "own", "uncombined"))
for mode in dict.fromkeys(r["mode"] for r in rows):
    for callers in sorted({r["callers"] for r in rows if r["mode"] == mode}):
        rs = [r for r in rows if r["mode"] == mode and r["callers"] == callers]
        c = lambda k: sum(r.get("counters", {}).get(k, 0) for r in rs)
        print("%-6s %7d %4d %9d %9d %7.0fms %12d %7d %7dms %7.1f%% %6d %6d %8d %6d %10d" % (
            mode, callers, len(rs), pct([r["ids_per_sec"] for r in rs], 0.5),
            min(r["ids_per_sec"] for r in rs), max(r["p99_us"] for r in rs) / 1000,
            sum(r["stall_ms"] > 1000 for r in rs), sum(r["errors"] for r in rs),
            max(r["stall_ms"] for r in rs), max(r["holes_pct"] for r in rs),
            c("rendezvous_slow"), c("rendezvous_slow_alive"), c("to_fallback"), c("to_own_rounds"), c("uncombined")))
bad = [r for r in rows if r["stall_ms"] > 1000 or r["errors"] > 0]
print("\n%d of %d runs stalled over 1 s or had errors" % (len(bad), len(rows)))
sys.exit(1 if bad else 0)
EOF
