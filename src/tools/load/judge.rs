//! Thresholds judged against a finished report: each metric's value in the report, compared
//! with the limit, gives the verdict the report then carries.

use super::report::Report;
use super::threshold::{Metric, Threshold, Verdict};

/// The metric's value in a report; `None` when the run measured nothing it could judge (no
/// response for a latency, no request for the error ratio): such a threshold fails.
fn value(metric: Metric, r: &Report) -> Option<f64> {
    let l = &r.latency_ms;
    let latency = |v: f64| (r.responses > 0).then_some(v);
    match metric {
        Metric::P50 => latency(l.p50),
        Metric::P90 => latency(l.p90),
        Metric::P99 => latency(l.p99),
        Metric::P99_9 => latency(l.p99_9),
        Metric::Max => latency(l.max),
        Metric::Mean => latency(l.mean),
        Metric::Errors => r.error_ratio(),
        Metric::Rps => Some(r.throughput_rps),
    }
}

impl Threshold {
    /// This threshold's verdict on a run (judging lives here, above the report, so that the
    /// report can carry verdicts without depending on how they are made).
    pub fn judge(&self, r: &Report) -> Verdict {
        let actual = value(self.metric, r);
        Verdict {
            threshold: self.text.clone(),
            metric: self.metric.as_str(),
            op: self.cmp.as_str(),
            limit: self.limit,
            actual,
            unit: self.metric.unit(),
            passed: actual.is_some_and(|v| self.cmp.holds(v, self.limit)),
        }
    }
}

/// Judges every threshold against a report.
pub fn judge_all(thresholds: &[Threshold], r: &Report) -> Vec<Verdict> {
    thresholds.iter().map(|t| t.judge(r)).collect()
}
