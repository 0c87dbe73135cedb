//! [`Store`]: the entry point, one per process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use object_store::aws::AmazonS3;
use object_store::path::Path;

use crate::options::StoreOptions;
use crate::s3::{S3Config, S3Target};
use crate::tasks::Tasks;
use crate::{dir, Location, Object, StoreError, Upload};
use qformat::names::is_run_name;

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
    tasks: Tasks,
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
        let opts = opts.sane();
        Store {
            inner: Arc::new(Inner {
                opts,
                s3_config: Mutex::new(config),
                clients: Mutex::new(HashMap::new()),
                tasks: Tasks::new(opts.max_gets),
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
        self.list_named(loc, is_run_name)
    }

    /// Every file or object directly under `loc` (not recursive) whose name `keep`
    /// accepts, sorted by name ([`Store::list_runs`] keeps runs; a merge of published
    /// shards also keeps their checkpoints).
    ///
    /// # Errors
    /// As [`Store::list_runs`].
    pub fn list_named(
        &self,
        loc: &Location,
        keep: fn(&str) -> bool,
    ) -> Result<Vec<Location>, StoreError> {
        let mut found = match loc {
            Location::Dir(path) => dir::list_named(path, keep)?,
            Location::S3 { .. } => {
                let target = self.s3_target(loc)?;
                let metas = self.inner.tasks.run(async move { target.list().await })?;
                metas
                    .iter()
                    .filter_map(|m| m.location.filename())
                    .filter(|name| keep(name))
                    .map(|name| loc.join(name))
                    .collect()
            }
        };
        found.sort();
        Ok(found)
    }

    /// The names of the files or objects directly under `loc` (not recursive; names
    /// starting with '.' are skipped), sorted: whatever they are named, unlike
    /// [`Store::list_runs`]. A directory that does not exist holds none, like an S3
    /// prefix with nothing under it.
    ///
    /// # Errors
    /// I/O and S3 errors naming `loc`.
    pub fn list_names(&self, loc: &Location) -> Result<Vec<String>, StoreError> {
        let mut names = match loc {
            Location::Dir(path) => dir::list_names(path)?,
            Location::S3 { .. } => {
                let target = self.s3_target(loc)?;
                let metas = self.inner.tasks.run(async move { target.list().await })?;
                metas
                    .iter()
                    .filter_map(|m| m.location.filename())
                    .filter(|name| !name.starts_with('.'))
                    .map(str::to_string)
                    .collect()
            }
        };
        names.sort();
        Ok(names)
    }

    /// The whole of a small file or object (a checkpoint), in one read: refused, before
    /// its bytes are read, when it is larger than `max_bytes`.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if it does not exist; [`StoreError::TooLarge`]; I/O, S3
    /// and configuration errors.
    pub fn read_small(&self, loc: &Location, max_bytes: u64) -> Result<Vec<u8>, StoreError> {
        match loc {
            Location::Dir(path) => dir::read_small(path, max_bytes),
            Location::S3 { .. } => {
                let target = self.s3_object(loc)?;
                let body = self
                    .inner
                    .tasks
                    .run(async move { target.get_small(max_bytes).await })?;
                Ok(body.to_vec())
            }
        }
    }

    /// Removes a file or object; one that does not exist is no error. A directory's
    /// removal is made durable (the directory is fsynced).
    ///
    /// # Errors
    /// I/O, S3 and configuration errors.
    pub fn delete(&self, loc: &Location) -> Result<(), StoreError> {
        match loc {
            Location::Dir(path) => dir::delete(path),
            Location::S3 { .. } => {
                let target = self.s3_object(loc)?;
                self.inner.tasks.run(async move { target.delete().await })
            }
        }
    }

    /// Makes sure `loc` can hold files: a local directory is created with its missing
    /// parents, durably (each created directory and its parent fsynced); an S3 prefix
    /// needs nothing. Call it before [`Store::create`] of a name in a directory that may
    /// not exist yet (`segments/shard-<n>/...`).
    ///
    /// # Errors
    /// I/O errors naming the directory.
    pub fn make_dirs(&self, loc: &Location) -> Result<(), StoreError> {
        match loc {
            Location::Dir(path) => dir::make_dirs(path),
            Location::S3 { .. } => Ok(()),
        }
    }

    /// Opens one file or object for ranged reads: learns its size (and on S3 its ETag,
    /// which every later read must match) once.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if it does not exist; I/O, S3 and configuration errors.
    pub fn open(&self, loc: &Location) -> Result<Object, StoreError> {
        match loc {
            Location::Dir(path) => Object::open_file(&self.inner.tasks, self.inner.opts, loc, path),
            Location::S3 { .. } => {
                let target = self.s3_object(loc)?;
                let t = target.clone();
                let meta = self.inner.tasks.run(async move { t.head().await })?;
                let meta = meta.ok_or_else(|| StoreError::NotFound {
                    object: loc.to_string(),
                })?;
                Ok(Object::from_s3(
                    &self.inner.tasks,
                    self.inner.opts,
                    loc,
                    target,
                    meta.size,
                    meta.e_tag,
                ))
            }
        }
    }

    /// Starts an atomic write of `loc`: nothing is visible under `loc` until
    /// [`Upload::finish`] succeeds; dropping the upload without finishing removes it.
    /// An S3 object smaller than one part (a checkpoint) is written by one PUT.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if the directory does not exist; I/O and configuration
    /// errors (S3 requests start only once data is written).
    pub fn create(&self, loc: &Location) -> Result<Upload, StoreError> {
        match loc {
            Location::Dir(path) => Upload::create_file(path),
            Location::S3 { .. } => Ok(Upload::create_s3(
                &self.inner.tasks,
                self.inner.opts.part_size,
                self.s3_object(loc)?,
            )),
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
                Ok(self
                    .inner
                    .tasks
                    .run(async move { target.head().await })?
                    .is_some())
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
}
