//! The run over time: what completed in each whole second since the start (latencies,
//! statuses, errors), for the report's charts over time.
//!
//! One [`Timeline`] per run, shared by the connections behind a mutex; each connection keeps
//! only its current second ([`SecondRecorder`]) and adds it to the timeline when its second
//! changes, so the lock is taken about once a second per connection and memory does not grow
//! with the run's connections. A saved run read back records straight into the timeline.
//!
//! Nor does it grow with the run's length past [`MAX_ENTRIES`]: a second is a few KiB, and a
//! year-long run (the longest allowed) kept second by second would need ~100 GB. An entry
//! covers one second until the run outgrows them; then neighbours merge and each covers twice
//! as many (2, 4, 8 … s), so a run of an hour and its tail is still seen second by second, and
//! a year in entries of 8192 s. The report gives each entry's span.

use std::sync::Mutex;

use super::stats::{Record, Tally};

/// Significant digits of a second's latency histograms: 1% resolution is plenty for a chart,
/// and keeps an operation's second at a few KiB (3 digits would be ten times as much).
const SECOND_SIGFIG: u8 = 2;

/// The most entries a timeline keeps: an hour (and a tail of timeouts) at one second each.
pub const MAX_ENTRIES: usize = 4096;

/// What completed in one second (or in one entry's seconds).
pub type Second = Tally<u32>;

fn empty_second() -> Second {
    Tally::new(SECOND_SIGFIG)
}

/// The whole run: entry `i` covers seconds `[i * span, (i + 1) * span)`. Grows only to the
/// last second counted in (or asked for by [`Timeline::extend_to`]).
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Seconds an entry covers: 1, or a power of two once the run outgrew [`MAX_ENTRIES`].
    span: u64,
    entries: Vec<Second>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            span: 1,
            entries: Vec::new(),
        }
    }
}

impl Timeline {
    /// Adds what a connection counted in second `index`.
    pub fn add(&mut self, index: usize, second: &Second) {
        self.entry(index).merge(second);
    }

    /// Counts `r` in the second it ended in.
    pub fn record(&mut self, r: &Record) {
        self.entry(r.second()).record(r);
    }

    /// Counts `n` requests never sent, in the second `r` (one of them) ended in.
    pub fn record_unsent(&mut self, r: &Record, n: u64) {
        self.entry(r.second()).unsent += n;
    }

    /// The entries, each [`Timeline::span`] seconds from the previous.
    pub fn entries(&self) -> &[Second] {
        &self.entries
    }

    /// Seconds each entry covers.
    pub fn span(&self) -> u64 {
        self.span
    }

    /// Makes the timeline cover at least the first `secs` seconds (quiet seconds are seconds
    /// too).
    pub fn extend_to(&mut self, secs: usize) {
        if let Some(last) = secs.checked_sub(1) {
            self.entry(last);
        }
    }

    /// The entry second `index` falls in, made (with the quiet ones before it) if need be.
    fn entry(&mut self, index: usize) -> &mut Second {
        let index = index as u64;
        while index / self.span >= MAX_ENTRIES as u64 {
            self.coarsen();
        }
        let i = (index / self.span) as usize;
        if self.entries.len() <= i {
            self.entries.resize_with(i + 1, empty_second);
        }
        &mut self.entries[i]
    }

    /// Doubles the span, each entry merged with its neighbour.
    fn coarsen(&mut self) {
        let mut old = std::mem::take(&mut self.entries).into_iter();
        while let Some(mut even) = old.next() {
            if let Some(odd) = old.next() {
                even.merge(&odd);
            }
            self.entries.push(even);
        }
        self.span *= 2;
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
