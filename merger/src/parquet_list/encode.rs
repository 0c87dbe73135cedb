//! Encoding row groups, on the writing thread or on encoder threads while it goes on.
//!
//! A row group is encoded column by column into memory ([`Encoder::encode`]: each column
//! chunk through its own [`SerializedPageWriter`] into a buffer), then spliced into the
//! file in row-group order ([`write_group`], `SerializedRowGroupWriter::append_column`).
//! The bytes of a chunk depend only on its rows and the writer's properties, and the file
//! writer places the chunks in the order they are given, so the file is the same whatever
//! thread encoded what: one thread's file, byte for byte.
//!
//! [`Pool`]: row group `g` goes to encoder `g % n`; each encoder takes its row groups in
//! order and hands them back in order, so the writing thread collects group `g` from
//! encoder `g % n` with no reordering. At most one row group per encoder is in flight
//! (handed out, not yet written): the writing thread waits for the oldest before it hands
//! out another, and reuses the buffers of written groups. Memory is thus `n + 1` row
//! groups' buffers (the one being filled and one per encoder) and their encoded chunks.

use std::collections::HashSet;
use std::io::Write;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::{JoinHandle, ThreadId};

use bytes::Bytes;
use parquet::column::writer::ColumnWriter;
use parquet::column::writer::{get_column_writer, get_typed_column_writer_mut, ColumnCloseResult};
use parquet::data_type::{ByteArray, ByteArrayType, DataType, Int32Type, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterPropertiesPtr;
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::SchemaDescPtr;

/// Payload values handed to the column writer at once: a multiple of its mini-batch
/// (`write_batch_size`, 1024), so its pages are cut exactly where one call would cut
/// them, and a small buffer of [`ByteArray`]s (2 MiB) instead of one per row.
const PAYLOAD_BATCH: usize = 64 * 1024;

/// The columns of the schema.
const COLUMNS: usize = 4;

/// The rows of one row group, column by column (u64s as Parquet's INT64 bits). Its
/// buffers go round (filled, encoded, written, filled again), as do the [`Sinks`] the
/// chunks are encoded into, so their memory is touched once, not faulted in afresh for
/// every row group (in the one-thread writer, a third of the CPU time went there).
#[derive(Debug, Default)]
pub(super) struct Rows {
    pub ids: Vec<i64>,
    pub shards: Vec<i32>,
    pub seqs: Vec<i64>,
    /// Every payload, one after another; `ends[i]` is where row i's ends.
    pub payloads: Vec<u8>,
    pub ends: Vec<usize>,
    /// Up to [`PAYLOAD_BATCH`] payloads as the column writer takes them.
    values: Vec<ByteArray>,
}

/// The buffers one row group's column chunks are encoded into, by column: only row
/// groups being encoded or written hold one, not the one being filled.
type Sinks = [Vec<u8>; COLUMNS];

impl Rows {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Bytes the rows take when written (progress).
    pub fn raw_bytes(&self) -> u64 {
        self.payloads.len() as u64 + 20 * self.ids.len() as u64
    }

    fn clear(&mut self) {
        self.ids.clear();
        self.shards.clear();
        self.seqs.clear();
        self.payloads.clear();
        self.ends.clear();
        self.values.clear();
    }
}

/// One encoded column chunk: its bytes (pages, offsets from 0) and what closing it said.
type Chunk = (Bytes, ColumnCloseResult);

/// Encodes row groups of the list's schema with the file's properties.
#[derive(Clone)]
pub(super) struct Encoder {
    pub schema: SchemaDescPtr,
    pub props: WriterPropertiesPtr,
}

impl Encoder {
    /// The four column chunks of `rows`, in schema order, encoded into `sinks`.
    fn encode(&self, rows: &mut Rows, sinks: &mut Sinks) -> Result<Vec<Chunk>, ParquetError> {
        let (min, max) = (rows.ids.first(), rows.ids.last());
        let [id_sink, shard_sink, seq_sink, payload_sink] = sinks.each_mut().map(std::mem::take);
        let ids = self.column::<Int64Type>(0, id_sink, |w| {
            // Sorted: the first and last are the min and max, no comparison per value.
            w.write_batch_with_statistics(&rows.ids, None, None, min, max, None)?;
            Ok(())
        })?;
        let shards = self.column::<Int32Type>(1, shard_sink, |w| {
            w.write_batch(&rows.shards, None, None)?;
            Ok(())
        })?;
        let seqs = self.column::<Int64Type>(2, seq_sink, |w| {
            w.write_batch(&rows.seqs, None, None)?;
            Ok(())
        })?;
        // One buffer for all payloads, each row a slice of it (no copy per value); the
        // buffer comes back for the next row group once the slices are dropped.
        let all = Bytes::from(std::mem::take(&mut rows.payloads));
        let values = &mut rows.values;
        let payloads = self.column::<ByteArrayType>(3, payload_sink, |w| {
            let mut start = 0;
            for ends in rows.ends.chunks(PAYLOAD_BATCH) {
                values.clear();
                values.extend(ends.iter().map(|&end| {
                    let v = ByteArray::from(all.slice(start..end));
                    start = end;
                    v
                }));
                w.write_batch(values, None, None)?;
            }
            values.clear();
            Ok(())
        });
        rows.payloads = Vec::from(all);
        Ok(vec![ids, shards, seqs, payloads?])
    }

    /// Column `i` written by `write` into `sink` (emptied first).
    fn column<T: DataType>(
        &self,
        i: usize,
        mut sink: Vec<u8>,
        write: impl FnOnce(
            &mut parquet::column::writer::ColumnWriterImpl<'_, T>,
        ) -> Result<(), ParquetError>,
    ) -> Result<Chunk, ParquetError> {
        sink.clear();
        let mut sink = TrackedWrite::new(sink);
        let close = {
            let pages = Box::new(SerializedPageWriter::new(&mut sink));
            let mut writer: ColumnWriter<'_> =
                get_column_writer(self.schema.column(i), self.props.clone(), pages);
            write(get_typed_column_writer_mut::<T>(&mut writer))?;
            writer.close()?
        };
        Ok((Bytes::from(sink.into_inner()?), close))
    }
}

/// Splices the encoded chunks of one row group into `file`, as its next row group, and
/// gives their buffers back to `sinks`.
fn write_group<W: Write + Send>(
    file: &mut SerializedFileWriter<W>,
    chunks: Vec<Chunk>,
    sinks: &mut Sinks,
) -> Result<(), ParquetError> {
    let mut group = file.next_row_group()?;
    for ((bytes, close), sink) in chunks.into_iter().zip(sinks.iter_mut()) {
        group.append_column(&bytes, close)?;
        // The only handle left: its Vec back, without a copy.
        *sink = Vec::from(bytes);
    }
    group.close()?;
    Ok(())
}

/// What the encoding of a list did (tests and logs check it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodeStats {
    /// Encoder threads configured (0: on the writing thread).
    pub encoders: usize,
    /// Distinct threads that encoded a row group.
    pub threads_used: usize,
    /// The most row groups handed to encoders and not yet written, at any time.
    pub peak_in_flight: usize,
    /// Row-group buffers ever made (the one being filled included): reused after that.
    pub buffers: usize,
    /// Sets of column-chunk buffers ever made: reused after that.
    pub chunk_buffers: usize,
}

/// A row group to encode, and the buffers to encode it into.
struct Job {
    rows: Rows,
    sinks: Sinks,
}

/// An encoded row group, or why it could not be, and its buffers for reuse.
struct Done {
    chunks: Result<Vec<Chunk>, ParquetError>,
    rows: Rows,
    thread: ThreadId,
}

struct Worker {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

/// Where row groups are encoded: here, or on encoder threads.
pub(super) struct Encoders {
    encoder: Encoder,
    workers: Vec<Worker>,
    /// Row groups handed out and written so far: group g goes to worker g % n.
    sent: u64,
    written: u64,
    /// Raw bytes of the groups in flight (progress).
    in_flight_bytes: u64,
    spare: Vec<Rows>,
    spare_sinks: Vec<Sinks>,
    threads: HashSet<ThreadId>,
    stats: EncodeStats,
}

impl Encoders {
    /// `n` encoder threads (none: encode on the writing thread).
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn new(encoder: Encoder, n: usize) -> Result<Encoders, ParquetError> {
        raise_malloc_thresholds();
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let (jobs, job_rx) = mpsc::channel::<Job>();
            let (done_tx, done) = mpsc::channel();
            let enc = encoder.clone();
            let thread = std::thread::Builder::new()
                .name(format!("parquet-encode-{i}"))
                .spawn(move || encode_loop(&enc, &job_rx, &done_tx))
                .map_err(|e| ParquetError::External(Box::new(e)))?;
            workers.push(Worker {
                jobs: Some(jobs),
                done,
                thread: Some(thread),
            });
        }
        Ok(Encoders {
            encoder,
            workers,
            sent: 0,
            written: 0,
            in_flight_bytes: 0,
            spare: Vec::new(),
            spare_sinks: Vec::new(),
            threads: HashSet::new(),
            stats: EncodeStats {
                encoders: n,
                buffers: 1,
                ..EncodeStats::default()
            },
        })
    }

    /// Encodes `rows` (taken, replaced by an empty buffer) and writes it into `file` after
    /// every row group before it: now, or once an encoder is done with it. Waits for the
    /// oldest row group in flight first when every encoder has one.
    pub fn submit<W: Write + Send>(
        &mut self,
        file: &mut SerializedFileWriter<W>,
        rows: &mut Rows,
    ) -> Result<(), ParquetError> {
        if self.workers.is_empty() {
            let mut sinks = self.take_sinks();
            let chunks = self.encoder.encode(rows, &mut sinks)?;
            write_group(file, chunks, &mut sinks)?;
            self.spare_sinks.push(sinks);
            self.threads.insert(std::thread::current().id());
            rows.clear();
            return Ok(());
        }
        while self.in_flight() >= self.workers.len() {
            self.write_oldest(file, true)?;
        }
        let next = self.spare.pop().unwrap_or_else(|| {
            self.stats.buffers += 1;
            Rows::default()
        });
        let job = Job {
            rows: std::mem::replace(rows, next),
            sinks: self.take_sinks(),
        };
        self.in_flight_bytes += job.rows.raw_bytes();
        let w = (self.sent % self.workers.len() as u64) as usize;
        let sent = self.workers[w]
            .jobs
            .as_ref()
            .map(|jobs| jobs.send(job).is_ok());
        if sent != Some(true) {
            return Err(self.stopped(w));
        }
        self.sent += 1;
        self.stats.peak_in_flight = self.stats.peak_in_flight.max(self.in_flight());
        // Whatever is already encoded goes out now, so its memory is free sooner.
        while self.write_oldest(file, false)? {}
        Ok(())
    }

    /// Writes every row group still in flight.
    pub fn finish<W: Write + Send>(
        &mut self,
        file: &mut SerializedFileWriter<W>,
    ) -> Result<EncodeStats, ParquetError> {
        while self.in_flight() > 0 {
            self.write_oldest(file, true)?;
        }
        let mut stats = self.stats.clone();
        stats.threads_used = self.threads.len();
        Ok(stats)
    }

    fn take_sinks(&mut self) -> Sinks {
        self.spare_sinks.pop().unwrap_or_else(|| {
            self.stats.chunk_buffers += 1;
            Sinks::default()
        })
    }

    /// Raw bytes of the row groups in flight.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    fn in_flight(&self) -> usize {
        (self.sent - self.written) as usize
    }

    /// Writes the oldest row group in flight, waiting for it if `wait`; says whether it did.
    fn write_oldest<W: Write + Send>(
        &mut self,
        file: &mut SerializedFileWriter<W>,
        wait: bool,
    ) -> Result<bool, ParquetError> {
        if self.in_flight() == 0 {
            return Ok(false);
        }
        let w = (self.written % self.workers.len() as u64) as usize;
        let done = if wait {
            self.workers[w].done.recv().ok()
        } else {
            match self.workers[w].done.try_recv() {
                Ok(done) => Some(done),
                Err(TryRecvError::Empty) => return Ok(false),
                Err(TryRecvError::Disconnected) => None,
            }
        };
        let Some(Done {
            chunks,
            mut rows,
            thread,
        }) = done
        else {
            return Err(self.stopped(w));
        };
        let mut sinks = Sinks::default();
        write_group(file, chunks?, &mut sinks)?;
        self.spare_sinks.push(sinks);
        self.threads.insert(thread);
        self.written += 1;
        self.in_flight_bytes -= rows.raw_bytes();
        rows.clear();
        self.spare.push(rows);
        Ok(true)
    }

    /// The error for encoder `w` gone (it panicked): its panic's message if it has one.
    fn stopped(&mut self, w: usize) -> ParquetError {
        let why = match self.workers[w].thread.take().map(JoinHandle::join) {
            Some(Err(panic)) => panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string()),
            _ => "it stopped".to_string(),
        };
        ParquetError::General(format!("Parquet encoder thread {w} failed: {why}"))
    }
}

impl Drop for Encoders {
    /// Stops the encoders (each finishes the row group it has, if any) and waits for them.
    fn drop(&mut self) {
        for worker in &mut self.workers {
            worker.jobs = None;
        }
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                if thread.join().is_err() {
                    tracing::warn!("a Parquet encoder thread panicked");
                }
            }
        }
    }
}

/// An encoder thread: row groups in, encoded row groups out, in order, until the writer
/// hangs up.
fn encode_loop(encoder: &Encoder, jobs: &Receiver<Job>, done: &Sender<Done>) {
    let thread = std::thread::current().id();
    while let Ok(Job {
        mut rows,
        mut sinks,
    }) = jobs.recv()
    {
        let chunks = encoder.encode(&mut rows, &mut sinks);
        if done
            .send(Done {
                chunks,
                rows,
                thread,
            })
            .is_err()
        {
            return;
        }
    }
}

/// The block [`raise_malloc_thresholds`] allocates and frees.
const MALLOC_PROBE: usize = 4 << 20;

/// Makes glibc's malloc keep the column writer's page buffers (about 1 MiB, a few per
/// page) in its heaps instead of mapping and unmapping them, or trimming the heap under
/// them, for every page: faulting them in afresh cost the one-thread writer a fifth of
/// its CPU time (BENCHMARKS.md, "Parquet at both cores' speed").
///
/// glibc raises its mmap threshold to the size of a freed mapped block (up to 32 MiB) and
/// its trim threshold to twice that; a block of [`MALLOC_PROBE`], allocated and freed
/// untouched (no page of it is faulted in), moves them to 4 and 8 MiB, as `mallopt` would,
/// without unsafe code: pages fit under them, the row groups' own buffers (reused, see
/// [`Rows`]) stay mapped, and a heap keeps at most 8 MiB it does not use. Once per
/// process; other allocators ignore it.
fn raise_malloc_thresholds() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| drop(std::hint::black_box(Vec::<u8>::with_capacity(MALLOC_PROBE))));
}
