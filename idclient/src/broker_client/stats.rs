//! A broker's counters ([`fetch_stats`]), on a connection of their own.

use super::conn::{handshake, wire_error};
use crate::{BrokerTls, IdError};
use idproto::auth::Token;
use idproto::framed::Timeouts;
use idproto::wire::{BrokerStats, ClientMsg, ServerMsg};
use idproto::NodeFailure;
use std::time::Duration;

/// Time allowed for [`fetch_stats`] as a whole.
pub const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads the counters of the broker at `addr` (`host:port`).
///
/// # Errors
/// [`IdError::BrokersUnavailable`] if it cannot be reached or does not answer within
/// [`STATS_TIMEOUT`]; [`IdError::Protocol`] if it answers something else.
pub async fn fetch_stats(addr: &str) -> Result<BrokerStats, IdError> {
    fetch_stats_with_token(addr, None).await
}

/// [`fetch_stats`] from a broker that requires `token` (its `--auth-token-file`).
///
/// # Errors
/// As [`fetch_stats`]; [`IdError::Protocol`] saying "refused the token" for a missing
/// or wrong token.
pub async fn fetch_stats_with_token(
    addr: &str,
    token: Option<&Token>,
) -> Result<BrokerStats, IdError> {
    fetch_stats_with(addr, token, None).await
}

/// [`fetch_stats_with_token`] from a broker that listens with TLS (`tls`).
///
/// # Errors
/// As [`fetch_stats_with_token`]; [`IdError::BrokersUnavailable`] saying why for a
/// failed TLS handshake (e.g. "certificate verification failed").
pub async fn fetch_stats_with(
    addr: &str,
    token: Option<&Token>,
    tls: Option<&BrokerTls>,
) -> Result<BrokerStats, IdError> {
    let unavailable = |reason: String| IdError::BrokersUnavailable {
        failures: vec![NodeFailure {
            addr: addr.to_string(),
            reason,
        }],
    };
    let work = async {
        let (mut rd, mut wr, _) = handshake(addr, Timeouts::default(), token, tls).await?;
        wr.send(&ClientMsg::Stats { id: 1 })
            .await
            .map_err(|e| wire_error(addr, e))?;
        match rd.read_msg::<ServerMsg>().await {
            Ok(Some(ServerMsg::Stats { stats, .. })) => Ok(*stats),
            Ok(Some(other)) => Err(IdError::Protocol {
                addr: addr.to_string(),
                reason: format!("expected stats, got {other:?}"),
            }),
            Ok(None) => Err(unavailable("closed before answering".into())),
            Err(e) => Err(unavailable(e.to_string())),
        }
    };
    match tokio::time::timeout(STATS_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => Err(unavailable(format!("no stats within {STATS_TIMEOUT:?}"))),
    }
}
