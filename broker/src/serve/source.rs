//! What the network side sees of the serving side, and all it sees besides the batch
//! queue: [`RoundSource`], which every way of serving IDs implements (a write round per
//! batch, confirmed windows, a leader's windows); [`Admit`], whether a request may be
//! started on this broker; and [`Leadership`], the election as RESP forwarding follows
//! it ([`Role`], [`Status`]).

use idclient::{IdError, IdRange, QuorumClient};
use idproto::wire::BrokerStats;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;

/// What the batcher needs from the quorum: one round for `n` IDs that gives up at
/// `deadline`. [`QuorumClient`] implements it; tests and simulations plug in fakes.
pub trait RoundSource: Send + Sync + 'static {
    /// Reserves `n` consecutive IDs in one round (retrying contention internally),
    /// giving up at `deadline`.
    ///
    /// # Errors
    /// As [`idclient::IdSource::next_ids`].
    fn next_ids_until(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send;

    /// Fills in the source's part of the counters: its role and, when it serves windows,
    /// the window counters. The default is a `--serve rounds` source.
    fn describe(&self, stats: &mut BrokerStats) {
        stats.role = "rounds".to_string();
    }

    /// Whether this broker may start a `NextIds` request now, or must answer it with a
    /// redirect to the leader and start nothing. Called once per request, which it may
    /// count. The default serves everything.
    fn admit(&self) -> Admit {
        Admit::Serve
    }

    /// The election this source serves under, if any: while it does not lead, RESP
    /// `QLIST.NEXT` requests are forwarded to the leader it names
    /// (`broker/src/net/forward.rs`). The default takes part in none.
    fn leadership(&self) -> Option<Arc<dyn Leadership>> {
        None
    }
}

impl RoundSource for QuorumClient {
    fn next_ids_until(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        QuorumClient::next_ids_until(self, n, deadline)
    }
}

/// Whether a `NextIds` request may be started on this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Serve it here.
    Serve,
    /// This broker does not lead: answer with a redirect to the leader it names (`None`:
    /// none is known now, an election is under way) and start nothing.
    Redirect(Option<String>),
}

/// A broker's part in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Follows a live leader's heartbeat; redirects binary clients, forwards RESP ones.
    Follower,
    /// Saw no leader's heartbeat change for the election timeout; claims the next term.
    Candidate,
    /// Won its term: refreshes the heartbeat and serves every request itself.
    Leader,
}

impl Role {
    /// As `BrokerStats::role` shows it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Leader => "leader",
        }
    }
}

/// Where the election stands, as this broker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// This broker's part in the election now.
    pub role: Role,
    /// The highest term seen (0: none yet).
    pub term: u64,
    /// The leader's advertised address, if one is known.
    pub leader: Option<String>,
}

/// What forwarding RESP requests to the leader needs of the election
/// ([`Election`](crate::serve::election::Election) implements it).
pub trait Leadership: Send + Sync {
    /// Where the election stands now.
    fn status(&self) -> Status;

    /// Sees every later change of [`Leadership::status`] (the current one is marked seen).
    fn subscribe(&self) -> watch::Receiver<Status>;

    /// This broker's own advertised address: never a leader to forward to while it does
    /// not lead.
    fn advertise(&self) -> &str;

    /// Whether a live leader's heartbeat names this broker's own address while it does
    /// not lead (a wrong `--advertise` on one of the two).
    fn own_address_named(&self) -> bool;

    /// Set once this broker resigned: until when a request waits for the next leader.
    fn handoff_until(&self) -> Option<Instant>;
}
