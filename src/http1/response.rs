//! Response heads from a backend: status, framing and reuse decided once, headers kept as
//! positions within the upstream read buffer.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::{
    complete, content_length, has_token, header_positions, names_headers, position, Framing,
    HeadError, HeaderPos, MAX_HEADERS,
};

/// A parsed response head from the backend, as positions in the upstream read buffer;
/// reused like [`super::RequestHead`].
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
    /// [`crate::policy::admit::RequestView::connection_lists`]).
    pub fn connection_lists(&self, buf: &[u8], name: &[u8]) -> bool {
        self.headers(buf)
            .any(|(n, v)| n.eq_ignore_ascii_case(b"connection") && has_token(v, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
