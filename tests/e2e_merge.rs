//! End to end: 4 real `producer` processes (3 generating items, 1 reading a file) stamp
//! items with IDs from a real local Redis quorum, concurrently, then `merger` merges their
//! sublists. list.bin must hold every input item exactly once, in strictly increasing ID
//! order, each shard's items in their input order, and `merger verify` must pass.
//!
//! The binaries are not built by `cargo test` for the root package: run
//! `cargo build --release --workspace --bins` first (CI does).

mod common;

use common::{bin, check_output};
use idtools::cluster::LocalQuorum;
use qformat::Record;
use std::collections::BTreeMap;
use std::process::Command;

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
