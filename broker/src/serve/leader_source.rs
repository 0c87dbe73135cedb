//! [`LeaderSource`]: a window-serving source that serves only while this broker leads
//! the election ([`crate::serve::election`]); otherwise each request is redirected to the
//! leader. Safety never depends on who leads: windows stay safe with two leaders.

use crate::serve::election::{self, Election, ElectionConfig, ElectionQuorum};
use crate::serve::rules::RULES;
use crate::serve::source::{Admit, Leadership, Role, RoundSource};
use crate::serve::window::{WindowQuorum, WindowSource};
use futures::future::{BoxFuture, FutureExt};
use idclient::{IdError, IdRange};
use idproto::wire::BrokerStats;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A window-serving source that serves only while it leads: the [`WindowSource`] plus
/// the election task (aborted when this is dropped).
pub struct LeaderSource<Q> {
    window: Arc<WindowSource<Q>>,
    election: Arc<Election>,
    task: JoinHandle<()>,
    /// Deletes the heartbeat of a term, within a time (the quorum's
    /// [`ElectionQuorum::resign`]).
    resign: Box<dyn Fn(u64, Duration) -> BoxFuture<'static, ()> + Send + Sync>,
    /// Starts an election task that only watches, from a term on (see
    /// [`LeaderSource::resign`]).
    watch_only: Box<dyn Fn(u64) -> JoinHandle<()> + Send + Sync>,
    /// That task, once resigned (aborted when this is dropped).
    watcher: Mutex<Option<JoinHandle<()>>>,
    heartbeat: Duration,
    /// How long a resigned broker's RESP requests wait for the next leader.
    handoff: Duration,
}

impl<Q: WindowQuorum> LeaderSource<Q> {
    /// Serves from `window` while elected through `quorum`; starts the election task.
    ///
    /// # Errors
    /// A configuration that [`ElectionConfig::validate`] refuses.
    pub fn start<E: ElectionQuorum>(
        window: Arc<WindowSource<Q>>,
        quorum: Arc<E>,
        config: ElectionConfig,
    ) -> Result<LeaderSource<Q>, String> {
        config.validate()?;
        let election = Arc::new(Election::new(config.advertise.clone()));
        let heartbeat = config.heartbeat;
        let handoff = config.election_timeout * 4;
        let resign = {
            let quorum = quorum.clone();
            Box::new(move |term, within| {
                let quorum = quorum.clone();
                async move { quorum.resign(term, Instant::now() + within).await }.boxed()
            })
        };
        let watch_only = {
            let (quorum, config, election) = (quorum.clone(), config.clone(), election.clone());
            Box::new(move |term| {
                election::spawn_watcher(quorum.clone(), config.clone(), election.clone(), term)
            })
        };
        let task = election::spawn(quorum, config, election.clone(), window.died());
        Ok(LeaderSource {
            window,
            election,
            task,
            resign,
            watch_only,
            watcher: Mutex::new(None),
            heartbeat,
            handoff,
        })
    }

    /// Leaves the election for good (a graceful shutdown): stops the election task and,
    /// if leading, deletes its heartbeat so the followers stand at once instead of after
    /// their timeout. Batches already queued are still served (safety never depends on
    /// who leads); new requests are redirected.
    ///
    /// Handoff: from then on an election task that only WATCHES (never stands) learns the
    /// next leader, so RESP requests this broker took meanwhile are forwarded to it
    /// (within four election timeouts; after that they are answered "no leader known" at
    /// once) instead of waiting out their deadline for a leader nobody would name.
    pub async fn resign(&self) {
        self.task.abort();
        let s = self.election.status();
        self.election.hand_off_until(Instant::now() + self.handoff);
        self.election.set(Role::Follower, s.term, None);
        if s.role == Role::Leader {
            tracing::info!(term = s.term, "resigning the lead");
            (self.resign)(s.term, self.heartbeat * 2).await;
        }
        let watcher = (self.watch_only)(s.term);
        let old = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(watcher);
        if let Some(old) = old {
            old.abort();
        }
    }

    /// The window this source serves from.
    pub fn window(&self) -> &Arc<WindowSource<Q>> {
        &self.window
    }

    /// The election's state.
    pub fn election(&self) -> &Arc<Election> {
        &self.election
    }
}

impl<Q> Drop for LeaderSource<Q> {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(w) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.abort();
        }
    }
}

impl<Q: WindowQuorum> RoundSource for LeaderSource<Q> {
    fn next_ids_until(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        // A batch queued while leading is served even if the broker stepped down since:
        // windows are safe with any number of leaders.
        self.window.next_ids_until(n, deadline)
    }

    fn describe(&self, stats: &mut BrokerStats) {
        self.window.describe(stats);
        let s = self.election.status();
        stats.role = s.role.name().to_string();
        stats.term = s.term;
        stats.leader = s.leader;
        stats.redirects = self.election.redirects();
    }

    /// Not the leader: a redirect to the leader it knows (counted), nothing started.
    fn admit(&self) -> Admit {
        if RULES.admits(self.election.leading()) {
            return Admit::Serve;
        }
        Admit::Redirect(self.election.redirect())
    }

    fn leadership(&self) -> Option<Arc<dyn Leadership>> {
        Some(self.election.clone())
    }
}
