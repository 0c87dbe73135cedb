//! The one backoff of the client: capped exponential with full jitter, seedable.
//!
//! Every retry loop of the crate (lost quorum rounds, broker failovers, reconnects) draws
//! its pauses here, so a simulation that seeds its clients replays exactly.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;
use std::time::Duration;

/// Pauses uniform in `[0, min(cap, base * 2^attempt)]` ("full jitter": concurrent losers
/// spread out instead of retrying in lockstep).
#[derive(Debug)]
pub struct Backoff {
    cap: Duration,
    /// `None`: the thread RNG. `Some`: a seeded RNG, for reproducible simulations.
    seeded: Option<Mutex<StdRng>>,
}

impl Backoff {
    /// A backoff that never pauses longer than `cap`, jittered by the thread RNG.
    pub fn new(cap: Duration) -> Backoff {
        Backoff { cap, seeded: None }
    }

    /// The same backoff drawing its jitter from an RNG seeded with `seed`.
    pub fn seeded(self, seed: u64) -> Backoff {
        Backoff {
            seeded: Some(Mutex::new(StdRng::seed_from_u64(seed))),
            ..self
        }
    }

    /// The pause before retry number `attempt` (0 for the first retry) when one try
    /// takes about `base`.
    pub fn pause(&self, base: Duration, attempt: u32) -> Duration {
        let ceiling = base.saturating_mul(1u32 << attempt.min(16)).min(self.cap);
        match &self.seeded {
            // A poisoned lock only means another task panicked mid-draw; the RNG is fine.
            Some(rng) => rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .gen_range(Duration::ZERO..=ceiling),
            None => rand::thread_rng().gen_range(Duration::ZERO..=ceiling),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_are_bounded_by_cap_and_by_the_doubling_base() {
        let b = Backoff::new(Duration::from_millis(50));
        for attempt in 0..40 {
            let p = b.pause(Duration::from_millis(1), attempt);
            assert!(p <= Duration::from_millis(50));
            if attempt < 5 {
                assert!(p <= Duration::from_millis(1 << attempt));
            }
        }
        assert!(b.pause(Duration::MAX, 40) <= Duration::from_millis(50));
    }

    #[test]
    fn a_seed_replays_the_same_pauses() {
        let draw = |seed| {
            let b = Backoff::new(Duration::from_secs(1)).seeded(seed);
            (0..20)
                .map(|k| b.pause(Duration::from_millis(3), k))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }
}
