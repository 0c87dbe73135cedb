//! idproto: what every part of qlist agrees on, with no I/O of its own beyond a socket.
//!
//! - [`IdRange`] and [`IdSource`]: an inclusive range of IDs and anything that hands them
//!   out (the direct quorum client and the broker client both implement it).
//! - [`IdError`] with its constructors: every way a request for IDs can fail.
//! - [`wire`]: the broker's binary protocol (messages, their encoding, limits), spoken by
//!   both the `broker` crate and `idclient`'s broker client.
//! - [`framed`]: the one framed connection both of them use: a cancel-safe
//!   [`framed::FrameReader`] with a frame timeout and a batching [`framed::FrameWriter`]
//!   with a write timeout.
//! - [`auth`]: the broker's shared-secret [`auth::Token`], never shown.
//! - `tls` (feature `tls`): a connection's halves, plain or TLS, and PEM loading, for
//!   both ends of a broker connection.

pub mod auth;
pub mod error;
pub mod framed;
#[cfg(feature = "tls")]
pub mod tls;
pub mod wire;

pub use error::{IdError, NodeFailure};

use std::future::Future;

/// An inclusive range of IDs `lo..=hi`, reserved by one successful quorum round.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct IdRange {
    /// First ID of the range, inclusive.
    pub lo: u64,
    /// Last ID of the range, inclusive (`hi >= lo`).
    pub hi: u64,
}

impl IdRange {
    /// Number of IDs in the range (`hi - lo + 1`).
    pub fn len(&self) -> u64 {
        self.hi - self.lo + 1
    }

    /// True when this is a well-formed range of exactly `n` IDs. For ranges from the
    /// network or another component: unlike `len() == n` it cannot overflow on a
    /// malformed range (`hi < lo`, or `0..=u64::MAX`).
    pub fn holds_exactly(&self, n: u64) -> bool {
        self.hi >= self.lo && n.checked_sub(1) == Some(self.hi - self.lo)
    }

    /// A range always holds at least one ID.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The IDs of the range in ascending order.
    pub fn iter(&self) -> std::ops::RangeInclusive<u64> {
        self.lo..=self.hi
    }
}

/// A source of globally ordered IDs: the direct quorum client or a broker client.
///
/// Guarantee of every implementation: a returned range lies wholly above every range
/// returned (by any source on the same quorum) before this call was made, and no ID is
/// returned twice.
pub trait IdSource: Send + Sync {
    /// Reserves `n` consecutive IDs (`n >= 1`) in one round.
    ///
    /// # Errors
    /// No quorum, deadline exceeded, unsafe node configuration, bad register value or
    /// (for brokers) a broken connection to every broker. An error never carries IDs:
    /// IDs whose outcome is unknown are burned (a hole), never handed out.
    fn next_ids(&self, n: u64) -> impl Future<Output = Result<IdRange, IdError>> + Send;

    /// One ID.
    ///
    /// # Errors
    /// As [`IdSource::next_ids`].
    fn next_id(&self) -> impl Future<Output = Result<u64, IdError>> + Send {
        async move { self.next_ids(1).await.map(|r| r.lo) }
    }
}

#[cfg(test)]
mod tests {
    use super::IdRange;

    #[test]
    fn holds_exactly_rejects_malformed_ranges_without_overflow() {
        assert!(IdRange { lo: 5, hi: 9 }.holds_exactly(5));
        assert!(!IdRange { lo: 5, hi: 9 }.holds_exactly(4));
        assert!(!IdRange { lo: 9, hi: 5 }.holds_exactly(1));
        assert!(!IdRange {
            lo: 0,
            hi: u64::MAX
        }
        .holds_exactly(u64::MAX));
        assert!(!IdRange { lo: 1, hi: 1 }.holds_exactly(0));
        assert!(IdRange {
            lo: u64::MAX,
            hi: u64::MAX
        }
        .holds_exactly(1));
    }
}
