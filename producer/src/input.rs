//! The producer's input: a file or stdin in one of two formats ([`InputFormat`]), or
//! generated items, read in batches.
//!
//! [`InputFormat::Lines`] (the default): one item per line; the line's bytes without the
//! `\n` are the payload (any bytes, not only UTF-8; a `\r` before the `\n` is kept). A last
//! line without `\n` is an item; an empty line is an item with an empty payload.
//!
//! [`InputFormat::Frames`]: each item is a little-endian u32 byte length followed by that
//! many bytes, so any bytes (newlines, NUL, nothing at all) are one item. A length above
//! [`MAX_ITEM_BYTES`] is refused before its bytes are read (nothing is allocated for it),
//! and input that ends inside a frame (in its 4 length bytes or in its body) is refused;
//! both errors name the byte offset at which the frame starts.

use crate::{ProducerError, MAX_ITEM_BYTES};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Read buffer for input files: large enough that syscalls do not matter.
const READ_BUFFER: usize = 1 << 20;

/// How the bytes of a file or stdin are cut into items (`--input-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputFormat {
    /// One item per line, the `\n` stripped (`--input-format lines`, the default).
    #[default]
    Lines,
    /// Each item a little-endian u32 length, then that many bytes (`--input-format frames`).
    Frames,
}

impl InputFormat {
    /// The name `--input-format` takes.
    pub fn name(self) -> &'static str {
        match self {
            InputFormat::Lines => "lines",
            InputFormat::Frames => "frames",
        }
    }
}

/// Bytes of a frame's length header.
pub const FRAME_HEADER: usize = 4;

/// Where items come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemInput {
    /// The items of this file, in the config's [`InputFormat`].
    File(PathBuf),
    /// The items of stdin, in the config's [`InputFormat`]. Not resumable: there is no way
    /// to check it is the same.
    Stdin,
    /// `count` synthetic items of `payload_size` bytes, see [`generate_payload`].
    Generate {
        /// Items to generate, all of them (`--generate`).
        count: u64,
        /// Bytes of each item (`--payload-size`), at most [`crate::MAX_ITEM_BYTES`].
        payload_size: usize,
    },
}

impl ItemInput {
    /// How the input is named in messages.
    pub fn describe(&self) -> String {
        match self {
            ItemInput::File(p) => p.display().to_string(),
            ItemInput::Stdin => "stdin".to_string(),
            ItemInput::Generate {
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

/// Reads `path` once: counts items, checks every item against [`MAX_ITEM_BYTES`] (so an
/// over-long line or frame is refused before anything is written), checks that the last
/// frame is whole (frames) and fingerprints the content.
///
/// # Errors
/// Unreadable file, a line or frame above the limit, a truncated last frame.
pub fn scan_file(path: &Path, format: InputFormat) -> Result<FileScan, ProducerError> {
    let input = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|error| ProducerError::Input {
        input: input.clone(),
        error,
    })?;
    let mut r = BufReader::with_capacity(READ_BUFFER, file);
    let mut hash = ContentHash::new();
    let mut counter = match format {
        InputFormat::Lines => Counter::Lines(LineCounter::default()),
        InputFormat::Frames => Counter::Frames(FrameCounter::default()),
    };
    loop {
        let buf = r.fill_buf().map_err(|error| ProducerError::Input {
            input: input.clone(),
            error,
        })?;
        if buf.is_empty() {
            break;
        }
        hash.update(buf);
        match &mut counter {
            Counter::Lines(c) => c.feed(buf, &input)?,
            Counter::Frames(c) => c.feed(buf, &input)?,
        }
        let n = buf.len();
        r.consume(n);
    }
    let items = match counter {
        Counter::Lines(c) => c.end(),
        Counter::Frames(c) => c.end(&input)?,
    };
    Ok(FileScan {
        bytes: hash.bytes,
        items,
        fingerprint: hash.fingerprint(format, items),
    })
}

/// The first pass's item counter, by format.
enum Counter {
    Lines(LineCounter),
    Frames(FrameCounter),
}

/// Counts lines and checks their length, buffer by buffer.
#[derive(Default)]
struct LineCounter {
    items: u64,
    line_len: usize,
}

impl LineCounter {
    fn feed(&mut self, buf: &[u8], input: &str) -> Result<(), ProducerError> {
        for &b in buf {
            if b == b'\n' {
                self.items += 1;
                self.line_len = 0;
            } else {
                self.line_len += 1;
                if self.line_len > MAX_ITEM_BYTES {
                    return Err(ProducerError::LineTooLong {
                        input: input.to_string(),
                        line: self.items + 1,
                        limit: MAX_ITEM_BYTES,
                    });
                }
            }
        }
        Ok(())
    }

    fn end(self) -> u64 {
        self.items + u64::from(self.line_len > 0)
    }
}

/// Walks frames buffer by buffer without keeping their bodies: a small state machine
/// (in a header, or skipping a body) that checks each length against the limit.
#[derive(Default)]
struct FrameCounter {
    items: u64,
    /// Byte offset of the frame being read.
    frame_at: u64,
    /// Header bytes of the current frame collected so far (0 between frames).
    header: [u8; FRAME_HEADER],
    have: usize,
    /// Body bytes of the current frame still to skip, once its header is complete.
    body_left: Option<u64>,
}

impl FrameCounter {
    fn feed(&mut self, mut buf: &[u8], input: &str) -> Result<(), ProducerError> {
        while !buf.is_empty() {
            match self.body_left {
                Some(left) => {
                    let skip = left.min(buf.len() as u64);
                    buf = &buf[skip as usize..];
                    self.body_left = Some(left - skip);
                }
                None => {
                    let take = (FRAME_HEADER - self.have).min(buf.len());
                    self.header[self.have..self.have + take].copy_from_slice(&buf[..take]);
                    self.have += take;
                    buf = &buf[take..];
                    if self.have == FRAME_HEADER {
                        let len = frame_length(self.header, input, self.items, self.frame_at)?;
                        self.body_left = Some(len);
                    }
                }
            }
            if self.body_left == Some(0) {
                self.next_frame();
            }
        }
        Ok(())
    }

    /// The current frame is whole: the next one starts after it.
    fn next_frame(&mut self) {
        let len = u64::from(u32::from_le_bytes(self.header));
        self.frame_at += FRAME_HEADER as u64 + len;
        self.items += 1;
        self.have = 0;
        self.body_left = None;
    }

    fn end(self, input: &str) -> Result<u64, ProducerError> {
        match self.body_left {
            None if self.have == 0 => Ok(self.items),
            None => Err(truncated(
                input,
                self.items,
                self.frame_at,
                format!("only {} of its {FRAME_HEADER} length bytes", self.have),
            )),
            Some(left) => {
                let len = u64::from(u32::from_le_bytes(self.header));
                Err(truncated(
                    input,
                    self.items,
                    self.frame_at,
                    format!("its length says {len} bytes, only {} follow", len - left),
                ))
            }
        }
    }
}

/// The length in a frame header, if it is within [`MAX_ITEM_BYTES`].
fn frame_length(
    header: [u8; FRAME_HEADER],
    input: &str,
    item: u64,
    offset: u64,
) -> Result<u64, ProducerError> {
    let len = u32::from_le_bytes(header);
    if len as usize > MAX_ITEM_BYTES {
        return Err(ProducerError::FrameTooLong {
            input: input.to_string(),
            item,
            offset,
            length: len,
            limit: MAX_ITEM_BYTES,
        });
    }
    Ok(u64::from(len))
}

fn truncated(input: &str, item: u64, offset: u64, what: String) -> ProducerError {
    ProducerError::TruncatedFrame {
        input: input.to_string(),
        item,
        offset,
        what,
    }
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

    /// The fingerprint stored in the progress marker, for content holding `items` items in
    /// `format`. Lines keep the spelling sublists were started with before frames existed.
    fn fingerprint(&self, format: InputFormat, items: u64) -> String {
        let kind = match format {
            InputFormat::Lines => "file",
            InputFormat::Frames => "frames file",
        };
        format!(
            "{kind} bytes={} items={items} crc32={:08x} fnv1a64={:016x}",
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
    format: InputFormat,
    input: String,
    /// Sequence number of the next item returned.
    next_seq: u64,
    /// Bytes of the file or stdin consumed by the items returned (frames: where the next
    /// frame starts, for messages).
    offset: u64,
    /// An error met after some items of a batch were read: returned by the next
    /// [`ItemReader::next_batch`], so that those items are written first.
    failed: Option<ProducerError>,
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
    /// Opens `spec` (a file or stdin read as `format`) and skips the items before
    /// `start_seq` (already in the sublist).
    ///
    /// # Errors
    /// Unreadable input, or input shorter than `start_seq` items.
    pub fn open(
        spec: &ItemInput,
        format: InputFormat,
        shard: u32,
        start_seq: u64,
    ) -> Result<ItemReader, ProducerError> {
        let input = spec.describe();
        let kind = match spec {
            ItemInput::File(p) => {
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
            ItemInput::Stdin => Kind::Lines(Box::new(BufReader::with_capacity(
                READ_BUFFER,
                std::io::stdin(),
            ))),
            ItemInput::Generate {
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
            format,
            input,
            next_seq: 0,
            offset: 0,
            failed: None,
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

    /// Where the next item is, for a person: `line 3`, or `the frame at byte offset 96`.
    pub fn place(&self) -> String {
        match (&self.kind, self.format) {
            (Kind::Generate { .. }, _) => format!("generated item {}", self.next_seq),
            (_, InputFormat::Lines) => format!("line {}", self.next_seq + 1),
            (_, InputFormat::Frames) => format!("the frame at byte offset {}", self.offset),
        }
    }

    /// The next item, or `None` at the end of the input.
    ///
    /// # Errors
    /// Read errors, a line or frame longer than [`MAX_ITEM_BYTES`], a truncated frame.
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
            Kind::File(r) => {
                let r: &mut dyn BufRead = r;
                match read_item(r, self.format, &self.input, self.next_seq, self.offset)? {
                    Some(item) => item,
                    None => return Ok(None),
                }
            }
            Kind::Lines(r) => {
                match read_item(
                    &mut **r,
                    self.format,
                    &self.input,
                    self.next_seq,
                    self.offset,
                )? {
                    Some(item) => item,
                    None => return Ok(None),
                }
            }
        };
        self.offset += match self.format {
            InputFormat::Lines => item.len() as u64 + 1,
            InputFormat::Frames => (FRAME_HEADER + item.len()) as u64,
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
        Some(r.get_ref().hash.fingerprint(self.format, self.next_seq))
    }

    /// Up to `max_items` items, stopping early once `max_bytes` payload bytes are
    /// collected. Empty at the end of the input.
    ///
    /// An error after some items were read (a truncated last frame on stdin, say) ends the
    /// batch with those items; the next call returns the error. So every whole item before
    /// a bad one is stamped and durable before the run stops.
    ///
    /// # Errors
    /// As [`ItemReader::next_item`].
    pub fn next_batch(
        &mut self,
        max_items: u64,
        max_bytes: usize,
    ) -> Result<Vec<Vec<u8>>, ProducerError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while (out.len() as u64) < max_items && bytes < max_bytes {
            match self.next_item() {
                Ok(Some(item)) => {
                    bytes += item.len();
                    out.push(item);
                }
                Ok(None) => break,
                Err(e) if out.is_empty() => return Err(e),
                Err(e) => {
                    self.failed = Some(e);
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// The next item of `r` in `format`, `None` at the end; `seq` and `offset` (where it
/// starts) name it in errors.
fn read_item(
    r: &mut dyn BufRead,
    format: InputFormat,
    input: &str,
    seq: u64,
    offset: u64,
) -> Result<Option<Vec<u8>>, ProducerError> {
    match format {
        InputFormat::Lines => read_line(r, input, seq),
        InputFormat::Frames => read_frame(r, input, seq, offset),
    }
}

/// One frame of `r` (the bytes after its length), `None` at a clean end (no byte of a
/// next frame). Memory is bounded by the limit: the length is checked before the body is
/// read, and the body grows only as its bytes actually arrive.
fn read_frame(
    r: &mut dyn BufRead,
    input: &str,
    seq: u64,
    offset: u64,
) -> Result<Option<Vec<u8>>, ProducerError> {
    let io = |error| ProducerError::Input {
        input: input.to_string(),
        error,
    };
    let mut header = [0u8; FRAME_HEADER];
    let have = read_up_to(r, &mut header).map_err(io)?;
    if have == 0 {
        return Ok(None);
    }
    if have < FRAME_HEADER {
        return Err(truncated(
            input,
            seq,
            offset,
            format!("only {have} of its {FRAME_HEADER} length bytes"),
        ));
    }
    let len = frame_length(header, input, seq, offset)?;
    let mut body = Vec::with_capacity(len.min(READ_BUFFER as u64) as usize);
    Read::take(r, len).read_to_end(&mut body).map_err(io)?;
    if (body.len() as u64) < len {
        return Err(truncated(
            input,
            seq,
            offset,
            format!("its length says {len} bytes, only {} follow", body.len()),
        ));
    }
    Ok(Some(body))
}

/// Fills `buf` from `r` as far as the input goes; returns the bytes read (less than
/// `buf.len()` only at the end of the input).
fn read_up_to(r: &mut dyn BufRead, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut have = 0;
    while have < buf.len() {
        match r.read(&mut buf[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(have)
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
        let scan = scan_file(&p, InputFormat::Lines).expect("scan");
        assert_eq!((scan.bytes, scan.items), (9, 4));
        let spec = ItemInput::File(p.clone());
        let mut r = ItemReader::open(&spec, InputFormat::Lines, 0, 0).expect("open");
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
        let mut r = ItemReader::open(&spec, InputFormat::Lines, 0, 2).expect("resume");
        assert_eq!(r.next_seq(), 2);
        assert_eq!(r.next_item().expect("item"), Some(b"b\r".to_vec()));
        assert!(matches!(
            ItemReader::open(&spec, InputFormat::Lines, 0, 5),
            Err(ProducerError::InputChanged { .. })
        ));
        // Batches stop at the byte cap.
        let mut r = ItemReader::open(&spec, InputFormat::Lines, 0, 0).expect("open");
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
        let scan = scan_file(&p, InputFormat::Lines).expect("scan");
        let spec = ItemInput::File(p.clone());
        let read_all = |edit: bool| {
            let mut r = ItemReader::open(&spec, InputFormat::Lines, 0, 0).expect("open");
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
            scan_file(&a, InputFormat::Lines).expect("a").fingerprint,
            scan_file(&b, InputFormat::Lines).expect("b").fingerprint
        );
        std::fs::write(&b, b"x\ny\n").expect("write");
        assert_eq!(
            scan_file(&a, InputFormat::Lines).expect("a").fingerprint,
            scan_file(&b, InputFormat::Lines).expect("b").fingerprint
        );
        assert!(matches!(
            scan_file(&dir.path().join("nope"), InputFormat::Lines),
            Err(ProducerError::Input { .. })
        ));
    }

    /// `items` as frames: each a u32 LE length, then its bytes.
    fn frames(items: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for item in items {
            out.extend_from_slice(&(item.len() as u32).to_le_bytes());
            out.extend_from_slice(item);
        }
        out
    }

    /// The first pass fed one byte at a time, as buffers may cut a frame anywhere.
    fn count_bytewise(bytes: &[u8]) -> Result<u64, ProducerError> {
        let mut c = FrameCounter::default();
        for b in bytes {
            c.feed(std::slice::from_ref(b), "t")?;
        }
        c.end("t")
    }

    #[test]
    fn frames_hold_any_bytes_and_resume() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("in");
        let items: [&[u8]; 5] = [b"a\nb", b"", b"\x00\x00", b"\xff\xfe\n", b"\n"];
        let bytes = frames(&items);
        std::fs::write(&p, &bytes).expect("write");
        let scan = scan_file(&p, InputFormat::Frames).expect("scan");
        assert_eq!((scan.bytes, scan.items), (bytes.len() as u64, 5));
        assert_eq!(count_bytewise(&bytes).expect("bytewise"), 5);
        assert!(
            scan.fingerprint.starts_with("frames file "),
            "{}",
            scan.fingerprint
        );
        assert_ne!(
            scan.fingerprint,
            scan_file(&p, InputFormat::Lines)
                .expect("lines")
                .fingerprint,
            "the same bytes as lines are another input"
        );
        let spec = ItemInput::File(p.clone());
        let mut r = ItemReader::open(&spec, InputFormat::Frames, 0, 0).expect("open");
        let want: Vec<Vec<u8>> = items.iter().map(|i| i.to_vec()).collect();
        assert_eq!(r.next_batch(10, 1 << 20).expect("batch"), want);
        assert!(r.next_batch(10, 1 << 20).expect("end").is_empty());
        assert_eq!(r.content_fingerprint(), Some(scan.fingerprint));
        let mut r = ItemReader::open(&spec, InputFormat::Frames, 0, 3).expect("resume");
        assert_eq!(r.place(), "the frame at byte offset 17");
        assert_eq!(r.next_item().expect("item"), Some(b"\xff\xfe\n".to_vec()));
    }

    #[test]
    fn a_truncated_frame_names_its_offset_after_the_whole_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("in");
        let whole = frames(&[b"one", b""]);
        let at = whole.len() as u64; // 11
        for (cut, what) in [
            (vec![7u8, 0], "only 2 of its 4 length bytes"),
            (
                vec![9, 0, 0, 0, b'x'],
                "its length says 9 bytes, only 1 follow",
            ),
        ] {
            let mut bytes = whole.clone();
            bytes.extend_from_slice(&cut);
            std::fs::write(&p, &bytes).expect("write");
            for e in [
                scan_file(&p, InputFormat::Frames).expect_err("scan"),
                count_bytewise(&bytes).expect_err("bytewise"),
            ] {
                match e {
                    ProducerError::TruncatedFrame {
                        item,
                        offset,
                        what: w,
                        ..
                    } => assert_eq!((item, offset, w.as_str()), (2, at, what)),
                    e => panic!("{e}"),
                }
            }
            let spec = ItemInput::File(p.clone());
            let mut r = ItemReader::open(&spec, InputFormat::Frames, 0, 0).expect("open");
            // The whole items come first, in their own batch; then the error.
            assert_eq!(
                r.next_batch(10, 1 << 20).expect("whole ones"),
                vec![b"one".to_vec(), vec![]]
            );
            let e = r.next_batch(10, 1 << 20).expect_err("the cut one");
            assert!(
                e.to_string()
                    .contains(&format!("truncated frame at byte offset {at}"))
                    && e.to_string().contains(what),
                "{e}"
            );
            assert_eq!(e.exit_code(), 3);
        }
    }

    #[test]
    fn a_frame_above_the_limit_is_refused_before_its_bytes_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("in");
        let mut bytes = frames(&[b"ok"]);
        // 4 GiB - 1 claimed, 3 bytes present: nothing of that size may be allocated.
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(b"abc");
        std::fs::write(&p, &bytes).expect("write");
        let limit = MAX_ITEM_BYTES;
        for e in [
            scan_file(&p, InputFormat::Frames).expect_err("scan"),
            count_bytewise(&bytes).expect_err("bytewise"),
            {
                let spec = ItemInput::File(p.clone());
                let mut r = ItemReader::open(&spec, InputFormat::Frames, 0, 0).expect("open");
                assert_eq!(r.next_batch(10, 1 << 20).expect("ok"), vec![b"ok".to_vec()]);
                r.next_batch(10, 1 << 20).expect_err("read")
            },
        ] {
            match &e {
                ProducerError::FrameTooLong {
                    item,
                    offset,
                    length,
                    limit: l,
                    ..
                } => assert_eq!((*item, *offset, *length, *l), (1, 6, u32::MAX, limit)),
                e => panic!("{e}"),
            }
            assert!(e.to_string().contains("byte offset 6"), "{e}");
        }
        // Exactly the limit is one item.
        let mut bytes = frames(&[]);
        bytes.extend_from_slice(&(limit as u32).to_le_bytes());
        bytes.resize(FRAME_HEADER + limit, b'z');
        std::fs::write(&p, &bytes).expect("write");
        assert_eq!(scan_file(&p, InputFormat::Frames).expect("scan").items, 1);
    }
}
