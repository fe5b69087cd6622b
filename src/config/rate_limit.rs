//! `[rate_limit]`: where the per-agent limits (`auth.agents[].rate_limit_per_second`, `burst`)
//! are kept. `local` keeps them in this process; `redis` keeps them in a Redis every replica
//! shares, so the limits hold across the fleet, with `on_redis_error` saying what happens
//! when Redis cannot answer within `timeout_ms`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;

use crate::client::redact::redact_url;

use super::file::RateLimitFile;
use super::files::{pem_certificates, secret_text, Files};
use super::problems::Problems;
use super::types::{OnRedisError, RateLimitBackend};

/// A `redis://` or `rediss://` URL, checked by the client's own parser. It may carry a
/// password, so `Debug` and `Display` print it with the password redacted ([`redact_url`]).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    pub fn parse(s: &str) -> Result<Self, String> {
        let scheme = s.split_once("://").map(|(scheme, _)| scheme);
        if !matches!(scheme, Some("redis" | "rediss")) {
            return Err(format!(
                "{} must start with redis:// or rediss:// (TLS)",
                redact_url(s)
            ));
        }
        // The parser's message never repeats the URL, so it cannot leak the password.
        s.into_connection_info().map_err(|e| {
            format!(
                "{} is not a Redis URL: {e} (a password's `/`, `?` or `#` must be \
                 percent-encoded, or the password kept in rate_limit.redis_password_file)",
                redact_url(s)
            )
        })?;
        Ok(Self(s.to_owned()))
    }

    /// The URL as written, password included: for the client only, never for logs.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it asks for TLS.
    pub fn is_tls(&self) -> bool {
        self.0.starts_with("rediss://")
    }

    /// Whether it carries a password (`redis://user:password@...`, `redis://:password@...`).
    fn has_password(&self) -> bool {
        self.authority()
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    }

    /// `scheme://host...` split after the scheme: the authority and what follows it.
    fn authority(&self) -> &str {
        let rest = self.0.split_once("://").map_or("", |(_, rest)| rest);
        &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())]
    }

    /// The URL with `password` (from `redis_password_file`) in its user information,
    /// percent-encoded, after the user name if it has one.
    fn with_password(&self, password: &str) -> RedisUrl {
        let (scheme, rest) = self
            .0
            .split_once("://")
            .expect("a checked URL has a scheme");
        let authority = self.authority();
        let (user, host) = match authority.rsplit_once('@') {
            Some((user, host)) => (user, host),
            None => ("", authority),
        };
        let tail = &rest[authority.len()..];
        let password = crate::http1::percent_encode(password);
        RedisUrl(format!("{scheme}://{user}:{password}@{host}{tail}"))
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

/// The Redis backend's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisLimitConfig {
    pub url: RedisUrl,
    /// PEM CA certificates the server's certificate must chain to (`rediss://` only); `None`:
    /// the system's roots.
    pub ca_pem: Option<Arc<[u8]>>,
    pub on_error: OnRedisError,
    /// Bounds every Redis call; past it, `on_error` applies.
    pub timeout: Duration,
    /// Put before each agent id to make its key.
    pub key_prefix: String,
}

impl RedisLimitConfig {
    /// Whether `other` talks to the same server the same way, so a connection made for one
    /// serves the other (the prefix and `on_error` are per call).
    pub fn same_connection(&self, other: &RedisLimitConfig) -> bool {
        // Every field, without `..`: a new setting does not compile until it is sorted into
        // the connection's or the call's.
        let RedisLimitConfig {
            url,
            ca_pem,
            timeout,
            on_error: _,
            key_prefix: _,
        } = self;
        *url == other.url && *ca_pem == other.ca_pem && *timeout == other.timeout
    }
}

/// The validated `[rate_limit]` section.
#[derive(Debug, Clone, PartialEq)]
pub enum RateLimitConfig {
    Local,
    Redis(RedisLimitConfig),
}

/// Reads the PEM file the config names `name`, which must hold at least one certificate.
fn read_ca(files: &mut Files, name: &str) -> Result<Arc<[u8]>, String> {
    let (path, pem) = files.read(name)?;
    pem_certificates(&path.display().to_string(), &pem)?;
    Ok(pem.into())
}

/// The password of `redis_password_file`, joined to `url`: the URL must carry none itself.
fn with_password_file(
    url: Option<RedisUrl>,
    f: &RateLimitFile,
    files: &mut Files,
    p: &mut Problems,
) -> Option<RedisUrl> {
    const KEY: &str = "rate_limit.redis_password_file";
    let Some(name) = &f.redis_password_file else {
        return url;
    };
    let password = files
        .read(name)
        .and_then(|(path, bytes)| secret_text(&path, bytes));
    let password = p.check(KEY, password)?;
    match url {
        None if f.redis_url.is_none() => {
            p.push(KEY, "only used with a redis_url");
            None
        }
        Some(url) if url.has_password() => {
            p.push(
                KEY,
                "redis_url already carries a password: keep it in one place (this file)",
            );
            None
        }
        url => url.map(|u| u.with_password(&password)),
    }
}

/// Validates `[rate_limit]`. The Redis settings are checked whatever the backend, so a
/// mistake is found before the day someone switches to it.
pub(super) fn rate_limit(
    f: &RateLimitFile,
    files: &mut Files,
    p: &mut Problems,
) -> RateLimitConfig {
    let timeout = p.millis("rate_limit.timeout_ms", f.timeout_ms);
    let url = match &f.redis_url {
        Some(u) => p.check("rate_limit.redis_url", RedisUrl::parse(u)),
        None if f.backend == RateLimitBackend::Redis => {
            p.push("rate_limit.redis_url", "required when backend = \"redis\"");
            None
        }
        None => None,
    };
    let url = with_password_file(url, f, files, p);
    let ca_pem = match &f.redis_ca_file {
        None => None,
        Some(path) => {
            if url.as_ref().is_some_and(|u| !u.is_tls()) || f.redis_url.is_none() {
                p.push(
                    "rate_limit.redis_ca_file",
                    "only used with a rediss:// (TLS) redis_url",
                );
            }
            p.check("rate_limit.redis_ca_file", read_ca(files, path))
        }
    };
    match (f.backend, url) {
        (RateLimitBackend::Redis, Some(url)) => RateLimitConfig::Redis(RedisLimitConfig {
            url,
            ca_pem,
            on_error: f.on_redis_error,
            timeout,
            key_prefix: f.key_prefix.clone(),
        }),
        _ => RateLimitConfig::Local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::RateLimitFile;
    use crate::config::testing;
    use crate::config::Snapshot;

    fn redis_file(url: &str) -> RateLimitFile {
        RateLimitFile {
            backend: RateLimitBackend::Redis,
            redis_url: Some(url.into()),
            ..RateLimitFile::default()
        }
    }

    fn validated(f: RateLimitFile) -> Result<RateLimitConfig, Vec<String>> {
        let mut cfg = testing::config();
        cfg.rate_limit = f;
        Snapshot::from_file(cfg)
            .map(|s| s.rate_limit)
            .map_err(|e| e.problems().into_iter().map(|p| p.to_string()).collect())
    }

    #[test]
    fn local_is_the_default() {
        assert_eq!(testing::snapshot().rate_limit, RateLimitConfig::Local);
    }

    #[test]
    fn a_redis_backend_gets_the_documented_defaults() {
        let RateLimitConfig::Redis(r) = validated(redis_file("redis://127.0.0.1:6379/0")).unwrap()
        else {
            panic!("expected the redis backend");
        };
        assert_eq!(r.on_error, OnRedisError::Local);
        assert_eq!(r.timeout, Duration::from_millis(50));
        assert_eq!(r.key_prefix, "agent-gateway:");
        assert!(r.ca_pem.is_none());
    }

    #[test]
    fn a_redis_backend_needs_a_url_and_a_url_must_be_redis() {
        let missing = RateLimitFile {
            backend: RateLimitBackend::Redis,
            ..RateLimitFile::default()
        };
        assert_eq!(
            validated(missing).unwrap_err(),
            ["rate_limit.redis_url: required when backend = \"redis\""]
        );
        let http = validated(redis_file("http://127.0.0.1:6379")).unwrap_err();
        assert!(http[0].starts_with("rate_limit.redis_url: "), "{http:?}");
        let zero = RateLimitFile {
            timeout_ms: 0,
            ..redis_file("redis://127.0.0.1:6379")
        };
        assert_eq!(
            validated(zero).unwrap_err(),
            ["rate_limit.timeout_ms: must be greater than 0"]
        );
    }

    #[test]
    fn the_redis_settings_are_checked_even_while_the_backend_is_local() {
        let f = RateLimitFile {
            backend: RateLimitBackend::Local,
            ..redis_file("redis://127.0.0.1:notaport")
        };
        assert_eq!(validated(f).unwrap_err().len(), 1);
    }

    #[test]
    fn a_ca_file_goes_with_tls_only() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let f = RateLimitFile {
            redis_ca_file: Some(empty.display().to_string()),
            ..redis_file("redis://127.0.0.1:6379")
        };
        let problems = validated(f).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems
            .iter()
            .all(|p| p.starts_with("rate_limit.redis_ca_file: ")));
    }

    #[test]
    fn a_password_file_joins_the_url_and_the_url_keeps_none_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("redis-password");
        std::fs::write(&pw, "p@ss:word\n").unwrap();
        let with_file = |url: &str| RateLimitFile {
            redis_password_file: Some(pw.display().to_string()),
            ..redis_file(url)
        };
        let RateLimitConfig::Redis(r) =
            validated(with_file("redis://app@127.0.0.1:6379/0")).unwrap()
        else {
            panic!("expected the redis backend");
        };
        assert_eq!(r.url.expose(), "redis://app:p%40ss%3Aword@127.0.0.1:6379/0");
        assert_eq!(r.url.to_string(), "redis://app:<redacted>@127.0.0.1:6379/0");
        let RateLimitConfig::Redis(r) = validated(with_file("rediss://h:1")).unwrap() else {
            panic!("expected the redis backend");
        };
        assert_eq!(r.url.expose(), "rediss://:p%40ss%3Aword@h:1");
        let twice = validated(with_file("redis://:other@127.0.0.1:6379/0")).unwrap_err();
        assert_eq!(twice.len(), 1, "{twice:?}");
        assert!(twice[0].starts_with("rate_limit.redis_password_file: "));
        assert!(
            !twice[0].contains("other") && !twice[0].contains("p@ss"),
            "{twice:?}"
        );
        let missing = RateLimitFile {
            redis_password_file: Some(dir.path().join("none").display().to_string()),
            ..redis_file("redis://127.0.0.1:6379/0")
        };
        assert!(validated(missing).unwrap_err()[0].contains("cannot read"));
    }

    #[test]
    fn the_password_never_shows() {
        let url = "rediss://default:s3cr%40t@redis.example:6380/2";
        let parsed = RedisUrl::parse(url).unwrap();
        assert_eq!(
            parsed.to_string(),
            "rediss://default:<redacted>@redis.example:6380/2"
        );
        assert!(!format!("{parsed:?}").contains("s3cr"));
        assert_eq!(parsed.expose(), url);
        let bad = RedisUrl::parse("redis://:hunter2@host:port/0").unwrap_err();
        assert!(!bad.contains("hunter2"), "{bad}");
        let not_redis = RedisUrl::parse("memcache://:hunter2@host:1/0").unwrap_err();
        assert!(!not_redis.contains("hunter2"), "{not_redis}");
        // Unencoded (`openssl rand -base64` writes `/`): each would end a parser's
        // authority early.
        for password in [
            "Sup3r/Secret+pw==",
            "hunt3r?two",
            "k3pt#s3cr3t",
            "qwx/zyk@vvq",
        ] {
            let written = format!("redis://:{password}@127.0.0.1:6379/0");
            let shown = match RedisUrl::parse(&written) {
                Ok(url) => url.to_string(),
                Err(e) => e,
            };
            for part in password.split(['/', '?', '#', '@']) {
                assert!(!shown.contains(part), "{password}: {shown}");
            }
        }
        let file = format!("{:?}", redis_file(url));
        assert!(!file.contains("s3cr"), "{file}");
    }
}
