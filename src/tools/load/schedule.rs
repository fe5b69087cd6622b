//! The open model's schedule: the target rate as a function of time, flat (`--rate`) or moved
//! linearly from stage to stage (`--stages`), and when each request is due.
//!
//! The rate integrated over time is the number of requests called for so far, `N(t)`; request
//! `i` is due at the moment `N(t)` reaches `i`, except request 0: `N` is 0 from the start, yet
//! nothing is called for until the rate leaves zero, so it is due then (the start, unless
//! ramps open on a pause). On a linear piece `N` is quadratic, so the due time of every
//! request has a closed form and the dispatcher never drifts from the schedule.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One `--stages` step: move the rate linearly to `target` (req/s) over `duration` (zero for
/// a jump).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub duration: Duration,
    pub target: f64,
}

/// A piece of the schedule on which the rate moves linearly from `from` to `to`.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    /// Seconds from the start of the run.
    start: f64,
    len: f64,
    from: f64,
    to: f64,
    /// Requests called for before this piece, `N(start)`.
    before: f64,
}

impl Piece {
    fn slope(&self) -> f64 {
        if self.len > 0.0 {
            (self.to - self.from) / self.len
        } else {
            0.0
        }
    }

    fn count(&self) -> f64 {
        (self.from + self.to) * self.len / 2.0
    }

    /// `N(start + tau)`.
    fn called_for(&self, tau: f64) -> f64 {
        let tau = tau.clamp(0.0, self.len);
        self.before + self.from * tau + self.slope() * tau * tau / 2.0
    }

    /// Seconds into the piece at which `n` more requests have been called for. The form
    /// `2n / (r0 + sqrt(r0² + 2an))` is the root of `r0 τ + a τ²/2 = n` that stays exact when
    /// the slope `a` is zero or negative.
    fn time_of(&self, n: f64) -> f64 {
        let a = self.slope();
        let tau = if n <= 0.0 {
            0.0
        } else if a == 0.0 {
            n / self.from
        } else {
            2.0 * n / (self.from + (self.from * self.from + 2.0 * a * n).max(0.0).sqrt())
        };
        tau.min(self.len)
    }
}

/// When each request of an open run is due. A saved run keeps it as its start rate and
/// stages, from which the same schedule is built again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "Parts", from = "Parts")]
pub struct Schedule {
    start_rate: f64,
    stages: Vec<Stage>,
    pieces: Vec<Piece>,
    total: u64,
    /// When the rate first leaves zero: request 0 is due then.
    first: Duration,
}

/// What a schedule is built from.
#[derive(Serialize, Deserialize)]
struct Parts {
    start_rate: f64,
    stages: Vec<Stage>,
}

impl From<Schedule> for Parts {
    fn from(s: Schedule) -> Parts {
        Parts {
            start_rate: s.start_rate,
            stages: s.stages,
        }
    }
}

impl From<Parts> for Schedule {
    fn from(p: Parts) -> Schedule {
        Schedule::build(p.start_rate, p.stages)
    }
}

impl Schedule {
    /// `rate` per second throughout `duration` (`--rate N --duration D`).
    pub fn flat(rate: f64, duration: Duration) -> Schedule {
        Self::build(
            rate,
            vec![Stage {
                duration,
                target: rate,
            }],
        )
    }

    /// From zero, each stage moving the rate linearly to its target (`--stages`).
    pub fn ramps(stages: Vec<Stage>) -> Schedule {
        Self::build(0.0, stages)
    }

    fn build(start_rate: f64, stages: Vec<Stage>) -> Schedule {
        let mut pieces = Vec::with_capacity(stages.len());
        let (mut start, mut before, mut from) = (0.0, 0.0, start_rate);
        for stage in &stages {
            let piece = Piece {
                start,
                len: stage.duration.as_secs_f64(),
                from,
                to: stage.target,
                before,
            };
            start += piece.len;
            before += piece.count();
            from = stage.target;
            pieces.push(piece);
        }
        // The start of the first piece whose rate is above zero past its start (a piece of
        // no length jumps, so the next one starts at the same time); the end without one.
        let first = pieces
            .iter()
            .find(|p| p.from > 0.0 || (p.len > 0.0 && p.to > 0.0))
            .map_or(start, |p| p.start);
        Schedule {
            start_rate,
            stages,
            pieces,
            first: secs_to_duration(first),
            // Rounded, as a flat run of 0.5 req/s over 3 s sends 2. Every request below the
            // total is due within the run: total - 1 <= N(end) - 0.5.
            total: before.round() as u64,
        }
    }

    /// How many requests the run sends.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// From the start of the run to the end of the last stage.
    pub fn duration(&self) -> Duration {
        self.stages.iter().map(|s| s.duration).sum()
    }

    /// The stages as given; a flat run is one stage at its rate.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The rate of a flat run; `None` for ramps.
    pub fn flat_rate(&self) -> Option<f64> {
        match self.stages.as_slice() {
            [only] if only.target == self.start_rate => Some(only.target),
            _ => None,
        }
    }

    /// The index of the piece (stage) running `t` seconds in; the last one after the end.
    fn piece_at(&self, t: f64) -> usize {
        self.pieces
            .partition_point(|p| p.start + p.len <= t)
            .min(self.pieces.len().saturating_sub(1))
    }

    /// Which stage runs `elapsed` into the run (0-based; the last one after the end).
    pub fn stage_at(&self, elapsed: Duration) -> usize {
        self.piece_at(elapsed.as_secs_f64())
    }

    /// Requests called for in the first `elapsed` of the run, `N(elapsed)`, as a real number.
    pub fn called_for(&self, elapsed: Duration) -> f64 {
        let t = elapsed.as_secs_f64();
        match self.pieces.get(self.piece_at(t)) {
            Some(p) => p.called_for(t - p.start),
            None => 0.0,
        }
    }

    /// When request `i` is due, relative to the start of the run.
    pub fn due_at(&self, i: u64) -> Duration {
        if i == 0 {
            return self.first;
        }
        let n = i as f64;
        // The first moment N reaches n: in the first piece whose end count does.
        let k = self
            .pieces
            .partition_point(|p| p.before + p.count() < n)
            .min(self.pieces.len().saturating_sub(1));
        let secs = match self.pieces.get(k) {
            Some(p) => p.start + p.time_of(n - p.before),
            None => 0.0,
        };
        secs_to_duration(secs)
    }

    /// How many requests are due `elapsed` into the run (requests `0..n`), at most the total.
    pub fn due_by(&self, elapsed: Duration) -> u64 {
        if elapsed < self.first {
            return 0;
        }
        let n = self.called_for(elapsed).floor() as u64 + 1;
        n.min(self.total)
    }

    /// Requests called for in whole second `s` of the run (`N(s + 1) - N(s)`): the target a
    /// per-second count is compared with.
    pub fn target_in_second(&self, s: u64) -> f64 {
        self.target_rate(s, 1)
    }

    /// Requests called for per second, on average, over the `span` seconds from second `s`.
    pub fn target_rate(&self, s: u64, span: u64) -> f64 {
        let at = |s: u64| self.called_for(Duration::from_secs(s));
        (at(s + span) - at(s)) / span as f64
    }
}

/// Seconds from the start as a due time, to the nanosecond.
fn secs_to_duration(secs: f64) -> Duration {
    Duration::from_nanos((secs * 1e9).round() as u64)
}
