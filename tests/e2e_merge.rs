//! End to end: 4 real `producer` processes (3 generating items, 1 reading a file) stamp
//! items with IDs from a real local Redis quorum, concurrently, then `merger` merges their
//! sublists. list.bin must hold every input item exactly once, in strictly increasing ID
//! order, each shard's items in their input order, and `merger verify` must pass. And
//! items of any bytes (`--input-format frames`) through sealed runs to `merger cat --json`.
//!
//! The binaries are not built by `cargo test` for the root package: run
//! `cargo build --release --workspace --bins` first (CI does).

mod common;

use common::{bin, check_output};
use idtools::cluster::LocalQuorum;
use qformat::Record;
use std::collections::BTreeMap;
use std::process::Command;
use testkit::frames;

const PAYLOAD_SIZE: usize = 64;
/// Items per generating producer: enough for many batches and interleaved IDs, small
/// enough for a quick test.
const GENERATED: [u64; 3] = [3000, 2000, 1];
const FILE_ITEMS: u64 = 1500;

fn file_line(i: u64) -> Vec<u8> {
    format!("line {i} \u{e9}\tend").into_bytes()
}

#[test]
fn four_producers_then_merge() {
    let (producer, merger) = (bin("producer"), bin("merger"));
    let quorum = LocalQuorum::temp(5)
        .expect("start a local 5-node redis quorum (is redis-server installed?)");
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let input = tmp.path().join("input.txt");
    let mut text = Vec::new();
    for i in 0..FILE_ITEMS {
        text.extend_from_slice(&file_line(i));
        text.push(b'\n');
    }
    std::fs::write(&input, &text).expect("write producer input");

    let urls = quorum.urls_arg();
    let mut children = Vec::new();
    for (shard, count) in GENERATED.iter().enumerate() {
        let child = Command::new(&producer)
            .args(["--shard", &shard.to_string(), "--data-dir"])
            .arg(&data)
            .args(["--nodes", &urls, "--generate", &count.to_string()])
            .args([
                "--payload-size",
                &PAYLOAD_SIZE.to_string(),
                "--batch",
                "100",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn producer");
        children.push((shard, child));
    }
    let child = Command::new(&producer)
        .args(["--shard", "3", "--data-dir"])
        .arg(&data)
        .args(["--nodes", &urls, "--input"])
        .arg(&input)
        .args(["--batch", "70"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn producer");
    children.push((3, child));
    for (shard, child) in children {
        let out = child.wait_with_output().expect("wait for producer");
        check_output(&out, &format!("producer --shard {shard}"));
    }

    let list = tmp.path().join("list.bin");
    let out = Command::new(&merger)
        .arg("--out")
        .arg(&list)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .expect("run merger");
    check_output(&out, "merger --out");
    let total: u64 = GENERATED.iter().sum::<u64>() + FILE_ITEMS;
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("merged {total} items from 4 shards")),
        "{out:?}"
    );
    let out = Command::new(&merger)
        .arg("verify")
        .arg(&list)
        .output()
        .expect("run merger verify");
    check_output(&out, "merger verify");

    // Strict ID order, framing and checksum are checked by the reader itself.
    let records: Vec<Record> = qformat::read_list(&list)
        .expect("open list.bin")
        .collect::<Result<_, _>>()
        .expect("valid list.bin");
    assert_eq!(records.len() as u64, total);
    let mut seqs: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for r in &records {
        let expected = match r.shard {
            0..=2 => producer::generate_payload(r.shard, r.seq, PAYLOAD_SIZE),
            3 => file_line(r.seq),
            other => panic!("record {} from unknown shard {other}", r.id),
        };
        assert_eq!(
            r.payload, expected,
            "payload of shard {} seq {}",
            r.shard, r.seq
        );
        seqs.entry(r.shard).or_default().push(r.seq);
    }
    // Each shard's items appear exactly once each, in input order: seqs 0, 1, 2, ...
    for (shard, count) in GENERATED.iter().copied().chain([FILE_ITEMS]).enumerate() {
        let got = seqs.remove(&(shard as u32)).unwrap_or_default();
        assert!(
            got.iter().copied().eq(0..count),
            "shard {shard}: seqs out of input order or missing ({} items)",
            got.len()
        );
    }
}

/// Items of any bytes, end to end as a user sees them: two producers read frames (one from
/// a file, one from stdin) with newlines, NUL bytes, empty items and invalid UTF-8, seal
/// their runs, `merger` merges the runs, and `merger cat --json` prints every item back
/// byte for byte (`payload` for UTF-8, `payload_hex` otherwise), in ID order.
#[test]
fn frames_round_trip_through_merger_cat_json() {
    let (producer, merger) = (bin("producer"), bin("merger"));
    let quorum = LocalQuorum::temp(3)
        .expect("start a local 3-node redis quorum (is redis-server installed?)");
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, runs) = (tmp.path().join("data"), tmp.path().join("runs"));
    std::fs::create_dir(&runs).expect("runs dir");
    let mut items: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"\n".to_vec(),
        b"two\nlines\n".to_vec(),
        b"\0".to_vec(),
        b"nul\0inside".to_vec(),
        b"crlf\r\n".to_vec(),
        b"".to_vec(),
        vec![0xff, 0xfe, 0x00, b'\n'],
        (0..=255u8).collect(),
        "utf-8 \u{e9}\t\"quoted\"\\".as_bytes().to_vec(),
    ];
    for i in 0..200u32 {
        items.push(format!("item {i}\n{}", "\0".repeat((i % 3) as usize)).into_bytes());
    }
    let want: [Vec<Vec<u8>>; 2] = [items.clone(), items.iter().rev().cloned().collect()];
    let input = tmp.path().join("items.frames");
    std::fs::write(&input, frames(&want[0])).expect("write input");

    let urls = quorum.urls_arg();
    let producer_cmd = |shard: &str, input: &std::path::Path| {
        let mut cmd = Command::new(&producer);
        cmd.args(["--shard", shard, "--data-dir"])
            .arg(&data)
            .args([
                "--nodes",
                &urls,
                "--input-format",
                "frames",
                "--batch",
                "16",
            ])
            .arg("--input")
            .arg(input)
            .arg("--seal-to")
            .arg(&runs);
        cmd
    };
    let out = producer_cmd("0", &input).output().expect("run producer");
    check_output(&out, "producer --shard 0 --input FILE");
    let mut child = producer_cmd("1", std::path::Path::new("-"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn producer");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(&frames(&want[1])).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait for producer");
    check_output(&out, "producer --shard 1 --input -");

    let list = tmp.path().join("list.bin");
    let out = Command::new(&merger)
        .arg("--runs")
        .arg(&runs)
        .args(["--expect-shards", "2", "--out"])
        .arg(&list)
        .output()
        .expect("run merger");
    check_output(&out, "merger --runs");
    let out = Command::new(&merger)
        .args(["cat", "--json"])
        .arg(&list)
        .output()
        .expect("run merger cat");
    check_output(&out, "merger cat --json");

    let mut got: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    let mut last_id = 0;
    let text = String::from_utf8(out.stdout).expect("merger cat --json prints UTF-8");
    for (n, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {n} is not one JSON object ({e}): {line}"));
        let id = v["id"].as_u64().expect("id");
        assert!(id > last_id, "line {n}: id {id} after {last_id}");
        last_id = id;
        let shard = v["shard"].as_u64().expect("shard") as usize;
        assert!(shard < 2, "line {n}: shard {shard}");
        assert_eq!(
            v["seq"].as_u64(),
            Some(got[shard].len() as u64),
            "line {n}: seq"
        );
        let payload = match (v["payload"].as_str(), v["payload_hex"].as_str()) {
            (Some(s), None) => s.as_bytes().to_vec(),
            (None, Some(hex)) => (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect(),
            _ => panic!("line {n}: want exactly one of payload, payload_hex: {line}"),
        };
        got[shard].push(payload);
    }
    for shard in 0..2 {
        assert_eq!(got[shard].len(), want[shard].len(), "shard {shard}: items");
        for (i, (g, w)) in got[shard].iter().zip(&want[shard]).enumerate() {
            assert!(g == w, "shard {shard} item {i}: {g:?} != {w:?}");
        }
    }
}
