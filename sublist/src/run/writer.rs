//! Writing a run ([`RunWriter`], into any [`Write`]) and reading one from a local file
//! from start to end ([`RunFile`]).

use super::*;

/// Writes a run into any [`Write`]: blocks as records arrive, then index, shard table and
/// footer on [`RunWriter::finish`]. Deterministic: the same records, specs and part give
/// the same bytes. Where the bytes go, and making them appear atomically, is the caller's
/// (a temporary file renamed into place, or an S3 multipart upload).
pub struct RunWriter<W: Write> {
    out: W,
    check: WriteCheck,
    block: Vec<u8>,
    block_records: u32,
    block_first: u64,
    offset: u64,
    index: Vec<BlockEntry>,
}

impl<W: Write> RunWriter<W> {
    /// Starts a run holding records of the shards in `specs` with IDs in `part`'s range.
    ///
    /// # Errors
    /// Writing the header.
    pub fn new(mut out: W, specs: Vec<ShardSpec>, part: Part) -> Result<RunWriter<W>, RunError> {
        out.write_all(&MAGIC)?;
        Ok(RunWriter {
            out,
            check: WriteCheck::new(specs, part),
            block: Vec::with_capacity(BLOCK_TARGET + RECORD_HEAD_LEN + 4096),
            block_records: 0,
            block_first: 0,
            offset: HEADER_LEN,
            index: Vec::new(),
        })
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.check.records()
    }

    /// Bytes written so far (what is buffered in the open block included).
    pub fn bytes(&self) -> u64 {
        self.offset + self.block.len() as u64
    }

    /// Appends one record: its ID must be above the last one and inside the part's
    /// range, its shard one of the specs', its seq the next of its shard.
    ///
    /// # Errors
    /// [`RunError::Write`] for a record that breaks those rules, [`RunError::Io`].
    pub fn write(&mut self, r: &Record) -> Result<(), RunError> {
        self.check.record(r)?;
        if self.block_records == 0 {
            self.block_first = r.id;
        }
        self.block.extend_from_slice(&encode_record_head(r));
        self.block.extend_from_slice(&r.payload);
        self.block_records += 1;
        if self.block.len() >= BLOCK_TARGET {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> Result<(), RunError> {
        if self.block_records == 0 {
            return Ok(());
        }
        let crc = crc32fast::hash(&self.block);
        self.block.extend_from_slice(&crc.to_le_bytes());
        self.out.write_all(&self.block)?;
        // A block holds at most BLOCK_TARGET bytes plus one record of at most MAX_PAYLOAD:
        // far below u32::MAX.
        let len = self.block.len() as u32;
        debug_assert_eq!(len as usize, self.block.len());
        self.index.push(BlockEntry {
            first_id: self.block_first,
            last_id: self.check.last_id().unwrap_or(self.block_first),
            offset: self.offset,
            records: self.block_records,
            len,
        });
        self.offset += u64::from(len);
        self.block.clear();
        self.block_records = 0;
        Ok(())
    }

    /// Appends the blocks of another run, `meta` its metadata and `blocks` the bytes of its
    /// blocks (`HEADER_LEN..meta.footer.index_offset` of its file), as they are: its records
    /// must all lie above this run's and in its part's range, its shards among this run's
    /// and its seqs follow on. How `merger --jobs` joins the ranges it merged in parallel.
    ///
    /// # Errors
    /// [`RunError::Write`] if the appended run breaks those rules, [`RunError::Io`].
    pub fn append_run(
        &mut self,
        meta: &RunMeta,
        blocks: &mut impl io::Read,
    ) -> Result<(), RunError> {
        if meta.blocks.is_empty() {
            return Ok(());
        }
        // Before the check moves last_id: the open block's entry needs the old one.
        self.flush_block()?;
        self.check.run(meta)?;
        let len = meta.footer.index_offset - HEADER_LEN;
        let copied = io::copy(&mut io::Read::take(&mut *blocks, len), &mut self.out)?;
        if copied != len {
            return Err(RunError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("an appended run's blocks ended after {copied} of {len} bytes"),
            )));
        }
        let shift = self.offset - HEADER_LEN;
        self.index.extend(meta.blocks.iter().map(|b| BlockEntry {
            offset: b.offset + shift,
            ..*b
        }));
        self.offset += len;
        Ok(())
    }

    /// Closes the last block and writes index, shard table and footer; returns the sink
    /// and the run's metadata (what a reader will decode from its tail).
    ///
    /// # Errors
    /// [`RunError::Io`].
    pub fn finish(mut self) -> Result<(W, RunMeta), RunError> {
        self.flush_block()?;
        let shards = self.check.finish()?;
        let mut meta = Vec::with_capacity(
            self.index.len() * INDEX_ENTRY_LEN as usize + shards.len() * SHARD_ENTRY_LEN as usize,
        );
        for b in &self.index {
            meta.extend_from_slice(&b.first_id.to_le_bytes());
            meta.extend_from_slice(&b.last_id.to_le_bytes());
            meta.extend_from_slice(&b.offset.to_le_bytes());
            meta.extend_from_slice(&b.records.to_le_bytes());
            meta.extend_from_slice(&b.len.to_le_bytes());
        }
        for s in &shards {
            let flags = if s.finished { SHARD_FINISHED } else { 0 };
            meta.extend_from_slice(&s.shard.to_le_bytes());
            meta.extend_from_slice(&flags.to_le_bytes());
            meta.extend_from_slice(&s.first_seq.to_le_bytes());
            meta.extend_from_slice(&s.count.to_le_bytes());
            meta.extend_from_slice(&s.total.to_le_bytes());
        }
        let mut footer = Footer {
            index_offset: self.offset,
            blocks: self.index.len() as u64,
            shards: shards.len() as u64,
            records: self.check.records(),
            part: self.check.part(),
            flags: 0,
            meta_crc: 0,
        };
        let mut crc = crc32fast::Hasher::new();
        crc.update(&meta);
        crc.update(&footer.encode()[..60]);
        footer.meta_crc = crc.finalize();
        meta.extend_from_slice(&footer.encode());
        self.out.write_all(&meta)?;
        self.out.flush()?;
        let file_len = self.offset + meta.len() as u64;
        Ok((
            self.out,
            RunMeta {
                file_len,
                footer,
                blocks: self.index,
                shards,
            },
        ))
    }
}

/// A run in a local file, read from start to end with every check: its metadata from
/// the tail, then each block in order (for tools, tests and examples; the merger reads
/// runs anywhere, by ranges, through `qstore`).
pub struct RunFile {
    /// The run's metadata.
    pub meta: RunMeta,
    input: io::BufReader<std::fs::File>,
    path: std::path::PathBuf,
    next_block: usize,
    out: std::collections::VecDeque<Record>,
    failed: bool,
}

impl RunFile {
    /// Opens `path` and decodes its metadata.
    ///
    /// # Errors
    /// [`RunError::File`] on an I/O error, and the metadata's errors.
    pub fn open(path: &std::path::Path) -> Result<RunFile, RunError> {
        use std::io::{Read, Seek, SeekFrom};
        let file_err = |op: &'static str| {
            move |error| RunError::File {
                path: path.to_path_buf(),
                op,
                error,
            }
        };
        let mut file = std::fs::File::open(path).map_err(file_err("open"))?;
        let len = file.metadata().map_err(file_err("stat"))?.len();
        if len < HEADER_LEN + FOOTER_LEN {
            return Err(RunError::TooShort {
                len,
                min: HEADER_LEN + FOOTER_LEN,
            });
        }
        let mut footer = [0u8; FOOTER_LEN as usize];
        file.seek(SeekFrom::Start(len - FOOTER_LEN))
            .and_then(|_| file.read_exact(&mut footer))
            .map_err(file_err("read footer"))?;
        let meta_len = Footer::decode(&footer, len)?.meta_len(len);
        let mut tail = vec![0u8; meta_len as usize];
        file.seek(SeekFrom::Start(len - meta_len))
            .and_then(|_| file.read_exact(&mut tail))
            .map_err(file_err("read metadata"))?;
        let meta = RunMeta::decode(len, &tail)?;
        let mut head = [0u8; HEADER_LEN as usize];
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.read_exact(&mut head))
            .map_err(file_err("read header"))?;
        if head != MAGIC {
            return Err(RunError::BadMagic {
                offset: 0,
                found: head,
            });
        }
        Ok(RunFile {
            meta,
            input: io::BufReader::with_capacity(1 << 20, file),
            path: path.to_path_buf(),
            next_block: 0,
            out: std::collections::VecDeque::new(),
            failed: false,
        })
    }

    fn fill(&mut self) -> Result<(), RunError> {
        use std::io::Read;
        while self.out.is_empty() {
            let Some(b) = self.meta.blocks.get(self.next_block).copied() else {
                return Ok(());
            };
            let mut bytes = vec![0u8; b.len as usize];
            self.input
                .read_exact(&mut bytes)
                .map_err(|error| RunError::File {
                    path: self.path.clone(),
                    op: "read block",
                    error,
                })?;
            self.out
                .extend(decode_block(&bytes, &b, self.next_block as u64)?);
            self.next_block += 1;
        }
        Ok(())
    }
}

impl Iterator for RunFile {
    type Item = Result<Record, RunError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if let Err(e) = self.fill() {
            self.failed = true;
            return Some(Err(e));
        }
        self.out.pop_front().map(Ok)
    }
}
