#!/usr/bin/env bash
# The whole qlist pipeline, end to end, on a local quorum this script starts and stops:
#   5 durable redis-server nodes -> 2 idbrokers -> 4 producers as separate processes
#   (through the brokers, as most users run them), publishing as they go, while
#   `merger follow` writes the stable prefix of the list -> merger -> verify, and the
#   follower's list compared with the batch merge's.
# Every process it starts it stops again by pid, also on failure or Ctrl-C.
#
# Settings (environment): QLIST_DEMO_DIR (default ./demo-data), QLIST_DEMO_ITEMS items per
# producer (default 100000), QLIST_DEMO_BATCH (default 1000), QLIST_DEMO_PORT first port
# to try for the quorum (default 7101), QLIST_DEMO_DIRECT how many of the 4 producers take
# their IDs straight from the quorum (--nodes) instead of the brokers (default 0),
# QLIST_DEMO_PUBLISH how often producers publish, in seconds (default 0.5).
set -euo pipefail

bin="${CARGO_TARGET_DIR:-/var/tmp/qlist-target}/release"
for b in idctl idbroker producer merger; do
  [ -x "$bin/$b" ] || { echo "demo: $bin/$b is missing: run 'make build' first" >&2; exit 1; }
done
dir="${QLIST_DEMO_DIR:-$PWD/demo-data}"
items="${QLIST_DEMO_ITEMS:-100000}"
batch="${QLIST_DEMO_BATCH:-1000}"
port="${QLIST_DEMO_PORT:-7101}"
direct="${QLIST_DEMO_DIRECT:-0}"
publish="${QLIST_DEMO_PUBLISH:-0.5}"
case $direct in [0-4]) ;; *) echo "demo: QLIST_DEMO_DIRECT must be 0 to 4, not '$direct'" >&2; exit 2 ;; esac

rm -rf "$dir"
mkdir -p "$dir/logs"
broker_pids=()
cleanup() {
  for pid in "${broker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${broker_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -f "$dir/quorum/cluster.json" ] && "$bin/idctl" cluster down --dir "$dir/quorum" 2>/dev/null || true
}
trap cleanup EXIT

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Find 5 consecutive free ports for the quorum.
while port_taken "$port" || port_taken $((port+1)) || port_taken $((port+2)) || port_taken $((port+3)) || port_taken $((port+4)); do
  port=$((port + 10))
done

echo "== 1/5 quorum: 5 redis-server nodes (appendonly, fsync always) on ports $port-$((port+4))"
nodes=$("$bin/idctl" cluster up --dir "$dir/quorum" --nodes 5 --base-port "$port" 2>"$dir/logs/cluster.log")
"$bin/idctl" check --nodes "$nodes" >/dev/null

echo "== 2/5 brokers: 2 idbrokers on free ports (one is elected leader, the other redirects clients to it)"
brokers=()
for i in 1 2; do
  "$bin/idbroker" --listen 127.0.0.1:0 --nodes "$nodes" >"$dir/logs/broker$i.out" 2>"$dir/logs/broker$i.log" &
  broker_pids+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$dir/logs/broker$i.out" 2>/dev/null && break; sleep 0.1; done
  addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$dir/logs/broker$i.out" | head -n 1)
  [ -n "$addr" ] || { echo "demo: broker $i did not start: $(tail -n 3 "$dir/logs/broker$i.log")" >&2; exit 1; }
  brokers+=("$addr")
done
broker_list="${brokers[0]},${brokers[1]}"
echo "   brokers at $broker_list"

if [ "$direct" -eq 0 ]; then how="all via the brokers"; else how="shards 0-$((direct - 1)) direct to the quorum, the rest via the brokers"; fi
echo "== 3/5 producers: 4 processes, $items items each, batches of $batch ($how),"
echo "   each publishing what it made durable every ${publish}s into the shared directory $dir/runs,"
echo "   while merger follow writes the list's stable prefix into $dir/follow as it grows"
mkdir -p "$dir/runs"
start_ms=$(( $(date +%s%N) / 1000000 ))
"$bin/merger" follow --runs "$dir/runs" --expect-shards 4 --out-dir "$dir/follow" --poll-ms 100 \
  --part-every 1 >"$dir/logs/follow.out" 2>"$dir/logs/follow.log" &
follow_pid=$!
broker_pids+=("$follow_pid")
pids=()
for shard in 0 1 2 3; do
  if [ "$shard" -lt "$direct" ]; then src=(--nodes "$nodes"); else src=(--broker "$broker_list"); fi
  # Each producer seals its finished sublist into the shared run directory, as producers
  # on many machines would into a mounted volume or an s3:// prefix.
  "$bin/producer" --shard "$shard" --data-dir "$dir/data" "${src[@]}" --generate "$items" --batch "$batch" \
    --no-progress-bar --seal-to "$dir/runs" --publish-every "$publish" >"$dir/logs/producer$shard.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "demo: producer $i failed:" >&2; tail -n 5 "$dir/logs/producer$i.log" >&2; exit 1
  fi
  echo "   $(grep -v '^sealed' "$dir/logs/producer$i.log" | tail -n 1)"
  sealed=$(grep '^sealed' "$dir/logs/producer$i.log" | tail -n 1 || true)
  [ -z "$sealed" ] || echo "   $sealed"
done
ms=$(( $(date +%s%N) / 1000000 - start_ms ))
if ! wait "$follow_pid"; then
  echo "demo: merger follow failed:" >&2; tail -n 5 "$dir/logs/follow.log" >&2; exit 1
fi
follow_ms=$(( $(date +%s%N) / 1000000 - start_ms ))
parts=$(ls "$dir/follow" | grep -c '^part-')
echo "   merger follow: $(tail -n 1 "$dir/logs/follow.out"), its last part $(( follow_ms - ms )) ms after the last producer finished"

echo "== 4/5 merger: k-way merge of the 4 runs in $dir/runs (every shard present and complete)"
if ! merged=$("$bin/merger" --out "$dir/list.bin" --runs "$dir/runs" --expect-shards 4 2>"$dir/logs/merger.log"); then
  echo "demo: merger failed:" >&2; tail -n 5 "$dir/logs/merger.log" >&2; exit 1
fi
echo "   $merged"

echo "== 5/5 verify"
verify=$("$bin/merger" verify "$dir/list.bin")
echo "   $verify"
echo "   $("$bin/merger" verify "$dir"/follow/part-*.bin | tail -n 1)"
if ! cmp -s <("$bin/merger" cat "$dir/list.bin") <("$bin/merger" cat "$dir"/follow/part-*.bin); then
  echo "demo: the follower's $parts parts do not hold the batch merge's list" >&2; exit 1
fi
echo "   the follower's $parts parts hold the same records, in the same order, as list.bin"

total=$((items * 4))
range=$(echo "$verify" | sed -n 's/.*ids \([0-9]*\)\.\.=\([0-9]*\).*/\1 \2/p')
read -r lo hi <<<"$range"
span=$((hi - lo + 1))
awk -v total="$total" -v lo="$lo" -v hi="$hi" -v ms="$ms" -v list="$dir/list.bin" -v direct="$direct" 'BEGIN {
  span = hi - lo + 1
  printf "\nsummary: %d items from 4 shards (%d direct, %d via brokers) in %.2f s of producing, %.0f IDs/s\n", total, direct, 4 - direct, ms / 1000, total / (ms > 0 ? ms / 1000 : 1)
  printf "         IDs %d..=%d, holes %d of %d (%.3f%%: IDs reserved but never handed out)\n", lo, hi, span - total, span, 100 * (span - total) / span
  printf "         list: %s (verified)\n", list
  if (direct > 0)
    printf "         direct producers beside a window leader write the register it reserves from and\n         end its windows early: that is most of these holes. Harmless (every ID is still\n         unique and in order), but give producers the brokers. docs/broker.md, Design\n"
  else
    printf "         (QLIST_DEMO_DIRECT=2 runs two producers straight on the quorum beside the brokers:\n         allowed, but each direct write ends the window leader'"'"'s window early, in holes)\n"
}'
echo "         print it with: $bin/merger cat $dir/list.bin | head"
