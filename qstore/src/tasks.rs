//! [`Tasks`]: the small tokio runtime S3 requests run on, started when first used and
//! shared by a [`Store`](crate::Store) and every object and upload it made, and waiting for
//! its tasks from any thread.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

use crate::error::StoreError;

/// The runtime for S3 requests: they wait on the network, not the CPU, and the machine
/// running the merge also merges; two workers keep the TLS and hashing work off the caller.
const RUNTIME_WORKERS: usize = 2;

/// The S3 runtime, started on first use. Cheap to clone (one `Arc`).
#[derive(Clone, Default)]
pub(crate) struct Tasks {
    runtime: Arc<OnceLock<Result<RuntimeGuard, String>>>,
}

/// Shuts the runtime down without waiting, so that a [`Store`](crate::Store) dropped inside another
/// runtime does not panic (a plain `Runtime` drop blocks, which tokio forbids there).
struct RuntimeGuard(Option<Runtime>);

impl Drop for RuntimeGuard {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Tasks {
    /// The S3 runtime, started on first use.
    fn runtime(&self) -> Result<&Handle, StoreError> {
        let rt = self.runtime.get_or_init(|| {
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

/// Waits for a task started with [`Tasks::spawn`], from any thread.
pub(crate) fn wait<T>(handle: JoinHandle<Result<T, StoreError>>) -> Result<T, StoreError> {
    futures::executor::block_on(handle).map_err(|e| StoreError::Config {
        message: format!("an S3 task ended abnormally: {e}"),
    })?
}
