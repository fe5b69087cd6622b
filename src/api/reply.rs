//! The answers the gateway gives by itself, in one place and one body shape.
//!
//! Every refusal or failure becomes a [`Reply`]; its body is the spec's ServiceAgentResponse
//! shape `{"status_code":N,"message_code":M,"message":"..."}`, except 401, whose body the
//! spec fixes as the JSON string `"not authorized"`. Each kind's status, message code and
//! message are chosen together in [`Reply::spec`]. A test checks that docs/requests.md's
//! message_code table has a row for each of [`Reply::ALL_CODES`], so the two cannot drift.
//!
//! The errors of [`crate::api::failure`] become answers here, one `From` impl each, so what
//! the client is told about a failure is decided in one place, beside the answers themselves.

use std::time::SystemTime;

use bytes::Bytes;
use http::HeaderValue;

use crate::api::failure::{
    BodyError, Failure, UnreadableHead, UpstreamError, UpstreamErrorKind, UpstreamOverflow,
};
use crate::api::route::RouteError;
use crate::http1::HeadError;

/// The `Retry-After` of the overflow 503: a connection comes free as soon as a request ends, so
/// the shortest wait that can be said.
pub const OVERFLOW_RETRY_AFTER_SECS: u64 = 1;

/// Why a v1 call was refused with 410.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum V1Refusal {
    Blocked,
    /// Inside a brownout window; the client may retry after the window ends.
    Brownout {
        until: SystemTime,
    },
    Sunset,
    /// The client asked (`X-Sunset-Rehearsal: 1`) for the answer it will get after the sunset.
    Rehearsal,
}

impl V1Refusal {
    /// Every reason, for metrics that start at zero.
    pub const ALL: [V1Refusal; 4] = [
        V1Refusal::Blocked,
        V1Refusal::Brownout {
            until: std::time::UNIX_EPOCH,
        },
        V1Refusal::Sunset,
        V1Refusal::Rehearsal,
    ];

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            V1Refusal::Blocked => "blocked",
            V1Refusal::Brownout { .. } => "brownout",
            V1Refusal::Sunset => "sunset",
            V1Refusal::Rehearsal => "rehearsal",
        }
    }
}

/// An answer produced by the gateway itself, never by the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Empty, `.` or `..` segment, control byte or otherwise unusable path.
    BadPath,
    /// The request body could not be read as declared (bad chunking, short body).
    BadBody,
    /// The request body breaks the spec's schema (the hint names the field and rule).
    InvalidBody,
    /// The request could not be parsed as HTTP at all.
    Malformed,
    /// A header name with an underscore stands for a header the gateway controls.
    AliasedHeader,
    /// `Connection` declares hop-by-hop a header the gateway decides on.
    HopByHopDecidedHeader,
    /// Missing or wrong credentials, or a service outside the agent's allow-list.
    Unauthorized,
    /// No operation has this path.
    NotFound,
    /// The path names an operation that takes another method.
    MethodNotAllowed { allow: &'static str },
    /// The client did not send its body in time.
    BodyTimeout,
    /// A v1 call refused by the retirement policy.
    V1Gone(V1Refusal),
    /// The body is larger than `limits.max_body_bytes`.
    PayloadTooLarge,
    /// The request target is longer than `limits.max_uri_bytes`.
    UriTooLong,
    /// A POST whose body is not declared `application/json`.
    UnsupportedMediaType,
    /// The agent is over its rate limit.
    RateLimited { retry_after_secs: u64 },
    /// The agent's limit could not be checked (Redis down) and `on_redis_error = "deny"`.
    RateLimitUnverified { retry_after_secs: u64 },
    /// The client's address failed to authenticate `auth.max_failures_per_minute` times in
    /// its current minute: refused without its credential being checked.
    AuthThrottled { retry_after_secs: u64 },
    /// Headers over `limits.max_header_bytes` or `limits.max_headers`.
    HeadersTooLarge,
    /// The backend could not be connected to.
    UpstreamConnect,
    /// The backend closed or broke the connection, or answered something that is not HTTP.
    UpstreamBroken,
    /// The backend did not answer within `upstream.read_timeout_ms` (or connect timeout).
    UpstreamTimeout,
    /// Every connection `upstream.max_connections_per_address` allows was busy, and the
    /// queue was full or the wait past `upstream.pending_timeout_ms`.
    UpstreamOverflow,
}

impl From<RouteError> for Reply {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::BadPath => Reply::BadPath,
            RouteError::NotFound => Reply::NotFound,
            RouteError::MethodNotAllowed { operation, .. } => Reply::MethodNotAllowed {
                allow: operation.method(),
            },
        }
    }
}

impl From<&UnreadableHead> for Reply {
    fn from(e: &UnreadableHead) -> Self {
        match e {
            UnreadableHead::Parse(HeadError::Malformed | HeadError::UnsupportedTransferCoding) => {
                Reply::Malformed
            }
            UnreadableHead::Parse(HeadError::TooManyHeaders) | UnreadableHead::TooLarge => {
                Reply::HeadersTooLarge
            }
            UnreadableHead::TargetTooLong => Reply::UriTooLong,
        }
    }
}

impl From<&BodyError> for Reply {
    fn from(e: &BodyError) -> Self {
        match e {
            BodyError::TooLarge { .. } => Reply::PayloadTooLarge,
            BodyError::Ambiguous(_) => Reply::Malformed,
            BodyError::Timeout => Reply::BodyTimeout,
            // A client gone mid-body gets the answer it got before its cause was kept; it
            // seldom reads it, and the request's record says what happened.
            BodyError::Unframed
            | BodyError::Chunked(_)
            | BodyError::Truncated
            | BodyError::ClientGone(_)
            | BodyError::Stream(_) => Reply::BadBody,
        }
    }
}

impl From<UpstreamErrorKind> for Reply {
    fn from(kind: UpstreamErrorKind) -> Self {
        match kind {
            UpstreamErrorKind::Timeout => Reply::UpstreamTimeout,
            UpstreamErrorKind::Connect => Reply::UpstreamConnect,
            UpstreamErrorKind::Reset | UpstreamErrorKind::Other => Reply::UpstreamBroken,
        }
    }
}

impl From<&UpstreamError> for Reply {
    fn from(e: &UpstreamError) -> Self {
        e.kind.into()
    }
}

impl From<&UpstreamOverflow> for Reply {
    fn from(_: &UpstreamOverflow) -> Self {
        Reply::UpstreamOverflow
    }
}

impl From<&Failure> for Reply {
    fn from(failure: &Failure) -> Self {
        match failure {
            Failure::Head(e) => e.into(),
            Failure::Body(e) => e.into(),
            Failure::Upstream(e) => e.into(),
            Failure::Overflow(e) => e.into(),
        }
    }
}

impl Reply {
    /// One of each kind, for documentation and tests; `all_codes_has_each_kind_once` holds it
    /// to the variants.
    pub const ALL_CODES: [Reply; 25] = [
        Reply::BadPath,
        Reply::BadBody,
        Reply::InvalidBody,
        Reply::Malformed,
        Reply::AliasedHeader,
        Reply::HopByHopDecidedHeader,
        Reply::Unauthorized,
        Reply::NotFound,
        Reply::MethodNotAllowed { allow: "POST" },
        Reply::BodyTimeout,
        Reply::V1Gone(V1Refusal::Blocked),
        Reply::V1Gone(V1Refusal::Brownout {
            until: std::time::UNIX_EPOCH,
        }),
        Reply::V1Gone(V1Refusal::Sunset),
        Reply::V1Gone(V1Refusal::Rehearsal),
        Reply::PayloadTooLarge,
        Reply::UriTooLong,
        Reply::UnsupportedMediaType,
        Reply::RateLimited {
            retry_after_secs: 1,
        },
        Reply::RateLimitUnverified {
            retry_after_secs: 1,
        },
        Reply::AuthThrottled {
            retry_after_secs: 1,
        },
        Reply::HeadersTooLarge,
        Reply::UpstreamConnect,
        Reply::UpstreamBroken,
        Reply::UpstreamTimeout,
        Reply::UpstreamOverflow,
    ];

    /// What this kind of answer says. One exhaustive match, with no catch-all arm: a new
    /// variant does not compile until its status, code and message are chosen together.
    pub const fn spec(self) -> ReplySpec {
        match self {
            Reply::BadPath => ReplySpec::new(
                400,
                0,
                "invalid path: empty, '.' or '..' segment, or a control character",
            ),
            Reply::BadBody => ReplySpec::new(400, 1, "the request body could not be read as framed"),
            Reply::InvalidBody => ReplySpec::new(
                400,
                2,
                "the request body does not match the operation's schema",
            ),
            Reply::Malformed => ReplySpec::new(400, 3, "the request is not valid HTTP/1.1"),
            Reply::AliasedHeader => ReplySpec::new(
                400,
                4,
                "a header name with an underscore reads, with '-' for '_', as a header the gateway controls; such names are refused",
            ),
            Reply::HopByHopDecidedHeader => ReplySpec::new(
                400,
                5,
                "the Connection header names a header the gateway decides on (credentials, Content-Type, Host); it would not reach the backend",
            ),
            Reply::Unauthorized => ReplySpec::new(401, 0, "not authorized"),
            Reply::NotFound => ReplySpec::new(404, 0, "no such operation"),
            Reply::MethodNotAllowed { .. } => {
                ReplySpec::new(405, 0, "method not allowed for this operation")
            }
            Reply::BodyTimeout => {
                ReplySpec::new(408, 0, "the request body was not received in time")
            }
            Reply::V1Gone(V1Refusal::Blocked) => {
                ReplySpec::new(410, 1, "API v1 is retired for this agent")
            }
            Reply::V1Gone(V1Refusal::Brownout { .. }) => ReplySpec::new(
                410,
                2,
                "API v1 is in a scheduled brownout; retry after it ends",
            ),
            Reply::V1Gone(V1Refusal::Sunset) => {
                ReplySpec::new(410, 3, "API v1 has reached its sunset date")
            }
            Reply::V1Gone(V1Refusal::Rehearsal) => ReplySpec::new(
                410,
                4,
                "sunset rehearsal (X-Sunset-Rehearsal: 1): after the sunset date every v1 call \
                 gets this answer",
            ),
            Reply::PayloadTooLarge => {
                ReplySpec::new(413, 0, "request body exceeds limits.max_body_bytes")
            }
            Reply::UriTooLong => {
                ReplySpec::new(414, 0, "request target exceeds limits.max_uri_bytes")
            }
            Reply::UnsupportedMediaType => {
                ReplySpec::new(415, 0, "the request body must be application/json")
            }
            Reply::RateLimited { .. } => {
                ReplySpec::new(429, 0, "rate limit exceeded for this agent")
            }
            Reply::RateLimitUnverified { .. } => ReplySpec::new(
                429,
                1,
                "this agent's rate limit cannot be checked now; retry later",
            ),
            Reply::AuthThrottled { .. } => ReplySpec::new(
                429,
                2,
                "too many failed authentications from this address; retry later",
            ),
            Reply::HeadersTooLarge => ReplySpec::new(
                431,
                0,
                "request headers exceed limits.max_header_bytes or limits.max_headers",
            ),
            Reply::UpstreamConnect => ReplySpec::new(502, 0, "the backend could not be reached"),
            Reply::UpstreamBroken => ReplySpec::new(
                502,
                1,
                "the backend closed the connection or sent an invalid response",
            ),
            Reply::UpstreamTimeout => ReplySpec::new(504, 0, "the backend did not answer in time"),
            Reply::UpstreamOverflow => ReplySpec::new(
                503,
                0,
                "every backend connection the gateway may open is busy; retry later",
            ),
        }
    }

    pub const fn status(self) -> u16 {
        self.spec().status
    }

    pub const fn message_code(self) -> u32 {
        self.spec().message_code
    }

    pub const fn message(self) -> &'static str {
        self.spec().message
    }

    /// The JSON body of this answer; `hint` (what to do instead) is appended to the message.
    pub fn body(self, hint: Option<&str>) -> Bytes {
        if self == Reply::Unauthorized {
            return Bytes::from_static(b"\"not authorized\"");
        }
        let message = match hint {
            Some(h) => format!("{}; {h}", self.message()),
            None => self.message().to_owned(),
        };
        let body = serde_json::json!({
            "status_code": self.status(),
            "message_code": self.message_code(),
            "message": message,
        });
        Bytes::from(body.to_string())
    }

    /// The answer as data: status, headers and body, for each client protocol to render.
    /// `hint` (what to do instead) is appended to the message. Every one is a decision about
    /// this request at this moment (credentials, a policy that reloads, a brownout window, a
    /// rate limit), so none may be stored by a cache: a 410 or 404 would otherwise be
    /// heuristically cacheable (RFC 9111 §4.2.2), and outlive the window that refused it.
    pub fn answer(self, hint: Option<&str>) -> Answer {
        let mut headers = vec![
            ("content-type", HeaderValue::from_static("application/json")),
            ("cache-control", HeaderValue::from_static("no-store")),
        ];
        match self {
            Reply::MethodNotAllowed { allow } => {
                headers.push(("allow", HeaderValue::from_static(allow)));
            }
            Reply::RateLimited { retry_after_secs }
            | Reply::RateLimitUnverified { retry_after_secs }
            | Reply::AuthThrottled { retry_after_secs } => {
                headers.push(("retry-after", HeaderValue::from(retry_after_secs)));
            }
            Reply::UpstreamOverflow => {
                headers.push(("retry-after", HeaderValue::from(OVERFLOW_RETRY_AFTER_SECS)));
            }
            Reply::V1Gone(V1Refusal::Brownout { until }) => {
                let date = httpdate::fmt_http_date(until);
                let value = HeaderValue::from_str(&date).expect("an HTTP-date is a header value");
                headers.push(("retry-after", value));
            }
            _ => {}
        }
        Answer {
            status: self.status(),
            headers,
            body: self.body(hint),
        }
    }
}

/// What one kind of the gateway's answers says, whatever its details (the `Allow` method, the
/// `Retry-After` time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplySpec {
    pub status: u16,
    /// The gateway's `message_code`: the status times 100 plus a number for the cause.
    pub message_code: u32,
    pub message: &'static str,
}

impl ReplySpec {
    const fn new(status: u16, cause: u32, message: &'static str) -> Self {
        ReplySpec {
            status,
            message_code: status as u32 * 100 + cause,
            message,
        }
    }
}

/// One of the gateway's own answers, as data. Framing (`Content-Length`) is the client
/// protocol's to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, HeaderValue)>,
    pub body: Bytes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_service_agent_response_shape() {
        for r in Reply::ALL_CODES {
            let v: serde_json::Value = serde_json::from_slice(&r.body(None)).unwrap();
            if r == Reply::Unauthorized {
                assert_eq!(v, serde_json::json!("not authorized"));
                continue;
            }
            assert_eq!(v["status_code"], r.status());
            assert_eq!(v["message_code"], r.message_code());
            assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }

    #[test]
    fn all_codes_has_each_kind_once() {
        // Exhaustive, with no catch-all arm: a new kind of answer does not compile here until
        // it has a place, and the place is then asked of `ALL_CODES`.
        let place = |r: Reply| match r {
            Reply::BadPath => 0,
            Reply::BadBody => 1,
            Reply::InvalidBody => 2,
            Reply::Malformed => 3,
            Reply::AliasedHeader => 4,
            Reply::HopByHopDecidedHeader => 5,
            Reply::Unauthorized => 6,
            Reply::NotFound => 7,
            Reply::MethodNotAllowed { .. } => 8,
            Reply::BodyTimeout => 9,
            Reply::V1Gone(V1Refusal::Blocked) => 10,
            Reply::V1Gone(V1Refusal::Brownout { .. }) => 11,
            Reply::V1Gone(V1Refusal::Sunset) => 12,
            Reply::V1Gone(V1Refusal::Rehearsal) => 13,
            Reply::PayloadTooLarge => 14,
            Reply::UriTooLong => 15,
            Reply::UnsupportedMediaType => 16,
            Reply::RateLimited { .. } => 17,
            Reply::RateLimitUnverified { .. } => 18,
            Reply::AuthThrottled { .. } => 19,
            Reply::HeadersTooLarge => 20,
            Reply::UpstreamConnect => 21,
            Reply::UpstreamBroken => 22,
            Reply::UpstreamTimeout => 23,
            Reply::UpstreamOverflow => 24,
        };
        let places: Vec<usize> = Reply::ALL_CODES.iter().map(|r| place(*r)).collect();
        assert_eq!(places, (0..Reply::ALL_CODES.len()).collect::<Vec<_>>());
    }

    #[test]
    fn each_failure_gets_the_answer_it_got_before_it_was_typed() {
        use std::io;
        let gone = || io::Error::from(io::ErrorKind::BrokenPipe);
        let cases: Vec<(Failure, Reply)> = vec![
            (
                UnreadableHead::from(HeadError::Malformed).into(),
                Reply::Malformed,
            ),
            (
                UnreadableHead::from(HeadError::TooManyHeaders).into(),
                Reply::HeadersTooLarge,
            ),
            (UnreadableHead::TargetTooLong.into(), Reply::UriTooLong),
            (UnreadableHead::TooLarge.into(), Reply::HeadersTooLarge),
            (
                BodyError::TooLarge { max: 1 }.into(),
                Reply::PayloadTooLarge,
            ),
            (
                BodyError::Ambiguous(crate::http1::FramingError::BadContentLength).into(),
                Reply::Malformed,
            ),
            (BodyError::Unframed.into(), Reply::BadBody),
            (
                BodyError::Chunked(crate::http1::ChunkError).into(),
                Reply::BadBody,
            ),
            (BodyError::Truncated.into(), Reply::BadBody),
            (BodyError::Timeout.into(), Reply::BodyTimeout),
            (BodyError::ClientGone(gone()).into(), Reply::BadBody),
            (BodyError::Stream(gone().into()).into(), Reply::BadBody),
        ];
        for (failure, reply) in &cases {
            assert_eq!(Reply::from(failure), *reply, "{failure:?}");
        }
        for (kind, reply, status) in [
            (UpstreamErrorKind::Connect, Reply::UpstreamConnect, 502),
            (UpstreamErrorKind::Timeout, Reply::UpstreamTimeout, 504),
            (UpstreamErrorKind::Reset, Reply::UpstreamBroken, 502),
            (UpstreamErrorKind::Other, Reply::UpstreamBroken, 502),
        ] {
            let failure = Failure::from(UpstreamError::new(kind, "test"));
            assert_eq!(Reply::from(&failure), reply, "{kind:?}");
            assert_eq!(reply.status(), status);
        }
        for reason in crate::api::failure::OverflowReason::ALL {
            let failure = Failure::from(UpstreamOverflow { reason });
            let answer = Reply::from(&failure).answer(None);
            assert_eq!(answer.status, 503);
            assert!(answer
                .headers
                .contains(&("retry-after", HeaderValue::from(1))));
        }
    }

    #[test]
    fn message_codes_are_unique() {
        let mut codes: Vec<u32> = Reply::ALL_CODES.iter().map(|r| r.message_code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Reply::ALL_CODES.len());
    }

    #[test]
    fn readme_lists_every_message_code() {
        let readme = include_str!("../../docs/requests.md");
        for r in Reply::ALL_CODES {
            let row = format!("| {} | {} |", r.status(), r.message_code());
            assert!(
                readme.contains(&row),
                "docs/requests.md lacks the row starting {row}"
            );
        }
    }
}
