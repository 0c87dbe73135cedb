//! A job that computes its items and appends them from code with [`producer::Appender`]:
//! no input file, no pipe, and still exactly once across kill -9.
//!
//! ```sh
//! NODES=$(idctl cluster up --dir /tmp/q --base-port 7001)
//! cargo run --release -p producer --example append -- \
//!     --nodes "$NODES" --data-dir /tmp/sublists --shard 0 --count 100000 --seal-to /tmp/runs
//! ```
//!
//! Killed at any moment and started again with the same arguments, it reopens the shard,
//! which says how many items are durable, and computes and appends from there. Its items
//! are binary records (newlines and NUL bytes in them, some empty): [`record`].

use anyhow::Context;
use clap::Parser;
use idclient::{ClientConfig, QuorumClient};
use producer::{AppendConfig, Appender};
use std::path::PathBuf;

/// Append `--count` computed records to shard `--shard` of `--data-dir`.
#[derive(Parser)]
struct Args {
    /// The ID generator's nodes: redis://host:port,redis://host:port,...
    #[arg(long)]
    nodes: String,
    /// Directory holding the sublists.
    #[arg(long)]
    data_dir: PathBuf,
    /// Shard number: the sublist is DATA_DIR/shard-<N>.
    #[arg(long)]
    shard: u32,
    /// Records to compute and append in all (across reruns).
    #[arg(long)]
    count: u64,
    /// Records per batch (one ID range, one synced write).
    #[arg(long, default_value_t = producer::DEFAULT_BATCH)]
    batch: u64,
    /// Once finished, seal the sublist into DEST/shard-<N>.bin (a directory or s3://...).
    #[arg(long, value_name = "DEST")]
    seal_to: Option<String>,
}

/// Record `i` of shard `shard`: what the job "computes". Deterministic, so a rerun computes
/// the same records; binary, so it could not be a line of a file.
pub fn record(shard: u32, i: u64) -> Vec<u8> {
    match i % 5 {
        0 => Vec::new(),
        1 => format!("shard {shard}\nrecord {i}\n").into_bytes(),
        2 => [&i.to_le_bytes()[..], b"\0\0", &(i * i).to_be_bytes()[..]].concat(),
        _ => format!("{shard}:{i}:{}", "x".repeat((i % 7) as usize)).into_bytes(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The stall point the kill test stops this job at (only in a test build).
    #[cfg(feature = "test-hooks")]
    producer::test_hooks::from_env().map_err(anyhow::Error::msg)?;
    let nodes = args.nodes.split(',').map(str::to_string).collect();
    let ids = QuorumClient::connect(ClientConfig::new(nodes))
        .await
        .context("connecting to the ID generator")?;
    let mut config = AppendConfig::new(args.shard, &args.data_dir);
    config.batch = args.batch;
    config.name = format!("example append count={}", args.count);
    let mut appender = Appender::open(config, ids)?;
    let from = appender.resume_at();
    println!(
        "shard {}: {from} records durable, appending from {from}",
        args.shard
    );
    for i in from..args.count {
        appender.append(&record(args.shard, i)).await?;
    }
    let summary = appender.finish().await?;
    println!("{summary}");
    if let Some(dest) = &args.seal_to {
        println!("{}", appender.seal_to(dest).await?);
    }
    Ok(())
}
