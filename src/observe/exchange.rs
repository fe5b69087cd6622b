//! What happened to one request: the record that metrics, the access log and its span are
//! made from. The data plane writes it as the request is served and never reads it back to
//! decide.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::TraceId;

use crate::api::failure::{Failure, UpstreamErrorKind};
use crate::api::operation::{ApiVersion, Operation};
use crate::api::reply::{Reply, V1Refusal};
use crate::api::schema::Rule;
use crate::observe::trace::RequestSpan;
use crate::policy::admit::{Identified, Refusal};
use crate::policy::auth::AuthFailure;
use crate::policy::rate_limit::Decision;

listed_enum! {
    /// The protocol a client spoke; labelled in metrics and the access log by its ALPN name.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Protocol {
        Http1 => "http/1.1",
        Http2 => "h2",
    }
}

/// How the backend side of one request went.
#[derive(Debug, Default)]
pub struct UpstreamRecord {
    /// The backend path and query the request was sent to.
    pub path: Option<String>,
    /// Every failure on the way, one per attempt that failed.
    pub errors: Vec<UpstreamErrorKind>,
    /// From sending the request to the backend's response header.
    pub header_time: Option<Duration>,
    /// From sending the request to the end of the backend's response body, or to the
    /// failure that broke the body off.
    pub duration: Option<Duration>,
    /// The backend address of the last attempt.
    pub address: Option<SocketAddr>,
    /// When the last attempt started: `header_time` and `duration` count from here.
    pub started: Option<Instant>,
    /// The last attempt went on a kept-alive connection from the pool.
    pub reused: bool,
    /// How long the last attempt's new connection took to open (none when reused).
    pub connect_time: Option<Duration>,
    /// The backend broke off its answer after its head and some of its body had gone to
    /// the client.
    pub answer_broken: bool,
}

impl UpstreamRecord {
    /// Notes an attempt to `address` that starts now, on a pooled connection or not.
    pub fn attempt(&mut self, address: SocketAddr, started: Instant, reused: bool) {
        self.address = Some(address);
        self.started = Some(started);
        self.reused = reused;
        self.connect_time = None;
    }
}

listed_enum! {
    /// A phase of the pipeline whose end a recorded span marks with an event, named by its label.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Phase {
        /// Admission (route, credentials, policy) and the rate limiter let it through.
        Admitted => "gateway.admitted",
        BodyReceived => "gateway.body_received",
        BodyValidated => "gateway.body_validated",
    }
}

/// One request's record, filled in as it is served; `'s` is the config snapshot the request
/// is served under, whose agent and token it names.
#[derive(Debug)]
pub struct Exchange<'s> {
    pub started: Instant,
    /// Wall-clock time at the start: what the retirement policy is judged at.
    pub started_at: SystemTime,
    pub request_id: String,
    pub protocol: Protocol,
    /// `None` when the request's head could not be read.
    pub method: Option<http::Method>,
    /// The client's path without the query string (queries may carry data we should not log).
    pub client_path: String,
    pub version: Option<ApiVersion>,
    pub operation: Option<Operation>,
    /// Only ids of configured agents, so labels and logs never carry arbitrary client input.
    pub agent_id: Option<&'s str>,
    /// The first 8 hex digits of the token the agent authenticated with.
    pub token_label: Option<&'s str>,
    /// Who is calling ([`crate::policy::client`]): the peer, or behind a trusted proxy the
    /// address it forwarded for.
    pub client_addr: Option<IpAddr>,
    /// The client's `User-Agent`, as sent (lossily UTF-8).
    pub user_agent: Option<String>,
    pub auth_failure: Option<AuthFailure>,
    /// The gateway's own answer, when it gave one instead of the backend's.
    pub refused: Option<Reply>,
    /// The error that made that answer, when one did (not a refusal by policy).
    pub failure: Option<Failure>,
    /// The schema rule the body broke (refused in enforce mode, forwarded in report mode).
    pub validation_failure: Option<Rule>,
    /// The rate limit's decision, when the agent has a limit and the request got that far.
    pub rate_limit: Option<Decision>,
    pub status: u16,
    pub upstream: UpstreamRecord,
    pub bytes_in: usize,
    pub bytes_out: usize,
    pub client_aborted: bool,
    /// The gateway cut the client off itself (an HTTP/2 connection past its drain deadline, a
    /// client that did not read its answer within `limits.client_send_timeout`) before the
    /// request's answer was through.
    pub closed_by_gateway: bool,
    /// The request's span, when tracing is on.
    pub span: Option<RequestSpan>,
    /// When each phase ended; noted only when the span is recorded.
    pub phase_ends: [Option<Instant>; Phase::COUNT],
}

/// The status of a request whose client gave up on it before it was sent on (an HTTP/2
/// reset, or a hang-up while it waited for a backend connection): nginx's 499, "client
/// closed request". Counted and logged, never sent.
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

/// The status of a request the gateway cut off from its client itself (an HTTP/2 connection
/// past its drain deadline, a client too slow to read) before any of its answer went out: the
/// gateway's 503, with `client_aborted` false. Counted and logged, never sent.
pub const CLOSED_BY_GATEWAY: u16 = 503;

/// A request's `api_version` in metrics and the access log: "none" when it named no operation.
pub fn version_name(version: Option<ApiVersion>) -> &'static str {
    version.map_or("none", ApiVersion::as_str)
}

/// A request's `method` in the access log and its span's name: empty when its head could not
/// be read.
pub fn method_name(method: Option<&http::Method>) -> &str {
    method.map_or("", http::Method::as_str)
}

/// A request's `operation` in metrics and the access log: "unmatched" when it named none.
pub fn operation_name(operation: Option<Operation>) -> &'static str {
    operation.map_or("unmatched", Operation::as_str)
}

/// How far from its anchor a wall-clock time is worked out from the monotonic clock: a step
/// of the wall clock (NTP's, an operator's `date`, a resume from suspend, during which the
/// monotonic clock stops) shows in request times within this. Between steps the two clocks
/// run at one rate (NTP slews both alike).
const WALL_ANCHOR_FOR: Duration = Duration::from_secs(1);

/// A wall-clock time and the monotonic instant it was read at.
#[derive(Debug, Clone, Copy)]
struct WallAnchor {
    instant: Instant,
    wall: SystemTime,
}

impl WallAnchor {
    /// The wall-clock time of `now`, when `now` is within [`WALL_ANCHOR_FOR`] after the anchor.
    fn at(self, now: Instant) -> Option<SystemTime> {
        let since = now.checked_duration_since(self.instant)?;
        (since < WALL_ANCHOR_FOR).then(|| self.wall + since)
    }
}

/// The wall-clock time of `now` (an instant just read), from this thread's anchor, read anew
/// once a second: a request's start reads one clock, not two (each read is about 20 ns here,
/// and a request read nine).
fn wall_time_at(now: Instant) -> SystemTime {
    thread_local! {
        static ANCHOR: std::cell::Cell<Option<WallAnchor>> = const { std::cell::Cell::new(None) };
    }
    ANCHOR.with(|anchor| {
        anchor.get().and_then(|a| a.at(now)).unwrap_or_else(|| {
            // The anchor's two readings back to back, so that a pause between `now` and
            // this (a preemption) is not carried into a second of this thread's times.
            let wall = SystemTime::now();
            let instant = Instant::now();
            anchor.set(Some(WallAnchor { instant, wall }));
            wall
        })
    })
}

impl<'s> Exchange<'s> {
    /// A record for a request over `protocol` that starts now; `method` is `None` when the
    /// request's head could not be read.
    pub fn start(protocol: Protocol, method: Option<&http::Method>, client_path: &str) -> Self {
        let started = Instant::now();
        Self {
            started,
            started_at: wall_time_at(started),
            request_id: String::new(),
            protocol,
            method: method.cloned(),
            client_path: client_path.to_owned(),
            version: None,
            operation: None,
            agent_id: None,
            token_label: None,
            client_addr: None,
            user_agent: None,
            auth_failure: None,
            refused: None,
            failure: None,
            validation_failure: None,
            rate_limit: None,
            status: 0,
            upstream: UpstreamRecord::default(),
            bytes_in: 0,
            bytes_out: 0,
            client_aborted: false,
            closed_by_gateway: false,
            span: None,
            phase_ends: [None; Phase::COUNT],
        }
    }

    /// Notes that `phase` ended now, for the span's events: a branch when the span is not
    /// recorded.
    pub fn reached(&mut self, phase: Phase) {
        if self.span.as_ref().is_some_and(RequestSpan::is_recording) {
            self.phase_ends[phase as usize] = Some(Instant::now());
        }
    }

    /// The trace the request belongs to, when tracing is on.
    pub fn trace_id(&self) -> Option<TraceId> {
        self.span.as_ref().map(RequestSpan::trace_id)
    }

    /// Notes that the client's connection was found gone before the request was sent on: its
    /// client gave up on it, unless the gateway had closed the connection itself.
    pub fn client_gone(&mut self, closed_by_gateway: bool) {
        self.answer_lost(closed_by_gateway, false);
        if !closed_by_gateway {
            self.status = CLIENT_CLOSED_REQUEST;
        }
    }

    /// Notes that the answer could not be sent whole: its client went away, unless the
    /// gateway had closed the connection itself. `status` stays what the client was told:
    /// the answer's once its head went out (`head_sent`), the gateway's 503 when it cut the
    /// connection before.
    pub fn answer_lost(&mut self, closed_by_gateway: bool, head_sent: bool) {
        self.closed_by_gateway = closed_by_gateway;
        self.client_aborted = !closed_by_gateway;
        if closed_by_gateway && !head_sent {
            self.status = CLOSED_BY_GATEWAY;
        }
    }

    /// Notes how far the request was understood.
    pub fn identified(&mut self, who: &Identified<'s>) {
        self.version = who.version;
        self.operation = who.operation;
        self.agent_id = who.agent.map(|a| a.id.as_str());
        self.token_label = who.token.map(|t| t.label.as_str());
    }

    /// Notes an admission refusal: who asked, and why they were refused.
    pub fn refused(&mut self, refusal: &Refusal<'s>) {
        self.identified(&refusal.who);
        self.auth_failure = refusal.auth_failure;
        self.refused = Some(refusal.reply);
    }

    /// Notes a failure that the gateway answers itself, and returns that answer.
    pub fn failed(&mut self, failure: impl Into<Failure>) -> Reply {
        let failure = failure.into();
        let reply = Reply::from(&failure);
        self.refused = Some(reply);
        self.failure = Some(failure);
        reply
    }

    /// The retirement policy's reason, when it refused a v1 call.
    pub fn v1_refusal(&self) -> Option<V1Refusal> {
        match self.refused {
            Some(Reply::V1Gone(r)) => Some(r),
            _ => None,
        }
    }

    /// Whether the agent was over its rate limit.
    pub fn rate_limited(&self) -> bool {
        matches!(self.refused, Some(Reply::RateLimited { .. }))
    }

    /// Whether the client's address was refused for its failed authentications.
    pub fn auth_throttled(&self) -> bool {
        matches!(self.refused, Some(Reply::AuthThrottled { .. }))
    }

    /// `ok`, `not_required`, `throttled` or the failure reason: the access log's auth outcome.
    pub fn auth_outcome(&self) -> &'static str {
        if self.auth_throttled() {
            return "throttled";
        }
        match (self.auth_failure, &self.agent_id) {
            (Some(f), _) => f.as_str(),
            (None, Some(_)) => "ok",
            (None, None) => "not_required",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_time_is_the_anchor_moved_on_by_the_monotonic_clock_and_read_anew_each_second() {
        // A test has a thread of its own: this one's first start sets its anchor.
        let t0 = Instant::now();
        let w0 = wall_time_at(t0);
        let (a, b) = (Duration::from_millis(600), Duration::from_millis(850));
        let (wa, wb) = (wall_time_at(t0 + a), wall_time_at(t0 + b));
        assert_eq!(
            wb.duration_since(wa).unwrap(),
            b - a,
            "one anchor, one rate"
        );
        // The anchor's instant is read a moment after t0 (less than this, unless the thread
        // stood still that long in between).
        let slack = Duration::from_millis(300);
        assert!(wa > w0 + a - slack && wa <= w0 + a, "{wa:?} {w0:?}");
        // An hour on, the wall clock is read again: what it says now, not the anchor's
        // reckoning (w0 + 1 h, in the future of any clock read now).
        let hour = Duration::from_secs(3600);
        let w1 = wall_time_at(t0 + hour);
        let read = SystemTime::now();
        assert!(
            w1 <= read && w1 < w0 + hour / 2,
            "read anew: {w1:?} {read:?}"
        );
        let anchor = WallAnchor {
            instant: t0,
            wall: w0,
        };
        assert_eq!(anchor.at(t0), Some(w0));
        assert_eq!(anchor.at(t0 + WALL_ANCHOR_FOR), None);
        assert_eq!(
            anchor.at(t0 - Duration::from_nanos(1)),
            None,
            "before the anchor"
        );
    }

    /// `status` is what the client was told; `client_aborted` and `closed_by_gateway` say who
    /// ended the connection.
    #[test]
    fn a_lost_answer_keeps_the_status_the_client_saw_and_says_who_cut_it() {
        let outcome = |ex: &Exchange| (ex.status, ex.client_aborted, ex.closed_by_gateway);
        let answered = || {
            let mut ex = Exchange::start(Protocol::Http2, Some(&http::Method::POST), "/p");
            ex.status = 200;
            ex
        };
        let mut ex = answered();
        ex.client_gone(false);
        assert_eq!(outcome(&ex), (CLIENT_CLOSED_REQUEST, true, false));
        let mut ex = answered();
        ex.client_gone(true);
        assert_eq!(outcome(&ex), (CLOSED_BY_GATEWAY, false, true));
        for head_sent in [false, true] {
            let mut ex = answered();
            ex.answer_lost(false, head_sent);
            assert_eq!(outcome(&ex), (200, true, false));
        }
        let mut ex = answered();
        ex.answer_lost(true, true);
        assert_eq!(outcome(&ex), (200, false, true), "its head went out");
        let mut ex = answered();
        ex.answer_lost(true, false);
        assert_eq!(
            outcome(&ex),
            (CLOSED_BY_GATEWAY, false, true),
            "nothing went out"
        );
    }
}
