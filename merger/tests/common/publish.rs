//! A fake producer that publishes as it goes (DESIGN.md, "The list while it grows"): it
//! seals the items it made since its last publication into a segment with qformat's
//! `RunWriter::segment`, then replaces its checkpoint atomically (temp + rename in a
//! directory, one PUT in S3), as `producer --publish-every` does.
//!
//! [`Plan`] deals a list of IDs to shards and publishes it in rounds, so that every claim
//! keeps the contract: shard s at time T publishes all its items with ID <= T and claims T
//! (its next item's ID is above T).

use std::path::{Path, PathBuf};

use qformat::checkpoint::{Checkpoint, SegmentRef};
use qformat::names::{checkpoint_name, segment_name};
use qformat::run::RunWriter;
use qformat::Record;
use testkit::s3::TestS3;

/// Where a fake producer publishes.
#[derive(Clone, Copy)]
pub enum Dest<'a> {
    /// A local directory: files written to a temporary name, then renamed.
    Dir(&'a Path),
    /// A prefix in a test S3 server: one PUT each.
    S3(&'a TestS3, &'a str),
}

impl Dest<'_> {
    /// Writes `bytes` under `name` (relative to the destination) atomically.
    pub fn put(&self, name: &str, bytes: &[u8]) {
        match self {
            Dest::Dir(dir) => {
                let path = dir.join(name);
                let parent = path.parent().expect("parent");
                std::fs::create_dir_all(parent).expect("mkdir");
                let tmp = parent.join(format!(
                    ".{}.tmp",
                    path.file_name().expect("name").to_string_lossy()
                ));
                std::fs::write(&tmp, bytes).expect("write temp");
                std::fs::rename(&tmp, &path).expect("rename");
            }
            Dest::S3(s3, prefix) => s3.put(&format!("{prefix}/{name}"), bytes),
        }
    }

    /// The destination as `merger --runs` takes it.
    pub fn arg(&self) -> String {
        match self {
            Dest::Dir(dir) => dir.display().to_string(),
            Dest::S3(s3, prefix) => s3.url(prefix),
        }
    }
}

/// One shard's fake producer.
pub struct Publisher {
    pub shard: u32,
    pub checkpoint: Checkpoint,
}

impl Publisher {
    pub fn new(shard: u32) -> Publisher {
        Publisher {
            shard,
            checkpoint: Checkpoint::empty(shard),
        }
    }

    /// Publishes `ids` (the shard's next items, ascending) as one segment (none if empty),
    /// then a checkpoint claiming `claim` (finished: `u64::MAX`).
    pub fn publish(&mut self, dest: Dest<'_>, ids: &[u64], claim: u64, finished: bool) {
        let first = self.checkpoint.count;
        if !ids.is_empty() {
            let end = first + ids.len() as u64;
            let mut w = RunWriter::segment(Vec::new(), self.shard, first, end).expect("segment");
            for (i, &id) in ids.iter().enumerate() {
                let r = Record {
                    id,
                    shard: self.shard,
                    seq: first + i as u64,
                    payload: super::payload(id),
                };
                w.write(&r).expect("write segment record");
            }
            let (bytes, _) = w.finish().expect("finish segment");
            dest.put(&segment_name(self.shard, first, end), &bytes);
            self.checkpoint.segments.push(SegmentRef {
                first_seq: first,
                end_seq: end,
                bytes: bytes.len() as u64,
            });
            self.checkpoint.count = end;
        }
        self.checkpoint.finished = finished;
        self.checkpoint.claim = if finished {
            u64::MAX
        } else {
            claim.max(self.checkpoint.claim)
        };
        dest.put(&checkpoint_name(self.shard), &self.checkpoint.encode());
    }
}

/// A list of IDs `1..=n` dealt to `shards` shards, published in rounds.
pub struct Plan {
    pub shards: u32,
    /// Per shard, its IDs ascending.
    pub ids: Vec<Vec<u64>>,
    /// Per shard, how many of its IDs are published.
    pub published: Vec<usize>,
    pub publishers: Vec<Publisher>,
    pub n: u64,
}

impl Plan {
    /// IDs `1..=n`, shard of id i by a fixed uneven pattern.
    pub fn new(shards: u32, n: u64) -> Plan {
        let mut ids = vec![Vec::new(); shards as usize];
        for i in 1..=n {
            ids[((i * 7 + i / 13) % u64::from(shards)) as usize].push(i);
        }
        Plan {
            shards,
            ids,
            published: vec![0; shards as usize],
            publishers: (0..shards).map(Publisher::new).collect(),
            n,
        }
    }

    /// Shard `s` publishes its items with ID <= `t` and claims `t` (finished when `t`
    /// reaches the end of the list).
    pub fn publish_until(&mut self, dest: Dest<'_>, s: u32, t: u64) {
        let si = s as usize;
        let from = self.published[si];
        let upto = self.ids[si].partition_point(|&id| id <= t);
        let new: Vec<u64> = self.ids[si][from..upto.max(from)].to_vec();
        self.published[si] = upto.max(from);
        let finished = t >= self.n;
        self.publishers[si].publish(dest, &new, t, finished);
    }

    /// Every shard publishes up to `t`.
    pub fn round(&mut self, dest: Dest<'_>, t: u64) {
        for s in 0..self.shards {
            self.publish_until(dest, s, t);
        }
    }

    /// Publishes the whole list in `rounds` rounds, each shard a little behind or ahead of
    /// the others (so that W is held by a different shard from round to round), calling
    /// `between` after each round.
    pub fn run(&mut self, dest: Dest<'_>, rounds: u64, mut between: impl FnMut(u64)) {
        for r in 1..=rounds {
            for s in 0..self.shards {
                let skew = (u64::from(s) * 3 + r) % 5;
                let t = (self.n * r / rounds).saturating_sub(skew * self.n / (rounds * 10));
                let t = if r == rounds { self.n } else { t };
                self.publish_until(dest, s, t);
            }
            between(r);
        }
    }
}

/// The files of a directory of parts, sorted (`part-*.<ext>`).
pub fn part_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("part-") && name.ends_with(&format!(".{ext}"))
        })
        .collect();
    v.sort();
    v
}
