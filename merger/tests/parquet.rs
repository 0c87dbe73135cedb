//! `merger --out list.parquet` and `merger convert`, read by the real readers: DuckDB and
//! pyarrow (PyPI, in the venv scripts/deps.sh makes) read exactly the list `merger cat`
//! prints, with the types, order, statistics and metadata docs/list-format.md promises.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const OUTPUT: i32 = 4;

/// The venv's python with duckdb and pyarrow (scripts/deps.sh); a missing one fails the
/// test, naming what to run.
fn python() -> PathBuf {
    let venv = std::env::var("QLIST_PY").unwrap_or_else(|_| "/var/tmp/qlist-py".into());
    let python = Path::new(&venv).join("bin/python");
    let probe = Command::new(&python)
        .args(["-c", "import duckdb, pyarrow"])
        .output();
    match probe {
        Ok(o) if o.status.success() => python,
        Ok(o) => panic!(
            "{} cannot import duckdb and pyarrow ({}): run `bash scripts/deps.sh`",
            python.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "{}: {e}: the Parquet readers' venv is missing; run `bash scripts/deps.sh`",
            python.display()
        ),
    }
}

/// What the readers returned for some Parquet file(s).
struct Read {
    facts: Value,
    duckdb: Vec<Value>,
    pyarrow: Vec<Value>,
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("read rows")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect()
}

/// Runs tests/parquet_read.py on `files` (one list or its parts in order), asking also
/// for the rows with IDs `lo..=hi`.
fn read(files: &[&Path], lo: u64, hi: u64) -> Read {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/parquet_read.py");
    let out = Command::new(python())
        .arg(script)
        .arg(dir.path())
        .arg(lo.to_string())
        .arg(hi.to_string())
        .args(files)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "parquet_read.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Read {
        facts: serde_json::from_slice(&out.stdout).expect("facts JSON"),
        duckdb: lines(&dir.path().join("duckdb.jsonl")),
        pyarrow: lines(&dir.path().join("pyarrow.jsonl")),
    }
}

/// `merger cat --json` of `files`, parsed.
fn cat_values(files: &[&Path]) -> Vec<Value> {
    cat(files)
        .iter()
        .map(|l| serde_json::from_str(l).expect("cat JSON"))
        .collect()
}

fn ids(rows: &[Value]) -> Vec<u64> {
    rows.iter().map(|r| r["id"].as_u64().expect("id")).collect()
}

/// Both readers return `want` row for row, and agree with it on count, min, max and sum.
#[track_caller]
fn same_rows(got: &Read, want: &[Value]) {
    assert_eq!(got.duckdb.len(), want.len(), "DuckDB row count");
    assert!(got.duckdb == want, "DuckDB's rows differ from merger cat");
    assert!(got.pyarrow == want, "pyarrow's rows differ from merger cat");
    let ids = ids(want);
    let sum: u128 = ids.iter().map(|&i| u128::from(i)).sum();
    let text = |v: Option<u64>| v.map_or(Value::Null, |v| Value::from(v.to_string()));
    for reader in ["duckdb", "pyarrow"] {
        let f = &got.facts[reader];
        assert_eq!(f["count"], Value::from(ids.len()), "{reader} count");
        assert_eq!(f["min"], text(ids.first().copied()), "{reader} min");
        assert_eq!(f["max"], text(ids.last().copied()), "{reader} max");
        let sum = if ids.is_empty() {
            Value::Null
        } else {
            Value::from(sum.to_string())
        };
        assert_eq!(f["sum"], sum, "{reader} sum");
    }
}

fn types(facts: &Value) -> (Value, Value) {
    (
        facts["duckdb"]["types"].clone(),
        facts["pyarrow"]["types"].clone(),
    )
}

#[test]
fn duckdb_and_pyarrow_read_exactly_the_list_merger_cat_prints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    make_shards(&data, 4, 20_000);
    let bin = dir.path().join("list.bin");
    let pq = dir.path().join("list.parquet");
    ok(&merger(&["--out", s(&bin), "--data-dir", s(&data)]));
    let said = ok(&merger(&[
        "--out",
        s(&pq),
        "--data-dir",
        s(&data),
        "--row-group-rows",
        "1000",
    ]));
    assert!(
        said.contains("merged 20000 items from 4 shards")
            && said.contains("as Parquet (20 row groups)"),
        "{said}"
    );
    let want = cat_values(&[&bin]);
    // An ID range well inside one row group (ids are 1..=20000, 1000 rows a group).
    let (lo, hi) = (5_100, 5_300);
    let got = read(&[&pq], lo, hi);
    same_rows(&got, &want);

    let (duck, arrow) = types(&got.facts);
    assert_eq!(
        duck,
        serde_json::json!([
            ["id", "UBIGINT"],
            ["shard", "UINTEGER"],
            ["seq", "UBIGINT"],
            ["payload", "BLOB"]
        ])
    );
    assert_eq!(
        arrow,
        serde_json::json!([
            ["id", "uint64"],
            ["shard", "uint32"],
            ["seq", "uint64"],
            ["payload", "binary"]
        ])
    );

    // Already in order: the file's order is the ID order, and every row group says so.
    let p = &got.facts["pyarrow"];
    assert_eq!(p["increasing"], Value::Bool(true));
    assert_eq!(got.facts["duckdb"]["order_by_is_noop"], Value::Bool(true));
    assert_eq!(p["row_groups"], Value::from(20));
    for sorting in p["sorting_columns"].as_array().expect("sorting") {
        assert_eq!(
            *sorting,
            serde_json::json!([[0, false]]),
            "a row group's sorting columns"
        );
    }

    // The statistics let a reader skip what a range query does not need: one row group
    // of 20 holds ids 5100..=5300, and both readers see the same statistics.
    assert_eq!(p["row_groups_for_range"], Value::from(1));
    let in_range = want
        .iter()
        .filter(|r| (lo..=hi).contains(&r["id"].as_u64().unwrap_or(0)))
        .count();
    assert_eq!(got.facts["duckdb"]["range_count"], Value::from(in_range));
    assert_eq!(got.facts["duckdb"]["id_stats"], p["id_stats"]);

    // What a run's footer says, in the qlist.list metadata.
    let meta = &p["qlist"][0];
    assert_eq!(meta["records"], Value::from(20_000));
    assert_eq!(meta["part"]["count"], Value::from(1));
    let shards = meta["shards"].as_array().expect("shards");
    assert_eq!(shards.len(), 4);
    assert!(shards.iter().all(|s| s["finished"] == Value::Bool(true)
        && s["count"] == s["total"]
        && s["first_seq"] == 0));

    // Uncompressed (snappy is the default): the same rows.
    let plain = dir.path().join("plain.parquet");
    ok(&merger(&[
        "--out",
        s(&plain),
        "--data-dir",
        s(&data),
        "--compression",
        "none",
    ]));
    same_rows(&read(&[&plain], lo, hi), &want);
}

#[test]
fn an_empty_list_ids_near_the_top_and_empty_and_largest_payloads() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Empty: one finished sublist with no items.
    let empty = dir.path().join("empty");
    make_shard(&empty, 0, &[], true);
    let pq = dir.path().join("empty.parquet");
    ok(&merger(&["--out", s(&pq), "--data-dir", s(&empty)]));
    let got = read(&[&pq], 0, u64::MAX);
    same_rows(&got, &[]);
    let (duck, _) = types(&got.facts);
    assert_eq!(
        duck[0],
        serde_json::json!(["id", "UBIGINT"]),
        "typed though empty"
    );
    assert_eq!(got.facts["pyarrow"]["row_groups"], Value::from(0));

    // IDs near u64::MAX (UInt64, not Int64: no negative numbers), an empty payload and
    // one of the largest size a payload may have.
    let data = dir.path().join("data");
    let top = [1, 2, u64::MAX - 3, u64::MAX - 1];
    let largest = qformat::MAX_PAYLOAD;
    make_shard_with(
        &data,
        0,
        &top,
        |id| match id {
            1 => Vec::new(),
            2 => vec![0xff; largest],
            _ => payload(id),
        },
        true,
    );
    make_shard(&data, 1, &[3, u64::MAX - 2], true);
    let bin = dir.path().join("list.bin");
    let pq = dir.path().join("top.parquet");
    ok(&merger(&["--out", s(&bin), "--data-dir", s(&data)]));
    ok(&merger(&["--out", s(&pq), "--data-dir", s(&data)]));
    let want = cat_values(&[&bin]);
    assert_eq!(want.len(), 6);
    let got = read(&[&pq], u64::MAX - 2, u64::MAX);
    same_rows(&got, &want);
    assert_eq!(
        got.facts["duckdb"]["max"],
        Value::from((u64::MAX - 1).to_string())
    );
    assert_eq!(got.facts["duckdb"]["range_count"], Value::from(2));
    assert_eq!(got.pyarrow[0]["payload"], Value::from(""));
    let hex = got.pyarrow[1]["payload_hex"]
        .as_str()
        .expect("binary payload");
    assert_eq!(hex.len(), 2 * largest);
}

#[test]
fn parts_jobs_and_convert_write_the_same_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sublists = make_shards(&data, 4, 12_000);
    let runs = dir.path().join("runs");
    seal_all(&sublists, &runs);
    let bin = dir.path().join("list.bin");
    ok(&merger(&["--out", s(&bin), "--runs", s(&runs)]));
    let want = cat_values(&[&bin]);

    // Parts: one Parquet file each, as Spark writes them; in order they are the list.
    let parts_dir = dir.path().join("parts");
    std::fs::create_dir(&parts_dir).expect("mkdir");
    let mut parts = Vec::new();
    let mut bin_parts = Vec::new();
    for i in 0..3 {
        let part = parts_dir.join(format!("part-{i}.parquet"));
        let said = ok(&merger(&[
            "--out",
            s(&part),
            "--runs",
            s(&runs),
            "--part",
            &format!("{i}/3"),
        ]));
        assert!(said.contains(&format!("part {i}/3")), "{said}");
        parts.push(part);
        let bin_part = dir.path().join(format!("part-{i}.bin"));
        ok(&merger(&[
            "--out",
            s(&bin_part),
            "--runs",
            s(&runs),
            "--part",
            &format!("{i}/3"),
        ]));
        bin_parts.push(bin_part);
    }
    let part_refs: Vec<&Path> = parts.iter().map(PathBuf::as_path).collect();
    let got = read(&part_refs, 0, 0);
    same_rows(&got, &want);
    for (i, meta) in got.facts["pyarrow"]["qlist"]
        .as_array()
        .expect("metadata")
        .iter()
        .enumerate()
    {
        assert_eq!(meta["part"]["index"], Value::from(i));
        assert_eq!(meta["part"]["count"], Value::from(3));
    }

    // --jobs: one file, the same rows.
    let jobs = dir.path().join("jobs.parquet");
    ok(&merger(&[
        "--out",
        s(&jobs),
        "--runs",
        s(&runs),
        "--jobs",
        "3",
    ]));
    same_rows(&read(&[&jobs], 0, 0), &want);

    // convert: a list.bin, and the list.bin parts of a split in order.
    let converted = dir.path().join("converted.parquet");
    let said = ok(&merger(&["convert", s(&bin), "--out", s(&converted)]));
    assert!(
        said.contains("converted 12000 items from 4 shards"),
        "{said}"
    );
    same_rows(&read(&[&converted], 0, 0), &want);
    let from_parts = dir.path().join("from-parts.parquet");
    let mut args = vec!["convert", "--out", s(&from_parts)];
    args.extend(bin_parts.iter().map(|p| s(p)));
    ok(&merger(&args));
    let got = read(&[&from_parts], 0, 0);
    same_rows(&got, &want);
    assert_eq!(
        got.facts["pyarrow"]["qlist"][0]["part"]["count"],
        Value::from(1)
    );
    // One part alone converts to that part.
    let one = dir.path().join("one.parquet");
    ok(&merger(&["convert", s(&bin_parts[1]), "--out", s(&one)]));
    let got = read(&[&one], 0, 0);
    assert_eq!(
        got.facts["pyarrow"]["qlist"][0]["part"]["index"],
        Value::from(1)
    );
    assert_eq!(got.duckdb, cat_values(&[&bin_parts[1]]));
}

/// Row groups encoded on threads while the merge or the conversion goes on: the same
/// bytes as on the merge thread alone, with every codec, and readers read them back.
#[test]
fn encoder_threads_write_the_bytes_of_one_thread() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sublists = make_shards(&data, 3, 9_000);
    let runs = dir.path().join("runs");
    seal_all(&sublists, &runs);
    let bin = dir.path().join("list.bin");
    ok(&merger(&["--out", s(&bin), "--runs", s(&runs)]));
    let want = cat_values(&[&bin]);
    for codec in ["snappy", "zstd", "zstd:1", "none"] {
        let mut files = Vec::new();
        for threads in ["0", "1", "3"] {
            let common = ["--compression", codec, "--row-group-rows", "700"];
            let common = common.iter().copied().chain(["--encode-threads", threads]);
            let merged = dir.path().join(format!("merged-{codec}-{threads}.parquet"));
            let mut args = vec!["--out", s(&merged), "--runs", s(&runs)];
            args.extend(common.clone());
            ok(&merger(&args));
            let converted = dir
                .path()
                .join(format!("converted-{codec}-{threads}.parquet"));
            let mut args = vec!["convert", s(&bin), "--out", s(&converted)];
            args.extend(common);
            ok(&merger(&args));
            files.push((threads, merged, converted));
        }
        let bytes = |p: &Path| std::fs::read(p).expect("read");
        let (_, merged0, converted0) = &files[0];
        for (threads, merged, converted) in &files[1..] {
            assert!(
                bytes(merged) == bytes(merged0),
                "{codec}: the merge with {threads} encoder threads wrote other bytes"
            );
            assert!(
                bytes(converted) == bytes(converted0),
                "{codec}: the conversion with {threads} encoder threads wrote other bytes"
            );
        }
        same_rows(&read(&[&files[2].1], 0, 0), &want);
        same_rows(&read(&[&files[2].2], 0, 0), &want);
    }
}

#[test]
fn a_failed_merge_or_conversion_leaves_no_file_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // Shards 0 and 1 both hold id 3: the merge fails at the duplicate.
    make_shard(&data, 0, &[1, 3, 5], true);
    make_shard(&data, 1, &[2, 3, 4], true);
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let pq = out_dir.join("list.parquet");
    let err = fails(
        &merger(&["--out", s(&pq), "--data-dir", s(&data)]),
        INPUT,
        &["duplicate id 3", "nothing written there"],
    );
    assert!(err.contains(s(&pq)), "{err}");
    assert!(
        names(&out_dir).is_empty(),
        "left behind: {:?}",
        names(&out_dir)
    );

    // A place nothing can be created in, even by root.
    let nowhere = "/proc/qlist-test-list.parquet";
    let data_ok = dir.path().join("ok");
    make_shard(&data_ok, 0, &[1, 2], true);
    fails(
        &merger(&["--out", nowhere, "--data-dir", s(&data_ok)]),
        OUTPUT,
        &[nowhere],
    );
    assert!(!Path::new(nowhere).exists());

    // convert: a missing input, an input that is no run, the output as its own input.
    let bin = dir.path().join("list.bin");
    ok(&merger(&["--out", s(&bin), "--data-dir", s(&data_ok)]));
    let out = out_dir.join("c.parquet");
    fails(
        &merger(&[
            "convert",
            s(&dir.path().join("missing.bin")),
            "--out",
            s(&out),
        ]),
        INPUT,
        &["missing.bin"],
    );
    let not_a_run = dir.path().join("notes.txt");
    std::fs::write(&not_a_run, "not a list").expect("write");
    fails(
        &merger(&["convert", s(&not_a_run), "--out", s(&out)]),
        INPUT,
        &["notes.txt"],
    );
    fails(
        &merger(&["convert", s(&bin), "--out", s(&bin)]),
        USAGE,
        &["it is the input"],
    );
    assert!(
        names(&out_dir).is_empty(),
        "left behind: {:?}",
        names(&out_dir)
    );
    // A Parquet list is for reading elsewhere: merger says so where it expects a run.
    let pq = dir.path().join("ok.parquet");
    ok(&merger(&["--out", s(&pq), "--data-dir", s(&data_ok)]));
    let again = out_dir.join("again.bin");
    for args in [
        vec!["cat", s(&pq)],
        vec!["verify", s(&pq)],
        vec!["convert", s(&pq), "--out", s(&out)],
        vec!["--out", s(&again), s(&pq)],
    ] {
        fails(&merger(&args), INPUT, &["is a Parquet file", "DuckDB"]);
    }
    assert!(
        names(&out_dir).is_empty(),
        "left behind: {:?}",
        names(&out_dir)
    );
    fails(
        &merger(&[
            "--out",
            s(&again),
            "--data-dir",
            s(&data_ok),
            "--format",
            "parquet",
        ]),
        USAGE,
        &["would be taken for a run"],
    );
    fails(
        &merger(&[
            "--out",
            s(&out),
            "--data-dir",
            s(&data_ok),
            "--compression",
            "lz77",
        ]),
        USAGE,
        &["expected none, snappy, zstd or zstd:LEVEL"],
    );
}

/// A Parquet output in S3 (a real SeaweedFS): from runs there, and converted from a
/// list.bin there; the objects, fetched, read as the same list.
#[test]
fn parquet_to_and_from_s3() {
    let s3 = testkit::s3::TestS3::start("qlist-parquet");
    let dir = tempfile::tempdir().expect("tempdir");
    let sublists = make_shards(&dir.path().join("data"), 3, 5_000);
    let run_with = |args: &[&str]| {
        Command::new(MERGER)
            .args(args)
            .envs(s3.env())
            .env("RUST_LOG", "warn")
            .output()
            .expect("run merger")
    };
    for (i, sub) in sublists.iter().enumerate() {
        ok(&run_with(&[
            "--out",
            &s3.url(&format!("runs/shard-{i}.bin")),
            s(sub),
        ]));
    }
    let bin = dir.path().join("list.bin");
    ok(&run_with(&["--out", s(&bin), "--runs", &s3.url("runs")]));
    let want = cat_values(&[&bin]);

    ok(&run_with(&[
        "--out",
        &s3.url("out/list.parquet"),
        "--runs",
        &s3.url("runs"),
    ]));
    ok(&run_with(&[
        "--out",
        &s3.url("out/list.bin"),
        "--runs",
        &s3.url("runs"),
    ]));
    ok(&run_with(&[
        "convert",
        &s3.url("out/list.bin"),
        "--out",
        &s3.url("out/converted.parquet"),
    ]));
    for key in ["out/list.parquet", "out/converted.parquet"] {
        let bytes = s3
            .get(key)
            .unwrap_or_else(|| panic!("{key} not in the bucket"));
        let local = dir.path().join(key.replace('/', "-"));
        std::fs::write(&local, bytes).expect("write the fetched object");
        same_rows(&read(&[&local], 0, 0), &want);
    }
}

/// `merger follow --format parquet`: one Parquet file per part; DuckDB and pyarrow read
/// the parts as one dataset, exactly the batch merge of the same source, and DuckDB reads
/// the directory by a glob.
#[test]
fn a_parquet_follow_is_read_as_one_dataset() {
    use common::publish::{part_files, Dest, Plan};
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let mut plan = Plan::new(3, 12_000);
    plan.run(Dest::Dir(&src), 6, |_| {});
    ok(&merger(&[
        "follow",
        "--runs",
        s(&src),
        "--expect-shards",
        "3",
        "--out-dir",
        s(&out),
        "--format",
        "parquet",
        "--part-bytes",
        "200000",
    ]));
    let parts = part_files(&out, "parquet");
    assert!(parts.len() >= 2, "{parts:?}");
    let list = tmp.path().join("list.bin");
    ok(&merger(&["--runs", s(&src), "--out", s(&list)]));
    let want = cat_values(&[&list]);
    let refs: Vec<&Path> = parts.iter().map(PathBuf::as_path).collect();
    same_rows(&read(&refs, 1, 100), &want);
    let glob = format!("{}/*.parquet", out.display());
    let q = Command::new(python())
        .args([
            "-c",
            "import duckdb, sys; print(duckdb.connect().execute(\"SELECT count(*), count(DISTINCT id), max(id) FROM read_parquet(?)\", [sys.argv[1]]).fetchone())",
            &glob,
        ])
        .output()
        .expect("python");
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    assert_eq!(
        String::from_utf8_lossy(&q.stdout).trim(),
        "(12000, 12000, 12000)"
    );
    // Started again on the complete follow, it writes nothing more.
    ok(&merger(&[
        "follow",
        "--runs",
        s(&src),
        "--expect-shards",
        "3",
        "--out-dir",
        s(&out),
        "--format",
        "parquet",
    ]));
    assert_eq!(part_files(&out, "parquet"), parts);
}
