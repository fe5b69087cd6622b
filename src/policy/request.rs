//! A request head as the policy reads it, whatever protocol carried it: [`RequestView`], and
//! what its head says about the body ([`BodyLength`]). HTTP/1.1 and HTTP/2 each implement the
//! view in the data plane; admission, request ids and tracing read only the view.

use crate::http1::{has_token, names_headers};

/// A request head, whatever protocol carried it.
pub trait RequestView: Sync {
    fn method(&self) -> &str;
    /// The target's path, raw (still percent-encoded).
    fn path(&self) -> &str;
    fn query(&self) -> Option<&str>;
    /// Bytes of the request target as sent.
    fn target_len(&self) -> usize;
    /// The authority the client addressed, when the request line carries one.
    fn authority(&self) -> Option<&str>;
    /// Every header field, in order.
    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])>;
    fn header_count(&self) -> usize;
    /// Every value of the header `name` (in lower case).
    fn headers_named<'n>(&'n self, name: &'n str) -> impl Iterator<Item = &'n [u8]>;
    /// What the head says about the body's length.
    fn body_length(&self) -> BodyLength;
    /// Whether the protocol requires the request to name its host (a `Host` line, or an
    /// authority in the target): HTTP/1.1 does (RFC 9112 §3.2); HTTP/1.0 predates `Host`.
    fn host_required(&self) -> bool;

    /// The first value of a header.
    fn header<'n>(&'n self, name: &'n str) -> Option<&'n [u8]> {
        self.headers_named(name).next()
    }

    /// The value of a header sent exactly once: `None` when it is absent or repeated, since a
    /// repeated credential could be checked in one copy here and read in another upstream.
    fn single_header<'n>(&'n self, name: &'n str) -> Option<&'n [u8]> {
        let mut values = self.headers_named(name);
        let first = values.next()?;
        values.next().is_none().then_some(first)
    }

    /// Whether a comma-separated header has `token` among its values.
    fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers_named(name)
            .any(|v| has_token(v, token.as_bytes()))
    }

    /// Whether a `Connection` header lists `name`: such a header is hop-by-hop by the
    /// client's declaration (RFC 9110 §7.6.1) and is not forwarded.
    fn connection_lists(&self, name: &[u8]) -> bool {
        self.headers_named("connection").any(|v| has_token(v, name))
    }

    /// Whether a `Connection` header names any header (anything but `close`/`keep-alive`):
    /// only then is [`Self::connection_lists`] worth asking.
    fn declares_hop_headers(&self) -> bool {
        self.headers_named("connection").any(names_headers)
    }
}

/// What a request head says about its body's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// Exactly this many bytes.
    Declared(u64),
    /// Known only when the body ends (chunked, or HTTP/2 without `content-length`).
    Unknown,
    /// The framing could be read two ways: the request must be refused (request smuggling).
    Ambiguous,
}
