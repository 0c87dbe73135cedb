#!/usr/bin/env python3
"""The timing, checking and reporting half of scripts/bench-merge-peers.sh (read its header
first: it builds the fixtures and calls this). Runs under the venv's python (pyarrow,
duckdb, polars); needs nothing else beyond the standard library.

  bench_merge_peers.py run WORK BIN REPO    time every row on the fixtures under WORK, print the report
  bench_merge_peers.py duckdb GLOB OUT CODEC   one peer row: DuckDB COPY ... ORDER BY id, then fsync
  bench_merge_peers.py polars GLOB OUT CODEC   one peer row: Polars sort + sink_parquet, then fsync

CODEC is `snappy` or `zstd:LEVEL`: every Parquet-writing row of one pass writes the same
codec at the same level (qlist `--compression`, DuckDB `COMPRESSION`/`COMPRESSION_LEVEL`,
Polars `compression`/`compression_level`), and the check reads it back from the file.

`run` takes its settings from the environment the shell script exported (QLIST_PEER_*).
"""
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

# ---------------------------------------------------------------------------------------
# The peer rows: each is its own process (what a user would run), printing one JSON line.


def fsync_file_and_dir(path):
    """What the merger does to its output: the file's data and its directory entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sql_str(s):
    return "'" + s.replace("'", "''") + "'"


def codec_level(codec):
    """`snappy` -> ("snappy", None); `zstd:3` -> ("zstd", 3)."""
    name, _, level = codec.partition(":")
    if name not in ("snappy", "zstd") or (name == "zstd") != bool(level):
        raise SystemExit(f"bench: codec {codec!r}: expected snappy or zstd:LEVEL")
    return name, int(level) if level else None


def peer_duckdb(pq_glob, out, codec):
    t0 = time.monotonic()
    import duckdb

    t1 = time.monotonic()
    threads = int(os.environ.get("QLIST_PEER_THREADS", "2"))
    name, level = codec_level(codec)
    opts = f"FORMAT parquet, COMPRESSION {name}" + (f", COMPRESSION_LEVEL {level}" if level else "")
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    con.execute(
        f"COPY (SELECT * FROM read_parquet({sql_str(pq_glob)}) ORDER BY id) "
        f"TO {sql_str(out)} ({opts})"
    )
    con.close()
    fsync_file_and_dir(out)
    t2 = time.monotonic()
    print(json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "version": duckdb.__version__}))


def peer_polars(pq_glob, out, codec):
    # POLARS_MAX_THREADS is set by the caller, before the import (Polars reads it once).
    t0 = time.monotonic()
    import polars as pl

    t1 = time.monotonic()
    name, level = codec_level(codec)
    kw = {"compression": name} | ({"compression_level": level} if level else {})
    pl.scan_parquet(pq_glob).sort("id").sink_parquet(out, **kw)
    fsync_file_and_dir(out)
    t2 = time.monotonic()
    print(
        json.dumps(
            {
                "import_s": t1 - t0,
                "work_s": t2 - t1,
                "version": pl.__version__,
                "threads": pl.thread_pool_size(),
            }
        )
    )


# ---------------------------------------------------------------------------------------
# Checks: every output of every repetition, after its timing.


class CheckFailed(Exception):
    pass


def parquet_ids(path):
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["id"])
    return t.column("id").combine_chunks()


def check_parquet(path, fx, codec):
    """count = N, ids strictly increasing, the fixture's min, max and sum of ids, and every
    column chunk in the codec the row was asked for."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    names = [md.schema.column(i).name for i in range(md.num_columns)]
    codecs = sorted(
        {md.row_group(g).column(c).compression for g in range(md.num_row_groups) for c in range(md.num_columns)}
    )
    ids = parquet_ids(path)
    if ids.type != pa.uint64():
        ids = ids.cast(pa.uint64())
    n = len(ids)
    if n != fx["items"]:
        raise CheckFailed(f"{n} rows, expected {fx['items']}")
    if n > 1 and not pc.all(pc.greater(ids[1:], ids[:-1])).as_py():
        bad = pc.index(pc.less_equal(ids[1:], ids[:-1]), True).as_py()
        raise CheckFailed(f"ids not strictly increasing at row {bad + 1}: {ids[bad].as_py()} then {ids[bad + 1].as_py()}")
    mm = pc.min_max(ids).as_py()
    s = pc.sum(ids).as_py() % (1 << 64)
    if (mm["min"], mm["max"], s) != (fx["min_id"], fx["max_id"], fx["sum_id"]):
        raise CheckFailed(f"ids {mm['min']}..={mm['max']} sum {s}, the fixture has {fx['min_id']}..={fx['max_id']} sum {fx['sum_id']}")
    if set(names) != {"id", "shard", "seq", "payload"}:
        raise CheckFailed(f"columns {names}")
    if codecs != [codec_level(codec)[0].upper()]:
        raise CheckFailed(f"codecs {codecs}, the row asked for {codec}")
    return f"{n} rows, ids strictly increasing, {md.num_row_groups} row groups, codec {'/'.join(codecs)}", "/".join(codecs)


def check_listbin(path, fx, binary):
    """`merger verify`: format, block CRCs, strict order, every shard's seqs; N records, the fixture's ids."""
    p = subprocess.run([binary, "verify", path], capture_output=True, text=True)
    if p.returncode != 0:
        raise CheckFailed(f"merger verify exit {p.returncode}: {p.stderr.strip()[-400:]}")
    m = re.search(r"OK: (\d+) records.*ids (\d+)\.\.=(\d+)", p.stdout)
    if not m:
        raise CheckFailed(f"merger verify said: {p.stdout.strip()}")
    n, lo, hi = (int(x) for x in m.groups())
    if (n, lo, hi) != (fx["items"], fx["min_id"], fx["max_id"]):
        raise CheckFailed(f"{n} records, ids {lo}..={hi}; the fixture has {fx['items']}, {fx['min_id']}..={fx['max_id']}")
    return f"merger verify: {n} records, ids {lo}..={hi}", "-"


def check_cat(path, fx):
    size = os.path.getsize(path)
    if size != fx["runs_bytes"]:
        raise CheckFailed(f"{size} bytes, the runs hold {fx['runs_bytes']}")
    return f"{size} bytes = the runs' bytes", "-"


def check_text(path, fx):
    """N lines, first fields (zero-padded ids) strictly increasing (sort -c -u), first and last id."""
    env = dict(os.environ, LC_ALL="C")
    p = subprocess.run(["sort", "-c", "-u", "-t", "\t", "-k1,1", path], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise CheckFailed(f"not strictly increasing by id: {p.stderr.strip()[-300:]}")
    p = subprocess.run(["wc", "-l", path], capture_output=True, text=True, check=True)
    n = int(p.stdout.split()[0])
    if n != fx["items"]:
        raise CheckFailed(f"{n} lines, expected {fx['items']}")
    with open(path, "rb") as f:
        first = int(f.readline().split(b"\t", 1)[0])
        f.seek(max(0, os.path.getsize(path) - 4096))
        last = int(f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1].split(b"\t", 1)[0])
    if (first, last) != (fx["min_id"], fx["max_id"]):
        raise CheckFailed(f"ids {first}..={last}, the fixture has {fx['min_id']}..={fx['max_id']}")
    return f"{n} lines, ids strictly increasing (sort -c -u)", "-"


# ---------------------------------------------------------------------------------------
# Measuring.


def proc_stat():
    """The aggregate cpu line of /proc/stat: user nice system idle iowait irq softirq steal."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v


def stat_delta(a, b):
    d = [y - x for x, y in zip(a, b)]
    total = sum(d)
    return {"total": total, "steal": d[7], "idle": d[3] + d[4]}


def steal_pct(deltas):
    total = sum(d["total"] for d in deltas)
    return 100.0 * sum(d["steal"] for d in deltas) / total if total else 0.0


def busy_pct(deltas):
    total = sum(d["total"] for d in deltas)
    return 100.0 * (total - sum(d["idle"] for d in deltas) - sum(d["steal"] for d in deltas)) / total if total else 0.0


CURRENT = {"proc": None}


def on_term(signum, frame):
    # The shell's trap sends TERM: end the row's process group (started by us, its own
    # session), then exit.
    p = CURRENT["proc"]
    if p is not None and p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    sys.exit(128 + signum)


def rss_wrapper():
    """GNU time -f '%M %U %S' when installed (its own footprint, ~2 MB, is the floor), else a
    tiny python that forks, execs and reports wait4's ru_maxrss (~9 MB floor) and CPU times:
    peak RSS KiB, user and system CPU seconds of the row's process and what it waited for."""
    t = shutil.which("time", path="/usr/bin:/bin")
    if t:
        p = subprocess.run([t, "-f", "%M %U %S", "-o", "/dev/null", "true"], capture_output=True)
        if p.returncode == 0:
            return "gnu-time", lambda out: [t, "-f", "%M %U %S", "-o", out]
    code = (
        "import os,sys\n"
        "pid=os.fork()\n"
        "if pid==0:\n"
        "  try: os.execvp(sys.argv[2],sys.argv[2:])\n"
        "  finally: os._exit(127)\n"
        "_,st,ru=os.wait4(pid,0)\n"
        "open(sys.argv[1],'w').write('%d %.2f %.2f\\n'%(ru.ru_maxrss,ru.ru_utime,ru.ru_stime))\n"
        "sys.exit(os.waitstatus_to_exitcode(st) & 255)\n"
    )
    return "python-wait4", lambda out: ["/usr/bin/python3", "-S", "-c", code, out]


def run_one(cmd, env, cwd, rss_file, log_file, wrap):
    full = wrap(rss_file) + cmd
    with open(log_file, "wb") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=err, env=env, cwd=cwd, start_new_session=True)
        CURRENT["proc"] = p
        out, _ = p.communicate()
        t1 = time.monotonic()
        CURRENT["proc"] = None
    rss = cpu = None
    try:
        with open(rss_file) as f:
            lines = [l for l in f.read().split("\n") if l.strip()]
        kib, user, system = lines[-1].split()
        rss, cpu = int(kib), float(user) + float(system)
    except (OSError, ValueError, IndexError):
        pass
    return p.returncode, t1 - t0, rss, cpu, out.decode(errors="replace")


# ---------------------------------------------------------------------------------------
# The fixtures and the rows.

def make_rows(codecs):
    """The rows: key, label (markdown), output name. A Parquet-writing row's key ends in
    `@CODEC`: every codec of QLIST_PEER_CODECS has qlist, DuckDB and Polars rows."""
    rows = [
        ("cat", "`cat` runs + fsync (the limit)", "cat.bin"),
        ("merger", "merger → list.bin", "list.bin"),
        ("jobs2", "merger → list.bin `--jobs 2`", "list.bin"),
    ]
    for i, c in enumerate(codecs):
        rows.append((f"merger-parquet@{c}", f"merger → list.parquet, {c}", "list.parquet"))
        if i == 0:
            # The same on the merge thread alone: what the encoder threads bring, same run.
            rows.append((f"parquet1@{c}", f"merger → list.parquet, {c}, `--encode-threads 0`", "list.parquet"))
        rows.append((f"duckdb@{c}", f"DuckDB `COPY … ORDER BY id`, {c}", "duck.parquet"))
        rows.append((f"polars@{c}", f"Polars `sort` + `sink_parquet`, {c}", "polars.parquet"))
    rows.append(("sort", "`LC_ALL=C sort -m` text + fsync", "sort.txt"))
    return rows


def row_cmd(key, fx, out, binary, helper, py):
    runs, S = fx["runs"], str(fx["shards"])
    key, _, codec = key.partition("@")
    if key == "cat":
        return ["sh", "-c", 'cat "$1"/*.bin > "$2" && sync "$2"', "sh", runs, out]
    if key == "merger":
        return [binary, "--runs", runs, "--expect-shards", S, "--out", out]
    if key == "merger-parquet":
        return [binary, "--runs", runs, "--expect-shards", S, "--out", out, "--compression", codec]
    if key == "parquet1":
        return [binary, "--runs", runs, "--expect-shards", S, "--out", out, "--compression", codec, "--encode-threads", "0"]
    if key == "jobs2":
        return [binary, "--runs", runs, "--expect-shards", S, "--out", out, "--jobs", "2"]
    if key in ("duckdb", "polars"):
        return [py, helper, key, os.path.join(fx["pq"], "*.parquet"), out, codec]
    if key == "sort":
        return [
            "sh",
            "-c",
            'LC_ALL=C sort -m --batch-size="$1" -T "$2" -o "$3" "$4"/*.txt && sync "$3"',
            "sh",
            S,
            os.path.dirname(out),
            out,
            fx["txt"],
        ]
    raise ValueError(key)


def check(key, out, fx, binary):
    key, _, codec = key.partition("@")
    if key == "cat":
        return check_cat(out, fx)
    if key in ("merger", "jobs2"):
        return check_listbin(out, fx, binary)
    if key == "sort":
        return check_text(out, fx)
    return check_parquet(out, fx, codec)


def prepare_fixture(fdir, shards, items, binary):
    """One untimed merge (the fixture's check, the common MB unit, and a warm page cache),
    and the fixture's ids from its Parquet inputs (count, min, max, sum, interleaving)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fx = {
        "dir": fdir,
        "shards": shards,
        "items": items,
        "runs": os.path.join(fdir, "runs"),
        "pq": os.path.join(fdir, "pq"),
        "txt": os.path.join(fdir, "txt"),
        "out": os.path.join(fdir, "out"),
        "binary": binary,
    }
    with open(os.path.join(fdir, "build.json")) as f:
        fx["build"] = json.load(f)
    os.makedirs(fx["out"], exist_ok=True)
    fx["runs_bytes"] = sum(
        os.path.getsize(os.path.join(fx["runs"], n)) for n in os.listdir(fx["runs"]) if n.endswith(".bin")
    )
    fx["pq_bytes"] = sum(os.path.getsize(os.path.join(fx["pq"], n)) for n in os.listdir(fx["pq"]))
    fx["txt_bytes"] = sum(os.path.getsize(os.path.join(fx["txt"], n)) for n in os.listdir(fx["txt"]))
    # The ids of the fixture, and how the shards interleave in ID order.
    ids, shard_of = [], []
    for n in sorted(os.listdir(fx["pq"])):
        t = pq.read_table(os.path.join(fx["pq"], n), columns=["id", "shard"])
        ids.append(t.column("id").combine_chunks())
        shard_of.append(t.column("shard").combine_chunks())
    allids = pa.concat_arrays(ids)
    allsh = pa.concat_arrays(shard_of)
    if len(allids) != items:
        raise SystemExit(f"bench: the fixture {fdir} holds {len(allids)} items, not {items}")
    mm = pc.min_max(allids).as_py()
    fx["min_id"], fx["max_id"] = mm["min"], mm["max"]
    fx["sum_id"] = pc.sum(allids).as_py() % (1 << 64)
    order = pc.sort_indices(allids)
    sh = pc.take(allsh, order)
    changes = pc.sum(pc.not_equal(sh[1:], sh[:-1]).cast(pa.int64())).as_py() if items > 1 else 0
    fx["stretch_mean"] = items / (changes + 1)
    fx["id_span"] = fx["max_id"] - fx["min_id"] + 1
    del allids, allsh, order, sh, ids, shard_of
    # The untimed merge.
    out = os.path.join(fx["out"], "list.bin")
    p = subprocess.run(
        [binary, "--runs", fx["runs"], "--expect-shards", str(shards), "--out", out], capture_output=True, text=True
    )
    if p.returncode != 0:
        raise SystemExit(f"bench: the untimed merge of {fx['runs']} failed: {p.stderr.strip()[-600:]}")
    check_listbin(out, fx, binary)
    fx["list_bytes"] = os.path.getsize(out)
    os.remove(out)
    return fx


def clear_dir(d):
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.remove(p)


def fmt_int(x):
    return f"{x:,.0f}"


def num(x, spec):
    """x formatted, or '-' when there is no value (every repetition failed)."""
    return "-" if x is None else format(x, spec)


def med(xs):
    return statistics.median(xs) if xs else None


def cmd_run(work, binary_dir, repo):
    signal.signal(signal.SIGTERM, on_term)
    env_in = os.environ
    shards_list = [int(s) for s in env_in.get("QLIST_PEER_SHARDS", "4 64").split()]
    items = int(env_in["QLIST_PEER_ITEMS"])
    reps = int(env_in["QLIST_PEER_REPS"])
    threads = env_in.get("QLIST_PEER_THREADS", "2")
    codecs = env_in.get("QLIST_PEER_CODECS", "snappy zstd:3").split()
    for c in codecs:
        codec_level(c)
    rows = make_rows(codecs)
    binary = os.path.join(binary_dir, "merger")
    helper = os.path.abspath(__file__)
    py = sys.executable
    wrap_name, wrap = rss_wrapper()
    env = dict(env_in, POLARS_MAX_THREADS=threads, QLIST_PEER_THREADS=threads, RUST_LOG=env_in.get("RUST_LOG", "warn"))
    tenth = items // 10

    def log(msg):
        print(f"bench: {msg}", file=sys.stderr, flush=True)

    fixtures = {}
    for S in shards_list:
        for frac, n in (("100", items), ("10", tenth)):
            log(f"preparing the fixture {S} shards, {n:,} items (untimed merge, ids)")
            fixtures[(S, frac)] = prepare_fixture(os.path.join(work, f"s{S}", f"f{frac}"), S, n, binary)

    results = {}  # (S, frac, key) -> list of reps
    stat_run0 = proc_stat()
    t_run0 = time.time()
    for rep in range(1, reps + 1):
        for S in shards_list:
            for frac in ("100", "10"):
                fx = fixtures[(S, frac)]
                for key, _, outname in rows:
                    out = os.path.join(fx["out"], outname)
                    clear_dir(fx["out"])
                    cmd = row_cmd(key, fx, out, binary, helper, py)
                    rss_file = os.path.join(work, "rss.txt")
                    log_file = os.path.join(work, f"log-s{S}-f{frac}-{key}-rep{rep}.txt")
                    if os.path.exists(rss_file):
                        os.remove(rss_file)
                    s0 = proc_stat()
                    rc, wall, rss, cpu, stdout = run_one(cmd, env, work, rss_file, log_file, wrap)
                    s1 = proc_stat()
                    r = {"rep": rep, "wall": wall, "rss": rss, "cpu": cpu, "rc": rc, "stat": stat_delta(s0, s1)}
                    if rc == 0 and key.partition("@")[0] in ("duckdb", "polars"):
                        try:
                            r["peer"] = json.loads(stdout.strip().splitlines()[-1])
                        except (ValueError, IndexError):
                            pass
                    if rc != 0:
                        with open(log_file, errors="replace") as f:
                            tail = f.read().strip()[-500:]
                        r["error"] = f"exit {rc}: {tail}"
                    else:
                        try:
                            r["check"], r["codec"] = check(key, out, fx, binary)
                            r["out_bytes"] = os.path.getsize(out)
                        except CheckFailed as e:
                            r["error"] = f"check failed: {e}"
                        except Exception as e:  # a reader that cannot read it at all
                            r["error"] = f"check failed: {type(e).__name__}: {e}"
                    results.setdefault((S, frac, key), []).append(r)
                    state = "ok" if "error" not in r else "FAILED: " + r["error"]
                    log(f"rep {rep}/{reps} {S} shards {frac}% {key}: {wall:.2f} s, CPU {cpu} s, {rss} KiB, {state}")
                    clear_dir(fx["out"])
    stat_run1 = proc_stat()
    t_run1 = time.time()
    whole = None
    try:
        with open(os.path.join(work, "stat0")) as f:
            whole = stat_delta([int(x) for x in f.readline().split()[1:9]], stat_run1)
    except (OSError, ValueError):
        pass

    report = make_report(
        fixtures, results, rows, codecs, shards_list, items, reps, threads, wrap_name, repo, work,
        stat_delta(stat_run0, stat_run1), whole, t_run0, t_run1,
    )
    print(report)
    rep_file = env_in.get("QLIST_PEER_REPORT")
    if rep_file:
        with open(rep_file, "w") as f:
            f.write(report + "\n")
        log(f"report written to {rep_file}")
    failures = sum(1 for rs in results.values() for r in rs if "error" in r)
    if failures:
        log(f"{failures} timed repetition(s) FAILED (see the table's 'failed' column and 'Failures')")
        return 3
    return 0


def summarize(rs, fx):
    ok = [r for r in rs if "error" not in r]
    wall = med([r["wall"] for r in ok])
    rss = [r["rss"] for r in ok if r["rss"] is not None]
    return {
        "wall": wall,
        "mbs": fx["list_bytes"] / wall / 1e6 if wall else None,
        "ips": fx["items"] / wall if wall else None,
        "rss": max(rss) if rss else None,
        "cpu": med([r["cpu"] for r in ok if r.get("cpu") is not None]),
        "failed": len(rs) - len(ok),
        "n": len(rs),
        "steal": steal_pct([r["stat"] for r in rs]),
        "busy": busy_pct([r["stat"] for r in rs]),
        "work": med([r["peer"]["work_s"] for r in ok if "peer" in r]),
        "import": med([r["peer"]["import_s"] for r in ok if "peer" in r]),
        "codec": next((r["codec"] for r in reversed(ok) if r.get("codec")), "-"),
        "out_bytes": next((r["out_bytes"] for r in reversed(ok) if r.get("out_bytes")), None),
    }


def machine(repo):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=repo).stdout.strip()
        except OSError:
            return "?"

    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "nproc": sh(["nproc"]),
        "mem": mem,
        "cpu": model,
        "kernel": sh(["uname", "-r"]),
        "commit": sh(["git", "rev-parse", "--short", "HEAD"]),
        "dirty": len(dirty.splitlines()) if dirty else 0,
        "sort": sh(["sort", "--version"]).splitlines()[0] if sh(["sort", "--version"]) else "?",
    }


def make_report(fixtures, results, rows, codecs, shards_list, items, reps, threads, wrap_name, repo, work, run_stat, whole_stat, t0, t1):
    import pyarrow

    labels = {k: l for k, l, _ in rows}

    L = []
    m = machine(repo)
    versions = {}
    for (_, _, key), rs in results.items():
        for r in rs:
            if "peer" in r:
                versions.setdefault(key.partition("@")[0], r["peer"]["version"])
    fs = subprocess.run(["df", "-T", work], capture_output=True, text=True).stdout.strip().splitlines()
    fstype = fs[-1].split()[1] if len(fs) > 1 else "?"
    L.append("## Merge against the data tools: scripts/bench-merge-peers.sh")
    L.append("")
    L.append(
        f"Run {time.strftime('%Y-%m-%d %H:%M', time.gmtime(t0))}-{time.strftime('%H:%M', time.gmtime(t1))} UTC "
        f"at commit {m['commit']}"
        + (f" (+{m['dirty']} uncommitted tracked file(s) in the work tree the binaries were built from)" if m["dirty"] else "")
        + f"; machine: nproc {m['nproc']}, {m['mem']}, {m['cpu']}, Linux {m['kernel']}, {fstype} under {work}."
    )
    L.append(
        f"CPU steal (vmstat's `st`, /proc/stat) over the timed rows **{steal_pct([run_stat]):.1f}%** "
        f"(busy {busy_pct([run_stat]):.0f}% of all CPUs)"
        + (f", over the whole script (fixtures included) {steal_pct([whole_stat]):.1f}%" if whole_stat else "")
        + "."
    )
    L.append(
        f"Command: `QLIST_PEER_ITEMS={items} QLIST_PEER_SHARDS=\"{' '.join(map(str, shards_list))}\" "
        f"QLIST_PEER_REPS={reps} QLIST_PEER_CODECS=\"{' '.join(codecs)}\" bash scripts/bench-merge-peers.sh`. "
        f"Tools: DuckDB {versions.get('duckdb', '?')} and "
        f"Polars {versions.get('polars', '?')} ({threads} threads each), pyarrow {pyarrow.__version__} (checks), "
        f"merger {merger_version(fixtures)}, "
        f"{m['sort']}; peak RSS by {'GNU time (%M)' if wrap_name == 'gnu-time' else 'a python fork/wait4 wrapper (~9 MB floor)'}."
    )
    L.append("")
    L.append(
        f"Medians of {reps} repetition(s), rows interleaved (repetition 1 of every row, then 2, ...); every output "
        "fsynced inside its timing and checked after it (count, strictly increasing ids, the fixture's first and "
        "last id; list.bin by `merger verify`; Parquet by pyarrow, also the sum of ids); every input read from the "
        "page cache (nothing dropped; an untimed merge of each fixture runs first); the output of each row removed "
        "before the next. MB/s = 10^6 bytes of the fixture's list.bin per second, for every row (the common unit, "
        "whatever the row writes); items/s = items / wall. Peak RSS: the largest of the repetitions. Wall "
        "includes starting the process (for DuckDB and Polars: python and the import, shown separately below)."
    )
    L.append("")
    L.append("Fixtures (real producer output: S `producer --generate` processes at once through one `idbroker` on a 3-node quorum, batches of 1000, sealed with `--seal-to`):")
    L.append("")
    L.append("| shards | items | built in (producers + seal) s | convert + text s | runs MB | list.bin MB | Parquet inputs MB (uncompressed) | text MB | mean stretch of one shard in ID order |")
    L.append("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for S in shards_list:
        for frac in ("100", "10"):
            fx = fixtures[(S, frac)]
            b = fx["build"]
            L.append(
                f"| {S} | {fmt_int(fx['items'])} | {b['produce_s']:.1f} | {b['convert_s']:.1f} | {fx['runs_bytes']/1e6:,.1f} | "
                f"{fx['list_bytes']/1e6:,.1f} | {fx['pq_bytes']/1e6:,.1f} | {fx['txt_bytes']/1e6:,.1f} | {fx['stretch_mean']:,.0f} ids |"
            )
    L.append("")
    L.append(
        "| shards | row | wall s | CPU s (user + sys) | MB/s | items/s | peak RSS KiB | 10%: wall s | 10%: peak RSS KiB | RSS 100% / 10% | steal % | output | failed |"
    )
    L.append("|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|")
    summ = {}
    for S in shards_list:
        for key, label, _ in rows:
            a = summ[(S, "100", key)] = summarize(results[(S, "100", key)], fixtures[(S, "100")])
            b = summ[(S, "10", key)] = summarize(results[(S, "10", key)], fixtures[(S, "10")])
            flat = f"{a['rss'] / b['rss']:.2f}" if a["rss"] and b["rss"] else "-"
            outdesc = "-"
            if a["out_bytes"]:
                outdesc = f"{a['out_bytes']/1e6:,.1f} MB" + (f", {a['codec'].lower()}" if a["codec"] not in ("-", None) else "")
            f_all = a["failed"] + b["failed"]
            L.append(
                f"| {S} | {label} | {num(a['wall'], '.2f')} | {num(a['cpu'], '.2f')} | {num(a['mbs'], ',.1f')} | {num(a['ips'], ',.0f')} | "
                f"{num(a['rss'], ',.0f')} | {num(b['wall'], '.2f')} | {num(b['rss'], ',.0f')} | {flat} | {a['steal']:.1f} | "
                f"{outdesc} | {'**' + str(f_all) + '**' if f_all else 0} of {a['n'] + b['n']} |"
            )
    L.append("")
    L.append("DuckDB and Polars: the wall above against the query alone (`COPY`/`sink_parquet` + fsync, timed inside the process) and python + the import:")
    L.append("")
    L.append("| shards | row | wall s | query + fsync s | python start + import s |")
    L.append("|--:|---|--:|--:|--:|")
    for S in shards_list:
        for key in [k for k, _, _ in rows if k.partition("@")[0] in ("duckdb", "polars")]:
            a = summ[(S, "100", key)]
            if a["wall"] and a["work"] is not None:
                imp = a["wall"] - a["work"]
                L.append(f"| {S} | {labels[key]} | {a['wall']:.2f} | {a['work']:.2f} | {imp:.2f} |")
            else:
                L.append(f"| {S} | {labels[key]} | - | - | - |")
    L.append("")

    def ratio(S, q, peer):
        a, b = summ[(S, "100", q)]["wall"], summ[(S, "100", peer)]["wall"]
        return b / a if a and b else None

    def ratio_work(S, q, peer):
        a, b = summ[(S, "100", q)]["wall"], summ[(S, "100", peer)]["work"]
        return b / a if a and b else None

    def ratio_best(S, q, peers):
        a = summ[(S, "100", q)]["wall"]
        walls = [summ[(S, "100", p)]["wall"] for p in peers]
        return min(walls) / a if a and all(walls) else None

    c0 = codecs[0]
    specs = [
        ("merger list.bin / `cat` + fsync", "merger", "cat", ">= 0.6", ratio),
        ("merger `--jobs 2` / merger", "jobs2", "merger", ">= 1.6", ratio),
        ("merger list.bin / DuckDB, " + c0, "merger", f"duckdb@{c0}", "> 1", ratio),
        ("merger list.bin / Polars, " + c0, "merger", f"polars@{c0}", "> 1", ratio),
        (f"merger list.parquet / the same `--encode-threads 0`, {c0}", f"merger-parquet@{c0}", f"parquet1@{c0}", "", ratio),
    ]
    for c in codecs:
        q = f"merger-parquet@{c}"
        specs += [
            (f"merger list.parquet / list.bin, {c}", q, "merger", ">= 0.5", ratio),
            (f"merger list.parquet / DuckDB, both {c}", q, f"duckdb@{c}", "", ratio),
            (f"merger list.parquet / Polars, both {c}", q, f"polars@{c}", "", ratio),
            (f"merger list.parquet / the best of DuckDB and Polars, all {c}", q, (f"duckdb@{c}", f"polars@{c}"), ">= 1.5", ratio_best),
            (f"merger list.parquet / DuckDB's query alone, {c}", q, f"duckdb@{c}", "", ratio_work),
            (f"merger list.parquet / Polars' query alone, {c}", q, f"polars@{c}", "", ratio_work),
        ]
    specs.append(("merger list.bin / `sort -m`", "merger", "sort", "", ratio))
    L.append("Ratios (throughput, from the medians of this run: > 1 means the first is faster):")
    L.append("")
    L.append("| ratio | " + " | ".join(f"{S} shards" for S in shards_list) + " | goal |")
    L.append("|---|" + "--:|" * len(shards_list) + "---|")
    for name, q, peer, goal, fn in specs:
        cells = []
        for S in shards_list:
            v = fn(S, q, peer)
            cells.append(f"{v:.2f}" if v else "-")
        L.append(f"| {name} | " + " | ".join(cells) + f" | {goal} |")
    L.append("")
    L.append("Rows: `cat` = `cat RUNS/*.bin > out && sync out` (every byte read and written once: the limit); "
             "merger = `merger --runs RUNS --expect-shards S --out OUT/list.bin` (`.parquet --compression CODEC`; "
             "`--jobs 2`: two ranges at once; `--encode-threads 0`: the row groups encoded on the merge thread, as "
             "before issue 47); DuckDB = `SET threads=N; COPY (SELECT * FROM read_parquet('PQ/*.parquet') ORDER BY "
             "id) TO 'OUT/duck.parquet' (FORMAT parquet, COMPRESSION C[, COMPRESSION_LEVEL L])` + fsync; Polars = "
             "`pl.scan_parquet('PQ/*.parquet').sort('id').sink_parquet('OUT/polars.parquet', compression=C[, "
             "compression_level=L])` + fsync, POLARS_MAX_THREADS=N. Every Parquet row names its codec (zstd:L: "
             "level L for all three) and its check reads the codec of every column chunk back; `sort -m` = `LC_ALL=C sort -m --batch-size=S` over one text "
             "file per run (`%020d id<TAB>shard<TAB>seq<TAB>payload`), then `sync`. The peers read the runs "
             "converted by `merger convert --compression none`; the 10% columns are the same rows on a fixture of "
             "a tenth of the items built the same way.")
    fails = [(k, r) for k, rs in results.items() for r in rs if "error" in r]
    L.append("")
    if fails:
        L.append(f"Failures ({len(fails)}):")
        L.append("")
        for (S, frac, key), r in fails:
            L.append(f"- {S} shards, {frac}%, {key}, repetition {r['rep']}: {r['error']}")
    else:
        L.append(f"Failures: none (every row of every repetition exited 0 and passed its check).")
    return "\n".join(L)


def merger_version(fixtures):
    binary = next(iter(fixtures.values()))["binary"]
    try:
        return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip().split()[-1]
    except (OSError, IndexError):
        return "?"


def main(argv):
    if len(argv) >= 2 and argv[1] == "duckdb" and len(argv) == 5:
        peer_duckdb(argv[2], argv[3], argv[4])
        return 0
    if len(argv) >= 2 and argv[1] == "polars" and len(argv) == 5:
        peer_polars(argv[2], argv[3], argv[4])
        return 0
    if len(argv) == 5 and argv[1] == "run":
        return cmd_run(argv[2], argv[3], argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
