//! Routing: which operation a client path names, and the upstream path it is forwarded to.
//!
//! Pure functions over `&str`, driven by the operation table ([`super::operation`]); no I/O.
//! Paths are matched on raw (still percent-encoded) bytes, segment by segment, so a prefix
//! only matches on a whole segment (`/api/v1beta` is not `/api/v1`) and `a%2Fb` stays one
//! segment that is forwarded exactly as sent.

use super::operation::{ApiVersion, Operation};
use super::operation::{Segment, MAX_SEGMENTS, OPERATIONS};
use crate::config::{BasePath, Bases};

/// A client path that names an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteMatch<'a> {
    pub version: ApiVersion,
    pub operation: Operation,
    /// The `{service_business_code}` segment of a v2 service-scoped path, raw.
    pub service: Option<&'a str>,
    /// The `{transaction_id}` segment of a status path, raw.
    pub transaction_id: Option<&'a str>,
}

/// Why a request does not reach an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteError {
    /// An empty, `.` or `..` segment (also percent-encoded), or a control byte.
    BadPath,
    /// No operation has this path.
    NotFound,
    /// The path is an operation's, the method is not; the operation's method is the one to allow.
    MethodNotAllowed {
        version: ApiVersion,
        operation: Operation,
    },
}

/// Whether a raw segment means `.` or `..` once percent-decoded (`%2e`, `.%2E`, ...).
fn is_dot_segment(seg: &str) -> bool {
    let b = seg.as_bytes();
    let mut dots = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'.' {
            i += 1;
        } else if b[i] == b'%' && b.len() >= i + 3 && b[i + 1] == b'2' && (b[i + 2] | 0x20) == b'e'
        {
            i += 3;
        } else {
            return false;
        }
        dots += 1;
    }
    dots == 1 || dots == 2
}

/// Whether the hex digits `hi` `lo` of a percent escape encode an ASCII control character
/// (`%00`-`%1F`, `%7F`).
fn is_control_escape(hi: u8, lo: u8) -> bool {
    matches!(
        (hi, lo.to_ascii_lowercase()),
        (b'0' | b'1', b'0'..=b'9' | b'a'..=b'f') | (b'7', b'f')
    )
}

/// Checks a raw path in one pass per segment: no empty, `.` or `..` segment (also encoded),
/// no ASCII control character or space (also percent-encoded, `%00`-`%1F`, `%7F`), so nothing
/// downstream can reinterpret it.
pub fn check_path(path: &str) -> Result<(), RouteError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(RouteError::BadPath);
    };
    if rest.is_empty() {
        return Ok(());
    }
    for seg in path_segments(rest) {
        let b = seg.as_bytes();
        if b.is_empty() || is_dot_segment(seg) {
            return Err(RouteError::BadPath);
        }
        for (i, &c) in b.iter().enumerate() {
            let encoded_control =
                c == b'%' && i + 2 < b.len() && is_control_escape(b[i + 1], b[i + 2]);
            if c.is_ascii_control() || c == b' ' || encoded_control {
                return Err(RouteError::BadPath);
            }
        }
    }
    Ok(())
}

/// The segments of `path` between its slashes, as `path.split('/')` gives them, found by a
/// plain loop over the bytes: `split` runs a general searcher per segment (it cost more than
/// the matching), and `memchr`'s setup costs more than a segment's few bytes.
fn path_segments(path: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(path);
    std::iter::from_fn(move || {
        let r = rest?;
        // A slash is one byte in UTF-8: the pieces on either side are whole characters.
        Some(match r.bytes().position(|b| b == b'/') {
            Some(i) => {
                rest = Some(&r[i + 1..]);
                &r[..i]
            }
            None => {
                rest = None;
                r
            }
        })
    })
}

/// The part of `path` after `base` and its `/`, if `base` is a whole-segment prefix of it.
fn strip_base<'a>(path: &'a str, base: &BasePath) -> Option<&'a str> {
    path.strip_prefix(base.as_str())?.strip_prefix('/')
}

/// Finds the operation a request names. `path` is the raw path without the query string.
pub fn match_route<'a>(
    bases: &Bases,
    method: &str,
    path: &'a str,
) -> Result<RouteMatch<'a>, RouteError> {
    check_path(path)?;
    let (version, rest) = if let Some(rest) = strip_base(path, &bases.v1) {
        (ApiVersion::V1, rest)
    } else if let Some(rest) = strip_base(path, &bases.v2) {
        (ApiVersion::V2, rest)
    } else {
        return Err(RouteError::NotFound);
    };
    let mut segments = [""; MAX_SEGMENTS];
    let mut count = 0;
    for seg in path_segments(rest) {
        if count == MAX_SEGMENTS {
            return Err(RouteError::NotFound);
        }
        segments[count] = seg;
        count += 1;
    }
    let segments = &segments[..count];
    let found = OPERATIONS.iter().find_map(|spec| {
        let shape = spec.operation.path(version);
        if shape.len() != segments.len() {
            return None;
        }
        let mut route = RouteMatch {
            version,
            operation: spec.operation,
            service: None,
            transaction_id: None,
        };
        for (want, got) in shape.iter().zip(segments) {
            match want {
                Segment::Literal(text) if text != got => return None,
                Segment::Literal(_) => {}
                Segment::ServiceCode => route.service = Some(*got),
                Segment::TransactionId => route.transaction_id = Some(*got),
            }
        }
        Some(route)
    });
    let route = found.ok_or(RouteError::NotFound)?;
    if method != route.operation.method() {
        return Err(RouteError::MethodNotAllowed {
            version,
            operation: route.operation,
        });
    }
    Ok(route)
}

/// Appends `%XX`, the percent-encoding of `b`.
fn push_escaped(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

/// Appends `text`, percent-encoding every byte outside ASCII: a client may send UTF-8
/// unescaped, which is no valid URI for the backend; encoded, it decodes to the same bytes.
fn push_uri_text(out: &mut String, text: &str) {
    if text.is_ascii() {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut utf8 = [0u8; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                push_escaped(out, b);
            }
        }
    }
}

/// Appends a raw path segment as a URI can hold it: RFC 3986 `pchar`s and valid percent
/// escapes as they are, any other byte percent-encoded.
fn push_uri_segment(out: &mut String, segment: &str) {
    let b = segment.as_bytes();
    if b.iter().all(|&c| is_pchar(c)) {
        // The usual segment (a literal, a service code): copied whole.
        out.push_str(segment);
        return;
    }
    for (i, &c) in b.iter().enumerate() {
        let escape = c == b'%'
            && b.get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
        if is_pchar(c) || escape {
            out.push(char::from(c));
        } else {
            push_escaped(out, c);
        }
    }
}

/// An RFC 3986 `pchar` but `%`: a byte a path segment holds as it is.
fn is_pchar(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

/// The text of each segment of `operation`'s path in `version`, with `service` and
/// `transaction_id` in theirs.
fn segments<'a>(
    version: ApiVersion,
    operation: Operation,
    service: &'a str,
    transaction_id: &'a str,
) -> impl Iterator<Item = &'a str> {
    operation.path(version).iter().map(move |seg| match *seg {
        Segment::Literal(text) => text,
        Segment::ServiceCode => service,
        Segment::TransactionId => transaction_id,
    })
}

/// The path of `operation` under `base` in `version`, with `service` and `transaction_id`
/// in their segments and `query` appended; what the client sent is passed on as sent,
/// except that bytes outside ASCII are percent-encoded.
pub fn build_path(
    base: &str,
    version: ApiVersion,
    operation: Operation,
    service: &str,
    transaction_id: &str,
    query: Option<&str>,
) -> String {
    let path = || segments(version, operation, service, transaction_id);
    let len =
        base.len() + path().map(|s| 1 + s.len()).sum::<usize>() + query.map_or(0, |q| 1 + q.len());
    let mut out = String::with_capacity(len);
    out.push_str(base);
    for seg in path() {
        out.push('/');
        push_uri_text(&mut out, seg);
    }
    if let Some(q) = query {
        out.push('?');
        push_uri_text(&mut out, q);
    }
    out
}

/// The path and query sent upstream: the operation's v2 path under the backend's `base`.
/// `service` is the code to put in a service-scoped path (the v2 segment as sent, or the v1
/// default).
pub fn upstream_path(
    base: &BasePath,
    route: &RouteMatch<'_>,
    service: &str,
    query: Option<&str>,
) -> String {
    let transaction_id = route.transaction_id.unwrap_or_default();
    build_path(
        base.as_str(),
        ApiVersion::V2,
        route.operation,
        service,
        transaction_id,
        query,
    )
}

/// `path`, an upstream path built under the backend base `from` ([`upstream_path`]), under
/// `to` instead; `None` when the two bases are one (the path stands as it is). The rest of the
/// path (operation, service code, transaction id, query) is kept as it was decided.
pub fn rebased(path: &str, from: &BasePath, to: &BasePath) -> Option<String> {
    if from == to {
        return None;
    }
    // Built under `from`, the path starts with it; were it not, it would stand.
    let rest = path.strip_prefix(from.as_str())?;
    let mut out = String::with_capacity(to.as_str().len() + rest.len());
    out.push_str(to.as_str());
    out.push_str(rest);
    Some(out)
}

/// The v2 call a v1 call maps to: its route, and the service code it acts on (empty for an
/// operation without one).
#[derive(Debug, Clone, Copy)]
pub struct Successor<'a> {
    pub route: RouteMatch<'a>,
    pub service: &'a str,
}

impl Successor<'_> {
    /// Appends its public v2 path (`/api/v2/verify/ORG/request`) to `out`: the operation's v2
    /// path under `v2_base`, with the call's service code and transaction id. Written as a URI
    /// reference a `Link` header can carry: a path byte a URI cannot hold as it is (`<`, `>`,
    /// `"`, a `%` that starts no escape) is percent-encoded.
    pub fn push_path(&self, v2_base: &BasePath, out: &mut String) {
        out.push_str(v2_base.as_str());
        let transaction_id = self.route.transaction_id.unwrap_or_default();
        for seg in segments(
            ApiVersion::V2,
            self.route.operation,
            self.service,
            transaction_id,
        ) {
            out.push('/');
            push_uri_segment(out, seg);
        }
    }

    /// Its public v2 path, as [`Self::push_path`] writes it.
    pub fn path(&self, v2_base: &BasePath) -> String {
        let mut out = String::with_capacity(v2_base.as_str().len() + 48);
        self.push_path(v2_base, &mut out);
        out
    }
}

/// The public path template of `operation` under `base`, with `{...}` placeholders, as a
/// client would read it in documentation (`/api/v2/verify/{service_business_code}/request`).
pub fn path_template(base: &str, version: ApiVersion, operation: Operation) -> String {
    let (service, transaction_id) = (
        Segment::ServiceCode.template(),
        Segment::TransactionId.template(),
    );
    build_path(base, version, operation, service, transaction_id, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn bases() -> Bases {
        Bases {
            v1: BasePath::parse("/api/v1").unwrap(),
            v2: BasePath::parse("/api/v2").unwrap(),
            upstream: BasePath::parse("/backend/v2").unwrap(),
        }
    }

    #[test]
    fn path_segments_are_those_split_gives() {
        for path in [
            "",
            "/",
            "a",
            "a/b",
            "/a/b/",
            "a//b",
            "verify/request",
            "é/ü/%2F",
        ] {
            assert_eq!(
                path_segments(path).collect::<Vec<_>>(),
                path.split('/').collect::<Vec<_>>(),
                "{path:?}"
            );
        }
    }

    fn forward(method: &str, path: &str, default: &str) -> Result<String, RouteError> {
        let b = bases();
        let (path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        let m = match_route(&b, method, path)?;
        Ok(upstream_path(
            &b.upstream,
            &m,
            m.service.unwrap_or(default),
            query,
        ))
    }

    #[test]
    fn bytes_outside_ascii_are_percent_encoded_upstream() {
        assert_eq!(
            forward("GET", "/api/v1/transaction/tx-é/status?q=ü&r=1", "D").unwrap(),
            "/backend/v2/transaction/tx-%C3%A9/status?q=%C3%BC&r=1"
        );
        assert_eq!(
            forward("POST", "/api/v2/verify/€/request", "D").unwrap(),
            "/backend/v2/verify/%E2%82%AC/request"
        );
    }

    /// A path goes under another base whole, its query too; only the base is replaced, even
    /// where the rest repeats it, and under the same base it stands.
    #[test]
    fn a_path_goes_under_another_base_with_the_rest_as_decided() {
        let b = bases();
        let path = forward(
            "GET",
            "/api/v1/transaction/backend/status?q=/backend/v2",
            "D",
        )
        .unwrap();
        assert_eq!(path, "/backend/v2/transaction/backend/status?q=/backend/v2");
        let to = |base| rebased(&path, &b.upstream, &BasePath::parse(base).unwrap());
        assert_eq!(
            to("/b/api").as_deref(),
            Some("/b/api/transaction/backend/status?q=/backend/v2")
        );
        assert_eq!(
            to("/backend").as_deref(),
            Some("/backend/transaction/backend/status?q=/backend/v2")
        );
        assert_eq!(
            to("/backend/v2/x").as_deref(),
            Some("/backend/v2/x/transaction/backend/status?q=/backend/v2")
        );
        assert_eq!(to("/backend/v2"), None);
    }

    #[test]
    fn routing_table_v1() {
        let cases = [
            (
                "POST",
                "/api/v1/verify/request",
                "/backend/v2/verify/DEF/request",
            ),
            (
                "POST",
                "/api/v1/verify/response",
                "/backend/v2/verify/response",
            ),
            (
                "POST",
                "/api/v1/connection/invitation",
                "/backend/v2/connection/DEF/invitation",
            ),
            (
                "POST",
                "/api/v1/credential/offer",
                "/backend/v2/credential/DEF/offer",
            ),
            (
                "GET",
                "/api/v1/transaction/tx-9/status",
                "/backend/v2/transaction/tx-9/status",
            ),
        ];
        for (method, path, want) in cases {
            assert_eq!(forward(method, path, "DEF").unwrap(), want, "{path}");
        }
    }

    #[test]
    fn routing_table_v2_keeps_its_code() {
        let cases = [
            (
                "POST",
                "/api/v2/verify/S1/request",
                "/backend/v2/verify/S1/request",
            ),
            (
                "POST",
                "/api/v2/verify/response",
                "/backend/v2/verify/response",
            ),
            (
                "POST",
                "/api/v2/connection/S1/invitation",
                "/backend/v2/connection/S1/invitation",
            ),
            (
                "POST",
                "/api/v2/credential/S1/offer",
                "/backend/v2/credential/S1/offer",
            ),
            (
                "GET",
                "/api/v2/transaction/t/status",
                "/backend/v2/transaction/t/status",
            ),
        ];
        for (method, path, want) in cases {
            assert_eq!(forward(method, path, "DEF").unwrap(), want, "{path}");
        }
    }

    #[test]
    fn path_templates() {
        let b = bases();
        assert_eq!(
            path_template(b.v2.as_str(), ApiVersion::V2, Operation::CredentialOffer),
            "/api/v2/credential/{service_business_code}/offer"
        );
        assert_eq!(
            path_template(b.v1.as_str(), ApiVersion::V1, Operation::CredentialOffer),
            "/api/v1/credential/offer"
        );
        assert_eq!(
            path_template(b.v1.as_str(), ApiVersion::V1, Operation::TransactionStatus),
            "/api/v1/transaction/{transaction_id}/status"
        );
    }

    #[test]
    fn a_v1_call_names_its_exact_v2_successor_as_a_uri_reference() {
        let b = bases();
        let successor = |method: &str, path: &str, service: &str| {
            let route = match_route(&b, method, path).unwrap();
            Successor { route, service }.path(&b.v2)
        };
        assert_eq!(
            successor("POST", "/api/v1/verify/request", "ORG"),
            "/api/v2/verify/ORG/request"
        );
        assert_eq!(
            successor("POST", "/api/v1/verify/response", ""),
            "/api/v2/verify/response"
        );
        assert_eq!(
            successor("GET", "/api/v1/transaction/tx-1%2Fa/status", ""),
            "/api/v2/transaction/tx-1%2Fa/status"
        );
        // Bytes a URI cannot hold, which a Link header would misread, are escaped.
        assert_eq!(
            successor("GET", "/api/v1/transaction/a>;rel=\"x\"<%zz/status", ""),
            "/api/v2/transaction/a%3E;rel=%22x%22%3C%25zz/status"
        );
    }

    #[test]
    fn query_strings_pass_verbatim() {
        assert_eq!(
            forward("POST", "/api/v1/verify/request?a=1&b=%2F&c", "DEF").unwrap(),
            "/backend/v2/verify/DEF/request?a=1&b=%2F&c"
        );
    }

    #[test]
    fn encoded_slash_stays_one_segment() {
        assert_eq!(
            forward("GET", "/api/v1/transaction/a%2Fb/status", "DEF").unwrap(),
            "/backend/v2/transaction/a%2Fb/status"
        );
        assert_eq!(
            forward("POST", "/api/v2/verify/a%2Fb/request", "DEF").unwrap(),
            "/backend/v2/verify/a%2Fb/request"
        );
    }

    #[test]
    fn wrong_method_is_405_with_allow() {
        assert_eq!(
            forward("GET", "/api/v1/verify/request", "D"),
            Err(RouteError::MethodNotAllowed {
                version: ApiVersion::V1,
                operation: Operation::VerifyRequest
            })
        );
        assert_eq!(
            forward("POST", "/api/v2/transaction/x/status", "D"),
            Err(RouteError::MethodNotAllowed {
                version: ApiVersion::V2,
                operation: Operation::TransactionStatus
            })
        );
    }

    #[test]
    fn unknown_paths_are_404() {
        for p in [
            "/",
            "/api/v1",
            "/api/v1beta/verify/request",
            "/api/v1/verify/X/request",
            "/api/v2/verify/request",
            "/api/v2/verify/a/b/request",
            "/api/v3/verify/response",
            "/api/v1/transaction/status",
            "/other",
        ] {
            assert_eq!(forward("POST", p, "D"), Err(RouteError::NotFound), "{p}");
        }
    }

    #[test]
    fn dot_and_empty_segments_are_400() {
        for p in [
            "/api/v1//verify/request",
            "/api/v1/verify/request/",
            "/api/v1/./verify/request",
            "/api/v2/../v1/verify/request",
            "/api/v1/transaction/%2e%2e/status",
            "/api/v1/transaction/.%2E/status",
            "/api/v1/transaction/%2E/status",
            "/api/v1/transaction/a%00b/status",
            "/api/v1/transaction/a%0Db/status",
            "/api/v1/transaction/a%0bb/status",
            "/api/v1/transaction/a%1Fb/status",
            "/api/v1/transaction/a%7fb/status",
            "/api/v1/transaction/a\x01b/status",
            "no-slash",
        ] {
            assert_eq!(forward("GET", p, "D"), Err(RouteError::BadPath), "{p:?}");
        }
        // Three dots is a name, not a dot segment.
        assert!(forward("GET", "/api/v1/transaction/.../status", "D").is_ok());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A raw segment: unreserved characters, percent escapes and dots, as clients send.
        fn segment() -> impl Strategy<Value = String> {
            proptest::collection::vec(
                prop_oneof![
                    "[A-Za-z0-9_~-]",
                    Just(".".to_string()),
                    Just("%2F".to_string()),
                    Just("%2e".to_string()),
                    Just("%2E".to_string()),
                    Just("%00".to_string()),
                    Just("%41".to_string()),
                ],
                0..6,
            )
            .prop_map(|parts| parts.concat())
        }

        proptest! {
            #[test]
            fn never_panics_on_any_input(method in "[A-Z]{0,7}", path in "\\PC{0,80}") {
                let _ = match_route(&bases(), &method, &path);
            }

            #[test]
            fn a_segment_is_forwarded_exactly_or_refused(seg in segment()) {
                let path = format!("/api/v1/transaction/{seg}/status");
                match forward("GET", &path, "D") {
                    Ok(up) => {
                        prop_assert_eq!(up, format!("/backend/v2/transaction/{seg}/status"));
                        prop_assert!(!seg.is_empty() && !is_dot_segment(&seg));
                    }
                    Err(e) => {
                        prop_assert_eq!(e, RouteError::BadPath);
                        let lower = seg.to_ascii_lowercase();
                        prop_assert!(seg.is_empty() || is_dot_segment(&seg) || lower.contains("%00"));
                    }
                }
            }

            #[test]
            fn a_v2_code_is_forwarded_exactly_or_refused(seg in segment()) {
                let path = format!("/api/v2/credential/{seg}/offer");
                if let Ok(up) = forward("POST", &path, "D") {
                    prop_assert_eq!(up, format!("/backend/v2/credential/{seg}/offer"));
                }
            }

            #[test]
            fn no_forwarded_path_has_a_dot_or_empty_segment(
                version in prop_oneof![Just("v1"), Just("v2")],
                segs in proptest::collection::vec(
                    prop_oneof![
                        3 => prop::sample::select(vec![
                            "verify", "request", "response", "connection", "invitation",
                            "credential", "offer", "transaction", "status",
                        ]).prop_map(str::to_string),
                        1 => segment(),
                    ],
                    1..5,
                ),
                method in prop_oneof![Just("GET"), Just("POST")],
            ) {
                let path = format!("/api/{version}/{}", segs.join("/"));
                if let Ok(up) = forward(method, &path, "D") {
                    let p = up.split('?').next().unwrap();
                    prop_assert!(p[1..].split('/').all(|s| !s.is_empty() && !is_dot_segment(s)), "{}", up);
                }
            }
        }
    }
}
