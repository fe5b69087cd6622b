//! Admission: everything the gateway decides about a request from its head, before any I/O.
//!
//! [`admit`] is the whole per-request policy as one pure function of the request's facts
//! ([`RequestFacts`], read from any protocol's [`RequestView`]) and a config [`Snapshot`],
//! checked in this order: the head's size, its body framing and host, header names aliasing
//! the gateway's own, a `Connection` header naming one it decides on, the route, the
//! credentials, the service scope, the retirement policy, the content type and the declared
//! body size. It returns either a [`Forward`] (with the rate-limit question and how to check
//! the body) or a [`Refusal`] (with the answer to give); both say how far the request was
//! understood, for metrics and logs, and which [`RetirementHeaders`] the answer carries. The
//! data plane only carries the decision out, and `benches/hot_path.rs` calls this same
//! function.

use std::time::{Duration, SystemTime};

use http::HeaderValue;

use crate::api::operation::{ApiVersion, Operation};
use crate::api::reply::Reply;
use crate::api::route::{
    match_route, path_template, upstream_path, RouteError, RouteMatch, Successor,
};
use crate::api::schema::ObjectSchema;
use crate::config::{Agent, AgentToken, RateLimit, Snapshot, Terms, ValidationMode};
use crate::policy::auth::{authenticate, AuthFailure, AGENT_ID_HEADER, AUTH_TOKEN_HEADER};
use crate::policy::headers;
use crate::policy::rate_limit::{self, Outcome};
use crate::policy::retirement::{self, REHEARSAL_HEADER};

/// What admission reads a request through; named here too, beside the facts they feed.
pub use crate::policy::request::{BodyLength, RequestView};

/// What a request is, as far as it was understood (for logs and metrics even when refused).
#[derive(Debug, Clone, Copy, Default)]
pub struct Identified<'s> {
    pub version: Option<ApiVersion>,
    pub operation: Option<Operation>,
    pub agent: Option<&'s Agent>,
    /// The token the agent authenticated with.
    pub token: Option<&'s AgentToken>,
}

/// The facts of a request head that admission looks at, whatever the protocol.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'r> {
    pub method: &'r str,
    pub path: &'r str,
    pub query: Option<&'r str>,
    /// Bytes of the request target as sent (`limits.max_uri_bytes`).
    pub target_len: usize,
    /// Header fields, and bytes of their names and values (`limits.max_headers`,
    /// `limits.max_header_bytes`).
    pub header_count: usize,
    pub header_bytes: usize,
    /// The body's framing can be trusted: `false` when it could be read two ways.
    pub framing_valid: bool,
    /// Whom the request is for can be read one way only: `Host` at most once and naming a
    /// host alone, an authority in the target naming a host alone and not empty (no user
    /// information in either: [`names_host_alone`]), and one of them is
    /// there when the protocol requires it (HTTP/1.1, HTTP/2), so that such a request never
    /// reaches the backend with a host the gateway made up (an HTTP/1.0 one without `Host`
    /// gets `Host: localhost`).
    pub host_valid: bool,
    /// A header name with an underscore stands for a header the gateway controls
    /// ([`headers::aliases_controlled`]).
    pub aliased_header: bool,
    /// `Connection` lists a header the gateway decides on, which would not reach the backend
    /// ([`headers::connection_lists_decided`]).
    pub hop_declared_decided: bool,
    /// The body's length, when the request declares it.
    pub declared_body_len: Option<u64>,
    pub agent_id: Option<&'r [u8]>,
    pub token: Option<&'r [u8]>,
    pub content_type: Option<&'r [u8]>,
    /// Decides brownout membership, so a retry with the same id gets the same answer.
    pub request_id: &'r str,
    /// The client asked for its post-sunset answer now (`X-Sunset-Rehearsal: 1`, once).
    pub rehearsal: bool,
    /// The time the retirement policy is judged at (injected, so tests need no real clock).
    pub now: SystemTime,
}

impl<'r> RequestFacts<'r> {
    /// The facts of `req`, whose request id is `request_id`, judged at `now`.
    pub fn of<R: RequestView>(req: &'r R, request_id: &'r str, now: SystemTime) -> Self {
        let body = req.body_length();
        let (mut header_bytes, mut aliased_header, mut hosts) = (0, false, 0);
        let (mut hop_declared_decided, mut hosts_valid) = (false, true);
        for (name, value) in req.headers() {
            header_bytes += name.len() + value.len();
            aliased_header |= headers::aliases_controlled(name);
            if name.eq_ignore_ascii_case(b"host") {
                hosts += 1;
                hosts_valid &= names_host_alone(value);
            }
            if name.eq_ignore_ascii_case(b"connection") {
                hop_declared_decided |= headers::connection_lists_decided(value);
            }
        }
        let authority = req.authority();
        let authority_valid =
            authority.is_none_or(|a| !a.is_empty() && names_host_alone(a.as_bytes()));
        let host_named = hosts == 1 || authority.is_some() || !req.host_required();
        RequestFacts {
            method: req.method(),
            path: req.path(),
            query: req.query(),
            target_len: req.target_len(),
            header_count: req.header_count(),
            header_bytes,
            aliased_header,
            hop_declared_decided,
            framing_valid: body != BodyLength::Ambiguous,
            host_valid: hosts <= 1 && hosts_valid && authority_valid && host_named,
            declared_body_len: match body {
                BodyLength::Declared(n) => Some(n),
                _ => None,
            },
            agent_id: req.single_header(AGENT_ID_HEADER),
            token: req.single_header(AUTH_TOKEN_HEADER),
            // Checked in one copy, it could be read in another upstream.
            content_type: req.single_header("content-type"),
            request_id,
            rehearsal: req.single_header(REHEARSAL_HEADER) == Some(b"1"),
            now,
        }
    }
}

/// Whether a `Host` value or a target's authority names a host (and port) alone: a host
/// (RFC 3986 `uri-host`) holds no `@`, so one there brings user information, which RFC 9110
/// §4.2.4 forbids in an `http` URI and which would reach the backend as sent (RFC 9112 §3.2:
/// a `Host` with an invalid value gets 400).
pub fn names_host_alone(value: &[u8]) -> bool {
    !value.contains(&b'@')
}

/// How a forwarded request's body is read and checked.
#[derive(Debug, Clone, Copy)]
pub struct BodyCheck {
    /// Bytes past this are refused with 413, and never buffered.
    pub max_bytes: usize,
    /// The schema the body is checked against; `None` when it is not checked.
    pub schema: Option<&'static ObjectSchema>,
    /// What a body that breaks the schema gets.
    pub mode: ValidationMode,
}

/// A request that may go upstream, once the rate limiter agrees.
#[derive(Debug)]
pub struct Forward<'s> {
    pub who: Identified<'s>,
    pub operation: Operation,
    pub upstream_path: String,
    /// The agent whose budget this request spends, and its limit; `None` when unlimited.
    pub rate_limit: Option<(&'s Agent, RateLimit)>,
    pub body: BodyCheck,
    /// What every answer to it carries, the backend's included.
    pub retirement_headers: RetirementHeaders<'s>,
}

impl Forward<'_> {
    /// Whether the request may be sent again after a kept-alive connection failed under it:
    /// only a read.
    pub fn idempotent(&self) -> bool {
        self.operation.method() == "GET"
    }
}

/// A request that is answered by the gateway itself.
#[derive(Debug)]
pub struct Refusal<'s> {
    pub who: Identified<'s>,
    pub reply: Reply,
    pub auth_failure: Option<AuthFailure>,
    /// What the client should do instead, appended to the reply's message.
    pub hint: Option<String>,
    /// What the answer carries.
    pub retirement_headers: RetirementHeaders<'s>,
}

impl<'s> Refusal<'s> {
    /// The refusal of a request understood as far as `who`, with `reply` and nothing more.
    pub fn new(who: Identified<'s>, reply: Reply) -> Self {
        Refusal {
            who,
            reply,
            auth_failure: None,
            hint: None,
            retirement_headers: RetirementHeaders::default(),
        }
    }

    fn unauthorized(who: Identified<'s>, failure: AuthFailure) -> Self {
        Refusal {
            auth_failure: Some(failure),
            ..Refusal::new(who, Reply::Unauthorized)
        }
    }

    /// This refusal, carrying `retirement_headers`.
    fn with(self, retirement_headers: RetirementHeaders<'s>) -> Self {
        Refusal {
            retirement_headers,
            ..self
        }
    }
}

/// The longest wait a 429 asks for. A rate far below one a day waits for years, or forever
/// (`u64::MAX` seconds), which clients that read `Retry-After` into a 32-bit number turn
/// into no wait at all; asked again after a day, such a client hears the rest.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The refusal of a forwardable request that the rate limit did not allow: over the limit
/// (429, `Retry-After` when a request would be allowed), or unverifiable with
/// `on_redis_error = "deny"` (429, `Retry-After` when Redis is next asked). `None`: allowed.
pub fn rate_limit_refusal<'s>(forward: &Forward<'s>, outcome: Outcome) -> Option<Refusal<'s>> {
    let secs =
        |wait: Duration| (wait.as_secs_f64().ceil() as u64).clamp(1, LONGEST_RETRY_AFTER.as_secs());
    let reply = match outcome {
        Outcome::Allowed => return None,
        Outcome::OverLimit { retry_after } => Reply::RateLimited {
            retry_after_secs: secs(retry_after),
        },
        Outcome::Unverified => Reply::RateLimitUnverified {
            retry_after_secs: secs(rate_limit::redis::COOLDOWN),
        },
    };
    Some(Refusal::new(forward.who, reply).with(forward.retirement_headers.clone()))
}

/// The retirement headers one answer carries. On every answer to a v1 call, refusals
/// included: `Deprecation` and `Sunset` under the caller's dates, and a `Link` naming the
/// deprecation and sunset documents and the exact v2 path this call maps to
/// (`rel="successor-version"`, RFC 5829). On v2, or a request that named no version, none.
#[derive(Debug, Clone, Default)]
pub struct RetirementHeaders<'s> {
    dates: &'s [(&'static str, HeaderValue)],
    /// Visible ASCII only: the configured link is checked at load, the successor escaped.
    link: Option<String>,
}

impl<'s> RetirementHeaders<'s> {
    /// The headers of a call identified as `who`, whose v2 successor is `successor` when the
    /// gateway can name it.
    fn of(snapshot: &'s Snapshot, who: &Identified<'s>, successor: Option<Successor<'_>>) -> Self {
        if who.version != Some(ApiVersion::V1) {
            return RetirementHeaders::default();
        }
        let terms: &Terms = snapshot.retirement.terms_for(who.agent);
        let docs = terms.link.as_deref();
        let link = match (docs, successor) {
            (None, None) => None,
            (docs, successor) => {
                // One allocation, written in place: this is on every v1 request.
                let mut v = String::with_capacity(docs.map_or(0, str::len) + 96);
                v.push_str(docs.unwrap_or_default());
                if let Some(successor) = successor {
                    if !v.is_empty() {
                        v.push_str(", ");
                    }
                    v.push('<');
                    successor.push_path(&snapshot.bases.v2, &mut v);
                    v.push_str(">; rel=\"successor-version\"");
                }
                Some(v)
            }
        };
        RetirementHeaders {
            dates: &terms.headers,
            link,
        }
    }

    /// The headers, as the bytes a protocol writes.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let dates = self.dates.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
        dates.chain(self.link.iter().map(|v| (&b"link"[..], v.as_bytes())))
    }

    /// The value of the header `name` (lower case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.headers()
            .find(|(n, _)| *n == name.as_bytes())
            .map(|(_, v)| v)
    }
}

/// `reply` to a request refused before its credentials are looked at (its route is wrong, or
/// its client address is past `auth.max_failures_per_minute`), `route` being what its method
/// and path matched: counted against the version and operation its path names, a wrong
/// method's included, with the signals of a call by no agent of that version (the successor
/// link names no agent's service code).
fn refused_by_route<'s>(
    snapshot: &'s Snapshot,
    path: &str,
    route: Result<RouteMatch<'_>, RouteError>,
    reply: Reply,
) -> Refusal<'s> {
    let (version, operation, successor) = match route {
        Ok(route) => (route.version, route.operation, unscoped_successor(route)),
        // A wrong method names the same call as its own method would.
        Err(RouteError::MethodNotAllowed { version, operation }) => {
            let successor = match_route(&snapshot.bases, operation.method(), path)
                .ok()
                .and_then(unscoped_successor);
            (version, operation, successor)
        }
        Err(_) => return Refusal::new(Identified::default(), reply),
    };
    let who = Identified {
        version: Some(version),
        operation: Some(operation),
        ..Identified::default()
    };
    let retirement = RetirementHeaders::of(snapshot, &who, successor);
    Refusal::new(who, reply).with(retirement)
}

/// The refusal of a request whose client address failed to authenticate
/// `auth.max_failures_per_minute` times in its minute: 429 (42902) before its credential is
/// checked, counted and signalled as a call of the version its path names.
pub fn throttled<'s>(
    snapshot: &'s Snapshot,
    method: &str,
    path: &str,
    retry_after_secs: u64,
) -> Refusal<'s> {
    let route = match_route(&snapshot.bases, method, path);
    refused_by_route(
        snapshot,
        path,
        route,
        Reply::AuthThrottled { retry_after_secs },
    )
}

/// The v2 call of a v1 call when the gateway can name it without an agent: an operation
/// with no service code in its path.
fn unscoped_successor(route: RouteMatch<'_>) -> Option<Successor<'_>> {
    (route.version == ApiVersion::V1 && !route.operation.is_service_scoped())
        .then_some(Successor { route, service: "" })
}

/// Refuses request lines and headers over the configured limits.
fn check_size(req: &RequestFacts<'_>, snapshot: &Snapshot) -> Result<(), Reply> {
    let limits = &snapshot.limits;
    if req.target_len > limits.max_uri_bytes {
        return Err(Reply::UriTooLong);
    }
    if req.header_count > limits.max_headers || req.header_bytes > limits.max_header_bytes {
        return Err(Reply::HeadersTooLarge);
    }
    Ok(())
}

/// Whether a request declares a JSON body (`application/json`, any parameters).
fn is_json(content_type: Option<&[u8]>) -> bool {
    // The media type ends at the first `;`; the whole value must be text. Read as bytes: an
    // ASCII media type (every JSON one) needs neither a UTF-8 check nor Unicode's trim, which
    // cost more than the rest of the admission's header checks.
    content_type.is_some_and(|v| {
        let (media, params) = v.split_at(memchr::memchr(b';', v).unwrap_or(v.len()));
        let media_is_json = if media.is_ascii() {
            media.trim_ascii().eq_ignore_ascii_case(b"application/json")
        } else {
            std::str::from_utf8(media)
                .is_ok_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
        };
        media_is_json && std::str::from_utf8(params).is_ok()
    })
}

/// Decides what happens to one request under one snapshot.
pub fn admit<'s>(
    snapshot: &'s Snapshot,
    req: &RequestFacts<'_>,
) -> Result<Forward<'s>, Refusal<'s>> {
    let mut who = Identified::default();
    check_size(req, snapshot).map_err(|reply| Refusal::new(who, reply))?;
    if !req.framing_valid || !req.host_valid {
        return Err(Refusal::new(who, Reply::Malformed));
    }
    if req.aliased_header {
        return Err(Refusal::new(who, Reply::AliasedHeader));
    }
    if req.hop_declared_decided {
        return Err(Refusal::new(who, Reply::HopByHopDecidedHeader));
    }
    let route = match match_route(&snapshot.bases, req.method, req.path) {
        Ok(r) => r,
        Err(e) => return Err(refused_by_route(snapshot, req.path, Err(e), e.into())),
    };
    who.version = Some(route.version);
    who.operation = Some(route.operation);

    if route.operation.needs_auth(snapshot.auth.require_on_status) {
        let (agent, token) = authenticate(&snapshot.auth, req.agent_id, req.token, req.now)
            .map_err(|f| {
                // A stranger learns no agent's service code from the successor link.
                let successor = unscoped_successor(route);
                Refusal::unauthorized(who, f).with(RetirementHeaders::of(snapshot, &who, successor))
            })?;
        who.agent = Some(agent);
        who.token = Some(token);
    }

    let service = match (route.operation.is_service_scoped(), route.service) {
        (false, _) => "",
        (true, Some(v2_code)) => v2_code,
        (true, None) => who
            .agent
            .and_then(|a| a.default_service.as_ref())
            .unwrap_or(&snapshot.v1_default_service)
            .as_str(),
    };
    // Every v1 call from here on maps to one v2 call, which every answer names.
    let successor = (route.version == ApiVersion::V1).then_some(Successor { route, service });
    let retirement = RetirementHeaders::of(snapshot, &who, successor);
    let refuse = |reply| Refusal::new(who, reply).with(retirement.clone());
    if route.operation.is_service_scoped() {
        if let Some(agent) = who.agent {
            if !agent.may_use(service) {
                let refusal = Refusal::unauthorized(who, AuthFailure::ServiceNotAllowed);
                return Err(refusal.with(retirement.clone()));
            }
        }
    }

    if route.version == ApiVersion::V1 {
        if let Err(refusal) = retirement::decide(
            &snapshot.retirement,
            who.agent,
            req.now,
            req.request_id,
            req.rehearsal,
        ) {
            let v2 = successor.map_or_else(
                || path_template(snapshot.bases.v2.as_str(), ApiVersion::V2, route.operation),
                |s| s.path(&snapshot.bases.v2),
            );
            return Err(Refusal {
                hint: Some(format!("use {} {v2} instead", route.operation.method())),
                ..refuse(Reply::V1Gone(refusal))
            });
        }
    }

    if route.operation.method() == "POST" && !is_json(req.content_type) {
        return Err(refuse(Reply::UnsupportedMediaType));
    }
    let max_bytes = snapshot.limits.max_body_bytes;
    if req
        .declared_body_len
        .is_some_and(|n| usize::try_from(n).map_or(true, |n| n > max_bytes))
    {
        return Err(refuse(Reply::PayloadTooLarge));
    }

    Ok(Forward {
        who,
        operation: route.operation,
        upstream_path: upstream_path(&snapshot.bases.upstream, &route, service, req.query),
        rate_limit: who.agent.and_then(|a| Some((a, a.rate_limit?))),
        body: BodyCheck {
            max_bytes,
            schema: (route.operation.schema())
                .filter(|_| snapshot.validation != ValidationMode::Off),
            mode: snapshot.validation,
        },
        retirement_headers: retirement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::reply::V1Refusal;
    use crate::config::file::AgentFile;
    use crate::config::testing::{self, AGENT_ID};
    use crate::config::V1Policy;

    fn header(headers: &RetirementHeaders<'_>, name: &str) -> Option<String> {
        headers
            .get(name)
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    }

    /// The test config with agent-1 changed by `edit`.
    fn snapshot(edit: impl FnOnce(&mut AgentFile), require_on_status: bool) -> Snapshot {
        let mut f = testing::config();
        f.auth.require_on_status = require_on_status;
        edit(f.agent_mut(AGENT_ID));
        f.snapshot()
    }

    fn unchanged(_: &mut AgentFile) {}

    fn facts<'r>(
        method: &'r str,
        path: &'r str,
        id: Option<&'r str>,
        token: Option<&'r str>,
    ) -> RequestFacts<'r> {
        RequestFacts {
            method,
            path,
            query: None,
            target_len: path.len(),
            header_count: 4,
            header_bytes: 100,
            framing_valid: true,
            host_valid: true,
            aliased_header: false,
            hop_declared_decided: false,
            declared_body_len: None,
            agent_id: id.map(str::as_bytes),
            token: token.map(str::as_bytes),
            content_type: Some(b"application/json"),
            request_id: "req-1",
            rehearsal: false,
            now: SystemTime::now(),
        }
    }

    /// `admit` for a request with agent-1's valid credentials.
    fn as_agent_1<'s>(
        s: &'s Snapshot,
        method: &str,
        path: &str,
    ) -> Result<Forward<'s>, Refusal<'s>> {
        admit(s, &facts(method, path, Some("agent-1"), Some("secret")))
    }

    #[test]
    fn a_host_with_user_information_names_no_host_alone() {
        for host in ["gw", "gw.example:8080", "127.0.0.1:1", "[::1]:8080", ""] {
            assert!(names_host_alone(host.as_bytes()), "{host:?}");
        }
        for host in ["u:pw@127.0.0.1:1", "u@gw", "@gw", "gw@", "[::1]@gw"] {
            assert!(!names_host_alone(host.as_bytes()), "{host:?}");
        }
    }

    #[test]
    fn v1_gets_the_global_default_code() {
        let s = snapshot(unchanged, true);
        let f = as_agent_1(&s, "POST", "/api/v1/verify/request").unwrap();
        assert_eq!(f.upstream_path, "/api/v2/verify/ORG_DEFAULT/request");
        assert_eq!(f.who.agent.unwrap().id, "agent-1");
        assert_eq!(f.who.version, Some(ApiVersion::V1));
    }

    #[test]
    fn v1_uses_the_agents_own_default_code() {
        let s = snapshot(|a| a.default_service = Some("OTHER".into()), true);
        let f = as_agent_1(&s, "POST", "/api/v1/credential/offer").unwrap();
        assert_eq!(f.upstream_path, "/api/v2/credential/OTHER/offer");
    }

    #[test]
    fn services_allow_list_applies_to_v1_and_v2() {
        let s = snapshot(|a| a.services = Some(vec!["A".into()]), true);
        let ok = as_agent_1(&s, "POST", "/api/v2/verify/A/request");
        assert!(ok.is_ok());
        for path in ["/api/v2/verify/B/request", "/api/v1/verify/request"] {
            let r = admit(&s, &facts("POST", path, Some("agent-1"), Some("secret"))).unwrap_err();
            assert_eq!(r.reply, Reply::Unauthorized);
            assert_eq!(
                r.auth_failure,
                Some(AuthFailure::ServiceNotAllowed),
                "{path}"
            );
        }
        // Operations without a service code are not limited by the list.
        assert!(as_agent_1(&s, "POST", "/api/v1/verify/response").is_ok());
    }

    #[test]
    fn status_auth_follows_require_on_status() {
        let strict = snapshot(unchanged, true);
        let r = admit(
            &strict,
            &facts("GET", "/api/v1/transaction/t/status", None, None),
        )
        .unwrap_err();
        assert_eq!(r.auth_failure, Some(AuthFailure::MissingHeaders));
        let lax = snapshot(unchanged, false);
        let f = admit(
            &lax,
            &facts("GET", "/api/v1/transaction/t/status", None, None),
        )
        .unwrap();
        assert_eq!(f.upstream_path, "/api/v2/transaction/t/status");
        assert!(f.who.agent.is_none());
    }

    #[test]
    fn a_blocked_agent_gets_410_naming_the_v2_path_on_v1_only() {
        let s = snapshot(|a| a.v1_policy = V1Policy::Block, true);
        let r = as_agent_1(&s, "POST", "/api/v1/credential/offer").unwrap_err();
        assert_eq!(r.reply, Reply::V1Gone(V1Refusal::Blocked));
        assert_eq!(
            r.hint.as_deref(),
            Some("use POST /api/v2/credential/ORG_DEFAULT/offer instead")
        );
        assert!(as_agent_1(&s, "POST", "/api/v2/credential/X/offer").is_ok());
        // Authentication comes first: a wrong token is still 401.
        let r = admit(
            &s,
            &facts(
                "POST",
                "/api/v1/credential/offer",
                Some("agent-1"),
                Some("bad"),
            ),
        )
        .unwrap_err();
        assert_eq!(r.reply, Reply::Unauthorized);
    }

    #[test]
    fn every_v1_answer_names_the_exact_v2_path_of_the_call_and_v2_answers_nothing() {
        let s = snapshot(|a| a.default_service = Some("OTHER".into()), true);
        let successor = |r: Result<Forward<'_>, Refusal<'_>>| {
            let headers = match r {
                Ok(f) => f.retirement_headers,
                Err(r) => r.retirement_headers,
            };
            header(&headers, "link")
        };
        let link = |path: &str| Some(format!("<{path}>; rel=\"successor-version\""));
        let v1 = as_agent_1(&s, "POST", "/api/v1/verify/request");
        assert_eq!(successor(v1), link("/api/v2/verify/OTHER/request"));
        let status = as_agent_1(&s, "GET", "/api/v1/transaction/tx-7/status");
        assert_eq!(successor(status), link("/api/v2/transaction/tx-7/status"));
        // Refusals name it too, once the call is known.
        let not_json = RequestFacts {
            content_type: Some(b"text/plain"),
            ..facts(
                "POST",
                "/api/v1/connection/invitation",
                Some("agent-1"),
                Some("secret"),
            )
        };
        assert_eq!(
            successor(admit(&s, &not_json)),
            link("/api/v2/connection/OTHER/invitation")
        );
        let wrong_method = facts("GET", "/api/v1/verify/response", None, None);
        assert_eq!(
            successor(admit(&s, &wrong_method)),
            link("/api/v2/verify/response")
        );
        // A stranger is not told an agent's service code; an operation without one is fine.
        let stranger = facts(
            "POST",
            "/api/v1/verify/request",
            Some("agent-1"),
            Some("bad"),
        );
        assert_eq!(successor(admit(&s, &stranger)), None);
        let stranger = facts(
            "POST",
            "/api/v1/verify/response",
            Some("agent-1"),
            Some("bad"),
        );
        assert_eq!(
            successor(admit(&s, &stranger)),
            link("/api/v2/verify/response")
        );
        // v2, and requests that named no version, carry no signal at all.
        let v2 = as_agent_1(&s, "POST", "/api/v2/verify/X/request").unwrap();
        assert_eq!(v2.retirement_headers.headers().count(), 0);
        let lost = admit(&s, &facts("GET", "/nope", None, None)).unwrap_err();
        assert_eq!(lost.retirement_headers.headers().count(), 0);
    }

    #[test]
    fn the_signals_are_the_agents_own_dates_beside_the_documents_link() {
        let mut f = testing::config();
        f.retirement.deprecated_at = Some("2026-06-01T00:00:00Z".into());
        f.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
        f.retirement.link = Some("https://example.org/v2".into());
        f.auth.agents.push(AgentFile {
            sunset_at: Some("2026-09-01T00:00:00Z".into()),
            ..AgentFile::new("early", testing::TOKEN)
        });
        let s = f.snapshot();
        let early = admit(
            &s,
            &facts(
                "GET",
                "/api/v1/transaction/t/status",
                Some("early"),
                Some("secret"),
            ),
        )
        .unwrap();
        assert_eq!(
            header(&early.retirement_headers, "sunset").as_deref(),
            Some("Tue, 01 Sep 2026 00:00:00 GMT")
        );
        assert_eq!(
            header(&early.retirement_headers, "deprecation").as_deref(),
            Some("@1780272000")
        );
        assert_eq!(
            header(&early.retirement_headers, "link").as_deref(),
            Some("<https://example.org/v2>; rel=\"deprecation\", <https://example.org/v2>; rel=\"sunset\", </api/v2/transaction/t/status>; rel=\"successor-version\"")
        );
        let other = as_agent_1(&s, "GET", "/api/v1/transaction/t/status").unwrap();
        assert_eq!(
            header(&other.retirement_headers, "sunset").as_deref(),
            Some("Tue, 01 Jun 2027 00:00:00 GMT")
        );
        // Retry-After in whole seconds, one at least and a day at most.
        let retry_after = |wait: Duration| match rate_limit_refusal(
            &early,
            Outcome::OverLimit { retry_after: wait },
        ) {
            Some(Refusal {
                reply: Reply::RateLimited { retry_after_secs },
                ..
            }) => retry_after_secs,
            other => panic!("{other:?}"),
        };
        assert_eq!(retry_after(Duration::from_millis(10)), 1);
        assert_eq!(retry_after(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after(Duration::from_secs(86_400)), 86_400);
        assert_eq!(retry_after(Duration::from_secs(86_401)), 86_400);
        assert_eq!(retry_after(Duration::MAX), 86_400);
        // A refusal by the rate limiter keeps the request's signals.
        let limited = rate_limit_refusal(
            &early,
            Outcome::OverLimit {
                retry_after: Duration::from_secs(1),
            },
        )
        .unwrap();
        assert_eq!(
            header(&limited.retirement_headers, "sunset"),
            header(&early.retirement_headers, "sunset")
        );
    }

    #[test]
    fn a_rehearsal_is_the_sunset_answer_now_on_v1_only() {
        let s = snapshot(unchanged, true);
        let rehearse = |method, path| RequestFacts {
            rehearsal: true,
            ..facts(method, path, Some("agent-1"), Some("secret"))
        };
        let r = admit(&s, &rehearse("POST", "/api/v1/verify/request")).unwrap_err();
        assert_eq!(r.reply, Reply::V1Gone(V1Refusal::Rehearsal));
        assert_eq!(r.reply.message_code(), 41004);
        assert_eq!(
            r.hint.as_deref(),
            Some("use POST /api/v2/verify/ORG_DEFAULT/request instead")
        );
        assert!(admit(&s, &rehearse("POST", "/api/v2/verify/X/request")).is_ok());
        // Credentials still come first.
        let stranger = RequestFacts {
            token: Some(b"bad"),
            ..rehearse("POST", "/api/v1/verify/request")
        };
        assert_eq!(admit(&s, &stranger).unwrap_err().reply, Reply::Unauthorized);
    }

    #[test]
    fn routing_errors_come_before_auth() {
        let s = snapshot(unchanged, true);
        let r = admit(&s, &facts("GET", "/nope", None, None)).unwrap_err();
        assert_eq!(r.reply, Reply::NotFound);
        assert_eq!(r.auth_failure, None);
        let r = admit(&s, &facts("GET", "/api/v1/verify/request", None, None)).unwrap_err();
        assert_eq!(r.reply, Reply::MethodNotAllowed { allow: "POST" });
        assert_eq!(r.who.version, Some(ApiVersion::V1));
        assert_eq!(r.who.operation, Some(Operation::VerifyRequest));
    }

    #[test]
    fn the_head_is_checked_before_anything_else_in_a_fixed_order() {
        let s = snapshot(unchanged, true);
        let ok = || {
            facts(
                "POST",
                "/api/v1/verify/request",
                Some("agent-1"),
                Some("secret"),
            )
        };
        let refused = |f: RequestFacts<'_>| admit(&s, &f).unwrap_err().reply;
        // Size first, then framing: neither needs a route or credentials.
        let long = RequestFacts {
            target_len: s.limits.max_uri_bytes + 1,
            token: Some(b"wrong"),
            ..ok()
        };
        assert_eq!(refused(long), Reply::UriTooLong);
        let many = RequestFacts {
            header_count: s.limits.max_headers + 1,
            ..ok()
        };
        assert_eq!(refused(many), Reply::HeadersTooLarge);
        let ambiguous = RequestFacts {
            framing_valid: false,
            path: "/nope",
            ..ok()
        };
        assert_eq!(refused(ambiguous), Reply::Malformed);
        // Then the headers that stand for, or would drop, one the gateway decides on, before
        // the route and the credentials, and in that order.
        let aliased = RequestFacts {
            aliased_header: true,
            hop_declared_decided: true,
            path: "/nope",
            token: Some(b"wrong"),
            ..ok()
        };
        assert_eq!(refused(aliased), Reply::AliasedHeader);
        let hop_declared = RequestFacts {
            hop_declared_decided: true,
            path: "/nope",
            token: Some(b"wrong"),
            ..ok()
        };
        assert_eq!(refused(hop_declared), Reply::HopByHopDecidedHeader);
        // The body's declaration comes after the credentials: a stranger learns nothing.
        let not_json = RequestFacts {
            content_type: Some(b"text/plain"),
            ..ok()
        };
        assert_eq!(refused(not_json), Reply::UnsupportedMediaType);
        let stranger = RequestFacts {
            content_type: Some(b"text/plain"),
            token: Some(b"wrong"),
            ..ok()
        };
        assert_eq!(refused(stranger), Reply::Unauthorized);
        let too_big = RequestFacts {
            declared_body_len: Some(s.limits.max_body_bytes as u64 + 1),
            ..ok()
        };
        assert_eq!(refused(too_big), Reply::PayloadTooLarge);
        let json_with_charset = RequestFacts {
            content_type: Some(b"Application/JSON; charset=utf-8"),
            ..ok()
        };
        assert!(admit(&s, &json_with_charset).is_ok());
    }

    #[test]
    fn a_json_media_type_is_read_case_blind_trimmed_and_with_text_parameters() {
        let json: [&[u8]; 5] = [
            b"application/json",
            b"Application/JSON; charset=utf-8",
            b" application/json\t;q=1",
            // Unicode's whitespace around a media type is trimmed, as `str::trim` does.
            "\u{a0}application/json".as_bytes(),
            "application/json; name=caf\u{e9}".as_bytes(),
        ];
        for v in json {
            assert!(is_json(Some(v)), "{:?}", String::from_utf8_lossy(v));
        }
        let not_json: [&[u8]; 6] = [
            b"text/plain",
            b"application/jsonx",
            b"application/json-seq",
            b"",
            b"application/json; charset=\xff",
            b"application/\xffjson",
        ];
        for v in not_json {
            assert!(!is_json(Some(v)), "{:?}", String::from_utf8_lossy(v));
        }
        assert!(!is_json(None));
    }

    #[test]
    fn a_forward_says_how_its_body_is_checked_and_whose_budget_it_spends() {
        let limited = snapshot(|a| a.rate_limit_per_second = Some(5.0), true);
        let f = as_agent_1(&limited, "POST", "/api/v1/verify/request").unwrap();
        let (agent, limit) = f.rate_limit.expect("agent-1 has a limit");
        assert_eq!((agent.id.as_str(), limit.per_second), ("agent-1", 5.0));
        assert_eq!(f.body.schema.map(|s| s.name), Some("VerifyRequest"));
        assert_eq!(f.body.mode, ValidationMode::Enforce);
        assert!(!f.idempotent());

        let unlimited = snapshot(unchanged, true);
        let f = as_agent_1(&unlimited, "GET", "/api/v1/transaction/t/status").unwrap();
        assert!(f.rate_limit.is_none() && f.body.schema.is_none() && f.idempotent());

        let mut off = testing::config();
        off.validation.mode = ValidationMode::Off;
        let off = off.snapshot();
        let f = as_agent_1(&off, "POST", "/api/v1/verify/request").unwrap();
        assert!(f.body.schema.is_none(), "validation off checks nothing");
    }
}
