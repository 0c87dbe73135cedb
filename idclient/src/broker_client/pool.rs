//! The client's connections: a few slots, callers spread over them; a broken or missing
//! connection is (re)opened on a pass over the brokers from the preferred one, with
//! backoff between passes, and meanwhile another slot's connection will do.

use super::conn::{open, open_failure, refused_token, Conn};
use super::failover::{note, note_cut, unavailable};
use super::{IdError, Inner};
use idproto::NodeFailure;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::{timeout_at, Instant};

/// A slot whose connection could not be opened while another slot's was usable is not
/// tried again before this long: meanwhile its callers use the connections there are
/// (a broker at its connection cap refuses the extra one), and no caller pays for a
/// doomed connect on every call.
const SLOT_RETRY: Duration = Duration::from_secs(1);

/// Pause after every broker refused a connection (jittered, doubling up to
/// [`MAX_RECONNECT_PAUSE`]), so a client does not spin while all brokers restart.
const RECONNECT_PAUSE_BASE: Duration = Duration::from_millis(10);
pub(super) const MAX_RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// One of the client's connections: callers are spread over the slots.
#[derive(Default)]
pub(super) struct Slot {
    /// Held while (re)connecting the slot: one caller connects, others wait or use
    /// another slot's connection.
    connecting: tokio::sync::Mutex<()>,
    /// Never held across an await.
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    conn: Option<Arc<Conn>>,
    /// Opening failed while another slot was usable: do not try before then.
    retry_at: Option<Instant>,
}

impl Slot {
    fn state(&self) -> MutexGuard<'_, SlotState> {
        // Plain field updates: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn usable(&self) -> Option<Arc<Conn>> {
        self.state()
            .conn
            .as_ref()
            .filter(|c| c.shared.usable())
            .cloned()
    }
}

impl Inner {
    /// A usable connection of any slot, starting after `slot`.
    fn any_usable(&self, slot: usize) -> Option<Arc<Conn>> {
        let n = self.slots.len();
        (1..=n).find_map(|k| self.slots[(slot + k) % n].usable())
    }

    /// A usable connection for a caller assigned `slot`: the slot's own, (re)connecting
    /// if needed (brokers tried from the preferred one on, with backoff after a full
    /// pass, until `deadline`). When the slot cannot be opened but another slot has a
    /// usable connection, that one is used: a client works with the connections it can
    /// get (e.g. when the broker is at its connection cap).
    pub(super) async fn conn(
        &self,
        slot: usize,
        deadline: Instant,
        failures: &mut Vec<NodeFailure>,
    ) -> Result<Arc<Conn>, IdError> {
        let this = &self.slots[slot];
        if let Some(conn) = this.usable() {
            return Ok(conn);
        }
        if this.state().retry_at.is_some_and(|t| Instant::now() < t) {
            if let Some(conn) = self.any_usable(slot) {
                return Ok(conn);
            }
        }
        let _connecting = match this.connecting.try_lock() {
            Ok(g) => g,
            Err(_) => {
                // Someone is connecting this slot: do not queue behind them if there
                // is another connection to use.
                if let Some(conn) = self.any_usable(slot) {
                    return Ok(conn);
                }
                match timeout_at(deadline, this.connecting.lock()).await {
                    Ok(g) => g,
                    Err(_) => return Err(unavailable(failures)),
                }
            }
        };
        if let Some(conn) = self.retire(this) {
            return Ok(conn);
        }
        self.reconnect(slot, deadline, failures).await
    }

    /// With the slot's connecting lock held: the connection someone else opened
    /// meanwhile, or `None` after dropping the slot's broken one (moving on from its
    /// broker unless it closed quietly, like at the broker's idle timeout).
    fn retire(&self, this: &Slot) -> Option<Arc<Conn>> {
        let old = {
            let mut state = this.state();
            if let Some(conn) = state.conn.as_ref().filter(|c| c.shared.usable()) {
                return Some(conn.clone());
            }
            state.conn.take()
        };
        if let Some(old) = old {
            if !old.shared.closed_quietly() {
                self.move_on_from(old.broker);
            }
        }
        None
    }

    /// Opens a connection for `slot`, pass after pass over the brokers with backoff
    /// between passes, until `deadline`; meanwhile another slot's usable connection
    /// will do (and the slot is retried at most every [`SLOT_RETRY`]).
    async fn reconnect(
        &self,
        slot: usize,
        deadline: Instant,
        failures: &mut Vec<NodeFailure>,
    ) -> Result<Arc<Conn>, IdError> {
        let this = &self.slots[slot];
        let mut passes = 0;
        loop {
            let all_refused_token = match self.open_any(deadline, failures).await {
                Ok(conn) => {
                    let mut state = this.state();
                    state.conn = Some(conn.clone());
                    state.retry_at = None;
                    return Ok(conn);
                }
                Err(all_refused_token) => all_refused_token,
            };
            if let Some(conn) = self.any_usable(slot) {
                this.state().retry_at = Some(Instant::now() + SLOT_RETRY);
                return Ok(conn);
            }
            // A wrong or missing token fails at once, as redis-cli with a wrong password
            // does, instead of retrying until the deadline.
            let now = Instant::now();
            if now >= deadline || all_refused_token {
                return Err(unavailable(failures));
            }
            let pause = self.reconnect_backoff.pause(RECONNECT_PAUSE_BASE, passes);
            tokio::time::sleep_until(deadline.min(now + pause)).await;
            passes += 1;
        }
    }

    /// One pass over the brokers from the preferred one: the first connection that
    /// completes its handshake (before `deadline`), noting each failure. `Err(true)`:
    /// every broker refused the client's token, which no retry will change.
    async fn open_any(
        &self,
        deadline: Instant,
        failures: &mut Vec<NodeFailure>,
    ) -> Result<Arc<Conn>, bool> {
        let order = self.pass_order();
        let n = order.len();
        let mut refused = 0;
        for b in order {
            let now = Instant::now();
            if now >= deadline {
                return Err(false);
            }
            let until = deadline.min(now + self.config.connect_timeout);
            let Some(addr) = self.addr_of(b) else {
                continue; // A learned entry is never removed: cannot happen.
            };
            let addr = &addr;
            let failure = |reason| NodeFailure {
                addr: addr.clone(),
                reason,
            };
            match timeout_at(until, open(b, addr, &self.config)).await {
                Ok(Ok(conn)) => {
                    self.preferred.store(b, Relaxed);
                    self.max_count.store(conn.max_count, Relaxed);
                    return Ok(Arc::new(conn));
                }
                Ok(Err(e)) => {
                    refused += usize::from(refused_token(&e));
                    note(failures, failure(open_failure(e)));
                }
                Err(_) if until == deadline => note_cut(
                    failures,
                    failure(format!("no handshake within {:?}", until - now)),
                ),
                Err(_) => note(
                    failures,
                    failure(format!("no handshake within {:?}", until - now)),
                ),
            }
        }
        Err(refused == n)
    }
}
