//! producer: reads items, stamps them with globally ordered IDs, writes shard `n`'s sublist.
//!
//! The input (lines or frames of a file or stdin, or generated items) is read in batches of B items.
//! Each batch gets one range of B IDs from an [`idclient::IdSource`] (one quorum round or
//! one broker request per batch), the items get the IDs in input order, and the batch is
//! written together with the progress marker in one synced RocksDB `WriteBatch`
//! ([`sublist::shard::ShardWriter`]). A producer killed at any moment and started again with
//! the same input resumes after the last durable batch: every item ends up in the sublist
//! exactly once, with the ID it got the first time (IDs fetched for a batch that never
//! became durable are holes, never duplicates).
//!
//! Main items: [`Config`], [`Producer`] (open, then [`Producer::run`]), [`run`],
//! [`generate_payload`] (the deterministic `--generate` items), [`ProducerError`];
//! [`InputFormat`] (lines or length-prefixed frames, [`mod@input`]);
//! [`seal()`] turns a finished sublist into a run in a directory or an S3 bucket
//! ([`mod@seal`]); with [`Publish`] (`--publish-every`), the producer publishes its items
//! as it goes, as segments and a checkpoint ([`mod@publish`]).
//!
//! While batch k is being written (fsync), the ID range of batch k+1 is already being
//! fetched: the two waits overlap. That is safe: the range of k+1 is requested after the
//! range of k was returned, so it lies above it; if the process dies, it is a hole.

pub mod append;
pub mod input;
pub mod metrics;
pub mod publish;
pub mod seal;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;

pub use append::{AppendConfig, Appender};
pub use input::{generate_payload, scan_file, InputFormat, ItemInput, ItemReader};
pub use metrics::ProducerMetrics;
pub use publish::{Publish, PublishError};
pub use qstore::Location;
pub use seal::{seal, SealError, SealSummary};
#[cfg(feature = "test-hooks")]
pub use test_hooks::STALL_ANNOUNCE;

use idclient::{IdError, IdRange, IdSource};
use indicatif::{ProgressBar, ProgressStyle};
use publish::Publisher;
use qformat::shard::ProgressMarker;
use qformat::Record;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use sublist::shard::{ShardError, ShardWriter};

/// What `--version` prints: the crate's version, and a warning in a build with the
/// `test-hooks` feature ([`qcli::version!`]).
pub const VERSION: &str = qcli::version!();

/// Largest item (line, frame or generated payload): 16 MiB. Lines of 10 MB are
/// accepted; above this an input is refused with the line number or the frame's byte
/// offset, before anything is written (file input), and a frame's length is checked
/// against it before its bytes are read, so a lying length allocates nothing.
/// Keeps one item, and the RocksDB value holding it, a sane size. It is the format's
/// limit, [`qformat::MAX_PAYLOAD`], which list.bin readers enforce too.
pub const MAX_ITEM_BYTES: usize = qformat::MAX_PAYLOAD;
/// A batch is closed early once it holds this many payload bytes, so a batch of 10,000
/// huge lines cannot exhaust memory (two batches are in flight at a time).
pub const MAX_BATCH_BYTES: usize = 32 << 20;
/// Largest `--batch`: one ID range and one WriteBatch per batch; beyond this a failed
/// batch wastes too much work and the pending records too much memory.
pub const MAX_BATCH_ITEMS: u64 = 1_000_000;
/// Default `--batch`.
pub const DEFAULT_BATCH: u64 = 1000;
/// Default `--payload-size` for `--generate`.
pub const DEFAULT_PAYLOAD_SIZE: usize = 100;

/// Everything that can stop a producer. Messages carry their cause inline (no `source`
/// chain), so `{:#}` prints each cause once. [`ProducerError::exit_code`] maps it to the
/// binary's exit code.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The arguments make no sense (batch 0, payload too large, ...).
    #[error("invalid arguments: {0}")]
    Config(String),

    /// The input cannot be read.
    #[error("input {input}: {error}")]
    Input {
        /// The input as named in messages ([`ItemInput::describe`]: a path, `stdin`, ...).
        input: String,
        /// The operating system's error.
        error: std::io::Error,
    },

    /// A line is longer than [`MAX_ITEM_BYTES`].
    #[error("input {input}: line {line} is longer than the limit of {limit} bytes per item")]
    LineTooLong {
        /// The input as named in messages ([`ItemInput::describe`]: a path, `stdin`, ...).
        input: String,
        /// The offending line's number, counted from 1.
        line: u64,
        /// The limit in bytes, [`MAX_ITEM_BYTES`].
        limit: usize,
    },

    /// A frame (`--input-format frames`) claims more than [`MAX_ITEM_BYTES`]: refused
    /// from its length alone, before its bytes are read.
    #[error("input {input}: the frame at byte offset {offset} (item {item}) has a length of {length} bytes, above the limit of {limit} bytes per item")]
    FrameTooLong {
        /// The input as named in messages ([`ItemInput::describe`]: a path, `stdin`, ...).
        input: String,
        /// The frame's item number (its sequence number, from 0).
        item: u64,
        /// Byte offset in the input at which the frame (its length) starts.
        offset: u64,
        /// The length the frame claims.
        length: u32,
        /// The limit in bytes, [`MAX_ITEM_BYTES`].
        limit: usize,
    },

    /// The input ends inside a frame: in its 4 length bytes or in its body. Every whole
    /// frame before it is written first (file input is checked by the first pass, before
    /// anything is written).
    #[error("input {input}: truncated frame at byte offset {offset} (item {item}): {what}")]
    TruncatedFrame {
        /// The input as named in messages ([`ItemInput::describe`]: a path, `stdin`, ...).
        input: String,
        /// The frame's item number (its sequence number, from 0).
        item: u64,
        /// Byte offset in the input at which the frame (its length) starts.
        offset: u64,
        /// What is missing, for a person to read.
        what: String,
    },

    /// The input no longer matches what the sublist was written from (found while reading).
    #[error("input {input} changed since the sublist was started: {reason}")]
    InputChanged {
        /// The input as named in messages ([`ItemInput::describe`]: a path, `stdin`, ...).
        input: String,
        /// What differs (item count, content), for a person to read.
        reason: String,
    },

    /// The sublist exists and was written from another input.
    #[error("sublist {path} was written from different input (stored: {stored}; given: {given}); refusing to mix inputs: use another --data-dir or delete {path}")]
    DifferentInput {
        /// The sublist's database directory, `DATA_DIR/shard-<n>`.
        path: PathBuf,
        /// The fingerprint of the input the sublist was started from (its progress marker).
        stored: String,
        /// The fingerprint of the input given now.
        given: String,
    },

    /// stdin, a pipe or a FIFO cannot be checked to be the same input, so a started sublist
    /// cannot resume from it (and a finished one cannot tell whether it is the input it
    /// already holds).
    #[error("sublist {path} {} {items} items; input from {input} cannot be resumed: stdin, a pipe or a FIFO can be read only once, so it cannot be checked to be the same input: use --input with a regular file, or delete {path} to write it again", if *finished { "is finished with" } else { "already holds" })]
    StreamNotResumable {
        /// The sublist's database directory, `DATA_DIR/shard-<n>`.
        path: PathBuf,
        /// The input as named in messages ([`ItemInput::describe`]: a path, `stdin`, ...).
        input: String,
        /// Items already durably in the sublist.
        items: u64,
        /// The sublist is finished (its whole input was written).
        finished: bool,
    },

    /// The sublist database failed (in use, wrong shard, not a sublist, I/O).
    #[error(transparent)]
    Shard(#[from] ShardError),

    /// Connecting to the ID generator failed.
    #[error("cannot connect to the ID generator: {0}")]
    Connect(IdError),

    /// Getting IDs failed (no quorum past the deadline, ...). Everything before is durable.
    #[error("getting IDs for items {next_seq}.. failed: {error} ({next_seq} items are durably in the sublist; run again to resume)")]
    Ids {
        /// Items durably in the sublist: the sequence number of the first unwritten one.
        next_seq: u64,
        /// Why the ID source failed.
        error: IdError,
    },

    /// The ID source returned a range of the wrong size: a bug in the source.
    #[error("ID source returned {got:?} for a request of {wanted} IDs")]
    BadRange {
        /// IDs asked for: the batch's item count.
        wanted: u64,
        /// The range the source returned, whose length is not `wanted`.
        got: IdRange,
    },

    /// The ID generator handed out IDs at or below an ID this sublist already holds: its
    /// nodes lost acknowledged writes (a quorum wiped by FLUSHALL, a deleted data dir...).
    #[error("the ID generator returned IDs {}..={}, not above {last_id}, the last ID already in sublist {}: IDs went backwards, so the ID generator's nodes lost acknowledged writes (FLUSHALL, a wiped or restored data dir, fsync off) and could repeat IDs given out before; nothing was written ({next_seq} items stay durable in the sublist). Do not use these nodes until their registers are back above every ID handed out", got.lo, got.hi, path.display())]
    IdsWentBackwards {
        /// The sublist's database directory, `DATA_DIR/shard-<n>`.
        path: PathBuf,
        /// The highest ID already in the sublist.
        last_id: u64,
        /// Items durably in the sublist; nothing of the batch was written.
        next_seq: u64,
        /// The range the ID generator returned, whose `lo` is not above `last_id`.
        got: IdRange,
    },

    /// A background write task died.
    #[error("write task failed: {0}")]
    Task(String),

    /// [`Appender::append`]: an item above [`MAX_ITEM_BYTES`]; it was not appended (nor
    /// anything after it in the same [`Appender::append_batch`]).
    #[error("sublist {}: item {seq} has {length} bytes, above the limit of {limit} bytes per item; it was not appended", path.display())]
    ItemTooLong {
        /// The sublist's database directory, `DATA_DIR/shard-<n>`.
        path: PathBuf,
        /// The number the item would have had.
        seq: u64,
        /// Its length in bytes.
        length: usize,
        /// The limit in bytes, [`MAX_ITEM_BYTES`].
        limit: usize,
    },

    /// [`Appender::append`] on a finished sublist: a finished sublist never changes.
    #[error("sublist {} is finished with {items} items: nothing more can be appended (seal it, or use another shard)", path.display())]
    Finished {
        /// The sublist's database directory, `DATA_DIR/shard-<n>`.
        path: PathBuf,
        /// Items in the sublist.
        items: u64,
    },

    /// An [`Appender`] call after an earlier one failed: what was appended but not durable
    /// is gone, so the appender takes nothing more. Open the shard again (as after a crash)
    /// and append from item `durable`.
    #[error("sublist {}: an earlier append failed ({reason}); {durable} items are durable: open the shard again and append from item {durable}", path.display())]
    AppenderFailed {
        /// The sublist's database directory, `DATA_DIR/shard-<n>`.
        path: PathBuf,
        /// Items durably in the sublist: the number to append from after reopening.
        durable: u64,
        /// The earlier error.
        reason: String,
    },

    /// Sealing a finished sublist ([`Appender::seal_to`]) failed.
    #[error(transparent)]
    Seal(#[from] SealError),

    /// Publishing as it goes ([`Publish`]) failed: the checkpoint found is bad or someone
    /// else's, or the destination failed. What is durable stays durable; run again to
    /// publish it.
    #[error(transparent)]
    Publish(#[from] PublishError),
}

impl ProducerError {
    /// Exit code of the `producer` binary: 2 bad arguments, 3 bad or unreadable input,
    /// 4 sublist refused (in use, wrong shard, different input, not a sublist, I/O),
    /// 5 ID generator unavailable or unsafe (no quorum, deadline, unsafe node, IDs went
    /// backwards), 1 anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            ProducerError::Config(_) => 2,
            ProducerError::Connect(IdError::Config(_)) => 2,
            ProducerError::Input { .. }
            | ProducerError::LineTooLong { .. }
            | ProducerError::FrameTooLong { .. }
            | ProducerError::TruncatedFrame { .. }
            | ProducerError::InputChanged { .. }
            | ProducerError::ItemTooLong { .. } => 3,
            ProducerError::DifferentInput { .. }
            | ProducerError::StreamNotResumable { .. }
            | ProducerError::Finished { .. }
            | ProducerError::Shard(_) => 4,
            ProducerError::Connect(_)
            | ProducerError::Ids { .. }
            | ProducerError::IdsWentBackwards { .. } => 5,
            ProducerError::Seal(e) => e.exit_code(),
            ProducerError::Publish(e) => e.exit_code(),
            ProducerError::BadRange { .. }
            | ProducerError::Task(_)
            | ProducerError::AppenderFailed { .. } => 1,
        }
    }
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressDisplay {
    /// An indicatif progress bar on stderr (for a terminal).
    Bar,
    /// A `tracing` info line every interval (for logs).
    Log(Duration),
    /// Nothing (library use, tests).
    Quiet,
}

/// What a producer does; built by the binary from its flags, or by tests.
#[derive(Debug, Clone)]
pub struct Config {
    /// The shard number `n` (`--shard`): which sublist, `data_dir/shard-<n>`, is written.
    pub shard: u32,
    /// The directory holding the sublists (`--data-dir`).
    pub data_dir: PathBuf,
    /// Where the items come from (`--input`, stdin or `--generate`).
    pub input: ItemInput,
    /// How a file or stdin is cut into items (`--input-format`); ignored by `--generate`.
    pub format: InputFormat,
    /// Items per batch: one ID range and one synced WriteBatch each.
    pub batch: u64,
    /// How progress is shown while running.
    pub display: ProgressDisplay,
    /// Publish as it goes (`--seal-to DEST --publish-every SECS`): segments and a
    /// checkpoint every interval, a finished checkpoint at the end. `None`: no publication.
    pub publish: Option<Publish>,
}

impl Config {
    /// A quiet config with the default batch size.
    pub fn new(shard: u32, data_dir: impl Into<PathBuf>, input: ItemInput) -> Config {
        Config {
            shard,
            data_dir: data_dir.into(),
            input,
            format: InputFormat::Lines,
            batch: DEFAULT_BATCH,
            display: ProgressDisplay::Quiet,
            publish: None,
        }
    }

    fn validate(&self) -> Result<(), ProducerError> {
        if self.batch == 0 || self.batch > MAX_BATCH_ITEMS {
            return Err(ProducerError::Config(format!(
                "--batch must be 1..={MAX_BATCH_ITEMS}, got {}",
                self.batch
            )));
        }
        if let ItemInput::Generate { payload_size, .. } = self.input {
            if payload_size > MAX_ITEM_BYTES {
                return Err(ProducerError::Config(format!(
                    "--payload-size must be at most {MAX_ITEM_BYTES}, got {payload_size}"
                )));
            }
        }
        Ok(())
    }
}

/// What one run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The shard number `n` written.
    pub shard: u32,
    /// The sublist's database directory, `DATA_DIR/shard-<n>`.
    pub path: PathBuf,
    /// The sublist was already finished: nothing was done.
    pub already_finished: bool,
    /// Items in the sublist when this run started (resume point).
    pub resumed_at: u64,
    /// Items written by this run.
    pub written: u64,
    /// Batches written by this run.
    pub batches: u64,
    /// IDs of this run's first and last item.
    pub id_span: Option<(u64, u64)>,
    /// Wall-clock time of [`Producer::run`], from its start to its end.
    pub elapsed: Duration,
    /// Publishing as it goes: items published (the last checkpoint's count), whether the
    /// checkpoint is finished, and where.
    pub published: Option<(u64, bool, Location)>,
}

impl Summary {
    /// Items in the sublist now.
    pub fn total(&self) -> u64 {
        self.resumed_at + self.written
    }

    /// Items stamped and written per second by this run.
    pub fn ids_per_sec(&self) -> f64 {
        self.written as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl Summary {
    fn fmt_published(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.published {
            Some((items, finished, dest)) => write!(
                f,
                "; published {items} items to {dest}{}",
                if *finished { ", finished" } else { "" }
            ),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already_finished {
            write!(
                f,
                "shard {}: {} is already finished ({} items): nothing to do",
                self.shard,
                self.path.display(),
                self.total()
            )?;
            return self.fmt_published(f);
        }
        write!(
            f,
            "shard {}: {} items in {:.3} s, {:.0} IDs/s, {} batches",
            self.shard,
            self.written,
            self.elapsed.as_secs_f64(),
            self.ids_per_sec(),
            self.batches
        )?;
        if self.resumed_at > 0 {
            write!(f, " (resumed after {} items)", self.resumed_at)?;
        }
        if let Some((lo, hi)) = self.id_span {
            write!(f, ", ids within {lo}..={hi}")?;
        }
        write!(f, "; {} holds {} items", self.path.display(), self.total())?;
        self.fmt_published(f)
    }
}

/// An opened producer: the sublist is locked and the input checked against it.
pub struct Producer {
    config: Config,
    writer: ShardWriter,
    progress: Option<ProgressMarker>,
    fingerprint: Vec<u8>,
    total: Option<u64>,
    metrics: Option<Arc<ProducerMetrics>>,
    publisher: Option<Publisher>,
}

impl Producer {
    /// Validates the config, opens (locks) the sublist and checks the input against it.
    /// Needs no ID generator: a finished sublist is recognised without one.
    ///
    /// # Errors
    /// Bad config, unreadable input or an over-long line (file input is scanned in full
    /// first), the sublist in use / of another shard / not a sublist, different input.
    pub fn open(config: Config) -> Result<Producer, ProducerError> {
        config.validate()?;
        let writer = ShardWriter::open(&config.data_dir, config.shard)?;
        let progress = writer.progress()?;
        let stream = match &config.input {
            ItemInput::Stdin => true,
            ItemInput::File(p) => input::is_stream(p)?,
            ItemInput::Generate { .. } => false,
        };
        let (fingerprint, total) = if stream {
            if let Some(p) = &progress {
                return Err(ProducerError::StreamNotResumable {
                    path: writer.path().to_path_buf(),
                    input: config.input.describe(),
                    items: p.next_seq,
                    finished: p.finished,
                });
            }
            if let ItemInput::File(p) = &config.input {
                tracing::warn!(input = %p.display(), "the input is a pipe or FIFO, not a regular file: it is read once, like stdin, so a run that stops cannot be resumed from it");
            }
            (b"stdin".to_vec(), None)
        } else {
            match &config.input {
                ItemInput::File(p) => {
                    let scan = scan_file(p, config.format)?;
                    (scan.fingerprint.into_bytes(), Some(scan.items))
                }
                ItemInput::Stdin => (b"stdin".to_vec(), None),
                ItemInput::Generate {
                    count,
                    payload_size,
                } => (
                    format!("generate count={count} payload-size={payload_size}").into_bytes(),
                    Some(*count),
                ),
            }
        };
        check_same_input(&writer, progress.as_ref(), &fingerprint)?;
        if total == Some(0) && progress.is_none() {
            tracing::warn!(input = %config.input.describe(), "the input is empty: writing an empty, finished sublist");
        }
        let publisher = open_publisher(config.publish.as_ref(), config.shard, progress.as_ref())?;
        Ok(Producer {
            config,
            writer,
            progress,
            fingerprint,
            total,
            metrics: None,
            publisher,
        })
    }

    /// The same producer, counting what it writes into `metrics` (`--metrics-listen`).
    pub fn with_metrics(mut self, metrics: Arc<ProducerMetrics>) -> Producer {
        self.metrics = Some(metrics);
        self
    }

    /// The sublist is finished: [`Producer::run`] would stamp nothing (it may still have
    /// to publish, [`Producer::needs_ids`]).
    pub fn is_finished(&self) -> bool {
        self.progress.as_ref().is_some_and(|p| p.finished)
    }

    /// [`Producer::run`] may ask the ID source for IDs: the sublist is not finished.
    /// (Finishing a publication claims no ID: a finished shard's claim is infinite.)
    pub fn needs_ids(&self) -> bool {
        !self.is_finished()
    }

    /// Items already in the sublist.
    pub fn resume_at(&self) -> u64 {
        self.progress.as_ref().map_or(0, |p| p.next_seq)
    }

    /// The summary of a run that stamped nothing (finished sublist).
    fn nothing_to_do(&self, start: Instant, published: Option<&Publisher>) -> Summary {
        Summary {
            shard: self.config.shard,
            path: self.writer.path().to_path_buf(),
            already_finished: true,
            resumed_at: self.resume_at(),
            written: 0,
            batches: 0,
            id_span: None,
            elapsed: start.elapsed(),
            published: published.map(Publisher::summary),
        }
    }

    /// A finished sublist: finishes its publication if an earlier run was killed before.
    async fn finish_publication(self, start: Instant) -> Result<Summary, ProducerError> {
        let Producer {
            config,
            writer,
            progress,
            fingerprint,
            total,
            metrics,
            publisher,
        } = self;
        let report = Reporter::new(ProgressDisplay::Quiet, config.shard, None, 0);
        let mut stamper = Stamper::new(
            writer,
            progress.as_ref(),
            fingerprint.clone(),
            report,
            metrics.clone(),
        );
        stamper.set_publisher(publisher);
        stamper.publish(&NoIds, true).await?;
        let Stamper {
            writer, publisher, ..
        } = stamper;
        let Writer::Idle(w) = writer else {
            return Err(writer_lost());
        };
        let p = Producer {
            config,
            writer: w.writer,
            progress,
            fingerprint,
            total,
            metrics,
            publisher: None,
        };
        Ok(p.nothing_to_do(start, publisher.as_ref()))
    }

    /// Stamps and writes the rest of the input, then marks the sublist finished.
    ///
    /// # Errors
    /// Input errors, ID errors (every batch before the failing one is durable), sublist
    /// write errors. The sublist is never half-written: each batch is atomic.
    pub async fn run(self, source: &impl IdSource) -> Result<Summary, ProducerError> {
        let start = Instant::now();
        if self.is_finished() {
            return self.finish_publication(start).await;
        }
        let mut execution = Execution::start(self)?;
        let result = execution.stamp_all(source).await;
        // Whatever happened, wait for the last write so the summary and the error are true.
        let waited = execution.stamper.finish_pending().await;
        execution.stamper.report.finish();
        result?;
        waited?;
        execution.summary(start)
    }
}

/// One execution of a producer ([`Producer::run`], not a sealed run file): the input
/// positioned after the durable items, and the stamper.
struct Execution {
    config: Config,
    /// The item count the input had when this execution started, if it could be counted.
    total: Option<u64>,
    /// File input: the fingerprint of the start, which this execution's reading must match.
    scanned: Option<Vec<u8>>,
    reader: ItemReader,
    stamper: Stamper,
}

impl Execution {
    /// Positions the input after the durable items (checking them against a file input).
    fn start(producer: Producer) -> Result<Execution, ProducerError> {
        let Producer {
            config,
            writer,
            progress,
            fingerprint,
            total,
            metrics,
            publisher,
        } = producer;
        let shard = config.shard;
        let resumed_at = progress.as_ref().map_or(0, |p| p.next_seq);
        let reader = match &config.input {
            ItemInput::File(_) if resumed_at > 0 => {
                let mut r = ItemReader::open(&config.input, config.format, shard, 0)?;
                check_stored_prefix(&writer, &mut r, resumed_at)?;
                r
            }
            _ => ItemReader::open(&config.input, config.format, shard, resumed_at)?,
        };
        let scanned = match (&config.input, total) {
            (ItemInput::File(_), Some(_)) => Some(fingerprint.clone()),
            _ => None,
        };
        if resumed_at > 0 {
            tracing::info!(shard, resumed_at, "resuming after the last durable batch");
        }
        let report = Reporter::new(config.display, shard, total, resumed_at);
        let mut stamper = Stamper::new(writer, progress.as_ref(), fingerprint, report, metrics);
        stamper.set_publisher(publisher);
        Ok(Execution {
            config,
            total,
            scanned,
            reader,
            stamper,
        })
    }

    /// Batch after batch until the input ends, then marks the sublist finished.
    async fn stamp_all(&mut self, source: &impl IdSource) -> Result<(), ProducerError> {
        loop {
            let items = match self.reader.next_batch(self.config.batch, MAX_BATCH_BYTES) {
                Ok(items) => items,
                Err(e) => {
                    self.stamper.finish_pending().await?;
                    return Err(e);
                }
            };
            if items.is_empty() {
                self.mark_finished().await?;
                return self.stamper.publish(source, true).await;
            }
            // Between two batches: no ID request is in flight.
            if self.stamper.publish_due() {
                self.stamper.publish(source, false).await?;
            }
            let mut items = items;
            self.stamper.stamp_batch(&mut items, source).await?;
        }
    }

    /// The input ended: once it is known to be the input the run started with, write the
    /// progress marker with `finished`.
    async fn mark_finished(&mut self) -> Result<(), ProducerError> {
        self.stamper.finish_pending().await?;
        let read = self.stamper.idle()?.next_seq;
        self.check_input_unchanged(read)?;
        self.stamper.write_finished()
    }

    /// At the end of the input: it still has the item count, and (file) the content, it
    /// had when the run started.
    fn check_input_unchanged(&mut self, read: u64) -> Result<(), ProducerError> {
        if let Some(total) = self.total.filter(|&t| t != read) {
            // The input was counted when the run started; reading it again gave another
            // count, so it changed underneath us.
            return Err(ProducerError::InputChanged {
                input: self.config.input.describe(),
                reason: format!("it had {total} items when the run started, {read} were read"),
            });
        }
        let Some(scanned) = &self.scanned else {
            return Ok(());
        };
        let content = self
            .reader
            .content_fingerprint()
            .unwrap_or_else(|| "more bytes after the end it reached".into());
        if content.as_bytes() != scanned.as_slice() {
            return Err(ProducerError::InputChanged {
                input: self.config.input.describe(),
                reason: format!(
                    "it was edited while it was read (at the start: {}; read: {content}); the sublist is left unfinished: delete {} and run again with the input you mean",
                    String::from_utf8_lossy(scanned),
                    self.stamper.path.display()
                ),
            });
        }
        Ok(())
    }

    fn summary(self, start: Instant) -> Result<Summary, ProducerError> {
        self.stamper.summary(start)
    }
}

/// Stamping and writing batches, the one path every item takes, from an input
/// ([`Producer::run`]) or, next, from code: one ID range per batch, the items
/// stamped in order, written with the progress marker in one synced WriteBatch on the
/// blocking pool while the caller prepares the next batch and fetches its IDs.
struct Stamper {
    shard: u32,
    path: PathBuf,
    fingerprint: Vec<u8>,
    /// Items durable when the sublist was opened.
    resumed_at: u64,
    /// Items durable now, as of the last write that completed.
    durable: u64,
    report: Reporter,
    writer: Writer,
    metrics: Option<Arc<ProducerMetrics>>,
    /// Publishing as it goes; `None` while a publication runs on the blocking pool.
    publisher: Option<Publisher>,
    /// The last claim published: every ID this shard gets from now on must be above it,
    /// as the claim promises (an ID source that went back below it is refused).
    claimed: u64,
}

impl Stamper {
    /// Stamps after what `progress` (the sublist's marker, if any) says is durable.
    fn new(
        writer: ShardWriter,
        progress: Option<&ProgressMarker>,
        fingerprint: Vec<u8>,
        report: Reporter,
        metrics: Option<Arc<ProducerMetrics>>,
    ) -> Stamper {
        let resumed_at = progress.map_or(0, |p| p.next_seq);
        Stamper {
            shard: writer.shard(),
            path: writer.path().to_path_buf(),
            fingerprint,
            resumed_at,
            durable: resumed_at,
            report,
            writer: Writer::Idle(WriterState {
                writer,
                next_seq: resumed_at,
                batches: 0,
                first_id: None,
                last_id: progress.map_or(0, |p| p.last_id),
            }),
            metrics,
            publisher: None,
            claimed: 0,
        }
    }

    /// Publishes with `publisher` (opened on this sublist) from now on.
    fn set_publisher(&mut self, mut publisher: Option<Publisher>) {
        if let Some(p) = &mut publisher {
            p.set_metrics(self.metrics.clone());
            if !p.last.finished {
                self.claimed = p.last.claim;
            }
            self.report.published = Some(p.last.count);
        }
        self.publisher = publisher;
    }

    /// Publishing, and a publication is due.
    fn publish_due(&self) -> bool {
        self.publisher.as_ref().is_some_and(Publisher::due)
    }

    /// Publishes what is durable (nothing without a publisher): waits for the running
    /// write, takes the claim (`finished`: infinite), then writes the segment and the
    /// checkpoint on the blocking pool. Called between two batches, so that no ID request
    /// is in flight when the claim is taken.
    async fn publish(
        &mut self,
        source: &impl IdSource,
        finished: bool,
    ) -> Result<(), ProducerError> {
        let Some((last_count, last_claim, last_finished)) = self
            .publisher
            .as_ref()
            .map(|p| (p.last.count, p.last.claim, p.last.finished))
        else {
            return Ok(());
        };
        self.finish_pending().await?;
        let durable = self.idle()?.next_seq;
        if finished && last_finished && last_count == durable {
            return Ok(());
        }
        let claim = if finished {
            u64::MAX
        } else {
            self.claim(source, last_claim).await?
        };
        let w = self.take_writer()?;
        let mut p = self.publisher.take().ok_or_else(writer_lost)?;
        let done = tokio::task::spawn_blocking(move || {
            let r = p.publish(&w.writer, durable, claim, finished);
            (w, p, r)
        })
        .await
        .map_err(|e| ProducerError::Task(e.to_string()))?;
        let (w, p, published) = done;
        self.writer = Writer::Idle(w);
        self.publisher = Some(p);
        published?;
        if !finished {
            self.claimed = claim;
        }
        self.report.published = Some(durable);
        Ok(())
    }

    /// The claim to publish, with the writer idle (the last write durable) and no ID
    /// request in flight: the largest ID returned to this producer if it is above the last
    /// claim, else one fresh ID (a hole), so that an idle producer does not hold the
    /// watermark back.
    async fn claim(
        &mut self,
        source: &impl IdSource,
        last_claim: u64,
    ) -> Result<u64, ProducerError> {
        let w = self.idle()?;
        let (last_id, next_seq) = (w.last_id, w.next_seq);
        if last_id > last_claim {
            return Ok(last_id);
        }
        let asked = Instant::now();
        let ids = source.next_ids(1).await;
        if let Some(m) = &self.metrics {
            m.ids_fetched(asked.elapsed(), ids.is_ok());
        }
        let got = ids.map_err(|error| ProducerError::Ids { next_seq, error })?;
        let floor = last_claim.max(last_id);
        if got.lo <= floor {
            return Err(ProducerError::IdsWentBackwards {
                path: self.path.clone(),
                last_id: floor,
                next_seq,
                got,
            });
        }
        Ok(got.hi)
    }

    /// Gets one ID range for `items` and starts writing them with it: the write runs
    /// while the caller reads the next batch and fetches its IDs. `items` is emptied once
    /// they are handed to the write; on an error before that it is left as it was.
    async fn stamp_batch(
        &mut self,
        items: &mut Vec<Vec<u8>>,
        source: &impl IdSource,
    ) -> Result<(), ProducerError> {
        debug_assert!(!items.is_empty(), "an ID range of 0 IDs");
        let n = items.len() as u64;
        let asked = Instant::now();
        let ids = source.next_ids(n).await;
        if let Some(m) = &self.metrics {
            m.ids_fetched(asked.elapsed(), ids.is_ok());
        }
        self.finish_pending().await?;
        self.maybe_test_stall().await;
        let w = self.take_writer()?;
        let range = match self.check_range(ids, n, &w) {
            Ok(range) => range,
            Err(e) => {
                self.writer = Writer::Idle(w);
                return Err(e);
            }
        };
        let records = stamp(std::mem::take(items), range, self.shard, w.next_seq);
        let fingerprint = self.fingerprint.clone();
        self.writer = Writer::Busy(tokio::task::spawn_blocking(move || {
            write_batch(w, &records, range, fingerprint)
        }));
        Ok(())
    }

    /// The range the ID source returned, if it is one to stamp `n` items after `w` with.
    fn check_range(
        &self,
        ids: Result<IdRange, IdError>,
        n: u64,
        w: &WriterState,
    ) -> Result<IdRange, ProducerError> {
        let range = ids.map_err(|error| ProducerError::Ids {
            next_seq: w.next_seq,
            error,
        })?;
        if !range.holds_exactly(n) {
            return Err(ProducerError::BadRange {
                wanted: n,
                got: range,
            });
        }
        // Above the last published claim too: a claim promises the shard's later IDs.
        let floor = w.last_id.max(self.claimed);
        if range.lo <= floor {
            return Err(ProducerError::IdsWentBackwards {
                path: self.path.clone(),
                last_id: floor,
                next_seq: w.next_seq,
                got: range,
            });
        }
        Ok(range)
    }

    /// What this stamper wrote since `start`, once its writer is idle.
    fn summary(&self, start: Instant) -> Result<Summary, ProducerError> {
        let Writer::Idle(state) = &self.writer else {
            return Err(writer_lost());
        };
        Ok(Summary {
            shard: self.shard,
            path: self.path.clone(),
            already_finished: false,
            resumed_at: self.resumed_at,
            written: state.next_seq - self.resumed_at,
            batches: state.batches,
            id_span: state.first_id.map(|lo| (lo, state.last_id)),
            elapsed: start.elapsed(),
            published: self.publisher.as_ref().map(Publisher::summary),
        })
    }

    /// Writes the progress marker with `finished` (after [`Stamper::finish_pending`]).
    fn write_finished(&mut self) -> Result<(), ProducerError> {
        let fingerprint = self.fingerprint.clone();
        let w = self.idle()?;
        let done = ProgressMarker {
            next_seq: w.next_seq,
            finished: true,
            last_id: w.last_id,
            fingerprint,
        };
        w.writer.write_batch(&[], &done)?;
        Ok(())
    }

    /// The test hook of [`test_hooks::STALL_ENV`], once the writer is idle.
    #[cfg(feature = "test-hooks")]
    async fn maybe_test_stall(&mut self) {
        if let Writer::Idle(w) = &self.writer {
            test_hooks::maybe_stall(w.next_seq).await;
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    async fn maybe_test_stall(&mut self) {}

    /// The idle writer (after [`Stamper::finish_pending`]).
    fn idle(&mut self) -> Result<&mut WriterState, ProducerError> {
        debug_assert!(
            !matches!(self.writer, Writer::Busy(_)),
            "a write still runs"
        );
        match &mut self.writer {
            Writer::Idle(w) => Ok(w),
            _ => Err(writer_lost()),
        }
    }

    /// The idle writer, to hand to the next write.
    fn take_writer(&mut self) -> Result<WriterState, ProducerError> {
        debug_assert!(
            !matches!(self.writer, Writer::Busy(_)),
            "a write still runs"
        );
        match std::mem::replace(&mut self.writer, Writer::Lost) {
            Writer::Idle(w) => Ok(w),
            other => {
                self.writer = other;
                Err(writer_lost())
            }
        }
    }

    /// Waits for the running write, if any: its writer becomes idle again (or is lost
    /// with the write's error, which this returns).
    async fn finish_pending(&mut self) -> Result<(), ProducerError> {
        match std::mem::replace(&mut self.writer, Writer::Lost) {
            Writer::Busy(h) => {
                let w = h.await.map_err(|e| ProducerError::Task(e.to_string()))??;
                self.durable = w.next_seq;
                self.report.update(w.next_seq);
                if let Some(m) = &self.metrics {
                    m.written(w.next_seq - self.resumed_at, w.batches);
                }
                self.writer = Writer::Idle(w);
            }
            other => self.writer = other,
        }
        Ok(())
    }
}

/// The ID source of a finished sublist, which asks for none (finishing a publication
/// claims no ID).
struct NoIds;

impl IdSource for NoIds {
    async fn next_ids(&self, _n: u64) -> Result<IdRange, IdError> {
        Err(IdError::BadRequest(
            "a finished sublist asks for no ID".into(),
        ))
    }
}

/// Opens the publisher of `publish` for a sublist with `progress` (blocks on the store).
fn open_publisher(
    publish: Option<&Publish>,
    shard: u32,
    progress: Option<&ProgressMarker>,
) -> Result<Option<Publisher>, ProducerError> {
    let Some(publish) = publish else {
        return Ok(None);
    };
    let store = qstore::Store::new(qstore::StoreOptions::default());
    let durable = progress.map_or(0, |p| p.next_seq);
    let finished = progress.is_some_and(|p| p.finished);
    Ok(Some(Publisher::open(
        publish, store, shard, durable, finished,
    )?))
}

/// A started sublist continues only from the input it was started with: its progress
/// marker's fingerprint must be `fingerprint`.
fn check_same_input(
    writer: &ShardWriter,
    progress: Option<&ProgressMarker>,
    fingerprint: &[u8],
) -> Result<(), ProducerError> {
    match progress {
        Some(p) if p.fingerprint != fingerprint => Err(ProducerError::DifferentInput {
            path: writer.path().to_path_buf(),
            stored: String::from_utf8_lossy(&p.fingerprint).into_owned(),
            given: String::from_utf8_lossy(fingerprint).into_owned(),
        }),
        _ => Ok(()),
    }
}

/// The items with their IDs, in input order, as the records of `shard` from `next_seq` on.
fn stamp(items: Vec<Vec<u8>>, range: IdRange, shard: u32, next_seq: u64) -> Vec<Record> {
    items
        .into_iter()
        .zip(range.iter())
        .enumerate()
        .map(|(i, (payload, id))| Record {
            id,
            shard,
            seq: next_seq + i as u64,
            payload,
        })
        .collect()
}

/// Writes one stamped batch with its progress marker (one synced WriteBatch); runs on the
/// blocking pool.
fn write_batch(
    mut w: WriterState,
    records: &[Record],
    range: IdRange,
    fingerprint: Vec<u8>,
) -> Result<WriterState, ProducerError> {
    let n = records.len() as u64;
    let p = ProgressMarker {
        next_seq: w.next_seq + n,
        finished: false,
        last_id: range.hi,
        fingerprint,
    };
    w.writer.write_batch(records, &p)?;
    w.next_seq += n;
    w.last_id = range.hi;
    w.batches += 1;
    w.first_id.get_or_insert(range.lo);
    Ok(w)
}

/// Resuming from a file: the items already in the sublist must be the input's first
/// `resumed_at` items (lines or frames), byte for byte, or the input was edited since they were written
/// (the fingerprint only describes the whole file as it is now).
fn check_stored_prefix(
    writer: &ShardWriter,
    reader: &mut ItemReader,
    resumed_at: u64,
) -> Result<(), ProducerError> {
    let input = reader.input().to_string();
    let changed = |reason: String| ProducerError::InputChanged {
        input: input.clone(),
        reason,
    };
    for stored in writer.items() {
        let stored = stored?;
        let seq = reader.next_seq();
        let place = reader.place();
        match reader.next_item()? {
            Some(item) if item == stored.payload && stored.seq == seq => {}
            Some(_) => {
                return Err(changed(format!(
                    "{place} is not item {seq} that the sublist {} already holds (it was edited since); delete the sublist and run again with the input you mean",
                    writer.path().display()
                )))
            }
            None => {
                return Err(changed(format!(
                    "it has {seq} items, the sublist already holds {resumed_at}"
                )))
            }
        }
    }
    if reader.next_seq() != resumed_at {
        return Err(ProducerError::Shard(ShardError::Corrupt {
            path: writer.path().to_path_buf(),
            reason: format!(
                "{} items, the progress marker says {resumed_at}",
                reader.next_seq()
            ),
        }));
    }
    Ok(())
}

/// The sublist's writer: idle between batches, or busy writing the previous batch on the
/// blocking pool while the next batch's IDs are fetched. A write that failed, or whose
/// task died, takes the writer with it: the run ends with that write's error.
enum Writer {
    Idle(WriterState),
    Busy(tokio::task::JoinHandle<Result<WriterState, ProducerError>>),
    Lost,
}

/// Asking for the writer after a failed write, which has ended the run already.
fn writer_lost() -> ProducerError {
    ProducerError::Task("writer lost after a failed write".into())
}

/// The sublist's writer and what it has durably written in this execution: the state
/// an idle [`Writer`] holds, and a busy one's write hands back.
struct WriterState {
    writer: ShardWriter,
    next_seq: u64,
    batches: u64,
    first_id: Option<u64>,
    last_id: u64,
}

/// Opens the sublist and runs to the end: [`Producer::open`] then [`Producer::run`].
///
/// # Errors
/// As those two.
pub async fn run(config: Config, source: &impl IdSource) -> Result<Summary, ProducerError> {
    Producer::open(config)?.run(source).await
}

/// Shows progress: a bar on a terminal, periodic log lines otherwise.
struct Reporter {
    display: ProgressDisplay,
    bar: Option<ProgressBar>,
    shard: u32,
    total: Option<u64>,
    start: Instant,
    start_seq: u64,
    last_log: Instant,
    /// Publishing as it goes: items published so far.
    published: Option<u64>,
}

impl Reporter {
    fn new(display: ProgressDisplay, shard: u32, total: Option<u64>, start_seq: u64) -> Reporter {
        let bar = (display == ProgressDisplay::Bar).then(|| {
            let bar = match total {
                Some(t) => ProgressBar::new(t),
                None => ProgressBar::new_spinner(),
            };
            let template = if total.is_some() {
                "shard {prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} items, {msg}, ETA {eta}"
            } else {
                "shard {prefix} [{elapsed_precise}] {spinner} {pos} items, {msg}"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bar.set_prefix(shard.to_string());
            bar.set_message("- items/s");
            bar.set_position(start_seq);
            bar.reset_eta();
            bar
        });
        let now = Instant::now();
        Reporter {
            display,
            bar,
            shard,
            total,
            start: now,
            start_seq,
            last_log: now,
            published: None,
        }
    }

    /// ", N published" when publishing.
    fn published_text(&self) -> String {
        self.published
            .map(|n| format!(", {n} published"))
            .unwrap_or_default()
    }

    fn update(&mut self, next_seq: u64) {
        match self.display {
            ProgressDisplay::Bar => {
                if let Some(b) = &self.bar {
                    let rate = (next_seq - self.start_seq) as f64
                        / self.start.elapsed().as_secs_f64().max(1e-9);
                    b.set_position(next_seq);
                    b.set_message(format!("{rate:.0} items/s{}", self.published_text()));
                }
            }
            ProgressDisplay::Log(every) => {
                if self.last_log.elapsed() >= every {
                    self.last_log = Instant::now();
                    let done = next_seq - self.start_seq;
                    let rate = done as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
                    let of = self.total.map(|t| format!(" of {t}")).unwrap_or_default();
                    tracing::info!(
                        "shard {}: {next_seq}{of} items, {rate:.0} items/s{}",
                        self.shard,
                        self.published_text()
                    );
                }
            }
            ProgressDisplay::Quiet => {}
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests;
