//! The run second by second: what completed in each whole second since the start (latencies,
//! statuses, errors), for the report's charts over time.
//!
//! One [`Timeline`] per run, shared by the connections behind a mutex; each connection keeps
//! only its current second ([`SecondRecorder`]) and adds it to the timeline when its second
//! changes, so the lock is taken about once a second per connection and memory grows with the
//! run's length, not with its connections. A saved run read back records straight into the
//! timeline.

use std::sync::Mutex;

use super::stats::{Record, Tally};

/// Significant digits of a second's latency histograms: 1% resolution is plenty for a chart,
/// and keeps an operation's second at a few KiB (3 digits would be ten times as much).
const SECOND_SIGFIG: u8 = 2;

/// What completed in one second.
pub type Second = Tally<u32>;

fn empty_second() -> Second {
    Tally::new(SECOND_SIGFIG)
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
            self.seconds.resize_with(index + 1, empty_second);
        }
        self.seconds[index].merge(second);
    }

    /// Counts `r` in the second it ended in.
    pub fn record(&mut self, r: &Record) {
        let index = r.second();
        self.extend_to(index + 1);
        self.seconds[index].record(r);
    }

    /// Counts `n` requests never sent, in the second `r` (one of them) ended in.
    pub fn record_unsent(&mut self, r: &Record, n: u64) {
        let index = r.second();
        self.extend_to(index + 1);
        self.seconds[index].unsent += n;
    }

    pub fn seconds(&self) -> &[Second] {
        &self.seconds
    }

    /// Makes the timeline at least `len` seconds long (quiet seconds are seconds too).
    pub fn extend_to(&mut self, len: usize) {
        if self.seconds.len() < len {
            self.seconds.resize_with(len, empty_second);
        }
    }
}

/// A connection's current second, added to the shared timeline when the second changes.
#[derive(Debug)]
pub struct SecondRecorder {
    index: usize,
    second: Second,
}

impl Default for SecondRecorder {
    fn default() -> Self {
        Self {
            index: 0,
            second: empty_second(),
        }
    }
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

    /// The second it is counting.
    pub fn index(&self) -> usize {
        self.index
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
