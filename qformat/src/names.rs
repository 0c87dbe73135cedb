//! The names of qlist's files and directories: the only place that builds or parses them.
//!
//! - A producer's sublist is the directory `DIR/shard-<n>` (canonical decimal `n`), built
//!   under `DIR/.creating-shard-<n>` and renamed into place ([`crate::shard`]).
//! - A sealed run is `shard-<n>.bin` in its destination; any `*.bin` that is not hidden
//!   is a run to a merge that lists a directory or a prefix.

use std::path::{Path, PathBuf};

/// Sublist databases are directories named `shard-<n>` under the data dir (DESIGN.md).
pub const SHARD_PREFIX: &str = "shard-";
/// A producer builds a new sublist under `.creating-shard-<n>` and renames it to
/// `shard-<n>`: a leftover without its `shard-<n>` means that producer was killed while
/// creating the sublist, before it wrote any item.
pub const CREATING_PREFIX: &str = ".creating-";
/// What a run's name ends with.
pub const RUN_SUFFIX: &str = ".bin";

/// `DIR/shard-<n>`: where shard `n`'s sublist lives.
pub fn shard_db_path(data_dir: &Path, shard: u32) -> PathBuf {
    data_dir.join(format!("{SHARD_PREFIX}{shard}"))
}

/// `DIR/.creating-shard-<n>`: where shard `n`'s sublist is built before it is renamed to
/// [`shard_db_path`].
pub fn creating_db_path(data_dir: &Path, shard: u32) -> PathBuf {
    data_dir.join(format!("{CREATING_PREFIX}{SHARD_PREFIX}{shard}"))
}

/// The n of a directory named exactly `shard-<n>` (canonical decimal, as the producer
/// names it: not `shard-07`, not `shard-3.bak`).
pub fn shard_number(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(SHARD_PREFIX)?;
    digits
        .parse::<u32>()
        .ok()
        .filter(|n| n.to_string() == digits)
}

/// The n of a leftover `.creating-shard-<n>` directory.
pub fn creating_shard_number(name: &str) -> Option<u32> {
    shard_number(name.strip_prefix(CREATING_PREFIX)?)
}

/// What an entry of a data dir is, by its name ([`data_dir_entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirEntry {
    /// `shard-<n>`: shard n's sublist.
    Shard(u32),
    /// `.creating-shard-<n>`: what a producer killed while creating shard n's sublist left.
    Creating(u32),
    /// Named like a sublist (`shard-*`) but not `shard-<number>`: a copy or a mistake.
    BadShardName,
}

/// What the entry `name` of a data dir is; `None` for anything that is no sublist's.
pub fn data_dir_entry(name: &str) -> Option<DataDirEntry> {
    if let Some(shard) = creating_shard_number(name) {
        return Some(DataDirEntry::Creating(shard));
    }
    if !name.starts_with(SHARD_PREFIX) {
        return None;
    }
    // "shard-07" or "shard-3.bak" would be a second copy of some shard.
    Some(shard_number(name).map_or(DataDirEntry::BadShardName, DataDirEntry::Shard))
}

/// A name a file in a data dir must not take: a sublist's (`shard-*`) or a creation's
/// (`.creating-*`), which would break every later merge of that directory.
pub fn is_sublist_name(name: &str) -> bool {
    name.starts_with(SHARD_PREFIX) || name.starts_with(CREATING_PREFIX)
}

/// The name of shard `shard`'s run in a destination: `shard-<n>.bin`.
pub fn run_name(shard: u32) -> String {
    format!("{SHARD_PREFIX}{shard}{RUN_SUFFIX}")
}

/// What a checkpoint's name ends with ([`checkpoint_name`]).
pub const CHECKPOINT_SUFFIX: &str = ".checkpoint";
/// The directory, inside a destination, that holds every shard's segments.
pub const SEGMENTS_DIR: &str = "segments";
/// What a segment's name ends with: not `.bin`, so that nothing that lists runs takes a
/// segment (which only its checkpoint makes part of the list) for one.
pub const SEGMENT_SUFFIX: &str = ".seg";
/// How a follower's parts are named: `part-<i>` and the format's extension.
pub const FOLLOW_PART_PREFIX: &str = "part-";

/// The name of shard `shard`'s checkpoint in a destination: `shard-<n>.checkpoint`.
pub fn checkpoint_name(shard: u32) -> String {
    format!("{SHARD_PREFIX}{shard}{CHECKPOINT_SUFFIX}")
}

/// The shard of a checkpoint's name (`shard-<n>.checkpoint`, canonical `n`).
pub fn checkpoint_shard(name: &str) -> Option<u32> {
    shard_number(name.strip_suffix(CHECKPOINT_SUFFIX)?)
}

/// The name, relative to its destination, of the segment of shard `shard` holding seqs
/// `first_seq..end_seq`: `segments/shard-<n>/<first>-<end>.seg`, both zero-padded to 20
/// digits so that a listing sorts them in seq order.
pub fn segment_name(shard: u32, first_seq: u64, end_seq: u64) -> String {
    format!("{SEGMENTS_DIR}/{SHARD_PREFIX}{shard}/{first_seq:020}-{end_seq:020}{SEGMENT_SUFFIX}")
}

/// The directory, relative to its destination, holding shard `shard`'s segments.
pub fn segments_dir_name(shard: u32) -> String {
    format!("{SEGMENTS_DIR}/{SHARD_PREFIX}{shard}")
}

/// The seq range of a segment's file name (`<first>-<end>.seg`, as [`segment_name`] ends).
pub fn segment_range(file_name: &str) -> Option<(u64, u64)> {
    let (a, b) = file_name.strip_suffix(SEGMENT_SUFFIX)?.split_once('-')?;
    let parse = |s: &str| s.parse::<u64>().ok().filter(|_| s.len() == 20);
    Some((parse(a)?, parse(b)?))
}

/// The name of a follower's part number `index`: `part-<index>.<ext>`, zero-padded to 8
/// digits so that a listing sorts them in order (`ext`: `bin` or `parquet`).
pub fn follow_part_name(index: u64, ext: &str) -> String {
    format!("{FOLLOW_PART_PREFIX}{index:08}.{ext}")
}

/// The index of a follower's part from its name, if it is one with extension `ext`.
pub fn follow_part_index(name: &str, ext: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(FOLLOW_PART_PREFIX)?
        .strip_suffix(ext)?
        .strip_suffix('.')?;
    digits.parse::<u64>().ok().filter(|_| digits.len() >= 8)
}

/// Whether `name` is what an unfinished write of a follower's part leaves in its
/// directory: a hidden `.part-<i>.<ext>.XXXXXX.tmp` (a follower killed while writing a
/// part; the next one removes it).
pub fn is_follow_part_temp(name: &str) -> bool {
    name.strip_prefix('.')
        .is_some_and(|n| n.starts_with(FOLLOW_PART_PREFIX) && n.ends_with(".tmp"))
}

/// A run's name: `*.bin`, not hidden.
pub fn is_run_name(name: &str) -> bool {
    has_run_suffix(name) && !name.starts_with('.') && name.len() > RUN_SUFFIX.len()
}

/// `name` ends like a run (`*.bin`): a file, not a directory of sublists.
pub fn has_run_suffix(name: &str) -> bool {
    name.ends_with(RUN_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_shard_names_have_a_number() {
        assert_eq!(shard_number("shard-0"), Some(0));
        assert_eq!(shard_number("shard-4294967295"), Some(u32::MAX));
        for bad in [
            "shard-",
            "shard-07",
            "shard-3.bak",
            "shard--1",
            "shard-+1",
            "shard-4294967296",
            "shard-a",
            "xshard-1",
            "shard-1 ",
        ] {
            assert_eq!(shard_number(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_are_built_and_parsed_alike() {
        let d = Path::new("/d");
        assert_eq!(shard_db_path(d, 7), PathBuf::from("/d/shard-7"));
        assert_eq!(
            creating_db_path(d, 7),
            PathBuf::from("/d/.creating-shard-7")
        );
        assert_eq!(run_name(3), "shard-3.bin");
        assert_eq!(data_dir_entry("shard-7"), Some(DataDirEntry::Shard(7)));
        assert_eq!(
            data_dir_entry(".creating-shard-7"),
            Some(DataDirEntry::Creating(7))
        );
        assert_eq!(data_dir_entry("shard-07"), Some(DataDirEntry::BadShardName));
        assert_eq!(data_dir_entry("list.bin"), None);
        assert_eq!(data_dir_entry(".creating-x"), None);
        assert!(is_sublist_name("shard-x") && is_sublist_name(".creating-shard-1"));
        assert!(!is_sublist_name("list.bin"));
        assert!(is_run_name(&run_name(0)) && is_run_name("list.bin"));
        for not_a_run in [".bin", ".shard-0.bin", "shard-0", "x.bin.tmp"] {
            assert!(!is_run_name(not_a_run), "{not_a_run}");
        }
    }

    #[test]
    fn publication_names_are_built_and_parsed_alike() {
        assert_eq!(checkpoint_name(7), "shard-7.checkpoint");
        assert_eq!(checkpoint_shard("shard-7.checkpoint"), Some(7));
        for bad in [
            "shard-07.checkpoint",
            "shard-7.checkpoint.tmp",
            "shard-7.bin",
        ] {
            assert_eq!(checkpoint_shard(bad), None, "{bad}");
        }
        let seg = segment_name(3, 5, 12);
        assert_eq!(
            seg,
            "segments/shard-3/00000000000000000005-00000000000000000012.seg"
        );
        assert!(!is_run_name(&seg) && !is_run_name(&checkpoint_name(3)));
        let file = seg.rsplit('/').next().unwrap_or_default();
        assert_eq!(segment_range(file), Some((5, 12)));
        assert_eq!(segment_range("5-12.seg"), None);
        assert_eq!(segments_dir_name(3), "segments/shard-3");
        assert_eq!(follow_part_name(12, "bin"), "part-00000012.bin");
        assert_eq!(follow_part_index("part-00000012.bin", "bin"), Some(12));
        assert_eq!(follow_part_index("part-00000012.parquet", "bin"), None);
        assert_eq!(follow_part_index("part-12.bin", "bin"), None);
        assert_eq!(follow_part_index(".part-00000012.bin", "bin"), None);
        assert!(is_follow_part_temp(".part-00000012.bin.a1B2c3.tmp"));
        assert!(!is_follow_part_temp("part-00000012.bin"));
        assert!(!is_follow_part_temp(".shard-1.bin.a1B2c3.tmp"));
    }
}
