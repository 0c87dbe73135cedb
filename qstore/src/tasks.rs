//! [`Tasks`]: the small tokio runtime S3 requests run on, started when first used and
//! shared by a [`Store`](crate::Store) and every object and upload it made, and waiting for
//! its tasks from any thread.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::error::StoreError;

/// The runtime for S3 requests: they wait on the network, not the CPU, and the machine
/// running the merge also merges; two workers keep the TLS and hashing work off the caller.
const RUNTIME_WORKERS: usize = 2;

/// The S3 runtime, started on first use, and the turns of its ranged GETs. Cheap to
/// clone (two `Arc`s).
#[derive(Clone)]
pub(crate) struct Tasks {
    runtime: Arc<OnceLock<Result<RuntimeGuard, String>>>,
    /// One permit per ranged GET in flight ([`crate::StoreOptions::max_gets`]).
    gets: Arc<Semaphore>,
    /// The buffers reads go into, used again.
    buffers: ReadBuffers,
}

/// Buffers for reads, local and S3 alike: a read goes into one taken from here, is handed
/// out as [`Bytes`], and the buffer comes back when every slice of it is dropped, whichever
/// thread drops it last; one still held is never written again. Without it every read was
/// a fresh allocation whose pages glibc had given back to the kernel: faulting and zeroing
/// them cost a merge of local runs a twentieth of its time, and was half of the receiving
/// threads' CPU in a 64-run merge from S3 (BENCHMARKS.md, "The merge at the machine's
/// limit"). At most `keep` buffers wait here unused; the rest are freed.
#[derive(Clone)]
pub(crate) struct ReadBuffers {
    free: Arc<Mutex<Vec<Vec<u8>>>>,
    keep: usize,
}

impl ReadBuffers {
    fn new(keep: usize) -> ReadBuffers {
        ReadBuffers {
            free: Arc::default(),
            keep,
        }
    }

    /// A buffer read into before if one is free (its length and bytes as they were, so a
    /// local read of the same size zeroes nothing), else an empty one.
    pub(crate) fn take(&self) -> Vec<u8> {
        self.free
            .lock()
            .ok()
            .and_then(|mut free| free.pop())
            .unwrap_or_default()
    }

    /// `read` as [`Bytes`] that give the buffer back when the last slice is dropped.
    pub(crate) fn hand_out(&self, read: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            read,
            buffers: self.clone(),
        })
    }
}

/// A read out of [`ReadBuffers`]; dropped, its buffer goes back.
struct Pooled {
    read: Vec<u8>,
    buffers: ReadBuffers,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.read
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let read = std::mem::take(&mut self.read);
        if let Ok(mut free) = self.buffers.free.lock() {
            if free.len() < self.buffers.keep {
                free.push(read);
            }
        }
    }
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
    /// Tasks whose ranged GETs take turns, `max_gets` at once (at least one).
    pub(crate) fn new(max_gets: usize) -> Tasks {
        let max_gets = max_gets.clamp(1, Semaphore::MAX_PERMITS);
        Tasks {
            runtime: Arc::default(),
            gets: Arc::new(Semaphore::new(max_gets)),
            // As many as GETs in flight: a merge gives one back about as often as it
            // reads, so few wait here at once.
            buffers: ReadBuffers::new(max_gets),
        }
    }

    /// The buffers reads go into.
    pub(crate) fn read_buffers(&self) -> ReadBuffers {
        self.buffers.clone()
    }

    /// Waits for a ranged GET's turn: first come, first served, so the reads a merge
    /// needs first are sent first. The turn ends when the permit is dropped.
    pub(crate) async fn get_turn(gets: Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        // The semaphore is never closed; were it, the GET would go without a turn.
        gets.acquire_owned().await.ok()
    }

    /// The turns of ranged GETs, to move into a task.
    pub(crate) fn gets(&self) -> Arc<Semaphore> {
        Arc::clone(&self.gets)
    }

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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn gets_take_turns_max_gets_at_once() {
        let tasks = Tasks::new(3);
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let handles: Vec<_> = (0..12)
            .map(|_| {
                let (gets, now, most) = (tasks.gets(), now.clone(), most.clone());
                tasks
                    .spawn(async move {
                        let _turn = Tasks::get_turn(gets).await;
                        let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(at_once, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .unwrap()
            })
            .collect();
        for h in handles {
            wait(h).unwrap();
        }
        // Twelve tasks that each hold a turn across a sleep, on two workers: without the
        // turns all twelve would be in at once.
        assert_eq!(most.load(Ordering::SeqCst), 3);
    }
}
