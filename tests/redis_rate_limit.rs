//! The cluster-wide rate limit against real processes: gateways sharing a real `redis-server`
//! (started by each test on a free port), Redis killed, frozen and restarted under them, the
//! backend switched and the URL changed by hot reload, and TLS with a password.
//!
//! Agents here have a tiny sustained rate (one request per 1000 s), so what a run allows is
//! exactly the burst, whatever the machine's speed.

mod common;

use std::net::SocketAddr;

use agent_gateway::config::file::{AgentFile, RateLimitFile};
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::{FileConfig, OnRedisError};
use common::pki::TestPki;
use common::redis::{use_redis, RedisServer};
use common::*;

/// Practically no refill: an agent gets its burst and then nothing for the rest of the test.
const SLOW: f64 = 0.001;
/// The agent tests use to see whether Redis decides again: it never runs out.
const PROBE: &str = "probe";

/// [`test_config`] in front of `backend`, with [`AGENT_ID`] limited to `burst`, an unlimited
/// `agent-2`, and the [`PROBE`] agent.
fn limited_config(backend: SocketAddr, burst: u32) -> FileConfig {
    let mut cfg = test_config(&[backend]);
    let agent = cfg.agent_mut(AGENT_ID);
    agent.rate_limit_per_second = Some(SLOW);
    agent.burst = Some(burst);
    cfg.auth.agents.push(AgentFile::new("agent-2", TOKEN));
    cfg.auth.agents.push(AgentFile {
        rate_limit_per_second: Some(1_000_000.0),
        burst: Some(1_000_000),
        ..AgentFile::new(PROBE, TOKEN)
    });
    cfg
}

/// One v2 status read by `agent`; returns the status.
fn call(gw: &Gateway, agent: &str) -> u16 {
    call_full(gw, agent).status
}

fn call_full(gw: &Gateway, agent: &str) -> Response {
    as_agent(
        gw.proxy,
        agent,
        "GET",
        "/api/v2/transaction/tx-1/status",
        &[],
    )
}

fn decisions(gw: &Gateway, backend: &str, result: &str) -> f64 {
    gw.metric(&format!(
        "agent_gateway_rate_limit_decisions_total{{backend=\"{backend}\",result=\"{result}\"}}"
    ))
}

fn backend_errors(gw: &Gateway) -> f64 {
    ["timeout", "error", "unavailable"]
        .iter()
        .map(|kind| {
            gw.metric(&format!(
                "agent_gateway_rate_limit_backend_errors_total{{kind=\"{kind}\"}}"
            ))
        })
        .sum()
}

/// Calls as [`PROBE`] until Redis decides one of them (after an outage, each gateway's
/// connection comes back on its own, within a reconnect round and a breaker cooldown).
fn wait_for_redis(gw: &Gateway) {
    let before = decisions(gw, "redis", "allowed");
    gw.wait_until("Redis to decide again", || {
        assert_eq!(call(gw, PROBE), 200);
        decisions(gw, "redis", "allowed") > before
    });
}

/// `n` calls by `agent`, alternating between `gateways`; the statuses in order.
fn alternate(gateways: &[&Gateway], agent: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| call(gateways[i % gateways.len()], agent))
        .collect()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

#[test]
fn two_gateways_sharing_one_redis_hold_an_agent_to_its_limit_in_total_and_again_after_a_restart() {
    let backend = Backend::start();
    let mut redis = RedisServer::start();
    let mut cfg = limited_config(backend.addr, 6);
    use_redis(&mut cfg, &redis.url(), OnRedisError::Local, "shared:");
    // Two replicas of one config, each on ports of its own.
    let a = Gateway::builder(cfg.clone()).start();
    let b = Gateway::builder(cfg).start();

    let statuses = alternate(&[&a, &b], AGENT_ID, 12);
    assert_eq!(
        (count(&statuses, 200), count(&statuses, 429)),
        (6, 6),
        "the burst holds across both replicas: {statuses:?}"
    );
    // Redis says when: the next request is one emission interval (1000 s) after the burst.
    let retry_after: u64 = call_full(&a, AGENT_ID)
        .header("retry-after")
        .expect("a 429 says when to retry")
        .parse()
        .unwrap();
    assert!((900..=1000).contains(&retry_after), "{retry_after}");
    let allowed = decisions(&a, "redis", "allowed") + decisions(&b, "redis", "allowed");
    assert_eq!(allowed, 6.0);
    assert_eq!(backend_errors(&a) + backend_errors(&b), 0.0);
    assert_eq!(redis.keys("shared:*"), ["shared:agent-1"]);

    // An agent without a limit costs no Redis call.
    let evalsha = redis.evalsha_calls();
    assert_eq!(alternate(&[&a, &b], "agent-2", 6), [200; 6]);
    assert_eq!(redis.evalsha_calls(), evalsha);

    // Killed and started again on the same port, empty: each replica reconnects by itself,
    // and the agent is held to its burst across both again.
    redis.kill();
    redis.restart();
    wait_for_redis(&a);
    wait_for_redis(&b);
    let statuses = alternate(&[&a, &b], AGENT_ID, 12);
    assert_eq!(
        (count(&statuses, 200), count(&statuses, 429)),
        (6, 6),
        "shared limiting resumes: {statuses:?}"
    );
}

#[test]
fn with_redis_killed_each_on_redis_error_does_what_the_readme_says() {
    let backend = Backend::start();
    let mut redis = RedisServer::start();
    let gateway = |on_error: OnRedisError, prefix: &str| {
        let mut cfg = limited_config(backend.addr, 2);
        use_redis(&mut cfg, &redis.url(), on_error, prefix);
        Gateway::builder(cfg).start()
    };
    let local = gateway(OnRedisError::Local, "local:");
    let allow = gateway(OnRedisError::Allow, "allow:");
    let deny = gateway(OnRedisError::Deny, "deny:");
    for gw in [&local, &allow, &deny] {
        assert_eq!(alternate(&[gw], AGENT_ID, 3), [200, 200, 429]);
        assert_eq!(decisions(gw, "redis", "limited"), 1.0);
    }

    redis.kill();
    // local: this replica's own buckets decide; they were never spent (Redis decided until
    // now), so the agent gets its burst again, from this replica alone.
    assert_eq!(alternate(&[&local], AGENT_ID, 3), [200, 200, 429]);
    assert_eq!(
        (
            decisions(&local, "local", "allowed"),
            decisions(&local, "local", "limited")
        ),
        (2.0, 1.0)
    );
    // allow: everything goes through.
    assert_eq!(alternate(&[&allow], AGENT_ID, 3), [200, 200, 200]);
    assert_eq!(decisions(&allow, "on_redis_error", "allowed"), 3.0);
    // deny: everything is refused, with its own message_code and a Retry-After.
    for _ in 0..3 {
        let refused = call_full(&deny, AGENT_ID);
        assert_eq!(refused.status, 429);
        assert_eq!(refused.json()["message_code"], 42901);
        assert_eq!(refused.header("retry-after"), Some("1"));
    }
    assert_eq!(decisions(&deny, "on_redis_error", "limited"), 3.0);
    // Each of those was counted as a backend error, and no agent without a limit noticed.
    for gw in [&local, &allow, &deny] {
        assert_eq!(backend_errors(gw), 3.0);
        assert_eq!(call(gw, "agent-2"), 200);
        // Readiness is the backend's business only.
        assert_eq!(get(gw.admin, "/readyz").status, 200);
    }
}

#[test]
fn a_frozen_redis_holds_no_request_past_its_timeout_and_limiting_resumes_when_it_wakes() {
    let backend = Backend::start();
    let redis = RedisServer::start();
    let mut cfg = limited_config(backend.addr, 2);
    use_redis(&mut cfg, &redis.url(), OnRedisError::Allow, "frozen:");
    let gw = Gateway::builder(cfg).start();
    assert_eq!(alternate(&[&gw], AGENT_ID, 3), [200, 200, 429]);

    // Stopped, Redis keeps its connections open and answers nothing, ever: a request that
    // waited on it past timeout_ms would never be answered (the client gives up after 15 s).
    redis.freeze();
    let statuses = alternate(&[&gw], AGENT_ID, 5);
    assert_eq!(statuses, [200; 5]);
    assert!(
        gw.metric("agent_gateway_rate_limit_backend_errors_total{kind=\"timeout\"}") >= 1.0,
        "the first call after the freeze timed out"
    );
    assert_eq!(backend_errors(&gw), 5.0);

    redis.thaw();
    wait_for_redis(&gw);
    // The bucket Redis kept through the freeze still holds the agent.
    assert_eq!(call(&gw, AGENT_ID), 429);
    assert_eq!(decisions(&gw, "redis", "limited"), 2.0);
}

#[test]
fn reloads_switch_between_local_and_redis_and_a_new_url_reconnects() {
    let backend = Backend::start();
    let first = RedisServer::start();
    let second = RedisServer::start();
    let cfg = limited_config(backend.addr, 2);
    let gw = Gateway::builder(cfg.clone()).start();

    // local: this process's bucket.
    assert_eq!(alternate(&[&gw], AGENT_ID, 3), [200, 200, 429]);
    assert_eq!(first.evalsha_calls(), 0);

    // redis: a fresh bucket in the first Redis.
    let mut on_first = cfg.clone();
    use_redis(&mut on_first, &first.url(), OnRedisError::Deny, "gw:");
    gw.reload(&on_first);
    assert_eq!(alternate(&[&gw], AGENT_ID, 3), [200, 200, 429]);
    assert_eq!(first.keys("gw:*"), ["gw:agent-1"]);
    // One connection, reused (waiting only for the test's own closed ones to leave the list).
    wait_until("one connection from the gateway", || {
        first.other_clients() == 1
    });

    // A new prefix keeps the connection.
    let mut renamed = on_first.clone();
    renamed.rate_limit.key_prefix = "renamed:".into();
    gw.reload(&renamed);
    assert_eq!(call(&gw, AGENT_ID), 200);
    assert_eq!(first.keys("renamed:*"), ["renamed:agent-1"]);
    wait_until("still one connection from the gateway", || {
        first.other_clients() == 1
    });

    // A new URL: the second Redis decides, and the connection to the first one closes.
    let mut on_second = renamed.clone();
    on_second.rate_limit.redis_url = Some(second.url());
    gw.reload(&on_second);
    assert_eq!(alternate(&[&gw], AGENT_ID, 3), [200, 200, 429]);
    assert_eq!(second.keys("*"), ["renamed:agent-1"]);
    wait_until("the first Redis' connection to close", || {
        first.other_clients() == 0
    });

    // Back to local: the process's own bucket, spent at the start, decides again.
    let mut back = on_second.clone();
    back.rate_limit = RateLimitFile::default();
    gw.reload(&back);
    let evalsha = second.evalsha_calls();
    assert_eq!(call(&gw, AGENT_ID), 429);
    assert_eq!(decisions(&gw, "local", "limited"), 2.0);
    assert_eq!(second.evalsha_calls(), evalsha);
    wait_until("the second Redis' connection to close", || {
        second.other_clients() == 0
    });
}

#[test]
fn rediss_with_a_password_and_a_private_ca_and_the_password_never_logged() {
    let pki = TestPki::for_host("redis", "127.0.0.1");
    let password = "pa55:w/rd@x";
    let redis = RedisServer::with_tls(&pki, password);
    let tls_port = redis.tls_port.unwrap();
    let backend = Backend::start();
    let gateway = |url: String| {
        let mut cfg = limited_config(backend.addr, 2);
        use_redis(&mut cfg, &url, OnRedisError::Deny, "tls:");
        cfg.rate_limit.redis_ca_file = Some(pki.ca.clone());
        Gateway::builder(cfg).log_level("trace").start()
    };
    // The password percent-encoded in the URL, as URLs require.
    let url = format!("rediss://:pa55%3Aw%2Frd%40x@127.0.0.1:{tls_port}/0");
    let gw = gateway(url);
    assert_eq!(alternate(&[&gw], AGENT_ID, 3), [200, 200, 429]);
    assert_eq!(decisions(&gw, "redis", "allowed"), 2.0);
    assert_eq!(redis.keys("tls:*"), ["tls:agent-1"]);

    // A wrong password: Redis refuses, and on_redis_error applies (here: deny).
    let wrong = gateway(format!("rediss://:wrong@127.0.0.1:{tls_port}/0"));
    let refused = call_full(&wrong, AGENT_ID);
    assert_eq!(
        (refused.status, refused.json()["message_code"].as_u64()),
        (429, Some(42901))
    );
    assert_eq!(backend_errors(&wrong), 1.0);

    for gw in [&gw, &wrong] {
        let log = gw.log();
        assert!(log.contains("rate limits: using Redis"), "{log}");
        for secret in ["pa55", "pa55%3Aw", "wrong@"] {
            assert!(!log.contains(secret), "the log shows {secret:?}");
        }
    }
}

/// Redis' CA rotated over the file `rate_limit.redis_ca_file` names: the watcher applies it,
/// and Redis decides again without a restart. The file was read once at start, outside the
/// reload's fingerprint and the watcher's files.
#[test]
fn a_redis_ca_rotated_over_its_file_is_trusted_without_a_restart() {
    let pki = TestPki::for_host("redis-rotated", "127.0.0.1");
    let stale = TestPki::for_host("redis-stale", "127.0.0.1");
    let redis = RedisServer::with_tls(&pki, "rotation-password");
    let tls_port = redis.tls_port.unwrap();
    let backend = Backend::start();
    let trust = tempfile::tempdir().unwrap();
    let ca_file = trust.path().join("redis-ca.crt");
    let install = |from: &str| replace_file(&ca_file, &std::fs::read_to_string(from).unwrap());
    install(&stale.ca);
    let mut cfg = limited_config(backend.addr, 2);
    let url = format!("rediss://:rotation-password@127.0.0.1:{tls_port}/0");
    use_redis(&mut cfg, &url, OnRedisError::Local, "rot:");
    cfg.rate_limit.redis_ca_file = Some(ca_file.display().to_string());
    cfg.server.watch_config = true;
    let gw = Gateway::builder(cfg).start();
    // Redis' certificate is not trusted yet: the local buckets decide.
    assert_eq!(call(&gw, AGENT_ID), 200);
    assert!(backend_errors(&gw) >= 1.0);
    assert_eq!(decisions(&gw, "redis", "allowed"), 0.0);

    install(&pki.ca);
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"success\"}",
        1.0,
    );
    wait_for_redis(&gw);
    assert_eq!(call(&gw, AGENT_ID), 200);
    assert!(redis.keys("rot:*").contains(&format!("rot:{AGENT_ID}")));
}

/// Redis refuses the gateway's password for a while as the gateway reconnects (restarted with
/// a config being fixed, an ACL changed): once it takes the password again, it decides again,
/// with no reload. The connection used to stay failed for good after such a refusal, every
/// decision `on_redis_error`'s until a reload changed the URL.
#[test]
fn a_password_refused_for_a_while_on_reconnect_does_not_stop_redis_deciding() {
    let redis = RedisServer::with_password("first-password");
    let backend = Backend::start();
    let mut cfg = limited_config(backend.addr, 2);
    let url = format!("redis://:first-password@127.0.0.1:{}/0", redis.port);
    use_redis(&mut cfg, &url, OnRedisError::Local, "pw:");
    let gw = Gateway::builder(cfg).start();
    wait_for_redis(&gw);

    // Another password, and the gateway's connection dropped: it reconnects, and is refused.
    let mut admin = redis.connection();
    let _: () = ::redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "second-password"])
        .query(&mut admin)
        .unwrap();
    let _: i64 = ::redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query(&mut admin)
        .unwrap();
    // Probes that reach Redis (one per cooldown) and fail, not calls the breaker turns away.
    let failed = || gw.metric("agent_gateway_rate_limit_backend_errors_total{kind=\"error\"}");
    let before = failed();
    gw.wait_until("Redis to refuse the gateway's probes", || {
        assert_eq!(call(&gw, PROBE), 200);
        failed() >= before + 3.0
    });
    let _: () = ::redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "first-password"])
        .query(&mut admin)
        .unwrap();
    wait_for_redis(&gw);
}
