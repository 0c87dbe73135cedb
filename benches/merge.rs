//! Merge throughput: merger's own merge (`merger::merge_inputs`, the `merger --out` path)
//! of real RocksDB sublists (4 and 64 shards, `QLIST_BENCH_ITEMS` items in total, default
//! 10 million, 100-byte payloads) into a run (list.bin version 2), against a library
//! version of the merge and two references, measured in the same run on the same data.
//! The references write version 1's simpler bytes (one CRC at the end, no index) through
//! `qformat::listbin::ListWriter` or by hand: a floor the run's blocks and index add to.
//!
//! - `kmerge`: the merge written with `itertools::kmerge_by` (module `kmerge` below), to
//!   check that merger's hand-written heap earns its place (BENCHMARKS.md).
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
//! Group `kway` times the heap against `kmerge_by` alone, in memory. Group `listbin` times list.bin's record encoding and decoding by hand (what
//! `qformat::listbin` does) against bincode, with the payload as a plain `Vec<u8>` and
//! through `serde_bytes`, in memory (docs/list-format.md); rows `v2_*` do the same in
//! version 2's shape (records appended to 256 KiB blocks, one CRC per block).
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
use qformat::listbin::{Crc32, ListReader, ListWriter, FOOTER_LEN, HEADER_LEN, MAGIC};
use qformat::record::{encode_record, encode_record_head, RECORD_HEAD_LEN};
use qformat::run::{decode_block, BlockEntry, Part, RunWriter, BLOCK_TARGET};
use qformat::shard::ProgressMarker;
use qformat::Record;
use rand::{Rng, SeedableRng};
use sublist::shard::{ShardReader, ShardWriter};

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
        let p = ProgressMarker {
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
        list_bytes += (qformat::record::RECORD_HEAD_LEN + r.payload.len()) as u64;
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

/// What `merger --out list.bin SHARD_DB...` does: the sublists opened and checked, merged
/// by the library's one merge loop into a run, fsynced and renamed into place.
fn merge_once(out: &Path, paths: &[PathBuf], progress: &mut dyn FnMut(u64, u64)) -> u64 {
    let store = qstore::Store::new(qstore::StoreOptions::default());
    let specs: Vec<merger::MergeInput> = paths
        .iter()
        .map(|p| merger::MergeInput::Sublist(p.clone()))
        .collect();
    let inputs = merger::open_inputs(&store, &specs, false).expect("open shards");
    let location = qstore::Location::Dir(out.to_path_buf());
    let upload = store.create(&location).expect("create the run");
    let writer = RunWriter::new(upload, inputs.shard_specs(), Part::WHOLE).expect("run writer");
    let mut sink = merger::sink::RunSink {
        writer,
        name: out.display().to_string(),
    };
    merger::merge_inputs(&inputs, Part::WHOLE, &mut sink, progress).expect("merge");
    let (upload, meta) = sink.writer.finish().expect("finish the run");
    upload.finish().expect("commit the run");
    meta.records()
}

/// The k-way merge written the library way, to measure against `merger::merge` (the
/// hand-written heap) in the same run: `itertools::kmerge_by` over one checked, read-ahead
/// adapter per source, plus a one-item lookahead that catches a duplicate before its
/// first copy is yielded. Same checks, same errors, same output and errors in the same
/// order (checked against the heap on 20,000 random inputs with injected errors), but it
/// holds one record more than the heap: the lookahead. So it breaks
/// `kway::tests::read_ahead_is_bounded_in_records_and_bytes` by one record (129 instead
/// of 128; with 200 KB payloads 2 instead of 1), which is why merger keeps the heap
/// (BENCHMARKS.md has the figures).
mod kmerge {
    use merger::{MergeError, SortedRecords, READ_AHEAD_BYTES, READ_AHEAD_RECORDS};
    use qformat::record::RECORD_HEAD_LEN;
    use qformat::Record;

    /// The k-way merge written the library way: `itertools::kmerge_by` over one checked,
    /// read-ahead adapter per source, plus a one-item lookahead for cross-source duplicates.
    /// Same checks and errors as `merger::merge`.
    pub struct Checked<I> {
        index: usize,
        name: String,
        /// The shard numbers this input's records may carry, ascending.
        shards: Vec<u32>,
        records: I,
        last_id: Option<u64>,
        ahead: std::collections::VecDeque<Record>,
        pending: Option<MergeError>,
        done: bool,
    }

    impl<I, E> Checked<I>
    where
        I: Iterator<Item = Result<Record, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        fn read_checked(&mut self) -> Result<Option<Record>, MergeError> {
            let record = match self.records.next() {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(MergeError::Read {
                        input: self.name.clone(),
                        error: e.into(),
                    })
                }
                Some(Ok(r)) => r,
            };
            let listed = match self.shards.as_slice() {
                [one] => *one == record.shard,
                many => many.binary_search(&record.shard).is_ok(),
            };
            if !listed {
                return Err(MergeError::WrongShard {
                    input: self.name.clone(),
                    expected: self.shards.clone(),
                    found: record.shard,
                    id: record.id,
                });
            }
            if let Some(prev) = self.last_id {
                if record.id <= prev {
                    return Err(MergeError::OutOfOrder {
                        input: self.name.clone(),
                        prev,
                        id: record.id,
                    });
                }
            }
            self.last_id = Some(record.id);
            Ok(Some(record))
        }

        fn refill(&mut self) {
            let mut bytes = 0;
            while self.ahead.len() < READ_AHEAD_RECORDS && bytes < READ_AHEAD_BYTES {
                match self.read_checked() {
                    Ok(Some(r)) => {
                        bytes += r.payload.len() + RECORD_HEAD_LEN;
                        self.ahead.push_back(r);
                    }
                    Ok(None) => {
                        self.done = true;
                        break;
                    }
                    Err(e) => {
                        self.pending = Some(e);
                        self.done = true;
                        break;
                    }
                }
            }
        }
    }

    impl<I, E> Iterator for Checked<I>
    where
        I: Iterator<Item = Result<Record, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        type Item = (usize, Result<Record, MergeError>);

        fn next(&mut self) -> Option<Self::Item> {
            if self.ahead.is_empty() && !self.done {
                self.refill();
            }
            match self.ahead.pop_front() {
                Some(r) => Some((self.index, Ok(r))),
                None => self.pending.take().map(|e| (self.index, Err(e))),
            }
        }
    }

    /// Errors sort first (so one surfaces as soon as its source's turn comes, as in the heap),
    /// then records by ID, ties by source index.
    fn kmerge_key(item: &Tagged) -> (bool, u64, usize) {
        match &item.1 {
            Err(_) => (false, 0, item.0),
            Ok(r) => (true, r.id, item.0),
        }
    }

    /// One merged item, tagged with its source's index.
    type Tagged = (usize, Result<Record, MergeError>);

    /// The merged stream of [`kmerge_library`].
    pub struct KMerged<M: Iterator<Item = Tagged>> {
        names: Vec<String>,
        merged: std::iter::Peekable<M>,
        failed: bool,
    }

    /// [`merger::merge`]'s contract, built on `itertools::kmerge_by`.
    pub fn kmerge_library<I, E>(
        sources: Vec<SortedRecords<I>>,
    ) -> KMerged<impl Iterator<Item = Tagged>>
    where
        I: Iterator<Item = Result<Record, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let names = sources.iter().map(|s| s.name.clone()).collect();
        let checked = sources.into_iter().enumerate().map(|(index, s)| Checked {
            index,
            name: s.name,
            shards: s.shards,
            records: s.records,
            last_id: None,
            ahead: std::collections::VecDeque::new(),
            pending: None,
            done: false,
        });
        KMerged {
            names,
            merged: itertools::Itertools::kmerge_by(checked, |a: &Tagged, b: &Tagged| {
                kmerge_key(a) < kmerge_key(b)
            })
            .peekable(),
            failed: false,
        }
    }

    impl<M: Iterator<Item = Tagged>> Iterator for KMerged<M> {
        type Item = Result<Record, MergeError>;

        fn next(&mut self) -> Option<Self::Item> {
            if self.failed {
                return None;
            }
            let (source, item) = self.merged.next()?;
            let result = item.and_then(|record| match self.merged.peek() {
                Some((next, Ok(n))) if n.id == record.id => Err(MergeError::Duplicate {
                    id: record.id,
                    first: self.names[source].clone(),
                    second: self.names[*next].clone(),
                }),
                // An error sorts first: it is the next thing out, so report it now (the heap
                // merge reports it instead of this record too).
                Some((_, Err(_))) => match self.merged.next() {
                    Some((_, Err(e))) => Err(e),
                    _ => Ok(record),
                },
                _ => Ok(record),
            });
            if result.is_err() {
                self.failed = true;
            }
            Some(result)
        }
    }
}

/// The library k-way merge over the sublists, written as version 1 bytes (`ListWriter`).
fn kmerge_once(out: &Path, paths: &[PathBuf]) -> u64 {
    let shards = merger::open_shards(paths, false).expect("open shards");
    let sources = shards
        .iter()
        .map(|s| {
            merger::SortedRecords::new(
                s.reader.path().display().to_string(),
                s.reader.shard(),
                s.reader.iter(),
            )
        })
        .collect();
    let mut writer = ListWriter::create(out).expect("create list.bin");
    let mut progress = 0u64;
    for record in kmerge::kmerge_library(sources) {
        writer.write(&record.expect("merge")).expect("write");
        if writer.records().is_multiple_of(merger::PROGRESS_EVERY) {
            progress = std::hint::black_box(writer.records());
        }
    }
    std::hint::black_box(progress);
    writer.finish().expect("finish").records
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

/// Records of the list.bin encoding benchmark: 128 MB of list.bin, in memory.
const CODEC_RECORDS: u64 = 1_000_000;

/// What `ListWriter::write` does per record (hand-written head, CRC, two buffered
/// writes), into a 1 MiB buffer over a sink so only the encoding is timed.
fn encode_hand(records: &[Record]) -> u32 {
    let mut out = BufWriter::with_capacity(1 << 20, std::io::sink());
    let mut crc = Crc32::new();
    for r in records {
        let head = encode_record_head(r);
        crc.update(&head);
        crc.update(&r.payload);
        out.write_all(&head).expect("write");
        out.write_all(&r.payload).expect("write");
    }
    out.flush().expect("flush");
    crc.finalize()
}

/// The same bytes through `bincode::serialize_into`, as favourable to bincode as we could
/// make it: `Vec<u8>` is serialized byte by byte (serde has no bytes fast path without
/// `serde_bytes`), so each record goes into a reused buffer first, and the CRC and the
/// buffered write take that buffer in one call each.
fn encode_bincode(records: &[Record]) -> u32 {
    encode_bincode_as(records)
}

/// Both bincode encoders, for records of type `T`.
fn encode_bincode_as<T: serde::Serialize>(records: &[T]) -> u32 {
    let mut out = BufWriter::with_capacity(1 << 20, std::io::sink());
    let mut crc = Crc32::new();
    let mut buf = Vec::with_capacity(RECORD_HEAD_LEN + PAYLOAD);
    for r in records {
        buf.clear();
        bincode::serialize_into(&mut buf, r).expect("serialize");
        crc.update(&buf);
        out.write_all(&buf).expect("write");
    }
    out.flush().expect("flush");
    crc.finalize()
}

/// A list.bin record as bincode sees it through `serde_bytes`: the payload goes through
/// serde's bytes methods (`serialize_bytes`, `deserialize_byte_buf`), which bincode 1.3
/// writes as one length and one slice and reads into one buffer, instead of a `Vec<u8>`'s
/// element-by-element sequence. Same bytes as [`Record`] (checked in [`bench_codec`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct BytesRecord {
    id: u64,
    shard: u32,
    seq: u64,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
}

/// [`encode_bincode`] with the payload through `serde_bytes`: the same reused buffer, one
/// CRC call and one buffered write per record.
fn encode_serde_bytes(records: &[BytesRecord]) -> u32 {
    encode_bincode_as(records)
}

/// One version-2 block: its CRC appended, written, the buffer cleared; returns the CRC.
fn flush_block(block: &mut Vec<u8>, out: &mut impl Write) -> u32 {
    let mut crc = Crc32::new();
    crc.update(block);
    let crc = crc.finalize();
    block.extend_from_slice(&crc.to_le_bytes());
    out.write_all(block).expect("write");
    block.clear();
    crc
}

/// Version 2's per-record work (`RunWriter::write` and `flush_block` without the order,
/// range and seq checks): the record head by hand and the payload appended to a 256 KiB
/// block buffer, one CRC and one write per block. Returns the XOR of the block CRCs.
fn encode_v2_hand(records: &[Record], out: &mut impl Write) -> u32 {
    let mut block = Vec::with_capacity(BLOCK_TARGET + RECORD_HEAD_LEN + PAYLOAD);
    let mut crcs = 0;
    for r in records {
        block.extend_from_slice(&encode_record_head(r));
        block.extend_from_slice(&r.payload);
        if block.len() >= BLOCK_TARGET {
            crcs ^= flush_block(&mut block, out);
        }
    }
    if !block.is_empty() {
        crcs ^= flush_block(&mut block, out);
    }
    crcs
}

/// [`encode_v2_hand`] with each record appended by bincode (payload through `serde_bytes`).
fn encode_v2_serde_bytes(records: &[BytesRecord], out: &mut impl Write) -> u32 {
    let mut block = Vec::with_capacity(BLOCK_TARGET + RECORD_HEAD_LEN + PAYLOAD);
    let mut crcs = 0;
    for r in records {
        bincode::serialize_into(&mut block, r).expect("serialize");
        if block.len() >= BLOCK_TARGET {
            crcs ^= flush_block(&mut block, out);
        }
    }
    if !block.is_empty() {
        crcs ^= flush_block(&mut block, out);
    }
    crcs
}

/// Into a 1 MiB buffer over a sink, as the other encode rows.
fn to_sink<T>(records: &[T], encode: fn(&[T], &mut BufWriter<std::io::Sink>) -> u32) -> u32 {
    let mut out = BufWriter::with_capacity(1 << 20, std::io::sink());
    let crcs = encode(records, &mut out);
    out.flush().expect("flush");
    crcs
}

/// The blocks of a version-2 run in memory (what [`encode_v2_hand`] writes), and their
/// index entries, offsets counted from the start of the blocks.
fn v2_blocks(records: &[Record]) -> (Vec<u8>, Vec<BlockEntry>) {
    let mut bytes = Vec::new();
    let mut index = Vec::new();
    let mut start = 0;
    while start < records.len() {
        let (mut end, mut len) = (start, 0);
        while end < records.len() && len < BLOCK_TARGET {
            len += RECORD_HEAD_LEN + records[end].payload.len();
            end += 1;
        }
        let offset = bytes.len() as u64;
        encode_v2_hand(&records[start..end], &mut bytes);
        index.push(BlockEntry {
            first_id: records[start].id,
            last_id: records[end - 1].id,
            offset,
            records: (end - start) as u32,
            len: (bytes.len() as u64 - offset) as u32,
        });
        start = end;
    }
    (bytes, index)
}

/// Version 2's decoder, `qformat::run::decode_block` (CRC, framing, lengths, order,
/// count, first and last ID of each block), over every block, plus order across blocks.
fn decode_v2_hand(bytes: &[u8], index: &[BlockEntry]) -> u64 {
    let (mut sum, mut last) = (0u64, None);
    for (i, e) in index.iter().enumerate() {
        let range = e.offset as usize..(e.offset + u64::from(e.len)) as usize;
        let records = decode_block(&bytes[range], e, i as u64).expect("block");
        assert!(last < Some(e.first_id), "ids must strictly increase");
        last = Some(e.last_id);
        sum = records.iter().fold(sum, |s, r| s.wrapping_add(r.id));
    }
    sum
}

/// [`decode_v2_hand`] with bincode (payload through `serde_bytes`) decoding the records:
/// the same checks (CRC, a length limit, the block filled exactly, order, count, first and
/// last ID), each block's records collected as `decode_block` returns them.
fn decode_v2_serde_bytes(bytes: &[u8], index: &[BlockEntry]) -> u64 {
    use bincode::Options;
    let options = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit((RECORD_HEAD_LEN + qformat::MAX_PAYLOAD) as u64);
    let (mut sum, mut last) = (0u64, None);
    for e in index {
        let block = &bytes[e.offset as usize..(e.offset + u64::from(e.len)) as usize];
        let (body, stored) = block.split_at(block.len() - 4);
        let mut crc = Crc32::new();
        crc.update(body);
        assert_eq!(crc.finalize().to_le_bytes(), stored, "block checksum");
        let mut input = body;
        let mut records = Vec::with_capacity(e.records as usize);
        while !input.is_empty() {
            let r: BytesRecord = options.deserialize_from(&mut input).expect("record");
            assert!(last < Some(r.id), "ids must strictly increase");
            last = Some(r.id);
            records.push(r);
        }
        assert_eq!(records.len(), e.records as usize, "records in block");
        assert_eq!(records.first().map(|r| r.id), Some(e.first_id), "first id");
        assert_eq!(records.last().map(|r| r.id), Some(e.last_id), "last id");
        sum = records.iter().fold(sum, |s, r| s.wrapping_add(r.id));
    }
    sum
}

/// `ListReader` over a list.bin in memory: framing, lengths, order, count, checksum.
fn decode_hand(list: &[u8]) -> u64 {
    let reader = ListReader::new(std::io::Cursor::new(list), list.len() as u64).expect("header");
    reader
        .map(|r| r.expect("record").id)
        .fold(0, u64::wrapping_add)
}

/// The same file through `bincode::deserialize_from`, with the checks bincode can do: a
/// length limit (a corrupt length cannot allocate more than the format allows, but the
/// error has no byte offset or record index), strict order, count and checksum. As
/// favourable as we could make it: the CRC is one call over the in-memory records, where
/// a file reader would have to hash what bincode reads as it goes.
fn decode_bincode(list: &[u8]) -> u64 {
    decode_bincode_as::<Record>(list, |r| r.id)
}

/// [`decode_bincode`] with the payload through `serde_bytes`: same options (length limit),
/// same order, count and checksum checks.
fn decode_serde_bytes(list: &[u8]) -> u64 {
    decode_bincode_as::<BytesRecord>(list, |r| r.id)
}

/// Both bincode decoders: records of type `T` (whose ID `id` gives), every check made.
fn decode_bincode_as<T: serde::de::DeserializeOwned>(list: &[u8], id: fn(&T) -> u64) -> u64 {
    use bincode::Options;
    let records_end = list.len() - FOOTER_LEN as usize;
    let count = u64::from_le_bytes(list[8..16].try_into().expect("count"));
    let options = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit((RECORD_HEAD_LEN + qformat::MAX_PAYLOAD) as u64);
    let records = &list[HEADER_LEN as usize..records_end];
    let mut input = std::io::BufReader::with_capacity(1 << 20, records);
    let (mut sum, mut last) = (0u64, None);
    for _ in 0..count {
        let r: T = options.deserialize_from(&mut input).expect("record");
        let r = id(&r);
        assert!(last < Some(r), "ids must strictly increase");
        last = Some(r);
        sum = sum.wrapping_add(r);
    }
    let footer = u32::from_le_bytes(list[records_end..].try_into().expect("footer"));
    let mut crc = Crc32::new();
    crc.update(records);
    assert_eq!(crc.finalize(), footer, "checksum");
    sum
}

/// list.bin's record encoding by hand (what `qformat::listbin` does) against bincode 1.3
/// (whose legacy layout it matches byte for byte), encoding and decoding, in memory.
fn bench_codec(c: &mut Criterion) {
    let records: Vec<Record> = (1..=CODEC_RECORDS)
        .map(|id| Record {
            id,
            shard: (id % 64) as u32,
            seq: id / 64,
            payload: payload(id),
        })
        .collect();
    let mut list = MAGIC.to_vec();
    list.extend_from_slice(&CODEC_RECORDS.to_le_bytes());
    for r in &records {
        encode_record(r, &mut list);
    }
    let bytes_records: Vec<BytesRecord> = records
        .iter()
        .map(|r| BytesRecord {
            id: r.id,
            shard: r.shard,
            seq: r.seq,
            payload: r.payload.clone(),
        })
        .collect();
    let crc = encode_hand(&records);
    assert_eq!(encode_bincode(&records), crc, "bincode writes other bytes");
    assert_eq!(
        encode_serde_bytes(&bytes_records),
        crc,
        "bincode with serde_bytes writes other bytes"
    );
    list.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(decode_hand(&list), decode_bincode(&list));
    assert_eq!(decode_hand(&list), decode_serde_bytes(&list));
    assert_eq!(
        to_sink(&records, encode_v2_hand),
        to_sink(&bytes_records, encode_v2_serde_bytes),
        "version 2 blocks: bincode with serde_bytes writes other bytes"
    );
    let (blocks, index) = v2_blocks(&records);
    assert_eq!(decode_v2_hand(&blocks, &index), decode_hand(&list));
    assert_eq!(decode_v2_serde_bytes(&blocks, &index), decode_hand(&list));
    let mut g = c.benchmark_group("listbin");
    g.throughput(Throughput::Bytes(list.len() as u64));
    g.bench_function("encode_hand", |b| b.iter(|| encode_hand(&records)));
    g.bench_function("encode_bincode", |b| b.iter(|| encode_bincode(&records)));
    g.bench_function("encode_serde_bytes", |b| {
        b.iter(|| encode_serde_bytes(&bytes_records))
    });
    g.bench_function("decode_hand", |b| b.iter(|| decode_hand(&list)));
    g.bench_function("decode_bincode", |b| b.iter(|| decode_bincode(&list)));
    g.bench_function("decode_serde_bytes", |b| {
        b.iter(|| decode_serde_bytes(&list))
    });
    g.bench_function("v2_encode_hand", |b| {
        b.iter(|| to_sink(&records, encode_v2_hand))
    });
    g.bench_function("v2_encode_serde_bytes", |b| {
        b.iter(|| to_sink(&bytes_records, encode_v2_serde_bytes))
    });
    g.bench_function("v2_decode_hand", |b| {
        b.iter(|| decode_v2_hand(&blocks, &index))
    });
    g.bench_function("v2_decode_serde_bytes", |b| {
        b.iter(|| decode_v2_serde_bytes(&blocks, &index))
    });
    g.finish();
}

/// The merge alone, in memory (no RocksDB, no file): `merger::merge` (the heap) against
/// `kmerge_by`, [`CODEC_RECORDS`] records dealt at random to 4 and 64 sources. Both clone
/// each record out of its source, as a RocksDB iterator hands out owned records.
fn bench_kway(c: &mut Criterion) {
    for shards in SHARD_COUNTS {
        let mut parts: Vec<Vec<Record>> = vec![Vec::new(); shards as usize];
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        for id in 1..=CODEC_RECORDS {
            let s = rng.gen_range(0..shards) as usize;
            let seq = parts[s].len() as u64;
            parts[s].push(Record {
                id,
                shard: s as u32,
                seq,
                payload: payload(id),
            });
        }
        let sources = || -> Vec<_> {
            parts
                .iter()
                .enumerate()
                .map(|(s, records)| {
                    let records = records
                        .iter()
                        .cloned()
                        .map(Ok::<_, std::convert::Infallible>);
                    merger::SortedRecords::new(format!("source {s}"), s as u32, records)
                })
                .collect()
        };
        let mut g = c.benchmark_group(format!("kway/{shards}shards"));
        g.throughput(Throughput::Elements(CODEC_RECORDS));
        g.bench_function("heap", |b| b.iter(|| sum_ids(merger::merge(sources()))));
        g.bench_function("kmerge", |b| {
            b.iter(|| sum_ids(kmerge::kmerge_library(sources())))
        });
        g.finish();
    }
}

fn sum_ids(merged: impl Iterator<Item = Result<Record, merger::MergeError>>) -> u64 {
    merged
        .map(|r| r.expect("merge").id)
        .fold(0, u64::wrapping_add)
}

/// One summary row: a shard count and what was measured on it.
struct Row {
    shards: u32,
    items: u64,
    list_bytes: u64,
    /// Peak RSS (KiB) at the start, after 10% and at the end of the probe merge.
    hwm: [Option<u64>; 3],
    /// The high-water mark could be reset before the probe.
    reset: bool,
}

/// Per-run durations by "shards/name", for the summary (criterion keeps its own too).
type Times = RefCell<BTreeMap<String, Vec<Duration>>>;

/// The variants timed on every fixture, in this order, in the same run.
const VARIANTS: [&str; 4] = ["merge", "kmerge", "scan", "sort_m"];

fn run_variant(f: &Fixture, name: &str, out: &Path) {
    match name {
        "merge" => assert_eq!(merge_once(out, &f.paths, &mut |_, _| {}), f.items),
        "kmerge" => assert_eq!(kmerge_once(out, &f.paths), f.items),
        "scan" => assert_eq!(scan_to_file(out, &f.paths), f.items),
        _ => sort_m(&f.work.join("sorted.txt"), &f.text),
    }
}

/// Builds the fixture for one shard count, times every variant on it, probes memory.
fn bench_shards(c: &mut Criterion, root: &Path, shards: u32, items: u64, times: &Times) -> Row {
    let f = build(root, shards, items);
    let mut g = c.benchmark_group(format!("merge/{shards}shards"));
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(f.list_bytes));
    let out = f.work.join("list.bin");
    for name in VARIANTS {
        let key = format!("{shards}/{name}");
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    run_variant(&f, name, &out);
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
    // QLIST_BENCH_KEEP=1 keeps the fixture (e.g. to profile `merger` on it afterwards).
    if std::env::var_os("QLIST_BENCH_KEEP").is_some() {
        eprintln!("fixture kept: {}", f.work.display());
    } else {
        let _ = std::fs::remove_dir_all(&f.work);
    }
    Row {
        shards: f.shards,
        items: f.items,
        list_bytes: f.list_bytes,
        hwm: [hwm0, hwm10, hwm100],
        reset,
    }
}

fn print_summary(rows: &[Row], times: &BTreeMap<String, Vec<Duration>>) {
    eprintln!("\nsummary (median per run; MB = 10^6 bytes of list.bin):");
    eprintln!(
        "{:>6} {:>10} {:>14} {:>10} {:>14} {:>12} {:>14} {:>10} {:>12} {:>12} {:>22}",
        "shards",
        "items",
        "merge items/s",
        "merge MB/s",
        "kmerge MB/s",
        "kmerge/merge",
        "scan items/s",
        "scan MB/s",
        "merge/scan",
        "sort-m MB/s",
        "peak RSS KiB @0/10/100%"
    );
    for row in rows {
        let secs = |name: &str| {
            let key = format!("{}/{name}", row.shards);
            median(times.get(&key).map(Vec::as_slice).unwrap_or(&[])).map(|d| d.as_secs_f64())
        };
        let (m, k, s, so) = (secs("merge"), secs("kmerge"), secs("scan"), secs("sort_m"));
        let ips = |t: Option<f64>| t.map_or("-".into(), |t| format!("{:.0}", row.items as f64 / t));
        let mbs = |t: Option<f64>| {
            t.map_or("-".into(), |t| {
                format!("{:.1}", row.list_bytes as f64 / 1e6 / t)
            })
        };
        // Throughput ratio a/b = time b / time a.
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.0}%", 100.0 * b / a),
            _ => "-".into(),
        };
        let hwm = row
            .hwm
            .map(|h| h.map_or("-".into(), |h| h.to_string()))
            .join("/");
        eprintln!(
            "{:>6} {:>10} {:>14} {:>10} {:>14} {:>12} {:>14} {:>10} {:>12} {:>12} {:>22}",
            row.shards,
            row.items,
            ips(m),
            mbs(m),
            mbs(k),
            ratio(k, m),
            ips(s),
            mbs(s),
            ratio(m, s),
            mbs(so),
            format!("{hwm}{}", if row.reset { "" } else { " (no reset)" })
        );
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let items: u64 = env_or("QLIST_BENCH_ITEMS", DEFAULT_ITEMS);
    let root_parent = std::env::var_os("QLIST_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let root = tempfile::Builder::new()
        .prefix("qlist-merge-bench-")
        .tempdir_in(&root_parent)
        .expect("bench temp dir");
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(10))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
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
    bench_codec(&mut c);
    bench_kway(&mut c);
    let times = Times::default();
    let rows: Vec<Row> = shard_counts
        .into_iter()
        .map(|shards| bench_shards(&mut c, root.path(), shards, items, &times))
        .collect();
    if std::env::var_os("QLIST_BENCH_KEEP").is_some() {
        let _ = root.keep();
    }
    print_summary(&rows, &times.into_inner());
}
