//! Metrics and the access log ([`AccessLog`]), both made from a finished [`Exchange`].
//!
//! Metric handles are created once, in [`Telemetry::register`], against a given registry (the
//! binary passes prometheus' default registry, the one pingora's own metrics use): each family
//! (routes, protocols, failures, agents, rate limits, the process, the retirement plan, the
//! requests in flight) registers its own and records its own part of an exchange. Labels are
//! bounded: versions, operations, reasons and kinds are fixed sets; `agent_id` is a configured
//! agent or `unknown`; `code` is an HTTP status. Never a raw path, never a token.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::api::failure::{Failure, UpstreamErrorKind};
use crate::api::operation::{ApiVersion, Operation};
use crate::api::reply::V1Refusal;
use crate::config::{Snapshot, UNKNOWN_AGENT};
use crate::observe::access_log::AccessLog;
use crate::observe::backend::BackendMetrics;
use crate::observe::exchange::{operation_name, version_name, Exchange, Protocol};
use crate::observe::in_flight::InFlight;
use crate::observe::log_sink::LineSink;
use crate::observe::retirement::RetirementMetrics;
use crate::observe::usage::{AgentUsage, UsageTracker};
use crate::policy::auth::AuthFailure;
use crate::policy::rate_limit::{BackendError, DecidedBy};

/// Bucket bounds in seconds: 100 µs doubling up to about 52 s.
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.0001, 2.0, 20).expect("static bucket layout is valid")
}

/// `api_version` label values: one per version, then "none" for requests that named no operation.
const VERSION_LABELS: usize = ApiVersion::COUNT + 1;
/// `operation` label values: one per operation, then "unmatched".
const OPERATION_LABELS: usize = Operation::COUNT + 1;

fn version_index(v: Option<ApiVersion>) -> usize {
    v.map_or(ApiVersion::COUNT, |v| v as usize)
}

fn operation_index(op: Option<Operation>) -> usize {
    op.map_or(Operation::COUNT, |o| o as usize)
}

fn version_label(index: usize) -> &'static str {
    version_name(ApiVersion::ALL.get(index).copied())
}

fn operation_label(index: usize) -> &'static str {
    operation_name(Operation::ALL.get(index).copied())
}

/// The handles every request touches, resolved once per (version, operation) so the hot path
/// does no label lookup for the common 200.
struct RouteHandles {
    ok: IntCounter,
    duration: Histogram,
}

/// Requests by route: the count by status and the time taken, in all and at the backend.
struct RouteMetrics {
    by_route: [[RouteHandles; OPERATION_LABELS]; VERSION_LABELS],
    upstream_by_operation: [Histogram; OPERATION_LABELS],
    requests: IntCounterVec,
}

impl RouteMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "agent_gateway_requests_total",
                "Requests answered by the proxy listener, including the gateway's own refusals, those their client gave up on before they were sent on (code 499), and those the gateway cut off itself (an HTTP/2 drain deadline, a client too slow to read) before any answer went out (code 503).",
            ),
            &["api_version", "operation", "code"],
        )?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "agent_gateway_request_duration_seconds",
                "Time from request start to the end of the response.",
            )
            .buckets(latency_buckets()),
            &["api_version", "operation"],
        )?;
        let upstream_duration = HistogramVec::new(
            HistogramOpts::new(
                "agent_gateway_upstream_duration_seconds",
                "Time spent waiting on the backend, from sending the request to its response header.",
            )
            .buckets(latency_buckets()),
            &["operation"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_duration.clone()))?;
        registry.register(Box::new(upstream_duration.clone()))?;

        let by_route = std::array::from_fn(|v| {
            std::array::from_fn(|o| RouteHandles {
                ok: requests.with_label_values(&[version_label(v), operation_label(o), "200"]),
                duration: request_duration
                    .with_label_values(&[version_label(v), operation_label(o)]),
            })
        });
        let upstream_by_operation =
            std::array::from_fn(|o| upstream_duration.with_label_values(&[operation_label(o)]));
        // Label sets resolved above print from the start, at zero; drop the ones no request
        // can have: an operation without a version or a version without one, a 200 for a
        // request that named no operation, and backend time for one that never went there.
        for v in 0..VERSION_LABELS {
            for o in 0..OPERATION_LABELS {
                let (version, operation) = (version_label(v), operation_label(o));
                let named = (v < ApiVersion::COUNT, o < Operation::COUNT);
                if named.0 != named.1 {
                    let _ = request_duration.remove_label_values(&[version, operation]);
                }
                if named != (true, true) {
                    let _ = requests.remove_label_values(&[version, operation, "200"]);
                }
            }
        }
        let _ = upstream_duration.remove_label_values(&[operation_label(Operation::COUNT)]);
        Ok(Self {
            by_route,
            upstream_by_operation,
            requests,
        })
    }

    fn record(&self, ex: &Exchange, (vi, oi): (usize, usize), elapsed: Duration) {
        let route = &self.by_route[vi][oi];
        if ex.status == 200 {
            route.ok.inc();
        } else {
            let mut code_buf = itoa::Buffer::new();
            let code = code_buf.format(ex.status);
            self.requests
                .with_label_values(&[version_label(vi), operation_label(oi), code])
                .inc();
        }
        route.duration.observe(elapsed.as_secs_f64());
        if let Some(t) = ex.upstream.header_time {
            self.upstream_by_operation[oi].observe(t.as_secs_f64());
        }
    }
}

/// Client connections and requests by protocol, in the order of [`Protocol::ALL`].
struct ProtocolMetrics {
    connections: [IntCounter; Protocol::COUNT],
    requests: [IntCounter; Protocol::COUNT],
}

impl ProtocolMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let connections = IntCounterVec::new(
            Opts::new(
                "agent_gateway_connections_total",
                "Client connections accepted on the proxy listener, by protocol (http/1.1, h2).",
            ),
            &["protocol"],
        )?;
        let requests = IntCounterVec::new(
            Opts::new(
                "agent_gateway_requests_by_protocol_total",
                "Requests answered on the proxy listener, by the protocol the client spoke.",
            ),
            &["protocol"],
        )?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        Ok(Self {
            connections: Protocol::ALL.map(|p| connections.with_label_values(&[p.as_str()])),
            requests: Protocol::ALL.map(|p| requests.with_label_values(&[p.as_str()])),
        })
    }
}

/// Requests refused or failed, by reason: credentials, the backend, the body's schema.
struct FailureMetrics {
    auth: [IntCounter; AuthFailure::COUNT],
    /// Requests refused with 429 for their address's failed authentications.
    auth_throttled: IntCounter,
    /// 401s that could not count toward their address's throttle: too many addresses.
    auth_untracked: IntCounter,
    upstream: [IntCounter; UpstreamErrorKind::COUNT],
    validation: IntCounterVec,
}

impl FailureMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let auth = IntCounterVec::new(
            Opts::new(
                "agent_gateway_auth_failures_total",
                "Requests refused with 401, by reason.",
            ),
            &["reason"],
        )?;
        let auth_throttled = IntCounter::new(
            "agent_gateway_auth_throttled_total",
            "Requests refused with 429 because their client address failed to authenticate auth.max_failures_per_minute times in its minute.",
        )?;
        let auth_untracked = IntCounter::new(
            "agent_gateway_auth_failures_untracked_total",
            "401s not counted toward their client address's auth.max_failures_per_minute, because as many other addresses as the gateway keeps had failures in their minute: guessing spread over very many addresses.",
        )?;
        let upstream = IntCounterVec::new(
            Opts::new(
                "agent_gateway_upstream_errors_total",
                "Failures talking to the backend, by kind.",
            ),
            &["kind"],
        )?;
        let validation = IntCounterVec::new(
            Opts::new(
                "agent_gateway_validation_failures_total",
                "Request bodies that broke the spec's schema, by operation and rule.",
            ),
            &["operation", "rule"],
        )?;
        registry.register(Box::new(auth.clone()))?;
        registry.register(Box::new(auth_throttled.clone()))?;
        registry.register(Box::new(auth_untracked.clone()))?;
        registry.register(Box::new(upstream.clone()))?;
        registry.register(Box::new(validation.clone()))?;
        Ok(Self {
            auth: AuthFailure::ALL.map(|r| auth.with_label_values(&[r.as_str()])),
            auth_throttled,
            auth_untracked,
            upstream: UpstreamErrorKind::ALL.map(|k| upstream.with_label_values(&[k.as_str()])),
            validation,
        })
    }

    fn record(&self, ex: &Exchange, operation: &str) {
        if let Some(f) = ex.auth_failure {
            self.auth[f as usize].inc();
        }
        if ex.auth_throttled() {
            self.auth_throttled.inc();
        }
        for kind in &ex.upstream.errors {
            self.upstream[*kind as usize].inc();
        }
        if let Some(rule) = ex.validation_failure {
            self.validation
                .with_label_values(&[operation, rule.as_str()])
                .inc();
        }
    }
}

/// Each agent's calls by version and operation, its v1 refusals, and when it last (and first,
/// since this process started) called v1.
struct AgentMetrics {
    /// Each configured agent's series and usage, found at its first request: a request then
    /// counts after one lookup, where each series by its labels was one.
    series: RwLock<HashMap<String, Arc<AgentSeries>, fnv::FnvBuildHasher>>,
    requests: IntCounterVec,
    v1_refusals: IntCounterVec,
    v1_first_seen: GaugeVec,
    v1_last_seen: GaugeVec,
    /// When each agent last authenticated with each of its tokens: when an old token stopped
    /// being used, so that it can be removed.
    token_last_used: GaugeVec,
}

impl AgentMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "agent_gateway_agent_requests_total",
                "Requests per configured agent (unknown for anything else), API version and operation.",
            ),
            &["agent_id", "api_version", "operation"],
        )?;
        let v1_refusals = IntCounterVec::new(
            Opts::new(
                "agent_gateway_v1_refusals_total",
                "v1 calls refused with 410 by the retirement policy, by agent and reason.",
            ),
            &["agent_id", "reason"],
        )?;
        let v1_first_seen = GaugeVec::new(
            Opts::new(
                "agent_gateway_v1_first_seen_timestamp_seconds",
                "Unix time of each configured agent's first v1 call since this process started.",
            ),
            &["agent_id"],
        )?;
        let v1_last_seen = GaugeVec::new(
            Opts::new(
                "agent_gateway_v1_last_seen_timestamp_seconds",
                "Unix time of each agent's latest v1 call (refused ones included).",
            ),
            &["agent_id"],
        )?;
        let token_last_used = GaugeVec::new(
            Opts::new(
                "agent_gateway_agent_token_last_used_timestamp_seconds",
                "Unix time each agent last authenticated with each token (token: the first 8 hex digits of its SHA-256).",
            ),
            &["agent_id", "token"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(v1_refusals.clone()))?;
        registry.register(Box::new(token_last_used.clone()))?;
        registry.register(Box::new(v1_first_seen.clone()))?;
        registry.register(Box::new(v1_last_seen.clone()))?;
        Ok(Self {
            series: RwLock::default(),
            requests,
            v1_refusals,
            v1_first_seen,
            v1_last_seen,
            token_last_used,
        })
    }

    /// Runs `f` on the series of the configured agent `id`, resolved at its first request.
    fn with_series<R>(
        &self,
        id: &str,
        usage: &UsageTracker,
        f: impl FnOnce(&AgentSeries) -> R,
    ) -> R {
        let make = || AgentSeries {
            requests: ApiVersion::ALL.map(|v| {
                Operation::ALL.map(|op| {
                    self.requests
                        .with_label_values(&[id, v.as_str(), op.as_str()])
                })
            }),
            v1_last_seen: OnceLock::new(),
            token_last_used: RwLock::default(),
            usage: usage.agent(id),
        };
        super::with_entry(&self.series, id, make, |series| f(series))
    }

    /// Makes `id`'s request and refusal counters exist, at zero until it calls.
    fn publish(&self, id: &str) {
        for version in ApiVersion::ALL {
            for operation in Operation::ALL {
                self.requests
                    .with_label_values(&[id, version.as_str(), operation.as_str()]);
            }
        }
        for refusal in V1Refusal::ALL {
            self.v1_refusals.with_label_values(&[id, refusal.reason()]);
        }
    }

    /// Counts a request that named a version; `v1_first_seen` is set when `usage` says it is
    /// the agent's first v1 call.
    fn record(&self, ex: &Exchange, v: ApiVersion, operation: &str, usage: &UsageTracker) {
        let started_at = ex
            .started_at
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let Some(id) = ex.agent_id else {
            let agent = UNKNOWN_AGENT;
            self.requests
                .with_label_values(&[agent, v.as_str(), operation])
                .inc();
            if v == ApiVersion::V1 {
                self.v1_last_seen
                    .with_label_values(&[agent])
                    .set(started_at);
            }
            if let Some(r) = ex.v1_refusal() {
                self.v1_refusals
                    .with_label_values(&[agent, r.reason()])
                    .inc();
            }
            return;
        };
        self.with_series(id, usage, |series| {
            match ex.operation {
                Some(op) => series.requests[v as usize][op as usize].inc(),
                None => self
                    .requests
                    .with_label_values(&[id, v.as_str(), operation])
                    .inc(),
            }
            if let Some(token) = ex.token_label {
                let make = || self.token_last_used.with_label_values(&[id, token]);
                super::with_entry(&series.token_last_used, token, make, |gauge| {
                    gauge.set(started_at);
                });
            }
            if v == ApiVersion::V1 {
                series
                    .v1_last_seen
                    .get_or_init(|| self.v1_last_seen.with_label_values(&[id]))
                    .set(started_at);
            }
            if let Some(r) = ex.v1_refusal() {
                self.v1_refusals.with_label_values(&[id, r.reason()]).inc();
            }
            if let Some(op) = ex.operation {
                if series.usage.record(v, op, ex.started_at) {
                    self.v1_first_seen.with_label_values(&[id]).set(started_at);
                }
            }
        });
    }
}

/// One configured agent's series, resolved once. Those resolved up front exist for every
/// configured agent anyway ([`AgentMetrics::publish`]); its v1 and token gauges appear at its
/// first v1 call and its first use of each token, as they did when looked up by label.
struct AgentSeries {
    /// `[version][operation]`, in the order of [`ApiVersion::ALL`] and [`Operation::ALL`].
    requests: [[IntCounter; Operation::COUNT]; ApiVersion::COUNT],
    v1_last_seen: OnceLock<Gauge>,
    /// The gauge of each token it authenticated with, by label: a few per agent.
    token_last_used: RwLock<HashMap<String, Arc<Gauge>, fnv::FnvBuildHasher>>,
    usage: Arc<AgentUsage>,
}

/// The rate limit: refusals by agent, decisions by what made them, and Redis' failures.
struct RateLimitMetrics {
    limited: IntCounterVec,
    /// By what decided, then allowed (0) or limited (1).
    decisions: [[IntCounter; 2]; DecidedBy::COUNT],
    backend_errors: [IntCounter; BackendError::COUNT],
}

impl RateLimitMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let limited = IntCounterVec::new(
            Opts::new(
                "agent_gateway_rate_limited_total",
                "Requests refused with 429 because their agent was over its rate limit.",
            ),
            &["agent_id"],
        )?;
        let decisions = IntCounterVec::new(
            Opts::new(
                "agent_gateway_rate_limit_decisions_total",
                "Rate-limit decisions on requests of agents with a limit, by what decided \
                 (local, redis, on_redis_error) and result (allowed, limited).",
            ),
            &["backend", "result"],
        )?;
        let backend_errors = IntCounterVec::new(
            Opts::new(
                "agent_gateway_rate_limit_backend_errors_total",
                "Rate-limit decisions Redis did not make, so on_redis_error applied, by kind \
                 (timeout, error, unavailable: not asked during the cooldown after a failure).",
            ),
            &["kind"],
        )?;
        registry.register(Box::new(limited.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(backend_errors.clone()))?;
        Ok(Self {
            limited,
            decisions: DecidedBy::ALL.map(|by| {
                ["allowed", "limited"]
                    .map(|result| decisions.with_label_values(&[by.as_str(), result]))
            }),
            backend_errors: BackendError::ALL
                .map(|kind| backend_errors.with_label_values(&[kind.as_str()])),
        })
    }

    fn record(&self, ex: &Exchange) {
        if let Some(decision) = ex.rate_limit {
            self.decisions[decision.by as usize][usize::from(!decision.allowed())].inc();
            if let Some(kind) = decision.error {
                self.backend_errors[kind as usize].inc();
            }
        }
        if ex.rate_limited() {
            let agent = ex.agent_id.unwrap_or(UNKNOWN_AGENT);
            self.limited.with_label_values(&[agent]).inc();
        }
    }
}

/// What the process is: its version, and when it started (its counters started from zero
/// then), set once; and how it fares (CPU, memory, file descriptors), read at each scrape.
fn register_process_info(registry: &Registry, started: SystemTime) -> prometheus::Result<()> {
    let build_info = IntGaugeVec::new(
        Opts::new(
            "agent_gateway_build_info",
            "Always 1; the label carries the version.",
        ),
        &["version"],
    )?;
    build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
    // Tells a counter's first scrape from a window's cut: `v1-usage --prometheus` counts a
    // replica's first scraped values only when it started inside the window.
    let start_time = Gauge::new(
        "agent_gateway_start_time_seconds",
        "Unix time this process started (its counters started from zero then).",
    )?;
    start_time.set(
        started
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    );
    registry.register(Box::new(build_info))?;
    registry.register(Box::new(start_time))?;
    register_process_collector(registry)
}

/// The standard `process_*` series (CPU seconds, resident memory, open and maximum file
/// descriptors, start time, threads), read from `/proc` at each scrape by the prometheus
/// crate's collector. The crate registers one in its default registry by itself, which the
/// binary passes here: that one is kept.
fn register_process_collector(registry: &Registry) -> prometheus::Result<()> {
    let collector = prometheus::process_collector::ProcessCollector::for_self();
    match registry.register(Box::new(collector)) {
        Err(prometheus::Error::AlreadyReg) | Ok(()) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The values of `counters`, summed by their `label`.
fn counter_sums(counters: &IntCounterVec, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for family in counters.collect() {
        for metric in family.get_metric() {
            let key = metric
                .get_label()
                .iter()
                .find(|l| l.name() == label)
                .map_or("", |l| l.value());
            *out.entry(key.to_owned()).or_insert(0) += metric.get_counter().value() as u64;
        }
    }
    out
}

/// Every metric the gateway exports, as ready handles, by family.
pub struct Telemetry {
    routes: RouteMetrics,
    protocols: ProtocolMetrics,
    failures: FailureMetrics,
    agents: AgentMetrics,
    rate_limits: RateLimitMetrics,
    /// The retirement plan, published at each scrape.
    retirement: RetirementMetrics,
    /// Requests being served now: the pipeline counts them, a draining process waits for
    /// them, and `agent_gateway_in_flight_requests` shows them.
    pub in_flight: Arc<InFlight>,
    /// Per-agent counts behind `/v1-usage`.
    pub usage: UsageTracker,
    /// The backend's names and addresses: the proxy counts DNS errors and ejections into it.
    pub backends: Arc<BackendMetrics>,
    access_log: AccessLog,
}

impl Telemetry {
    /// Creates and registers every metric in `registry`, one family after the other.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let usage = UsageTracker::default();
        register_process_info(registry, usage.started())?;
        Ok(Self {
            routes: RouteMetrics::register(registry)?,
            protocols: ProtocolMetrics::register(registry)?,
            failures: FailureMetrics::register(registry)?,
            agents: AgentMetrics::register(registry)?,
            rate_limits: RateLimitMetrics::register(registry)?,
            retirement: RetirementMetrics::register(registry)?,
            in_flight: InFlight::register(registry)?,
            usage,
            backends: Arc::new(BackendMetrics::register(registry)?),
            access_log: AccessLog::new(None),
        })
    }

    /// Logs go to `sink`, whose count of dropped lines joins `registry`; access lines are
    /// written into it directly when the logs are `json` (otherwise, and without a sink, they
    /// are `tracing` events).
    pub fn logging_to(
        mut self,
        sink: Arc<LineSink>,
        json: bool,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        registry.register(Box::new(sink.dropped_lines().clone()))?;
        self.access_log = AccessLog::new(json.then_some(sink));
        Ok(self)
    }

    /// Brings the metrics that follow the config up to `snapshot` as of `now`; the admin
    /// listener calls it before each scrape. Every configured agent's request and refusal
    /// counters exist from then on, at zero until it calls, so `increase()` over a window
    /// sees its first call; the retirement plan's gauges are set ([`RetirementMetrics`]).
    pub fn publish(&self, snapshot: &Snapshot, now: SystemTime) {
        for id in snapshot.auth.agents.keys() {
            self.agents.publish(id);
        }
        self.retirement.publish(snapshot, now);
    }

    /// Each agent's 429s for being over its rate limit since this gateway started.
    pub fn rate_limited_by_agent(&self) -> BTreeMap<String, u64> {
        counter_sums(&self.rate_limits.limited, "agent_id")
    }

    /// Requests by API version (`v1`, `v2`, `none`) since this gateway started.
    pub fn requests_by_version(&self) -> BTreeMap<String, u64> {
        counter_sums(&self.routes.requests, "api_version")
    }

    /// Counts a client connection speaking `protocol`.
    pub fn connection_opened(&self, protocol: Protocol) {
        self.protocols.connections[protocol as usize].inc();
    }

    /// Counts a 401 that its client's failed-authentication window could not count
    /// ([`crate::proxy`]'s table of them was full).
    pub fn auth_failure_untracked(&self) {
        self.failures.auth_untracked.inc();
    }

    /// Counts a finished request and writes its access log line.
    pub fn record(&self, ex: &Exchange) {
        self.protocols.requests[ex.protocol as usize].inc();
        let elapsed = ex.started.elapsed();
        let route = (version_index(ex.version), operation_index(ex.operation));
        let operation = operation_label(route.1);
        self.routes.record(ex, route, elapsed);
        self.failures.record(ex, operation);
        self.rate_limits.record(ex);
        if let Some(Failure::Overflow(o)) = &ex.failure {
            self.backends.overflowed(o.reason);
        }
        if let Some(v) = ex.version {
            self.agents.record(ex, v, operation, &self.usage);
        }
        self.access_log.write(ex, elapsed);
    }
}
