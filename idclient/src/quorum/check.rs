//! `idctl check`: every node inspected on a fresh connection.

use crate::node::{Identity, Node, TlsConfig};
use crate::register::NodeError;
use crate::IdError;
use std::time::Duration;

/// What `idctl check` found on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCheck {
    /// The node's address (never its password).
    pub addr: String,
    /// `Ok` with warnings (possibly none), or why the node is unusable.
    pub verdict: Result<Vec<String>, String>,
}

/// Checks every node (what `idctl check` runs), in parallel: reachable, a master, not the
/// same server as another node listed, durable. A master with replicas gets a warning.
///
/// `rediss://` nodes are reached as `tls` says.
///
/// # Errors
/// A URL that cannot be parsed, or unusable TLS settings.
pub async fn check_nodes(
    urls: &[String],
    connect_timeout: Duration,
    reply_timeout: Duration,
    tls: &TlsConfig,
) -> Result<Vec<NodeCheck>, IdError> {
    tls.load()
        .map_err(|e| IdError::Config(format!("TLS: {e}")))?;
    let mut nodes = Vec::new();
    for url in urls {
        nodes.push(
            Node::with_tls(url.trim(), connect_timeout, reply_timeout, true, tls)
                .map_err(|e| IdError::Config(format!("bad node URL: {e}")))?,
        );
    }
    let results = futures::future::join_all(nodes.iter().map(|n| n.inspect())).await;
    let mut servers: Vec<(&str, String)> = Vec::new();
    let mut checks = Vec::new();
    for (node, result) in nodes.iter().zip(results) {
        let verdict = match result {
            Ok(Identity {
                run_id, replicas, ..
            }) => match servers.iter().find(|(_, r)| *r == run_id) {
                Some((other, _)) => Err(format!(
                    "DUPLICATE: the same Redis server as {other} (run_id {run_id}): list each server once"
                )),
                None => {
                    servers.push((node.addr(), run_id));
                    Ok(if replicas > 0 {
                        vec![format!("WARNING: {replicas} connected replica(s): a failover to an asynchronous replica can lose acknowledged writes, and with them the order of IDs")]
                    } else {
                        Vec::new()
                    })
                }
            },
            Err(NodeError::Unsafe(reason)) => Err(format!("UNSAFE: {reason}")),
            Err(NodeError::NotIndependent(reason)) => Err(format!("REFUSED: it {reason}")),
            Err(NodeError::Unavailable(reason) | NodeError::BadValue(reason)) => {
                Err(format!("UNREACHABLE: {reason}"))
            }
        };
        checks.push(NodeCheck {
            addr: node.addr().to_string(),
            verdict,
        });
    }
    Ok(checks)
}
