//! `--find-max`: the stepping logic of the search for the highest rate that holds the SLO,
//! what people do by hand with wrk. It doubles the rate from the first step until a step
//! breaks the SLO (or halves it until one holds), never past [`MAX_RATE`], then bisects
//! between the highest rate that held and the lowest that broke until they are within
//! [`PRECISION`] of each other. Pure: the shell runs each step and tells the search whether
//! it held.

use super::args::MAX_RATE;

/// The search stops when the lowest broken rate is within this fraction above the highest
/// rate that held.
pub const PRECISION: f64 = 0.05;

/// Below this many requests per second the search gives up halving.
pub const MIN_RATE: f64 = 1.0;

/// Where the search stands after the steps run so far.
#[derive(Debug, Clone, PartialEq)]
pub struct KneeSearch {
    start: f64,
    max_steps: usize,
    steps: usize,
    /// The highest rate that held the SLO.
    held: Option<f64>,
    /// The lowest rate that broke it.
    broke: Option<f64>,
}

impl KneeSearch {
    /// A search whose first step runs at `start` req/s, at most `max_steps` steps.
    pub fn new(start: f64, max_steps: usize) -> KneeSearch {
        KneeSearch {
            start: start.round().clamp(MIN_RATE, MAX_RATE),
            max_steps,
            steps: 0,
            held: None,
            broke: None,
        }
    }

    /// The rate of the next step (whole requests per second), or `None` when the search is
    /// done: close enough, out of steps, nothing holds even at [`MIN_RATE`], or [`MAX_RATE`]
    /// held.
    pub fn next_rate(&self) -> Option<f64> {
        if self.steps >= self.max_steps {
            return None;
        }
        match (self.held, self.broke) {
            (None, None) => Some(self.start),
            (Some(held), None) => (held < MAX_RATE).then(|| (held * 2.0).min(MAX_RATE)),
            (None, Some(broke)) => {
                let next = (broke / 2.0).floor();
                (next >= MIN_RATE).then_some(next)
            }
            (Some(held), Some(broke)) => {
                let next = ((held + broke) / 2.0).round();
                (broke - held > held * PRECISION && next > held && next < broke).then_some(next)
            }
        }
    }

    /// Records the outcome of a step at `rate`.
    pub fn record(&mut self, rate: f64, held: bool) {
        self.steps += 1;
        if held {
            self.held = Some(self.held.map_or(rate, |h| h.max(rate)));
        } else {
            self.broke = Some(self.broke.map_or(rate, |b| b.min(rate)));
        }
    }

    /// The highest rate that held the SLO so far.
    pub fn best(&self) -> Option<f64> {
        self.held
    }

    /// The lowest rate that broke the SLO so far.
    pub fn lowest_broken(&self) -> Option<f64> {
        self.broke
    }
}
