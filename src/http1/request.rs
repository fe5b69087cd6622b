//! Request heads: parsed into positions within the connection's read buffer, and read through
//! [`Request`], a view of it over that buffer.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::{
    complete, content_length, position, transfer_coding, ConnectionTokens, Framing, FramingError,
    HeadError, HeaderTable, TransferCoding, MAX_HEADERS,
};

/// A parsed request head, as positions in the connection's read buffer, with what the
/// request line and the framing headers say worked out once, at parse: a request's head is
/// read many times (admission, forwarding, logging), and each read is a slice. Reused from
/// one request to the next, so parsing allocates nothing once the connection is warm.
#[derive(Debug)]
pub struct RequestHead {
    /// Bytes of the head, final CRLF included: where the body starts.
    pub len: usize,
    method: Range<usize>,
    target: Range<usize>,
    /// The target's path (empty: `/`), query and authority (absolute form), split at parse.
    path: Range<usize>,
    query: Option<Range<usize>>,
    authority: Option<Range<usize>>,
    /// HTTP/1.0 rather than 1.1.
    pub http10: bool,
    /// The method is `HEAD`: its answers have no body.
    pub method_is_head: bool,
    framing: Result<Framing, FramingError>,
    keep_alive: bool,
    headers: HeaderTable,
}

impl Default for RequestHead {
    fn default() -> Self {
        RequestHead {
            len: 0,
            method: 0..0,
            target: 0..0,
            path: 0..0,
            query: None,
            authority: None,
            http10: false,
            method_is_head: false,
            framing: Ok(Framing::Length(0)),
            keep_alive: false,
            headers: HeaderTable::default(),
        }
    }
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
        let target = req.path.unwrap_or_default();
        let parts = TargetParts::of(target);
        let at = |part: &str| position(buf, part.as_bytes());
        self.len = len;
        self.method = at(req.method.unwrap_or_default());
        self.target = at(target);
        self.path = at(parts.path);
        self.query = parts.query.map(at);
        self.authority = parts.authority.map(at);
        self.http10 = req.version == Some(0);
        self.method_is_head = req.method == Some("HEAD");
        self.headers.fill(buf, req.headers);
        // Read from the headers alone: no view of the head, whose text is checked as UTF-8.
        self.framing = self.read_framing(buf);
        self.keep_alive = self.read_keep_alive(buf);
        Ok(true)
    }

    /// [`Self::framing`], read from the headers (at parse).
    fn read_framing(&self, buf: &[u8]) -> Result<Framing, FramingError> {
        let length = content_length(self.headers.named(buf, b"content-length"))?;
        match transfer_coding(self.headers.named(buf, b"transfer-encoding")) {
            TransferCoding::Absent => Ok(Framing::Length(length.unwrap_or(0))),
            TransferCoding::Chunked if length.is_none() && !self.http10 => Ok(Framing::Chunked),
            _ => Err(FramingError::BadTransferEncoding),
        }
    }

    /// [`Self::wants_keep_alive`], read from the version and headers (at parse).
    fn read_keep_alive(&self, buf: &[u8]) -> bool {
        let mut connection = ConnectionTokens::default();
        for value in self.headers.named(buf, b"connection") {
            connection.add(value);
        }
        connection.persistent(self.http10)
    }

    /// How the body is framed ([`Request::framing`]), read without a view of the head.
    pub fn framing(&self) -> Result<Framing, FramingError> {
        self.framing
    }

    /// Whether the client asked to keep the connection open ([`Request::wants_keep_alive`]).
    pub fn wants_keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// Frees the header table while no head is being read (a connection waiting for its
    /// next request); the next [`Self::parse`] allocates it at the size it needs.
    pub fn release(&mut self) {
        self.headers.release();
    }

    /// How many header positions the table has room for (what [`Self::release`] frees).
    #[cfg(test)]
    pub(crate) fn header_table_capacity(&self) -> usize {
        self.headers.capacity()
    }

    /// The head over the buffer it was parsed from.
    pub fn view<'a>(&'a self, buf: &'a [u8]) -> Request<'a> {
        // The request line's method and target are text (httparse read them as `str`): one
        // check for both, then each part is a slice of it.
        let start = self.method.start.min(self.target.start);
        let line = std::str::from_utf8(&buf[start..self.target.end]).unwrap_or_default();
        let text = |r: &Range<usize>| {
            let r = r.start.saturating_sub(start)..r.end.saturating_sub(start);
            line.get(r).unwrap_or_default()
        };
        let path = text(&self.path);
        Request {
            head: self,
            buf,
            method: text(&self.method),
            target: text(&self.target),
            path: if path.is_empty() { "/" } else { path },
            query: self.query.as_ref().map(text),
            authority: self.authority.as_ref().map(text),
        }
    }
}

/// A request target's parts: the authority of an absolute-form target, the path (empty for
/// `http://host`), and the query; a fragment is dropped.
struct TargetParts<'a> {
    authority: Option<&'a str>,
    path: &'a str,
    query: Option<&'a str>,
}

impl<'a> TargetParts<'a> {
    fn of(target: &'a str) -> Self {
        // Searched with memchr: `str`'s searchers cost more than the rest of the parse.
        let find = |text: &str, byte| memchr::memchr(byte, text.as_bytes());
        let scheme_end = if target.starts_with('/') {
            None
        } else {
            target.find("://")
        };
        let (authority, origin) = match scheme_end {
            Some(i) => {
                let after = &target[i + 3..];
                let slash = find(after, b'/').unwrap_or(after.len());
                (Some(&after[..slash]), &after[slash..])
            }
            None => (None, target),
        };
        let origin = &origin[..find(origin, b'#').unwrap_or(origin.len())];
        let (path, query) = match find(origin, b'?') {
            Some(i) => (&origin[..i], Some(&origin[i + 1..])),
            None => (origin, None),
        };
        TargetParts {
            authority,
            path,
            query,
        }
    }
}

/// A parsed request head over its buffer: each part a slice of it.
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
        self.head.headers.iter(self.buf)
    }

    pub fn header_count(&self) -> usize {
        self.head.headers.len()
    }

    /// Every value of a header (`name` in any case).
    pub fn headers_named<'n>(&self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + 'n
    where
        'a: 'n,
    {
        self.head.headers.named(self.buf, name.as_bytes())
    }

    /// How the body is framed; conflicting or unsupported framing is refused, so a body is
    /// never read one way here and another way by the backend (request smuggling).
    pub fn framing(&self) -> Result<Framing, FramingError> {
        self.head.framing
    }

    /// Whether the client asked to keep the connection open after this request.
    pub fn wants_keep_alive(&self) -> bool {
        self.head.keep_alive
    }
}

/// A `Host` value (RFC 9110 7.2: a host, then `:` and a port) as its host and port:
/// `[::1]:8080` is `::1` and 8080, a bare IPv6 address a host without a port. `None` when it
/// is none: unmatched brackets, a port that is not a number, nothing.
pub fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    let (address, port) = if let Some(bracketed) = host.strip_prefix('[') {
        let (address, after) = bracketed.split_once(']')?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        (address, port)
    } else {
        match host.split_once(':') {
            Some((name, port)) if !port.contains(':') => (name, Some(port)),
            _ => (host, None),
        }
    };
    let port = port.map(str::parse).transpose().ok()?;
    (!address.is_empty()).then_some((address, port))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(req.headers_named("x-auth-token").next(), Some(&b"t"[..]));
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
    fn the_request_line_is_split_once_wherever_the_head_starts() {
        // A client may send empty lines before a request line (RFC 9112 §2.2): the parts
        // are positions in the buffer, not in the line.
        let (head, buf) = parse("\r\nGET /a/b?q=1#frag HTTP/1.1\r\nHost: gw\r\n\r\n");
        let req = head.view(&buf);
        assert_eq!(
            (req.method(), req.target(), req.path(), req.query()),
            ("GET", "/a/b?q=1#frag", "/a/b", Some("q=1"))
        );
        let (head, buf) = parse("GET /a? HTTP/1.1\r\n\r\n");
        assert_eq!(head.view(&buf).query(), Some(""));
        let (head, buf) = parse("GET /caf\u{e9} HTTP/1.1\r\n\r\n");
        assert_eq!(head.view(&buf).path(), "/caf\u{e9}");
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
        // Leading zeros are digits like any: the 18 a length may have come after them.
        assert_eq!(
            framing("Content-Length: 0000000000000000025\r\n"),
            Ok(Framing::Length(25))
        );
        assert_eq!(
            framing("Content-Length: 00999999999999999999\r\n"),
            Ok(Framing::Length(999_999_999_999_999_999))
        );
        assert_eq!(framing("Content-Length: 000\r\n"), Ok(Framing::Length(0)));
        for bad in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: 0001000000000000000000\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 1e3\r\n",
            "Content-Length: \r\n",
            "Content-Length: 99999999999999999999\r\n",
        ] {
            assert_eq!(framing(bad), Err(FramingError::BadContentLength), "{bad}");
        }
        assert_eq!(
            framing("Transfer-Encoding: \t chunked \t\r\n"),
            Ok(Framing::Chunked),
            "optional whitespace is spaces and tabs"
        );
        for bad in [
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: identity\r\n",
            "Transfer-Encoding: \u{a0}chunked\r\n",
            "Transfer-Encoding: chunked, chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked,\r\n",
            "Transfer-Encoding: \r\n",
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
    fn hosts_split_into_address_and_port() {
        assert_eq!(split_host("gw.test"), Some(("gw.test", None)));
        assert_eq!(split_host("gw.test:8080"), Some(("gw.test", Some(8080))));
        assert_eq!(split_host("[::1]:8080"), Some(("::1", Some(8080))));
        assert_eq!(split_host("[::1]"), Some(("::1", None)));
        assert_eq!(split_host("gw:x"), None);
        assert_eq!(split_host(""), None);
    }
}
