//! A shard's *checkpoint*: what its producer has published so far while it runs
//! (DESIGN.md, "The list while it grows"). It names the shard's *segments* (runs holding
//! consecutive seq ranges of the shard, in seq order), its item count, its *claim* (every
//! item of the shard with an ID at or below it is in those segments, and every later ID of
//! the shard is above it) and whether the shard is finished.
//!
//! The bytes are a short text, one field a line, ending in a CRC-32 of everything before
//! that line, so a torn or hand-edited checkpoint is refused instead of read as empty:
//!
//! ```text
//! qlist-checkpoint 1
//! shard 3
//! count 12000
//! claim 4567
//! finished 0
//! segment 0 5000 612345
//! segment 5000 12000 702345
//! crc32 89abcdef
//! ```
//!
//! `segment A B BYTES`: the segment holding seqs `A..B`, `BYTES` long, named by
//! [`crate::names::segment_name`]. Segments tile `0..count` in order; `claim` is a decimal
//! u64 (`max` for a finished shard, whose claim is infinite); `finished` is 0 or 1.

use std::fmt::Write as _;

/// The first line of every checkpoint: format name and version.
pub const CHECKPOINT_MAGIC: &str = "qlist-checkpoint 1";
/// The longest checkpoint a reader accepts (a corrupt or foreign file never makes a
/// reader allocate more): 64 MiB holds about a million segments.
pub const MAX_CHECKPOINT_BYTES: u64 = 64 << 20;

/// One published segment of a shard: seqs `first_seq..end_seq`, `bytes` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentRef {
    /// Seq of its first item.
    pub first_seq: u64,
    /// One past the seq of its last item.
    pub end_seq: u64,
    /// Its length in bytes (a reader checks the object it opens has this length).
    pub bytes: u64,
}

impl SegmentRef {
    /// Items in the segment.
    pub fn items(&self) -> u64 {
        self.end_seq - self.first_seq
    }
}

/// A shard's checkpoint (see the module's doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The shard.
    pub shard: u32,
    /// Items published: seqs `0..count`, in the segments.
    pub count: u64,
    /// Every item of the shard with an ID <= claim is in the segments; every ID the shard
    /// gets later is above it. `u64::MAX` once finished.
    pub claim: u64,
    /// The producer reached the end of its input and every item is in the segments.
    pub finished: bool,
    /// The segments, in seq order, tiling `0..count`.
    pub segments: Vec<SegmentRef>,
}

/// A checkpoint's bytes are wrong: what and where (1-based line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad checkpoint, line {line}: {reason}")]
pub struct CheckpointError {
    /// The line (1-based; 0 for the file as a whole).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

fn bad(line: usize, reason: impl Into<String>) -> CheckpointError {
    CheckpointError {
        line,
        reason: reason.into(),
    }
}

impl Checkpoint {
    /// An empty, unfinished checkpoint of `shard` (nothing published, claim 0).
    pub fn empty(shard: u32) -> Checkpoint {
        Checkpoint {
            shard,
            count: 0,
            claim: 0,
            finished: false,
            segments: Vec::new(),
        }
    }

    /// Checks the rules a checkpoint keeps: segments non-empty, tiling `0..count` in
    /// order; a finished shard claims `u64::MAX`.
    ///
    /// # Errors
    /// The first rule broken (line 0).
    pub fn check(&self) -> Result<(), CheckpointError> {
        let mut next = 0u64;
        for s in &self.segments {
            if s.first_seq != next || s.end_seq <= s.first_seq {
                return Err(bad(
                    0,
                    format!(
                        "segment {}..{} does not follow seq {next} (segments must tile 0..count in order, none empty)",
                        s.first_seq, s.end_seq
                    ),
                ));
            }
            next = s.end_seq;
        }
        if next != self.count {
            return Err(bad(
                0,
                format!("segments end at seq {next}, count is {}", self.count),
            ));
        }
        if self.finished && self.claim != u64::MAX {
            return Err(bad(0, "a finished shard must claim max"));
        }
        Ok(())
    }

    /// The checkpoint's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::new();
        let claim = if self.claim == u64::MAX {
            "max".to_string()
        } else {
            self.claim.to_string()
        };
        // Writing into a String cannot fail.
        let _ = writeln!(s, "{CHECKPOINT_MAGIC}");
        let _ = writeln!(s, "shard {}", self.shard);
        let _ = writeln!(s, "count {}", self.count);
        let _ = writeln!(s, "claim {claim}");
        let _ = writeln!(s, "finished {}", u8::from(self.finished));
        for g in &self.segments {
            let _ = writeln!(s, "segment {} {} {}", g.first_seq, g.end_seq, g.bytes);
        }
        let crc = crc32fast::hash(s.as_bytes());
        let _ = writeln!(s, "crc32 {crc:08x}");
        s.into_bytes()
    }

    /// Parses and checks a checkpoint's bytes.
    ///
    /// # Errors
    /// [`CheckpointError`] naming the line: not a checkpoint, a field missing, out of
    /// order or malformed, a CRC that does not match, segments that do not tile.
    pub fn decode(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        if bytes.len() as u64 > MAX_CHECKPOINT_BYTES {
            return Err(bad(0, format!("{} bytes, over the limit", bytes.len())));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| bad(0, "not UTF-8 text"))?;
        let body_len = check_crc(text)?;
        let mut lines = text[..body_len]
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, l)) if l == CHECKPOINT_MAGIC => {}
            _ => {
                return Err(bad(
                    1,
                    format!("not a checkpoint (want {CHECKPOINT_MAGIC:?})"),
                ))
            }
        }
        let shard = number(field(&mut lines, "shard")?, u64::from(u32::MAX))? as u32;
        let count = number(field(&mut lines, "count")?, u64::MAX)?;
        let claim = match field(&mut lines, "claim")? {
            (_, "max") => u64::MAX,
            claim => number(claim, u64::MAX)?,
        };
        let finished = match field(&mut lines, "finished")? {
            (_, "0") => false,
            (_, "1") => true,
            (line, _) => return Err(bad(line, "finished must be 0 or 1")),
        };
        let c = Checkpoint {
            shard,
            count,
            claim,
            finished,
            segments: lines
                .map(segment)
                .collect::<Result<Vec<_>, CheckpointError>>()?,
        };
        c.check()?;
        Ok(c)
    }
}

/// Checks the last line, `crc32 XXXXXXXX`, against the bytes before it; returns their length.
fn check_crc(text: &str) -> Result<usize, CheckpointError> {
    let trimmed = text
        .strip_suffix('\n')
        .ok_or_else(|| bad(0, "truncated (no final newline)"))?;
    let start = trimmed.rfind('\n').map_or(0, |i| i + 1);
    let line = text[..start].lines().count() + 1;
    let hex = trimmed[start..]
        .strip_prefix("crc32 ")
        .ok_or_else(|| bad(line, "truncated (the last line is not the crc32)"))?;
    let want = u32::from_str_radix(hex, 16)
        .ok()
        .filter(|_| hex.len() == 8)
        .ok_or_else(|| bad(line, "crc32 is not 8 hex digits"))?;
    let got = crc32fast::hash(&text.as_bytes()[..start]);
    if got != want {
        return Err(bad(
            line,
            format!("crc32 {got:08x} of the lines above, the file says {want:08x}"),
        ));
    }
    Ok(start)
}

/// The next line, which must be `NAME VALUE`: (line number, VALUE).
fn field<'a>(
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
    name: &str,
) -> Result<(usize, &'a str), CheckpointError> {
    let (n, l) = lines
        .next()
        .ok_or_else(|| bad(0, format!("no {name:?} line")))?;
    let value = l
        .strip_prefix(name)
        .and_then(|v| v.strip_prefix(' '))
        .ok_or_else(|| bad(n, format!("want {name:?}, found {l:?}")))?;
    Ok((n, value))
}

/// A canonical decimal number at most `max` (no sign, no leading zero, no spaces).
fn number((line, s): (usize, &str), max: u64) -> Result<u64, CheckpointError> {
    s.parse::<u64>()
        .ok()
        .filter(|v| v.to_string() == s && *v <= max)
        .ok_or_else(|| bad(line, format!("{s:?} is not a decimal number up to {max}")))
}

/// `segment A B BYTES`.
fn segment((line, l): (usize, &str)) -> Result<SegmentRef, CheckpointError> {
    let rest = l
        .strip_prefix("segment ")
        .ok_or_else(|| bad(line, format!("want a segment line, found {l:?}")))?;
    let mut f = rest.split(' ');
    let mut next = || {
        f.next()
            .ok_or_else(|| bad(line, "a segment line is: segment FIRST END BYTES"))
    };
    let first_seq = number((line, next()?), u64::MAX)?;
    let end_seq = number((line, next()?), u64::MAX)?;
    let bytes = number((line, next()?), u64::MAX)?;
    if f.next().is_some() {
        return Err(bad(line, "a segment line is: segment FIRST END BYTES"));
    }
    Ok(SegmentRef {
        first_seq,
        end_seq,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            shard: 3,
            count: 12000,
            claim: 4567,
            finished: false,
            segments: vec![
                SegmentRef {
                    first_seq: 0,
                    end_seq: 5000,
                    bytes: 612_345,
                },
                SegmentRef {
                    first_seq: 5000,
                    end_seq: 12000,
                    bytes: 702_345,
                },
            ],
        }
    }

    #[test]
    fn round_trips() {
        for c in [sample(), Checkpoint::empty(0), {
            let mut c = sample();
            c.finished = true;
            c.claim = u64::MAX;
            c
        }] {
            let bytes = c.encode();
            assert_eq!(Checkpoint::decode(&bytes), Ok(c));
        }
        let text = String::from_utf8(sample().encode()).unwrap();
        assert!(text.starts_with("qlist-checkpoint 1\nshard 3\ncount 12000\nclaim 4567\n"));
        assert!(text.contains("\nsegment 5000 12000 702345\ncrc32 "));
    }

    #[test]
    fn every_torn_prefix_is_refused() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Checkpoint::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn an_edit_is_refused_by_its_crc() {
        let text = String::from_utf8(sample().encode()).unwrap();
        let edited = text.replace("claim 4567", "claim 9567");
        let e = Checkpoint::decode(edited.as_bytes()).unwrap_err();
        assert!(e.reason.contains("crc32"), "{e}");
        assert_eq!(e.line, 8);
    }

    /// Re-encodes a body with a correct CRC, to test the field checks behind it.
    fn with_crc(body: &str) -> Vec<u8> {
        format!("{body}crc32 {:08x}\n", crc32fast::hash(body.as_bytes())).into_bytes()
    }

    #[test]
    fn bad_fields_name_their_line() {
        let head = "qlist-checkpoint 1\nshard 3\n";
        for (body, line, says) in [
            ("qlist-checkpoint 2\n", 1, "not a checkpoint"),
            ("qlist-checkpoint 1\nshard 03\n", 2, "decimal"),
            ("qlist-checkpoint 1\nshard 4294967296\n", 2, "decimal"),
            ("qlist-checkpoint 1\ncount 1\n", 2, "want \"shard\""),
            (
                &format!("{head}count 1\nclaim 5\nfinished 2\n"),
                5,
                "0 or 1",
            ),
            (
                &format!("{head}count 1\nclaim 5\nfinished 0\nsegment 0 1\n"),
                6,
                "FIRST END BYTES",
            ),
            (
                &format!("{head}count 2\nclaim 5\nfinished 0\nsegment 0 1 10\nsegment 2 3 10\n"),
                0,
                "does not follow",
            ),
            (
                &format!("{head}count 5\nclaim 5\nfinished 0\nsegment 0 1 10\n"),
                0,
                "count is 5",
            ),
            (
                &format!("{head}count 0\nclaim 5\nfinished 1\n"),
                0,
                "claim max",
            ),
        ] {
            let e = Checkpoint::decode(&with_crc(body)).unwrap_err();
            assert_eq!(e.line, line, "{body:?}: {e}");
            assert!(e.reason.contains(says), "{body:?}: {e}");
        }
    }

    #[test]
    fn foreign_bytes_are_refused() {
        for b in [&b""[..], b"\xff\xfe", b"QLIST002", b"crc32 00000000\n"] {
            assert!(Checkpoint::decode(b).is_err());
        }
    }
}
