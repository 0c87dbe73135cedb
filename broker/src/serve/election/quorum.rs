//! What the election needs from the quorum ([`ElectionQuorum`]), and the real one
//! ([`QuorumElection`]): the term register `<key>:term` and the heartbeat `<key>:leader`
//! on the quorum's own nodes.

use crate::serve::rules::Rules;
use idclient::{
    ClientConfig, Combine, Heartbeat, HeartbeatAuth, HeartbeatNode, IdError, Node, QuorumClient,
    Refresh, Register, Token,
};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// What the election needs from the quorum. [`QuorumElection`] is the real one; the unit
/// tests plug in a fake.
pub trait ElectionQuorum: Send + Sync + 'static {
    /// The highest term on a majority (reads started after this call).
    fn read_term(&self, deadline: Instant) -> impl Future<Output = Result<u64, IdError>> + Send;

    /// "If term < `term` then term = `term`" on every node: `Ok(true)` when a majority
    /// accepted, which makes the caller leader of `term`.
    fn claim_term(
        &self,
        term: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<bool, IdError>> + Send;

    /// Refreshes `hb` on every node (see [`idclient::refresh_heartbeat`]).
    fn refresh(
        &self,
        hb: Heartbeat,
        ttl: Duration,
        deadline: Instant,
    ) -> impl Future<Output = Refresh> + Send;

    /// What a majority of nodes hold as heartbeat (see [`idclient::read_heartbeats`]).
    fn read_heartbeats(
        &self,
        deadline: Instant,
    ) -> impl Future<Output = Result<Vec<Option<Heartbeat>>, IdError>> + Send;

    /// Deletes the heartbeat of `term` wherever it is (see [`idclient::resign_heartbeat`]).
    fn resign(&self, term: u64, deadline: Instant) -> impl Future<Output = ()> + Send;

    /// How many nodes make a majority.
    fn majority(&self) -> usize;

    /// The brokers' heartbeat key, when they share a token: heartbeats are signed with
    /// it, and only those it verifies are trusted. `None`: every heartbeat is trusted.
    fn auth(&self) -> Option<&HeartbeatAuth> {
        None
    }

    /// The term register's key, for messages.
    fn term_register(&self) -> String {
        "<key>:term".to_string()
    }
}

/// The election over the quorum's nodes: a [`QuorumClient`] on the term register
/// `<key>:term` (its own connections, so election traffic never queues behind ID rounds),
/// whose nodes also carry the heartbeat `<key>:leader`.
///
/// Generic over the node type like [`QuorumClient`], so the deterministic simulation
/// (`idtools/tests/sim/election.rs`) runs this very code over simulated nodes; production
/// uses the default, [`Node`] (Redis).
pub struct QuorumElection<N: Register = Node> {
    terms: QuorumClient<N>,
    heartbeat_key: String,
    /// Set by [`QuorumElection::with_token`].
    auth: Option<HeartbeatAuth>,
}

impl QuorumElection<Node> {
    /// Connects to the quorum `config` describes (its `key` is the ID register; the
    /// election uses `<key>:term` and `<key>:leader` beside it).
    ///
    /// # Errors
    /// As [`QuorumClient::connect`].
    pub async fn connect(config: &ClientConfig) -> Result<QuorumElection, IdError> {
        let mut terms = config.clone();
        terms.key = Self::term_key(&config.key);
        // One candidate per broker, one write per election: nothing to combine.
        terms.combine = Combine::Never;
        let terms = QuorumClient::connect(terms).await?;
        Ok(QuorumElection::over(terms, &config.key))
    }
}

impl<N: Register> QuorumElection<N> {
    /// The term register's key beside the ID register `key`.
    pub fn term_key(key: &str) -> String {
        format!("{key}:term")
    }

    /// The election of the ID register `key`'s brokers over `terms`, a client of the term
    /// register ([`QuorumElection::term_key`]`(key)`, which it must use, combining
    /// never), whose nodes carry the heartbeat `<key>:leader`.
    pub fn over(terms: QuorumClient<N>, key: &str) -> QuorumElection<N> {
        QuorumElection {
            terms,
            heartbeat_key: format!("{key}:leader"),
            auth: None,
        }
    }

    /// Signs heartbeats, and trusts only signed ones, with a key derived from `token`
    /// (the brokers' `--auth-token-file`): a forged heartbeat then deposes no leader and
    /// names no address a broker sends its token to. `None`: unauthenticated, as
    /// without a token every heartbeat is trusted.
    pub fn with_token(mut self, token: Option<&Token>) -> QuorumElection<N> {
        self.auth = token.map(|t| HeartbeatAuth::new(t, &self.heartbeat_key));
        self
    }

    fn nodes(&self) -> &[N] {
        self.terms.nodes()
    }
}

impl<N: HeartbeatNode + 'static> ElectionQuorum for QuorumElection<N> {
    fn read_term(&self, deadline: Instant) -> impl Future<Output = Result<u64, IdError>> + Send {
        self.terms.read_max(deadline)
    }

    async fn claim_term(&self, term: u64, deadline: Instant) -> Result<bool, IdError> {
        self.terms.reserve(term, term, deadline).await
    }

    async fn refresh(&self, hb: Heartbeat, ttl: Duration, deadline: Instant) -> Refresh {
        let (nodes, key) = (self.nodes(), &self.heartbeat_key);
        match &self.auth {
            Some(auth) => {
                let trust = |hb: &Heartbeat| auth.verify(hb);
                idclient::refresh_heartbeat_trusting(nodes, key, &hb, ttl, deadline, &trust).await
            }
            None => idclient::refresh_heartbeat(nodes, key, &hb, ttl, deadline).await,
        }
    }

    fn read_heartbeats(
        &self,
        deadline: Instant,
    ) -> impl Future<Output = Result<Vec<Option<Heartbeat>>, IdError>> + Send {
        idclient::read_heartbeats(self.nodes(), &self.heartbeat_key, deadline)
    }

    async fn resign(&self, term: u64, deadline: Instant) {
        idclient::resign_heartbeat(self.nodes(), &self.heartbeat_key, term, deadline).await;
    }

    fn majority(&self) -> usize {
        Rules::majority(self.nodes().len())
    }

    fn auth(&self) -> Option<&HeartbeatAuth> {
        self.auth.as_ref()
    }

    fn term_register(&self) -> String {
        Self::term_key(self.heartbeat_key.trim_end_matches(":leader"))
    }
}
