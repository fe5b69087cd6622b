//! Configuration: the file layer ([`mod@file`]) and the validated [`Snapshot`] the gateway runs on.
//!
//! A snapshot can only be built by [`Snapshot::from_file`] (or [`Snapshot::load`]), which
//! checks every value and reports every problem at once, by key path ([`Problem`]); from a
//! file's text, with the problems of its shape too, each with its line and column, in the
//! order of the file (`document.rs`, against the keys `schema.rs` reads from `file.rs`). Each
//! section is validated next to its own types (`startup.rs`, `upstream.rs`, `auth.rs`,
//! `retirement.rs`, `limits.rs`, `rate_limit.rs`, `tracing.rs`), each validated type named
//! after its section (`[upstream]` is an [`UpstreamConfig`]); the value types they share are
//! in `types.rs`, a leaf, what they report in `problems.rs`, another, and the PromQL label
//! matchers of `retirement.prometheus_selector` in `selector.rs`, a third; whether others can
//! write where `server.upgrade_sock` is made, in `upgrade_sock.rs`. This module only
//! assembles: the bases, which span three sections, and the snapshot. Once built, nothing
//! re-checks. What a valid snapshot allows that works but should not (no agent) is said by
//! `warnings.rs`, as warnings, not problems; a published token is refused by the commands that
//! serve (`published.rs`), the demo excepted.

mod admin;
mod auth;
mod document;
pub mod dump;
mod edge;
pub mod file;
mod files;
mod limits;
mod problems;
pub mod published;
mod rate_limit;
mod retirement;
pub mod schema;
mod selector;
mod server_cert;
mod startup;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
mod tracing;
mod types;
mod upgrade_sock;
mod upstream;
pub mod warnings;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

pub use admin::AdminConfig;
pub use auth::{Agent, AgentTable, AgentToken, AuthConfig, RateLimit, UNKNOWN_AGENT};
pub use edge::EdgeConfig;
pub use file::{FileConfig, DEFAULT_QUIET_DAYS};
pub use files::{directory_of, Inputs, Mount};
pub use limits::LimitsConfig;
pub use problems::{ConfigError, Place, Problem};
pub use rate_limit::{RateLimitConfig, RedisLimitConfig, RedisUrl};
pub use retirement::{Brownout, Recurrence, RetirementConfig, Terms};
pub use selector::{promql_string, MatchOp, SeriesSelector};
pub use server_cert::ServerCert;
pub use startup::{cpus_available, StartupConfig};
pub use tracing::TracingConfig;
pub use types::{
    format_time, unix_seconds, BasePath, Bases, BusinessCode, Dates, IpNet, OnRedisError,
    RateLimitBackend, Repeat, TokenDigest, V1Policy, ValidationMode, Weekday,
};
pub use upstream::{BudgetConfig, DnsConfig, EjectionConfig, Host, Target, UpstreamConfig};

pub(crate) use document::problem_in_text;
use document::Parsed;
use file::{AgentsFile, AuthFile};
use files::Files;
use problems::Problems;
use schema::Schema;

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
    /// Who is in front of the proxy listener: trusted proxies, the PROXY protocol.
    pub edge: EdgeConfig,
    /// The certificate the proxy listener serves, when it speaks TLS.
    pub server_cert: Option<ServerCert>,
    pub admin: AdminConfig,
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
    /// The config's text and the secret files it names, as read.
    pub inputs: Inputs,
}

/// A config file read and checked, with the files it names: what was read (whatever the
/// verdict, so that a reload can tell unchanged inputs) and the snapshot or its problems.
pub struct Reading {
    pub inputs: Inputs,
    pub result: Result<Snapshot, ConfigError>,
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

/// The agents file `auth.agents_file` names, read and parsed: its agents, and what reading it
/// found (each problem of its agents is located in it).
struct AgentsRead {
    name: String,
    parsed: Parsed<AgentsFile>,
}

/// Reads the agents file of `auth`, if it names one; a file that cannot be read or is not
/// TOML is a problem (placed in it when it has a place).
fn read_agents_file(auth: &AuthFile, files: &mut Files, p: &mut Problems) -> Option<AgentsRead> {
    let name = auth.agents_file.as_ref()?;
    let (path, bytes) = p.check("auth.agents_file", files.read(name))?;
    let text = p.check(
        "auth.agents_file",
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display())),
    )?;
    let shown = path.display().to_string();
    match Parsed::<AgentsFile>::read(&text, Schema::agents_file()) {
        // What a write caught half-way shows (truncated, not yet written): applied, it would
        // lock every agent out.
        Ok(parsed) if parsed.file.agents.is_empty() => {
            p.push(
                "auth.agents_file",
                format!("{shown} holds no agent (to refuse every agent, leave agents_file out)"),
            );
            None
        }
        Ok(parsed) => Some(AgentsRead {
            name: shown,
            parsed,
        }),
        Err(problems) => {
            p.extend(problems.into_iter().map(|q| Problem {
                file: Some(shown.clone()),
                ..q
            }));
            None
        }
    }
}

/// `auth.agents[k]...` of the agents file's `k - inline`th agent, as the agents file names it
/// (`agents[0]...`); `None` for an inline agent's key or another key.
fn agents_file_key(key: &str, inline: usize) -> Option<String> {
    let rest = key.strip_prefix("auth.agents[")?;
    let (index, rest) = rest.split_once(']')?;
    let k: usize = index.parse().ok()?;
    (k >= inline).then(|| format!("agents[{}]{rest}", k - inline))
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
    /// Read, parse and validate a config file and the files it names (relative to its
    /// directory).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::read(path)?.result
    }

    /// Reads a config file and the files it names, and checks them; `Err` only when the
    /// config file itself cannot be read.
    pub fn read(path: &Path) -> Result<Reading, ConfigError> {
        Self::read_mounted(path, &[])
    }

    /// [`Snapshot::read`], with the files under each mount's directory read from its source:
    /// a config checked away from the pod whose Secrets it names.
    pub fn read_mounted(path: &Path, mounts: &[Mount]) -> Result<Reading, ConfigError> {
        let text = read(path)?;
        Ok(Self::from_text(
            &text,
            Files::beside(path, &text).mounted(mounts),
        ))
    }

    /// Parse and validate the text of a config file; the files it names are relative to the
    /// current directory.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::from_text(text, Files::new(Path::new("."), text)).result
    }

    /// Validate a parsed file, reporting every problem at once (the files it names are
    /// relative to the current directory).
    pub fn from_file(f: FileConfig) -> Result<Self, ConfigError> {
        let mut files = Files::new(Path::new("."), "");
        Self::validate(f, &mut files).map_err(ConfigError::Invalid)
    }

    /// Every problem of `text`, its shape's and its values', in the order of the file (then
    /// the agents file's, in its order).
    fn from_text(text: &str, mut files: Files) -> Reading {
        let parsed = match Parsed::<FileConfig>::read(text, Schema::file()) {
            Ok(parsed) => parsed,
            Err(problems) => {
                return Reading {
                    inputs: files.finish(),
                    result: Err(ConfigError::Invalid(problems)),
                }
            }
        };
        let validated = Self::validate(parsed.file.clone(), &mut files);
        let inputs = files.finish();
        let result = match validated {
            Ok(mut snapshot) if parsed.is_clean() => {
                snapshot.source.sha256 = Some(Sha256::digest(text).into());
                snapshot.source.inputs = inputs.clone();
                Ok(snapshot)
            }
            result => Err(ConfigError::Invalid(
                parsed.merge(result.err().unwrap_or_default()),
            )),
        };
        Reading { inputs, result }
    }

    fn validate(f: FileConfig, files: &mut Files) -> Result<Self, Vec<Problem>> {
        let mut p = Problems::default();
        // The agents file's agents are validated after the inline ones, as if they were
        // `auth.agents[n..]` (duplicate ids across the two, brownouts naming them); their
        // problems then go back to the file, under its own keys.
        let agents_file = read_agents_file(&f.auth, files, &mut p);
        let inline = f.auth.agents.len();
        let mut auth_file = f.auth.clone();
        if let Some(read) = &agents_file {
            auth_file
                .agents
                .extend(read.parsed.file.agents.iter().cloned());
        }
        let startup = startup::startup(&f.listen, &f.server, &mut p);
        upgrade_sock::upgrade_sock(&f.server, &mut p);
        let server_cert = server_cert::server_cert(&f.listen, files, &mut p);
        let bases = bases(&f, &mut p);
        let v1_default_service = p.check(
            "v1.default_service",
            BusinessCode::parse(&f.v1.default_service),
        );
        let upstream = upstream::upstream(&f.upstream, files, &mut p);
        let auth = auth::auth(&auth_file, &mut p);
        let retirement =
            retirement::retirement(&f.retirement, &auth_file, &auth.agents, files, &mut p);
        let limits = limits::limits(&f.limits, &mut p);
        let rate_limit = rate_limit::rate_limit(&f.rate_limit, files, &mut p);
        let tracing = tracing::tracing(&f.tracing, &mut p);
        let edge = edge::edge(&f.listen, &mut p);
        let admin = admin::admin(&f.admin, &mut p);
        if let Some(read) = agents_file {
            let moved = p.split_off(|key| agents_file_key(key, inline));
            let placed = read.parsed.merge(moved).into_iter().map(|q| Problem {
                file: Some(read.name.clone()),
                ..q
            });
            p.extend(placed.collect::<Vec<_>>());
        }
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
                edge,
                server_cert,
                admin,
                source: Source {
                    file: Arc::new(f),
                    sha256: None,
                    loaded_at: SystemTime::now(),
                    inputs: Inputs::default(),
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
            s.auth.agents[AGENT_ID].tokens,
            [AgentToken::new(
                TokenDigest::of(testing::TOKEN.as_bytes()),
                None
            )]
        );
        assert_eq!(s.auth.max_failures_per_minute, None);
        assert_eq!(s.edge, EdgeConfig::default());
        assert_eq!(s.admin, AdminConfig::default());
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

    /// Nothing prints a config with `{:?}` today; one added later must not show a password,
    /// whether the key takes one (the OTLP endpoint, the Redis URL) or is refused one (the
    /// link, the Prometheus URL, as the file holds them before validation).
    #[test]
    fn a_url_s_password_shows_in_no_debug_print() {
        let passwords = ["otlp-pw", "redis-pw", "link-pw", "prom-pw"];
        let shown = |what: &str, text: String| {
            for password in passwords {
                assert!(!text.contains(password), "{password} in {what}: {text}");
            }
            assert!(
                text.contains(crate::client::redact::REDACTED),
                "{what}: {text}"
            );
        };
        let mut f = testing::config();
        f.tracing.otlp_endpoint = Some("http://otel:otlp-pw@127.0.0.1:4318".into());
        f.rate_limit.backend = RateLimitBackend::Redis;
        f.rate_limit.redis_url = Some("redis://app:redis-pw@127.0.0.1:6379/0".into());
        let snapshot = f.clone().snapshot();
        shown("TracingConfig", format!("{:?}", snapshot.tracing));
        shown("RateLimitConfig", format!("{:?}", snapshot.rate_limit));
        shown("Snapshot", format!("{snapshot:?}"));

        f.retirement.link = Some("https://docs:link-pw@docs.example/v2".into());
        f.retirement.prometheus_url = Some("http://ops:prom-pw@prometheus:9090".into());
        shown("TracingFile", format!("{:?}", f.tracing));
        shown("RateLimitFile", format!("{:?}", f.rate_limit));
        shown("RetirementFile", format!("{:?}", f.retirement));
        shown("FileConfig", format!("{f:?}"));
    }
}
