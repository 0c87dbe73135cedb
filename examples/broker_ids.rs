//! Get IDs through one or more idbrokers (group commit; fails over between brokers).
//!
//! ```sh
//! idbroker --listen 127.0.0.1:7300 --nodes "$NODES" &
//! cargo run --release --example broker_ids -- 127.0.0.1:7300
//! ```

use anyhow::{Context, Result};
use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::IdSource;
use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<()> {
    let addrs = std::env::args()
        .nth(1)
        .context("usage: broker_ids host:port[,host:port...]")?;
    let client = Arc::new(
        BrokerClient::connect(
            addrs.split(',').map(str::to_string).collect(),
            BrokerClientConfig::default(),
        )
        .await?,
    );
    // Many concurrent callers share one client: the broker serves all requests that
    // arrive during one quorum round with that round.
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let client = Arc::clone(&client);
        tasks.push(tokio::spawn(async move { client.next_id().await }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await??);
    }
    ids.sort_unstable();
    ids.dedup();
    println!(
        "{} distinct IDs from {} to {}",
        ids.len(),
        ids[0],
        ids[ids.len() - 1]
    );
    Ok(())
}
