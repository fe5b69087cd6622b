//! The open model's schedule: when each request is due.

use std::time::Duration;

/// How many requests an open run of `rate` per second over `duration` sends.
pub fn total_requests(rate: f64, duration: Duration) -> u64 {
    (rate * duration.as_secs_f64()).round() as u64
}

/// When request `i` is due, relative to the start of the run.
pub fn intended_offset(i: u64, rate: f64) -> Duration {
    Duration::from_nanos((i as f64 * 1e9 / rate) as u64)
}

/// How many requests are due `elapsed` into the run (requests `0..n`), at most `total`.
pub fn due_by(elapsed: Duration, rate: f64, total: u64) -> u64 {
    let n = (elapsed.as_secs_f64() * rate).floor() as u64 + 1;
    n.min(total)
}
