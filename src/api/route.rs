//! Routing: which operation a client path names, and the upstream path it is forwarded to.
//!
//! Pure functions over `&str`; no I/O. Paths are matched on raw (still percent-encoded) bytes,
//! segment by segment, so a prefix only matches on a whole segment (`/api/v1beta` is not
//! `/api/v1`) and `a%2Fb` stays one segment that is forwarded exactly as sent.

use crate::config::{BasePath, Bases};

/// The public interface version a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiVersion {
    V1,
    V2,
}

impl ApiVersion {
    pub const ALL: [ApiVersion; 2] = [ApiVersion::V1, ApiVersion::V2];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "v1",
            ApiVersion::V2 => "v2",
        }
    }
}

/// The five operations of the Agent REST Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    VerifyRequest,
    VerifyResponse,
    ConnectionInvitation,
    CredentialOffer,
    TransactionStatus,
}

impl Operation {
    pub const ALL: [Operation; 5] = [
        Operation::VerifyRequest,
        Operation::VerifyResponse,
        Operation::ConnectionInvitation,
        Operation::CredentialOffer,
        Operation::TransactionStatus,
    ];

    /// The label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::VerifyRequest => "verify_request",
            Operation::VerifyResponse => "verify_response",
            Operation::ConnectionInvitation => "connection_invitation",
            Operation::CredentialOffer => "credential_offer",
            Operation::TransactionStatus => "transaction_status",
        }
    }

    /// The one method this operation accepts.
    pub fn method(self) -> &'static str {
        match self {
            Operation::TransactionStatus => "GET",
            _ => "POST",
        }
    }

    /// Whether the v2 path of this operation carries a `{service_business_code}`.
    pub fn is_service_scoped(self) -> bool {
        matches!(
            self,
            Operation::VerifyRequest | Operation::ConnectionInvitation | Operation::CredentialOffer
        )
    }
}

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
    for seg in rest.split('/') {
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

    let mut segs = rest.split('/');
    let parts = (segs.next(), segs.next(), segs.next(), segs.next());
    let (operation, service, transaction_id) = match (version, parts) {
        (_, (Some("verify"), Some("response"), None, None)) => {
            (Operation::VerifyResponse, None, None)
        }
        (_, (Some("transaction"), Some(id), Some("status"), None)) => {
            (Operation::TransactionStatus, None, Some(id))
        }
        (ApiVersion::V1, (Some("verify"), Some("request"), None, None)) => {
            (Operation::VerifyRequest, None, None)
        }
        (ApiVersion::V1, (Some("connection"), Some("invitation"), None, None)) => {
            (Operation::ConnectionInvitation, None, None)
        }
        (ApiVersion::V1, (Some("credential"), Some("offer"), None, None)) => {
            (Operation::CredentialOffer, None, None)
        }
        (ApiVersion::V2, (Some("verify"), Some(code), Some("request"), None)) => {
            (Operation::VerifyRequest, Some(code), None)
        }
        (ApiVersion::V2, (Some("connection"), Some(code), Some("invitation"), None)) => {
            (Operation::ConnectionInvitation, Some(code), None)
        }
        (ApiVersion::V2, (Some("credential"), Some(code), Some("offer"), None)) => {
            (Operation::CredentialOffer, Some(code), None)
        }
        _ => return Err(RouteError::NotFound),
    };
    if method != operation.method() {
        return Err(RouteError::MethodNotAllowed { version, operation });
    }
    Ok(RouteMatch {
        version,
        operation,
        service,
        transaction_id,
    })
}

/// The path and query sent upstream. `service` is the code to put in a service-scoped path
/// (the v2 segment as sent, or the v1 default); `query` is appended verbatim.
pub fn upstream_path(
    base: &BasePath,
    route: &RouteMatch<'_>,
    service: &str,
    query: Option<&str>,
) -> String {
    let base = base.as_str();
    let mut out =
        String::with_capacity(base.len() + service.len() + 48 + query.map_or(0, |q| q.len() + 1));
    out.push_str(base);
    match route.operation {
        Operation::VerifyRequest => {
            out.push_str("/verify/");
            out.push_str(service);
            out.push_str("/request");
        }
        Operation::VerifyResponse => out.push_str("/verify/response"),
        Operation::ConnectionInvitation => {
            out.push_str("/connection/");
            out.push_str(service);
            out.push_str("/invitation");
        }
        Operation::CredentialOffer => {
            out.push_str("/credential/");
            out.push_str(service);
            out.push_str("/offer");
        }
        Operation::TransactionStatus => {
            out.push_str("/transaction/");
            out.push_str(route.transaction_id.unwrap_or_default());
            out.push_str("/status");
        }
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// The public path template of `operation` under `base`, with `{...}` placeholders, as a
/// client would read it in documentation (`/api/v2/verify/{service_business_code}/request`).
pub fn path_template(base: &str, version: ApiVersion, operation: Operation) -> String {
    let code = match version {
        ApiVersion::V1 => "",
        ApiVersion::V2 => "/{service_business_code}",
    };
    let tail = match operation {
        Operation::VerifyRequest => format!("/verify{code}/request"),
        Operation::VerifyResponse => "/verify/response".to_owned(),
        Operation::ConnectionInvitation => format!("/connection{code}/invitation"),
        Operation::CredentialOffer => format!("/credential{code}/offer"),
        Operation::TransactionStatus => "/transaction/{transaction_id}/status".to_owned(),
    };
    format!("{base}{tail}")
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
