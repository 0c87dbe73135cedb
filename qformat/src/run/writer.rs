//! Writing a run ([`RunWriter`], into any [`Write`]).

use super::*;

/// Writes a run into any [`Write`]: blocks as records arrive, then index, shard table and
/// footer on [`RunWriter::finish`]. Deterministic: the same records, specs and part give
/// the same bytes. Where the bytes go, and making them appear atomically, is the caller's
/// (a temporary file renamed into place, or an S3 multipart upload).
///
/// Where blocks end depends only on the records' bytes from the start of the list (the
/// *position*, CRCs not counted): a block closes after the record that reaches or passes
/// the next multiple of [`BLOCK_TARGET`]. So a range of the list written on its own
/// ([`RunWriter::range`], started at such a boundary with its position) has the blocks
/// the whole list has there, byte for byte: how `merger --jobs` writes its ranges in
/// parallel into their places and joins them ([`RunWriter::join_range`]).
pub struct RunWriter<W: Write> {
    out: W,
    check: WriteCheck,
    block: Vec<u8>,
    block_records: u32,
    block_first: u64,
    offset: u64,
    /// Record bytes of the list up to the open block's end (see the type's doc).
    position: u64,
    /// The position at which the open block closes.
    boundary: u64,
    index: Vec<BlockEntry>,
}

/// What [`RunWriter::finish_range`] wrote: a range's blocks, for [`RunWriter::join_range`].
#[derive(Debug, Clone)]
pub struct RangeWritten {
    /// Where it started.
    pub start: RangeStart,
    /// Where it ended: the file offset and position after its last block.
    pub end: RangeStart,
    /// Its blocks, at their offsets in the file.
    pub blocks: Vec<BlockEntry>,
    /// What it holds of each shard (every expected shard, maybe none of its items).
    pub shards: Vec<ShardEntry>,
    /// Records in it.
    pub records: u64,
}

impl<W: Write> RunWriter<W> {
    /// Starts a run holding records of the shards in `specs` with IDs in `part`'s range.
    ///
    /// # Errors
    /// Writing the header.
    pub fn new(mut out: W, specs: Vec<ShardSpec>, part: Part) -> Result<RunWriter<W>, RunError> {
        out.write_all(&MAGIC)?;
        Ok(RunWriter::range(out, specs, part, RangeStart::FIRST))
    }

    /// Starts a *segment*: a run holding exactly the seqs `first_seq..end_seq` of `shard`
    /// (DESIGN.md, "The list while it grows"), a whole list whose shard entry says first
    /// seq `first_seq`, total `end_seq`, not finished. [`RunWriter::finish`] refuses it
    /// unless every one of those seqs was written.
    ///
    /// # Errors
    /// Writing the header.
    pub fn segment(
        mut out: W,
        shard: u32,
        first_seq: u64,
        end_seq: u64,
    ) -> Result<RunWriter<W>, RunError> {
        out.write_all(&MAGIC)?;
        let mut w = RunWriter::range(
            out,
            Vec::new(),
            Part::WHOLE,
            RangeStart {
                offset: HEADER_LEN,
                position: 0,
            },
        );
        w.check = WriteCheck::segment(shard, first_seq, end_seq);
        Ok(w)
    }

    /// Replaces the part and the shards' specs before [`RunWriter::finish`], for a list
    /// whose ID range and shard totals are learned while it is written (a follower's
    /// part): see [`WriteCheck::restate`].
    ///
    /// # Errors
    /// [`RunError::Restate`] when the records written do not fit them.
    pub fn restate(&mut self, part: Part, specs: Vec<ShardSpec>) -> Result<(), RunError> {
        self.check.restate(part, specs)
    }

    /// The last ID written, if any.
    pub fn last_id(&self) -> Option<u64> {
        self.check.last_id()
    }

    /// A writer of one range of a list: blocks only, the first at `start`, records in
    /// `range` (a part of the list: its IDs). No header is written; end it with
    /// [`RunWriter::finish_range`].
    pub fn range(out: W, specs: Vec<ShardSpec>, range: Part, start: RangeStart) -> RunWriter<W> {
        RunWriter {
            out,
            check: WriteCheck::new(specs, range),
            block: Vec::with_capacity(BLOCK_TARGET + RECORD_HEAD_LEN + 4096),
            block_records: 0,
            block_first: 0,
            offset: start.offset,
            position: start.position,
            boundary: next_boundary(start.position),
            index: Vec::new(),
        }
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.check.records()
    }

    /// The sink (to move a file's write position past bytes written into it elsewhere,
    /// [`RunWriter::join_range`]).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Where the open block starts in the file: the bytes of the blocks closed so far.
    pub fn block_offset(&self) -> u64 {
        self.offset
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
        let head = encode_record_head(r);
        self.check
            .record_fields(r.id, r.shard, r.seq, r.payload.len())?;
        self.push(r.id, &head, &r.payload)
    }

    /// [`RunWriter::write`] of a borrowed record, copied as it is encoded.
    ///
    /// # Errors
    /// As [`RunWriter::write`].
    pub fn write_ref(&mut self, r: &RecordRef<'_>) -> Result<(), RunError> {
        self.check
            .record_fields(r.id, r.shard, r.seq, r.payload.len())?;
        self.push(r.id, r.encoded, &[])
    }

    /// Appends records already encoded one after another (a stretch of a checked block,
    /// [`check_block`]): each is checked as [`RunWriter::write`] checks it, and the bytes
    /// between block boundaries are copied in one piece.
    ///
    /// # Errors
    /// As [`RunWriter::write`]; the records before the one refused are written.
    pub fn write_encoded(&mut self, bytes: &[u8]) -> Result<(), RunError> {
        let (mut copied, mut pos) = (0usize, 0usize);
        for r in BlockRecords::new(bytes) {
            pos += r.encoded.len();
            if let Err(e) = self
                .check
                .record_fields(r.id, r.shard, r.seq, r.payload.len())
            {
                self.block
                    .extend_from_slice(&bytes[copied..pos - r.encoded.len()]);
                return Err(e);
            }
            if self.block_records == 0 {
                self.block_first = r.id;
            }
            self.block_records += 1;
            self.position += r.encoded.len() as u64;
            if self.position >= self.boundary {
                self.block.extend_from_slice(&bytes[copied..pos]);
                copied = pos;
                self.flush_block()?;
            }
        }
        self.block.extend_from_slice(&bytes[copied..pos]);
        Ok(())
    }

    /// Adds one checked record's bytes (`head` then `payload`) to the open block.
    fn push(&mut self, id: u64, head: &[u8], payload: &[u8]) -> Result<(), RunError> {
        if self.block_records == 0 {
            self.block_first = id;
        }
        self.block.extend_from_slice(head);
        self.block.extend_from_slice(payload);
        self.block_records += 1;
        self.position += (head.len() + payload.len()) as u64;
        if self.position >= self.boundary {
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
        self.boundary = next_boundary(self.position);
        self.block.clear();
        self.block_records = 0;
        Ok(())
    }

    /// Appends the blocks of another run, `meta` its metadata and `blocks` the bytes of its
    /// blocks (`HEADER_LEN..meta.footer.index_offset` of its file), as they are: its records
    /// must all lie above this run's and in its part's range, its shards among this run's
    /// and its seqs follow on.
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
        copy_exactly(blocks, &mut self.out, len)?;
        let shift = self.offset - HEADER_LEN;
        self.index.extend(meta.blocks.iter().map(|b| BlockEntry {
            offset: b.offset + shift,
            ..*b
        }));
        self.offset += len;
        self.position += len - meta.blocks.len() as u64 * BLOCK_CRC_LEN;
        self.boundary = next_boundary(self.position);
        Ok(())
    }

    /// Closes a range's last block ([`RunWriter::range`], begun at `start`); returns the
    /// sink and what the range holds.
    ///
    /// # Errors
    /// [`RunError::Io`].
    pub fn finish_range(mut self, start: RangeStart) -> Result<(W, RangeWritten), RunError> {
        self.flush_block()?;
        self.out.flush()?;
        let written = RangeWritten {
            start,
            end: RangeStart {
                offset: self.offset,
                position: self.position,
            },
            blocks: self.index,
            shards: self.check.table(),
            records: self.check.records(),
        };
        Ok((self.out, written))
    }

    /// Takes a range written by another writer ([`RunWriter::range`]) as the next part
    /// of this run. Its blocks must already be in place right after this writer's, unless
    /// `bytes` gives them, which are then copied in (`range.end.offset -
    /// range.start.offset` of them). Its records must lie above this run's, its shards'
    /// seqs follow on, and it must start exactly where this run ends (offset and position).
    ///
    /// # Errors
    /// [`RunError::Write`] if the range breaks those rules, [`RunError::Io`].
    pub fn join_range(
        &mut self,
        range: &RangeWritten,
        bytes: Option<&mut dyn io::Read>,
    ) -> Result<(), RunError> {
        self.flush_block()?;
        let here = RangeStart {
            offset: self.offset,
            position: self.position,
        };
        if range.start != here {
            return Err(RunError::Io(io::Error::other(format!(
                "a range written apart starts at {:?}, but the list before it ends at {here:?}",
                range.start
            ))));
        }
        let (Some(first), Some(last)) = (range.blocks.first(), range.blocks.last()) else {
            return Ok(());
        };
        self.check
            .span(first.first_id, last.last_id, &range.shards, range.records)?;
        if let Some(bytes) = bytes {
            copy_exactly(bytes, &mut self.out, range.end.offset - range.start.offset)?;
        }
        self.index.extend_from_slice(&range.blocks);
        self.offset = range.end.offset;
        self.position = range.end.position;
        self.boundary = next_boundary(self.position);
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

/// Copies exactly `len` bytes from `from` to `to`.
fn copy_exactly<R: io::Read + ?Sized>(
    from: &mut R,
    to: &mut impl Write,
    len: u64,
) -> Result<(), RunError> {
    let copied = io::copy(&mut io::Read::take(&mut *from, len), to)?;
    if copied != len {
        return Err(RunError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("an appended run's blocks ended after {copied} of {len} bytes"),
        )));
    }
    Ok(())
}
