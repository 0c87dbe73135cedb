//! `producer --input-format frames`: items of any bytes as length-prefixed frames, from a
//! file or stdin; the binary as OS processes, a real redis-server quorum, real RocksDB.

mod common;

use common::{assert_exit, durable_items as items, producer_cmd, quorum, run, stderr_lines};
use qformat::names::shard_db_path;
use qformat::run::{decode_block, RunMeta};
use qformat::Record;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;
use sublist::shard::ShardReader;
use testkit::frames;

/// Items no line-based input could carry: newlines, NUL, `\r\n`, empty ones, invalid
/// UTF-8, one of 1 MiB, and plain ones around them.
fn awkward_items() -> Vec<Vec<u8>> {
    let mut items: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"\n".to_vec(),
        b"two\nlines".to_vec(),
        b"\0".to_vec(),
        b"nul\0inside\0".to_vec(),
        b"crlf\r\n".to_vec(),
        b"".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x0a, 0x0d],
        (0..=255u8).collect(),
        vec![b'\n'; 1 << 20],
    ];
    for i in 0..300u32 {
        items.push(format!("item {i}\n{}", "\0".repeat((i % 5) as usize)).into_bytes());
    }
    items
}

/// The sublist's progress marker: (durable items, finished).
fn progress(data: &Path, shard: u32) -> Option<(u64, bool)> {
    let db = shard_db_path(data, shard);
    if !db.join("CURRENT").exists() {
        return None;
    }
    let r = ShardReader::open(&db).expect("open the sublist");
    r.progress()
        .expect("progress marker")
        .map(|p| (p.next_seq, p.finished))
}

/// The sublist holds exactly `want`, byte for byte, in order, with increasing IDs.
#[track_caller]
fn check_items(recs: &[Record], shard: u32, want: &[Vec<u8>]) {
    assert_eq!(recs.len(), want.len(), "shard {shard}: item count");
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(
            (r.shard, r.seq),
            (shard, i as u64),
            "shard {shard}: item {i}"
        );
        assert!(
            r.payload == want[i],
            "shard {shard}: payload of item {i} differs"
        );
        if i > 0 {
            assert!(
                recs[i - 1].id < r.id,
                "shard {shard}: IDs not increasing at {i}"
            );
        }
    }
}

/// Every record of a sealed run, decoded block by block.
fn run_records(path: &Path) -> Vec<Record> {
    let bytes = std::fs::read(path).expect("read the run");
    let meta = RunMeta::decode(bytes.len() as u64, &bytes).expect("run metadata");
    let mut got = Vec::new();
    for (i, b) in meta.blocks.iter().enumerate() {
        let range = b.offset as usize..(b.offset + u64::from(b.len)) as usize;
        got.extend(decode_block(&bytes[range], b, i as u64).expect("block"));
    }
    got
}

fn path_arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// `producer --input-format frames` for `shard` of `data` from `input` (`-`: stdin).
fn frames_args<'a>(shard: &'a str, data: &'a Path, nodes: &'a str, input: &'a str) -> Vec<&'a str> {
    vec![
        "--shard",
        shard,
        "--data-dir",
        path_arg(data),
        "--nodes",
        nodes,
        "--input",
        input,
        "--input-format",
        "frames",
        "--batch",
        "16",
    ]
}

/// Runs the producer with `stdin` piped in.
fn run_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = producer_cmd(args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn producer");
    let mut pipe = child.stdin.take().expect("piped stdin");
    // A producer that refuses its input may exit before reading it all: a broken pipe.
    match pipe.write_all(stdin) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {e}"),
        _ => {}
    }
    drop(pipe);
    child.wait_with_output().expect("wait")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn any_bytes_round_trip_byte_exact_from_a_file_and_from_stdin() {
    let q = quorum(3);
    let nodes = q.urls_arg();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).expect("runs dir");
    let want = awkward_items();
    let input = tmp.path().join("items.frames");
    std::fs::write(&input, frames(&want)).expect("write input");

    let mut args = frames_args("0", &data, &nodes, path_arg(&input));
    args.extend(["--seal-to", path_arg(&runs)]);
    let out = run(&args);
    assert_exit(&out, 0, "");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{} items", want.len())),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let recs = items(&data, 0);
    check_items(&recs, 0, &want);
    assert_eq!(progress(&data, 0), Some((want.len() as u64, true)));
    assert!(
        run_records(&runs.join("shard-0.bin")) == recs,
        "the sealed run differs from the sublist"
    );
    // Finished: nothing to do.
    let again = run(&args);
    assert_exit(&again, 0, "");
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));
    // The same bytes cut as lines are another input: refused, not mixed.
    let mut lines = frames_args("0", &data, &nodes, path_arg(&input));
    lines[9] = "lines";
    assert_exit(&run(&lines), 4, "different input");

    // stdin: the same items, byte for byte.
    let out = run_stdin(&frames_args("1", &data, &nodes, "-"), &frames(&want));
    assert_exit(&out, 0, "");
    check_items(&items(&data, 1), 1, &want);
    assert_eq!(progress(&data, 1), Some((want.len() as u64, true)));
    // stdin cannot be checked to be the same input: refused on a started sublist.
    assert_exit(
        &run_stdin(&frames_args("1", &data, &nodes, "-"), &frames(&want)),
        4,
        "cannot be resumed",
    );

    // An empty input is an empty, finished sublist, as with lines.
    let empty = tmp.path().join("empty.frames");
    std::fs::write(&empty, b"").expect("write");
    assert_exit(
        &run(&frames_args("2", &data, &nodes, path_arg(&empty))),
        0,
        "",
    );
    assert_eq!(progress(&data, 2), Some((0, true)));
}

#[test]
fn a_truncated_last_frame_names_its_offset_and_keeps_the_whole_ones() {
    let q = quorum(3);
    let nodes = q.urls_arg();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let whole: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; usize::from(i)]).collect();
    let at = frames(&whole).len();
    // Cut in the length (2 of its 4 bytes), and in the body (9 bytes said, 3 there).
    let cuts: [(&[u8], &str); 2] = [
        (&[9, 0], "only 2 of its 4 length bytes"),
        (
            &[9, 0, 0, 0, b'a', b'\n', 0],
            "its length says 9 bytes, only 3 follow",
        ),
    ];
    for (n, (cut, what)) in cuts.iter().enumerate() {
        let mut bytes = frames(&whole);
        bytes.extend_from_slice(cut);
        let expected = format!("truncated frame at byte offset {at} (item 40): {what}");

        // A file is checked in full first: refused before anything is written, so the
        // file, once completed, is a fresh input.
        let input = tmp.path().join(format!("cut-{n}.frames"));
        std::fs::write(&input, &bytes).expect("write input");
        let shard = format!("{}", 10 + n);
        let out = run(&frames_args(&shard, &data, &nodes, path_arg(&input)));
        assert_exit(&out, 3, &expected);
        assert!(stderr(&out).contains(path_arg(&input)), "{}", stderr(&out));
        assert!(
            items(&data, 10 + n as u32).is_empty(),
            "nothing written from the file"
        );

        // stdin is read once: the whole frames before the cut are stamped and durable,
        // then the error; the sublist stays unfinished.
        let shard = format!("{}", 20 + n);
        let out = run_stdin(&frames_args(&shard, &data, &nodes, "-"), &bytes);
        assert_exit(&out, 3, &expected);
        assert!(stderr(&out).contains("stdin"), "{}", stderr(&out));
        check_items(&items(&data, 20 + n as u32), 20 + n as u32, &whole);
        assert_eq!(progress(&data, 20 + n as u32), Some((40, false)));
    }
}

#[test]
fn a_frame_longer_than_the_item_limit_is_refused_from_its_length() {
    let q = quorum(3);
    let nodes = q.urls_arg();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let limit = producer::MAX_ITEM_BYTES;
    let ok: Vec<Vec<u8>> = vec![b"fine".to_vec(), b"".to_vec()];
    let at = frames(&ok).len();
    for (n, claimed) in [
        u32::MAX,
        u32::try_from(limit + 1).expect("limit + 1 fits a u32"),
    ]
    .into_iter()
    .enumerate()
    {
        // The length claims up to 4 GiB; only a few bytes follow. Refused from the length
        // alone: the producer neither waits for nor allocates the body.
        let mut bytes = frames(&ok);
        bytes.extend_from_slice(&claimed.to_le_bytes());
        bytes.extend_from_slice(b"abc");
        let expected = format!(
            "the frame at byte offset {at} (item 2) has a length of {claimed} bytes, above the limit of {limit} bytes per item"
        );
        let input = tmp.path().join(format!("long-{n}.frames"));
        std::fs::write(&input, &bytes).expect("write input");
        let shard = format!("{n}");
        assert_exit(
            &run(&frames_args(&shard, &data, &nodes, path_arg(&input))),
            3,
            &expected,
        );
        assert!(
            items(&data, n as u32).is_empty(),
            "nothing written from the file"
        );

        let shard = format!("{}", 10 + n);
        assert_exit(
            &run_stdin(&frames_args(&shard, &data, &nodes, "-"), &bytes),
            3,
            &expected,
        );
        check_items(&items(&data, 10 + n as u32), 10 + n as u32, &ok);
    }
    // Exactly the limit is an item.
    let big = vec![vec![0u8; limit]];
    let input = tmp.path().join("limit.frames");
    std::fs::write(&input, frames(&big)).expect("write input");
    assert_exit(
        &run(&frames_args("5", &data, &nodes, path_arg(&input))),
        0,
        "",
    );
    check_items(&items(&data, 5), 5, &big);
}

#[test]
fn kill_9_mid_run_with_frames_resumes_with_no_loss_and_no_duplicate() {
    let q = quorum(3);
    let nodes = q.urls_arg();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let want: Vec<Vec<u8>> = (0..4000u32)
        .map(|i| format!("{i}\n\0{}", "\n".repeat((i % 3) as usize)).into_bytes())
        .collect();
    let input = tmp.path().join("items.frames");
    std::fs::write(&input, frames(&want)).expect("write input");
    let args = frames_args("3", &data, &nodes, path_arg(&input));
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new(); // seq -> ID across kills
    let mut durable = 0;
    for round in 1..=3u64 {
        let stall_at = round * 1000;
        let mut child = producer_cmd(&args)
            .env("QLIST_PRODUCER_TEST_STALL_AFTER", stall_at.to_string())
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn producer");
        let lines = stderr_lines(&mut child);
        let mut said = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_secs(120)) {
                Ok(line) if line.contains(producer::STALL_ANNOUNCE) => break,
                Ok(line) => said.push(line),
                Err(e) => panic!(
                    "round {round}: no stall ({e}); stderr:\n{}",
                    said.join("\n")
                ),
            }
        }
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "exited before its kill"
        );
        child.kill().expect("SIGKILL to the producer's pid");
        assert_eq!(
            child.wait().expect("wait").code(),
            None,
            "killed by a signal"
        );
        let recs = items(&data, 3);
        check_items(&recs, 3, &want[..recs.len()]);
        for r in &recs {
            let before = seen.insert(r.seq, r.id);
            assert!(
                before.is_none() || before == Some(r.id),
                "item {} changed its ID",
                r.seq
            );
        }
        let now = recs.len() as u64;
        assert!(
            now >= stall_at && now >= durable && now < 4000,
            "round {round}: {now}"
        );
        assert_eq!(progress(&data, 3), Some((now, false)));
        durable = now;
    }
    let out = run(&args);
    assert_exit(&out, 0, "");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("resumed after {durable} items")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let recs = items(&data, 3);
    check_items(&recs, 3, &want);
    for r in &recs {
        if let Some(&id) = seen.get(&r.seq) {
            assert_eq!(id, r.id, "item {} changed its ID after a restart", r.seq);
        }
    }

    // An input edited after a kill is not resumed from.
    let data2 = tmp.path().join("data2");
    let args2 = frames_args("3", &data2, &nodes, path_arg(&input));
    let mut child = producer_cmd(&args2)
        .env("QLIST_PRODUCER_TEST_STALL_AFTER", "100")
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn producer");
    let lines = stderr_lines(&mut child);
    while !lines
        .recv_timeout(Duration::from_secs(120))
        .expect("stall announced")
        .contains(producer::STALL_ANNOUNCE)
    {}
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    let mut edited = want.clone();
    edited[5] = b"6\n\0\n\n".to_vec(); // same length as item 5, other bytes
    assert_eq!(edited[5].len(), want[5].len());
    std::fs::write(&input, frames(&edited)).expect("edit input");
    // Same size, other content: the fingerprint differs, so it is another input.
    assert_exit(&run(&args2), 4, "different input");
    assert_eq!(
        progress(&data2, 3).map(|p| p.1),
        Some(false),
        "left as it was"
    );
}

#[test]
fn help_explains_the_input_formats() {
    let out = run(&["--help"]);
    assert_exit(&out, 0, "");
    let help = String::from_utf8_lossy(&out.stdout);
    for words in [
        "--input-format <FORMAT>",
        "default: lines",
        "little-endian u32",
        "frames",
        "lines",
        "byte offset",
        "16 MiB",
    ] {
        assert!(help.contains(words), "--help lacks {words:?}:\n{help}");
    }
    // --input-format applies to --input only.
    assert_exit(
        &run(&[
            "--shard",
            "0",
            "--data-dir",
            "d",
            "--nodes",
            "redis://127.0.0.1:1",
            "--generate",
            "1",
            "--input-format",
            "frames",
        ]),
        2,
        "--input-format applies to --input only",
    );
    assert_exit(
        &run(&[
            "--shard",
            "0",
            "--data-dir",
            "d",
            "--nodes",
            "redis://127.0.0.1:1",
            "--input",
            "x",
            "--input-format",
            "json",
        ]),
        2,
        "json",
    );
}
