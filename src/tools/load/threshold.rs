//! Pass/fail thresholds, as k6 has them: `METRIC OP VALUE` (`p99<50ms`, `errors<0.1%`,
//! `rps>1800`), a latency optionally of one operation (`verify_request.p99<50ms`), parsed once from the command line (`--threshold`, and `--slo` for
//! `--find-max`), and the verdicts a report carries once they are judged against it
//! ([`super::judge`]).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::api::operation::Operation;

use super::LoadError;

listed_enum! {
    /// What a threshold measures; its label is the name a threshold gives it and the report
    /// shows.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Metric {
        P50 => "p50",
        P90 => "p90",
        P99 => "p99",
        P99_9 => "p99.9",
        Max => "max",
        Mean => "mean",
        /// Failed requests (non-2xx, no answer, never sent) over all requests.
        Errors => "errors",
        /// Achieved responses per second.
        Rps => "rps",
    }
}

impl Metric {
    /// The unit of its limit and value: milliseconds, a ratio (0 to 1), or requests/s.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Errors => "ratio",
            Metric::Rps => "req/s",
            _ => "ms",
        }
    }

    /// A value in the metric's unit, for people.
    pub fn show(self, v: f64) -> String {
        match self {
            Metric::Errors => format!("{}%", trim_float(v * 100.0, 4)),
            Metric::Rps => format!("{v:.1} req/s"),
            _ => format!("{v:.3} ms"),
        }
    }
}

/// `v` with at most `decimals` decimals and no trailing zeros.
fn trim_float(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

listed_enum! {
    /// How the measured value must compare with the limit.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Cmp {
        Lt => "<",
        Le => "<=",
        Gt => ">",
        Ge => ">=",
    }
}

impl Cmp {
    pub(super) fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            Cmp::Lt => value < limit,
            Cmp::Le => value <= limit,
            Cmp::Gt => value > limit,
            Cmp::Ge => value >= limit,
        }
    }
}

/// One threshold: `[operation.]metric op limit`, the limit in the metric's unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// As given, for messages and the report.
    pub text: String,
    /// The operation whose latency it judges; `None` for the whole mix.
    pub operation: Option<Operation>,
    pub metric: Metric,
    pub cmp: Cmp,
    pub limit: f64,
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Threshold {
    type Err = LoadError;

    fn from_str(s: &str) -> Result<Self, LoadError> {
        let bad = |why: String| LoadError::Threshold(s.to_owned(), why);
        let at = s
            .find(['<', '>'])
            .ok_or_else(|| bad("no comparison: use <, <=, > or >= (e.g. p99<50ms)".into()))?;
        let (name, rest) = s.split_at(at);
        let (cmp, value) = match (rest.as_bytes()[0], rest.as_bytes().get(1)) {
            (b'<', Some(b'=')) => (Cmp::Le, &rest[2..]),
            (b'<', _) => (Cmp::Lt, &rest[1..]),
            (b'>', Some(b'=')) => (Cmp::Ge, &rest[2..]),
            _ => (Cmp::Gt, &rest[1..]),
        };
        let (operation, name) = scope(name.trim());
        let metric = metric_named(name).ok_or_else(|| {
            bad(format!(
                "unknown metric {name:?} (known: {}, each optionally after an operation and a dot: verify_request.p99)",
                Metric::ALL.map(Metric::as_str).join(", ")
            ))
        })?;
        if operation.is_some() && metric.unit() != "ms" {
            return Err(bad(format!(
                "only a latency (p50, p90, p99, p99.9, max, mean) is measured per operation, not {}",
                metric.as_str()
            )));
        }
        let limit = parse_limit(metric, value.trim()).map_err(bad)?;
        Ok(Threshold {
            text: s.trim().to_owned(),
            operation,
            metric,
            cmp,
            limit,
        })
    }
}

/// The operation a threshold's name starts with (`verify_request.p99`), and the rest.
fn scope(name: &str) -> (Option<Operation>, &str) {
    Operation::ALL
        .into_iter()
        .find_map(|op| {
            let metric = name.strip_prefix(op.as_str())?.strip_prefix('.')?;
            Some((Some(op), metric))
        })
        .unwrap_or((None, name))
}

/// A metric by name; k6's `p(99)` spelling and `p99_9` are accepted too.
fn metric_named(name: &str) -> Option<Metric> {
    let name = name.to_ascii_lowercase();
    let name = match name.strip_prefix("p(").and_then(|n| n.strip_suffix(')')) {
        Some(q) => format!("p{q}"),
        None => name.replace('_', "."),
    };
    Metric::ALL.into_iter().find(|m| m.as_str() == name)
}

/// The limit in the metric's unit: latencies in ms (`50ms`, `1.5s`, `800us`; a plain number is
/// ms, as in k6), the error ratio as a percentage (`0.1%`) or a ratio (`0.001`), rates as a
/// number (`1800`, `1800/s`).
fn parse_limit(metric: Metric, text: &str) -> Result<f64, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .ok_or_else(|| format!("{text:?} is not a number >= 0"))?;
    let unit = unit.trim();
    match metric {
        Metric::Errors => match unit {
            "%" if n <= 100.0 => Ok(n / 100.0),
            "" if n <= 1.0 => Ok(n),
            "" => Err(format!(
                "{text:?}: give a percentage (e.g. 0.1%) or a ratio from 0 to 1"
            )),
            _ => Err(format!("{text:?}: give a percentage (e.g. 0.1%)")),
        },
        Metric::Rps => match unit {
            "" | "/s" | "req/s" => Ok(n),
            _ => Err(format!("{text:?}: give requests per second (e.g. 1800)")),
        },
        _ => match unit {
            "" | "ms" => Ok(n),
            "us" | "µs" => Ok(n / 1000.0),
            "s" => Ok(n * 1000.0),
            _ => Err(format!(
                "{text:?}: give a latency such as 50ms, 1.5s or 800us"
            )),
        },
    }
}

/// A threshold judged against a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// As given on the command line.
    pub threshold: String,
    /// The operation whose latency was judged; null for the whole mix.
    pub operation: Option<&'static str>,
    pub metric: &'static str,
    pub op: &'static str,
    /// In `unit`.
    pub limit: f64,
    /// What the run measured, in `unit`; null when it measured nothing to judge.
    pub actual: Option<f64>,
    pub unit: &'static str,
    pub passed: bool,
}

impl Verdict {
    /// `p99<50ms (p99 73.214 ms)`, `verify_request.p99<50ms (verify_request.p99 73.214 ms)`,
    /// or `(nothing measured)`.
    pub fn describe(&self) -> String {
        let metric = metric_named(self.metric).expect("verdicts name known metrics");
        let name = match self.operation {
            Some(op) => format!("{op}.{}", self.metric),
            None => self.metric.to_owned(),
        };
        match self.actual {
            Some(v) => format!("{} ({name} {})", self.threshold, metric.show(v)),
            None => format!("{} (nothing measured)", self.threshold),
        }
    }
}
