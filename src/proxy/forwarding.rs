//! Which headers cross each hop, in one place, and the request head sent upstream. Pure.
//!
//! A request is forwarded with its own headers minus those that describe the client's hop
//! ([`NOT_FORWARDED`], and any the client named in `Connection`), and with the ones the
//! gateway owns written by the gateway: the exact `Content-Length` of the body it read, the
//! request id, `X-Forwarded-For`, `X-Forwarded-Proto` and, when it traces, `traceparent` (the
//! client's `tracestate` only with the client's trace). (Answers going the other way: [`crate::proxy::relay`].)

use std::net::IpAddr;

use bytes::{BufMut, BytesMut};

use crate::http1::RequestWriter;
use crate::observe::trace::Propagation;
use crate::policy::admit::RequestView;
use crate::policy::client::FORWARDED_PROTO;
use crate::policy::headers::{NOT_FORWARDED, TRACEPARENT, TRACESTATE};
use crate::policy::request_id;

/// Bodies up to this size travel in the same buffer as the head: one `send` per request.
pub const INLINE_BODY_MAX: usize = 16 * 1024;

/// What goes upstream: the client's request as admitted, on the way to the backend.
pub struct UpstreamRequest<'a, R> {
    pub view: &'a R,
    pub body: &'a [u8],
    /// The backend path and query, from admission.
    pub path: &'a str,
    pub request_id: &'a str,
    /// The connection's peer (the PROXY protocol's source, else the TCP peer), appended to
    /// `X-Forwarded-For`.
    pub client_ip: Option<IpAddr>,
    /// `X-Forwarded-Proto`: `http` or `https` ([`crate::policy::client::forwarded_proto`]).
    pub proto: &'a str,
    /// The trace context the gateway sends instead of the client's; `None` when it does not
    /// trace (the client's passes unchanged).
    pub trace: Option<Propagation>,
}

impl<R: RequestView> UpstreamRequest<'_, R> {
    /// Writes the request head into `out`: the new path, the client's headers minus
    /// hop-by-hop ones, an exact Content-Length for the buffered body, the request id,
    /// `X-Forwarded-For` and the gateway's `traceparent`. A body up to [`INLINE_BODY_MAX`] is appended, so a small request
    /// costs one `send`; a larger one is sent from where it lies ([`Self::separate_body`]).
    pub fn write_head(&self, out: &mut BytesMut) {
        let req = self.view;
        out.clear();
        let mut w = RequestWriter::new(out, req.method(), self.path);
        // The authority of the target, when it has one, is the Host (RFC 9112 §3.2.2); the
        // Host line, if any, is said once (admission refuses two).
        let authority = req.authority();
        let mut has_host = false;
        let declares_hop_headers = req.declares_hop_headers();
        let mut cookies = 0;
        for (name, value) in req.headers() {
            let is_host = name.eq_ignore_ascii_case(b"host");
            if NOT_FORWARDED.contains(name)
                || (is_host && authority.is_some())
                || (declares_hop_headers && req.connection_lists(name))
                || self.trace.is_some_and(|t| replaced_by(&t, name))
            {
                continue;
            }
            if name.eq_ignore_ascii_case(b"cookie") {
                cookies += 1;
                continue;
            }
            has_host |= is_host;
            w.header(name, value);
        }
        if !has_host {
            // HTTP/1.1 upstreams need Host; an HTTP/1.0 client may not have sent one.
            w.header("host", authority.unwrap_or("localhost"));
        }
        if cookies > 0 {
            // One line (RFC 9113 §8.2.3: an HTTP/2 client may split it in crumbs).
            w.start_value(b"cookie");
            for (i, crumb) in req.headers_named("cookie").enumerate() {
                if i > 0 {
                    w.value_part(b"; ");
                }
                w.value_part(crumb);
            }
            w.end_value();
        }
        if !self.body.is_empty() || req.method() == "POST" {
            w.number("content-length", self.body.len() as u64);
        }
        w.header(request_id::HEADER, self.request_id);
        if let Some(ip) = self.client_ip {
            w.start_value(b"x-forwarded-for");
            // An empty one (`X-Forwarded-For:`) adds no empty entry.
            for prior in req
                .headers_named("x-forwarded-for")
                .filter(|v| !v.trim_ascii().is_empty())
            {
                w.value_part(prior).value_part(b", ");
            }
            w.value_ip(ip).end_value();
        }
        w.header(FORWARDED_PROTO, self.proto);
        if let Some(trace) = &self.trace {
            w.header(TRACEPARENT, &trace.traceparent[..]);
        }
        w.end();
        if self.body.len() <= INLINE_BODY_MAX {
            out.put_slice(self.body);
        }
    }

    /// The body when it is too large to travel in the head's buffer.
    pub fn separate_body(&self) -> Option<&[u8]> {
        (self.body.len() > INLINE_BODY_MAX).then_some(self.body)
    }
}

/// Whether the client's header `name` gives way to the gateway's trace context.
fn replaced_by(trace: &Propagation, name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(TRACEPARENT.as_bytes())
        || (!trace.keep_tracestate && name.eq_ignore_ascii_case(TRACESTATE.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::RequestHead;

    fn upstream_head(raw: &str, body: &[u8], client_ip: Option<&str>) -> String {
        traced_head(raw, body, client_ip, None)
    }

    fn traced_head(
        raw: &str,
        body: &[u8],
        client_ip: Option<&str>,
        trace: Option<Propagation>,
    ) -> String {
        let mut head = RequestHead::default();
        assert_eq!(head.parse(raw.as_bytes()), Ok(true));
        let view = head.view(raw.as_bytes());
        let request = UpstreamRequest {
            view: &view,
            body,
            path: "/backend/v2/x?q=1",
            request_id: "rid-1",
            client_ip: client_ip.map(|ip| ip.parse().unwrap()),
            proto: "http",
            trace,
        };
        let mut out = BytesMut::new();
        request.write_head(&mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn an_empty_x_forwarded_for_adds_no_empty_entry() {
        let got = upstream_head(
            "GET /api/v1/x HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For:\r\nX-Forwarded-For: 10.0.0.1\r\n\
             X-Forwarded-For:  \r\n\r\n",
            b"",
            Some("127.0.0.1"),
        );
        assert!(
            got.contains("\r\nx-forwarded-for: 10.0.0.1, 127.0.0.1\r\n"),
            "{got}"
        );
    }

    #[test]
    fn hop_headers_are_dropped_and_the_gateways_own_are_written() {
        let got = upstream_head(
            "POST /api/v1/x HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
             Keep-Alive: 5\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\
             X-Request-Id: client-id\r\nX-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: https\r\nX-Auth-Token: t\r\n\r\n",
            b"{}",
            Some("127.0.0.1"),
        );
        assert_eq!(
            got,
            "POST /backend/v2/x?q=1 HTTP/1.1\r\nHost: gw\r\nX-Auth-Token: t\r\n\
             content-length: 2\r\nx-request-id: rid-1\r\nx-forwarded-for: 10.0.0.1, 127.0.0.1\r\nx-forwarded-proto: http\r\n\r\n{}"
        );
    }

    #[test]
    fn an_http10_request_without_host_gets_one_and_a_get_no_length() {
        let got = upstream_head("GET http://gw:8080/a HTTP/1.0\r\n\r\n", b"", None);
        assert_eq!(
            got,
            "GET /backend/v2/x?q=1 HTTP/1.1\r\nhost: gw:8080\r\nx-request-id: rid-1\r\nx-forwarded-proto: http\r\n\r\n"
        );
    }

    #[test]
    fn an_absolute_target_names_the_host_and_cookies_go_as_one_line() {
        let got = upstream_head(
            "GET http://gw:8080/a HTTP/1.1\r\nHost: other\r\nCookie: a=1\r\nX-A: 1\r\nCookie: b=2\r\n\r\n",
            b"",
            None,
        );
        assert_eq!(
            got,
            "GET /backend/v2/x?q=1 HTTP/1.1\r\nX-A: 1\r\nhost: gw:8080\r\ncookie: a=1; b=2\r\n\
             x-request-id: rid-1\r\nx-forwarded-proto: http\r\n\r\n"
        );
    }

    #[test]
    fn cookies_named_in_connection_are_dropped_crumbs_and_all() {
        let got = upstream_head(
            "GET /a HTTP/1.1\r\nHost: gw\r\nConnection: cookie\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
            b"",
            None,
        );
        assert!(!got.to_ascii_lowercase().contains("cookie"), "{got}");
    }

    const TRACED: &str = "GET /a HTTP/1.1\r\nHost: gw\r\nTraceParent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\
        tracestate: a=1\r\ntracestate: b=2\r\n\r\n";
    const OURS: &[u8; 55] = b"00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";

    #[test]
    fn without_tracing_the_clients_trace_context_passes_unchanged() {
        let got = upstream_head(TRACED, b"", None);
        assert_eq!(
            got,
            "GET /backend/v2/x?q=1 HTTP/1.1\r\nHost: gw\r\n\
             TraceParent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\
             tracestate: a=1\r\ntracestate: b=2\r\nx-request-id: rid-1\r\nx-forwarded-proto: http\r\n\r\n"
        );
    }

    #[test]
    fn a_continued_trace_gets_the_gateways_traceparent_and_the_clients_tracestate() {
        let trace = Propagation {
            traceparent: *OURS,
            keep_tracestate: true,
        };
        let got = traced_head(TRACED, b"", None, Some(trace));
        assert_eq!(
            got,
            "GET /backend/v2/x?q=1 HTTP/1.1\r\nHost: gw\r\ntracestate: a=1\r\ntracestate: b=2\r\n\
             x-request-id: rid-1\r\nx-forwarded-proto: http\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01\r\n\r\n"
        );
    }

    #[test]
    fn a_new_trace_goes_on_without_the_clients_tracestate() {
        let trace = Propagation {
            traceparent: *OURS,
            keep_tracestate: false,
        };
        let got = traced_head(TRACED, b"", None, Some(trace));
        assert_eq!(
            got,
            "GET /backend/v2/x?q=1 HTTP/1.1\r\nHost: gw\r\nx-request-id: rid-1\r\n\
             x-forwarded-proto: http\r\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01\r\n\r\n"
        );
    }

    #[test]
    fn a_large_body_is_not_copied_into_the_head() {
        let body = vec![b'x'; INLINE_BODY_MAX + 1];
        let got = upstream_head("POST / HTTP/1.1\r\nHost: gw\r\n\r\n", &body, None);
        assert!(got.ends_with("\r\n\r\n"), "{got}");
        assert!(got.contains(&format!("content-length: {}\r\n", body.len())));
    }
}
