//! Configuration: the file layer ([`mod@file`]) and the validated [`Snapshot`] the gateway runs on.
//!
//! A snapshot can only be built by [`Snapshot::from_file`] (or [`Snapshot::load`]), which
//! checks every value and reports every problem at once, by key path. Each section is
//! validated next to its own types ([`auth`], [`limits`], [`rate_limit`], [`retirement`],
//! [`tracing`], [`upstream`]); the value types they share are in [`types`], a leaf. Once
//! built, nothing re-checks.

mod auth;
pub mod file;
mod limits;
mod rate_limit;
mod retirement;
pub mod testing;
mod tracing;
mod types;
mod upstream;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

pub use auth::{Agent, AuthConfig, RateLimit};
pub use file::FileConfig;
pub use limits::{Limits, ValidationMode};
pub use rate_limit::{OnRedisError, RateLimitBackend, RateLimitConfig, RedisLimitConfig, RedisUrl};
pub use retirement::{Brownout, Recurrence, Retirement, Terms};
pub use tracing::TracingSettings;
pub use types::{
    unix_seconds, BasePath, Bases, BusinessCode, Dates, Repeat, TokenDigest, V1Policy, Weekday,
};
pub use upstream::UpstreamConfig;

/// One thing wrong with a config file, located by its key path (`auth.agents[2].id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{} problem(s):\n{}", .0.len(), .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// Every problem, each with its key path; a parse error is one problem at the root.
    pub fn problems(&self) -> Vec<Problem> {
        match self {
            ConfigError::Invalid(p) => p.clone(),
            other => vec![Problem {
                key: String::new(),
                message: other.to_string(),
            }],
        }
    }
}

/// Settings that only take effect at process start (listeners, runtimes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupSettings {
    pub proxy_listen: SocketAddr,
    /// Certificate and key files of a TLS proxy listener.
    pub proxy_tls: Option<(String, String)>,
    /// HTTP/2 for clients that ask for it (ALPN `h2`, or the h2c preface).
    pub http2: bool,
    pub admin_listen: Option<SocketAddr>,
    pub threads: usize,
    pub grace_period_seconds: u64,
    pub work_stealing: bool,
    pub upstream_keepalive_pool_size: usize,
    pub watch_config: bool,
    pub upgrade_sock: String,
}

/// The whole validated configuration. Immutable; a reload builds a new one.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub startup: StartupSettings,
    pub bases: Bases,
    pub v1_default_service: BusinessCode,
    pub upstream: UpstreamConfig,
    pub auth: AuthConfig,
    pub limits: Limits,
    pub validation: ValidationMode,
    pub retirement: Retirement,
    pub rate_limit: RateLimitConfig,
    /// `None` when tracing is off (no `tracing.otlp_endpoint`).
    pub tracing: Option<TracingSettings>,
}

/// Whether validation looks host names up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    Resolve,
    /// Check the form only ([`Snapshot::check_without_lookup`]).
    Skip,
}

/// Collects problems while a file is validated, each under its key path.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }

    /// The parsed value, or `None` with the error recorded under `key`.
    fn check<T>(&mut self, key: impl Into<String>, r: Result<T, String>) -> Option<T> {
        r.map_err(|e| self.push(key, e)).ok()
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

impl FileConfig {
    /// The file layer of a config's text: its shape checked, none of its values.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))
    }
}

fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not an ip:port address"))
}

fn parse_time(s: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339(s)
        .map_err(|e| format!("{s:?} is not an RFC 3339 UTC time like 2027-06-01T00:00:00Z ({e})"))
}

fn millis(key: &str, ms: u64, problems: &mut Problems) -> Duration {
    if ms == 0 {
        problems.push(key, "must be greater than 0");
    }
    Duration::from_millis(ms)
}

/// Validates `[listen]` and `[server]`.
fn startup(f: &FileConfig, p: &mut Problems) -> Option<StartupSettings> {
    let proxy_listen = p.check("listen.proxy", parse_listen(&f.listen.proxy));
    let admin_listen = match &f.listen.admin {
        None => Some(None),
        Some(a) => p.check("listen.admin", parse_listen(a)).map(Some),
    };
    let proxy_tls = match (&f.listen.tls_cert, &f.listen.tls_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            match pingora::tls::load_certs_and_key_files(cert, key) {
                Ok(Some(_)) => {}
                Ok(None) => p.push(
                    "listen.tls_cert",
                    "no certificate or key found in the files",
                ),
                Err(e) => p.push(
                    "listen.tls_cert",
                    format!("cannot load {cert} / {key}: {e}"),
                ),
            }
            Some((cert.clone(), key.clone()))
        }
        _ => {
            p.push("listen.tls_cert", "tls_cert and tls_key go together");
            None
        }
    };
    let s = &f.server;
    if s.threads == 0 {
        p.push("server.threads", "must be at least 1");
    }
    if s.upstream_keepalive_pool_size == 0 {
        p.push("server.upstream_keepalive_pool_size", "must be at least 1");
    }
    Some(StartupSettings {
        proxy_listen: proxy_listen?,
        proxy_tls,
        http2: f.listen.http2,
        admin_listen: admin_listen?,
        threads: s.threads,
        grace_period_seconds: s.grace_period_seconds,
        work_stealing: s.work_stealing,
        upstream_keepalive_pool_size: s.upstream_keepalive_pool_size,
        watch_config: s.watch_config,
        upgrade_sock: s.upgrade_sock.clone(),
    })
}

/// Validates `[v1]`, `[v2]` and `upstream.base_path`: three clean bases, the public two disjoint.
fn bases(f: &FileConfig, p: &mut Problems) -> Option<Bases> {
    let v1 = p.check("v1.base_path", BasePath::parse(&f.v1.base_path));
    let v2 = p.check("v2.base_path", BasePath::parse(&f.v2.base_path));
    let upstream = p.check("upstream.base_path", BasePath::parse(&f.upstream.base_path));
    if let (Some(a), Some(b)) = (&v1, &v2) {
        if a.covers(b) || b.covers(a) {
            p.push(
                "v2.base_path",
                format!(
                    "overlaps v1.base_path {:?}: the two bases must be disjoint",
                    a.as_str()
                ),
            );
        }
    }
    Some(Bases {
        v1: v1?,
        v2: v2?,
        upstream: upstream?,
    })
}

impl Snapshot {
    /// Read, parse and validate a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&read(path)?)
    }

    /// Read and check a config file like [`Self::load`], without looking upstream host names
    /// up ([`Self::check_without_lookup`]).
    pub fn check_file_without_lookup(path: &Path) -> Result<(), ConfigError> {
        Self::check_without_lookup(FileConfig::parse(&read(path)?)?)
    }

    /// Parse and validate the text of a config file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::from_file(FileConfig::parse(text)?)
    }

    /// Validate a parsed file, reporting every problem at once.
    pub fn from_file(f: FileConfig) -> Result<Self, ConfigError> {
        Self::validate(f, Lookup::Resolve)
    }

    /// Checks a file without looking up upstream host names (only their `host:port` form):
    /// for a config checked away from the DNS it will run with, such as a Kubernetes ConfigMap
    /// whose backend is a Service name, checked in CI. Gives no snapshot: nothing may serve
    /// unresolved addresses.
    pub fn check_without_lookup(f: FileConfig) -> Result<(), ConfigError> {
        Self::validate(f, Lookup::Skip).map(drop)
    }

    fn validate(f: FileConfig, lookup: Lookup) -> Result<Self, ConfigError> {
        let mut p = Problems::default();
        let startup = startup(&f, &mut p);
        let bases = bases(&f, &mut p);
        let v1_default_service = p.check(
            "v1.default_service",
            BusinessCode::parse(&f.v1.default_service),
        );
        let upstream = upstream::upstream(&f.upstream, lookup, &mut p);
        let auth = auth::auth(&f.auth, &mut p);
        let retirement = retirement::retirement(&f.retirement, &f.auth, &auth.agents, &mut p);
        let limits = limits::limits(&f.limits, &mut p);
        let rate_limit = rate_limit::rate_limit(&f.rate_limit, &mut p);
        let tracing = tracing::tracing(&f.tracing, &mut p);
        match (startup, bases, v1_default_service) {
            (Some(startup), Some(bases), Some(v1_default_service)) if p.0.is_empty() => {
                Ok(Snapshot {
                    startup,
                    bases,
                    v1_default_service,
                    upstream,
                    auth,
                    limits,
                    validation: f.validation.mode,
                    retirement,
                    rate_limit,
                    tracing,
                })
            }
            _ => Err(ConfigError::Invalid(p.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{self, AGENT_ID};
    use super::*;
    use crate::http1;

    /// The smallest file the gateway accepts, as an operator would write it.
    fn minimal_text() -> String {
        format!(
            r#"
[listen]
proxy = "127.0.0.1:8080"
[v1]
default_service = "ORG_DEFAULT"
[upstream]
addresses = ["127.0.0.1:9000"]
[[auth.agents]]
id = "agent-1"
token_sha256 = "{}"
"#,
            TokenDigest::of(testing::TOKEN.as_bytes()).to_hex()
        )
    }

    fn problems(f: FileConfig) -> Vec<String> {
        match Snapshot::from_file(f) {
            Ok(_) => panic!("expected the config to be refused"),
            Err(e) => e.problems().into_iter().map(|p| p.key).collect(),
        }
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let s = Snapshot::parse(&minimal_text()).unwrap();
        assert_eq!(s.bases.v1.as_str(), "/api/v1");
        assert_eq!(s.bases.v2.as_str(), "/api/v2");
        assert_eq!(s.bases.upstream.as_str(), "/api/v2");
        assert_eq!(s.upstream.connect_timeout, Duration::from_millis(1000));
        assert_eq!(s.upstream.read_timeout, Duration::from_millis(30_000));
        assert_eq!(s.limits.max_body_bytes, 1024 * 1024);
        assert_eq!(s.limits.client_header_timeout, Duration::from_secs(10));
        assert_eq!(s.validation, ValidationMode::Enforce);
        assert!(s.auth.require_on_status);
        assert_eq!(s.startup.grace_period_seconds, 5);
        assert_eq!(
            s.auth.agents[AGENT_ID].token,
            TokenDigest::of(testing::TOKEN.as_bytes())
        );
    }

    #[test]
    fn the_typed_test_config_round_trips_through_toml() {
        let f = testing::config();
        let text = f.to_toml();
        let back: FileConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.to_toml(), text);
        assert!(Snapshot::parse(&text).is_ok(), "{text}");
    }

    #[test]
    fn every_problem_is_reported_by_key_path() {
        let text = r#"
[listen]
proxy = "not-an-address"
[v1]
default_service = "a/b"
[upstream]
addresses = ["127.0.0.1:9000", "nowhere"]
[[auth.agents]]
id = "a"
token_sha256 = "xyz"
[[auth.agents]]
id = "a"
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
services = ["ok", "bad code"]
"#;
        let keys: Vec<String> = match Snapshot::parse(text) {
            Ok(_) => panic!("expected the config to be refused"),
            Err(e) => e.problems().into_iter().map(|p| p.key).collect(),
        };
        for want in [
            "listen.proxy",
            "v1.default_service",
            "upstream.addresses[1]",
            "auth.agents[0].token_sha256",
            "auth.agents[1].id",
            "auth.agents[1].services[1]",
        ] {
            assert!(keys.iter().any(|k| k == want), "missing {want} in {keys:?}");
        }
    }

    #[test]
    fn without_lookup_host_names_are_checked_for_form_only() {
        let mut f = testing::config();
        f.upstream.addresses = vec!["backend.example.invalid:8080".into()];
        assert!(Snapshot::from_file(f.clone()).is_err());
        assert!(Snapshot::check_without_lookup(f.clone()).is_ok());
        f.upstream.addresses = vec!["no-port".into(), ":80".into(), "h:x".into()];
        f.v1.default_service = "a/b".into();
        let keys: Vec<String> = Snapshot::check_without_lookup(f)
            .unwrap_err()
            .problems()
            .into_iter()
            .map(|p| p.key)
            .collect();
        assert_eq!(
            keys,
            [
                "v1.default_service",
                "upstream.addresses[0]",
                "upstream.addresses[1]",
                "upstream.addresses[2]"
            ]
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let text = minimal_text() + "[v2]\nbase_pth = \"/x\"\n";
        let err = Snapshot::parse(&text).unwrap_err().to_string();
        assert!(err.contains("base_pth"), "{err}");
    }

    #[test]
    fn overlapping_bases_are_refused() {
        let mut f = testing::config();
        f.v1.base_path = "/api".into();
        assert_eq!(problems(f), vec!["v2.base_path"]);
    }

    #[test]
    fn rate_limits() {
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).rate_limit_per_second = Some(2.5);
        assert_eq!(
            f.snapshot().auth.agents[AGENT_ID].rate_limit,
            Some(RateLimit {
                per_second: 2.5,
                burst: 3
            })
        );
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).rate_limit_per_second = Some(0.0);
        assert_eq!(problems(f), vec!["auth.agents[0].rate_limit_per_second"]);
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).burst = Some(3);
        assert_eq!(problems(f), vec!["auth.agents[0].burst"]);
    }

    #[test]
    fn agent_default_service_must_be_in_its_services() {
        let mut f = testing::config();
        let agent = f.agent_mut(AGENT_ID);
        agent.default_service = Some("OTHER".into());
        agent.services = Some(vec!["ORG_DEFAULT".into()]);
        assert_eq!(problems(f), vec!["auth.agents[0].default_service"]);
    }

    #[test]
    fn zero_timeouts_and_limits_are_refused() {
        let mut f = testing::config();
        f.limits.max_body_bytes = 0;
        f.upstream.connect_timeout_ms = 0;
        let keys = problems(f);
        assert!(keys.contains(&"upstream.connect_timeout_ms".to_string()));
        assert!(keys.contains(&"limits.max_body_bytes".to_string()));
    }

    #[test]
    fn max_headers_cannot_exceed_the_parsers_table() {
        let with = |n: usize| {
            let mut f = testing::config();
            f.limits.max_headers = n;
            f
        };
        assert!(Snapshot::from_file(with(http1::MAX_HEADERS)).is_ok());
        assert_eq!(
            problems(with(http1::MAX_HEADERS + 1)),
            ["limits.max_headers"]
        );
    }
}
