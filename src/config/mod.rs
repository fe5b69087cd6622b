//! Configuration: the file layer ([`mod@file`]) and the validated [`Snapshot`] the gateway runs on.
//!
//! A snapshot can only be built by [`Snapshot::from_file`] (or [`Snapshot::load`]), which
//! checks every value and reports every problem at once, by key path ([`Problem`]); from a
//! file's text, with the problems of its shape too, each with its line and column, in the
//! order of the file (`document.rs`, against the keys `schema.rs` reads from `file.rs`). Each
//! section is validated next to its own types (`startup.rs`, `upstream.rs`, `auth.rs`,
//! `retirement.rs`, `limits.rs`, `rate_limit.rs`, `tracing.rs`), each validated type named
//! after its section (`[upstream]` is an [`UpstreamConfig`]); the value types they share are
//! in `types.rs`, a leaf, and what they report in `problems.rs`, another. This module only
//! assembles: the bases, which span three sections, and the snapshot. Once built, nothing
//! re-checks.

mod auth;
mod document;
pub mod dump;
pub mod file;
mod limits;
mod problems;
mod rate_limit;
mod retirement;
pub mod schema;
mod startup;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
mod tracing;
mod types;
mod upstream;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

pub use auth::{Agent, AuthConfig, RateLimit};
pub use file::{FileConfig, DEFAULT_QUIET_DAYS};
pub use limits::LimitsConfig;
pub use problems::{ConfigError, Place, Problem};
pub use rate_limit::{RateLimitConfig, RedisLimitConfig, RedisUrl};
pub use retirement::{Brownout, Recurrence, RetirementConfig, Terms};
pub use startup::{cpus_available, StartupConfig};
pub use tracing::TracingConfig;
pub use types::{
    format_time, unix_seconds, BasePath, Bases, BusinessCode, Dates, OnRedisError,
    RateLimitBackend, Repeat, TokenDigest, V1Policy, ValidationMode, Weekday,
};
pub use upstream::{BudgetConfig, DnsConfig, EjectionConfig, Host, Target, UpstreamConfig};

use document::Parsed;
use problems::Problems;

/// The whole validated configuration. Immutable; a reload builds a new one.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub startup: StartupConfig,
    pub bases: Bases,
    pub v1_default_service: BusinessCode,
    pub upstream: UpstreamConfig,
    pub auth: AuthConfig,
    pub limits: LimitsConfig,
    pub validation: ValidationMode,
    pub retirement: RetirementConfig,
    pub rate_limit: RateLimitConfig,
    /// `None` when tracing is off (no `tracing.otlp_endpoint`).
    pub tracing: Option<TracingConfig>,
    /// What it was built from.
    pub source: Source,
}

/// What a snapshot was built from, for `config dump` and the admin listener's `/config`.
#[derive(Clone)]
pub struct Source {
    /// The file as read, every default filled in ([`dump::effective`] adds what validation
    /// settled and redacts the secrets).
    pub file: Arc<FileConfig>,
    /// SHA-256 of the file's text; `None` for a snapshot built from a typed config (tests).
    pub sha256: Option<[u8; 32]>,
    pub loaded_at: SystemTime,
}

/// By hand: the file holds token digests and maybe a Redis password.
impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("sha256", &self.sha256.map(hex::encode))
            .field("loaded_at", &self.loaded_at)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
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

    /// Parse and validate the text of a config file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let parsed = Parsed::read(text).map_err(ConfigError::Invalid)?;
        match Self::validate(parsed.file.clone()) {
            Ok(mut snapshot) if parsed.is_clean() => {
                snapshot.source.sha256 = Some(Sha256::digest(text).into());
                Ok(snapshot)
            }
            result => Err(ConfigError::Invalid(
                parsed.merge(result.err().unwrap_or_default()),
            )),
        }
    }

    /// Validate a parsed file, reporting every problem at once.
    pub fn from_file(f: FileConfig) -> Result<Self, ConfigError> {
        Self::validate(f).map_err(ConfigError::Invalid)
    }

    fn validate(f: FileConfig) -> Result<Self, Vec<Problem>> {
        let mut p = Problems::default();
        let startup = startup::startup(&f.listen, &f.server, &mut p);
        let bases = bases(&f, &mut p);
        let v1_default_service = p.check(
            "v1.default_service",
            BusinessCode::parse(&f.v1.default_service),
        );
        let upstream = upstream::upstream(&f.upstream, &mut p);
        let auth = auth::auth(&f.auth, &mut p);
        let retirement = retirement::retirement(&f.retirement, &f.auth, &auth.agents, &mut p);
        let limits = limits::limits(&f.limits, &mut p);
        let rate_limit = rate_limit::rate_limit(&f.rate_limit, &mut p);
        let tracing = tracing::tracing(&f.tracing, &mut p);
        let snapshot = match (startup, bases, v1_default_service) {
            (Some(startup), Some(bases), Some(v1_default_service)) => Some(Snapshot {
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
                source: Source {
                    file: Arc::new(f),
                    sha256: None,
                    loaded_at: SystemTime::now(),
                },
            }),
            _ => None,
        };
        p.finish(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::testing::{self, AGENT_ID};
    use super::*;

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
            s.startup.threads,
            std::thread::available_parallelism().unwrap().get()
        );
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
        let keys = FileConfig::parse(text).unwrap().refused_keys();
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
    fn host_names_are_checked_for_form_and_never_looked_up() {
        let mut f = testing::config();
        f.upstream.addresses = vec!["backend.example.invalid:8080".into()];
        assert!(Snapshot::from_file(f.clone()).is_ok());
        f.upstream.addresses = vec!["no-port".into(), ":80".into(), "h:x".into()];
        f.v1.default_service = "a/b".into();
        assert_eq!(
            f.refused_keys(),
            [
                "v1.default_service",
                "upstream.addresses[0]",
                "upstream.addresses[1]",
                "upstream.addresses[2]"
            ]
        );
    }

    #[test]
    fn problems_of_shape_and_of_value_come_together_in_the_order_of_the_file() {
        let text = minimal_text().replace("proxy = \"127.0.0.1:8080\"", "proxy = 8080")
            + "[retirement]\nsunset_at = \"2027-06-01\"\nquiet_dayz = 3\n\
               [limits]\nclient_body_timeout = \"0s\"\n";
        let problems = Snapshot::parse(&text).unwrap_err().problems();
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "listen.proxy",
                "retirement.sunset_at",
                "retirement.quiet_dayz",
                "limits.client_body_timeout"
            ],
            "{problems:?}"
        );
        assert!(problems.iter().all(|p| p.at.is_some()), "{problems:?}");
        assert_eq!(problems[3].message, "must be greater than 0");
    }

    #[test]
    fn a_missing_section_is_a_missing_key() {
        let keys = FileConfig::parse("[v1]\ndefault_service = \"X\"\n")
            .unwrap()
            .refused_keys();
        assert_eq!(keys, ["listen.proxy", "upstream.addresses"]);
    }

    #[test]
    fn a_snapshot_from_text_knows_the_texts_digest() {
        let text = minimal_text();
        let s = Snapshot::parse(&text).unwrap();
        assert_eq!(s.source.sha256, Some(Sha256::digest(&text).into()));
        assert_eq!(s.source.file.listen.proxy, "127.0.0.1:8080");
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
        assert_eq!(f.refused_keys(), ["v2.base_path"]);
    }

    #[test]
    fn zero_timeouts_and_limits_are_refused() {
        let mut f = testing::config();
        f.limits.max_body_bytes = 0;
        f.upstream.connect_timeout_ms = 0;
        let keys = f.refused_keys();
        assert!(keys.contains(&"upstream.connect_timeout_ms".to_string()));
        assert!(keys.contains(&"limits.max_body_bytes".to_string()));
    }
}
