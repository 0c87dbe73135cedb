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
//! Memory is bounded: a row group is buffered (its columns, and the payloads in one
//! buffer) and flushed when it holds [`ParquetOptions::row_group_rows`] rows or
//! [`ROW_GROUP_BYTES`] of payload, whichever comes first; the encoder then holds at most
//! one column chunk of it. Peak memory is about twice one row group, flat in the list's size.
//!
//! What a run's footer holds is kept in the file's key-value metadata under `qlist.list`
//! (JSON: the format version, the part, the shard table), so a Parquet part says which
//! part of which split it is, as a run does.

use std::io::{Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{ColumnPath, Type};
use qformat::run::Part;
use qformat::run::{
    check_block, BlockRecords, RangeWritten, RunError, ShardEntry, ShardSpec, WriteCheck,
};
use qformat::RecordRef;

use crate::sink::ListSink;
use crate::MergeError;

/// A row group is flushed once its payloads reach this many bytes (or it holds
/// [`ParquetOptions::row_group_rows`] rows): large enough that a reader's per-group cost
/// is nothing, small enough that memory stays low and an ID-range query skips most of a
/// large list.
pub const ROW_GROUP_BYTES: usize = 64 << 20;
/// Rows per row group by default: 1 Mi, parquet-rs's own default and the order of
/// Spark's and DuckDB's.
pub const DEFAULT_ROW_GROUP_ROWS: usize = 1 << 20;
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
}

impl std::str::FromStr for Codec {
    type Err = String;
    fn from_str(s: &str) -> Result<Codec, String> {
        match s {
            "none" | "uncompressed" => Ok(Codec::None),
            "snappy" => Ok(Codec::Snappy),
            _ => Err(format!("{s:?}: expected none or snappy")),
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
}

impl Default for ParquetOptions {
    fn default() -> ParquetOptions {
        ParquetOptions {
            codec: Codec::default(),
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
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
}

/// Writes a list as Parquet into any [`Write`]; making it appear atomically is the
/// caller's (a temporary file renamed into place, or an S3 multipart upload).
pub struct ParquetWriter<W: Write + Send> {
    file: SerializedFileWriter<W>,
    check: WriteCheck,
    name: String,
    row_group_rows: usize,
    row_groups: u64,
    /// The open row group, column by column (u64s as Parquet's INT64 bits).
    ids: Vec<i64>,
    shards: Vec<i32>,
    seqs: Vec<i64>,
    /// Every payload of the open row group, one after another; `ends[i]` is where row i's ends.
    payloads: Vec<u8>,
    ends: Vec<usize>,
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

fn properties(opts: &ParquetOptions) -> WriterProperties {
    let codec = match opts.codec {
        Codec::None => Compression::UNCOMPRESSED,
        Codec::Snappy => Compression::SNAPPY,
    };
    let col = |name: &str| ColumnPath::from(name);
    WriterProperties::builder()
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
        .build()
}

impl<W: Write + Send> ParquetWriter<W> {
    /// Starts a Parquet list of the shards in `specs` with IDs in `part`'s range, into
    /// `out`; `name` (the `--out` given) names it in errors.
    ///
    /// # Errors
    /// [`MergeError::Parquet`]: writing the header failed.
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
        let file =
            SerializedFileWriter::new(out, schema, Arc::new(properties(opts))).map_err(err)?;
        let rows = opts.row_group_rows.max(1);
        Ok(ParquetWriter {
            file,
            check: WriteCheck::new(specs, part),
            name: name.to_string(),
            row_group_rows: rows,
            row_groups: 0,
            ids: Vec::with_capacity(rows.min(DEFAULT_ROW_GROUP_ROWS)),
            shards: Vec::with_capacity(rows.min(DEFAULT_ROW_GROUP_ROWS)),
            seqs: Vec::with_capacity(rows.min(DEFAULT_ROW_GROUP_ROWS)),
            payloads: Vec::new(),
            ends: Vec::with_capacity(rows.min(DEFAULT_ROW_GROUP_ROWS)),
        })
    }

    fn err(&self) -> impl FnOnce(ParquetError) -> MergeError + '_ {
        |error| MergeError::Parquet {
            out: self.name.clone(),
            error,
        }
    }

    fn flush_row_group(&mut self) -> Result<(), MergeError> {
        if self.ids.is_empty() {
            return Ok(());
        }
        let result = self.write_row_group();
        result.map_err(self.err())?;
        self.row_groups += 1;
        self.ids.clear();
        self.shards.clear();
        self.seqs.clear();
        self.ends.clear();
        Ok(())
    }

    fn write_row_group(&mut self) -> Result<(), ParquetError> {
        let missing = || ParquetError::General("the schema has fewer columns than written".into());
        let mut group = self.file.next_row_group()?;
        let mut col = group.next_column()?.ok_or_else(missing)?;
        // Sorted: the first and last are the min and max, no comparison needed per value.
        let (min, max) = (self.ids.first(), self.ids.last());
        col.typed::<Int64Type>()
            .write_batch_with_statistics(&self.ids, None, None, min, max, None)?;
        col.close()?;
        let mut col = group.next_column()?.ok_or_else(missing)?;
        col.typed::<Int32Type>()
            .write_batch(&self.shards, None, None)?;
        col.close()?;
        let mut col = group.next_column()?.ok_or_else(missing)?;
        col.typed::<Int64Type>()
            .write_batch(&self.seqs, None, None)?;
        col.close()?;
        // One buffer for all payloads, each row a slice of it (no copy per value).
        let all = Bytes::from(std::mem::take(&mut self.payloads));
        let mut start = 0;
        let values: Vec<ByteArray> = self
            .ends
            .iter()
            .map(|&end| {
                let v = ByteArray::from(all.slice(start..end));
                start = end;
                v
            })
            .collect();
        let mut col = group.next_column()?.ok_or_else(missing)?;
        col.typed::<ByteArrayType>()
            .write_batch(&values, None, None)?;
        col.close()?;
        group.close()?;
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
        };
        let name = self.name;
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
        // The bits of the u64s: Parquet's INT64 annotated unsigned.
        self.ids.push(r.id as i64);
        self.shards.push(r.shard as i32);
        self.seqs.push(r.seq as i64);
        self.payloads.extend_from_slice(r.payload);
        self.ends.push(self.payloads.len());
        if self.ids.len() >= self.row_group_rows || self.payloads.len() >= ROW_GROUP_BYTES {
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
        self.file.bytes_written() as u64 + self.payloads.len() as u64 + 20 * self.ids.len() as u64
    }
}
