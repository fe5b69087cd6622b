//! What the connections count as a run goes: each connection's tally of answers, failures
//! and latencies, merged into the run's at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::{Counter, Histogram};

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

/// How one request ended, as the counts see it.
#[derive(Debug, Clone, Copy)]
pub enum Ended {
    /// An answer, with its latency in whole µs (from [`latency_us`]).
    Answered {
        status: u16,
        latency_us: u64,
    },
    Failed(ConnErrorKind),
    /// Not sent: the run's hard deadline had passed.
    Unsent,
}

/// How requests ended: answers by status with their latencies, failures by kind, and requests
/// never sent. A connection keeps one over the whole run ([`Stats`]) and one per second
/// ([`super::timeline::Second`]).
#[derive(Debug, Clone)]
pub struct Tally<C: Counter> {
    pub latency_us: Histogram<C>,
    pub statuses: BTreeMap<u16, u64>,
    pub conn_errors: BTreeMap<ConnErrorKind, u64>,
    /// Scheduled requests never sent: the run's hard deadline had passed.
    pub unsent: u64,
}

impl<C: Counter> Tally<C> {
    /// An empty tally whose latencies keep `sigfig` significant digits.
    pub fn new(sigfig: u8) -> Self {
        Self {
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, sigfig)
                .expect("static histogram bounds are valid"),
            statuses: BTreeMap::new(),
            conn_errors: BTreeMap::new(),
            unsent: 0,
        }
    }

    pub fn record(&mut self, ended: Ended) {
        match ended {
            Ended::Answered { status, latency_us } => self.record_response(status, latency_us),
            Ended::Failed(kind) => self.record_error(kind),
            Ended::Unsent => self.unsent += 1,
        }
    }

    /// Records an answer; `latency_us` from [`latency_us`].
    pub fn record_response(&mut self, status: u16, latency_us: u64) {
        self.latency_us.saturating_record(latency_us);
        *self.statuses.entry(status).or_default() += 1;
    }

    pub fn record_error(&mut self, kind: ConnErrorKind) {
        *self.conn_errors.entry(kind).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Tally<C>) {
        // Every field, without `..` (here and below): a new count does not compile until it is
        // merged, looked at and cleared.
        let Tally {
            latency_us,
            statuses,
            conn_errors,
            unsent,
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
        self.unsent += unsent;
    }

    pub fn is_empty(&self) -> bool {
        // Every latency recorded came with a status.
        let Tally {
            latency_us: _,
            statuses,
            conn_errors,
            unsent,
        } = self;
        statuses.is_empty() && conn_errors.is_empty() && *unsent == 0
    }

    /// Empties the tally, keeping its histogram's memory.
    pub fn clear(&mut self) {
        let Tally {
            latency_us,
            statuses,
            conn_errors,
            unsent,
        } = self;
        latency_us.reset();
        statuses.clear();
        conn_errors.clear();
        *unsent = 0;
    }
}

/// One connection's counts over the run; merged into the run's at the end.
#[derive(Debug, Clone)]
pub struct Stats {
    /// How its requests ended.
    pub ended: Tally<u64>,
    pub operations: [u64; Operation::COUNT],
    /// Open model: requests that started more than 1 ms after they were due (no idle
    /// connection, or a busy client).
    pub late_starts: u64,
    /// In flight when the run was interrupted: abandoned, counted nowhere else.
    pub cancelled: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            ended: Tally::new(3),
            operations: [0; Operation::COUNT],
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
    pub fn merge(&mut self, other: &Stats) {
        // Every field, without `..`: a new count does not compile until it is merged.
        let Stats {
            ended,
            operations,
            late_starts,
            cancelled,
        } = other;
        self.ended.merge(ended);
        for (a, b) in self.operations.iter_mut().zip(operations) {
            *a += b;
        }
        self.late_starts += late_starts;
        self.cancelled += cancelled;
    }
}
