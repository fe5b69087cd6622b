//! Thresholds judged against a finished report: each metric's value in the report, compared
//! with the limit, gives the verdict the report then carries.

use crate::api::operation::Operation;

use super::report::Report;
use super::threshold::{Metric, Threshold, Verdict};

/// The metric's value in a report, of one operation's latencies or of the whole mix; `None`
/// when the run measured nothing it could judge (no response for a latency, no request for
/// the error ratio): such a threshold fails.
fn value(metric: Metric, operation: Option<Operation>, r: &Report) -> Option<f64> {
    let (l, responses) = match operation {
        None => (&r.latency_ms, r.responses),
        Some(op) => {
            let of_op = r.latency_by_operation.get(op.as_str())?;
            (&of_op.latency_ms, of_op.responses)
        }
    };
    let latency = |v: f64| (responses > 0).then_some(v);
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
        let actual = value(self.metric, self.operation, r);
        Verdict {
            threshold: self.text.clone(),
            operation: self.operation.map(Operation::as_str),
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
