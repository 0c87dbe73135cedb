"""Reads a qlist Parquet list with DuckDB and with pyarrow, for merger/tests/parquet.rs.

usage: parquet_read.py OUTDIR LO HI FILE...

FILE... is one list, or the parts of one in order. Writes OUTDIR/duckdb.jsonl and
OUTDIR/pyarrow.jsonl, every row in the order the reader returns it with no ORDER BY, one
JSON object per line as `merger cat --json` prints a record; prints one JSON object of
what the readers say about the file(s): aggregates, types, row groups and their
statistics, sorting columns, the qlist.list metadata, and an ID-range query.
"""

import json
import os
import sys

import duckdb
import pyarrow.parquet as pq


def record(id_, shard, seq, payload):
    """A row as `merger cat --json` prints it."""
    obj = {"id": id_, "shard": shard, "seq": seq}
    try:
        obj["payload"] = payload.decode("utf-8")
    except UnicodeDecodeError:
        obj["payload_hex"] = payload.hex()
    return obj


def write_rows(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(record(*r)))
            f.write("\n")


def with_duckdb(files, lo, hi, outdir):
    con = duckdb.connect()
    src = "read_parquet(?)"
    count, mn, mx, total = con.execute(
        f"SELECT count(*), min(id), max(id), sum(id) FROM {src}", [files]
    ).fetchone()
    rows = con.execute(f"SELECT id, shard, seq, payload FROM {src}", [files]).fetchall()
    write_rows(os.path.join(outdir, "duckdb.jsonl"), rows)
    ordered = con.execute(
        f"SELECT id FROM {src} ORDER BY id", [files]
    ).fetchall()
    in_range = con.execute(
        f"SELECT count(*) FROM {src} WHERE id BETWEEN ? AND ?", [files, lo, hi]
    ).fetchone()[0]
    types = con.execute(f"DESCRIBE SELECT * FROM {src}", [files]).fetchall()
    # Per row group, as DuckDB reads the footer: min and max of id (its statistics).
    groups = con.execute(
        "SELECT stats_min_value, stats_max_value FROM parquet_metadata(?) WHERE path_in_schema = 'id' "
        "ORDER BY file_name, row_group_id",
        [files],
    ).fetchall()
    return {
        "count": count,
        "min": None if mn is None else str(mn),
        "max": None if mx is None else str(mx),
        "sum": None if total is None else str(total),
        "order_by_is_noop": [r[0] for r in rows] == [r[0] for r in ordered],
        "range_count": in_range,
        "types": [[t[0], t[1]] for t in types],
        "id_stats": [[g[0], g[1]] for g in groups],
    }


def with_pyarrow(files, lo, hi, outdir):
    rows = []
    groups = []
    sorting = []
    meta = []
    types = None
    for path in files:
        f = pq.ParquetFile(path)
        types = [[field.name, str(field.type)] for field in f.schema_arrow]
        kv = f.metadata.metadata or {}
        meta.append(json.loads(kv[b"qlist.list"]) if b"qlist.list" in kv else None)
        for i in range(f.metadata.num_row_groups):
            rg = f.metadata.row_group(i)
            st = rg.column(0).statistics
            groups.append([str(st.min), str(st.max)] if st is not None and st.has_min_max else None)
            sorting.append([[c.column_index, c.descending] for c in (rg.sorting_columns or [])])
        t = f.read()
        rows.extend(
            zip(
                t.column("id").to_pylist(),
                t.column("shard").to_pylist(),
                t.column("seq").to_pylist(),
                t.column("payload").to_pylist(),
            )
        )
    write_rows(os.path.join(outdir, "pyarrow.jsonl"), rows)
    ids = [r[0] for r in rows]
    # The row groups a reader must read for ids lo..=hi, by their statistics alone.
    needed = sum(1 for g in groups if g is None or not (int(g[1]) < lo or int(g[0]) > hi))
    return {
        "count": len(rows),
        "min": str(min(ids)) if ids else None,
        "max": str(max(ids)) if ids else None,
        "sum": str(sum(ids)) if ids else None,
        "increasing": all(a < b for a, b in zip(ids, ids[1:])),
        "types": types,
        "row_groups": len(groups),
        "row_groups_for_range": needed,
        "id_stats": groups,
        "sorting_columns": sorting,
        "qlist": meta,
    }


def main():
    outdir, lo, hi, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    print(
        json.dumps(
            {
                "duckdb": with_duckdb(files, lo, hi, outdir),
                "pyarrow": with_pyarrow(files, lo, hi, outdir),
            }
        )
    )


if __name__ == "__main__":
    main()
