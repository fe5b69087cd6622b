//! Per-agent rate limits, asked after admission (so neither strangers nor requests refused for
//! their own faults spend an agent's budget), and only for agents that have a limit.
//!
//! A [`Limiter`] decides for one agent and its limit: [`local::LocalLimiter`] keeps token
//! buckets in this process; [`redis::RedisLimiter`] runs one GCRA script per decision on a
//! Redis every replica shares. [`decide`] is the rule between them: the shared backend decides,
//! and when it cannot, `on_redis_error` does. [`RateLimits`] is what the data plane holds: the
//! local buckets and the current Redis connection. It is built at assembly from the first
//! snapshot, follows each reload ([`RateLimits::configure`]), and each request asks it under its
//! own snapshot's `[rate_limit]`. (After linkerd's `local_rate_limit`: the state behind a trait,
//! the clock an argument.)

mod limits;
pub mod local;
pub mod redis;

use std::future::Future;
use std::time::{Duration, Instant};

pub use self::limits::RateLimits;
use crate::config::{OnRedisError, RateLimit};

/// A limiter's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Over the limit; a request would be allowed after `retry_after`.
    OverLimit {
        retry_after: Duration,
    },
}

listed_enum! {
    /// Why the shared backend gave no verdict: a kind only, the metric's label (the Redis
    /// client's own error, when there is one, is logged where it happens).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
    pub enum BackendError {
        /// No answer within `rate_limit.timeout_ms`.
        #[error("the shared rate-limit backend did not answer within rate_limit.timeout_ms")]
        Timeout => "timeout",
        /// The connection or the call failed.
        #[error("the connection to the shared rate-limit backend, or the call, failed")]
        Failed => "error",
        /// Not asked: it failed moments ago, and is left alone until its cooldown ends.
        #[error(
            "the shared rate-limit backend failed moments ago and is not asked until its cooldown ends"
        )]
        Unavailable => "unavailable",
    }
}

/// One backend of per-agent limits. Asking is async so that a remote store fits; a local one
/// returns a ready future and costs a plain call.
pub trait Limiter: Send + Sync {
    /// Spends one request of `agent_id`'s budget under `limit`, or says when it may go.
    fn check(
        &self,
        agent_id: &str,
        limit: RateLimit,
        now: Instant,
    ) -> impl Future<Output = Result<Verdict, BackendError>> + Send;
}

listed_enum! {
    /// What decided a request.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum DecidedBy {
        /// This process's buckets: the configured backend, or Redis' fallback.
        Local => "local",
        /// The shared Redis.
        Redis => "redis",
        /// `on_redis_error = "allow"` or `"deny"`, without any bucket.
        OnRedisError => "on_redis_error",
    }
}

/// What happens to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    /// 429: over the limit.
    OverLimit {
        retry_after: Duration,
    },
    /// 429: the limit could not be checked and `on_redis_error = "deny"`.
    Unverified,
}

impl From<Verdict> for Outcome {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Allowed => Outcome::Allowed,
            Verdict::OverLimit { retry_after } => Outcome::OverLimit { retry_after },
        }
    }
}

/// The rate limit's decision on one request, with what made it (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub by: DecidedBy,
    /// Why the shared backend did not decide, when it was asked and did not.
    pub error: Option<BackendError>,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }
}

/// The decision of a `local` backend.
pub async fn decide_locally<L: Limiter>(
    local: &L,
    agent_id: &str,
    limit: RateLimit,
    now: Instant,
) -> Decision {
    Decision {
        // The local buckets cannot fail; a limiter that did would let the request through.
        outcome: local
            .check(agent_id, limit, now)
            .await
            .map_or(Outcome::Allowed, Outcome::from),
        by: DecidedBy::Local,
        error: None,
    }
}

/// The decision of a shared backend, and when it gives none, `on_error`'s: `local` asks this
/// process's buckets, `allow` lets the request through, `deny` refuses it.
pub async fn decide<S: Limiter, L: Limiter>(
    shared: &S,
    local: &L,
    on_error: OnRedisError,
    agent_id: &str,
    limit: RateLimit,
    now: Instant,
) -> Decision {
    let error = match shared.check(agent_id, limit, now).await {
        Ok(verdict) => {
            return Decision {
                outcome: verdict.into(),
                by: DecidedBy::Redis,
                error: None,
            }
        }
        Err(e) => e,
    };
    let (outcome, by) = match on_error {
        OnRedisError::Local => {
            let local = decide_locally(local, agent_id, limit, now).await;
            (local.outcome, local.by)
        }
        OnRedisError::Allow => (Outcome::Allowed, DecidedBy::OnRedisError),
        OnRedisError::Deny => (Outcome::Unverified, DecidedBy::OnRedisError),
    };
    Decision {
        outcome,
        by,
        error: Some(error),
    }
}

#[cfg(test)]
mod tests {
    use super::local::LocalLimiter;
    use super::*;

    const LIMIT: RateLimit = RateLimit {
        per_second: 1.0,
        burst: 1,
    };

    /// A shared backend that always answers `answer`.
    struct Fixed(Result<Verdict, BackendError>);

    impl Limiter for Fixed {
        fn check(
            &self,
            _: &str,
            _: RateLimit,
            _: Instant,
        ) -> impl Future<Output = Result<Verdict, BackendError>> + Send {
            std::future::ready(self.0)
        }
    }

    async fn on(shared: Fixed, on_error: OnRedisError, local: &LocalLimiter) -> Decision {
        decide(&shared, local, on_error, "a", LIMIT, Instant::now()).await
    }

    #[tokio::test]
    async fn the_shared_backend_decides_when_it_answers() {
        let local = LocalLimiter::default();
        let over = Verdict::OverLimit {
            retry_after: Duration::from_millis(300),
        };
        for on_error in [OnRedisError::Local, OnRedisError::Allow, OnRedisError::Deny] {
            let d = on(Fixed(Ok(over)), on_error, &local).await;
            assert_eq!(
                d,
                Decision {
                    outcome: Outcome::OverLimit {
                        retry_after: Duration::from_millis(300)
                    },
                    by: DecidedBy::Redis,
                    error: None
                }
            );
            let d = on(Fixed(Ok(Verdict::Allowed)), on_error, &local).await;
            assert!(d.allowed() && d.by == DecidedBy::Redis);
        }
        // The local buckets were never touched: the agent's one token is still there.
        assert!(local.take("a", LIMIT, Instant::now()).is_ok());
    }

    #[tokio::test]
    async fn on_redis_error_local_falls_back_to_this_processs_buckets() {
        let local = LocalLimiter::default();
        let first = on(
            Fixed(Err(BackendError::Timeout)),
            OnRedisError::Local,
            &local,
        )
        .await;
        assert_eq!(
            first,
            Decision {
                outcome: Outcome::Allowed,
                by: DecidedBy::Local,
                error: Some(BackendError::Timeout)
            }
        );
        let second = on(
            Fixed(Err(BackendError::Failed)),
            OnRedisError::Local,
            &local,
        )
        .await;
        assert!(matches!(second.outcome, Outcome::OverLimit { .. }));
        assert_eq!(second.error, Some(BackendError::Failed));
    }

    #[tokio::test]
    async fn on_redis_error_allow_and_deny_decide_without_a_bucket() {
        let local = LocalLimiter::default();
        let cases = [
            (
                OnRedisError::Allow,
                BackendError::Unavailable,
                Outcome::Allowed,
            ),
            (
                OnRedisError::Deny,
                BackendError::Timeout,
                Outcome::Unverified,
            ),
        ];
        for _ in 0..3 {
            for (on_error, error, outcome) in cases {
                assert_eq!(
                    on(Fixed(Err(error)), on_error, &local).await,
                    Decision {
                        outcome,
                        by: DecidedBy::OnRedisError,
                        error: Some(error)
                    }
                );
            }
        }
        assert!(local.take("a", LIMIT, Instant::now()).is_ok());
    }
}
