//! The in-process backend: a token bucket per configured agent, in this process's memory.
//!
//! Buckets outlive config reloads (keyed by agent id); a changed limit applies to the existing
//! bucket. The clock is an argument, so tests need no sleeping.

use std::collections::HashMap;
use std::future::{ready, Future};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{BackendError, Limiter, Verdict};
use crate::config::RateLimit;

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Token buckets of every rate-limited agent.
#[derive(Default)]
pub struct LocalLimiter {
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// Decides at once: the future is ready when made, so asking costs what a plain call does.
impl Limiter for LocalLimiter {
    fn check(
        &self,
        agent_id: &str,
        limit: RateLimit,
        now: Instant,
    ) -> impl Future<Output = Result<Verdict, BackendError>> + Send {
        ready(Ok(match self.take(agent_id, limit, now) {
            Ok(()) => Verdict::Allowed,
            Err(retry_after) => Verdict::OverLimit { retry_after },
        }))
    }
}

impl LocalLimiter {
    /// Takes one token from `agent_id`'s bucket, or says how long until one is available.
    pub fn take(&self, agent_id: &str, limit: RateLimit, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let burst = f64::from(limit.burst);
        let bucket = buckets.entry(agent_id.to_owned()).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * limit.per_second).min(burst);
        // A decision may come with an earlier time than the last one (a request that waited
        // on Redis before falling back here): the time between them was refilled already.
        bucket.last = bucket.last.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            // A rate so small that the wait overflows a Duration waits forever.
            Err(
                Duration::try_from_secs_f64((1.0 - bucket.tokens) / limit.per_second)
                    .unwrap_or(Duration::MAX),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: RateLimit = RateLimit {
        per_second: 2.0,
        burst: 3,
    };

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let rl = LocalLimiter::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(rl.take("a", LIMIT, t0).is_ok());
        }
        let wait = rl.take("a", LIMIT, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Half a second later one token is back, not two.
        let t1 = t0 + Duration::from_millis(500);
        assert!(rl.take("a", LIMIT, t1).is_ok());
        assert!(rl.take("a", LIMIT, t1).is_err());
        // A long pause refills only up to the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(rl.take("a", LIMIT, t2).is_ok());
        }
        assert!(rl.take("a", LIMIT, t2).is_err());
    }

    #[test]
    fn agents_have_separate_buckets() {
        let rl = LocalLimiter::default();
        let t0 = Instant::now();
        let one = RateLimit {
            per_second: 1.0,
            burst: 1,
        };
        assert!(rl.take("a", one, t0).is_ok());
        assert!(rl.take("a", one, t0).is_err());
        assert!(rl.take("b", one, t0).is_ok());
    }

    /// A request that waited on Redis and fell back here decides with its start time, earlier
    /// than a decision made meanwhile: the time between them is not refilled twice.
    #[test]
    fn an_earlier_time_does_not_refill_the_same_time_twice() {
        let one = RateLimit {
            per_second: 1.0,
            burst: 1,
        };
        let rl = LocalLimiter::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(rl.take("a", one, t0).is_ok());
        assert!(rl.take("a", one, at(1000)).is_ok());
        assert!(rl.take("a", one, at(100)).is_err());
        assert!(
            rl.take("a", one, at(1100)).is_err(),
            "3 allowed in 1.1 s at 1/s"
        );
    }

    #[test]
    fn a_rate_too_small_to_wait_for_refuses_without_a_panic() {
        let tiny = RateLimit {
            per_second: 1e-20,
            burst: 1,
        };
        let rl = LocalLimiter::default();
        let t0 = Instant::now();
        assert!(rl.take("a", tiny, t0).is_ok());
        assert_eq!(rl.take("a", tiny, t0), Err(Duration::MAX));
    }
}
