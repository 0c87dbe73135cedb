#!/usr/bin/env bash
# The merge against the tools a user would otherwise reach for, in one command and one run:
#
#   bash scripts/bench-merge-peers.sh | tee peers.txt      # 10M items, 4 and 64 shards, 3 reps
#   make bench-peers-smoke   # the smoke size: 20000 items, 4 shards, 1 rep (about a minute):
#                            # every row runs and every output is checked; its times mean nothing
#
# Needs `make build` (the binaries in $CARGO_TARGET_DIR/release, default
# /var/tmp/qlist-target) and `bash scripts/deps.sh` (redis-server, and the venv at $QLIST_PY,
# default /var/tmp/qlist-py, with duckdb, pyarrow and polars from PyPI). Fails with a message
# naming what is missing. GNU time (Debian package `time`) measures peak RSS when installed,
# else a small python wrapper does (a ~9 MB floor). Run it on a quiet machine: it prints CPU
# steal and busy % so a noisy run shows.
#
# What it measures: how fast the merger turns the sealed runs of real producers into one
# ordered list, against `cat` (the limit: the same bytes read and written once), DuckDB and
# Polars (the runs converted to Parquet, sorted by id into one Parquet file) and GNU
# `sort -m` (the runs as text). Every output is fsynced inside its timing, checked after it
# (count = N, ids strictly increasing, the fixture's first and last id), and every row's
# peak RSS is taken; a row that fails or whose check fails is counted in the table and
# listed, never dropped (the script then exits 3, after the report).
#
# Fixture, for each shard count S (built once, untimed, before any row is timed):
#   a local 3-node quorum (`idctl cluster up`), one `idbroker` on it, S `producer --shard n
#   --generate N/S --seal-to RUNS` processes at once through the broker (100-byte generated
#   items, batches of 1000), so the runs interleave in batches as real producer output does;
#   the quorum and broker are stopped before the rows. Then `merger convert RUNS/shard-n.bin
#   --compression none` (PQ/shard-n.parquet, the peers' input), and `merger cat` of each run
#   as text with the id zero-padded to 20 digits first (TXT/shard-n.txt: bytewise order = id
#   order). The same again with N/10 items (the 10% fixture, for peak RSS flatness).
#
# Rows (each its own process; MB/s is always 10^6 bytes of the fixture's list.bin per second,
# the common unit; everything is read from the page cache, nothing is dropped):
#   cat              cat RUNS/*.bin > OUT/cat.bin && sync OUT/cat.bin   (the limit; checked: size)
#   merger           merger --runs RUNS --expect-shards S --out OUT/list.bin   (merger verify)
#   jobs2            the same as merger, --jobs 2   (merger verify)
#   and for each codec C of QLIST_PEER_CODECS (snappy, zstd:L), every Parquet writer the same
#   codec at the same level (the check reads every column chunk's codec back: pyarrow check):
#   merger-parquet@C the same as merger, --out OUT/list.parquet --compression C
#   parquet1@C       (the first codec only) the same, --encode-threads 0: encoded on the merge
#                    thread alone, as before issue 47
#   duckdb@C         python + duckdb: SET threads=T; COPY (SELECT * FROM read_parquet('PQ/*.parquet')
#                    ORDER BY id) TO 'OUT/duck.parquet' (FORMAT parquet, COMPRESSION C
#                    [, COMPRESSION_LEVEL L]); fsync
#   polars@C         python + polars (POLARS_MAX_THREADS=T): pl.scan_parquet('PQ/*.parquet')
#                    .sort('id').sink_parquet('OUT/polars.parquet', compression=C
#                    [, compression_level=L]); fsync
#   sort             LC_ALL=C sort -m --batch-size=S -o OUT/sort.txt TXT/*.txt && sync   (sort -c -u, wc -l)
# Repetitions are interleaved (repetition 1 of every row on every fixture, then 2, ...); the
# report gives medians of wall seconds, CPU seconds (user + sys), MB/s, items/s, peak RSS (KiB, the largest of the
# repetitions), the same rows on the 10% fixture and the RSS ratio 100% / 10%, CPU steal per
# row and over the run (/proc/stat, vmstat's `st`), DuckDB's and Polars' query time without
# python's start and import, and the ratios (merger / cat, --jobs 2 / merger, merger list.bin
# and list.parquet / DuckDB and / Polars per codec, list.parquet / the best peer and / list.bin:
# throughput, > 1 means qlist is faster), as markdown tables for BENCHMARKS.md, with the
# machine (nproc, memory, CPU model), the commit and the versions (DuckDB, Polars, pyarrow,
# merger).
#
# Settings (environment):
#   QLIST_PEER_ITEMS    items N of the full fixture (default 10000000; the 10% one has N/10)
#   QLIST_PEER_SHARDS   shard counts, space-separated (default "4 64")
#   QLIST_PEER_REPS     repetitions of every row (default 3)
#   QLIST_PEER_THREADS  threads of DuckDB and Polars (default 2)
#   QLIST_PEER_CODECS   the Parquet passes, space-separated: snappy, zstd:LEVEL (default
#                       "snappy zstd:3": zstd's own default level)
#   QLIST_PEER_DIR      parent of the scratch directory (default $TMPDIR or /tmp): a fresh
#                       mktemp -d under it holds everything and is removed on exit
#                       (10M items: ~9 GB for both shard counts)
#   QLIST_PEER_PORT     first port to try for the quorum (default 7401)
#   QLIST_PEER_REPORT   also write the report (markdown) to this file
#   CARGO_TARGET_DIR, QLIST_PY   where the binaries and the venv are
#
# Everything it starts (quorum, broker, producers, the timing helper and the row it runs)
# it stops by pid on exit, also on failure and Ctrl-C, and removes its scratch directory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
bin="${CARGO_TARGET_DIR:-/var/tmp/qlist-target}/release"
venv="${QLIST_PY:-/var/tmp/qlist-py}"
py="$venv/bin/python"
items="${QLIST_PEER_ITEMS:-10000000}"
shards_list="${QLIST_PEER_SHARDS:-4 64}"
reps="${QLIST_PEER_REPS:-3}"
threads="${QLIST_PEER_THREADS:-2}"
codecs="${QLIST_PEER_CODECS:-snappy zstd:3}"
port="${QLIST_PEER_PORT:-7401}"
parent="${QLIST_PEER_DIR:-${TMPDIR:-/tmp}}"

die() { echo "bench-merge-peers: $*" >&2; exit 1; }
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

is_count "$items" || die "QLIST_PEER_ITEMS must be a positive integer, not '$items'"
[ "$items" -ge 10 ] || die "QLIST_PEER_ITEMS must be at least 10 (the 10% fixture has N/10 items)"
is_count "$reps" || die "QLIST_PEER_REPS must be a positive integer, not '$reps'"
is_count "$threads" || die "QLIST_PEER_THREADS must be a positive integer, not '$threads'"
is_count "$port" || die "QLIST_PEER_PORT must be a port number, not '$port'"
[ -n "${shards_list// /}" ] || die "QLIST_PEER_SHARDS is empty"
[ -n "${codecs// /}" ] || die "QLIST_PEER_CODECS is empty"
for c in $codecs; do
  [[ $c == snappy || $c =~ ^zstd:([1-9]|1[0-9]|2[0-2])$ ]] || die "QLIST_PEER_CODECS: '$c' is not snappy or zstd:LEVEL (1-22)"
done
for s in $shards_list; do
  is_count "$s" || die "QLIST_PEER_SHARDS must be positive integers, not '$s'"
  [ $((items / 10)) -ge "$s" ] || die "QLIST_PEER_ITEMS=$items is too small for $s shards (the 10% fixture needs an item per shard)"
done

for b in idctl idbroker producer merger; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing: run 'make build' first (or set CARGO_TARGET_DIR)"
done
[ -x "$py" ] || die "no python at $py: run 'bash scripts/deps.sh' (it makes the venv with duckdb, pyarrow and polars)"
"$py" -c 'import duckdb, pyarrow, polars' 2>/dev/null ||
  die "$py cannot import duckdb, pyarrow and polars: run 'bash scripts/deps.sh' (or '$py -m pip install duckdb pyarrow polars')"
command -v redis-server >/dev/null || die "redis-server not found: run 'bash scripts/deps.sh'"
for c in sort awk cat sync git df; do command -v "$c" >/dev/null || die "$c not found"; done
[ -d "$parent" ] || die "QLIST_PEER_DIR=$parent is not a directory"

work=$(mktemp -d "$parent/qlist-peers.XXXXXX")
head -n 1 /proc/stat >"$work/stat0"
broker_pid=""
quorum=""
pids=()
helper_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$helper_pid" ]; then kill -TERM "$helper_pid" 2>/dev/null || true; wait "$helper_pid" 2>/dev/null || true; fi
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  stop_servers
  rm -rf "$work"
  exit "$rc"
}
stop_servers() {
  if [ -n "$broker_pid" ]; then
    kill -TERM "$broker_pid" 2>/dev/null || true
    wait "$broker_pid" 2>/dev/null || true
    broker_pid=""
  fi
  if [ -n "$quorum" ] && [ -f "$quorum/cluster.json" ]; then
    "$bin/idctl" cluster down --dir "$quorum" >/dev/null 2>&1 || echo "bench-merge-peers: idctl cluster down --dir $quorum failed" >&2
  fi
  quorum=""
}
trap cleanup EXIT
trap 'echo "bench-merge-peers: interrupted" >&2; exit 130' INT
trap 'echo "bench-merge-peers: terminated" >&2; exit 143' TERM

now() { date +%s.%N; }
log() { echo "bench-merge-peers: $*" >&2; }

mkdir -p "$work/logs"
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
while port_taken "$port" || port_taken $((port + 1)) || port_taken $((port + 2)); do
  port=$((port + 10))
done
quorum="$work/quorum"
log "scratch directory $work; quorum of 3 redis-server nodes on ports $port-$((port + 2))"
nodes=$("$bin/idctl" cluster up --dir "$quorum" --nodes 3 --base-port "$port" 2>"$work/logs/cluster.log") ||
  die "idctl cluster up failed: $(tail -n 5 "$work/logs/cluster.log")"
"$bin/idbroker" --listen 127.0.0.1:0 --nodes "$nodes" >"$work/logs/broker.out" 2>"$work/logs/broker.log" &
broker_pid=$!
broker=""
for _ in $(seq 100); do
  broker=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$work/logs/broker.out" | head -n 1)
  [ -n "$broker" ] && break
  kill -0 "$broker_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$broker" ] || die "idbroker did not start: $(tail -n 5 "$work/logs/broker.log")"
log "broker $broker (pid $broker_pid) on $nodes"

# build_fixture S N DIR: S producers at once through the broker, N items in all, sealed into
# DIR/runs; then DIR/pq (Parquet, uncompressed) and DIR/txt (text) from the runs.
build_fixture() {
  local S=$1 N=$2 d=$3 n cnt t0 t1 t2 i
  mkdir -p "$d/runs" "$d/pq" "$d/txt" "$d/out"
  log "fixture: $S producers, $N items of 100 bytes in all, through the broker, sealing into $d/runs"
  t0=$(now)
  pids=()
  for ((n = 0; n < S; n++)); do
    cnt=$((N / S + (n < N % S ? 1 : 0)))
    "$bin/producer" --shard "$n" --data-dir "$d/data" --broker "$broker" --generate "$cnt" \
      --no-progress-bar --seal-to "$d/runs" >"$work/logs/producer-$S-$N-$n.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      die "producer --shard $i ($S shards, $N items) failed: $(tail -n 5 "$work/logs/producer-$S-$N-$i.log")"
    fi
  done
  pids=()
  t1=$(now)
  rm -rf "$d/data"   # the sublists: the runs are what is merged
  for ((n = 0; n < S; n++)); do
    "$bin/merger" convert "$d/runs/shard-$n.bin" --compression none --out "$d/pq/shard-$n.parquet" \
      >/dev/null 2>"$work/logs/convert.log" || die "merger convert of shard $n failed: $(tail -n 5 "$work/logs/convert.log")"
    # merger cat: id<TAB>shard<TAB>seq<TAB>escaped payload; the id zero-padded to 20 digits.
    "$bin/merger" cat "$d/runs/shard-$n.bin" 2>"$work/logs/cat.log" |
      LC_ALL=C awk 'BEGIN { FS = OFS = "\t"; z = "00000000000000000000" } { $1 = substr(z, 1, 20 - length($1)) $1; print }' \
        >"$d/txt/shard-$n.txt" || die "merger cat of shard $n failed: $(tail -n 5 "$work/logs/cat.log")"
  done
  t2=$(now)
  awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { printf "{\"produce_s\": %.3f, \"convert_s\": %.3f}\n", b - a, c - b }' >"$d/build.json"
  log "fixture built: producers + seal $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, convert + text $(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.1f", b - a }') s"
}

for S in $shards_list; do
  build_fixture "$S" "$items" "$work/s$S/f100"
  build_fixture "$S" $((items / 10)) "$work/s$S/f10"
done
log "stopping the broker and the quorum before the timed rows"
stop_servers

export QLIST_PEER_ITEMS="$items" QLIST_PEER_SHARDS="$shards_list" QLIST_PEER_REPS="$reps" QLIST_PEER_THREADS="$threads" QLIST_PEER_CODECS="$codecs"
# In the background and waited for, so that a TERM or Ctrl-C reaches the trap at once; the
# trap then stops it (and it the row it is running).
"$py" "$here/bench_merge_peers.py" run "$work" "$bin" "$repo" &
helper_pid=$!
set +e
wait "$helper_pid"
rc=$?
set -e
helper_pid=""
exit "$rc"
