//! HTTP/1.1 framing for the proxy, as pure functions over bytes: request and response heads
//! parsed (by `httparse`) into positions within the connection's buffer, the body-framing
//! rules (RFC 9112 §6), an incremental chunked decoder, and response-head serialization.
//!
//! The gateway speaks HTTP/1.1 itself rather than through pingora's sessions: per request it
//! then costs one parse of each head, no header maps, no copies of the body and no
//! per-request buffers (measured in `benches/compare.sh`). The sockets are in
//! [`crate::proxy`].

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::{BufMut, BytesMut};

/// The most header lines a head may have; `limits.max_headers` cannot go above it.
pub const MAX_HEADERS: usize = 256;

/// Why a head cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("not a valid HTTP/1.x head")]
    Malformed,
    #[error("more than {MAX_HEADERS} header lines")]
    TooManyHeaders,
}

/// Why a message's body framing cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("invalid or conflicting Content-Length")]
    BadContentLength,
    #[error("Transfer-Encoding other than chunked, or together with Content-Length")]
    BadTransferEncoding,
}

/// Why a chunked body cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunked encoding")]
pub struct ChunkError;

/// How a message's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the sender closes the connection (responses only).
    UntilClose,
}

/// One header line: positions of its name and value in the buffer the head was parsed from.
type HeaderPos = (Range<usize>, Range<usize>);

/// A parsed request head, as positions in the connection's read buffer. Reused from one
/// request to the next, so parsing allocates nothing once the connection is warm.
#[derive(Debug, Default)]
pub struct RequestHead {
    /// Bytes of the head, final CRLF included: where the body starts.
    pub len: usize,
    method: Range<usize>,
    target: Range<usize>,
    /// HTTP/1.0 rather than 1.1.
    pub http10: bool,
    headers: Vec<HeaderPos>,
}

impl RequestHead {
    /// Parses a request head at the start of `buf`: `Ok(true)` when it is complete (and
    /// `self` describes it), `Ok(false)` when more bytes are needed.
    pub fn parse(&mut self, buf: &[u8]) -> Result<bool, HeadError> {
        let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let Some(len) = complete(req.parse_with_uninit_headers(buf, &mut storage))? else {
            return Ok(false);
        };
        self.len = len;
        self.method = position(buf, req.method.unwrap_or_default().as_bytes());
        self.target = position(buf, req.path.unwrap_or_default().as_bytes());
        self.http10 = req.version == Some(0);
        header_positions(buf, req.headers, &mut self.headers);
        Ok(true)
    }

    /// The head over the buffer it was parsed from.
    pub fn view<'a>(&'a self, buf: &'a [u8]) -> Request<'a> {
        // httparse admits only visible ASCII in methods and targets.
        let text = |r: &Range<usize>| std::str::from_utf8(&buf[r.clone()]).unwrap_or_default();
        let target = text(&self.target);
        let (authority, origin) = match target.find("://") {
            Some(i) if !target.starts_with('/') => {
                let after = &target[i + 3..];
                let slash = after.find('/').unwrap_or(after.len());
                (Some(&after[..slash]), &after[slash..])
            }
            _ => (None, target),
        };
        let origin = origin.split('#').next().unwrap_or_default();
        let (path, query) = match origin.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (origin, None),
        };
        Request {
            head: self,
            buf,
            method: text(&self.method),
            target,
            path: if path.is_empty() { "/" } else { path },
            query,
            authority,
        }
    }
}

/// The head's length once httparse has a whole head, `None` while it needs more bytes.
fn complete(parsed: httparse::Result<usize>) -> Result<Option<usize>, HeadError> {
    match parsed {
        Ok(httparse::Status::Complete(len)) => Ok(Some(len)),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooManyHeaders),
        Err(_) => Err(HeadError::Malformed),
    }
}

/// Replaces `out` with the positions of `headers`' names and values within `buf`.
fn header_positions(buf: &[u8], headers: &[httparse::Header<'_>], out: &mut Vec<HeaderPos>) {
    out.clear();
    out.extend(
        headers
            .iter()
            .map(|h| (position(buf, h.name.as_bytes()), position(buf, h.value))),
    );
}

/// Where `part` (a subslice of `buf`) lies within `buf`.
fn position(buf: &[u8], part: &[u8]) -> Range<usize> {
    if part.is_empty() {
        return 0..0;
    }
    let start = (part.as_ptr() as usize).saturating_sub(buf.as_ptr() as usize);
    start..start + part.len()
}

/// A parsed request head over its buffer, with the request line's parts split out once.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    head: &'a RequestHead,
    buf: &'a [u8],
    method: &'a str,
    target: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    authority: Option<&'a str>,
}

impl<'a> Request<'a> {
    pub fn method(&self) -> &'a str {
        self.method
    }

    pub fn http10(&self) -> bool {
        self.head.http10
    }

    /// The request target as sent: origin form `/path?query`, or absolute form.
    pub fn target(&self) -> &'a str {
        self.target
    }

    /// The target's path: the origin form's, or the path of an absolute-form target.
    pub fn path(&self) -> &'a str {
        self.path
    }

    /// The authority of an absolute-form target.
    pub fn authority(&self) -> Option<&'a str> {
        self.authority
    }

    pub fn query(&self) -> Option<&'a str> {
        self.query
    }

    /// Every header line, in order, names as sent.
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let buf = self.buf;
        self.head
            .headers
            .iter()
            .map(move |(n, v)| (&buf[n.clone()], &buf[v.clone()]))
    }

    pub fn header_count(&self) -> usize {
        self.head.headers.len()
    }

    /// The first value of a header (`name` in lower case).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers_named(name).next()
    }

    /// The value of a header sent exactly once: `None` when it is absent or repeated, since a
    /// repeated credential could be checked in one copy here and read in another upstream.
    pub fn single_header(&self, name: &str) -> Option<&'a [u8]> {
        let mut values = self.headers_named(name);
        let first = values.next()?;
        values.next().is_none().then_some(first)
    }

    /// Every value of a header (`name` in lower case).
    pub fn headers_named<'n>(&self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + 'n
    where
        'a: 'n,
    {
        let this = *self;
        this.head
            .headers
            .iter()
            .filter(move |(n, _)| this.buf[n.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(move |(_, v)| &this.buf[v.clone()])
    }

    /// Whether a comma-separated header has `token` among its values.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers_named(name)
            .any(|v| has_token(v, token.as_bytes()))
    }

    /// Whether a `Connection` header lists `name`: such a header is hop-by-hop by the
    /// client's declaration (RFC 9110 §7.6.1) and is not forwarded.
    pub fn connection_lists(&self, name: &[u8]) -> bool {
        self.headers_named("connection").any(|v| has_token(v, name))
    }

    /// Whether a `Connection` header names any header (anything but `close`/`keep-alive`):
    /// only then is [`Self::connection_lists`] worth asking.
    pub fn declares_hop_headers(&self) -> bool {
        self.headers_named("connection").any(names_headers)
    }

    /// How the body is framed; conflicting or unsupported framing is refused, so a body is
    /// never read one way here and another way by the backend (request smuggling).
    pub fn framing(&self) -> Result<Framing, FramingError> {
        let length = content_length(self.headers_named("content-length"))?;
        let mut codings = self.headers_named("transfer-encoding").peekable();
        if codings.peek().is_none() {
            return Ok(Framing::Length(length.unwrap_or(0)));
        }
        let chunked_only = codings.all(|v| {
            std::str::from_utf8(v).is_ok_and(|v| {
                v.split(',')
                    .all(|c| c.trim().eq_ignore_ascii_case("chunked"))
            })
        });
        if length.is_some() || self.http10() || !chunked_only {
            return Err(FramingError::BadTransferEncoding);
        }
        Ok(Framing::Chunked)
    }

    /// Whether the client asked to keep the connection open after this request.
    pub fn wants_keep_alive(&self) -> bool {
        if self.has_token("connection", "close") {
            return false;
        }
        !self.http10() || self.has_token("connection", "keep-alive")
    }
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
/// Whether a `Connection` value lists a token other than `close` and `keep-alive`.
fn names_headers(value: &[u8]) -> bool {
    value.split(|b| *b == b',').any(|t| {
        let t = t.trim_ascii();
        !t.is_empty() && !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"keep-alive")
    })
}

fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// The value of every Content-Length line, which must agree.
fn content_length<'a>(values: impl Iterator<Item = &'a [u8]>) -> Result<Option<u64>, FramingError> {
    let mut length = None;
    for value in values {
        for part in value.split(|b| *b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || part.len() > 18 || !part.iter().all(u8::is_ascii_digit) {
                return Err(FramingError::BadContentLength);
            }
            let n = part.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if length.is_some_and(|l| l != n) {
                return Err(FramingError::BadContentLength);
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// A parsed response head from the backend, as positions in the upstream read buffer;
/// reused like [`RequestHead`].
#[derive(Debug)]
pub struct ResponseHead {
    /// Bytes of the head, final CRLF included.
    pub len: usize,
    pub status: u16,
    pub framing: Framing,
    /// The backend will keep the connection open after this response.
    pub keep_alive: bool,
    /// A `Connection` header names hop-by-hop headers (see [`Self::connection_lists`]).
    pub declares_hop_headers: bool,
    /// Header lines (without the status line), to be relayed selectively.
    headers: Vec<HeaderPos>,
    reason: Range<usize>,
}

impl Default for ResponseHead {
    fn default() -> Self {
        ResponseHead {
            len: 0,
            status: 0,
            framing: Framing::Length(0),
            keep_alive: false,
            declares_hop_headers: false,
            headers: Vec::new(),
            reason: 0..0,
        }
    }
}

impl ResponseHead {
    /// Parses a response head at the start of `buf`: `Ok(true)` when complete, `Ok(false)`
    /// when more bytes are needed.
    pub fn parse(&mut self, buf: &[u8]) -> Result<bool, HeadError> {
        let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            buf,
            &mut storage,
        );
        let Some(len) = complete(parsed)? else {
            return Ok(false);
        };
        let status = resp.code.unwrap_or_default();
        let mut connection_close = resp.version == Some(0);
        // Chunked framing only when `chunked` is the final coding (RFC 9112 §6.3): the last
        // one of the last Transfer-Encoding line.
        let mut encoded = false;
        let mut chunked = false;
        self.declares_hop_headers = false;
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("connection") {
                self.declares_hop_headers |= names_headers(h.value);
                if has_token(h.value, b"close") {
                    connection_close = true;
                } else if has_token(h.value, b"keep-alive") {
                    connection_close = false;
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                encoded = true;
                let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
                chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
            }
        }
        let length = content_length(
            resp.headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| h.value),
        )
        .map_err(|_| HeadError::Malformed)?;
        self.framing = if (100..200).contains(&status) || status == 204 || status == 304 {
            Framing::Length(0)
        } else if chunked {
            Framing::Chunked
        } else if encoded {
            Framing::UntilClose
        } else {
            length.map_or(Framing::UntilClose, Framing::Length)
        };
        self.len = len;
        self.status = status;
        self.keep_alive = !connection_close && self.framing != Framing::UntilClose;
        self.reason = position(buf, resp.reason.unwrap_or_default().as_bytes());
        header_positions(buf, resp.headers, &mut self.headers);
        Ok(true)
    }

    /// The reason phrase, from the head's buffer.
    pub fn reason<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.reason.clone()]
    }

    /// Every header line, from the head's buffer.
    pub fn headers<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        self.headers
            .iter()
            .map(move |(n, v)| (&buf[n.clone()], &buf[v.clone()]))
    }

    /// Whether a `Connection` header lists `name` (hop-by-hop, see
    /// [`Request::connection_lists`]).
    pub fn connection_lists(&self, buf: &[u8], name: &[u8]) -> bool {
        self.headers(buf)
            .any(|(n, v)| n.eq_ignore_ascii_case(b"connection") && has_token(v, name))
    }
}

/// Writes a response head: the status line, then one header at a time, then [`Self::end`].
pub struct HeadWriter<'a> {
    out: &'a mut BytesMut,
}

impl<'a> HeadWriter<'a> {
    /// Starts a head with `status` and its reason phrase (the canonical one if `reason` is empty).
    pub fn new(out: &'a mut BytesMut, status: u16, reason: &[u8]) -> Self {
        let canonical = http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        out.put_slice(b"HTTP/1.1 ");
        out.put_slice(itoa::Buffer::new().format(status).as_bytes());
        out.put_u8(b' ');
        out.put_slice(if reason.is_empty() {
            canonical.as_bytes()
        } else {
            reason
        });
        out.put_slice(b"\r\n");
        HeadWriter { out }
    }

    pub fn header(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> &mut Self {
        self.out.put_slice(name.as_ref());
        self.out.put_slice(b": ");
        self.out.put_slice(value.as_ref());
        self.out.put_slice(b"\r\n");
        self
    }

    pub fn number(&mut self, name: &str, value: u64) -> &mut Self {
        self.header(name, itoa::Buffer::new().format(value))
    }

    /// Ends the head.
    pub fn end(self) {
        self.out.put_slice(b"\r\n");
    }
}

/// An incremental decoder of `Transfer-Encoding: chunked` (RFC 9112 §7.1). Fed whatever bytes
/// have arrived, it hands out the data and says where the body ends; chunk extensions and
/// trailers are read and dropped.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    /// Data bytes left in the current chunk, or the size being read.
    size: u64,
    digits: u32,
    /// Bytes of the current extension or trailer line, bounded.
    line: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    /// Spaces after the size, before `;` or the line end.
    SizeSpace,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// Longest chunk extension or trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// The state after a chunk size and its spaces: an extension or the line end.
fn after_size(b: u8) -> Result<ChunkState, ChunkError> {
    match b {
        b';' => Ok(ChunkState::Extension),
        b'\r' => Ok(ChunkState::SizeLf),
        _ => Err(ChunkError),
    }
}

/// A byte allowed inside a chunk extension or a trailer line: never a control byte (a bare
/// LF in particular, which another parser could take for a line end).
fn is_line_byte(b: u8) -> bool {
    b == b'\t' || (b >= b' ' && b != 0x7f)
}

/// Whether `b` is the one byte the grammar allows here.
fn expect(b: u8, want: u8) -> Result<(), ChunkError> {
    if b == want {
        Ok(())
    } else {
        Err(ChunkError)
    }
}

impl ChunkedDecoder {
    /// One byte of a chunk extension or trailer line, which ends at CR (then `at_cr`).
    fn line_byte(&mut self, b: u8, at_cr: ChunkState) -> Result<ChunkState, ChunkError> {
        self.line += 1;
        if b == b'\r' {
            Ok(at_cr)
        } else if is_line_byte(b) && self.line <= MAX_CHUNK_LINE {
            Ok(self.state)
        } else {
            Err(ChunkError)
        }
    }

    /// Decodes from `input`, passing each run of data to `on_data`. Returns how many bytes of
    /// `input` were consumed and whether the body is complete (input after the end is left).
    pub fn decode(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<(usize, bool), ChunkError> {
        use ChunkState::*;
        let mut i = 0;
        while i < input.len() && self.state != Done {
            let b = input[i];
            match self.state {
                Data => {
                    let n = (input.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    on_data(&input[i..i + n]);
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    continue;
                }
                Size => match (b as char).to_digit(16) {
                    Some(d) if self.digits < 15 => {
                        self.size = self.size * 16 + u64::from(d);
                        self.digits += 1;
                    }
                    None if self.digits > 0 && matches!(b, b' ' | b'\t') => self.state = SizeSpace,
                    None if self.digits > 0 => self.state = after_size(b)?,
                    _ => return Err(ChunkError),
                },
                SizeSpace => {
                    if !matches!(b, b' ' | b'\t') {
                        self.state = after_size(b)?;
                    }
                }
                Extension => self.state = self.line_byte(b, SizeLf)?,
                SizeLf => {
                    expect(b, b'\n')?;
                    self.digits = 0;
                    self.line = 0;
                    self.state = if self.size == 0 { TrailerStart } else { Data };
                }
                DataCr => self.state = expect(b, b'\r').map(|()| DataLf)?,
                DataLf => self.state = expect(b, b'\n').map(|()| Size)?,
                TrailerStart => {
                    self.line = 0;
                    self.state = match b {
                        b'\r' => EndLf,
                        // A trailer field starts with its name.
                        b if b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b) => {
                            Trailer
                        }
                        _ => return Err(ChunkError),
                    };
                }
                Trailer => self.state = self.line_byte(b, TrailerLf)?,
                TrailerLf => self.state = expect(b, b'\n').map(|()| TrailerStart)?,
                EndLf => self.state = expect(b, b'\n').map(|()| Done)?,
                Done => unreachable!("the loop stops at Done"),
            }
            i += 1;
        }
        Ok((i, self.state == Done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(raw: &str) -> (RequestHead, Vec<u8>) {
        let mut head = RequestHead::default();
        assert_eq!(head.parse(raw.as_bytes()), Ok(true), "{raw:?}");
        (head, raw.as_bytes().to_vec())
    }

    #[test]
    fn a_request_head_is_read_into_positions() {
        let (head, buf) = parse(
            "POST /api/v1/verify/request?x=1 HTTP/1.1\r\nHost: gw\r\nX-Auth-Token: t\r\nContent-Length: 2\r\n\r\n{}",
        );
        let req = head.view(&buf);
        assert_eq!(req.method(), "POST");
        assert_eq!(req.path(), "/api/v1/verify/request");
        assert_eq!(req.query(), Some("x=1"));
        assert_eq!(req.header("x-auth-token"), Some(&b"t"[..]));
        assert_eq!(req.header_count(), 3);
        assert_eq!(req.framing(), Ok(Framing::Length(2)));
        assert!(req.wants_keep_alive());
        assert_eq!(&buf[head.len..], b"{}");
    }

    #[test]
    fn a_partial_head_asks_for_more_and_garbage_is_malformed() {
        let mut head = RequestHead::default();
        assert_eq!(head.parse(b"GET / HTTP/1.1\r\nHost: x\r\n"), Ok(false));
        assert_eq!(
            head.parse(b"NOT HTTP AT ALL\r\n\r\n"),
            Err(HeadError::Malformed)
        );
        assert_eq!(
            head.parse(b"GET /a\x00b HTTP/1.1\r\n\r\n"),
            Err(HeadError::Malformed)
        );
        assert_eq!(
            head.parse(b"GET / HTTP/1.1\r\nX-Evil: a\rb\r\n\r\n"),
            Err(HeadError::Malformed)
        );
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "A: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(head.parse(many.as_bytes()), Err(HeadError::TooManyHeaders));
    }

    #[test]
    fn absolute_form_targets_give_their_path_and_authority() {
        let (head, buf) = parse("GET http://gw:8080/api/v2/x?q HTTP/1.1\r\n\r\n");
        let req = head.view(&buf);
        assert_eq!(
            (req.path(), req.authority()),
            ("/api/v2/x", Some("gw:8080"))
        );
        let (head, buf) = parse("GET http://gw HTTP/1.1\r\n\r\n");
        assert_eq!(head.view(&buf).path(), "/");
    }

    #[test]
    fn framing_refuses_what_could_be_read_two_ways() {
        let framing = |headers: &str| {
            let (head, buf) = parse(&format!("POST / HTTP/1.1\r\n{headers}\r\n"));
            head.view(&buf).framing()
        };
        assert_eq!(framing(""), Ok(Framing::Length(0)));
        assert_eq!(
            framing("Content-Length: 5\r\nContent-Length: 5\r\n"),
            Ok(Framing::Length(5))
        );
        assert_eq!(
            framing("Transfer-Encoding: Chunked\r\n"),
            Ok(Framing::Chunked)
        );
        for bad in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 1e3\r\n",
            "Content-Length: \r\n",
            "Content-Length: 99999999999999999999\r\n",
        ] {
            assert_eq!(framing(bad), Err(FramingError::BadContentLength), "{bad}");
        }
        for bad in [
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: identity\r\n",
        ] {
            assert_eq!(
                framing(bad),
                Err(FramingError::BadTransferEncoding),
                "{bad}"
            );
        }
        let (head, buf) = parse("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(
            head.view(&buf).framing(),
            Err(FramingError::BadTransferEncoding)
        );
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_header() {
        let keep = |raw: &str| {
            let (head, buf) = parse(raw);
            head.view(&buf).wants_keep_alive()
        };
        assert!(keep("GET / HTTP/1.1\r\n\r\n"));
        assert!(!keep("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"));
        assert!(!keep("GET / HTTP/1.0\r\n\r\n"));
        assert!(keep("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    }

    #[test]
    fn response_heads_give_status_framing_and_reuse() {
        let head = |raw: &str| {
            let mut head = ResponseHead::default();
            assert_eq!(head.parse(raw.as_bytes()), Ok(true));
            head
        };
        let r = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(
            (r.status, r.framing, r.keep_alive),
            (200, Framing::Length(12), true)
        );
        let r = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Chunked, false));
        let r = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::UntilClose, false));
        let r = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::UntilClose, false));
        let r = head(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 9\r\n\r\n",
        );
        assert_eq!((r.framing, r.keep_alive), (Framing::Chunked, true));
        let r = head("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
        assert!(!r.keep_alive);
        let r = head("HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n");
        assert!(!r.declares_hop_headers);
        let r = head("HTTP/1.1 200 OK\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\n\r\n");
        assert!(r.declares_hop_headers);
        assert!(r.connection_lists(
            b"HTTP/1.1 200 OK\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\n\r\n",
            b"x-hop"
        ));
        let r = head("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Length(0), true));
        let mut r = ResponseHead::default();
        assert_eq!(r.parse(b"HTTP/1.1 200 OK\r\n"), Ok(false));
        assert!(r.parse(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn the_head_writer_writes_a_status_line_and_headers() {
        let mut out = BytesMut::new();
        let mut w = HeadWriter::new(&mut out, 404, b"");
        w.header("content-type", "application/json")
            .number("content-length", 7);
        w.end();
        assert_eq!(
            &out[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n"
        );
    }

    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let mut out = Vec::new();
        let (n, done) = ChunkedDecoder::default().decode(input, |d| out.extend_from_slice(d))?;
        Ok((out, n, done))
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let body = b"5;ext=1\r\nhello\r\n6 ;a=\"b c\"\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        assert_eq!(
            decode_all(body),
            Ok((b"hello world".to_vec(), body.len() - 4, true))
        );
        assert_eq!(decode_all(b"0\r\n\r\n"), Ok((vec![], 5, true)));
        assert_eq!(
            decode_all(b"A\r\n0123456789\r\n"),
            Ok((b"0123456789".to_vec(), 15, false))
        );
        for bad in [
            &b"x\r\n"[..],
            b"5\r\nhelloX\r\n",
            b"\r\n",
            b"5\nhello",
            b"fffffffffffffffff\r\n",
            // A bare LF ending the body or a trailer: another parser could end it elsewhere.
            b"0\r\n\nGET /x HTTP/1.1\r\n\r\n",
            b"0\r\nX: a\n\r\n",
            b"5 garbage\r\n",
            b"5;a\x01\r\n",
            b"0\r\n: no name\r\n\r\n",
        ] {
            assert_eq!(
                decode_all(bad),
                Err(ChunkError),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    proptest! {
        /// Any body, chunked any way and fed in any pieces, decodes to itself and ends where
        /// the encoding ends.
        #[test]
        fn chunked_decoding_is_split_invariant(
            body in proptest::collection::vec(any::<u8>(), 0..2000),
            chunk in 1usize..300,
            piece in 1usize..64,
        ) {
            let mut encoded = Vec::new();
            for c in body.chunks(chunk) {
                encoded.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                encoded.extend_from_slice(c);
                encoded.extend_from_slice(b"\r\n");
            }
            encoded.extend_from_slice(b"0\r\n\r\nrest");
            let mut decoder = ChunkedDecoder::default();
            let mut out = Vec::new();
            let mut at = 0;
            let mut done = false;
            while !done {
                let end = (at + piece).min(encoded.len());
                let (n, d) = decoder.decode(&encoded[at..end], |x| out.extend_from_slice(x)).unwrap();
                at += n;
                done = d;
                prop_assert!(at < encoded.len());
            }
            prop_assert_eq!(out, body);
            prop_assert_eq!(&encoded[at..], b"rest");
        }
    }
}
