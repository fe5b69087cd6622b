//! Response heads from a backend: status, framing and reuse decided once, headers kept as
//! positions within the upstream read buffer.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::{
    complete, content_length, has_token, is_bodiless_status, position, transfer_coding,
    ConnectionTokens, Framing, HeadError, HeaderTable, TransferCoding, MAX_HEADERS,
};

/// A parsed response head from the backend, as positions in the upstream read buffer;
/// reused like [`super::RequestHead`].
#[derive(Debug)]
pub struct ResponseHead {
    /// Bytes of the head, final CRLF included.
    pub len: usize,
    pub status: u16,
    pub framing: Framing,
    /// The connection can carry another exchange after this response: the backend keeps it
    /// open and the response's framing was unambiguous.
    pub keep_alive: bool,
    /// A `Connection` header names hop-by-hop headers (see [`Self::connection_lists`]).
    pub declares_hop_headers: bool,
    /// Header lines (without the status line), to be relayed selectively.
    headers: HeaderTable,
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
            headers: HeaderTable::default(),
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
        if !(100..=599).contains(&status) {
            return Err(HeadError::Malformed);
        }
        self.headers.fill(buf, resp.headers);
        let named = |name: &'static str| self.headers.named(buf, name.as_bytes());
        let mut connection = ConnectionTokens::default();
        for value in named("connection") {
            connection.add(value);
        }
        let length = content_length(named("content-length")).map_err(|_| HeadError::Malformed)?;
        let coding = transfer_coding(named("transfer-encoding"));
        // RFC 9112 §6.3, with one coding spoken: chunked. A body declared two ways, or by a
        // status that has none, is relayed as the rule says, and the connection is not trusted
        // after it: bytes could follow that another parser would count as the next answer.
        let (framing, ambiguous) = match coding {
            _ if is_bodiless_status(status) => (
                Framing::Length(0),
                coding != TransferCoding::Absent || length.is_some_and(|n| n > 0),
            ),
            TransferCoding::Chunked => (Framing::Chunked, length.is_some()),
            TransferCoding::Absent => (length.map_or(Framing::UntilClose, Framing::Length), false),
            TransferCoding::Other => return Err(HeadError::UnsupportedTransferCoding),
        };
        self.declares_hop_headers = connection.names_headers;
        self.framing = framing;
        self.len = len;
        self.status = status;
        self.keep_alive = connection.persistent(resp.version == Some(0))
            && !ambiguous
            && framing != Framing::UntilClose;
        self.reason = position(buf, resp.reason.unwrap_or_default().as_bytes());
        Ok(true)
    }

    /// The reason phrase, from the head's buffer.
    pub fn reason<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.reason.clone()]
    }

    /// Every header line, from the head's buffer.
    pub fn headers<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        self.headers.iter(buf)
    }

    /// Whether a `Connection` header lists `name`: such a header is hop-by-hop by the backend's
    /// declaration (RFC 9110 §7.6.1) and is not relayed.
    pub fn connection_lists(&self, buf: &[u8], name: &[u8]) -> bool {
        self.headers
            .named(buf, b"connection")
            .any(|v| has_token(v, name))
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
        let r = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n");
        assert_eq!(
            (r.framing, r.keep_alive),
            (Framing::Chunked, false),
            "declared two ways: relayed as chunked, the connection not trusted after it"
        );
        let r = head("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
        assert!(!r.keep_alive);
        let r = head("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n");
        assert!(r.keep_alive);
        // `close` on any line ends the connection, whatever a later line says.
        for lines in [
            "Connection: close\r\nConnection: keep-alive",
            "Connection: keep-alive\r\nConnection: close",
            "Connection: close, keep-alive",
        ] {
            let r = head(&format!(
                "HTTP/1.1 200 OK\r\n{lines}\r\nContent-Length: 1\r\n\r\n"
            ));
            assert!(!r.keep_alive, "{lines:?}");
        }
        let r = head("HTTP/1.1 200 OK\r\nContent-Length: 0000000000000000019\r\n\r\n");
        assert_eq!(
            r.framing,
            Framing::Length(19),
            "leading zeros count for nothing"
        );
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
        for declared in ["Content-Length: 5", "Transfer-Encoding: chunked"] {
            let r = head(&format!("HTTP/1.1 304 Not Modified\r\n{declared}\r\n\r\n"));
            assert_eq!(
                (r.framing, r.keep_alive),
                (Framing::Length(0), false),
                "{declared}"
            );
        }
        let r = head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Length(5), true));
        let mut r = ResponseHead::default();
        assert_eq!(r.parse(b"HTTP/1.1 200 OK\r\n"), Ok(false));
        assert!(r.parse(b"SSH-2.0\r\n\r\n").is_err());
        for status in ["000", "099", "600", "999"] {
            let raw = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
            assert_eq!(
                r.parse(raw.as_bytes()),
                Err(HeadError::Malformed),
                "{status}"
            );
        }
        for coding in [
            "gzip",
            "chunked, gzip",
            "gzip, chunked",
            "chunked, chunked",
            "chunked\r\nTransfer-Encoding: chunked",
            "\u{a0}chunked",
            "chunked,",
        ] {
            let raw = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: {coding}\r\n\r\n");
            assert_eq!(
                r.parse(raw.as_bytes()),
                Err(HeadError::UnsupportedTransferCoding),
                "{coding:?}"
            );
        }
    }
}
