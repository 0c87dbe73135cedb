//! Appending from code: the embedding API. A job that computes its items stamps them where
//! they are computed, with the guarantees of the `producer` binary.
//!
//! [`Appender::open`] opens (locks) shard `n`'s sublist and says, in
//! [`Appender::resume_at`], how many items are already durable in it: the number of the
//! caller's next item. [`Appender::append`] and [`Appender::append_batch`] buffer items;
//! every `batch` items (or [`MAX_BATCH_BYTES`] of payload) are stamped with one ID range and
//! written with the progress marker in one synced WriteBatch, the same path
//! [`crate::Producer::run`] takes. [`Appender::flush`] makes everything appended so far
//! durable; [`Appender::finish`] marks the sublist finished; [`Appender::seal_to`] then
//! writes it as a run into a directory or S3.
//!
//! Exactly once across kill -9: items and marker are one atomic write, so after a crash
//! [`Appender::resume_at`] is exactly the count of durable items, which are items
//! `0..resume_at` in the order they were appended. A caller that appends its items again
//! from that number on ends with every item exactly once. Items appended but not yet
//! durable when the process died are simply not there (their IDs, if fetched, are holes).
//!
//! Publishing as it goes: with [`AppendConfig::publish`], the first [`Appender::append`],
//! [`Appender::append_batch`] or [`Appender::flush`] call after each interval publishes
//! what is durable by then (a segment, then the checkpoint; items still buffered wait for
//! the next), and [`Appender::publish`] publishes everything appended so far now;
//! [`Appender::finish`] publishes the rest and a finished checkpoint. There is no timer: a
//! caller that stops calling (a long computation between two appends) holds the shard's
//! claim, and so the list's stable watermark, where its last publication left it; call
//! [`Appender::publish`] from time to time during such pauses.
//!
//! Order: an item's ID is fetched when its batch is stamped, after `append` accepted it,
//! so it is above every ID handed out anywhere before `append` was called. To stamp now
//! (say, before telling another process about the item), call [`Appender::flush`].
//!
//! ```no_run
//! # async fn job(source: idclient::QuorumClient) -> Result<(), producer::ProducerError> {
//! use producer::{AppendConfig, Appender};
//! let mut a = Appender::open(AppendConfig::new(3, "/data/sublists"), source)?;
//! for i in a.resume_at()..1_000_000 {
//!     a.append(format!("item {i}").as_bytes()).await?;
//! }
//! a.finish().await?;
//! a.seal_to("s3://bucket/runs").await?;
//! # Ok(()) }
//! ```

use crate::seal::{seal, SealError, SealSummary};
use crate::{
    check_same_input, open_publisher, ProducerError, ProgressDisplay, Publish, Reporter, Stamper,
    Summary, DEFAULT_BATCH, MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_ITEM_BYTES,
};
use idclient::IdSource;
use qstore::{Location, Store, StoreOptions};
use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;
use sublist::shard::ShardWriter;

/// What [`Appender::open`] opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendConfig {
    /// The shard number `n`: the sublist is `data_dir/shard-<n>`.
    pub shard: u32,
    /// The directory holding the sublists (created if missing).
    pub data_dir: PathBuf,
    /// Items per batch: one ID range and one synced write each (1..=[`MAX_BATCH_ITEMS`]).
    pub batch: u64,
    /// Names what this job appends; stored in the sublist's progress marker, so that
    /// opening the sublist to append something else (another name, or a sublist the
    /// `producer` binary wrote from a file) is refused with
    /// [`ProducerError::DifferentInput`] instead of mixing the two. Default `"code"`.
    pub name: String,
    /// Publish as it goes (see the [module docs](self)): a segment and a checkpoint in
    /// `publish.dest` every `publish.every`. Default `None`.
    pub publish: Option<Publish>,
}

impl AppendConfig {
    /// Shard `shard` under `data_dir`, batches of [`DEFAULT_BATCH`], name `"code"`.
    pub fn new(shard: u32, data_dir: impl Into<PathBuf>) -> AppendConfig {
        AppendConfig {
            shard,
            data_dir: data_dir.into(),
            batch: DEFAULT_BATCH,
            name: "code".into(),
            publish: None,
        }
    }

    /// The same config, publishing into `dest` (a local directory that exists, or
    /// `s3://bucket/prefix`) every `every`.
    ///
    /// # Errors
    /// [`ProducerError::Publish`]: `dest` is not a destination, or `every` is zero.
    pub fn publish_every(
        mut self,
        dest: &str,
        every: std::time::Duration,
    ) -> Result<AppendConfig, ProducerError> {
        self.publish = Some(Publish::new(dest, every)?);
        Ok(self)
    }

    /// The fingerprint stored in the progress marker.
    fn fingerprint(&self) -> Vec<u8> {
        format!("append name={}", self.name).into_bytes()
    }
}

/// Appends items from code to shard `n`'s sublist; see the [module docs](self).
///
/// Call [`Appender::flush`] or [`Appender::finish`] before dropping it: items still
/// buffered are dropped with it (not durable, so [`Appender::resume_at`] of the next open
/// does not count them), and a write still running finishes on its own.
pub struct Appender<S> {
    source: S,
    data_dir: PathBuf,
    batch: u64,
    pub(crate) stamper: Stamper,
    /// Items appended but not yet handed to a write.
    buffer: Vec<Vec<u8>>,
    buffer_bytes: usize,
    /// Number of the next item appended.
    next_seq: u64,
    finished: bool,
    /// The sublist was finished when it was opened (by an earlier run).
    finished_at_open: bool,
    /// The first error: after it the appender refuses everything.
    failed: Option<String>,
    opened: Instant,
}

impl<S: IdSource> Appender<S> {
    /// Opens (creating if needed) and locks `config.data_dir/shard-<n>`; `source` gives
    /// the IDs. Needs no ID yet, and no async runtime.
    ///
    /// # Errors
    /// A batch size out of range ([`ProducerError::Config`]); the sublist in use by another
    /// process, another shard's, not a sublist, unreadable ([`ProducerError::Shard`]);
    /// started by something else than this config's name ([`ProducerError::DifferentInput`]);
    /// publishing: the destination's checkpoint bad or someone else's, the destination
    /// failing ([`ProducerError::Publish`]). Opening with publishing reads the checkpoint
    /// and removes orphan segments: it blocks on the store.
    pub fn open(config: AppendConfig, source: S) -> Result<Appender<S>, ProducerError> {
        if config.batch == 0 || config.batch > MAX_BATCH_ITEMS {
            return Err(ProducerError::Config(format!(
                "batch must be 1..={MAX_BATCH_ITEMS}, got {}",
                config.batch
            )));
        }
        let writer = ShardWriter::open(&config.data_dir, config.shard)?;
        let progress = writer.progress()?;
        let fingerprint = config.fingerprint();
        check_same_input(&writer, progress.as_ref(), &fingerprint)?;
        let finished = progress.as_ref().is_some_and(|p| p.finished);
        let resumed_at = progress.as_ref().map_or(0, |p| p.next_seq);
        if resumed_at > 0 {
            tracing::info!(
                shard = config.shard,
                resumed_at,
                finished,
                "reopened a started sublist"
            );
        }
        let publisher = open_publisher(config.publish.as_ref(), config.shard, progress.as_ref())?;
        let report = Reporter::new(ProgressDisplay::Quiet, config.shard, None, resumed_at);
        let mut stamper = Stamper::new(writer, progress.as_ref(), fingerprint, report, None);
        stamper.set_publisher(publisher);
        Ok(Appender {
            source,
            data_dir: config.data_dir,
            batch: config.batch,
            stamper,
            buffer: Vec::new(),
            buffer_bytes: 0,
            next_seq: resumed_at,
            finished,
            finished_at_open: finished,
            failed: None,
            opened: Instant::now(),
        })
    }

    /// The same appender, counting what it writes into `metrics`: the counters
    /// `producer --metrics-listen` serves (items and batches durably written by this
    /// run, failed ID requests, each batch's wait for its IDs), for a job that serves
    /// them itself ([`crate::metrics::endpoints`], or its own Prometheus registry).
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::ProducerMetrics>) -> Appender<S> {
        if let Some(p) = &mut self.stamper.publisher {
            p.set_metrics(Some(metrics.clone()));
        }
        self.stamper.metrics = Some(metrics);
        self
    }

    /// Publishing: items published so far (the last checkpoint's count) and its claim;
    /// `None` without [`AppendConfig::publish`].
    pub fn published(&self) -> Option<(u64, u64)> {
        self.stamper
            .publisher
            .as_ref()
            .map(|p| (p.last.count, p.last.claim))
    }

    /// Items that were durable when the sublist was opened: the number of the caller's
    /// next item. A caller that appends its items from this number on gets each exactly
    /// once, whatever happened to earlier runs.
    pub fn resume_at(&self) -> u64 {
        self.stamper.resumed_at
    }

    /// The number the next appended item gets (items appended so far, durable or not).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Items known to be durable: those of every write that has completed.
    pub fn durable(&self) -> u64 {
        self.stamper.durable
    }

    /// The sublist is finished (by [`Appender::finish`], now or in an earlier run): it
    /// takes no more items and can be sealed.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The sublist's database directory, `DATA_DIR/shard-<n>`.
    pub fn path(&self) -> &std::path::Path {
        &self.stamper.path
    }

    /// The ID source given to [`Appender::open`].
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Appends one item (any bytes, up to [`MAX_ITEM_BYTES`]); returns its number. It is
    /// stamped and written with its batch, once `batch` items are buffered (the write
    /// runs while the caller goes on); [`Appender::flush`] makes it durable now.
    ///
    /// # Errors
    /// [`ProducerError::ItemTooLong`] (the item is refused, the appender stays usable);
    /// [`ProducerError::Finished`]; [`ProducerError::AppenderFailed`] after an earlier
    /// error; stamping a full batch: ID errors ([`ProducerError::Ids`], ...) and write
    /// errors ([`ProducerError::Shard`]). After any error but the first two the appender
    /// refuses everything: open the shard again and append from its
    /// [`Appender::resume_at`].
    pub async fn append(&mut self, item: &[u8]) -> Result<u64, ProducerError> {
        self.usable()?;
        self.check_len(self.next_seq, item.len())?;
        self.publish_if_due().await?;
        let seq = self.push(item.to_vec());
        if self.buffer_full() {
            self.stamp_buffer().await?;
        }
        Ok(seq)
    }

    /// Appends `items` in order; returns their numbers. Their lengths are checked first:
    /// if one is too long, none is appended.
    ///
    /// # Errors
    /// As [`Appender::append`].
    pub async fn append_batch<I, T>(&mut self, items: I) -> Result<Range<u64>, ProducerError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        self.usable()?;
        let items: Vec<T> = items.into_iter().collect();
        for (i, item) in items.iter().enumerate() {
            self.check_len(self.next_seq + i as u64, item.as_ref().len())?;
        }
        self.publish_if_due().await?;
        let first = self.next_seq;
        for item in items {
            self.push(item.as_ref().to_vec());
            if self.buffer_full() {
                self.stamp_buffer().await?;
            }
        }
        Ok(first..self.next_seq)
    }

    /// Makes every item appended so far durable (stamps what is buffered, waits for the
    /// writes); returns the count of durable items, equal to [`Appender::next_seq`].
    ///
    /// # Errors
    /// As [`Appender::append`], but for the item checks.
    pub async fn flush(&mut self) -> Result<u64, ProducerError> {
        if self.finished {
            return Ok(self.durable());
        }
        self.usable()?;
        if !self.buffer.is_empty() {
            self.stamp_buffer().await?;
        }
        let waited = self.stamper.finish_pending().await;
        self.note(waited)?;
        debug_assert_eq!(self.stamper.durable, self.next_seq);
        self.publish_if_due().await?;
        Ok(self.stamper.durable)
    }

    /// Publishes now ([`AppendConfig::publish`]): makes everything appended so far durable
    /// ([`Appender::flush`]), then writes it as a segment and replaces the checkpoint,
    /// whose claim moves up even if nothing was appended since the last one (it then costs
    /// one ID). On a finished sublist, finishes the publication if it is not. Without
    /// publishing it only flushes. Returns the items published.
    ///
    /// # Errors
    /// As [`Appender::flush`]; the destination failing ([`ProducerError::Publish`]); the
    /// ID for the claim ([`ProducerError::Ids`]). After an error the appender refuses
    /// everything, as after a failed append.
    pub async fn publish(&mut self) -> Result<u64, ProducerError> {
        let finished = self.finished;
        if !finished {
            self.flush().await?;
        }
        self.usable_for_publication()?;
        let published = self.stamper.publish(&self.source, finished).await;
        self.note(published)?;
        Ok(self.published().map_or(0, |(count, _)| count))
    }

    /// Flushes, then marks the sublist finished: it takes no more items and can be sealed.
    /// Publishing, it then publishes the rest and a finished checkpoint (claim `u64::MAX`;
    /// also on a sublist an earlier run finished but was killed before that). On a
    /// finished sublist it stamps nothing (the summary says `already_finished`).
    ///
    /// # Errors
    /// As [`Appender::flush`].
    pub async fn finish(&mut self) -> Result<Summary, ProducerError> {
        if !self.finished {
            self.flush().await?;
            let done = self.stamper.write_finished();
            self.note(done)?;
            self.finished = true;
        }
        self.usable_for_publication()?;
        let published = self.stamper.publish(&self.source, true).await;
        self.note(published)?;
        let mut summary = self.stamper.summary(self.opened)?;
        summary.already_finished = self.finished_at_open;
        Ok(summary)
    }

    /// Seals the finished sublist into the run `dest/shard-<n>.bin`: `dest` is a local
    /// directory that exists or `s3://bucket/prefix` (credentials from the `AWS_*`
    /// variables, as for `producer --seal-to`). Deterministic and atomic, so sealing again
    /// (after a crash, say) is harmless. Runs on tokio's blocking pool.
    ///
    /// # Errors
    /// [`ProducerError::Seal`]: the sublist is not finished, `dest` is not a destination,
    /// or the run cannot be written there.
    pub async fn seal_to(&self, dest: &str) -> Result<SealSummary, ProducerError> {
        let path = self.stamper.path.clone();
        let location = Location::parse(dest).map_err(|error| SealError::Store {
            path: path.clone(),
            error: Box::new(error),
        })?;
        let (data_dir, shard) = (self.data_dir.clone(), self.stamper.shard);
        let sealed = tokio::task::spawn_blocking(move || {
            let store = Store::new(StoreOptions::default());
            seal(&data_dir, shard, &store, &location, &mut |_, _| {})
        })
        .await
        .map_err(|e| ProducerError::Task(e.to_string()))?;
        Ok(sealed?)
    }

    /// Publishes if publishing and its interval has passed (between two batches: no ID
    /// request is in flight).
    async fn publish_if_due(&mut self) -> Result<(), ProducerError> {
        if self.stamper.publish_due() {
            let published = self.stamper.publish(&self.source, false).await;
            self.note(published)?;
        }
        Ok(())
    }

    /// Refuses a publication after an error.
    fn usable_for_publication(&self) -> Result<(), ProducerError> {
        match &self.failed {
            Some(reason) => Err(ProducerError::AppenderFailed {
                path: self.stamper.path.clone(),
                durable: self.stamper.durable,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses calls on a finished sublist or after an error.
    fn usable(&self) -> Result<(), ProducerError> {
        if let Some(reason) = &self.failed {
            return Err(ProducerError::AppenderFailed {
                path: self.stamper.path.clone(),
                durable: self.stamper.durable,
                reason: reason.clone(),
            });
        }
        if self.finished {
            return Err(ProducerError::Finished {
                path: self.stamper.path.clone(),
                items: self.next_seq,
            });
        }
        Ok(())
    }

    fn check_len(&self, seq: u64, length: usize) -> Result<(), ProducerError> {
        if length > MAX_ITEM_BYTES {
            return Err(ProducerError::ItemTooLong {
                path: self.stamper.path.clone(),
                seq,
                length,
                limit: MAX_ITEM_BYTES,
            });
        }
        Ok(())
    }

    fn push(&mut self, item: Vec<u8>) -> u64 {
        self.buffer_bytes += item.len();
        self.buffer.push(item);
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    fn buffer_full(&self) -> bool {
        self.buffer.len() as u64 >= self.batch || self.buffer_bytes >= MAX_BATCH_BYTES
    }

    /// Stamps the buffer as one batch; its write runs on while the caller goes on.
    async fn stamp_buffer(&mut self) -> Result<(), ProducerError> {
        debug_assert!(!self.buffer.is_empty());
        let stamped = self
            .stamper
            .stamp_batch(&mut self.buffer, &self.source)
            .await;
        self.note(stamped)?;
        self.buffer_bytes = 0;
        Ok(())
    }

    /// Remembers the first error: what was appended but not durable may be lost with it.
    fn note<T>(&mut self, result: Result<T, ProducerError>) -> Result<T, ProducerError> {
        if let Err(e) = &result {
            self.failed.get_or_insert_with(|| e.to_string());
        }
        result
    }
}
