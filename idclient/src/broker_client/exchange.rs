//! One request on one connection: send it, wait for its reply (or the connection's end,
//! or the deadline), and judge what the reply means for the caller.

use super::conn::{Conn, Reply, Shared};
use super::{IdError, IdRange, Inner};
use idproto::wire::{ClientMsg, ServerMsg};
use idproto::NodeFailure;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{timeout_at, Instant};

/// Part of the remaining time NOT passed to the broker as the request's deadline (at
/// most [`MAX_MARGIN`]), so the broker's typed answer ("no quorum") arrives before the
/// client's own timer fires.
const MARGIN_DIVISOR: u32 = 20;
const MAX_MARGIN: Duration = Duration::from_millis(100);

/// What one attempt on one connection came to.
pub(super) enum Attempt {
    Done(Result<IdRange, IdError>),
    /// Safe to send elsewhere: the connection broke, or the broker refused to start it.
    Failover(NodeFailure),
    /// The broker is not the leader and did not start the request: send it to `leader`
    /// (`None`: no leader known, an election is under way).
    Redirect {
        from: String,
        leader: Option<String>,
    },
}

impl Inner {
    /// Sends one request on `conn` and waits for its reply until `deadline`.
    pub(super) async fn attempt(&self, conn: &Conn, n: u64, deadline: Instant) -> Attempt {
        let id = self.next_request.fetch_add(1, Relaxed);
        match exchange(conn, id, n, deadline).await {
            Ok(reply) => judge(&conn.shared, n, reply),
            Err(attempt) => attempt,
        }
    }
}

/// The request's outcome is unknown but no ID of it was returned: send it elsewhere.
fn lost(shared: &Shared, reason: String) -> Attempt {
    Attempt::Failover(NodeFailure {
        addr: shared.addr.clone(),
        reason,
    })
}

/// The deadline sent to the broker when `remaining` is left: a little less (see
/// [`MARGIN_DIVISOR`]), and at least 1 ms (0 would mean the broker's default).
fn broker_deadline_ms(remaining: Duration) -> u64 {
    let margin = (remaining / MARGIN_DIVISOR).min(MAX_MARGIN);
    u64::try_from((remaining - margin).as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Sends request `id` for `n` IDs on `conn` and waits for its reply until `deadline`.
/// `Err` is the attempt's end without a reply (lost, or timed out).
async fn exchange(conn: &Conn, id: u64, n: u64, deadline: Instant) -> Result<ServerMsg, Attempt> {
    let shared = &conn.shared;
    let (tx, rx) = oneshot::channel();
    {
        let mut table = shared.table();
        if let Some(reason) = &table.broken {
            return Err(lost(shared, reason.clone()));
        }
        table.waiting.insert(id, tx);
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    let msg = ClientMsg::NextIds {
        id,
        count: n,
        deadline_ms: broker_deadline_ms(remaining),
    };
    let timed_out = || {
        // Removed first: a late reply finds no taker (its IDs are burned).
        shared.table().waiting.remove(&id);
        Attempt::Done(Err(IdError::BrokersUnavailable {
            failures: vec![NodeFailure {
                addr: shared.addr.clone(),
                reason: format!("no reply within the deadline ({remaining:?})"),
            }],
        }))
    };
    match timeout_at(deadline, conn.tx.send(msg)).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(_)) => {
            shared.table().waiting.remove(&id);
            return Err(lost(shared, "connection writer stopped".into()));
        }
        Ok(Ok(())) => {}
    }
    match timeout_at(deadline, rx).await {
        Err(_) => Err(timed_out()),
        Ok(Err(_)) => Err(lost(shared, "connection dropped the request".into())),
        Ok(Ok(Reply::Lost(reason))) => Err(lost(shared, reason)),
        Ok(Ok(Reply::Msg(msg))) => Ok(msg),
    }
}

/// What the broker's reply to a request for `n` IDs comes to.
fn judge(shared: &Shared, n: u64, reply: ServerMsg) -> Attempt {
    match reply {
        ServerMsg::Ids { lo, hi, .. } if (IdRange { lo, hi }).holds_exactly(n) => {
            Attempt::Done(Ok(IdRange { lo, hi }))
        }
        ServerMsg::Failed {
            error: IdError::BrokersUnavailable { failures },
            ..
        } => {
            // The broker is shutting down and never started this request.
            shared.draining.store(true, Relaxed);
            let reason = failures
                .first()
                .map_or_else(|| "broker unavailable".to_string(), |f| f.reason.clone());
            lost(shared, reason)
        }
        ServerMsg::Failed { error, .. } => Attempt::Done(Err(error)),
        ServerMsg::Redirect { leader, .. } => {
            // A follower: it started nothing for this request, and gets nothing new.
            shared.draining.store(true, Relaxed);
            Attempt::Redirect {
                from: shared.addr.clone(),
                leader,
            }
        }
        other => {
            let reason = format!("unexpected reply to a request for {n} IDs: {other:?}");
            shared.fail(reason.clone());
            Attempt::Done(Err(IdError::Protocol {
                addr: shared.addr.clone(),
                reason,
            }))
        }
    }
}
