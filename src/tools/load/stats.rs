//! What the connections count as a run goes: each connection's tally of answers, failures
//! and latencies, merged into the run's at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::api::operation::Operation;

/// Largest latency the histograms hold (larger values are clamped): one minute, in µs.
pub const MAX_LATENCY_US: u64 = 60_000_000;

listed_enum! {
    /// How an exchange failed without an HTTP status.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub enum ConnErrorKind {
        Connect => "connect",
        Timeout => "timeout",
        /// The server closed the connection before a whole response.
        Closed => "closed",
        /// A read or write failed (reset, broken pipe).
        Io => "io",
        Protocol => "protocol",
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
    /// In flight when the run was interrupted: abandoned, counted nowhere else.
    pub cancelled: u64,
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
            cancelled: 0,
        }
    }
}

/// A latency in whole µs, within the histograms' bounds.
pub fn latency_us(latency: Duration) -> u64 {
    (latency.as_micros() as u64).clamp(1, MAX_LATENCY_US)
}

impl Stats {
    /// Records an answer; `latency_us` from [`latency_us`].
    pub fn record_response(&mut self, status: u16, latency_us: u64) {
        self.latency_us.saturating_record(latency_us);
        *self.statuses.entry(status).or_default() += 1;
    }

    pub fn record_error(&mut self, kind: ConnErrorKind) {
        *self.conn_errors.entry(kind).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Stats) {
        // Every field, without `..`: a new count does not compile until it is merged.
        let Stats {
            latency_us,
            statuses,
            conn_errors,
            operations,
            unsent,
            late_starts,
            cancelled,
        } = other;
        self.latency_us
            .add(latency_us)
            .expect("histograms share bounds");
        for (k, v) in statuses {
            *self.statuses.entry(*k).or_default() += v;
        }
        for (k, v) in conn_errors {
            *self.conn_errors.entry(*k).or_default() += v;
        }
        for (a, b) in self.operations.iter_mut().zip(operations) {
            *a += b;
        }
        self.unsent += unsent;
        self.late_starts += late_starts;
        self.cancelled += cancelled;
    }
}
