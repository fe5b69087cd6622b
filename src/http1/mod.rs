//! HTTP/1.1 as pure functions over bytes, shared by everything in the crate that speaks it
//! (the proxy on both hops, the load generator, the health checker, the CLI's admin client):
//! request and response heads parsed (by `httparse`) into positions within the connection's
//! buffer ([`request`], [`response`]), the body-framing rules (RFC 9112 §6), an incremental
//! chunked decoder ([`chunked`]), head writers ([`writer`]) and a small client ([`client`]).
//!
//! Speaking HTTP/1.1 here rather than through pingora's sessions costs one parse of each head
//! per request, no header maps, no copies of the body and no per-request buffers (measured in
//! `benches/compare.sh`). No sockets here, except in [`client`], which is generic over any
//! async stream.

mod chunked;
pub mod client;
mod request;
mod response;
mod writer;

use std::ops::Range;

use bytes::BytesMut;

pub use chunked::{write_chunk, ChunkError, ChunkedDecoder, LAST_CHUNK};
pub use request::{split_host, Request, RequestHead};
pub use response::ResponseHead;
pub use writer::{escape_html, percent_encode, put_hex, put_ip, RequestWriter, ResponseWriter};

/// The most header lines a head may have; `limits.max_headers` cannot go above it.
pub const MAX_HEADERS: usize = 256;

/// The first size of each buffer an HTTP/1.1 exchange takes (the proxy's read buffer for a
/// client, its answer, the backend exchange's): room for a usual API request or answer, as
/// nginx's `client_header_buffer_size` (1k), and within glibc's per-thread cache of small
/// blocks (up to 1,032 bytes), so that taking and freeing one costs a few instructions where a
/// 4 KiB block goes through the allocator's bins. Larger messages grow it.
pub const FIRST_BUFFER: usize = 1024;

/// What a read has room for, at least, once a message is past its first buffer.
pub const READ_CHUNK: usize = 4096;

/// Makes room in `buf` for the next read: `first` bytes when it has no room at all (none
/// allocated, or all of it read and taken: a new message, or the next part of a body, as the
/// caller says), and [`READ_CHUNK`] more when under 512 bytes are left, so that a message
/// longer than its first buffer is read 4 KiB or more at a time.
pub fn reserve_for_read(buf: &mut BytesMut, first: usize) {
    if buf.capacity() == 0 {
        buf.reserve(first);
    } else if buf.capacity() - buf.len() < 512 {
        buf.reserve(READ_CHUNK);
    }
}

/// Why a head cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("not a valid HTTP/1.x head")]
    Malformed,
    #[error("a transfer coding other than chunked, once")]
    UnsupportedTransferCoding,
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

/// A header name's fingerprint, the same whatever its case: its length and its first and last
/// bytes. Names that differ in it differ; names that share it are compared byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NameKey(u32);

impl NameKey {
    fn of(name: &[u8]) -> Self {
        let (first, last) = match name {
            [] => (0, 0),
            [first, .., last] => (*first, *last),
            [only] => (*only, *only),
        };
        let len = u32::try_from(name.len()).unwrap_or(u32::MAX) & 0xffff;
        NameKey(
            len << 16
                | u32::from(first.to_ascii_lowercase()) << 8
                | u32::from(last.to_ascii_lowercase()),
        )
    }

    /// Its bit in a head's [`HeaderTable::names`]: a multiplicative hash of the key.
    fn bit(self) -> u64 {
        1 << (self.0.wrapping_mul(0x9e37_79b9) >> 26)
    }
}

/// One header line: positions of its name and value in the buffer the head was parsed from,
/// and its name's key.
#[derive(Debug, Clone)]
struct HeaderPos {
    name: Range<usize>,
    value: Range<usize>,
    key: NameKey,
}

/// A head's header lines as positions in its buffer, looked up by name without comparing
/// bytes: each name's [`NameKey`] is worked out once, at parse, and a 64-bit set of them
/// answers most lookups of a header that is not there (most of a request's: framing,
/// `Expect`, `X-Request-Id`, the forwarding and trace headers) without a scan, as nginx's
/// table of known request headers does. Reused from one head to the next.
#[derive(Debug, Default)]
pub(crate) struct HeaderTable {
    lines: Vec<HeaderPos>,
    /// The [`NameKey::bit`]s of the names present.
    names: u64,
}

impl HeaderTable {
    /// Replaces the table with the positions of `headers` within `buf`.
    pub(crate) fn fill(&mut self, buf: &[u8], headers: &[httparse::Header<'_>]) {
        self.lines.clear();
        // One allocation for a table that was released while its connection waited.
        self.lines.reserve(headers.len());
        self.names = 0;
        for h in headers {
            let key = NameKey::of(h.name.as_bytes());
            self.names |= key.bit();
            self.lines.push(HeaderPos {
                name: position(buf, h.name.as_bytes()),
                value: position(buf, h.value),
                key,
            });
        }
    }

    /// Frees the table's room (a connection waiting for its next head keeps none).
    pub(crate) fn release(&mut self) {
        *self = HeaderTable::default();
    }

    /// How many lines the table has room for.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.lines.capacity()
    }

    pub(crate) fn len(&self) -> usize {
        self.lines.len()
    }

    /// Every header line over `buf`, in order, names as sent.
    pub(crate) fn iter<'a>(
        &'a self,
        buf: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.lines
            .iter()
            .map(move |h| (&buf[h.name.clone()], &buf[h.value.clone()]))
    }

    /// Every value of the header `name` (any case) over `buf`.
    pub(crate) fn named<'a, 'n>(
        &'a self,
        buf: &'a [u8],
        name: &'n [u8],
    ) -> impl Iterator<Item = &'a [u8]> + 'n
    where
        'a: 'n,
    {
        let key = NameKey::of(name);
        let lines: &[HeaderPos] = if self.names & key.bit() != 0 {
            &self.lines
        } else {
            &[]
        };
        lines
            .iter()
            .filter(move |h| h.key == key && buf[h.name.clone()].eq_ignore_ascii_case(name))
            .map(move |h| &buf[h.value.clone()])
    }
}

/// The head's length once httparse has a whole head, `None` while it needs more bytes.
pub(crate) fn complete(parsed: httparse::Result<usize>) -> Result<Option<usize>, HeadError> {
    match parsed {
        Ok(httparse::Status::Complete(len)) => Ok(Some(len)),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooManyHeaders),
        Err(_) => Err(HeadError::Malformed),
    }
}

/// Where `part` (a subslice of `buf`) lies within `buf`.
pub(crate) fn position(buf: &[u8], part: &[u8]) -> Range<usize> {
    if part.is_empty() {
        return 0..0;
    }
    let start = (part.as_ptr() as usize).saturating_sub(buf.as_ptr() as usize);
    start..start + part.len()
}

/// Optional whitespace (RFC 9110 §5.6.3) trimmed: spaces and horizontal tabs only, never the
/// other bytes some parsers take for whitespace.
pub(crate) fn trim_ows(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = value.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(start), Some(end)) => &value[start..=end],
        _ => &[],
    }
}

/// The elements of a comma-separated header value (RFC 9110 §5.6.1), optional whitespace
/// trimmed, empty ones included for the callers that refuse them. A value without a comma,
/// the usual one (`keep-alive`, `56`, `chunked`), is its one element. Found by a plain loop
/// over the bytes: `split`'s machinery cost more than the rest of reading a short value.
pub(crate) fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(value);
    std::iter::from_fn(move || {
        let r = rest?;
        let (element, after) = match r.iter().position(|b| *b == b',') {
            Some(i) => (&r[..i], Some(&r[i + 1..])),
            None => (r, None),
        };
        rest = after;
        Some(trim_ows(element))
    })
}

/// What a message's `Transfer-Encoding` lines say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransferCoding {
    /// No `Transfer-Encoding` line.
    Absent,
    /// `chunked`, exactly once, and nothing else.
    Chunked,
    /// Anything else: another coding, `chunked` twice, an empty element, a stray byte.
    Other,
}

/// Reads every `Transfer-Encoding` value. Only one coding the gateway speaks is accepted,
/// `chunked` once: a list another parser could read differently is refused rather than
/// guessed at.
pub(crate) fn transfer_coding<'a>(values: impl Iterator<Item = &'a [u8]>) -> TransferCoding {
    let mut codings = 0;
    for value in values {
        for coding in list_elements(value) {
            codings += 1;
            if !coding.eq_ignore_ascii_case(b"chunked") {
                return TransferCoding::Other;
            }
        }
    }
    match codings {
        0 => TransferCoding::Absent,
        1 => TransferCoding::Chunked,
        _ => TransferCoding::Other,
    }
}

/// Whether a response with `status` has no body, whatever its headers say (RFC 9110 §6.4.1).
pub fn is_bodiless_status(status: u16) -> bool {
    (100..200).contains(&status) || status == 204 || status == 304
}

/// Whether a `Connection` value lists a token other than `close` and `keep-alive`.
pub(crate) fn names_headers(value: &[u8]) -> bool {
    list_elements(value).any(|t| {
        !t.is_empty() && !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"keep-alive")
    })
}

/// What a message's `Connection` lines list, each read in one pass ([`ConnectionTokens::add`],
/// called in the loop over the lines: a chained iterator there cost some 250 instructions a
/// request): `close`, `keep-alive`, and whether any other token (a header they declare
/// hop-by-hop, [`names_headers`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionTokens {
    pub close: bool,
    pub keep_alive: bool,
    pub names_headers: bool,
}

impl ConnectionTokens {
    /// Adds what one of a message's `Connection` lines lists: a token on any line counts.
    pub(crate) fn add(&mut self, value: &[u8]) {
        for token in list_elements(value) {
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if !token.is_empty() {
                self.names_headers = true;
            }
        }
    }

    /// Whether the connection stays open after the message (RFC 9112 §9.3): never with
    /// `close` on any line, whatever else they say; in HTTP/1.0 only with `keep-alive`.
    pub(crate) fn persistent(self, http10: bool) -> bool {
        !self.close && (!http10 || self.keep_alive)
    }
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
pub(crate) fn has_token(value: &[u8], token: &[u8]) -> bool {
    list_elements(value).any(|t| t.eq_ignore_ascii_case(token))
}

/// The value of every Content-Length line, which must agree.
pub(crate) fn content_length<'a>(
    values: impl Iterator<Item = &'a [u8]>,
) -> Result<Option<u64>, FramingError> {
    let mut length = None;
    for value in values {
        for part in list_elements(value) {
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(FramingError::BadContentLength);
            }
            // Leading zeros are digits like any (RFC 9110 §8.6); past them, 18 digits
            // always fit in a u64.
            let significant = &part[part.iter().take_while(|&&d| d == b'0').count()..];
            if significant.len() > 18 {
                return Err(FramingError::BadContentLength);
            }
            let n = significant
                .iter()
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if length.is_some_and(|l| l != n) {
                return Err(FramingError::BadContentLength);
            }
            length = Some(n);
        }
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_value_is_read_as_has_token_and_names_headers_read_it() {
        for value in [
            &b""[..],
            b"close",
            b"Keep-Alive",
            b" keep-alive , close",
            b"close, X-Hop",
            b"X-Hop",
            b",, ,",
            b"keep-alive,",
            b"upgrade\t",
        ] {
            let mut tokens = ConnectionTokens::default();
            tokens.add(value);
            let shown = String::from_utf8_lossy(value);
            assert_eq!(tokens.close, has_token(value, b"close"), "{shown}");
            assert_eq!(
                tokens.keep_alive,
                has_token(value, b"keep-alive"),
                "{shown}"
            );
            assert_eq!(tokens.names_headers, names_headers(value), "{shown}");
        }
    }

    #[test]
    fn a_header_table_finds_every_value_of_a_name_in_any_case_and_nothing_else() {
        let raw = b"GET / HTTP/1.1\r\nX-Auth-Token: a\r\nHost: gw\r\nx-AUTH-token: b\r\n\
            X-Able-Ten: key-twin\r\nX-Auth-Tokens: longer\r\n\r\n";
        let mut storage = [httparse::EMPTY_HEADER; 8];
        let mut req = httparse::Request::new(&mut storage);
        assert!(req.parse(raw).unwrap().is_complete());
        let mut table = HeaderTable::default();
        table.fill(raw, req.headers);
        let named = |name: &str| table.named(raw, name.as_bytes()).collect::<Vec<_>>();
        assert_eq!(named("x-auth-token"), [&b"a"[..], b"b"]);
        assert_eq!(named("X-AUTH-TOKEN"), [&b"a"[..], b"b"]);
        // Same length, first and last bytes: told apart by its bytes.
        assert_eq!(NameKey::of(b"x-able-ten"), NameKey::of(b"x-auth-ten"));
        assert_eq!(named("x-able-ten"), [&b"key-twin"[..]]);
        assert!(named("x-auth-ten").is_empty());
        assert!(named("content-length").is_empty());
        assert!(named("").is_empty());
        assert_eq!(table.len(), 5);
        assert_eq!(table.iter(raw).nth(1), Some((&b"Host"[..], &b"gw"[..])));
        // Filled again for the next head: nothing of the last one is left.
        let next = b"GET / HTTP/1.1\r\nHost: other\r\n\r\n";
        let mut storage = [httparse::EMPTY_HEADER; 8];
        let mut req = httparse::Request::new(&mut storage);
        assert!(req.parse(next).unwrap().is_complete());
        table.fill(next, req.headers);
        assert!(table.named(next, b"x-auth-token").next().is_none());
        assert_eq!(table.named(next, b"host").next(), Some(&b"other"[..]));
    }

    #[test]
    fn a_read_has_room_for_a_chunk_once_past_the_first_buffer() {
        let mut buf = BytesMut::new();
        reserve_for_read(&mut buf, FIRST_BUFFER);
        assert_eq!(buf.capacity(), FIRST_BUFFER);
        // Most of it read: a chunk more.
        buf.extend_from_slice(&[b'x'; FIRST_BUFFER - 100]);
        reserve_for_read(&mut buf, FIRST_BUFFER);
        assert!(buf.capacity() - buf.len() >= READ_CHUNK);
        // All of it read and taken (a body relayed on): the caller asks for a chunk.
        let filled = buf.capacity() - buf.len();
        buf.extend_from_slice(&vec![b'x'; filled]);
        let all = buf.len();
        bytes::Buf::advance(&mut buf, all);
        reserve_for_read(&mut buf, READ_CHUNK);
        assert!(buf.capacity() >= READ_CHUNK);
        // Room enough already: nothing changes.
        let before = buf.capacity();
        reserve_for_read(&mut buf, READ_CHUNK);
        assert_eq!(buf.capacity(), before);
    }
}
