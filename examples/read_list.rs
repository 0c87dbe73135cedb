//! Read a list.bin with the streaming reader (checks framing, order, count and checksum
//! as it goes).
//!
//! ```sh
//! cargo run --release --example read_list -- demo-data/list.bin
//! ```

use anyhow::{Context, Result};
use std::path::PathBuf;

fn main() -> Result<()> {
    let path = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: read_list LIST.BIN")?,
    );
    let mut per_shard = std::collections::BTreeMap::<u32, u64>::new();
    let mut last = None;
    for record in qformat::read_list(&path)? {
        let record = record.with_context(|| format!("reading {}", path.display()))?;
        *per_shard.entry(record.shard).or_default() += 1;
        last = Some(record.id);
    }
    println!(
        "{}: last id {last:?}, items per shard {per_shard:?}",
        path.display()
    );
    Ok(())
}
