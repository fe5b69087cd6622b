//! Head writers: a response head for a client, a request head for a backend. Both write
//! straight into the connection's output buffer, one header at a time. And the
//! percent-encoding of what goes into a request target, and the escaping of text that goes into
//! an HTML body (the load report, the admin listener's board).

use std::fmt::Write as _;
use std::net::IpAddr;

use bytes::{BufMut, BytesMut};

/// Writes a response head: the status line, then one header at a time, then [`Self::end`].
pub struct ResponseWriter<'a> {
    out: &'a mut BytesMut,
}

impl<'a> ResponseWriter<'a> {
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
        ResponseWriter { out }
    }

    pub fn header(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> &mut Self {
        put_header(self.out, name.as_ref(), value.as_ref());
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

/// Writes a request head: the request line, then one header at a time, then [`Self::end`].
pub struct RequestWriter<'a> {
    out: &'a mut BytesMut,
}

impl<'a> RequestWriter<'a> {
    /// Starts `method target HTTP/1.1`.
    pub fn new(out: &'a mut BytesMut, method: &str, target: &str) -> Self {
        out.put_slice(method.as_bytes());
        out.put_u8(b' ');
        out.put_slice(target.as_bytes());
        out.put_slice(b" HTTP/1.1\r\n");
        RequestWriter { out }
    }

    pub fn header(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> &mut Self {
        put_header(self.out, name.as_ref(), value.as_ref());
        self
    }

    pub fn number(&mut self, name: &str, value: u64) -> &mut Self {
        self.header(name, itoa::Buffer::new().format(value))
    }

    /// Starts a header whose value the caller writes in pieces with [`Self::value_part`],
    /// ending it with [`Self::end_value`].
    pub fn start_value(&mut self, name: &[u8]) -> &mut Self {
        self.out.put_slice(name);
        self.out.put_slice(b": ");
        self
    }

    pub fn value_part(&mut self, part: &[u8]) -> &mut Self {
        self.out.put_slice(part);
        self
    }

    /// A value part that is an address's text ([`put_ip`]).
    pub fn value_ip(&mut self, ip: IpAddr) -> &mut Self {
        put_ip(self.out, ip);
        self
    }

    pub fn end_value(&mut self) -> &mut Self {
        self.out.put_slice(b"\r\n");
        self
    }

    /// Ends the head.
    pub fn end(self) {
        self.out.put_slice(b"\r\n");
    }
}

/// Fills `out` with the low hex digits of `v`, zero-padded, one digit a byte: hex written by
/// hand, with no formatter (request ids, chunk sizes).
#[inline]
pub fn put_hex(out: &mut [u8], mut v: u64) {
    for digit in out.iter_mut().rev() {
        *digit = b"0123456789abcdef"[(v & 0xf) as usize];
        v >>= 4;
    }
}

/// Writes an address's text, as `Display` writes it. An IPv4 address, the usual client, is
/// four numbers written straight in: the formatting machinery cost more than all of a
/// request's other headers. IPv6 goes through `Display`.
pub fn put_ip(out: &mut impl BufMut, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.put_u8(b'.');
                }
                out.put_slice(digits.format(octet).as_bytes());
            }
        }
        // Writing into a buffer does not fail.
        IpAddr::V6(v6) => drop(std::io::Write::write_fmt(
            &mut out.writer(),
            format_args!("{v6}"),
        )),
    }
}

fn put_header(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// `s` with everything but RFC 3986 unreserved characters percent-encoded: safe as one path
/// segment or one query value of a request target.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Text safe in HTML content and attribute values.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_writer_writes_a_status_line_and_headers() {
        let mut out = BytesMut::new();
        let mut w = ResponseWriter::new(&mut out, 404, b"");
        w.header("content-type", "application/json")
            .number("content-length", 7);
        w.end();
        assert_eq!(
            &out[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n"
        );
    }

    #[test]
    fn addresses_are_written_as_their_text() {
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "10.20.3.4",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = BytesMut::new();
            RequestWriter::new(&mut out, "GET", "/").value_ip(ip);
            assert_eq!(
                &out[b"GET / HTTP/1.1\r\n".len()..],
                ip.to_string().as_bytes()
            );
            let mut text = Vec::new();
            put_ip(&mut text, ip);
            assert_eq!(text, ip.to_string().as_bytes());
        }
    }

    #[test]
    fn the_request_writer_writes_a_request_line_and_headers() {
        let mut out = BytesMut::new();
        let mut w = RequestWriter::new(&mut out, "GET", "/healthz");
        w.header("host", "gw").number("content-length", 0);
        w.start_value(b"x-forwarded-for")
            .value_part(b"10.0.0.1, ")
            .value_part(b"127.0.0.1")
            .end_value();
        w.end();
        assert_eq!(
            &out[..],
            &b"GET /healthz HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\nx-forwarded-for: 10.0.0.1, 127.0.0.1\r\n\r\n"[..]
        );
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode("aZ09-._~"), "aZ09-._~");
        assert_eq!(
            percent_encode("sum(rate(x[5m])) / é"),
            "sum%28rate%28x%5B5m%5D%29%29%20%2F%20%C3%A9"
        );
    }
}
