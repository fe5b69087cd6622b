//! Header rules, one table each: the request headers that describe the client's hop or are
//! the gateway's own to write, the trace context it replaces when it traces, the answer
//! headers that describe the backend's hop or its framing, and the names a client may not
//! send under an underscore alias nor declare hop-by-hop.

use super::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};
use super::request_id;
use crate::http1::list_elements;

/// Request headers that describe one hop, not the request, that the gateway sets itself, or
/// that would tell the backend something other than what the gateway decided on; never
/// forwarded as sent.
pub const NOT_FORWARDED: HeaderNames<28> = HeaderNames::new([
    // The client's hop and its framing.
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
    // Written by the gateway.
    request_id::HEADER,
    "x-forwarded-for",
    "x-forwarded-proto",
    // Another path or method than the one admitted, for the frameworks that route by them
    // (Symfony, IIS, Laravel, Rails, ...): a request admitted for one service would be served
    // by another, or a read run as a write.
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    // Who the client is, or where it called, in a client's own words: a backend reading them
    // would believe what the gateway did not. The gateway's `X-Forwarded-For` (the peer it
    // saw, appended) and `X-Forwarded-Proto` say it, and `Host` goes on as sent.
    "forwarded",
    "x-real-ip",
    "x-forwarded-host",
    "x-forwarded-port",
    // The same, by the other names frameworks read: the scheme (`X-Forwarded-Ssl: on`, which
    // Rack and Spring read before or beside `X-Forwarded-Proto`, and `X-Forwarded-Scheme`), the
    // path prefix the client called under (Spring, Werkzeug, ASP.NET), and its address (Rails
    // reads `Client-IP`; CDNs write the others).
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-forwarded-prefix",
    "client-ip",
    "true-client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
]);

/// The W3C trace context (`traceparent`, `tracestate`). When the gateway traces, the backend
/// gets the gateway's own `traceparent` instead of the client's (and the client's `tracestate`
/// only when its trace goes on); when it does not, both pass unchanged.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// Answer headers of the backend's that describe its hop or its framing, or that the
/// gateway sets itself: a client gets the gateway's own framing headers, never the backend's.
pub const NOT_RELAYED: HeaderNames<7> = HeaderNames::new([
    "connection",
    "keep-alive",
    "proxy-connection",
    // Hop-by-hop, and fatal to an HTTP/2 answer (RFC 9113 §8.2.2): `h2` refuses to send it.
    // (`Upgrade`, which a 426 carries to an HTTP/1.1 client, pingora drops on HTTP/2.)
    "te",
    "content-length",
    "transfer-encoding",
    request_id::HEADER,
]);

/// Request headers the gateway reads to decide, beyond the ones it never forwards.
const DECIDED_ON: HeaderNames<4> =
    HeaderNames::new([AUTH_TOKEN_HEADER, AGENT_ID_HEADER, "content-type", "host"]);

/// Whether a `Connection` value lists a header the gateway decides on. Listed, it would be
/// hop-by-hop by the client's declaration (RFC 9110 §7.6.1) and dropped on the way: the
/// backend would get the request the gateway admitted without the credentials, content type
/// or host it was admitted on (a hop-by-hop header abuse). The request is refused.
pub fn connection_lists_decided(value: &[u8]) -> bool {
    list_elements(value).any(|token| DECIDED_ON.contains(token))
}

/// Up to this many names, a set compares a name with each: constants once inlined, which
/// the compiler compares length first, then byte by byte. Past it, the table by length costs
/// less. Measured with benches/instructions.sh, when [`NOT_FORWARDED`] had 21 names: they
/// cost some 450 instructions a request compared one by one, about 100 by the table; the 7 of
/// [`NOT_RELAYED`] cost some 280 more by the table than one by one.
const SMALL: usize = 8;

/// A set of header names, in lower case. A large one is looked up by length first: most
/// names a message carries have no name of their length in the set and are passed over
/// without a byte compared.
pub struct HeaderNames<const N: usize> {
    names: [&'static str; N],
    /// For each length, which of `names` have it: bit `i` for `names[i]`.
    by_length: [u32; 32],
}

impl<const N: usize> HeaderNames<N> {
    /// The set of `names`; a name not in lower case, or too long for the table, does not
    /// compile.
    pub const fn new(names: [&'static str; N]) -> Self {
        assert!(N <= 32, "at most 32 names: one bit each");
        let mut by_length = [0u32; 32];
        let mut i = 0;
        while i < N {
            let name = names[i].as_bytes();
            assert!(
                !name.is_empty() && name.len() < 32,
                "a header name of 1 to 31 bytes"
            );
            let mut b = 0;
            while b < name.len() {
                assert!(!name[b].is_ascii_uppercase(), "header names in lower case");
                b += 1;
            }
            by_length[name.len()] |= 1 << i;
            i += 1;
        }
        Self { names, by_length }
    }

    /// Whether `name`, in any case, is one of the set. Inlined: called once per header, and
    /// most calls end at the length's compare or the table's lookup.
    #[inline(always)]
    pub fn contains(&self, name: &[u8]) -> bool {
        if N <= SMALL {
            // A few names, each a constant once inlined: compared outright.
            return self
                .names
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n.as_bytes()));
        }
        let (Some(&(mut candidates)), Some(first), Some(last)) =
            (self.by_length.get(name.len()), name.first(), name.last())
        else {
            return false;
        };
        let (first, last) = (first.to_ascii_lowercase(), last.to_ascii_lowercase());
        while candidates != 0 {
            let listed = self.names[candidates.trailing_zeros() as usize].as_bytes();
            // The first and last bytes tell most names of one length apart (`x-forwarded-*`
            // and `x-service-agent-id` share their first), before a whole compare.
            if listed[0] == first
                && listed[listed.len() - 1] == last
                && name.eq_ignore_ascii_case(listed)
            {
                return true;
            }
            candidates &= candidates - 1;
        }
        false
    }

    /// The names, as written.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }
}

/// Whether `name` has an underscore and, read with `-` for `_` as CGI, WSGI and many
/// frameworks read it, names a header the gateway controls (framing, hop-by-hop, credentials,
/// content type, the ones it writes, and the overrides of path, method or client it drops).
/// A backend could take such a header for the one the gateway checked or dropped, or for a
/// second framing: the request is refused.
pub fn aliases_controlled(name: &[u8]) -> bool {
    if !name.contains(&b'_') {
        return false;
    }
    NOT_FORWARDED
        .names()
        .iter()
        .chain(DECIDED_ON.names())
        .any(|controlled| {
            controlled.len() == name.len()
                && controlled.bytes().zip(name).all(|(c, n)| {
                    let n = if *n == b'_' {
                        b'-'
                    } else {
                        n.to_ascii_lowercase()
                    };
                    c == n
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `set` finds `name` when a compare with each of its names does, and finds its `pick`th
    /// name in any case.
    fn finds_as_each_compare<const N: usize>(
        set: &HeaderNames<N>,
        name: &str,
        pick: usize,
    ) -> Result<(), TestCaseError> {
        let each = set.names().iter().any(|n| name.eq_ignore_ascii_case(n));
        prop_assert_eq!(set.contains(name.as_bytes()), each, "{}", name);
        let listed = set.names()[pick % N];
        prop_assert!(set.contains(listed.to_ascii_uppercase().as_bytes()));
        prop_assert!(set.contains(listed.as_bytes()));
        Ok(())
    }

    /// Names that share a listed name's length and first byte, or all but one byte of it,
    /// are not in the set: the table narrows the compares, it does not replace them.
    #[test]
    fn near_misses_of_listed_names_are_not_in_the_set() {
        for name in [
            "x-real-ix",
            "content-lengtx",
            "x-forwarded-fox",
            "connectiom",
            "keep-alivf",
            "f-original-url",
            "x_forwarded_for",
        ] {
            assert!(!NOT_FORWARDED.contains(name.as_bytes()), "{name}");
            assert!(!NOT_RELAYED.contains(name.as_bytes()), "{name}");
        }
        assert!(!DECIDED_ON.contains(b"hosx"));
        assert!(NOT_FORWARDED.contains(b"X-Real-IP") && NOT_RELAYED.contains(b"Keep-Alive"));
    }

    proptest! {
        #[test]
        fn a_header_set_finds_what_a_compare_with_each_name_finds(
            name in "[a-zA-Z_-]{0,40}",
            pick in 0..32usize,
        ) {
            finds_as_each_compare(&NOT_FORWARDED, &name, pick)?;
            finds_as_each_compare(&NOT_RELAYED, &name, pick)?;
            finds_as_each_compare(&DECIDED_ON, &name, pick)?;
        }
    }

    #[test]
    fn a_connection_value_lists_a_decided_header_in_any_case_and_place() {
        for (value, lists) in [
            (&b"keep-alive, X-Auth-Token"[..], true),
            (b"x-service-agent-id", true),
            (b"close,Host", true),
            (b"  content-type  ,keep-alive", true),
            (b"keep-alive", false),
            (b"close, x-custom", false),
            (b"X-Auth-Tokens", false),
            (b"hostname", false),
            (b"", false),
        ] {
            let shown = String::from_utf8_lossy(value);
            assert_eq!(connection_lists_decided(value), lists, "{shown}");
        }
    }

    #[test]
    fn underscore_names_alias_controlled_headers_only() {
        for (name, aliases) in [
            (&b"Transfer_Encoding"[..], true),
            (b"content_length", true),
            (b"X_Auth_Token", true),
            (b"X_SERVICE_AGENT_ID", true),
            (b"x-service_agent-id", true),
            (b"Content_Type", true),
            (b"X_Request_Id", true),
            (b"Proxy_Connection", true),
            (b"X_Original_URL", true),
            (b"x_real_ip", true),
            (b"X_Forwarded_Ssl", true),
            (b"true_client_ip", true),
            (b"Transfer-Encoding", false),
            (b"X_Custom", false),
            (b"X_Auth_Token_2", false),
            (b"Connection_", false),
            (b"_", false),
        ] {
            let shown = String::from_utf8_lossy(name);
            assert_eq!(aliases_controlled(name), aliases, "{shown}");
        }
    }
}
