//! The rendezvous protocol of combined rounds, as data: a batch's name ([`Nonce`]), the
//! leases a leader holds ([`Leases`]), what `join` and `close` answer ([`Join`],
//! [`Close`]), the result a leader publishes ([`BatchResult`]) and a member's share of it
//! ([`member_range`]). How clients use it is `QuorumClient::combined` (quorum/combining.rs,
//! with the results subscription of `combine.rs`); the Lua script that implements
//! it on a Redis node is `script::COMBINE`, the simulation's model is
//! `testkit::sim`.
//!
//! A leaf: it imports nothing from the rest of the crate, so the node, the combining code
//! and the quorum client can all share these types without importing one another.

use idproto::IdRange;
use std::time::Duration;

/// How long a leader holds the rendezvous: `round` for a batch in flight, `batch` for an
/// open batch (which may first wait up to `round` for the batch in flight before it).
/// When a lease runs out the members stop waiting and join again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leases {
    /// How long a batch in flight holds the rendezvous: its leader's time for the round.
    pub round: Duration,
    /// How long an open batch holds it, the wait for the batch in flight included.
    pub batch: Duration,
}

/// What `join` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Joined the open batch `batch` at `offset`; its leader's lease ends in `wait`.
    Follow {
        /// The open batch joined; its result is published under this name.
        batch: Nonce,
        /// IDs of the members that joined before: the caller's IDs start this far into
        /// the batch's range.
        offset: u64,
        /// What is left of the leader's lease: how long to wait for the result.
        wait: Duration,
    },
    /// Nothing open, nothing in flight: the caller's batch (its request alone) is in
    /// flight now; run it.
    Solo,
    /// The caller opened a batch and leads it; `busy` is in flight for up to `wait`.
    Lead {
        /// The batch in flight, which the caller's batch waits for before it closes.
        busy: Nonce,
        /// What is left of that batch's lease.
        wait: Duration,
    },
    /// The open batch is full: run an ordinary round.
    Full,
}

/// What `close` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Closed and now in flight: reserve `ids` IDs for it.
    Closed {
        /// IDs the batch's members asked for in all: the count of its quorum round.
        ids: u64,
    },
    /// Batch `busy` is still in flight, for up to `wait`.
    Busy {
        /// The batch still in flight.
        busy: Nonce,
        /// What is left of its lease.
        wait: Duration,
    },
    /// The batch is gone (expired, or the node restarted): its members will join again.
    Gone,
}

/// The outcome of one batch, as published to its members: `"<batch> <lo> <hi>"`, or
/// `"<batch> failed"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchResult {
    /// The batch this is the outcome of.
    pub batch: Nonce,
    /// The IDs reserved for the whole batch; `None` when its round failed.
    pub range: Option<IdRange>,
}

impl BatchResult {
    /// The text published on the results channel, which [`BatchResult::parse`] reads.
    pub fn message(&self) -> String {
        match self.range {
            Some(r) => format!("{} {} {}", self.batch, r.lo, r.hi),
            None => format!("{} failed", self.batch),
        }
    }

    /// `None` for anything else: a stranger's message on the channel is ignored.
    pub fn parse(message: &str) -> Option<BatchResult> {
        let mut words = message.split(' ');
        let batch = Nonce::parse(words.next()?.as_bytes())?;
        let result = match (words.next()?, words.next()) {
            ("failed", None) => BatchResult { batch, range: None },
            (lo, Some(hi)) => {
                let (lo, hi): (u64, u64) = (lo.parse().ok()?, hi.parse().ok()?);
                if lo == 0 || lo > hi {
                    return None;
                }
                BatchResult {
                    batch,
                    range: Some(IdRange { lo, hi }),
                }
            }
            _ => return None,
        };
        words.next().is_none().then_some(result)
    }
}

/// The IDs at `offset` of a published batch range, if they lie inside it.
pub fn member_range(batch: IdRange, offset: u64, n: u64) -> Option<IdRange> {
    let lo = batch.lo.checked_add(offset)?;
    let hi = lo.checked_add(n.checked_sub(1)?)?;
    (hi <= batch.hi).then_some(IdRange { lo, hi })
}

/// A batch's name. Members take the IDs at their offset from the result published under
/// it, so two live batches must never share one: 128 random bits from the thread's
/// CSPRNG make that as unlikely as two equal random UUIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nonce(pub u128);

impl Nonce {
    /// A fresh name: 128 random bits from the thread's CSPRNG.
    pub fn random() -> Nonce {
        Nonce(rand::random())
    }

    /// 32 lowercase hex digits: how it travels (Lua compares it as a string).
    pub fn parse(s: &[u8]) -> Option<Nonce> {
        if s.len() != 32
            || !s
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            return None;
        }
        u128::from_str_radix(std::str::from_utf8(s).ok()?, 16)
            .ok()
            .map(Nonce)
    }
}

impl std::fmt::Display for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        for result in [
            BatchResult {
                batch: Nonce(7),
                range: Some(IdRange { lo: 1, hi: 1 }),
            },
            BatchResult {
                batch: Nonce(u128::MAX),
                range: Some(IdRange {
                    lo: 1 << 63,
                    hi: u64::MAX,
                }),
            },
            BatchResult {
                batch: Nonce::random(),
                range: None,
            },
        ] {
            assert_eq!(BatchResult::parse(&result.message()), Some(result));
        }
    }

    #[test]
    fn strangers_messages_are_ignored() {
        let n = "0000000000000000000000000000002a";
        for bad in [
            String::new(),
            "x".to_string(),
            "42 1 2".to_string(),
            n.to_string(),
            format!("{n} 2"),
            format!("{n} 2 3 4"),
            format!("{n} 3 2"),
            format!("{n} 0 5"),
            format!("{n} failed 2"),
            format!("{n} 2 99999999999999999999"),
            format!("{} 2 3", n.to_uppercase()),
            "000000000000000000000000000000ZZ 1 2".to_string(),
        ] {
            assert_eq!(BatchResult::parse(&bad), None, "{bad:?}");
        }
        assert_eq!(
            BatchResult::parse(&format!("{n} 2 3")),
            Some(BatchResult {
                batch: Nonce(42),
                range: Some(IdRange { lo: 2, hi: 3 })
            })
        );
    }

    #[test]
    fn member_ranges_stay_inside_the_batch() {
        let batch = IdRange { lo: 10, hi: 19 };
        assert_eq!(member_range(batch, 0, 1), Some(IdRange { lo: 10, hi: 10 }));
        assert_eq!(member_range(batch, 7, 3), Some(IdRange { lo: 17, hi: 19 }));
        assert_eq!(member_range(batch, 8, 3), None);
        assert_eq!(member_range(batch, 10, 1), None);
        assert_eq!(
            member_range(
                IdRange {
                    lo: u64::MAX,
                    hi: u64::MAX
                },
                1,
                1
            ),
            None
        );
        assert_eq!(member_range(batch, 0, 0), None);
    }

    proptest! {
        // Members at consecutive offsets get disjoint, adjacent ranges.
        #[test]
        fn offsets_partition_the_batch(lo in 1u64..1 << 40, sizes in proptest::collection::vec(1u64..100, 1..20)) {
            let total: u64 = sizes.iter().sum();
            let batch = IdRange { lo, hi: lo + total - 1 };
            let mut next = lo;
            let mut offset = 0;
            for n in sizes {
                let r = member_range(batch, offset, n).expect("inside");
                prop_assert_eq!(r.lo, next);
                prop_assert_eq!(r.hi - r.lo + 1, n);
                next = r.hi + 1;
                offset += n;
            }
            prop_assert_eq!(next, batch.hi + 1);
        }
    }
}
