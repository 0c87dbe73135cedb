//! The batch queue between the connections and the batcher: what a connection queues
//! ([`IdRequest`]) and what comes back to its writer ([`Outgoing`]). With the source's
//! trait ([`crate::serve::source`]), all the network side sees of the serving side.

use crate::stats::Stats;
use idclient::{IdError, IdRange};
use idproto::wire::ServerMsg;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;

/// A reply on its way to a connection's writer. The permit is the connection's
/// in-flight slot: it is released only once the reply has been written, so a client
/// that does not read cannot make the broker queue more than its in-flight cap.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub msg: ServerMsg,
    pub permit: Option<OwnedSemaphorePermit>,
}

/// One `NextIds` request waiting for a round.
#[derive(Debug)]
pub(crate) struct IdRequest {
    pub id: u64,
    pub count: u64,
    pub deadline: Instant,
    /// The deadline as the client asked for it, for the error message.
    pub requested: Duration,
    pub reply: mpsc::Sender<Outgoing>,
    pub permit: Option<OwnedSemaphorePermit>,
}

impl IdRequest {
    pub(crate) fn answer(self, result: Result<IdRange, IdError>, stats: &Stats) {
        let msg = match result {
            Ok(range) => {
                stats.requests_ok.fetch_add(1, Relaxed);
                stats.ids.fetch_add(range.len(), Relaxed);
                ServerMsg::ids(self.id, range)
            }
            Err(error) => {
                stats.requests_failed.fetch_add(1, Relaxed);
                ServerMsg::Failed { id: self.id, error }
            }
        };
        // The channel has room for every permit holder, so only a closed connection
        // makes this fail: then nobody is left to tell.
        if let Err(e) = self.reply.try_send(Outgoing {
            msg,
            permit: self.permit,
        }) {
            let full = matches!(e, mpsc::error::TrySendError::Full(_));
            debug_assert!(!full, "reply {} dropped: connection queue full", self.id);
            if full {
                tracing::warn!(
                    id = self.id,
                    "reply dropped: connection queue full (a bug: permits should prevent this)"
                );
            }
        }
    }

    pub(crate) fn expired(self, stats: &Stats) {
        let deadline = self.requested;
        self.answer(
            Err(IdError::Deadline {
                deadline,
                rounds: 0,
            }),
            stats,
        );
    }
}
