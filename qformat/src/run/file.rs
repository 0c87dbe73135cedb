//! Reading a run from a local file from start to end ([`RunFile`]).

use super::*;

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
