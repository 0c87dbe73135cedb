//! The RESP request parser: an array of bulk strings, read incrementally.
//!
//! Its state survives between reads, so every byte received is looked at a bounded
//! number of times: a header line (`*N`, `$N`) is searched for its end within
//! [`MAX_HEADER`] bytes, a bulk string's body only once all of it is there. The work a
//! client causes is thus proportional to what it sends, however it splits it (a
//! general RESP decoder that restarts on every line end is quadratic, and one that
//! follows nested arrays reserves memory per level). What a request declares is
//! checked before anything is allocated for it: at most [`MAX_ARGS`] arguments, and
//! in all at most [`MAX_REQUEST_LEN`] bytes.

/// Largest request, in bytes, headers included. A qlist command is a few dozen bytes
/// (a `HELLO` with a long token a few hundred); the cap bounds each connection's
/// buffer and arguments.
pub const MAX_REQUEST_LEN: usize = 16 * 1024;

/// Most arguments (command name included) a request may declare. qlist's longest
/// command, `HELLO 3 AUTH user password SETNAME name`, has 7.
pub(super) const MAX_ARGS: usize = 16;

/// Longest header line, without its CRLF: a sign and the 19 digits of an i64, and
/// room to spare.
const MAX_HEADER: usize = 24;

/// A request's arguments, the command name first.
pub(super) type Args = Vec<Vec<u8>>;

/// Why the bytes received are not a request.
#[derive(Debug, PartialEq)]
pub(super) enum ParseError {
    /// The request declares, or has reached, more than [`MAX_REQUEST_LEN`] bytes.
    TooLarge,
    /// More than [`MAX_ARGS`] arguments declared.
    TooManyArgs(i64),
    /// The first byte of a request is not `*`.
    NotAnArray(u8),
    /// An element is not a bulk string.
    NotBulk,
    /// Anything else malformed, said in a few words.
    Malformed(&'static str),
}

/// The request being read: what its headers declared and the arguments read so far.
#[derive(Debug, Default)]
pub(super) struct RequestParser {
    /// Arguments declared by the `*N` header; `None` until it is read.
    declared: Option<usize>,
    /// The arguments read so far.
    args: Args,
    /// Length of the bulk string whose `$N` header was read, body still to come.
    bulk: Option<usize>,
    /// Bytes of this request consumed so far (headers and bodies).
    used: usize,
}

impl RequestParser {
    /// A request has begun: a header was consumed, the request is not complete.
    pub(super) fn in_progress(&self) -> bool {
        self.declared.is_some()
    }

    /// Reads what it can of `buf` (the bytes not consumed yet): the bytes consumed,
    /// and the request's arguments once it is complete (empty for `*0` or `*-1`,
    /// which Redis ignores). Consumed bytes are never offered again.
    ///
    /// # Errors
    /// The request is malformed or too large: the connection cannot be resynced.
    pub(super) fn parse(&mut self, buf: &[u8]) -> Result<(usize, Option<Args>), ParseError> {
        let mut pos = 0;
        loop {
            let rest = &buf[pos..];
            let Some(declared) = self.declared else {
                let Some((n, len)) = header(rest, b'*')? else {
                    return Ok((pos, None));
                };
                pos += len;
                if n <= 0 {
                    return Ok((pos, Some(Vec::new())));
                }
                let n = usize::try_from(n)
                    .ok()
                    .filter(|n| *n <= MAX_ARGS)
                    .ok_or(ParseError::TooManyArgs(n))?;
                self.declared = Some(n);
                self.args = Vec::with_capacity(n);
                self.used = len;
                continue;
            };
            if self.args.len() == declared {
                let args = std::mem::take(&mut self.args);
                *self = RequestParser::default();
                return Ok((pos, Some(args)));
            }
            match self.bulk {
                None => {
                    let Some((n, len)) = header(rest, b'$')? else {
                        return Ok((pos, None));
                    };
                    let n = usize::try_from(n)
                        .map_err(|_| ParseError::Malformed("negative bulk string length"))?;
                    self.used = self.used.saturating_add(len).saturating_add(n);
                    if self.used.saturating_add(2) > MAX_REQUEST_LEN {
                        return Err(ParseError::TooLarge);
                    }
                    pos += len;
                    self.bulk = Some(n);
                }
                Some(n) => {
                    // The body and its CRLF: looked at once, when all there.
                    let Some(body) = rest.get(..n + 2) else {
                        return Ok((pos, None));
                    };
                    if !body.ends_with(b"\r\n") {
                        return Err(ParseError::Malformed("bulk string not followed by CRLF"));
                    }
                    self.args.push(body[..n].to_vec());
                    self.used += 2;
                    self.bulk = None;
                    pos += n + 2;
                }
            }
        }
    }
}

/// A header line `<kind>N\r\n` at the start of `buf`: `N` and the line's length with
/// its CRLF, or `None` if the line is not complete yet. Looks at most at
/// [`MAX_HEADER`] + 2 bytes.
fn header(buf: &[u8], kind: u8) -> Result<Option<(i64, usize)>, ParseError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != kind {
        return Err(match kind {
            b'*' => ParseError::NotAnArray(first),
            _ => ParseError::NotBulk,
        });
    }
    let window = &buf[..buf.len().min(MAX_HEADER + 2)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        if window.len() == MAX_HEADER + 2 {
            return Err(ParseError::Malformed("header line too long"));
        }
        if window.contains(&b'\n') {
            return Err(ParseError::Malformed("line end without CR"));
        }
        return Ok(None);
    };
    let n = std::str::from_utf8(&window[1..end])
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or(ParseError::Malformed("invalid length"))?;
    Ok(Some((n, end + 2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `step` bytes as a connection would (unconsumed bytes
    /// stay in the buffer): the requests, or the first error.
    fn feed(input: &[u8], step: usize) -> Result<Vec<Vec<Vec<u8>>>, ParseError> {
        let mut p = RequestParser::default();
        let (mut buf, mut out) = (Vec::new(), Vec::new());
        for piece in input.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                let (used, req) = p.parse(&buf)?;
                buf.drain(..used);
                match req {
                    Some(r) => out.push(r),
                    None => break,
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn requests_parse_whatever_the_split() {
        let input = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*0\r\n*1\r\n$0\r\n\r\n";
        for step in 1..input.len() {
            let got = feed(input, step).expect("valid");
            let want = vec![
                vec![b"PING".to_vec(), b"hi".to_vec()],
                vec![],
                vec![Vec::new()],
            ];
            assert_eq!(got, want, "step {step}");
        }
    }

    #[test]
    fn declared_sizes_are_checked_before_anything_is_read() {
        assert_eq!(
            feed(b"*2147483647\r\n", 1),
            Err(ParseError::TooManyArgs(2147483647))
        );
        assert_eq!(feed(b"*17\r\n", 64), Err(ParseError::TooManyArgs(17)));
        assert_eq!(feed(b"*1\r\n$16384\r\n", 64), Err(ParseError::TooLarge));
        assert_eq!(
            feed(b"*1\r\n$999999999999999999999\r\n", 64),
            Err(ParseError::Malformed("invalid length"))
        );
        // Arguments that together exceed the cap.
        let big = format!("$8000\r\n{}\r\n", "x".repeat(8000));
        let input = format!("*3\r\n{big}{big}{big}");
        assert_eq!(feed(input.as_bytes(), 4096), Err(ParseError::TooLarge));
    }

    #[test]
    fn anything_but_an_array_of_bulk_strings_is_refused() {
        assert_eq!(feed(b"*1\r\n*1\r\n", 1), Err(ParseError::NotBulk));
        assert_eq!(feed(b"*1\r\n:1\r\n", 64), Err(ParseError::NotBulk));
        assert_eq!(feed(b"PING\r\n", 64), Err(ParseError::NotAnArray(b'P')));
        assert_eq!(
            feed(b"*1\r\n$x\r\n", 64),
            Err(ParseError::Malformed("invalid length"))
        );
        assert_eq!(
            feed(b"*1\r\n$-1\r\n", 64),
            Err(ParseError::Malformed("negative bulk string length"))
        );
        assert_eq!(
            feed(b"*1\r\n$2\r\nabcd", 64),
            Err(ParseError::Malformed("bulk string not followed by CRLF"))
        );
        assert_eq!(
            feed(format!("*{}", "1".repeat(40)).as_bytes(), 1),
            Err(ParseError::Malformed("header line too long"))
        );
    }

    #[test]
    fn a_partial_request_is_not_read_again() {
        let mut p = RequestParser::default();
        assert_eq!(p.parse(b"*2\r\n$4\r\nPI"), Ok((8, None)));
        assert!(p.in_progress());
        // Only the unconsumed bytes come back, with more.
        assert_eq!(p.parse(b"PI"), Ok((0, None)));
        assert_eq!(
            p.parse(b"PING\r\n$1\r\nx\r\n"),
            Ok((13, Some(vec![b"PING".to_vec(), b"x".to_vec()])))
        );
        assert!(!p.in_progress());
    }
}
