//! The run second by second: what completed in each whole second since the start (latencies,
//! statuses, errors), for the report's charts over time.
//!
//! One [`Timeline`] per run, shared by the connections behind a mutex; each connection keeps
//! only its current second ([`SecondRecorder`]) and adds it to the timeline when its second
//! changes, so the lock is taken about once a second per connection and memory grows with the
//! run's length, not with its connections.

use std::collections::BTreeMap;
use std::sync::Mutex;

use hdrhistogram::Histogram;

use super::stats::{ConnErrorKind, MAX_LATENCY_US};

/// Significant digits of a second's latency histogram: 1% resolution is plenty for a chart,
/// and keeps a second at about 10 KiB (3 digits would be 128 KiB).
const SECOND_SIGFIG: u8 = 2;

/// What completed in one second.
#[derive(Debug, Clone)]
pub struct Second {
    pub latency_us: Histogram<u32>,
    pub statuses: BTreeMap<u16, u64>,
    pub conn_errors: BTreeMap<ConnErrorKind, u64>,
    /// Scheduled requests dropped unsent (past the run's deadline).
    pub unsent: u64,
}

impl Default for Second {
    fn default() -> Self {
        Second {
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, SECOND_SIGFIG)
                .expect("static histogram bounds are valid"),
            statuses: BTreeMap::new(),
            conn_errors: BTreeMap::new(),
            unsent: 0,
        }
    }
}

impl Second {
    /// Records an answer; `latency_us` already clamped to the histogram's bounds.
    pub fn record_response(&mut self, status: u16, latency_us: u64) {
        self.latency_us.saturating_record(latency_us);
        *self.statuses.entry(status).or_default() += 1;
    }

    pub fn record_error(&mut self, kind: ConnErrorKind) {
        *self.conn_errors.entry(kind).or_default() += 1;
    }

    fn merge(&mut self, other: &Second) {
        // Every field, without `..` (here and below): a new count does not compile until it is
        // merged, looked at and cleared.
        let Second {
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

    fn is_empty(&self) -> bool {
        // Every latency recorded came with a status.
        let Second {
            latency_us: _,
            statuses,
            conn_errors,
            unsent,
        } = self;
        statuses.is_empty() && conn_errors.is_empty() && *unsent == 0
    }

    /// Empties the second, keeping its histogram's memory.
    fn clear(&mut self) {
        let Second {
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

/// The whole run, second `i` at index `i`.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    seconds: Vec<Second>,
}

impl Timeline {
    /// Adds what a connection counted in second `index`.
    pub fn add(&mut self, index: usize, second: &Second) {
        if self.seconds.len() <= index {
            self.seconds.resize_with(index + 1, Second::default);
        }
        self.seconds[index].merge(second);
    }

    pub fn seconds(&self) -> &[Second] {
        &self.seconds
    }

    /// Makes the timeline at least `len` seconds long (quiet seconds are seconds too).
    pub fn extend_to(&mut self, len: usize) {
        if self.seconds.len() < len {
            self.seconds.resize_with(len, Second::default);
        }
    }
}

/// A connection's current second, added to the shared timeline when the second changes.
#[derive(Debug, Default)]
pub struct SecondRecorder {
    index: usize,
    second: Second,
}

impl SecondRecorder {
    /// The second numbered `index`, after handing the previous one to `timeline` if the
    /// second changed.
    pub fn at(&mut self, index: usize, timeline: &Mutex<Timeline>) -> &mut Second {
        if index != self.index {
            self.flush(timeline);
            self.index = index;
        }
        &mut self.second
    }

    /// Hands what was counted to `timeline`.
    pub fn flush(&mut self, timeline: &Mutex<Timeline>) {
        if !self.second.is_empty() {
            timeline
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(self.index, &self.second);
            self.second.clear();
        }
    }
}
