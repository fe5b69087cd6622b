//! Metrics and the access log ([`AccessLog`]), both made from a finished [`Exchange`].
//!
//! Metric handles are created once, in [`Telemetry::register`], against a given registry (the
//! binary passes prometheus' default registry, the one pingora's own metrics use). Labels are
//! bounded: versions, operations, reasons and kinds are fixed sets; `agent_id` is a configured
//! agent or `unknown`; `code` is an HTTP status. Never a raw path, never a token.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{
    exponential_buckets, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::api::operation::{ApiVersion, Operation};
use crate::api::reply::V1Refusal;
use crate::config::Snapshot;
use crate::observe::access_log::AccessLog;
use crate::observe::exchange::{
    operation_name, version_name, Exchange, Protocol, UpstreamErrorKind,
};
use crate::observe::in_flight::{InFlight, InFlightGauge};
use crate::observe::log_sink::LineSink;
use crate::observe::retirement::RetirementMetrics;
use crate::observe::usage::UsageTracker;
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

/// Every metric the gateway exports, as ready handles.
pub struct Telemetry {
    by_route: [[RouteHandles; OPERATION_LABELS]; VERSION_LABELS],
    upstream_by_operation: [Histogram; OPERATION_LABELS],
    requests: IntCounterVec,
    auth_failures: [IntCounter; AuthFailure::ALL.len()],
    agent_requests: IntCounterVec,
    upstream_errors: [IntCounter; UpstreamErrorKind::ALL.len()],
    /// Requests being served now: the pipeline counts them, a draining process waits for
    /// them, and `agent_gateway_in_flight_requests` shows them.
    pub in_flight: Arc<InFlight>,
    /// Client connections and requests by protocol, in the order of [`Protocol::ALL`].
    connections: [IntCounter; Protocol::ALL.len()],
    requests_by_protocol: [IntCounter; Protocol::ALL.len()],
    v1_refusals: IntCounterVec,
    v1_first_seen: GaugeVec,
    v1_last_seen: GaugeVec,
    validation_failures: IntCounterVec,
    rate_limited: IntCounterVec,
    /// By what decided, then allowed (0) or limited (1).
    rate_limit_decisions: [[IntCounter; 2]; DecidedBy::ALL.len()],
    rate_limit_backend_errors: [IntCounter; BackendError::ALL.len()],
    /// The retirement plan, published at each scrape.
    retirement: RetirementMetrics,
    /// Per-agent counts behind `/v1-usage`.
    pub usage: UsageTracker,
    access_log: AccessLog,
}

impl Telemetry {
    /// Creates and registers every metric in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "agent_gateway_requests_total",
                "Requests answered by the proxy listener, including the gateway's own refusals.",
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
        let auth_failures_vec = IntCounterVec::new(
            Opts::new(
                "agent_gateway_auth_failures_total",
                "Requests refused with 401, by reason.",
            ),
            &["reason"],
        )?;
        let agent_requests = IntCounterVec::new(
            Opts::new(
                "agent_gateway_agent_requests_total",
                "Requests per configured agent (unknown for anything else), API version and operation.",
            ),
            &["agent_id", "api_version", "operation"],
        )?;
        let upstream_errors_vec = IntCounterVec::new(
            Opts::new(
                "agent_gateway_upstream_errors_total",
                "Failures talking to the backend, by kind.",
            ),
            &["kind"],
        )?;
        let in_flight = Arc::new(InFlight::default());
        let connections_vec = IntCounterVec::new(
            Opts::new(
                "agent_gateway_connections_total",
                "Client connections accepted on the proxy listener, by protocol (http/1.1, h2).",
            ),
            &["protocol"],
        )?;
        let requests_by_protocol_vec = IntCounterVec::new(
            Opts::new(
                "agent_gateway_requests_by_protocol_total",
                "Requests answered on the proxy listener, by the protocol the client spoke.",
            ),
            &["protocol"],
        )?;
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
        let usage = UsageTracker::default();
        // Tells a counter's first scrape from a window's cut: `v1-usage --prometheus` counts a
        // replica's first scraped values only when it started inside the window.
        let start_time = Gauge::new(
            "agent_gateway_start_time_seconds",
            "Unix time this process started (its counters started from zero then).",
        )?;
        start_time.set(
            usage
                .started()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );

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

        let validation_failures = IntCounterVec::new(
            Opts::new(
                "agent_gateway_validation_failures_total",
                "Request bodies that broke the spec's schema, by operation and rule.",
            ),
            &["operation", "rule"],
        )?;
        let rate_limited = IntCounterVec::new(
            Opts::new(
                "agent_gateway_rate_limited_total",
                "Requests refused with 429 because their agent was over its rate limit.",
            ),
            &["agent_id"],
        )?;

        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_duration.clone()))?;
        registry.register(Box::new(upstream_duration.clone()))?;
        registry.register(Box::new(auth_failures_vec.clone()))?;
        registry.register(Box::new(agent_requests.clone()))?;
        registry.register(Box::new(upstream_errors_vec.clone()))?;
        registry.register(Box::new(InFlightGauge::new(in_flight.clone())?))?;
        registry.register(Box::new(connections_vec.clone()))?;
        registry.register(Box::new(requests_by_protocol_vec.clone()))?;
        registry.register(Box::new(build_info))?;
        registry.register(Box::new(start_time))?;
        registry.register(Box::new(v1_refusals.clone()))?;
        registry.register(Box::new(v1_first_seen.clone()))?;
        registry.register(Box::new(v1_last_seen.clone()))?;
        registry.register(Box::new(validation_failures.clone()))?;
        let rate_limit_decisions = IntCounterVec::new(
            Opts::new(
                "agent_gateway_rate_limit_decisions_total",
                "Rate-limit decisions on requests of agents with a limit, by what decided \
                 (local, redis, on_redis_error) and result (allowed, limited).",
            ),
            &["backend", "result"],
        )?;
        let rate_limit_backend_errors = IntCounterVec::new(
            Opts::new(
                "agent_gateway_rate_limit_backend_errors_total",
                "Rate-limit decisions Redis did not make, so on_redis_error applied, by kind \
                 (timeout, error, unavailable: not asked during the cooldown after a failure).",
            ),
            &["kind"],
        )?;
        registry.register(Box::new(rate_limited.clone()))?;
        registry.register(Box::new(rate_limit_decisions.clone()))?;
        registry.register(Box::new(rate_limit_backend_errors.clone()))?;

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
            auth_failures: AuthFailure::ALL
                .map(|r| auth_failures_vec.with_label_values(&[r.as_str()])),
            agent_requests,
            upstream_errors: UpstreamErrorKind::ALL
                .map(|k| upstream_errors_vec.with_label_values(&[k.as_str()])),
            in_flight,
            connections: Protocol::ALL.map(|p| connections_vec.with_label_values(&[p.as_str()])),
            requests_by_protocol: Protocol::ALL
                .map(|p| requests_by_protocol_vec.with_label_values(&[p.as_str()])),
            v1_refusals,
            v1_first_seen,
            v1_last_seen,
            retirement: RetirementMetrics::register(registry)?,
            usage,
            validation_failures,
            rate_limited,
            rate_limit_decisions: DecidedBy::ALL.map(|by| {
                ["allowed", "limited"]
                    .map(|result| rate_limit_decisions.with_label_values(&[by.as_str(), result]))
            }),
            rate_limit_backend_errors: BackendError::ALL
                .map(|kind| rate_limit_backend_errors.with_label_values(&[kind.as_str()])),
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
            for version in ApiVersion::ALL {
                for operation in Operation::ALL {
                    self.agent_requests.with_label_values(&[
                        id,
                        version.as_str(),
                        operation.as_str(),
                    ]);
                }
            }
            for refusal in V1Refusal::ALL {
                self.v1_refusals.with_label_values(&[id, refusal.reason()]);
            }
        }
        self.retirement.publish(snapshot, now);
    }

    /// Counts a client connection speaking `protocol`.
    pub fn connection_opened(&self, protocol: Protocol) {
        self.connections[protocol as usize].inc();
    }

    /// Counts a finished request and writes its access log line.
    pub fn record(&self, ex: &Exchange) {
        self.requests_by_protocol[ex.protocol as usize].inc();
        let elapsed = ex.started.elapsed();
        let (vi, oi) = (version_index(ex.version), operation_index(ex.operation));
        let (version, operation) = (version_label(vi), operation_label(oi));
        let route = &self.by_route[vi][oi];
        if ex.status == 200 {
            route.ok.inc();
        } else {
            let mut code_buf = itoa::Buffer::new();
            let code = code_buf.format(ex.status);
            self.requests
                .with_label_values(&[version, operation, code])
                .inc();
        }
        route.duration.observe(elapsed.as_secs_f64());
        if let Some(t) = ex.upstream.header_time {
            self.upstream_by_operation[oi].observe(t.as_secs_f64());
        }
        if let Some(f) = ex.auth_failure {
            self.auth_failures[f as usize].inc();
        }
        for kind in &ex.upstream.errors {
            self.upstream_errors[*kind as usize].inc();
        }
        if let Some(rule) = ex.validation_failure {
            self.validation_failures
                .with_label_values(&[operation, rule.as_str()])
                .inc();
        }
        if let Some(decision) = ex.rate_limit {
            self.rate_limit_decisions[decision.by as usize][usize::from(!decision.allowed())].inc();
            if let Some(kind) = decision.error {
                self.rate_limit_backend_errors[kind as usize].inc();
            }
        }
        if ex.rate_limited() {
            let agent = ex.agent_id.as_deref().unwrap_or("unknown");
            self.rate_limited.with_label_values(&[agent]).inc();
        }
        if let Some(v) = ex.version {
            let agent = ex.agent_id.as_deref().unwrap_or("unknown");
            self.agent_requests
                .with_label_values(&[agent, version, operation])
                .inc();
            let started_at = ex
                .started_at
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
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
            if let (Some(id), Some(op)) = (&ex.agent_id, ex.operation) {
                if self.usage.record(id, v, op, ex.started_at) {
                    self.v1_first_seen.with_label_values(&[id]).set(started_at);
                }
            }
        }

        self.access_log.write(ex, elapsed);
    }
}
