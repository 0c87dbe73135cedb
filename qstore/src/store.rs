//! [`Store`]: the entry point, one per process; [`StoreOptions`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use object_store::aws::AmazonS3;
use object_store::path::Path;
use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

use crate::location::is_run_name;
use crate::s3::{S3Config, S3Target};
use crate::{dir, Location, Object, StoreError, Upload};

/// How long one operation (a read, a part, a listing) may take, retries included: long
/// enough to ride out an S3 server restart or a throttling burst, short enough that a dead
/// endpoint is reported within a minute.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);
/// Bytes per ranged GET: large enough that per-request latency (~10-50 ms on S3) is a
/// small part of the transfer time, small enough to keep per-run read-ahead memory low.
pub const DEFAULT_READ_CHUNK: usize = 4 << 20;
/// Ranged GETs in flight per reader: one being consumed while the next arrives.
pub const DEFAULT_IN_FLIGHT: usize = 2;
/// Multipart part size: S3 allows at most 10,000 parts, so 8 MiB parts allow 78 GiB runs.
pub const DEFAULT_PART_SIZE: usize = 8 << 20;
/// S3 rejects parts smaller than 5 MiB (except the last) when the upload is completed.
pub const S3_MIN_PART_SIZE: usize = 5 << 20;
/// S3's largest part.
pub const S3_MAX_PART_SIZE: usize = 5 << 30;
/// The runtime for S3 requests: they wait on the network, not the CPU, and the machine
/// running the merge also merges; two workers keep the TLS and hashing work off the caller.
const RUNTIME_WORKERS: usize = 2;

/// Limits and timeouts of a [`Store`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Total time for one operation, retries with backoff included.
    pub deadline: Duration,
    /// Bytes per ranged GET in [`Object::read_ranges`] (and per local read).
    pub read_chunk: usize,
    /// Ranged GETs in flight per [`crate::RangeReader`].
    pub in_flight: usize,
    /// Multipart part size of S3 uploads (kept within S3's 5 MiB..5 GiB).
    pub part_size: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            deadline: DEFAULT_DEADLINE,
            read_chunk: DEFAULT_READ_CHUNK,
            in_flight: DEFAULT_IN_FLIGHT,
            part_size: DEFAULT_PART_SIZE,
        }
    }
}

impl StoreOptions {
    /// The same with every value within what works: no zero sizes, parts S3 accepts.
    fn sane(self) -> StoreOptions {
        StoreOptions {
            deadline: self.deadline.max(Duration::from_millis(1)),
            read_chunk: self.read_chunk.max(1),
            in_flight: self.in_flight.max(1),
            part_size: self.part_size.clamp(S3_MIN_PART_SIZE, S3_MAX_PART_SIZE),
        }
    }
}

/// Reads and writes runs at [`Location`]s. Cheap to clone (one `Arc`); one per process.
///
/// S3 requests run on a small tokio runtime the store owns, created when an `s3://`
/// location is first used. Every method is synchronous and may be called from any thread,
/// including one inside another tokio runtime (it then blocks that thread).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    opts: StoreOptions,
    /// Given, or read from the environment when S3 is first used.
    s3_config: Mutex<Option<S3Config>>,
    /// One client per bucket: each keeps its own connection pool.
    clients: Mutex<HashMap<String, Arc<AmazonS3>>>,
    runtime: OnceLock<Result<RuntimeGuard, String>>,
}

/// Shuts the runtime down without waiting, so that a [`Store`] dropped inside another
/// runtime does not panic (a plain `Runtime` drop blocks, which tokio forbids there).
struct RuntimeGuard(Option<Runtime>);

impl Drop for RuntimeGuard {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("opts", &self.inner.opts)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store; S3 settings are read from the environment when an `s3://` location is
    /// first used (see [`S3Config::from_env`]).
    pub fn new(opts: StoreOptions) -> Store {
        Store::build(opts, None)
    }

    /// A store that reaches S3 with `config` instead of the environment.
    pub fn with_s3_config(opts: StoreOptions, config: S3Config) -> Store {
        Store::build(opts, Some(config))
    }

    fn build(opts: StoreOptions, config: Option<S3Config>) -> Store {
        Store {
            inner: Arc::new(Inner {
                opts: opts.sane(),
                s3_config: Mutex::new(config),
                clients: Mutex::new(HashMap::new()),
                runtime: OnceLock::new(),
            }),
        }
    }

    /// The options in force (after bringing them within limits).
    pub fn options(&self) -> StoreOptions {
        self.inner.opts
    }

    /// Every `*.bin` file or object directly under `loc` (not recursive; names starting
    /// with '.' are skipped: temporary files live there), sorted by name.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for a missing directory (an empty one, or an S3 prefix with
    /// nothing under it, gives `Ok(vec![])`); I/O and S3 errors naming `loc`.
    pub fn list_runs(&self, loc: &Location) -> Result<Vec<Location>, StoreError> {
        let mut runs = match loc {
            Location::Dir(path) => dir::list_runs(path)?,
            Location::S3 { .. } => {
                let target = self.s3_target(loc)?;
                let metas = self.run(async move { target.list().await })?;
                metas
                    .iter()
                    .filter_map(|m| m.location.filename())
                    .filter(|name| is_run_name(name))
                    .map(|name| loc.join(name))
                    .collect()
            }
        };
        runs.sort();
        Ok(runs)
    }

    /// Opens one file or object for ranged reads: learns its size (and on S3 its ETag,
    /// which every later read must match) once.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if it does not exist; I/O, S3 and configuration errors.
    pub fn open(&self, loc: &Location) -> Result<Object, StoreError> {
        match loc {
            Location::Dir(path) => Object::open_file(self, loc, path),
            Location::S3 { .. } => {
                let target = self.s3_object(loc)?;
                let t = target.clone();
                let meta = self.run(async move { t.head().await })?;
                let meta = meta.ok_or_else(|| StoreError::NotFound {
                    object: loc.to_string(),
                })?;
                Ok(Object::from_s3(self, loc, target, meta.size, meta.e_tag))
            }
        }
    }

    /// Starts an atomic write of `loc`: nothing is visible under `loc` until
    /// [`Upload::finish`] succeeds; dropping the upload without finishing removes it.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if the directory does not exist; I/O and configuration
    /// errors (S3 requests start only once data is written).
    pub fn create(&self, loc: &Location) -> Result<Upload, StoreError> {
        match loc {
            Location::Dir(path) => Upload::create_file(path),
            Location::S3 { .. } => Ok(Upload::create_s3(self, self.s3_object(loc)?)),
        }
    }

    /// Whether `loc` exists (a stat or a HEAD).
    ///
    /// # Errors
    /// I/O, S3 and configuration errors other than "not found".
    pub fn exists(&self, loc: &Location) -> Result<bool, StoreError> {
        match loc {
            Location::Dir(path) => match std::fs::metadata(path) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(StoreError::io(loc, "stat", e)),
            },
            Location::S3 { .. } => {
                let target = self.s3_object(loc)?;
                Ok(self.run(async move { target.head().await })?.is_some())
            }
        }
    }

    /// The client and key for an S3 location (the client is built on first use).
    pub(crate) fn s3_target(&self, loc: &Location) -> Result<S3Target, StoreError> {
        let Location::S3 { bucket, prefix } = loc else {
            unreachable!("s3_target called with a local path: {loc}");
        };
        let key = Path::parse(prefix).map_err(|e| StoreError::BadLocation {
            input: loc.to_string(),
            reason: e.to_string(),
        })?;
        Ok(S3Target {
            client: self.client(bucket)?,
            key,
            name: loc.to_string().into(),
            deadline: self.inner.opts.deadline,
        })
    }

    /// [`Store::s3_target`] for one object: the key must not be empty.
    fn s3_object(&self, loc: &Location) -> Result<S3Target, StoreError> {
        if loc.name().is_empty() {
            return Err(StoreError::BadLocation {
                input: loc.to_string(),
                reason: "names a bucket, not an object in it".to_string(),
            });
        }
        self.s3_target(loc)
    }

    fn client(&self, bucket: &str) -> Result<Arc<AmazonS3>, StoreError> {
        let mut clients = self.inner.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(bucket) {
            return Ok(Arc::clone(c));
        }
        let mut config = self
            .inner
            .s3_config
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if config.is_none() {
            *config = Some(S3Config::from_env()?);
        }
        let client = Arc::new(
            config
                .as_ref()
                .expect("set above")
                .client(bucket, &self.inner.opts)?,
        );
        clients.insert(bucket.to_string(), Arc::clone(&client));
        Ok(client)
    }

    /// The S3 runtime, started on first use.
    fn runtime(&self) -> Result<&Handle, StoreError> {
        let rt = self.inner.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(RUNTIME_WORKERS)
                .thread_name("qstore-s3")
                .enable_all()
                .build()
                .map(|rt| RuntimeGuard(Some(rt)))
                .map_err(|e| e.to_string())
        });
        match rt {
            Ok(RuntimeGuard(Some(rt))) => Ok(rt.handle()),
            Ok(RuntimeGuard(None)) => unreachable!("the runtime is taken only on drop"),
            Err(e) => Err(StoreError::Config {
                message: format!("cannot start the S3 runtime: {e}"),
            }),
        }
    }

    /// Starts `fut` on the S3 runtime.
    pub(crate) fn spawn<T, F>(
        &self,
        fut: F,
    ) -> Result<JoinHandle<Result<T, StoreError>>, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        Ok(self.runtime()?.spawn(fut))
    }

    /// Runs `fut` on the S3 runtime and waits for it: never `Runtime::block_on`, so any
    /// thread may call it.
    pub(crate) fn run<T, F>(&self, fut: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        wait(self.spawn(fut)?)
    }
}

/// Waits for a task started with [`Store::spawn`], from any thread.
pub(crate) fn wait<T>(handle: JoinHandle<Result<T, StoreError>>) -> Result<T, StoreError> {
    futures::executor::block_on(handle).map_err(|e| StoreError::Config {
        message: format!("an S3 task ended abnormally: {e}"),
    })?
}
