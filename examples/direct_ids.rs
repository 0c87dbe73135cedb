//! Get IDs straight from the quorum with the direct client.
//!
//! ```sh
//! NODES=$(idctl cluster up --dir /tmp/q --base-port 7001)
//! cargo run --release --example direct_ids -- "$NODES"
//! ```

use anyhow::{Context, Result};
use idclient::{ClientConfig, IdSource, QuorumClient};

#[tokio::main]
async fn main() -> Result<()> {
    let nodes = std::env::args()
        .nth(1)
        .context("usage: direct_ids redis://host:port,redis://host:port,...")?;
    let config = ClientConfig::new(nodes.split(',').map(str::to_string).collect());
    // Checks every node's durability settings; refuses an unsafe node.
    let client = QuorumClient::connect(config).await?;
    let id = client.next_id().await?;
    let range = client.next_ids(100).await?; // 100 consecutive IDs in one round
    println!("one ID: {id}; a range: {}..={}", range.lo, range.hi);
    assert!(range.lo > id, "a later request always gets larger IDs");
    println!("counters: {:?}", client.counters());
    Ok(())
}
