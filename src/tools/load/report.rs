//! What a run measured: per-connection statistics merged into the report (the data model the
//! text, the JSON and the HTML report are made from), described by the run's [`Setup`].

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::{Duration, SystemTime};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::api::operation::Operation;

use super::plan::{Load, Setup};
use super::schedule::Schedule;
use super::stats::{AgentCounts, Stats};
use super::threshold::Verdict;
use super::timeline::Timeline;

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

impl Latency {
    pub(super) fn of<T: hdrhistogram::Counter>(h: &Histogram<T>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

/// Failures: HTTP statuses other than 2xx, and exchanges that got no status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Errors {
    pub total: u64,
    pub by_status: BTreeMap<u16, u64>,
    pub connection: BTreeMap<&'static str, u64>,
    pub unsent: u64,
}

/// One `--stages` stage as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageReport {
    pub duration_s: f64,
    pub target_rps: f64,
}

/// What completed in one second of the run (in a span of seconds, in a long run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SecondReport {
    /// Seconds since the start: this entry covers `[t, t + span_s)`.
    pub t: u64,
    /// The seconds it covers: 1, or a power of two in a run too long to keep every second
    /// (see the timeline's module doc). Its counts are over all of them.
    pub span_s: u64,
    /// Open model: the requests the schedule called for in each of its seconds, on average.
    pub target_rps: Option<f64>,
    /// Ramps: the stage running at its start, from 1.
    pub stage: Option<usize>,
    /// Answers (any status) that completed in it.
    pub responses: u64,
    /// Of those answers; null when there were none.
    pub latency_ms: Option<Latency>,
    pub statuses: BTreeMap<u16, u64>,
    /// Exchanges without an answer, by kind, and `unsent`.
    pub errors: BTreeMap<&'static str, u64>,
    /// Of the answers of each operation that had any in this second.
    pub latency_by_operation: BTreeMap<&'static str, Latency>,
}

/// One operation's answers over the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperationLatency {
    /// Its answers (any status).
    pub responses: u64,
    pub latency_ms: Latency,
    /// Its latency distribution (HdrHistogram's percentile spectrum).
    pub latency_distribution: Vec<DistributionPoint>,
}

/// What one agent's requests came to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentReport {
    pub id: String,
    pub weight: u32,
    /// Requests sent as it.
    pub requests: u64,
    /// Its answers (any status).
    pub responses: u64,
    pub statuses: BTreeMap<u16, u64>,
    /// Answers 4xx: refused, by the gateway (401, 403, 410, 429) or the backend.
    pub refused: u64,
    /// Its failed requests: non-2xx answers, no answer, or never sent.
    pub errors: u64,
}

/// A point of the latency distribution: `percentile` % of the answers took at most
/// `latency_ms`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DistributionPoint {
    pub percentile: f64,
    pub latency_ms: f64,
}

/// Points per halving of the distance to 100% in the latency distribution (HdrHistogram's
/// percentile output uses 5).
const DISTRIBUTION_TICKS: u32 = 5;

/// The result of a run, printed as text or JSON, and drawn in the HTML report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub target: String,
    pub api: &'static str,
    /// `open` (fixed schedule) or `closed` (`--rate max`).
    pub model: &'static str,
    /// Requests per second asked for (open model at a flat rate).
    pub rate: Option<f64>,
    pub connections: usize,
    pub mix: String,
    /// From the start to the end of the run: until every request taken has ended, which a
    /// request sent just before the deadline can hold up to twice `--timeout` past
    /// `duration_s`, or until Ctrl-C.
    pub elapsed_s: f64,
    /// From the start to the last answer: what `throughput_rps` is over.
    pub last_answer_s: f64,
    /// Exchanges that got an HTTP response (any status).
    pub responses: u64,
    /// Answers per second, from the start to the last answer (requests still waiting out
    /// their timeout after it do not lower it).
    pub throughput_rps: f64,
    /// Open model: from each request's intended start; closed model: from its send.
    pub latency_from: &'static str,
    pub latency_ms: Latency,
    pub statuses: BTreeMap<u16, u64>,
    pub errors: Errors,
    pub late_starts: u64,
    pub operations: BTreeMap<&'static str, u64>,
    /// Open model with `--stages`: the ramps, from 0 req/s.
    pub stages: Option<Vec<StageReport>>,
    /// How long the run was planned to send.
    pub duration_s: f64,
    pub timeout_s: f64,
    /// When the run started (UTC, RFC 3339).
    pub started_at: String,
    /// Ended early by Ctrl-C.
    pub interrupted: bool,
    /// Requests in flight when the run was interrupted, abandoned and not counted.
    pub cancelled: u64,
    /// The run second by second.
    pub timeline: Vec<SecondReport>,
    /// The latency distribution (HdrHistogram's percentile spectrum).
    pub latency_distribution: Vec<DistributionPoint>,
    /// `--threshold` (or `--slo`) verdicts.
    pub thresholds: Vec<Verdict>,
    /// The HTTP version spoken: `1.1` or `2`.
    pub http: &'static str,
    /// Requests in flight at once per connection: HTTP/2 streams (1 for HTTP/1.1).
    pub streams: usize,
    /// The names of the `-H` headers sent with every request.
    pub headers: Vec<String>,
    /// `--requests`: the run ended once this many answers were in.
    pub requests_limit: Option<u64>,
    /// Latency of each operation that was answered.
    pub latency_by_operation: BTreeMap<&'static str, OperationLatency>,
    /// Each agent's requests, in the order they were given.
    pub agents: Vec<AgentReport>,
}

impl Report {
    /// Failed requests over all requests counted (answered, failed without an answer, unsent);
    /// `None` when there were none.
    pub fn error_ratio(&self) -> Option<f64> {
        let attempts =
            self.responses + self.errors.connection.values().sum::<u64>() + self.errors.unsent;
        (attempts > 0).then(|| self.errors.total as f64 / attempts as f64)
    }

    /// Whether every threshold passed (true when there are none).
    pub fn thresholds_passed(&self) -> bool {
        self.thresholds.iter().all(|v| v.passed)
    }
}

/// What a run measured, before it becomes a report.
#[derive(Debug, Clone)]
pub struct Measured {
    pub stats: Stats,
    pub timeline: Timeline,
    pub elapsed: Duration,
    pub started_at: SystemTime,
    pub interrupted: bool,
}

impl Measured {
    /// An empty measurement of a run that started at `started_at`.
    pub fn new(started_at: SystemTime) -> Measured {
        Measured {
            stats: Stats::default(),
            timeline: Timeline::default(),
            elapsed: Duration::ZERO,
            started_at,
            interrupted: false,
        }
    }
}

/// Builds the report (without verdicts) from what a run measured.
pub fn make_report(setup: &Setup, m: &Measured) -> Report {
    let stats = &m.stats;
    let responses: u64 = stats.ended.statuses.values().sum();
    let by_status: BTreeMap<u16, u64> = stats
        .ended
        .statuses
        .iter()
        .filter(|(s, _)| !(200..300).contains(*s))
        .map(|(s, n)| (*s, *n))
        .collect();
    let connection: BTreeMap<&'static str, u64> = stats
        .ended
        .conn_errors
        .iter()
        .map(|(k, n)| (k.as_str(), *n))
        .collect();
    let total =
        by_status.values().sum::<u64>() + connection.values().sum::<u64>() + stats.ended.unsent;
    let secs = m.elapsed.as_secs_f64();
    let last_answer = Duration::from_micros(stats.last_answer_us).as_secs_f64();
    let schedule = match &setup.load {
        Load::Open(s) => Some(s),
        Load::Closed(_) => None,
    };
    let (model, latency_from) = match schedule {
        None => ("closed", "send"),
        Some(_) => ("open", "intended start"),
    };
    let ramps = schedule.filter(|s| s.flat_rate().is_none());
    let all = stats.ended.latency_of_all();
    Report {
        target: setup.target.clone(),
        api: setup.api.version().as_str(),
        model,
        rate: schedule.and_then(Schedule::flat_rate),
        connections: setup.connections,
        mix: setup.mix.clone(),
        elapsed_s: secs,
        last_answer_s: last_answer,
        responses,
        throughput_rps: throughput(responses, last_answer),
        latency_from,
        latency_ms: Latency::of(&all),
        statuses: stats.ended.statuses.clone(),
        errors: Errors {
            total,
            by_status,
            connection,
            unsent: stats.ended.unsent,
        },
        late_starts: stats.late_starts,
        operations: Operation::ALL
            .iter()
            .zip(stats.operations)
            .filter(|(_, n)| *n > 0)
            .map(|(op, n)| (op.as_str(), n))
            .collect(),
        stages: ramps.map(|s| {
            s.stages()
                .iter()
                .map(|st| StageReport {
                    duration_s: st.duration.as_secs_f64(),
                    target_rps: st.target,
                })
                .collect()
        }),
        duration_s: setup.load.duration().as_secs_f64(),
        timeout_s: setup.timeout.as_secs_f64(),
        started_at: humantime::format_rfc3339_seconds(m.started_at).to_string(),
        interrupted: m.interrupted,
        cancelled: stats.cancelled,
        timeline: timeline_report(schedule, ramps.is_some(), &m.timeline),
        latency_distribution: distribution(&all),
        thresholds: Vec::new(),
        http: setup.http.as_str(),
        streams: setup.streams,
        headers: setup.headers.clone(),
        requests_limit: setup.requests,
        latency_by_operation: Operation::ALL
            .iter()
            .zip(&stats.ended.latency_us)
            .filter(|(_, h)| !h.is_empty())
            .map(|(op, h)| {
                let of_op = OperationLatency {
                    responses: h.len(),
                    latency_ms: Latency::of(h),
                    latency_distribution: distribution(h),
                };
                (op.as_str(), of_op)
            })
            .collect(),
        agents: setup
            .agents
            .iter()
            .enumerate()
            .map(|(k, a)| {
                let counts = stats.agents.get(k).cloned().unwrap_or_default();
                agent_report(&a.id, a.weight, counts)
            })
            .collect(),
    }
}

/// Answers per second over the `secs` from the start to the last answer; 0 without answers.
fn throughput(responses: u64, secs: f64) -> f64 {
    if responses > 0 && secs > 0.0 {
        responses as f64 / secs
    } else {
        0.0
    }
}

fn agent_report(id: &str, weight: u32, counts: AgentCounts) -> AgentReport {
    let AgentCounts {
        sent,
        statuses,
        unanswered,
    } = counts;
    let count = |range: std::ops::Range<u16>| -> u64 {
        statuses
            .iter()
            .filter(|(s, _)| range.contains(s))
            .map(|(_, n)| n)
            .sum()
    };
    let responses = statuses.values().sum();
    AgentReport {
        id: id.to_owned(),
        weight,
        requests: sent,
        responses,
        refused: count(400..500),
        errors: responses - count(200..300) + unanswered,
        statuses,
    }
}

/// The timeline as reported: one entry per second (or per span of seconds), with the
/// schedule's target beside it.
fn timeline_report(
    schedule: Option<&Schedule>,
    ramps: bool,
    timeline: &Timeline,
) -> Vec<SecondReport> {
    let planned = schedule.map_or(0, |s| s.duration().as_secs_f64().ceil() as u64);
    let span = timeline.span();
    timeline
        .entries()
        .iter()
        .enumerate()
        .map(|(i, second)| {
            let t = i as u64 * span;
            let responses: u64 = second.statuses.values().sum();
            let mut errors: BTreeMap<&'static str, u64> = second
                .conn_errors
                .iter()
                .map(|(k, n)| (k.as_str(), *n))
                .collect();
            if second.unsent > 0 {
                errors.insert("unsent", second.unsent);
            }
            SecondReport {
                t,
                span_s: span,
                target_rps: schedule
                    .filter(|_| t < planned)
                    .map(|s| s.target_rate(t, span)),
                stage: schedule
                    .filter(|_| ramps && t < planned)
                    .map(|s| s.stage_at(Duration::from_secs(t)) + 1),
                responses,
                latency_ms: (responses > 0).then(|| Latency::of(&second.latency_of_all())),
                statuses: second.statuses.clone(),
                errors,
                latency_by_operation: Operation::ALL
                    .iter()
                    .zip(&second.latency_us)
                    .filter(|(_, h)| !h.is_empty())
                    .map(|(op, h)| (op.as_str(), Latency::of(h)))
                    .collect(),
            }
        })
        .collect()
}

/// HdrHistogram's percentile spectrum of a run's latencies.
fn distribution(h: &Histogram<u64>) -> Vec<DistributionPoint> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut points: Vec<DistributionPoint> = h
        .iter_quantiles(DISTRIBUTION_TICKS)
        .map(|v| DistributionPoint {
            percentile: v.quantile_iterated_to() * 100.0,
            latency_ms: h.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0,
        })
        .collect();
    // The iterator ends with 100% at the highest value; the max itself is exact.
    if let Some(last) = points.last_mut() {
        last.latency_ms = h.max() as f64 / 1000.0;
    }
    points
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
    let model = match (r.model, r.rate, &r.stages) {
        ("closed", _, _) => "closed model (--rate max)".to_string(),
        (_, Some(rate), _) => format!("open model at {rate} req/s"),
        (_, None, Some(stages)) => format!(
            "open model, stages {}",
            stages
                .iter()
                .map(|s| format!("{}s:{}", s.duration_s, s.target_rps))
                .collect::<Vec<_>>()
                .join(",")
        ),
        _ => "open model".to_string(),
    };
    let until = match r.requests_limit {
        Some(n) => format!(" until {n} answers"),
        None => String::new(),
    };
    let (http, streams) = match r.http {
        "2" => (", HTTP/2", format!(" × {} streams", r.streams)),
        _ => ("", String::new()),
    };
    let _ = writeln!(
        out,
        "{} (api {}{http}): {model}{until}, {} connections{streams}, mix {}",
        r.target, r.api, r.connections, r.mix
    );
    if r.interrupted {
        let _ = writeln!(
            out,
            "  interrupted by Ctrl-C after {:.2} s of {} s planned; {} requests in flight abandoned (not counted)",
            r.elapsed_s, r.duration_s, r.cancelled
        );
    }
    // The run's end, when requests that got no answer held it well past the last one.
    let ended = if r.elapsed_s - r.last_answer_s >= 0.1 {
        format!("; the run ended at {:.2} s", r.elapsed_s)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  throughput  {:.1} req/s ({} responses in {:.2} s, to the last answer{ended})",
        r.throughput_rps, r.responses, r.last_answer_s
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
        let more = if r.http == "2" {
            "--connections or --streams"
        } else {
            "--connections"
        };
        let _ = writeln!(
            out,
            "  late starts {} requests started > 1 ms after due (more {more} may help)",
            r.late_starts
        );
    }
    let _ = writeln!(out, "  operations  {}", join_counts(r.operations.clone()));
    if !r.latency_by_operation.is_empty() {
        let _ = writeln!(
            out,
            "  latency by operation (ms)  {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "p50", "p90", "p99", "p99.9", "max", "answers"
        );
        for (op, o) in &r.latency_by_operation {
            let l = &o.latency_ms;
            let _ = writeln!(
                out,
                "    {op:<24} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9}",
                l.p50, l.p90, l.p99, l.p99_9, l.max, o.responses
            );
        }
    }
    if r.agents.len() > 1 || r.agents.iter().any(|a| a.refused > 0) {
        let _ = writeln!(out, "  agents");
        for a in &r.agents {
            let _ = writeln!(
                out,
                "    {} (weight {}): {} sent, {} refused, {} errors; statuses {}",
                a.id,
                a.weight,
                a.requests,
                a.refused,
                a.errors,
                if a.statuses.is_empty() {
                    "none".to_owned()
                } else {
                    join_counts(a.statuses.clone())
                }
            );
        }
    }
    if !r.headers.is_empty() {
        let _ = writeln!(out, "  headers     {}", r.headers.join(", "));
    }
    if !r.thresholds.is_empty() {
        let _ = writeln!(out, "  thresholds");
        for v in &r.thresholds {
            let mark = if v.passed { "pass" } else { "FAIL" };
            let _ = writeln!(out, "    {mark}  {}", v.describe());
        }
    }
    out
}

/// Where an open run is, for the progress line: the target rate now and, during ramps, the
/// stage (1-based) of how many.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProgressTarget {
    pub rate: f64,
    pub stage: Option<(usize, usize)>,
}

/// The one-second progress line written to stderr while running.
pub fn progress_line(
    second: u64,
    target: Option<ProgressTarget>,
    done_in_second: u64,
    done: u64,
    errors: u64,
) -> String {
    let target = match target {
        Some(ProgressTarget {
            rate,
            stage: Some((stage, stages)),
        }) => format!("  stage {stage}/{stages} target {rate:>8.0} req/s"),
        Some(ProgressTarget { rate, stage: None }) => format!("  target {rate:>8.0} req/s"),
        None => String::new(),
    };
    format!("[{second:>4}s]{target} {done_in_second:>8} req/s  total {done:>10}  errors {errors}")
}

/// One step of `--find-max`: a flat open run at `rate`, judged against the SLO.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KneeStep {
    pub rate: f64,
    /// Whether every SLO threshold passed; null for a step cut short by Ctrl-C (not judged).
    pub held: Option<bool>,
    /// The step's run, its `thresholds` the SLO's verdicts.
    pub report: Report,
}

/// A `--find-max` step that could not run: it counts as broken and ends the search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedStep {
    pub rate: f64,
    /// Why (`cannot connect to ...`).
    pub error: String,
}

/// The result of `--find-max`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KneeReport {
    /// Always `find_max`: tells this shape from a single run's.
    pub mode: &'static str,
    pub target: String,
    pub api: &'static str,
    pub connections: usize,
    pub mix: String,
    pub slo: Vec<String>,
    pub step_duration_s: f64,
    pub started_at: String,
    pub steps: Vec<KneeStep>,
    /// The highest rate that held the SLO; null when none did.
    pub max_rate_held: Option<f64>,
    /// The lowest rate that broke it; null when none did.
    pub lowest_rate_broken: Option<f64>,
    /// The step after `steps` that could not connect, which ended the search; null when none.
    pub failed_step: Option<FailedStep>,
    pub interrupted: bool,
}

/// The human-readable result of `--find-max`.
pub fn format_knee(k: &KneeReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} (api {}): find-max, SLO {}, steps of {} s, {} connections, mix {}",
        k.target,
        k.api,
        k.slo.join(" and "),
        k.step_duration_s,
        k.connections,
        k.mix
    );
    let _ = writeln!(
        out,
        "  {:>4}  {:>10}  {:>10}  {:>10}  {:>10}  {:>8}  SLO",
        "step", "rate", "achieved", "p50 ms", "p99 ms", "errors"
    );
    for (i, s) in k.steps.iter().enumerate() {
        let r = &s.report;
        let verdict = match s.held {
            Some(true) => "held".to_string(),
            Some(false) => format!(
                "broke: {}",
                r.thresholds
                    .iter()
                    .filter(|v| !v.passed)
                    .map(|v| v.describe())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => "interrupted".to_string(),
        };
        let _ = writeln!(
            out,
            "  {:>4}  {:>10}  {:>10.1}  {:>10.3}  {:>10.3}  {:>8}  {verdict}",
            i + 1,
            s.rate,
            r.throughput_rps,
            r.latency_ms.p50,
            r.latency_ms.p99,
            r.errors.total
        );
    }
    if let Some(failed) = &k.failed_step {
        let _ = writeln!(
            out,
            "  {:>4}  {:>10}  broke: {} (the search ends here)",
            k.steps.len() + 1,
            failed.rate,
            failed.error
        );
    }
    if k.interrupted {
        let _ = writeln!(out, "  interrupted by Ctrl-C");
    }
    match (k.max_rate_held, k.lowest_rate_broken) {
        (Some(held), Some(broke)) => {
            let _ = writeln!(
                out,
                "  highest rate that held the SLO: {held} req/s (broken at {broke} req/s)"
            );
        }
        (Some(held), None) => {
            let _ = writeln!(
                out,
                "  highest rate that held the SLO: {held} req/s (no step broke it: more --max-steps go higher)"
            );
        }
        (None, _) => {
            let _ = writeln!(out, "  no rate held the SLO");
        }
    }
    out
}
