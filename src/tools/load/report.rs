//! What a run measured: per-connection statistics, merged into the report, as text or JSON.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::api::operation::Operation;

use super::args::Rate;
use super::run::Plan;
use super::MAX_LATENCY_US;

/// How an exchange failed without an HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConnErrorKind {
    Connect,
    Timeout,
    /// The server closed the connection before a whole response.
    Closed,
    /// A read or write failed (reset, broken pipe).
    Io,
    Protocol,
}

impl ConnErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnErrorKind::Connect => "connect",
            ConnErrorKind::Timeout => "timeout",
            ConnErrorKind::Closed => "closed",
            ConnErrorKind::Io => "io",
            ConnErrorKind::Protocol => "protocol",
        }
    }
}

/// One connection's tally; merged into the run's at the end.
#[derive(Debug, Clone)]
pub struct Stats {
    pub latency_us: Histogram<u64>,
    pub statuses: BTreeMap<u16, u64>,
    pub conn_errors: BTreeMap<ConnErrorKind, u64>,
    pub operations: [u64; Operation::COUNT],
    /// Scheduled requests never sent: the run's hard deadline had passed.
    pub unsent: u64,
    /// Open model: requests that started more than 1 ms after they were due (no idle
    /// connection, or a busy client).
    pub late_starts: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("static histogram bounds are valid"),
            statuses: BTreeMap::new(),
            conn_errors: BTreeMap::new(),
            operations: [0; Operation::COUNT],
            unsent: 0,
            late_starts: 0,
        }
    }
}

impl Stats {
    pub fn record_response(&mut self, status: u16, latency: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, MAX_LATENCY_US);
        self.latency_us.saturating_record(us);
        *self.statuses.entry(status).or_default() += 1;
    }

    pub fn record_error(&mut self, kind: ConnErrorKind) {
        *self.conn_errors.entry(kind).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Stats) {
        self.latency_us
            .add(&other.latency_us)
            .expect("histograms share bounds");
        for (k, v) in &other.statuses {
            *self.statuses.entry(*k).or_default() += v;
        }
        for (k, v) in &other.conn_errors {
            *self.conn_errors.entry(*k).or_default() += v;
        }
        for (a, b) in self.operations.iter_mut().zip(other.operations) {
            *a += b;
        }
        self.unsent += other.unsent;
        self.late_starts += other.late_starts;
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
    pub mean: f64,
}

/// Failures: HTTP statuses other than 2xx, and exchanges that got no status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Errors {
    pub total: u64,
    pub by_status: BTreeMap<u16, u64>,
    pub connection: BTreeMap<&'static str, u64>,
    pub unsent: u64,
}

/// The result of a run, printed as text or JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub target: String,
    pub api: &'static str,
    /// `open` (fixed schedule) or `closed` (`--rate max`).
    pub model: &'static str,
    /// Requests per second asked for (open model).
    pub rate: Option<f64>,
    pub connections: usize,
    pub mix: String,
    /// From the first scheduled request to the last answer.
    pub elapsed_s: f64,
    /// Exchanges that got an HTTP response (any status).
    pub responses: u64,
    pub throughput_rps: f64,
    /// Open model: from each request's intended start; closed model: from its send.
    pub latency_from: &'static str,
    pub latency_ms: Latency,
    pub statuses: BTreeMap<u16, u64>,
    pub errors: Errors,
    pub late_starts: u64,
    pub operations: BTreeMap<&'static str, u64>,
}

/// Builds the report from the merged stats of a run.
pub fn make_report(plan: &Plan, stats: &Stats, elapsed: Duration) -> Report {
    let h = &stats.latency_us;
    let ms = |us: u64| us as f64 / 1000.0;
    let responses: u64 = stats.statuses.values().sum();
    let by_status: BTreeMap<u16, u64> = stats
        .statuses
        .iter()
        .filter(|(s, _)| !(200..300).contains(*s))
        .map(|(s, n)| (*s, *n))
        .collect();
    let connection: BTreeMap<&'static str, u64> = stats
        .conn_errors
        .iter()
        .map(|(k, n)| (k.as_str(), *n))
        .collect();
    let total = by_status.values().sum::<u64>() + connection.values().sum::<u64>() + stats.unsent;
    let secs = elapsed.as_secs_f64();
    let (model, rate, latency_from) = match plan.rate {
        Rate::Max => ("closed", None, "send"),
        Rate::PerSecond(r) => ("open", Some(r), "intended start"),
    };
    Report {
        target: plan.target_url.clone(),
        api: plan.script.api.as_str(),
        model,
        rate,
        connections: plan.connections,
        mix: plan.script.mix.to_string(),
        elapsed_s: secs,
        responses,
        throughput_rps: if secs > 0.0 {
            responses as f64 / secs
        } else {
            0.0
        },
        latency_from,
        latency_ms: Latency {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        },
        statuses: stats.statuses.clone(),
        errors: Errors {
            total,
            by_status,
            connection,
            unsent: stats.unsent,
        },
        late_starts: stats.late_starts,
        operations: Operation::ALL
            .iter()
            .zip(stats.operations)
            .filter(|(_, n)| *n > 0)
            .map(|(op, n)| (op.as_str(), n))
            .collect(),
    }
}

pub(super) fn join_counts<K: fmt::Display>(items: impl IntoIterator<Item = (K, u64)>) -> String {
    items
        .into_iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The human-readable report.
pub fn format_report(r: &Report) -> String {
    let mut out = String::new();
    let model = match r.rate {
        Some(rate) => format!("open model at {rate} req/s"),
        None => "closed model (--rate max)".to_string(),
    };
    let _ = writeln!(
        out,
        "{} (api {}): {model}, {} connections, mix {}",
        r.target, r.api, r.connections, r.mix
    );
    let _ = writeln!(
        out,
        "  throughput  {:.1} req/s ({} responses in {:.2} s)",
        r.throughput_rps, r.responses, r.elapsed_s
    );
    let l = &r.latency_ms;
    let _ = writeln!(
        out,
        "  latency     p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms  (from {})",
        l.p50, l.p90, l.p99, l.p99_9, l.max, r.latency_from
    );
    let _ = writeln!(out, "  statuses    {}", join_counts(r.statuses.clone()));
    if r.errors.total == 0 {
        let _ = writeln!(out, "  errors      none");
    } else {
        let mut parts = Vec::new();
        if !r.errors.by_status.is_empty() {
            parts.push(format!(
                "by status {}",
                join_counts(r.errors.by_status.clone())
            ));
        }
        if !r.errors.connection.is_empty() {
            parts.push(format!(
                "connection {}",
                join_counts(r.errors.connection.clone())
            ));
        }
        if r.errors.unsent > 0 {
            parts.push(format!("unsent (past the deadline) {}", r.errors.unsent));
        }
        let _ = writeln!(
            out,
            "  errors      {} ({})",
            r.errors.total,
            parts.join("; ")
        );
    }
    if r.late_starts > 0 {
        let _ = writeln!(
            out,
            "  late starts {} requests started > 1 ms after due (more --connections may help)",
            r.late_starts
        );
    }
    let _ = writeln!(out, "  operations  {}", join_counts(r.operations.clone()));
    out
}

/// The one-second progress line written to stderr while running.
pub fn progress_line(second: u64, done_in_second: u64, done: u64, errors: u64) -> String {
    format!("[{second:>4}s] {done_in_second:>8} req/s  total {done:>10}  errors {errors}")
}
