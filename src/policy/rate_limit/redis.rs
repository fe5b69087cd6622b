//! The shared backend: the per-agent limits kept in a Redis every replica uses, one atomic
//! GCRA script per decision (`gcra.lua`), so the replicas together hold each agent to its limit.
//!
//! One multiplexed connection per Redis (redis-rs' `ConnectionManager`, which reconnects on
//! its own after an I/O error), made by the first request that needs it, never at start or
//! reload, and made anew after any other failure: a reconnect refused by Redis itself (its
//! password changed for a while, `maxclients`) leaves a manager failing for good, and a
//! primary demoted behind the same address answers every script `READONLY`. Every call is
//! bounded by `timeout_ms`; after a failure a [`Breaker`] leaves Redis alone for
//! [`COOLDOWN`] and then lets one request probe it, so during an outage requests get
//! `on_redis_error` at once rather than each waiting out the timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::io::tcp::TcpSettings;
use ::redis::{Client, IntoConnectionInfo, RedisError, Script, TlsCertificates};

use super::{BackendError, Limiter, Verdict};
use crate::config::{RateLimit, RedisLimitConfig};

/// The decision script; its SHA-1 is computed once. Calls send `EVALSHA`, and after a Redis
/// restart (`NOSCRIPT`) the client loads it and calls again.
static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("gcra.lua")));

/// How long Redis is left alone after a failure before one request probes it again.
pub const COOLDOWN: Duration = Duration::from_millis(250);

/// Unacknowledged data older than this closes the connection (TCP_USER_TIMEOUT), so a Redis
/// behind a black hole is reconnected to: a timed-out call alone keeps the socket.
const USER_TIMEOUT: Duration = Duration::from_secs(2);

/// Fails fast while the backend is known to be down. Times are milliseconds since the
/// breaker's creation, passed in, so the logic is tested without a clock.
#[derive(Debug)]
struct Breaker {
    epoch: Instant,
    /// Until when calls are skipped; 0 = closed (calls go through).
    open_until: AtomicU64,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            open_until: AtomicU64::new(0),
        }
    }
}

impl Breaker {
    /// Milliseconds since the breaker was made (never 0, which means closed).
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether a call may go now. Once the cooldown has passed, exactly one caller wins the
    /// probe; the others keep failing fast until it succeeds.
    fn admit(&self, now_ms: u64) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        now_ms >= until
            && self
                .open_until
                .compare_exchange(
                    until,
                    now_ms + COOLDOWN.as_millis() as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Records a call's result; says whether the breaker changed state (for one log line per
    /// outage, not one per request).
    fn record(&self, ok: bool, now_ms: u64) -> Option<bool> {
        let next = if ok {
            0
        } else {
            now_ms + COOLDOWN.as_millis() as u64
        };
        let before = self.open_until.swap(next, Ordering::AcqRel);
        ((before == 0) != ok).then_some(ok)
    }
}

/// One Redis connection, shared by every limiter on the same URL, CA and timeout.
struct Connection {
    client: Client,
    timeout: Duration,
    /// Made on first use, inside the runtime of the request that needs it; `None` again
    /// after a failure it would not recover from by itself ([`Connection::reset`]).
    manager: Mutex<Managed>,
}

/// The connection's manager, if made, and how many managers were made, it included (its
/// generation): a call that failed on one manager forgets that one, not a newer one.
#[derive(Default)]
struct Managed {
    current: Option<ConnectionManager>,
    generation: u64,
}

impl Connection {
    fn new(config: &RedisLimitConfig) -> Result<Self, RedisError> {
        let info = config
            .url
            .expose()
            .into_connection_info()?
            .set_tcp_settings(
                TcpSettings::default()
                    .set_nodelay(true)
                    .set_user_timeout(USER_TIMEOUT),
            );
        let client = match &config.ca_pem {
            Some(ca) => Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.to_vec()),
                },
            )?,
            None => Client::open(info)?,
        };
        Ok(Self {
            client,
            timeout: config.timeout,
            manager: Mutex::new(Managed::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Managed> {
        self.manager.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The manager and its generation (for [`Connection::reset`]), made lazily: making it
    /// spawns a task, so it needs a runtime, and never connects by itself.
    fn manager(&self) -> Result<(ConnectionManager, u64), BackendError> {
        let mut managed = self.lock();
        if let Some(made) = &managed.current {
            return Ok((made.clone(), managed.generation));
        }
        // Redis-rs' defaults (6 reconnect attempts from 100 ms doubling, 1 s connect
        // timeout) held a caller for 9.5 s while Redis was down; these give up within
        // about 150 ms and let the next call start a new round.
        let settings = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(250))))
            .set_response_timeout(Some(self.timeout))
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500))
            .set_number_of_retries(4);
        let made = ConnectionManager::new_lazy_with_config(self.client.clone(), settings).map_err(
            |e| {
                tracing::error!(error = %e, "rate limits: cannot make the Redis connection");
                BackendError::Failed
            },
        )?;
        managed.generation += 1;
        Ok((managed.current.insert(made).clone(), managed.generation))
    }

    /// Forgets the manager of `generation` after a failure that is not its I/O: the next call
    /// (a breaker's probe) makes a new one, connecting afresh. A newer manager, made by a
    /// later call after another failure forgot this one, is kept: it may be connected
    /// already.
    fn reset(&self, generation: u64) {
        let mut managed = self.lock();
        if managed.generation == generation {
            managed.current = None;
        }
    }
}

/// Per-agent limits on a shared Redis.
pub struct RedisLimiter {
    config: RedisLimitConfig,
    connection: Arc<Connection>,
    breaker: Breaker,
}

impl RedisLimiter {
    /// A limiter on `config`'s Redis; nothing connects until the first decision.
    pub fn new(config: RedisLimitConfig) -> Result<Self, RedisError> {
        Ok(Self {
            connection: Arc::new(Connection::new(&config)?),
            config,
            breaker: Breaker::default(),
        })
    }

    pub fn config(&self) -> &RedisLimitConfig {
        &self.config
    }

    /// A limiter with new per-call settings (the key prefix, `on_redis_error`) on this one's
    /// connection; `config` must be [`RedisLimitConfig::same_connection`] as this one's.
    pub fn with_config(&self, config: RedisLimitConfig) -> Self {
        Self {
            config,
            connection: self.connection.clone(),
            breaker: Breaker::default(),
        }
    }

    /// One `EVALSHA` of the script, within the timeout.
    async fn ask(&self, agent_id: &str, limit: RateLimit) -> Result<Verdict, BackendError> {
        let (mut manager, generation) = self.connection.manager()?;
        let mut call = GCRA.prepare_invoke();
        call.key(format!("{}{}", self.config.key_prefix, agent_id))
            .arg(limit.per_second)
            .arg(limit.burst);
        let answer = tokio::time::timeout(
            self.config.timeout,
            call.invoke_async::<(i64, u64, u64)>(&mut manager),
        )
        .await;
        match answer {
            Err(_) => Err(BackendError::Timeout),
            Ok(Err(e)) if e.is_timeout() => Err(BackendError::Timeout),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "rate limits: Redis call failed");
                self.connection.reset(generation);
                Err(BackendError::Failed)
            }
            Ok(Ok((1, _, _))) => Ok(Verdict::Allowed),
            Ok(Ok((_, retry_after_ms, _))) => Ok(Verdict::OverLimit {
                retry_after: Duration::from_millis(retry_after_ms),
            }),
        }
    }
}

impl Limiter for RedisLimiter {
    async fn check(
        &self,
        agent_id: &str,
        limit: RateLimit,
        _now: Instant,
    ) -> Result<Verdict, BackendError> {
        if !self.breaker.admit(self.breaker.now_ms()) {
            return Err(BackendError::Unavailable);
        }
        let answer = self.ask(agent_id, limit).await;
        match (
            self.breaker.record(answer.is_ok(), self.breaker.now_ms()),
            answer,
        ) {
            (Some(false), Err(e)) => tracing::warn!(
                url = %self.config.url,
                error = e.as_str(),
                on_redis_error = ?self.config.on_error,
                "rate limits: Redis failed; on_redis_error applies until it answers again"
            ),
            (Some(true), _) => {
                tracing::info!(url = %self.config.url, "rate limits: Redis answers again")
            }
            _ => {}
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OnRedisError, RedisUrl};

    const COOL: u64 = COOLDOWN.as_millis() as u64;

    #[test]
    fn the_breaker_fails_fast_for_the_cooldown_then_lets_one_probe_through() {
        let b = Breaker::default();
        assert!(b.admit(10));
        assert_eq!(b.record(false, 10), Some(false), "closed -> open");
        assert!(!b.admit(11));
        assert!(!b.admit(10 + COOL - 1));
        assert!(
            b.admit(10 + COOL),
            "the first caller after the cooldown probes"
        );
        assert!(!b.admit(10 + COOL), "and only it");
        assert_eq!(b.record(false, 10 + COOL + 5), None, "still open");
        assert!(!b.admit(10 + 2 * COOL));
        assert!(b.admit(15 + 2 * COOL));
        assert_eq!(b.record(true, 20 + 2 * COOL), Some(true), "open -> closed");
        assert!(b.admit(21 + 2 * COOL));
        assert_eq!(b.record(true, 22 + 2 * COOL), None);
    }

    fn config(url: &str, timeout: Duration) -> RedisLimitConfig {
        RedisLimitConfig {
            url: RedisUrl::parse(url).unwrap(),
            ca_pem: None,
            on_error: OnRedisError::Local,
            timeout,
            key_prefix: "t:".into(),
        }
    }

    const LIMIT: RateLimit = RateLimit {
        per_second: 1.0,
        burst: 1,
    };

    /// A server that accepts connections and never answers: the call must end at the timeout,
    /// to the millisecond of the (paused, so exact) test clock.
    #[tokio::test(start_paused = true)]
    async fn a_redis_that_never_answers_costs_exactly_the_timeout() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let accepted = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let timeout = Duration::from_millis(80);
        let limiter = RedisLimiter::new(config(&format!("redis://{addr}/0"), timeout)).unwrap();
        let start = tokio::time::Instant::now();
        let answer = limiter.check("a", LIMIT, Instant::now()).await;
        assert!(
            matches!(
                answer,
                Err(BackendError::Timeout) | Err(BackendError::Failed)
            ),
            "{answer:?}"
        );
        assert!(start.elapsed() <= timeout, "{:?}", start.elapsed());
        // The breaker is open now: the next call does not even try.
        let start = tokio::time::Instant::now();
        assert_eq!(
            limiter.check("a", LIMIT, Instant::now()).await,
            Err(BackendError::Unavailable)
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        accepted.abort();
    }

    /// Two calls fail on one manager: the first forgets it and a third call makes a new one;
    /// the second call's failure, reported after, must not forget the new one.
    #[tokio::test]
    async fn a_late_failure_forgets_only_the_manager_it_failed_on() {
        let connection =
            Connection::new(&config("redis://127.0.0.1:1/0", Duration::from_millis(50))).unwrap();
        let (_, failed_on) = connection.manager().unwrap();
        assert_eq!(
            connection.manager().unwrap().1,
            failed_on,
            "made once, then shared"
        );
        connection.reset(failed_on);
        let (_, fresh) = connection.manager().unwrap();
        assert_ne!(fresh, failed_on, "a failure forgets its manager");
        connection.reset(failed_on);
        assert_eq!(
            connection.manager().unwrap().1,
            fresh,
            "a late failure keeps the newer one"
        );
        connection.reset(fresh);
        assert_ne!(connection.manager().unwrap().1, fresh);
    }

    #[test]
    fn a_new_prefix_keeps_the_connection_and_a_new_url_does_not() {
        let a = config("redis://127.0.0.1:1/0", Duration::from_millis(50));
        let limiter = RedisLimiter::new(a.clone()).unwrap();
        let renamed = RedisLimitConfig {
            key_prefix: "other:".into(),
            ..a.clone()
        };
        assert!(a.same_connection(&renamed));
        let same = limiter.with_config(renamed);
        assert!(Arc::ptr_eq(&same.connection, &limiter.connection));
        let moved = config("redis://127.0.0.1:2/0", Duration::from_millis(50));
        assert!(!a.same_connection(&moved));
    }
}
