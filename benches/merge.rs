//! Merge throughput: `merger::merge_to_file` over real RocksDB sublists (4 and 64 shards,
//! `QLIST_BENCH_ITEMS` items in total, default 10 million, 100-byte payloads) against two
//! references measured in the same run on the same data:
//!
//! - `scan`: a plain sequential scan of the same shards, one after the other, writing the
//!   same bytes (header, encoded records, CRC footer, fsync, rename) without merging. The
//!   merge's target is at least 70% of its throughput.
//! - `sort_m`: GNU `LC_ALL=C sort -m` over the same items exported once as sorted text files
//!   (`%020u\tshard\tseq\tpayload`, one file per shard, from the page cache), timed as a
//!   child process; `--batch-size` is raised so sort merges all shards in one pass.
//!
//! Peak memory: VmHWM is reset through `/proc/self/clear_refs` before one extra merge and
//! read then (the process's baseline), after 10% of the items and at the end; equal values
//! at 10% and 100% mean memory does not grow with the item count.
//!
//! Run: `cargo bench --bench merge` (full size) or
//! `QLIST_BENCH_ITEMS=200000 cargo bench --bench merge` (smoke test). The fixture is built
//! once per run under `QLIST_BENCH_DIR` (default: the system temp dir) and removed at the end
//! (kept with `QLIST_BENCH_KEEP=1`). `QLIST_BENCH_SHARDS=64` runs one shard count only.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use rand::{Rng, SeedableRng};
use sublist::listbin::{encode_record_head, Crc32, FOOTER_LEN, HEADER_LEN, MAGIC};
use sublist::shard::{Progress, ShardReader, ShardWriter};
use sublist::Record;

const DEFAULT_ITEMS: u64 = 10_000_000;
const PAYLOAD: usize = 100;
/// Default shard counts; `QLIST_BENCH_SHARDS=64` (comma-separated) picks others.
const SHARD_COUNTS: [u32; 2] = [4, 64];
/// Items buffered across all shards while building the fixture: large batches keep the
/// synced RocksDB writes few, and the cap keeps the builder's memory small.
const BUILD_BUFFER: usize = 256_000;

struct Fixture {
    shards: u32,
    items: u64,
    paths: Vec<PathBuf>,
    text: Vec<PathBuf>,
    list_bytes: u64,
    work: PathBuf,
}

fn payload(id: u64) -> Vec<u8> {
    // Printable, so the same payload works as a text line for `sort -m`.
    let mut p = format!("{id:020}-").into_bytes();
    let fill = b'a' + (id % 26) as u8;
    p.resize(PAYLOAD, fill);
    p
}

fn build(root: &Path, shards: u32, items: u64) -> Fixture {
    let work = root.join(format!("{shards}-shards"));
    let data = work.join("data");
    let text_dir = work.join("text");
    std::fs::create_dir_all(&text_dir).expect("create fixture dirs");
    let mut writers: Vec<ShardWriter> = (0..shards)
        .map(|s| ShardWriter::open(&data, s).expect("open shard writer"))
        .collect();
    let text: Vec<PathBuf> = (0..shards)
        .map(|s| text_dir.join(format!("{s}.txt")))
        .collect();
    let mut text_out: Vec<BufWriter<std::fs::File>> = text
        .iter()
        .map(|p| BufWriter::new(std::fs::File::create(p).expect("create text file")))
        .collect();
    let per_shard = (BUILD_BUFFER / shards as usize).max(1);
    let mut buf: Vec<Vec<Record>> = vec![Vec::new(); shards as usize];
    let mut seq = vec![0u64; shards as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let flush = |w: &mut ShardWriter, b: &mut Vec<Record>, next_seq: u64, finished: bool| {
        let last_id = b
            .last()
            .map(|r| r.id)
            .or_else(|| w.progress().ok().flatten().map(|p| p.last_id))
            .unwrap_or(0);
        let p = Progress {
            next_seq,
            finished,
            last_id,
            fingerprint: b"bench".to_vec(),
        };
        w.write_batch(b, &p).expect("write batch");
        b.clear();
    };
    let start = Instant::now();
    let mut list_bytes = HEADER_LEN + FOOTER_LEN;
    for id in 1..=items {
        let s = rng.gen_range(0..shards) as usize;
        let r = Record {
            id,
            shard: s as u32,
            seq: seq[s],
            payload: payload(id),
        };
        seq[s] += 1;
        list_bytes += (sublist::listbin::RECORD_HEAD_LEN + r.payload.len()) as u64;
        writeln!(
            text_out[s],
            "{:020}\t{}\t{}\t{}",
            r.id,
            r.shard,
            r.seq,
            String::from_utf8_lossy(&r.payload)
        )
        .expect("write text");
        buf[s].push(r);
        if buf[s].len() >= per_shard {
            flush(&mut writers[s], &mut buf[s], seq[s], false);
        }
    }
    for s in 0..shards as usize {
        flush(&mut writers[s], &mut buf[s], seq[s], true);
        text_out[s].flush().expect("flush text");
    }
    drop(writers);
    eprintln!(
        "fixture: {items} items in {shards} shards built in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    let paths = merger::find_shards(&data).expect("find shards");
    Fixture {
        shards,
        items,
        paths,
        text,
        list_bytes,
        work,
    }
}

/// The baseline: every shard scanned in turn, the same bytes written the same way as
/// `ListWriter` (buffered, CRC, count patched, fsync, rename), but no heap and no checks.
fn scan_to_file(out: &Path, paths: &[PathBuf]) -> u64 {
    let tmp = out.with_extension("scan.tmp");
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp).expect("create"));
    w.write_all(&MAGIC).expect("write");
    w.write_all(&0u64.to_le_bytes()).expect("write");
    let mut crc = Crc32::new();
    let mut count = 0u64;
    for p in paths {
        let reader = ShardReader::open(p).expect("open shard");
        for r in reader.iter() {
            let r = r.expect("read shard");
            let head = encode_record_head(&r);
            crc.update(&head);
            crc.update(&r.payload);
            w.write_all(&head).expect("write");
            w.write_all(&r.payload).expect("write");
            count += 1;
        }
    }
    w.write_all(&crc.finalize().to_le_bytes()).expect("write");
    let mut f = w.into_inner().expect("flush");
    f.seek(SeekFrom::Start(8)).expect("seek");
    f.write_all(&count.to_le_bytes()).expect("write");
    f.sync_all().expect("fsync");
    std::fs::rename(&tmp, out).expect("rename");
    count
}

fn merge_once(out: &Path, paths: &[PathBuf], progress: &mut dyn FnMut(u64, u64)) -> u64 {
    let shards = merger::open_shards(paths, false).expect("open shards");
    merger::merge_to_file(out, &shards, progress)
        .expect("merge")
        .records
}

fn sort_m(out: &Path, text: &[PathBuf]) {
    let status = Command::new("sort")
        .env("LC_ALL", "C")
        .arg("-m")
        .arg(format!("--batch-size={}", text.len().max(2)))
        .arg("-o")
        .arg(out)
        .args(text)
        .status()
        .expect("run `sort` (GNU coreutils) for the comparison");
    assert!(status.success(), "sort -m failed: {status}");
}

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak RSS (KiB) after 10% of the items and after all of them, in a merge started with a
/// freshly reset high-water mark.
fn memory_probe(f: &Fixture) -> (Option<u64>, Option<u64>, Option<u64>, bool) {
    let out = f.work.join("probe.bin");
    let reset = reset_hwm();
    let before = vm_hwm_kib();
    let mut at_10 = None;
    let tenth = f.items / 10;
    merge_once(&out, &f.paths, &mut |records, _| {
        if at_10.is_none() && records >= tenth {
            at_10 = vm_hwm_kib();
        }
    });
    let at_end = vm_hwm_kib();
    let _ = std::fs::remove_file(&out);
    (before, at_10, at_end, reset)
}

fn median(v: &[Duration]) -> Option<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied()
}

fn main() {
    let items: u64 = std::env::var("QLIST_BENCH_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ITEMS);
    let root_parent = std::env::var_os("QLIST_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    // QLIST_BENCH_KEEP=1 keeps the fixture (e.g. to profile `merger` on it afterwards).
    let keep = std::env::var_os("QLIST_BENCH_KEEP").is_some();
    let root = tempfile::Builder::new()
        .prefix("qlist-merge-bench-")
        .tempdir_in(&root_parent)
        .expect("bench temp dir");
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(10))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    // name -> per-iteration durations, for the summary table (criterion keeps its own too).
    let times: RefCell<BTreeMap<String, Vec<Duration>>> = RefCell::new(BTreeMap::new());
    let mut rows = Vec::new();
    let shard_counts: Vec<u32> = match std::env::var("QLIST_BENCH_SHARDS") {
        Ok(v) => v
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .expect("QLIST_BENCH_SHARDS: comma-separated numbers")
            })
            .collect(),
        Err(_) => SHARD_COUNTS.to_vec(),
    };
    for shards in shard_counts {
        let f = build(root.path(), shards, items);
        let mut g = c.benchmark_group(format!("merge/{shards}shards"));
        g.sampling_mode(SamplingMode::Flat);
        g.throughput(Throughput::Bytes(f.list_bytes));
        let out = f.work.join("list.bin");
        for (name, kind) in [("merge", 0), ("scan", 1), ("sort_m", 2)] {
            let key = format!("{shards}/{name}");
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let t = Instant::now();
                        match kind {
                            0 => assert_eq!(merge_once(&out, &f.paths, &mut |_, _| {}), f.items),
                            1 => assert_eq!(scan_to_file(&out, &f.paths), f.items),
                            _ => sort_m(&f.work.join("sorted.txt"), &f.text),
                        }
                        let d = t.elapsed();
                        times.borrow_mut().entry(key.clone()).or_default().push(d);
                        total += d;
                    }
                    total
                })
            });
        }
        g.finish();
        let (hwm0, hwm10, hwm100, reset) = memory_probe(&f);
        rows.push((f.shards, f.items, f.list_bytes, hwm0, hwm10, hwm100, reset));
        if keep {
            eprintln!("fixture kept: {}", f.work.display());
        } else {
            let _ = std::fs::remove_dir_all(&f.work);
        }
    }
    if keep {
        let _ = root.keep();
    }

    let times = times.into_inner();
    eprintln!("\nsummary (median per run; MB = 10^6 bytes of list.bin):");
    eprintln!(
        "{:>6} {:>10} {:>14} {:>10} {:>14} {:>10} {:>12} {:>12} {:>22}",
        "shards",
        "items",
        "merge items/s",
        "merge MB/s",
        "scan items/s",
        "scan MB/s",
        "merge/scan",
        "sort-m MB/s",
        "peak RSS KiB @0/10/100%"
    );
    for (shards, items, bytes, hwm0, hwm10, hwm100, reset) in rows {
        let rate = |name: &str| {
            median(
                times
                    .get(&format!("{shards}/{name}"))
                    .map(Vec::as_slice)
                    .unwrap_or(&[]),
            )
            .map(|d| d.as_secs_f64())
        };
        let (m, s, so) = (rate("merge"), rate("scan"), rate("sort_m"));
        let ips = |t: Option<f64>| t.map_or("-".into(), |t| format!("{:.0}", items as f64 / t));
        let mbs =
            |t: Option<f64>| t.map_or("-".into(), |t| format!("{:.1}", bytes as f64 / 1e6 / t));
        let ratio = match (m, s) {
            (Some(m), Some(s)) => format!("{:.0}%", 100.0 * s / m),
            _ => "-".into(),
        };
        let hwm = |h: Option<u64>| h.map_or("-".into(), |h| h.to_string());
        eprintln!(
            "{:>6} {:>10} {:>14} {:>10} {:>14} {:>10} {:>12} {:>12} {:>22}",
            shards,
            items,
            ips(m),
            mbs(m),
            ips(s),
            mbs(s),
            ratio,
            mbs(so),
            format!(
                "{}/{}/{}{}",
                hwm(hwm0),
                hwm(hwm10),
                hwm(hwm100),
                if reset { "" } else { " (no reset)" }
            )
        );
    }
}
