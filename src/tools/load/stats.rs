//! What the connections count as a run goes. Each request ends as one [`Record`] (what a
//! saved run keeps of it, a line of `--save`); a connection adds its records to its tally of
//! answers, failures and latencies by operation, and to its counts per agent, merged into the
//! run's at the end. A saved run read back goes through the same [`Stats::record`].

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::{Counter, Histogram};

use crate::api::operation::Operation;

use super::args::LONGEST;

/// Largest latency the histograms hold (larger values are clamped), in µs: the longest a run
/// can make, `--duration` + 2 × `--timeout` at their longest (a request due at the start,
/// taken just before the hard deadline, waiting out its timeout). A histogram grows only as
/// far as the latencies recorded in it.
pub const MAX_LATENCY_US: u64 = 3 * LONGEST.as_secs() * 1_000_000;

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
        /// HTTP/2: the server reset the request's stream.
        Reset => "reset",
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// An answer with this status.
    Answered(u16),
    Failed(ConnErrorKind),
    /// Not sent: the run's hard deadline had passed.
    Unsent,
    /// In flight when the run was interrupted: abandoned, counted nowhere but in `cancelled`.
    Cancelled,
}

/// One request as the counts, the timeline and a saved run see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// When it was due (open model) or sent (closed model), µs since the run's start.
    pub start_us: u64,
    /// From `start_us` to how it ended, µs: the latency of an answer.
    pub latency_us: u64,
    pub end: End,
    pub op: Operation,
    /// Index into the run's agents.
    pub agent: usize,
    /// Open model: sent more than 1 ms after it was due (no idle connection or stream, or a
    /// busy client).
    pub late: bool,
}

impl Record {
    /// The whole second of the run in which it ended.
    pub fn second(&self) -> usize {
        (self.start_us.saturating_add(self.latency_us) / 1_000_000) as usize
    }
}

/// Whole µs of `d`, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// An empty latency histogram keeping `sigfig` significant digits. It grows to the largest
/// latency recorded, so that a run of fast answers keeps small histograms.
fn latency_histogram<C: Counter>(sigfig: u8) -> Histogram<C> {
    Histogram::new(sigfig).expect("a valid number of significant digits")
}

/// How requests ended: answers by status with their latencies by operation, failures by
/// kind, and requests never sent. A connection keeps one over the whole run ([`Stats`]) and
/// one per second ([`super::timeline::Second`]).
#[derive(Debug, Clone)]
pub struct Tally<C: Counter> {
    /// The latencies of answers, by operation (indexed like [`Operation::ALL`]).
    pub latency_us: [Histogram<C>; Operation::COUNT],
    pub statuses: BTreeMap<u16, u64>,
    pub conn_errors: BTreeMap<ConnErrorKind, u64>,
    /// Scheduled requests never sent: the run's hard deadline had passed.
    pub unsent: u64,
}

impl<C: Counter> Tally<C> {
    /// An empty tally whose latencies keep `sigfig` significant digits.
    pub fn new(sigfig: u8) -> Self {
        Self {
            latency_us: std::array::from_fn(|_| latency_histogram(sigfig)),
            statuses: BTreeMap::new(),
            conn_errors: BTreeMap::new(),
            unsent: 0,
        }
    }

    /// Counts how `r` ended (a cancelled request is not counted here).
    pub fn record(&mut self, r: &Record) {
        match r.end {
            End::Answered(status) => {
                self.latency_us[r.op as usize]
                    .record(r.latency_us.clamp(1, MAX_LATENCY_US))
                    .expect("an auto-resizing histogram takes any latency up to the maximum");
                *self.statuses.entry(status).or_default() += 1;
            }
            End::Failed(kind) => *self.conn_errors.entry(kind).or_default() += 1,
            End::Unsent => self.unsent += 1,
            End::Cancelled => {}
        }
    }

    /// The latencies of every operation together: the whole mix.
    pub fn latency_of_all(&self) -> Histogram<C> {
        let mut all = latency_histogram(self.latency_us[0].sigfig());
        for h in &self.latency_us {
            all.add(h)
                .expect("an auto-resizing histogram takes any other");
        }
        all
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
        for (mine, theirs) in self.latency_us.iter_mut().zip(latency_us) {
            mine.add(theirs)
                .expect("an auto-resizing histogram takes any other");
        }
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

    /// Empties the tally, keeping its histograms' memory.
    pub fn clear(&mut self) {
        let Tally {
            latency_us,
            statuses,
            conn_errors,
            unsent,
        } = self;
        latency_us.iter_mut().for_each(Histogram::reset);
        statuses.clear();
        conn_errors.clear();
        *unsent = 0;
    }
}

/// What one agent's requests came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentCounts {
    /// Requests sent as it (abandoned ones too).
    pub sent: u64,
    pub statuses: BTreeMap<u16, u64>,
    /// Its requests that got no answer: failed, or never sent.
    pub unanswered: u64,
}

impl AgentCounts {
    fn merge(&mut self, other: &AgentCounts) {
        let AgentCounts {
            sent,
            statuses,
            unanswered,
        } = other;
        self.sent += sent;
        for (k, v) in statuses {
            *self.statuses.entry(*k).or_default() += v;
        }
        self.unanswered += unanswered;
    }
}

/// One connection's counts over the run; merged into the run's at the end.
#[derive(Debug, Clone)]
pub struct Stats {
    /// How its requests ended.
    pub ended: Tally<u64>,
    /// Requests sent, by operation (indexed like [`Operation::ALL`]).
    pub operations: [u64; Operation::COUNT],
    /// By agent, indexed like the run's agents (shorter when the last ones sent nothing).
    pub agents: Vec<AgentCounts>,
    /// Open model: requests that started more than 1 ms after they were due.
    pub late_starts: u64,
    /// In flight when the run was interrupted: abandoned, counted nowhere else.
    pub cancelled: u64,
    /// When the last answer came, µs since the run's start (0 without one): what throughput
    /// is over, rather than the run's end, which one request waiting out its `--timeout` can
    /// hold back by up to twice that.
    pub last_answer_us: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            ended: Tally::new(3),
            operations: [0; Operation::COUNT],
            agents: Vec::new(),
            late_starts: 0,
            cancelled: 0,
            last_answer_us: 0,
        }
    }
}

impl Stats {
    /// Counts one request.
    pub fn record(&mut self, r: &Record) {
        self.ended.record(r);
        if self.agents.len() <= r.agent {
            self.agents.resize_with(r.agent + 1, AgentCounts::default);
        }
        let agent = &mut self.agents[r.agent];
        if r.end != End::Unsent {
            self.operations[r.op as usize] += 1;
            agent.sent += 1;
            // Late is "sent more than 1 ms after it was due": never an unsent one, whatever
            // an older saved line says.
            self.late_starts += u64::from(r.late);
        }
        match r.end {
            End::Answered(status) => {
                *agent.statuses.entry(status).or_default() += 1;
                self.last_answer_us = self
                    .last_answer_us
                    .max(r.start_us.saturating_add(r.latency_us));
            }
            End::Failed(_) | End::Unsent => agent.unanswered += 1,
            End::Cancelled => self.cancelled += 1,
        }
    }

    /// Counts `n` of `agent`'s requests never sent, at once: the rest of a schedule once the
    /// run's hard deadline has passed.
    pub fn record_unsent(&mut self, agent: usize, n: u64) {
        self.ended.unsent += n;
        if self.agents.len() <= agent {
            self.agents.resize_with(agent + 1, AgentCounts::default);
        }
        self.agents[agent].unanswered += n;
    }

    pub fn merge(&mut self, other: &Stats) {
        // Every field, without `..`: a new count does not compile until it is merged.
        let Stats {
            ended,
            operations,
            agents,
            late_starts,
            cancelled,
            last_answer_us,
        } = other;
        self.ended.merge(ended);
        for (a, b) in self.operations.iter_mut().zip(operations) {
            *a += b;
        }
        if self.agents.len() < agents.len() {
            self.agents.resize_with(agents.len(), AgentCounts::default);
        }
        for (mine, theirs) in self.agents.iter_mut().zip(agents) {
            mine.merge(theirs);
        }
        self.late_starts += late_starts;
        self.cancelled += cancelled;
        self.last_answer_us = self.last_answer_us.max(*last_answer_us);
    }
}
