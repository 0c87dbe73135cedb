//! What the publication tests share: reading a destination's checkpoint and segments back
//! (from a directory or S3) and checking them against the sublist.

use qformat::checkpoint::Checkpoint;
use qformat::names::{checkpoint_name, segment_name, segment_range, segments_dir_name};
use qformat::run::{decode_block, RunMeta};
use qformat::Record;

/// Where a test reads a destination from: a directory, or a prefix of a test S3 bucket.
pub enum Published<'a> {
    Dir(&'a std::path::Path),
    S3(&'a testkit::s3::TestS3, &'a str),
}

impl Published<'_> {
    /// The object or file `name` (relative to the destination); `None` if missing.
    pub fn get(&self, name: &str) -> Option<Vec<u8>> {
        match self {
            Published::Dir(d) => std::fs::read(d.join(name)).ok(),
            Published::S3(s3, prefix) => s3.get(&format!("{prefix}/{name}")),
        }
    }

    /// The shard's checkpoint, decoded (a bad one fails the test).
    #[track_caller]
    pub fn checkpoint(&self, shard: u32) -> Option<Checkpoint> {
        let bytes = self.get(&checkpoint_name(shard))?;
        Some(Checkpoint::decode(&bytes).expect("a valid checkpoint"))
    }

    /// The names of the shard's segment files, sorted (not hidden ones: a temporary file
    /// a kill mid-write left, which is no segment).
    pub fn segment_files(&self, shard: u32) -> Vec<String> {
        let dir = segments_dir_name(shard);
        let mut names: Vec<String> = match self {
            Published::Dir(d) => match std::fs::read_dir(d.join(&dir)) {
                Ok(entries) => entries
                    .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                    .collect(),
                Err(_) => Vec::new(),
            },
            Published::S3(s3, prefix) => s3
                .keys(&format!("{prefix}/{dir}/"))
                .into_iter()
                .map(|k| k.rsplit('/').next().unwrap_or_default().to_string())
                .collect(),
        };
        names.retain(|n| !n.starts_with('.'));
        names.sort();
        names
    }

    /// The records of every segment `c` names, in order, each segment checked: its
    /// length, its one shard entry (first seq a, count b - a, total b, not finished),
    /// its records' seqs.
    #[track_caller]
    pub fn records(&self, c: &Checkpoint) -> Vec<Record> {
        let mut out = Vec::new();
        for s in &c.segments {
            let name = segment_name(c.shard, s.first_seq, s.end_seq);
            let bytes = self
                .get(&name)
                .unwrap_or_else(|| panic!("{name} is missing"));
            assert_eq!(bytes.len() as u64, s.bytes, "{name}'s length");
            let meta = RunMeta::decode(bytes.len() as u64, &bytes).expect("segment metadata");
            let e = meta.shard(c.shard).expect("the shard's entry");
            assert_eq!(
                (e.first_seq, e.count, e.total, e.finished, meta.shards.len()),
                (s.first_seq, s.items(), s.end_seq, false, 1),
                "{name}'s shard table"
            );
            for (i, b) in meta.blocks.iter().enumerate() {
                let range = b.offset as usize..(b.offset + u64::from(b.len)) as usize;
                out.extend(decode_block(&bytes[range], b, i as u64).expect("block"));
            }
        }
        for (i, r) in out.iter().enumerate() {
            assert_eq!((r.shard, r.seq), (c.shard, i as u64), "seqs tile 0..count");
        }
        out
    }

    /// Checks the final state: a finished checkpoint whose segments hold exactly
    /// `sublist`, and no segment file it does not name.
    #[track_caller]
    pub fn check_finished(&self, shard: u32, sublist: &[Record]) {
        let c = self.checkpoint(shard).expect("a checkpoint");
        assert!(c.finished, "{c:?}");
        assert_eq!(c.claim, u64::MAX);
        assert_eq!(c.count, sublist.len() as u64);
        let got = self.records(&c);
        assert!(
            got == sublist,
            "the published records differ from the sublist's"
        );
        let mut named: Vec<String> = c
            .segments
            .iter()
            .map(|s| {
                let name = segment_name(shard, s.first_seq, s.end_seq);
                name.rsplit('/').next().unwrap_or_default().to_string()
            })
            .collect();
        named.sort();
        assert_eq!(self.segment_files(shard), named, "orphan segments left");
        for n in &named {
            assert!(segment_range(n).is_some(), "{n}");
        }
    }
}

/// The claim rule, checked against the shard's final items: the items with an ID at or
/// below `c.claim` are exactly the first `c.count` (those the checkpoint published).
#[track_caller]
pub fn check_claim(c: &Checkpoint, items: &[Record]) {
    let count = c.count as usize;
    assert!(count <= items.len(), "{c:?}");
    if let Some(last) = count.checked_sub(1).map(|i| &items[i]) {
        assert!(
            last.id <= c.claim,
            "published item {last:?} above the claim {c:?}"
        );
    }
    if let Some(next) = items.get(count) {
        assert!(
            next.id > c.claim,
            "item {} (ID {}) came after checkpoint {c:?} but is not above its claim",
            next.seq,
            next.id
        );
    }
}
