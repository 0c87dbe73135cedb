//! The producer's input: lines of a file or stdin, or generated items, read in batches.
//!
//! One item per line; the line's bytes without the `\n` are the payload (any bytes, not
//! only UTF-8; a `\r` before the `\n` is kept). A last line without `\n` is an item; an
//! empty line is an item with an empty payload.

use crate::{ProducerError, MAX_ITEM_BYTES};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Read buffer for input files: large enough that syscalls do not matter.
const READ_BUFFER: usize = 1 << 20;

/// Where items come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSpec {
    /// One item per line of this file.
    File(PathBuf),
    /// One item per line of stdin. Not resumable: there is no way to check it is the same.
    Stdin,
    /// `count` synthetic items of `payload_size` bytes, see [`generate_payload`].
    Generate {
        /// Items to generate, all of them (`--generate`).
        count: u64,
        /// Bytes of each item (`--payload-size`), at most [`crate::MAX_ITEM_BYTES`].
        payload_size: usize,
    },
}

impl InputSpec {
    /// How the input is named in messages.
    pub fn describe(&self) -> String {
        match self {
            InputSpec::File(p) => p.display().to_string(),
            InputSpec::Stdin => "stdin".to_string(),
            InputSpec::Generate {
                count,
                payload_size,
            } => format!("--generate {count} --payload-size {payload_size}"),
        }
    }
}

/// The deterministic payload of generated item `seq` of shard `shard`: `size` bytes,
/// starting with `"<shard>:<seq>:"` (cut to `size`) and filled with lowercase letters
/// from a SplitMix64 stream seeded by (shard, seq). Tests recompute items with it.
pub fn generate_payload(shard: u32, seq: u64, size: usize) -> Vec<u8> {
    let mut out = format!("{shard}:{seq}:").into_bytes();
    out.truncate(size);
    let mut state = (u64::from(shard) << 48) ^ seq ^ 0x5157_4c49_5354_0001;
    while out.len() < size {
        let mut z = {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            state
        };
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        for b in z.to_le_bytes() {
            if out.len() == size {
                break;
            }
            out.push(b'a' + b % 26);
        }
    }
    out
}

/// The input is a pipe, FIFO, socket or character device (what `<(zcat f.gz)` gives as
/// `/dev/fd/N`): it can be read only once, so it is read like stdin (no first pass, not
/// resumable) instead of being scanned and then read again.
///
/// # Errors
/// The path cannot be examined (missing, no permission).
pub fn is_stream(path: &Path) -> Result<bool, ProducerError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).map_err(|error| ProducerError::Input {
        input: path.display().to_string(),
        error,
    })?;
    let t = meta.file_type();
    Ok(t.is_fifo() || t.is_socket() || t.is_char_device())
}

/// Summary of an input file, computed in one pass before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileScan {
    /// The file's size in bytes.
    pub bytes: u64,
    /// Lines in the file: one item each.
    pub items: u64,
    /// Identifies the content (not the name): a moved file still resumes.
    pub fingerprint: String,
}

/// Reads `path` once: counts items, checks every line against [`MAX_ITEM_BYTES`] (so an
/// over-long line is refused before anything is written) and fingerprints the content.
///
/// # Errors
/// Unreadable file, or a line above the limit.
pub fn scan_file(path: &Path) -> Result<FileScan, ProducerError> {
    let file = std::fs::File::open(path).map_err(|error| ProducerError::Input {
        input: path.display().to_string(),
        error,
    })?;
    let mut r = BufReader::with_capacity(READ_BUFFER, file);
    let mut hash = ContentHash::new();
    let (mut items, mut line_len) = (0u64, 0usize);
    loop {
        let buf = r.fill_buf().map_err(|error| ProducerError::Input {
            input: path.display().to_string(),
            error,
        })?;
        if buf.is_empty() {
            break;
        }
        hash.update(buf);
        for &b in buf {
            if b == b'\n' {
                items += 1;
                line_len = 0;
            } else {
                line_len += 1;
                if line_len > MAX_ITEM_BYTES {
                    return Err(ProducerError::LineTooLong {
                        input: path.display().to_string(),
                        line: items + 1,
                        limit: MAX_ITEM_BYTES,
                    });
                }
            }
        }
        let n = buf.len();
        r.consume(n);
    }
    if line_len > 0 {
        items += 1;
    }
    Ok(FileScan {
        bytes: hash.bytes,
        items,
        fingerprint: hash.fingerprint(items),
    })
}

/// Size, CRC-32 and FNV-1a 64 of a file's content: the first pass computes it, and the
/// reading pass computes it again over what it actually read, so content edited in place
/// between the two (even at the same size and mtime) is caught.
#[derive(Clone)]
struct ContentHash {
    bytes: u64,
    crc: crc32fast::Hasher,
    fnv: u64,
}

impl ContentHash {
    fn new() -> ContentHash {
        ContentHash {
            bytes: 0,
            crc: crc32fast::Hasher::new(),
            fnv: 0xcbf2_9ce4_8422_2325,
        }
    }

    fn update(&mut self, buf: &[u8]) {
        self.bytes += buf.len() as u64;
        self.crc.update(buf);
        for &b in buf {
            self.fnv = (self.fnv ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The fingerprint stored in the progress marker, for content holding `items` items.
    fn fingerprint(&self, items: u64) -> String {
        format!(
            "file bytes={} items={items} crc32={:08x} fnv1a64={:016x}",
            self.bytes,
            self.crc.clone().finalize(),
            self.fnv
        )
    }
}

/// A file that hashes every byte read from it.
struct Hashing<R> {
    inner: R,
    hash: ContentHash,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Yields the items of an input in order, from a given sequence number on.
pub struct ItemReader {
    kind: Kind,
    input: String,
    /// Sequence number of the next item returned.
    next_seq: u64,
}

enum Kind {
    /// A file (or a pipe given by name), hashed as it is read.
    File(BufReader<Hashing<std::fs::File>>),
    /// stdin.
    Lines(Box<dyn BufRead + Send>),
    Generate {
        shard: u32,
        count: u64,
        payload_size: usize,
    },
}

impl ItemReader {
    /// Opens `spec` and skips the items before `start_seq` (already in the sublist).
    ///
    /// # Errors
    /// Unreadable input, or input shorter than `start_seq` items.
    pub fn open(spec: &InputSpec, shard: u32, start_seq: u64) -> Result<ItemReader, ProducerError> {
        let input = spec.describe();
        let kind = match spec {
            InputSpec::File(p) => {
                let f = std::fs::File::open(p).map_err(|error| ProducerError::Input {
                    input: input.clone(),
                    error,
                })?;
                Kind::File(BufReader::with_capacity(
                    READ_BUFFER,
                    Hashing {
                        inner: f,
                        hash: ContentHash::new(),
                    },
                ))
            }
            InputSpec::Stdin => Kind::Lines(Box::new(BufReader::with_capacity(
                READ_BUFFER,
                std::io::stdin(),
            ))),
            InputSpec::Generate {
                count,
                payload_size,
            } => Kind::Generate {
                shard,
                count: *count,
                payload_size: *payload_size,
            },
        };
        let mut r = ItemReader {
            kind,
            input,
            next_seq: 0,
        };
        match &r.kind {
            Kind::Generate { .. } => r.next_seq = start_seq,
            Kind::File(_) | Kind::Lines(_) => {
                while r.next_seq < start_seq {
                    if r.next_item()?.is_none() {
                        return Err(ProducerError::InputChanged {
                            input: r.input.clone(),
                            reason: format!(
                                "it has {} items, the sublist already holds {start_seq}",
                                r.next_seq
                            ),
                        });
                    }
                }
            }
        }
        Ok(r)
    }

    /// How the input is named in messages.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// Sequence number of the next item.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The next item, or `None` at the end of the input.
    ///
    /// # Errors
    /// Read errors, or a line longer than [`MAX_ITEM_BYTES`].
    pub fn next_item(&mut self) -> Result<Option<Vec<u8>>, ProducerError> {
        let item = match &mut self.kind {
            Kind::Generate {
                shard,
                count,
                payload_size,
            } => {
                if self.next_seq >= *count {
                    return Ok(None);
                }
                generate_payload(*shard, self.next_seq, *payload_size)
            }
            Kind::File(r) => match read_line(r, &self.input, self.next_seq)? {
                Some(line) => line,
                None => return Ok(None),
            },
            Kind::Lines(r) => match read_line(&mut **r, &self.input, self.next_seq)? {
                Some(line) => line,
                None => return Ok(None),
            },
        };
        self.next_seq += 1;
        Ok(Some(item))
    }

    /// The fingerprint of everything read from a file input, once its end was reached
    /// (`None` for other inputs or before the end): equal to [`scan_file`]'s fingerprint
    /// exactly when the content read is the content scanned.
    pub fn content_fingerprint(&mut self) -> Option<String> {
        let Kind::File(r) = &mut self.kind else {
            return None;
        };
        if !r.fill_buf().is_ok_and(|b| b.is_empty()) {
            return None;
        }
        Some(r.get_ref().hash.fingerprint(self.next_seq))
    }

    /// Up to `max_items` items, stopping early once `max_bytes` payload bytes are
    /// collected. Empty at the end of the input.
    ///
    /// # Errors
    /// As [`ItemReader::next_item`].
    pub fn next_batch(
        &mut self,
        max_items: u64,
        max_bytes: usize,
    ) -> Result<Vec<Vec<u8>>, ProducerError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while (out.len() as u64) < max_items && bytes < max_bytes {
            match self.next_item()? {
                Some(item) => {
                    bytes += item.len();
                    out.push(item);
                }
                None => break,
            }
        }
        Ok(out)
    }
}

/// One line of `r` without its `\n`, `None` at the end; `seq` numbers it in errors.
fn read_line(r: &mut dyn BufRead, input: &str, seq: u64) -> Result<Option<Vec<u8>>, ProducerError> {
    let mut buf = Vec::new();
    // Bounded read: a huge line costs at most the limit in memory before it is refused.
    let n = Read::take(r, MAX_ITEM_BYTES as u64 + 1)
        .read_until(b'\n', &mut buf)
        .map_err(|error| ProducerError::Input {
            input: input.to_string(),
            error,
        })?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    }
    if buf.len() > MAX_ITEM_BYTES {
        return Err(ProducerError::LineTooLong {
            input: input.to_string(),
            line: seq + 1,
            limit: MAX_ITEM_BYTES,
        });
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_payloads_are_deterministic() {
        assert_eq!(
            generate_payload(3, 17, 12),
            b"3:17:"
                .iter()
                .copied()
                .chain(generate_payload(3, 17, 12)[5..].iter().copied())
                .collect::<Vec<_>>()
        );
        assert_eq!(generate_payload(3, 17, 40), generate_payload(3, 17, 40));
        assert_ne!(generate_payload(3, 17, 40), generate_payload(4, 17, 40));
        assert_ne!(
            generate_payload(3, 17, 40)[6..],
            generate_payload(3, 18, 40)[6..]
        );
        assert_eq!(generate_payload(3, 17, 2), b"3:");
        assert_eq!(generate_payload(3, 17, 0), b"");
        assert_eq!(generate_payload(1, 1, 1000).len(), 1000);
        assert!(generate_payload(1, 1, 1000)[4..]
            .iter()
            .all(u8::is_ascii_lowercase));
    }

    #[test]
    fn lines_bytes_and_resume() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("in");
        std::fs::write(&p, b"a\n\nb\r\n\xff\x00c").expect("write");
        let scan = scan_file(&p).expect("scan");
        assert_eq!((scan.bytes, scan.items), (9, 4));
        let spec = InputSpec::File(p.clone());
        let mut r = ItemReader::open(&spec, 0, 0).expect("open");
        assert_eq!(
            r.next_batch(10, 1 << 20).expect("batch"),
            vec![
                b"a".to_vec(),
                vec![],
                b"b\r".to_vec(),
                b"\xff\x00c".to_vec()
            ]
        );
        assert!(r.next_batch(10, 1 << 20).expect("end").is_empty());
        let mut r = ItemReader::open(&spec, 0, 2).expect("resume");
        assert_eq!(r.next_seq(), 2);
        assert_eq!(r.next_item().expect("item"), Some(b"b\r".to_vec()));
        assert!(matches!(
            ItemReader::open(&spec, 0, 5),
            Err(ProducerError::InputChanged { .. })
        ));
        // Batches stop at the byte cap.
        let mut r = ItemReader::open(&spec, 0, 0).expect("open");
        assert_eq!(r.next_batch(10, 1).expect("batch").len(), 1);
    }

    #[test]
    fn what_was_read_is_fingerprinted_like_the_scan() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("in");
        // Three read buffers' worth, so the tail is read after the edit below.
        let line = [b'x'; 999];
        let mut content = Vec::new();
        for _ in 0..3 * READ_BUFFER / 1000 {
            content.extend_from_slice(&line);
            content.push(b'\n');
        }
        std::fs::write(&p, &content).expect("write");
        let scan = scan_file(&p).expect("scan");
        let spec = InputSpec::File(p.clone());
        let read_all = |edit: bool| {
            let mut r = ItemReader::open(&spec, 0, 0).expect("open");
            assert!(r.next_item().expect("item").is_some());
            assert_eq!(r.content_fingerprint(), None, "not at the end yet");
            if edit {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .expect("open");
                f.seek(SeekFrom::Start(content.len() as u64 - 10))
                    .expect("seek");
                f.write_all(b"y").expect("edit");
            }
            while r.next_item().expect("item").is_some() {}
            r.content_fingerprint().expect("at the end")
        };
        assert_eq!(read_all(false), scan.fingerprint);
        // Same size, edited in place after the first pass: the read content differs.
        assert_ne!(read_all(true), scan.fingerprint);
    }

    #[test]
    fn fingerprint_follows_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"x\ny\n").expect("write");
        std::fs::write(&b, b"x\nz\n").expect("write");
        assert_ne!(
            scan_file(&a).expect("a").fingerprint,
            scan_file(&b).expect("b").fingerprint
        );
        std::fs::write(&b, b"x\ny\n").expect("write");
        assert_eq!(
            scan_file(&a).expect("a").fingerprint,
            scan_file(&b).expect("b").fingerprint
        );
        assert!(matches!(
            scan_file(&dir.path().join("nope")),
            Err(ProducerError::Input { .. })
        ));
    }
}
