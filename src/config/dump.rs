//! The effective config of a snapshot, as `agent-gateway config dump` prints it and the admin
//! listener's `GET /config` answers it: the file it was built from with every default filled
//! in, the values validation settled written back (`server.threads`, every date in UTC, each
//! brownout's shares, each agent's burst, `retirement.prometheus_selector` as the queries
//! render it), the start-up settings the process runs with (a
//! reload keeps the running ones until a restart), durations in milliseconds, and no secret:
//! token digests (agents' and the admin's) and a URL's password are redacted, and of the
//! secret files (`auth.agents_file`, `rate_limit.redis_password_file`) only the names show.
//! Every URL shows without its password: `rate_limit.redis_url` and `tracing.otlp_endpoint`
//! (`retirement.prometheus_url` and `retirement.link` may not carry one). Both are redacted
//! the one way the crate has ([`crate::client::redact`]).

use super::file::{Digests, FileConfig};
use super::types::{format_time, parse_time};
use super::Snapshot;
use crate::client::redact::{redact_url, REDACTED};

/// The effective config of `snapshot`, in the file's own shape.
pub fn effective(snapshot: &Snapshot) -> FileConfig {
    let mut f = FileConfig::clone(&snapshot.source.file);
    running_startup(snapshot, &mut f);
    let time = |t: Option<std::time::SystemTime>| t.map(format_time);
    let dates = snapshot.retirement.terms.dates;
    f.retirement.deprecated_at = time(dates.deprecated_at);
    f.retirement.sunset_at = time(dates.sunset_at);
    // As the queries render it: no braces or spaces, each value quoted afresh.
    if f.retirement.prometheus_selector.is_some() {
        f.retirement.prometheus_selector = Some(snapshot.retirement.prometheus_selector.matchers());
    }
    for (file, b) in f
        .retirement
        .brownouts
        .iter_mut()
        .zip(&snapshot.retirement.brownouts)
    {
        file.start = format_time(b.start);
        file.end = format_time(b.end);
        file.until = time(b.repeat.as_ref().map(|r| r.until));
        file.percent = Some(b.percent);
        file.percent_end = Some(b.percent_end);
    }
    for agent in &mut f.auth.agents {
        redact(&mut agent.token_sha256);
        for token in &mut agent.tokens {
            token.sha256 = REDACTED.into();
            token.not_after = token
                .not_after
                .as_deref()
                .map(|t| parse_time(t).map_or_else(|_| t.to_owned(), format_time));
        }
        if let Some(valid) = snapshot.auth.agents.get(&agent.id) {
            agent.deprecated_at = time(valid.dates.deprecated_at);
            agent.sunset_at = time(valid.dates.sunset_at);
            agent.burst = valid.rate_limit.map(|r| r.burst);
        }
    }
    redact(&mut f.admin.token_sha256);
    // The URLs that may carry a password. `retirement.link` and `retirement.prometheus_url`
    // may not (validation refuses one with user information), so they show as written: the
    // redaction's last-`@` rule would mangle a path holding an `@` (`https://h:8443/@team`).
    for url in [&mut f.rate_limit.redis_url, &mut f.tracing.otlp_endpoint]
        .into_iter()
        .flatten()
    {
        *url = redact_url(url);
    }
    f
}

/// Each digest of `list` redacted, so the dump still says how many there are.
fn redact(list: &mut Digests) {
    for digest in &mut list.0 {
        *digest = REDACTED.into();
    }
}

/// `[listen]` and `[server]` as the process runs them.
fn running_startup(snapshot: &Snapshot, f: &mut FileConfig) {
    // Every field, without `..`: a new start-up setting does not compile until it is shown.
    let super::StartupConfig {
        proxy_listen,
        proxy_tls,
        http2,
        admin_listen,
        threads,
        grace_period_seconds,
        work_stealing,
        upstream_keepalive_pool_size,
        watch_config,
        upgrade_sock,
        readiness_requires_upstream,
    } = &snapshot.startup;
    f.listen.proxy = proxy_listen.to_string();
    // The files of the certificate served, on a listener that speaks TLS.
    let served = snapshot.server_cert.as_ref().filter(|_| *proxy_tls);
    f.listen.tls_cert = served.map(|c| c.cert_file.clone());
    f.listen.tls_key = served.map(|c| c.key_file.clone());
    f.listen.http2 = *http2;
    f.listen.admin = admin_listen.map(|a| a.to_string());
    f.server.threads = Some(*threads);
    f.server.grace_period_seconds = *grace_period_seconds;
    f.server.work_stealing = *work_stealing;
    f.server.upstream_keepalive_pool_size = *upstream_keepalive_pool_size;
    f.server.watch_config = *watch_config;
    f.server.upgrade_sock = upgrade_sock.clone();
    f.server.readiness_requires_upstream = *readiness_requires_upstream;
}

/// The effective config as TOML.
pub fn to_toml(snapshot: &Snapshot) -> String {
    toml::to_string(&effective(snapshot)).expect("a config of plain values serializes")
}

/// The effective config as JSON.
pub fn to_json(snapshot: &Snapshot) -> serde_json::Value {
    serde_json::to_value(effective(snapshot)).expect("a config of plain values serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::{BrownoutFile, RateLimitFile, TokenFile};
    use crate::config::testing::{self, AGENT_ID};
    use crate::config::RateLimitBackend;
    use crate::config::TokenDigest;

    #[test]
    fn the_dump_fills_defaults_writes_dates_in_utc_and_hides_secrets() {
        let mut f = testing::config();
        f.retirement.sunset_at = Some("2027-06-01T02:00:00+02:00".into());
        f.agent_mut(AGENT_ID).rate_limit_per_second = Some(2.5);
        f.retirement.brownouts.push(BrownoutFile::new(
            "2026-12-01T10:00:00-01:00",
            "2026-12-01T12:00:00Z",
        ));
        f.rate_limit = RateLimitFile {
            backend: RateLimitBackend::Redis,
            redis_url: Some("redis://:hunter2@127.0.0.1:6379/0".into()),
            ..RateLimitFile::default()
        };
        f.retirement.prometheus_url = Some("http://prometheus:9090".into());
        f.retirement.link = Some("https://docs.example:8443/@team/v2".into());
        f.retirement.prometheus_selector = Some(r#"{ namespace = "prod" }"#.into());
        f.tracing.otlp_endpoint = Some("http://otel:otlp-pw@127.0.0.1:4318".into());
        let snapshot = f.snapshot();
        let text = to_toml(&snapshot);
        for want in [
            "sunset_at = \"2027-06-01T00:00:00Z\"",
            r#"prometheus_selector = 'namespace="prod"'"#,
            "start = \"2026-12-01T11:00:00Z\"",
            "percent = 100",
            "burst = 3",
            &format!("threads = {}", snapshot.startup.threads),
            "read_timeout_ms = 30000",
            "token_sha256 = \"<redacted>\"",
            "redis_url = \"redis://:<redacted>@127.0.0.1:6379/0\"",
            "otlp_endpoint = \"http://otel:<redacted>@127.0.0.1:4318\"",
            "prometheus_url = \"http://prometheus:9090\"",
            "link = \"https://docs.example:8443/@team/v2\"",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
        for secret in ["hunter2", "otlp-pw"] {
            assert!(!text.contains(secret), "{secret}: {text}");
        }
        let digest = &snapshot.auth.agents[AGENT_ID].tokens[0].digest.to_hex();
        assert!(!text.contains(digest.as_str()), "{text}");
        let back: FileConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.upstream.addresses, ["127.0.0.1:9000"]);
        assert_eq!(to_json(&snapshot)["limits"]["max_body_bytes"], 1048576);
    }

    #[test]
    fn every_digest_is_redacted_and_secret_files_show_only_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("redis-password");
        std::fs::write(&password, "hunter2\n").unwrap();
        let hex = |t: &str| TokenDigest::of(t.as_bytes()).to_hex();
        let mut f = testing::config();
        let agent = f.agent_mut(AGENT_ID);
        agent.token_sha256 = Digests(vec![hex("old"), hex("new")]);
        agent.tokens = vec![TokenFile {
            sha256: hex("planned"),
            not_after: Some("2027-01-01T01:00:00+01:00".into()),
        }];
        f.admin.token_sha256 = Digests(vec![hex("admin")]);
        f.rate_limit.redis_url = Some("redis://127.0.0.1:6379/0".into());
        f.rate_limit.redis_password_file = Some(password.display().to_string());
        let text = to_toml(&f.snapshot());
        for token in ["old", "new", "planned", "admin"] {
            assert!(!text.contains(&hex(token)), "{token}: {text}");
        }
        assert!(!text.contains("hunter2"), "{text}");
        for want in [
            "token_sha256 = [\"<redacted>\", \"<redacted>\"]",
            "sha256 = \"<redacted>\"",
            "not_after = \"2027-01-01T00:00:00Z\"",
            &format!("redis_password_file = {:?}", password.display().to_string()),
            "redis_url = \"redis://127.0.0.1:6379/0\"",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
    }

    #[test]
    fn the_dump_shows_the_start_up_settings_the_process_runs_with() {
        let mut snapshot = testing::snapshot();
        snapshot.startup.proxy_listen = "127.0.0.1:1".parse().unwrap();
        assert_eq!(effective(&snapshot).listen.proxy, "127.0.0.1:1");
    }
}
