//! [`RateLimits`], what the data plane holds: this process's buckets and the connection to the
//! configured Redis, following each reload, asked once per request under that request's own
//! snapshot.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwapOption;

use super::local::LocalLimiter;
use super::redis::RedisLimiter;
use super::{decide, decide_locally, BackendError, Decision, Limiter, Verdict};
use crate::config::{RateLimit, RateLimitConfig};

/// A shared backend that is not there (a request that still runs on a Redis snapshot just
/// after a reload to `local`): every question is a failure, so `on_redis_error` applies.
struct Absent;

impl Limiter for Absent {
    fn check(
        &self,
        _: &str,
        _: RateLimit,
        _: Instant,
    ) -> impl Future<Output = Result<Verdict, BackendError>> + Send {
        std::future::ready(Err(BackendError::Unavailable))
    }
}

/// The rate limiter the proxy holds: this process's buckets (the `local` backend, and Redis'
/// fallback; they outlive reloads) and the connection to the configured Redis, if any.
#[derive(Default)]
pub struct RateLimits {
    local: LocalLimiter,
    redis: ArcSwapOption<RedisLimiter>,
}

impl RateLimits {
    /// The limiter for `config`, connecting to Redis lazily (on the first request that needs it).
    pub fn new(config: &RateLimitConfig) -> Self {
        let limits = Self::default();
        limits.configure(config);
        limits
    }

    /// Follows a new `[rate_limit]`: a new Redis URL, CA or timeout gets a new connection (the
    /// old one closes once no request uses it); a new prefix keeps the connection; `local`
    /// drops it. Never blocks: connections are made by the requests that use them.
    pub fn configure(&self, config: &RateLimitConfig) {
        let RateLimitConfig::Redis(wanted) = config else {
            self.redis.store(None);
            return;
        };
        let current = self.redis.load_full();
        let next = match current.as_deref() {
            Some(running) if running.config() == wanted => return,
            Some(running) if running.config().same_connection(wanted) => {
                running.with_config(wanted.clone())
            }
            _ => match RedisLimiter::new(wanted.clone()) {
                Ok(limiter) => {
                    tracing::info!(url = %wanted.url, "rate limits: using Redis");
                    limiter
                }
                Err(e) => {
                    // Only a CA the TLS library refuses gets here (the config checked the rest):
                    // every decision then takes `on_redis_error`.
                    tracing::error!(url = %wanted.url, error = %e, "rate limits: cannot set up the Redis client");
                    self.redis.store(None);
                    return;
                }
            },
        };
        self.redis.store(Some(Arc::new(next)));
    }

    /// Decides one request of `agent_id` under `limit`, by the request's own snapshot's
    /// `[rate_limit]`.
    pub async fn check(
        &self,
        config: &RateLimitConfig,
        agent_id: &str,
        limit: RateLimit,
        now: Instant,
    ) -> Decision {
        match config {
            RateLimitConfig::Local => decide_locally(&self.local, agent_id, limit, now).await,
            RateLimitConfig::Redis(redis) => match self.redis.load_full() {
                Some(shared) => {
                    decide(&*shared, &self.local, redis.on_error, agent_id, limit, now).await
                }
                None => decide(&Absent, &self.local, redis.on_error, agent_id, limit, now).await,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::rate_limit::{DecidedBy, Outcome};

    const LIMIT: RateLimit = RateLimit {
        per_second: 1.0,
        burst: 1,
    };

    #[tokio::test]
    async fn a_local_backend_never_touches_redis_state() {
        let limits = RateLimits::new(&RateLimitConfig::Local);
        let now = Instant::now();
        let d = limits.check(&RateLimitConfig::Local, "a", LIMIT, now).await;
        assert_eq!((d.outcome, d.by), (Outcome::Allowed, DecidedBy::Local));
        let d = limits.check(&RateLimitConfig::Local, "a", LIMIT, now).await;
        assert!(matches!(d.outcome, Outcome::OverLimit { .. }));
        assert!(limits.redis.load().is_none());
    }
}
