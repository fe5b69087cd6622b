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
pub const NOT_FORWARDED: [&str; 21] = [
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
];

/// The W3C trace context (`traceparent`, `tracestate`). When the gateway traces, the backend
/// gets the gateway's own `traceparent` instead of the client's (and the client's `tracestate`
/// only when its trace goes on); when it does not, both pass unchanged.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// Answer headers of the backend's that describe its hop or its framing, or that the
/// gateway sets itself: a client gets the gateway's own framing headers, never the backend's.
pub const NOT_RELAYED: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    // Hop-by-hop, and fatal to an HTTP/2 answer (RFC 9113 §8.2.2): `h2` refuses to send it.
    // (`Upgrade`, which a 426 carries to an HTTP/1.1 client, pingora drops on HTTP/2.)
    "te",
    "content-length",
    "transfer-encoding",
    request_id::HEADER,
];

/// Request headers the gateway reads to decide, beyond the ones it never forwards.
const DECIDED_ON: [&str; 4] = [AUTH_TOKEN_HEADER, AGENT_ID_HEADER, "content-type", "host"];

/// Whether a `Connection` value lists a header the gateway decides on. Listed, it would be
/// hop-by-hop by the client's declaration (RFC 9110 §7.6.1) and dropped on the way: the
/// backend would get the request the gateway admitted without the credentials, content type
/// or host it was admitted on (a hop-by-hop header abuse). The request is refused.
pub fn connection_lists_decided(value: &[u8]) -> bool {
    list_elements(value).any(|token| is_listed(&DECIDED_ON, token))
}

/// Whether `name` is one of `list` (which is in lower case).
pub fn is_listed(list: &[&str], name: &[u8]) -> bool {
    list.iter().any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

/// Whether `name` has an underscore and, read with `-` for `_` as CGI, WSGI and many
/// frameworks read it, names a header the gateway controls (framing, hop-by-hop, credentials,
/// content type, the ones it writes). A backend could take such a header for the one the
/// gateway checked, or for a second framing: the request is refused.
pub fn aliases_controlled(name: &[u8]) -> bool {
    if !name.contains(&b'_') {
        return false;
    }
    NOT_FORWARDED.iter().chain(&DECIDED_ON).any(|controlled| {
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
