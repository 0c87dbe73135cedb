//! One framed connection, used by both ends of the broker protocol: the broker's
//! connections (`broker` crate) and the broker client (`idclient::broker_client`).
//!
//! - [`FrameReader`]: cancel-safe reading of whole frames through its own buffer, with a
//!   deadline on every partial frame (the frame timeout).
//! - [`FrameWriter`]: encodes frames into one buffer and writes them in as few system
//!   calls as possible ([`FrameWriter::write_batch`] drains a queue into one write of at
//!   most about [`WRITE_BUF`] bytes), every write bounded by the write timeout.
//! - [`split`]: a TCP stream as a reader and a writer, Nagle off.
//!
//! The bytes on the wire are exactly those of [`crate::wire::encode`]; this module only
//! decides when they are read and written.

use crate::wire::{decode, encode, WireError, HEADER_LEN, MAX_FRAME_LEN};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{timeout, timeout_at, Instant};

/// Initial read buffer of a [`FrameReader`]: a few hundred pipelined requests per read
/// system call. It grows only to hold one larger frame, never beyond
/// [`HEADER_LEN`] + [`MAX_FRAME_LEN`].
pub const READ_BUF: usize = 16 * 1024;

/// A [`FrameWriter`] writes what it has once this much is buffered, even if more frames
/// are queued: a burst cannot grow the buffer without bound (at most this plus one
/// frame), and one write of 64 KiB already amortises the system call.
pub const WRITE_BUF: usize = 64 * 1024;

/// Default time from the first byte of a frame (header included) to its last. A frame
/// is at most 64 KiB, so a live peer sends one in far less; a half-sent frame must not
/// hold a connection forever.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// Default time one write may block: a peer that does not read for this long is gone.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The two limits of a framed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// See [`FRAME_TIMEOUT`].
    pub frame: Duration,
    /// See [`WRITE_TIMEOUT`].
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            frame: FRAME_TIMEOUT,
            write: WRITE_TIMEOUT,
        }
    }
}

/// Splits `stream` into a [`FrameReader`] and a [`FrameWriter`], with Nagle's algorithm
/// off (requests and replies are small and latency-bound; the writer batches itself).
///
/// # Errors
/// If the socket option cannot be set.
pub fn split(
    stream: TcpStream,
    timeouts: Timeouts,
) -> std::io::Result<(FrameReader<OwnedReadHalf>, FrameWriter<OwnedWriteHalf>)> {
    stream.set_nodelay(true)?;
    let (rd, wr) = stream.into_split();
    Ok((
        FrameReader::new(rd, timeouts.frame),
        FrameWriter::new(wr, timeouts.write),
    ))
}

/// Reads frames from a byte stream through its own buffer, so that reading is cancel
/// safe: every `.await` is one `read` into the buffer, and a frame is taken out only once
/// it is whole. Dropping a [`FrameReader::read_msg`] or [`FrameReader::fill`] future (a
/// lost `select!` branch, a timeout) loses nothing; the next call goes on where it
/// stopped. A partial frame is normal, not an error, but it has a deadline:
/// [`FrameReader::frame_deadline`], which [`FrameReader::read_msg`] enforces and callers
/// with their own `select!` (the broker) race.
///
/// The length is checked as soon as the 4 header bytes are in, before any payload is
/// read, and the buffer never grows beyond one maximal frame.
#[derive(Debug)]
pub struct FrameReader<R> {
    rd: R,
    /// Buffered bytes are `buf[start..end]`; `buf.len()` is the current capacity.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    frame_timeout: Duration,
    /// When the last read returned bytes.
    filled_at: Instant,
    /// When the first buffered byte of the frame at the head of the buffer was read;
    /// `None` when nothing is buffered.
    frame_started: Option<Instant>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader over `rd` with a [`READ_BUF`] buffer; a partial frame may take
    /// `frame_timeout` from its first byte to its last.
    pub fn new(rd: R, frame_timeout: Duration) -> FrameReader<R> {
        FrameReader {
            rd,
            buf: vec![0; READ_BUF],
            start: 0,
            end: 0,
            frame_timeout,
            filled_at: Instant::now(),
            frame_started: None,
        }
    }

    /// The frame timeout this reader was made with.
    pub fn frame_timeout(&self) -> Duration {
        self.frame_timeout
    }

    /// Bytes buffered that are not part of a message already returned.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// True if part of a frame (header included) is buffered, waiting for the rest.
    /// (Whole buffered frames are taken first by [`FrameReader::next_msg`].)
    pub fn partial(&self) -> bool {
        self.buffered() > 0
    }

    /// When the frame being received must be complete: its first byte's arrival plus
    /// the frame timeout. `None` while no byte of a frame is buffered.
    pub fn frame_deadline(&self) -> Option<Instant> {
        if !self.partial() {
            return None;
        }
        self.frame_started.map(|t| t + self.frame_timeout)
    }

    /// The payload length of the frame at the head of the buffer, once its header is in.
    fn head_len(&self) -> Result<Option<usize>, WireError> {
        if self.buffered() < HEADER_LEN {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        let len = u32::from_le_bytes(header);
        if len > MAX_FRAME_LEN {
            return Err(WireError::TooLarge {
                len: u64::from(len),
            });
        }
        Ok(Some(len as usize))
    }

    /// Decodes the next message if a whole frame is buffered; never reads.
    ///
    /// # Errors
    /// [`WireError::TooLarge`] for a header above [`MAX_FRAME_LEN`] (as soon as the
    /// header is buffered), [`WireError::Decode`] for a bad payload (the frame is
    /// consumed either way).
    pub fn next_msg<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        self.next_with(decode)
    }

    /// [`FrameReader::next_msg`] with the payload decoded by `decode` (the broker's
    /// [`crate::wire::decode_client`], which also understands old Hellos).
    ///
    /// # Errors
    /// As [`FrameReader::next_msg`], with `decode`'s errors for a bad payload.
    pub fn next_with<T>(
        &mut self,
        decode: impl FnOnce(&[u8]) -> Result<T, WireError>,
    ) -> Result<Option<T>, WireError> {
        let Some(len) = self.head_len()? else {
            return Ok(None);
        };
        if self.buffered() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.start + HEADER_LEN..self.start + HEADER_LEN + len;
        self.start = payload.end;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            self.frame_started = None;
        } else {
            // The bytes after it came with the last read at the latest.
            self.frame_started = Some(self.filled_at);
        }
        decode(&self.buf[payload]).map(Some)
    }

    /// One `read` into the buffer: the number of bytes read, 0 at end of stream.
    /// Cancel safe. Reads at most up to the end of the buffer, which is first made large
    /// enough for the frame being read (so a call always makes room to progress).
    ///
    /// # Errors
    /// I/O errors; [`WireError::TooLarge`] for a header above [`MAX_FRAME_LEN`].
    pub async fn fill(&mut self) -> Result<usize, WireError> {
        self.make_room()?;
        let n = self.rd.read(&mut self.buf[self.end..]).await?;
        if n > 0 {
            self.end += n;
            self.filled_at = Instant::now();
            self.frame_started.get_or_insert(self.filled_at);
        }
        Ok(n)
    }

    /// Makes room after the buffered bytes for the rest of the frame being read.
    fn make_room(&mut self) -> Result<(), WireError> {
        let need = HEADER_LEN + self.head_len()?.unwrap_or(0);
        if self.buf.len() - self.start < need || self.end == self.buf.len() {
            // The frame does not fit where it starts, or whole frames were taken and
            // the partial one at the end still fits: move it to the front (and grow
            // the buffer if the frame needs it).
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            }
        }
        if self.end == self.buf.len() {
            // Only when whole frames were left unread (callers take them with next_msg
            // first): room for one more read rather than a false end of stream.
            debug_assert!(false, "fill called with whole frames buffered");
            self.buf.resize(self.end + READ_BUF, 0);
        }
        Ok(())
    }

    /// Reads until one whole message is buffered and decodes it. `Ok(None)` is a clean
    /// end of stream (at a frame boundary). Cancel safe (see [`FrameReader`]).
    ///
    /// # Errors
    /// I/O errors, [`WireError::Truncated`] on end of stream inside a frame,
    /// [`WireError::FrameTimeout`] if a frame is not complete by its
    /// [`FrameReader::frame_deadline`], and as [`FrameReader::next_msg`].
    pub async fn read_msg<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        loop {
            if let Some(msg) = self.next_msg()? {
                return Ok(Some(msg));
            }
            let n = match self.frame_deadline() {
                None => self.fill().await?,
                Some(until) => match timeout_at(until, self.fill()).await {
                    Ok(n) => n?,
                    Err(_) => return Err(WireError::FrameTimeout(self.frame_timeout)),
                },
            };
            if n == 0 {
                return if self.partial() {
                    Err(WireError::Truncated)
                } else {
                    Ok(None)
                };
            }
        }
    }
}

/// Writes frames through one buffer: [`FrameWriter::push`] encodes, [`FrameWriter::flush`]
/// writes everything pushed in one `write_all`, bounded by the write timeout.
///
/// Not cancel safe: a flush dropped midway may have written part of a frame, so the
/// connection is unusable after it. Race writes only with the end of the connection.
#[derive(Debug)]
pub struct FrameWriter<W> {
    wr: W,
    buf: Vec<u8>,
    write_timeout: Duration,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer over `wr` whose every write must finish within `write_timeout`.
    pub fn new(wr: W, write_timeout: Duration) -> FrameWriter<W> {
        FrameWriter {
            wr,
            buf: Vec::with_capacity(WRITE_BUF),
            write_timeout,
        }
    }

    /// Bytes pushed and not yet written.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// True once [`WRITE_BUF`] bytes are buffered: time to write.
    pub fn is_full(&self) -> bool {
        self.buf.len() >= WRITE_BUF
    }

    /// Encodes `msg` as one frame after those already buffered.
    ///
    /// # Errors
    /// As [`crate::wire::encode`]; the buffer is then left as it was.
    pub fn push<T: Serialize>(&mut self, msg: &T) -> Result<(), WireError> {
        encode(msg, &mut self.buf)
    }

    /// Writes everything buffered (nothing if the buffer is empty), and flushes the
    /// stream: a TLS stream may hold the last record until flushed (a TCP one holds
    /// nothing, so that costs it nothing).
    ///
    /// # Errors
    /// I/O errors; [`WireError::WriteTimeout`] if the peer does not take the bytes
    /// within the write timeout.
    pub async fn flush(&mut self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let write = async {
            self.wr.write_all(&self.buf).await?;
            self.wr.flush().await
        };
        match timeout(self.write_timeout, write).await {
            Err(_) => return Err(WireError::WriteTimeout(self.write_timeout)),
            Ok(r) => r?,
        }
        self.buf.clear();
        Ok(())
    }

    /// Pushes `msg` and flushes: for one-shot exchanges (a handshake).
    ///
    /// # Errors
    /// As [`FrameWriter::push`] and [`FrameWriter::flush`].
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), WireError> {
        self.push(msg)?;
        self.flush().await
    }

    /// Waits for the next item of `rx`, then hands it and every item already queued to
    /// `push` (which encodes it with [`FrameWriter::push`]) until the queue is empty or
    /// the buffer is full, and writes the lot in one flush. Returns the number of items
    /// written; 0 once `rx` is closed and empty.
    ///
    /// # Errors
    /// What `push` returns (nothing is written then), and as [`FrameWriter::flush`].
    pub async fn write_batch<M>(
        &mut self,
        rx: &mut mpsc::Receiver<M>,
        mut push: impl FnMut(&mut Self, M) -> Result<(), WireError>,
    ) -> Result<usize, WireError> {
        let Some(first) = rx.recv().await else {
            return Ok(0);
        };
        push(self, first)?;
        let mut items = 1;
        while !self.is_full() {
            let Ok(next) = rx.try_recv() else {
                break;
            };
            push(self, next)?;
            items += 1;
        }
        self.flush().await?;
        Ok(items)
    }

    /// Flushes, then shuts down the write side (the peer reads end of stream), within
    /// the write timeout.
    ///
    /// # Errors
    /// As [`FrameWriter::flush`].
    pub async fn shutdown(&mut self) -> Result<(), WireError> {
        self.flush().await?;
        match timeout(self.write_timeout, self.wr.shutdown()).await {
            Err(_) => Err(WireError::WriteTimeout(self.write_timeout)),
            Ok(r) => Ok(r?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ClientMsg, ServerMsg};
    use crate::IdRange;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};
    use tokio::io::ReadBuf;

    const LONG: Duration = Duration::from_secs(3600);

    fn frame<T: Serialize>(msg: &T) -> Vec<u8> {
        let mut out = Vec::new();
        encode(msg, &mut out).expect("encode");
        out
    }

    fn next_ids(id: u64) -> ClientMsg {
        ClientMsg::NextIds {
            id,
            count: 1,
            deadline_ms: 0,
        }
    }

    /// A `read_msg` dropped mid-frame (the lost branch of a `select!`) loses nothing: the
    /// header and payload bytes it had read are kept and the next call returns the frame.
    #[tokio::test(start_paused = true)]
    async fn reader_is_cancel_safe_in_select() {
        let (mut tx, rx) = tokio::io::duplex(1024);
        let mut reader = FrameReader::new(rx, LONG);
        let bytes = frame(&next_ids(9));
        // Every split point: 1 byte of the header, the whole header, part of the payload.
        for cut in [1, HEADER_LEN, HEADER_LEN + 3] {
            tx.write_all(&bytes[..cut]).await.expect("write");
            let mut other = std::pin::pin!(tokio::time::sleep(Duration::from_millis(20)));
            tokio::select! {
                biased;
                msg = reader.read_msg::<ClientMsg>() => panic!("a partial frame is not a message: {msg:?}"),
                () = &mut other => {}
            }
            assert!(reader.partial());
            tx.write_all(&bytes[cut..]).await.expect("write");
            assert_eq!(
                reader.read_msg::<ClientMsg>().await.expect("read"),
                Some(next_ids(9)),
                "cut at {cut}"
            );
            assert!(!reader.partial());
            assert_eq!(reader.frame_deadline(), None);
        }
        drop(tx);
        assert_eq!(reader.read_msg::<ClientMsg>().await.expect("eof"), None);
    }

    #[tokio::test]
    async fn reader_reads_pipelined_frames_and_big_ones() {
        let mut bytes = Vec::new();
        // Enough small frames to wrap the buffer several times, then a maximal one.
        let n = 3 * READ_BUF as u64 / 28;
        for id in 0..n {
            encode(&next_ids(id), &mut bytes).expect("encode");
        }
        let big = ServerMsg::Refused {
            reason: "x".repeat(MAX_FRAME_LEN as usize - 12),
        };
        encode(&big, &mut bytes).expect("encode the largest frame");
        encode(&ServerMsg::ids(1, IdRange { lo: 1, hi: 1 }), &mut bytes).expect("encode");
        // Odd-sized chunks so frames straddle reads.
        let mut r = FrameReader::new(ChunkedReader::new(&bytes, 1000), LONG);
        for id in 0..n {
            let msg: ClientMsg = r.read_msg().await.expect("read").expect("a frame");
            assert_eq!(msg, next_ids(id));
        }
        match r.read_msg::<ServerMsg>().await {
            Ok(Some(ServerMsg::Refused { reason })) => assert_eq!(reason.len(), 65524),
            other => panic!("expected the big frame, got {other:?}"),
        }
        assert!(r.buf.len() <= HEADER_LEN + MAX_FRAME_LEN as usize);
        assert!(matches!(
            r.read_msg::<ServerMsg>().await,
            Ok(Some(ServerMsg::Ids { id: 1, .. }))
        ));
        assert!(matches!(r.read_msg::<ServerMsg>().await, Ok(None)));
    }

    #[tokio::test]
    async fn reader_rejects_an_oversized_header_at_once_and_truncation() {
        // Only the header: the reader must not wait for a payload it will never accept.
        let big = (MAX_FRAME_LEN + 1).to_le_bytes();
        let mut r = FrameReader::new(&big[..], LONG);
        assert!(matches!(
            r.read_msg::<ClientMsg>().await,
            Err(WireError::TooLarge { len }) if len == u64::from(MAX_FRAME_LEN) + 1
        ));
        let bytes = frame(&next_ids(1));
        for cut in [1, HEADER_LEN, bytes.len() - 1] {
            let mut r = FrameReader::new(&bytes[..cut], LONG);
            assert!(matches!(
                r.read_msg::<ClientMsg>().await,
                Err(WireError::Truncated)
            ));
        }
        // A frame of exactly the maximum is accepted (it is the payload that is bad).
        let mut max = MAX_FRAME_LEN.to_le_bytes().to_vec();
        max.resize(HEADER_LEN + MAX_FRAME_LEN as usize, 0xff);
        let mut r = FrameReader::new(&max[..], LONG);
        assert!(matches!(
            r.read_msg::<ClientMsg>().await,
            Err(WireError::Decode(_))
        ));
    }

    /// A partial frame must be complete within the frame timeout of its first byte; a
    /// silent connection with nothing partial waits as long as it likes.
    #[tokio::test(start_paused = true)]
    async fn partial_frame_times_out_from_its_first_byte() {
        let timeout = Duration::from_millis(300);
        let (mut tx, rx) = tokio::io::duplex(1024);
        let mut reader = FrameReader::new(rx, timeout);
        // Nothing partial: no deadline, however long the silence.
        let idle = tokio::time::timeout(Duration::from_secs(60), reader.read_msg::<ClientMsg>());
        assert!(idle.await.is_err(), "no frame was sent");
        assert_eq!(reader.frame_deadline(), None);

        // A whole frame, then the first byte of the next: only that one has a deadline.
        let bytes = frame(&next_ids(1));
        let mut two = bytes.clone();
        two.push(bytes[0]);
        let t0 = Instant::now();
        tx.write_all(&two).await.expect("write");
        assert_eq!(
            reader.read_msg::<ClientMsg>().await.expect("1"),
            Some(next_ids(1))
        );
        assert_eq!(reader.frame_deadline(), Some(t0 + timeout));
        // More bytes of the frame do not push its deadline back.
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.write_all(&bytes[1..5]).await.expect("write");
        match reader.read_msg::<ClientMsg>().await {
            Err(WireError::FrameTimeout(d)) => assert_eq!(d, timeout),
            other => panic!("expected a frame timeout, got {other:?}"),
        }
        let late = Instant::now() - (t0 + timeout);
        assert!(
            late < Duration::from_millis(5),
            "timed out {late:?} after the deadline"
        );
    }

    /// Counts the write calls it gets; accepts everything, or nothing when `stuck`.
    #[derive(Clone, Default)]
    struct Sink {
        writes: Arc<Mutex<Vec<usize>>>,
        bytes: Arc<Mutex<Vec<u8>>>,
        stuck: bool,
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            if self.stuck {
                return Poll::Pending;
            }
            self.writes.lock().expect("lock").push(buf.len());
            self.bytes.lock().expect("lock").extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Everything queued goes out in writes of about WRITE_BUF, not one per frame, and
    /// the bytes are exactly the frames in queue order.
    #[tokio::test]
    async fn writer_batches_many_small_frames_into_few_writes() {
        let sink = Sink::default();
        let mut w = FrameWriter::new(sink.clone(), LONG);
        let n = 10_000u64;
        let (tx, mut rx) = mpsc::channel(n as usize);
        let mut want = Vec::new();
        for id in 0..n {
            tx.try_send(next_ids(id)).expect("queue");
            encode(&next_ids(id), &mut want).expect("encode");
        }
        drop(tx);
        let mut batches = 0;
        loop {
            let items = w
                .write_batch(&mut rx, |w, m| w.push(&m))
                .await
                .expect("write");
            if items == 0 {
                break;
            }
            batches += 1;
        }
        let writes = sink.writes.lock().expect("lock").clone();
        // 10,000 frames of 32 bytes: 320,000 bytes in 5 writes of WRITE_BUF (rounded up
        // to a whole frame), not 10,000.
        assert_eq!(batches, want.len().div_ceil(WRITE_BUF));
        assert_eq!(writes.len(), batches);
        assert!(writes.iter().all(|&w| w <= WRITE_BUF + 32), "{writes:?}");
        assert_eq!(*sink.bytes.lock().expect("lock"), want);
    }

    #[tokio::test(start_paused = true)]
    async fn writer_times_out_on_a_peer_that_does_not_read() {
        let sink = Sink {
            stuck: true,
            ..Default::default()
        };
        let mut w = FrameWriter::new(sink, Duration::from_millis(500));
        let t0 = Instant::now();
        match w.send(&next_ids(1)).await {
            Err(WireError::WriteTimeout(d)) => assert_eq!(d, Duration::from_millis(500)),
            other => panic!("expected a write timeout, got {other:?}"),
        }
        let waited = Instant::now() - t0;
        assert!(
            waited >= Duration::from_millis(500) && waited < Duration::from_millis(505),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn writer_keeps_its_buffer_on_an_unencodable_frame() {
        let sink = Sink::default();
        let mut w = FrameWriter::new(sink.clone(), LONG);
        w.push(&next_ids(1)).expect("push");
        let huge = ServerMsg::Refused {
            reason: "x".repeat(MAX_FRAME_LEN as usize),
        };
        assert!(matches!(w.push(&huge), Err(WireError::TooLarge { .. })));
        w.flush().await.expect("flush");
        assert_eq!(*sink.bytes.lock().expect("lock"), frame(&next_ids(1)));
    }

    /// Reader and writer over a real loopback connection, as both sides use them.
    #[tokio::test]
    async fn split_connection_round_trips() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let (mut crd, mut cwr) = split(client, Timeouts::default()).expect("split");
        let (mut srd, mut swr) = split(server, Timeouts::default()).expect("split");
        cwr.send(&next_ids(4)).await.expect("send");
        assert_eq!(
            srd.read_msg::<ClientMsg>().await.expect("read"),
            Some(next_ids(4))
        );
        swr.send(&ServerMsg::ids(4, IdRange { lo: 1, hi: 1 }))
            .await
            .expect("send");
        swr.shutdown().await.expect("shutdown");
        assert!(matches!(
            crd.read_msg::<ServerMsg>().await,
            Ok(Some(ServerMsg::Ids {
                id: 4,
                lo: 1,
                hi: 1
            }))
        ));
        assert!(matches!(crd.read_msg::<ServerMsg>().await, Ok(None)));
    }

    /// Hands out at most `chunk` bytes per read.
    struct ChunkedReader<'a> {
        bytes: &'a [u8],
        chunk: usize,
    }

    impl<'a> ChunkedReader<'a> {
        fn new(bytes: &'a [u8], chunk: usize) -> ChunkedReader<'a> {
            ChunkedReader { bytes, chunk }
        }
    }

    impl AsyncRead for ChunkedReader<'_> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = self.chunk.min(buf.remaining()).min(self.bytes.len());
            buf.put_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Poll::Ready(Ok(()))
        }
    }
}
