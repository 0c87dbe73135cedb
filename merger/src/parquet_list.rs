//! The list as a Parquet file (docs/list-format.md, "Parquet"), for the tools that analyse
//! it: DuckDB, pandas/pyarrow, Polars, Spark open it in one line.
//!
//! Four required columns, `id` UInt64, `shard` UInt32, `seq` UInt64, `payload` Binary
//! (Parquet's INT64/INT32 with the unsigned INTEGER annotation, so IDs near `u64::MAX`
//! read as the numbers they are, and BYTE_ARRAY). Rows are in strictly increasing `id`
//! order: every record passes the same [`WriteCheck`] as a run's, and each row group says
//! so in its sorting columns. Row groups carry min/max statistics of `id`, `shard` and
//! `seq` (and a page index), so a reader asking for an ID range skips the row groups
//! and pages outside it; `payload` carries none (its min/max would be useless and costly).
//!
//! Row groups are encoded while the merge goes on, on [`ParquetOptions::encoders`] threads
//! (`encode`): the merge thread fills a row group (its columns, and the payloads in one
//! buffer) until it holds [`ParquetOptions::row_group_rows`] rows or [`ROW_GROUP_BYTES`]
//! of payload, hands it to the next encoder in turn and fills the next; encoded row groups
//! are spliced into the file in order, so the file is byte for byte the one a single
//! thread writes. Memory is bounded: at most one row group per encoder is in flight, and
//! the merge thread waits for the oldest before it hands out another, so peak memory is
//! about `encoders + 1` row groups and their encoded chunks, flat in the list's size.
//!
//! What a run's footer holds is kept in the file's key-value metadata under `qlist.list`
//! (JSON: the format version, the part, the shard table), so a Parquet part says which
//! part of which split it is, as a run does.

use std::io::{Read, Write};
use std::sync::Arc;

use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{ColumnPath, SchemaDescriptor, Type};
use qformat::run::Part;
use qformat::run::{
    check_block, BlockRecords, RangeWritten, RunError, ShardEntry, ShardSpec, WriteCheck,
};
use qformat::RecordRef;

use crate::sink::ListSink;
use crate::MergeError;

mod encode;

pub use encode::EncodeStats;
use encode::{Encoder, Encoders, Rows};

/// A row group is flushed once its payloads reach this many bytes (or it holds
/// [`ParquetOptions::row_group_rows`] rows): large enough that a reader's per-group cost
/// is nothing, small enough that memory stays low with a row group per encoder in flight
/// (64 MiB until issue 47), that the last row group's encoding, after the merge ends and
/// on one thread, is short, and that an ID-range query skips most of a large list.
pub const ROW_GROUP_BYTES: usize = 32 << 20;
/// Rows per row group by default: 1 Mi, parquet-rs's own default and the order of
/// Spark's and DuckDB's.
pub const DEFAULT_ROW_GROUP_ROWS: usize = 1 << 20;
/// Encoder threads at most: each holds one row group in flight (up to [`ROW_GROUP_BYTES`]
/// of payloads and its encoded chunks), so memory grows with them; beyond four, the merge
/// thread that fills the row groups is the limit (snappy: an encoder does about 1.4x the
/// merge thread's work).
pub const MAX_ENCODERS: usize = 4;
/// The key of the file's key-value metadata that holds part and shard table.
pub const META_KEY: &str = "qlist.list";

/// Compression of the column chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    /// None: no CPU spent on payloads that do not compress.
    None,
    /// Snappy (the default, as in Spark, pyarrow and DuckDB): cheap to compress and
    /// decompress, read by every Parquet reader; on the benchmark's 10M items it made
    /// the file 9.5x smaller and the merge faster (BENCHMARKS.md, "Parquet").
    #[default]
    Snappy,
    /// Zstandard at this level (1..=22): smaller files for more CPU; Polars' default
    /// codec. `zstd` alone is level [`ZSTD_DEFAULT_LEVEL`].
    Zstd(i32),
}

/// The level `--compression zstd` means: zstd's own default (`ZSTD_CLEVEL_DEFAULT`),
/// also DuckDB's and DataFusion's, so a comparison at "zstd" compares the same work.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

impl std::str::FromStr for Codec {
    type Err = String;
    fn from_str(s: &str) -> Result<Codec, String> {
        let expected = || format!("{s:?}: expected none, snappy, zstd or zstd:LEVEL (1-22)");
        match s {
            "none" | "uncompressed" => Ok(Codec::None),
            "snappy" => Ok(Codec::Snappy),
            "zstd" => Ok(Codec::Zstd(ZSTD_DEFAULT_LEVEL)),
            _ => {
                let level = s.strip_prefix("zstd:").ok_or_else(expected)?;
                let level: i32 = level.parse().map_err(|_| expected())?;
                if (1..=22).contains(&level) {
                    Ok(Codec::Zstd(level))
                } else {
                    Err(expected())
                }
            }
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Snappy => f.write_str("snappy"),
            Codec::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

/// How a Parquet list is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Compression of every column chunk.
    pub codec: Codec,
    /// Rows per row group at most ([`ROW_GROUP_BYTES`] of payload may end one sooner).
    pub row_group_rows: usize,
    /// Threads encoding row groups while the merge goes on (at most [`MAX_ENCODERS`]);
    /// 0 encodes on the writing thread. The file is the same byte for byte whatever it is.
    pub encoders: usize,
}

/// Encoder threads by default: one per CPU, at most [`MAX_ENCODERS`].
#[must_use]
pub fn default_encoders() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(MAX_ENCODERS)
}

impl Default for ParquetOptions {
    fn default() -> ParquetOptions {
        ParquetOptions {
            codec: Codec::default(),
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
            encoders: default_encoders(),
        }
    }
}

/// What a finished Parquet list holds.
#[derive(Debug, Clone)]
pub struct ParquetSummary {
    /// Rows.
    pub records: u64,
    /// Row groups.
    pub row_groups: u64,
    /// The shard table (as a run's).
    pub shards: Vec<ShardEntry>,
    /// The part it holds.
    pub part: Part,
    /// How the row groups were encoded.
    pub encoding: EncodeStats,
}

/// Writes a list as Parquet into any [`Write`]; making it appear atomically is the
/// caller's (a temporary file renamed into place, or an S3 multipart upload).
pub struct ParquetWriter<W: Write + Send> {
    file: SerializedFileWriter<W>,
    check: WriteCheck,
    name: String,
    row_group_rows: usize,
    row_groups: u64,
    /// The open row group.
    rows: Rows,
    encoders: Encoders,
}

/// The schema: four required columns, the integers unsigned.
fn schema() -> Result<Type, ParquetError> {
    parquet::schema::parser::parse_message_type(
        "message qlist_list {
            required int64 id (INTEGER(64, false));
            required int32 shard (INTEGER(32, false));
            required int64 seq (INTEGER(64, false));
            required binary payload;
        }",
    )
}

fn properties(opts: &ParquetOptions) -> Result<WriterProperties, ParquetError> {
    let codec = match opts.codec {
        Codec::None => Compression::UNCOMPRESSED,
        Codec::Snappy => Compression::SNAPPY,
        Codec::Zstd(level) => Compression::ZSTD(ZstdLevel::try_new(level)?),
    };
    let col = |name: &str| ColumnPath::from(name);
    Ok(WriterProperties::builder()
        .set_created_by(format!("qlist merger {}", env!("CARGO_PKG_VERSION")))
        .set_compression(codec)
        // Only the shard column repeats (a few values): a dictionary elsewhere would be
        // built, overflow and be thrown away for every page.
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(col("shard"), true)
        // Increasing IDs and per-shard increasing seqs: deltas are small.
        .set_column_encoding(col("id"), Encoding::DELTA_BINARY_PACKED)
        .set_column_encoding(col("seq"), Encoding::DELTA_BINARY_PACKED)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_column_statistics_enabled(col("payload"), EnabledStatistics::None)
        .set_sorting_columns(Some(vec![SortingColumn {
            column_idx: 0,
            descending: false,
            nulls_first: false,
        }]))
        .build())
}

impl<W: Write + Send> ParquetWriter<W> {
    /// Starts a Parquet list of the shards in `specs` with IDs in `part`'s range, into
    /// `out`; `name` (the `--out` given) names it in errors.
    ///
    /// # Errors
    /// [`MergeError::Parquet`]: writing the header failed, or an encoder thread could not
    /// be started.
    pub fn new(
        out: W,
        specs: Vec<ShardSpec>,
        part: Part,
        opts: &ParquetOptions,
        name: &str,
    ) -> Result<ParquetWriter<W>, MergeError> {
        let err = |error| MergeError::Parquet {
            out: name.to_string(),
            error,
        };
        let schema = Arc::new(schema().map_err(err)?);
        let props = Arc::new(properties(opts).map_err(err)?);
        let encoder = Encoder {
            schema: Arc::new(SchemaDescriptor::new(schema.clone())),
            props: props.clone(),
        };
        let file = SerializedFileWriter::new(out, schema, props).map_err(err)?;
        let encoders = Encoders::new(encoder, opts.encoders.min(MAX_ENCODERS)).map_err(err)?;
        Ok(ParquetWriter {
            file,
            check: WriteCheck::new(specs, part),
            name: name.to_string(),
            row_group_rows: opts.row_group_rows.max(1),
            row_groups: 0,
            rows: Rows::default(),
            encoders,
        })
    }

    fn err(&self) -> impl FnOnce(ParquetError) -> MergeError + '_ {
        |error| MergeError::Parquet {
            out: self.name.clone(),
            error,
        }
    }

    fn flush_row_group(&mut self) -> Result<(), MergeError> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let result = self.encoders.submit(&mut self.file, &mut self.rows);
        result.map_err(self.err())?;
        self.row_groups += 1;
        Ok(())
    }

    /// Closes the last row group and writes the footer (with the `qlist.list` metadata);
    /// returns the sink and what the file holds.
    ///
    /// # Errors
    /// [`MergeError::Run`] for a whole list lacking items of a shard
    /// ([`RunError::Incomplete`]), [`MergeError::Parquet`] for a write error.
    pub fn finish(mut self) -> Result<(W, ParquetSummary), MergeError> {
        self.flush_row_group()?;
        let encoding = self.encoders.finish(&mut self.file);
        let encoding = encoding.map_err(self.err())?;
        let shards = self.check.finish().map_err(|error| MergeError::Run {
            name: self.name.clone(),
            error,
        })?;
        let part = self.check.part();
        let meta = serde_json::json!({
            "format": "qlist list",
            "version": 1,
            "records": self.check.records(),
            "part": {
                "index": part.index,
                "count": part.count,
                "first_id": part.first_id.to_string(),
                "last_id": part.last_id.to_string(),
            },
            "shards": shards.iter().map(|s| serde_json::json!({
                "shard": s.shard,
                "finished": s.finished,
                "first_seq": s.first_seq,
                "count": s.count,
                "total": s.total,
            })).collect::<Vec<_>>(),
        });
        self.file
            .append_key_value_metadata(KeyValue::new(META_KEY.to_string(), meta.to_string()));
        let summary = ParquetSummary {
            records: self.check.records(),
            row_groups: self.row_groups,
            shards,
            part,
            encoding,
        };
        let name = self.name;
        // The encoders are stopped first: a failing footer write leaves no thread behind.
        drop(self.encoders);
        let out = self
            .file
            .into_inner()
            .map_err(|error| MergeError::Parquet {
                out: name.clone(),
                error,
            })?;
        Ok((out, summary))
    }
}

impl<W: Write + Send> ParquetWriter<W> {
    /// Replaces the part and the shards' specs before [`ParquetWriter::finish`] (a
    /// follower's part learns them as it grows): [`WriteCheck::restate`].
    ///
    /// # Errors
    /// [`MergeError::Run`] when the rows written do not fit them.
    pub fn restate(&mut self, part: Part, specs: Vec<ShardSpec>) -> Result<(), MergeError> {
        let restated = self.check.restate(part, specs);
        restated.map_err(|error| MergeError::Run {
            name: self.name.clone(),
            error,
        })
    }

    /// The last ID written, if any.
    pub fn last_id(&self) -> Option<u64> {
        self.check.last_id()
    }

    /// Appends one record as a row, checked.
    fn write_ref(&mut self, r: &RecordRef<'_>) -> Result<(), MergeError> {
        let checked = self
            .check
            .record_fields(r.id, r.shard, r.seq, r.payload.len());
        checked.map_err(|error| MergeError::Run {
            name: self.name.clone(),
            error,
        })?;
        let rows = &mut self.rows;
        // The bits of the u64s: Parquet's INT64 annotated unsigned.
        rows.ids.push(r.id as i64);
        rows.shards.push(r.shard as i32);
        rows.seqs.push(r.seq as i64);
        rows.payloads.extend_from_slice(r.payload);
        rows.ends.push(rows.payloads.len());
        if rows.len() >= self.row_group_rows || rows.payloads.len() >= ROW_GROUP_BYTES {
            self.flush_row_group()?;
        }
        Ok(())
    }
}

/// What a Parquet list's `qlist.list` metadata says (as a run's footer and shard table
/// would): its part and its shard table. Reads the file's footer only.
///
/// # Errors
/// [`MergeError::ListCheck`] naming the file: not Parquet, not written by qlist, or
/// metadata that does not parse.
pub fn read_list_meta(path: &std::path::Path) -> Result<(Part, Vec<ShardEntry>), MergeError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let bad = |what: String| MergeError::ListCheck {
        name: path.display().to_string(),
        what,
    };
    let file = std::fs::File::open(path).map_err(|e| bad(format!("open: {e}")))?;
    let reader = SerializedFileReader::new(file).map_err(|e| bad(e.to_string()))?;
    let text = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == META_KEY))
        .and_then(|k| k.value.clone())
        .ok_or_else(|| bad(format!("no {META_KEY:?} metadata: not a list qlist wrote")))?;
    let meta: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("{META_KEY}: {e}")))?;
    let field = |v: &serde_json::Value, path: &[&str]| -> Result<u64, MergeError> {
        let mut at = v;
        for p in path {
            at = &at[*p];
        }
        at.as_u64()
            .or_else(|| at.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| bad(format!("{META_KEY}: {} is not a number", path.join("."))))
    };
    let small = |n: u64, what: &str| {
        u32::try_from(n).map_err(|_| bad(format!("{META_KEY}: {what} {n} is too large")))
    };
    let part = Part {
        index: small(field(&meta, &["part", "index"])?, "part index")?,
        count: small(field(&meta, &["part", "count"])?, "part count")?,
        first_id: field(&meta, &["part", "first_id"])?,
        last_id: field(&meta, &["part", "last_id"])?,
    };
    let shards = meta["shards"]
        .as_array()
        .ok_or_else(|| bad(format!("{META_KEY}: no shard table")))?
        .iter()
        .map(|s| {
            Ok(ShardEntry {
                shard: small(field(s, &["shard"])?, "shard")?,
                finished: s["finished"].as_bool().unwrap_or(false),
                first_seq: field(s, &["first_seq"])?,
                count: field(s, &["count"])?,
                total: field(s, &["total"])?,
            })
        })
        .collect::<Result<Vec<_>, MergeError>>()?;
    Ok((part, shards))
}

impl<W: Write + Send> ListSink for ParquetWriter<W> {
    fn write_encoded(&mut self, records: &[u8]) -> Result<(), MergeError> {
        for r in BlockRecords::new(records) {
            self.write_ref(&r)?;
        }
        Ok(())
    }

    /// The range's records, block by block from `bytes`, each checked again and written
    /// as rows.
    fn join_range(
        &mut self,
        range: &RangeWritten,
        bytes: Option<&mut dyn Read>,
    ) -> Result<(), MergeError> {
        let name = format!("{} (a range merged by another thread)", self.name);
        let run_err = |error: RunError| MergeError::Run {
            name: name.clone(),
            error,
        };
        let Some(bytes) = bytes else {
            return Err(run_err(RunError::Io(std::io::Error::other(
                "a Parquet list takes a range's blocks as bytes, not in place",
            ))));
        };
        let mut buf = Vec::new();
        let mut at = range.start.offset;
        for (i, entry) in range.blocks.iter().enumerate() {
            if entry.offset != at {
                return Err(run_err(RunError::Io(std::io::Error::other(format!(
                    "block {i} starts at {} but the previous ended at {at}",
                    entry.offset
                )))));
            }
            buf.resize(entry.len as usize, 0);
            bytes
                .read_exact(&mut buf)
                .map_err(|e| run_err(RunError::Io(e)))?;
            at += u64::from(entry.len);
            let body = check_block(&buf, entry, i as u64).map_err(run_err)?;
            self.write_encoded(body)?;
        }
        Ok(())
    }

    fn records(&self) -> u64 {
        self.check.records()
    }

    fn bytes(&self) -> u64 {
        self.file.bytes_written() as u64 + self.encoders.in_flight_bytes() + self.rows.raw_bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use bytes::Bytes;
    use parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::serialized_reader::ReadOptionsBuilder;
    use qformat::record::{encode_record, Record};

    use super::*;

    const SHARDS: u32 = 3;

    /// `n` records of `SHARDS` shards, IDs with gaps, payloads of varied length and content.
    fn records(n: u64) -> (Vec<ShardSpec>, Vec<u8>) {
        let mut seqs = [0u64; SHARDS as usize];
        let mut bytes = Vec::new();
        for i in 0..n {
            let shard = ((i * 7 + i / 5) % u64::from(SHARDS)) as u32;
            let seq = seqs[shard as usize];
            seqs[shard as usize] += 1;
            let len = (i * 37 % 150) as usize;
            let payload = format!("{i:020}-{}", "x".repeat(len)).into_bytes();
            let record = Record {
                id: 1000 + i * 3 + i % 2,
                shard,
                seq,
                payload,
            };
            encode_record(&record, &mut bytes);
        }
        let specs = (0..SHARDS)
            .map(|shard| ShardSpec {
                shard,
                finished: true,
                total: seqs[shard as usize],
            })
            .collect();
        (specs, bytes)
    }

    #[track_caller]
    fn write(n: u64, opts: ParquetOptions) -> (Vec<u8>, ParquetSummary) {
        let (specs, bytes) = records(n);
        let mut w = ParquetWriter::new(Vec::new(), specs, Part::WHOLE, &opts, "test.parquet")
            .expect("new writer");
        // In pieces, as a merge hands them over.
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let mut end = 0;
            for _ in 0..97 {
                if end == rest.len() {
                    break;
                }
                let r = BlockRecords::new(&rest[end..]).next().expect("a record");
                end += qformat::record::RECORD_HEAD_LEN + r.payload.len();
            }
            w.write_encoded(&rest[..end]).expect("write");
            rest = &rest[end..];
        }
        w.finish().expect("finish")
    }

    fn opts(codec: Codec, rows: usize, encoders: usize) -> ParquetOptions {
        ParquetOptions {
            codec,
            row_group_rows: rows,
            encoders,
        }
    }

    #[test]
    fn the_file_is_the_same_bytes_whatever_the_encoder_threads() {
        for codec in [Codec::None, Codec::Snappy, Codec::Zstd(ZSTD_DEFAULT_LEVEL)] {
            let (one, summary) = write(20_000, opts(codec, 300, 0));
            assert_eq!(summary.row_groups, 67);
            assert_eq!(summary.encoding.threads_used, 1);
            for encoders in [1, 2, 3, MAX_ENCODERS] {
                let (many, summary) = write(20_000, opts(codec, 300, encoders));
                assert_eq!(summary.row_groups, 67);
                assert!(
                    many == one,
                    "{codec}: {encoders} encoder threads wrote other bytes than one thread"
                );
            }
        }
    }

    #[test]
    fn row_groups_are_encoded_on_every_encoder_thread() {
        for encoders in [1, 2, 3, MAX_ENCODERS] {
            let (_, summary) = write(10_000, opts(Codec::Snappy, 250, encoders));
            let e = summary.encoding;
            assert_eq!(e.encoders, encoders);
            // Row group g goes to encoder g % n: every encoder gets some with 40 groups.
            assert_eq!(e.threads_used, encoders, "{e:?}");
        }
        // And none of them is the writing thread: the merge goes on meanwhile.
        let (specs, bytes) = records(1000);
        let o = opts(Codec::Snappy, 100, 2);
        let mut w = ParquetWriter::new(Vec::new(), specs, Part::WHOLE, &o, "t").expect("new");
        w.write_encoded(&bytes).expect("write");
        let (_, summary) = w.finish().expect("finish");
        assert_eq!(summary.encoding.threads_used, 2);
    }

    #[test]
    fn at_most_one_row_group_per_encoder_is_in_flight() {
        for encoders in [1, 2, MAX_ENCODERS] {
            // Small row groups fill much faster than they are encoded: without the bound
            // the writer would hand out all 200 at once.
            let (_, summary) = write(20_000, opts(Codec::Zstd(9), 100, encoders));
            let e = summary.encoding;
            assert_eq!(summary.row_groups, 200);
            assert!(e.peak_in_flight <= encoders, "{e:?}");
            assert!(e.peak_in_flight >= 1, "{e:?}");
            // The buffers of written row groups are reused: one filling, one per encoder.
            assert!(e.buffers <= encoders + 1, "{e:?}");
            assert!(e.chunk_buffers <= encoders, "{e:?}");
        }
    }

    /// The writer before encoder threads, column by column into the file's own row group
    /// writer: the spliced chunks must make exactly its bytes.
    fn write_directly(n: u64, o: &ParquetOptions) -> Vec<u8> {
        let (_, bytes) = records(n);
        let schema = Arc::new(schema().expect("schema"));
        let props = Arc::new(properties(o).expect("props"));
        let mut file = SerializedFileWriter::new(Vec::new(), schema, props).expect("file");
        let all: Vec<RecordRef<'_>> = BlockRecords::new(&bytes).collect();
        for rows in all.chunks(o.row_group_rows) {
            let ids: Vec<i64> = rows.iter().map(|r| r.id as i64).collect();
            let shards: Vec<i32> = rows.iter().map(|r| r.shard as i32).collect();
            let seqs: Vec<i64> = rows.iter().map(|r| r.seq as i64).collect();
            let payloads: Vec<ByteArray> = rows.iter().map(|r| r.payload.to_vec().into()).collect();
            let mut group = file.next_row_group().expect("group");
            let mut col = group.next_column().expect("col").expect("id");
            let (min, max) = (ids.first(), ids.last());
            col.typed::<Int64Type>()
                .write_batch_with_statistics(&ids, None, None, min, max, None)
                .expect("ids");
            col.close().expect("close");
            let mut col = group.next_column().expect("col").expect("shard");
            col.typed::<Int32Type>()
                .write_batch(&shards, None, None)
                .expect("shards");
            col.close().expect("close");
            let mut col = group.next_column().expect("col").expect("seq");
            col.typed::<Int64Type>()
                .write_batch(&seqs, None, None)
                .expect("seqs");
            col.close().expect("close");
            let mut col = group.next_column().expect("col").expect("payload");
            col.typed::<ByteArrayType>()
                .write_batch(&payloads, None, None)
                .expect("payloads");
            col.close().expect("close");
            group.close().expect("group");
        }
        file.into_inner().expect("footer")
    }

    #[test]
    fn spliced_chunks_make_the_bytes_of_writing_column_by_column() {
        for codec in [Codec::None, Codec::Snappy] {
            // Row groups of more rows than the payloads are handed over at once: pages
            // are cut as one call would cut them.
            let o = opts(codec, 150_000, 2);
            let (ours, summary) = write(200_000, o);
            assert_eq!(summary.row_groups, 2);
            let direct = write_directly(200_000, &o);
            // Ours ends with the qlist.list metadata in the footer; the direct one has none.
            let footer_start = |b: &[u8]| {
                let n = b.len();
                let len = u32::from_le_bytes(b[n - 8..n - 4].try_into().expect("4 bytes"));
                n - 8 - len as usize
            };
            let (a, b) = (footer_start(&ours), footer_start(&direct));
            assert_eq!(a, b, "{codec}: the row groups and indexes differ in length");
            assert!(
                ours[..a] == direct[..b],
                "{codec}: row groups or page indexes differ"
            );
        }
    }

    #[test]
    fn the_file_keeps_statistics_page_index_and_sorting_columns() {
        let (bytes, summary) = write(20_000, opts(Codec::Snappy, 3000, 2));
        let read_opts = ReadOptionsBuilder::new().with_page_index().build();
        let reader = SerializedFileReader::new_with_options(Bytes::from(bytes), read_opts)
            .expect("a Parquet file");
        let meta = reader.metadata();
        assert_eq!(meta.num_row_groups() as u64, summary.row_groups);
        assert_eq!(meta.file_metadata().num_rows(), 20_000);
        let mut prev_max = None;
        for g in meta.row_groups() {
            let sorting = g.sorting_columns().expect("sorting columns");
            assert_eq!(sorting.len(), 1);
            assert_eq!(sorting[0].column_idx, 0);
            for c in 0..3 {
                let stats = g.column(c).statistics().expect("min/max of id, shard, seq");
                assert!(stats.min_bytes_opt().is_some() && stats.max_bytes_opt().is_some());
            }
            assert!(g.column(3).statistics().is_none(), "no payload min/max");
            let id = g.column(0).statistics().expect("id stats");
            let min = u64::from_le_bytes(id.min_bytes_opt().expect("min").try_into().expect("8"));
            assert!(prev_max < Some(min));
            prev_max = Some(u64::from_le_bytes(
                id.max_bytes_opt().expect("max").try_into().expect("8"),
            ));
        }
        assert!(meta.page_index().is_some(), "a page index");
        for g in meta.row_groups() {
            for c in 0..4 {
                let chunk = g.column(c);
                assert!(
                    chunk.offset_index_offset().is_some(),
                    "column {c}: no offset index"
                );
                // A column index (page min/max) where there are statistics.
                assert_eq!(chunk.column_index_offset().is_some(), c < 3, "column {c}");
            }
        }
        let encodings: HashSet<Encoding> = meta
            .row_groups()
            .iter()
            .flat_map(|g| g.column(0).encodings().collect::<Vec<_>>())
            .collect();
        assert!(
            encodings.contains(&Encoding::DELTA_BINARY_PACKED),
            "{encodings:?}"
        );
    }

    #[test]
    fn codec_names() {
        assert_eq!("snappy".parse(), Ok(Codec::Snappy));
        assert_eq!("none".parse(), Ok(Codec::None));
        assert_eq!("zstd".parse(), Ok(Codec::Zstd(ZSTD_DEFAULT_LEVEL)));
        assert_eq!("zstd:1".parse(), Ok(Codec::Zstd(1)));
        assert!("zstd:0".parse::<Codec>().is_err());
        assert!("zstd:23".parse::<Codec>().is_err());
        assert!("lz4".parse::<Codec>().is_err());
        assert_eq!(Codec::Zstd(3).to_string(), "zstd:3");
    }
}
