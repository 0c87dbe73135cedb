#!/usr/bin/env bash
# 64 direct clients for 10 s on a fresh local 5-node quorum while the rendezvous node (the
# node whose URL sorts first) is paused for 3 s or killed, 3.5 s into the run. Prints
# idctl bench's per-second progress (IDs per interval) and its JSON line.
#   scripts/bench-rendezvous.sh IDCTL pause|kill|none auto|always|never
set -euo pipefail
IDCTL=$1; MODE=$2; COMBINE=$3
D=$(mktemp -d /tmp/qlist-bench-rdv.XXXX)
BASE=$((20000 + RANDOM % 20000))
URLS=$("$IDCTL" cluster up --dir "$D" --nodes 5 --base-port "$BASE" 2>/dev/null)
trap '"$IDCTL" cluster down --dir "$D" >/dev/null 2>&1; rm -rf "$D"' EXIT
RPID=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); n=s['nodes'] if isinstance(s,dict) else s; print(sorted(n,key=lambda r:r['url'])[0]['pid'])" "$D/cluster.json")
"$IDCTL" bench --nodes "$URLS" --clients 64 --seconds 10 --combine "$COMBINE" > "$D/out.json" 2> "$D/err.txt" &
B=$!
sleep 3.5   # about 0.5 s to connect, then 3 s of steady load
case $MODE in
  pause) kill -STOP "$RPID"; sleep 3; kill -CONT "$RPID" ;;
  kill) kill -9 "$RPID" ;;
  none) ;;
  *) echo "mode must be pause, kill or none" >&2; exit 2 ;;
esac
wait "$B" || true
echo "== mode=$MODE combine=$COMBINE: IDs per progress interval"
grep -E "^bench:" "$D/err.txt" | awk '{ids=$3; printf "%s:%d ", $2, ids-prev; prev=ids} END {print ""}'
cat "$D/out.json"
