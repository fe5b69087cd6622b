//! Configuration: the file layer ([`file`]) and the validated [`Snapshot`] the gateway runs on.
//!
//! A snapshot can only be built by [`Snapshot::from_file`] (or [`Snapshot::load`]), which
//! checks every value and reports every problem at once, by key path. Once built, nothing
//! re-checks: a [`BusinessCode`] is always a safe path segment, a [`TokenDigest`] always
//! 32 bytes, a [`BasePath`] always a clean absolute path.

pub mod file;

use std::collections::HashMap;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pingora::upstreams::peer::{HttpPeer, Peer};

use crate::api::route::Bases;
use crate::http1;
use crate::policy::retirement::{Brownout, Retirement, V1Policy};
pub use file::FileConfig;

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

/// A service business code: one safe path segment, `[A-Za-z0-9._~-]+`, never `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BusinessCode(String);

impl BusinessCode {
    pub fn parse(s: &str) -> Result<Self, String> {
        let safe = s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'));
        if s.is_empty() || !safe || s == "." || s == ".." {
            return Err(format!(
                "{s:?} is not a safe path segment (allowed: A-Z a-z 0-9 . _ ~ -, not . or ..)"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An absolute path prefix made of safe segments, without a trailing slash (`/api/v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasePath(String);

impl BasePath {
    pub fn parse(s: &str) -> Result<Self, String> {
        let Some(rest) = s.strip_prefix('/') else {
            return Err(format!("{s:?} must start with /"));
        };
        if rest.is_empty() {
            return Err("must have at least one segment (\"/\" alone is not a base)".into());
        }
        for seg in rest.split('/') {
            BusinessCode::parse(seg).map_err(|e| format!("in {s:?}: {e}"))?;
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `self` equals `other` or is a whole-segment prefix of it.
    pub fn covers(&self, other: &BasePath) -> bool {
        other.0 == self.0
            || (other.0.starts_with(&self.0) && other.0.as_bytes()[self.0.len()] == b'/')
    }
}

/// The SHA-256 of an agent's token. The token itself is never stored.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenDigest(pub [u8; 32]);

impl TokenDigest {
    pub fn parse_hex(s: &str) -> Result<Self, String> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out)
            .map_err(|_| "must be 64 hex digits (the SHA-256 of the token)".to_string())?;
        Ok(Self(out))
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

/// A configured client of the gateway.
#[derive(Debug, Clone)]
pub struct Agent {
    pub id: String,
    pub token: TokenDigest,
    /// Overrides `v1.default_service` for this agent's v1 calls.
    pub default_service: Option<BusinessCode>,
    /// When set, the only business codes this agent may reach (v1 or v2).
    pub services: Option<Vec<BusinessCode>>,
    /// What happens to this agent's v1 calls.
    pub v1_policy: V1Policy,
    pub rate_limit: Option<RateLimit>,
}

impl Agent {
    /// Whether this agent may act on the service `code` (a raw path segment).
    pub fn may_use(&self, code: &str) -> bool {
        match &self.services {
            None => true,
            Some(allowed) => allowed.iter().any(|c| c.as_str() == code),
        }
    }
}

/// A token bucket's settings: `per_second` sustained, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

/// What happens to request bodies that break the spec's schemas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationMode {
    /// Answer 400 naming the field and rule; nothing reaches the backend.
    #[default]
    Enforce,
    /// Forward anyway, but count and log the violation.
    Report,
    /// Do not validate.
    Off,
}

/// Bounds on what a client may send, and how slowly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_uri_bytes: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub client_header_timeout: Duration,
    pub client_body_timeout: Duration,
    /// How long one write to a client may wait for it to read.
    pub client_send_timeout: Duration,
}

/// Authentication settings and the agent table, keyed by agent id.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub require_on_status: bool,
    pub agents: HashMap<String, Agent>,
}

/// The backend: pre-resolved addresses with peers built once, so no request resolves or allocates them.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub addresses: Vec<SocketAddr>,
    pub peers: Vec<HttpPeer>,
    /// Each peer's key in the connection pool: its address and TLS settings, hashed once.
    pub pool_keys: Vec<u64>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
    pub health_check_interval: Duration,
    pub health_check_path: Option<String>,
}

/// Settings that only take effect at process start (listeners, runtimes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupSettings {
    pub proxy_listen: SocketAddr,
    /// Certificate and key files of a TLS proxy listener.
    pub proxy_tls: Option<(String, String)>,
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

fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not an ip:port address"))
}

fn resolve_upstream(s: &str) -> Result<SocketAddr, String> {
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?} is not a resolvable host:port ({e})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

/// The host part of a `host:port` address (without brackets for IPv6).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Loads PEM CA certificates, each checked to be a usable trust anchor.
fn load_ca(path: &str) -> Result<Arc<pingora::protocols::tls::CaType>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let mut store = pingora::tls::RootCertStore::empty();
    let mut certs = Vec::new();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| format!("{path}: {e}"))?;
        store
            .add(cert.clone())
            .map_err(|e| format!("{path}: not a usable CA certificate: {e}"))?;
        certs.push(pingora::utils::tls::WrappedX509::new(
            cert.to_vec(),
            pingora::utils::tls::parse_x509,
        ));
    }
    if certs.is_empty() {
        return Err(format!("{path} holds no PEM certificate"));
    }
    Ok(Arc::from(certs.into_boxed_slice()))
}

fn parse_time(s: &str) -> Result<std::time::SystemTime, String> {
    humantime::parse_rfc3339(s)
        .map_err(|e| format!("{s:?} is not an RFC 3339 UTC time like 2027-06-01T00:00:00Z ({e})"))
}

/// Validates `[retirement]`; brownout agents must be configured agents.
fn retirement(
    f: &file::RetirementFile,
    agents: &HashMap<String, Agent>,
    p: &mut Problems,
) -> Retirement {
    let mut r = Retirement {
        deprecated_at: f
            .deprecated_at
            .as_deref()
            .and_then(|s| p.check("retirement.deprecated_at", parse_time(s))),
        sunset_at: f
            .sunset_at
            .as_deref()
            .and_then(|s| p.check("retirement.sunset_at", parse_time(s))),
        link: f.link.clone(),
        enforce_sunset: f.enforce_sunset,
        brownouts: Vec::new(),
        quiet_days: f.quiet_days,
        headers: Vec::new(),
    };
    if let Some(link) = &f.link {
        let ok = (link.starts_with("https://") || link.starts_with("http://"))
            && link
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'<' && b != b'>' && b != b'"');
        if !ok {
            p.push(
                "retirement.link",
                "must be an http(s) URL without spaces, quotes or angle brackets",
            );
        }
    }
    if f.enforce_sunset && f.sunset_at.is_none() {
        p.push("retirement.enforce_sunset", "needs retirement.sunset_at");
    }
    for (i, b) in f.brownouts.iter().enumerate() {
        let key = format!("retirement.brownouts[{i}]");
        let start = p.check(format!("{key}.start"), parse_time(&b.start));
        let end = p.check(format!("{key}.end"), parse_time(&b.end));
        let percent = b.percent.unwrap_or(100);
        if !(1..=100).contains(&percent) {
            p.push(format!("{key}.percent"), "must be 1 to 100");
        }
        if let Some(list) = &b.agents {
            for (j, id) in list.iter().enumerate() {
                if !agents.contains_key(id) {
                    p.push(
                        format!("{key}.agents[{j}]"),
                        format!("{id:?} is not a configured agent"),
                    );
                }
            }
        }
        match (start, end) {
            (Some(start), Some(end)) if start < end => r.brownouts.push(Brownout {
                start,
                end,
                percent,
                agents: b.agents.clone(),
            }),
            (Some(_), Some(_)) => p.push(format!("{key}.end"), "must be after start"),
            _ => {}
        }
    }
    r.render_headers();
    r
}

fn millis(key: &str, ms: u64, problems: &mut Problems) -> Duration {
    if ms == 0 {
        problems.push(key, "must be greater than 0");
    }
    Duration::from_millis(ms)
}

impl Snapshot {
    /// Read, parse and validate a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parse and validate the text of a config file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: FileConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        Self::from_file(file)
    }

    /// Validate a parsed file, reporting every problem at once.
    pub fn from_file(f: FileConfig) -> Result<Self, ConfigError> {
        let mut p = Problems::default();

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
        if f.server.threads == 0 {
            p.push("server.threads", "must be at least 1");
        }
        if f.server.upstream_keepalive_pool_size == 0 {
            p.push("server.upstream_keepalive_pool_size", "must be at least 1");
        }

        let v1_base = p.check("v1.base_path", BasePath::parse(&f.v1.base_path));
        let v2_base = p.check("v2.base_path", BasePath::parse(&f.v2.base_path));
        let upstream_base = p.check("upstream.base_path", BasePath::parse(&f.upstream.base_path));
        if let (Some(a), Some(b)) = (&v1_base, &v2_base) {
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
        let v1_default_service = p.check(
            "v1.default_service",
            BusinessCode::parse(&f.v1.default_service),
        );

        if f.upstream.addresses.is_empty() {
            p.push("upstream.addresses", "needs at least one host:port");
        }
        let addresses: Vec<SocketAddr> = f
            .upstream
            .addresses
            .iter()
            .enumerate()
            .filter_map(|(i, a)| p.check(format!("upstream.addresses[{i}]"), resolve_upstream(a)))
            .collect();
        let connect_timeout = millis(
            "upstream.connect_timeout_ms",
            f.upstream.connect_timeout_ms,
            &mut p,
        );
        let read_timeout = millis(
            "upstream.read_timeout_ms",
            f.upstream.read_timeout_ms,
            &mut p,
        );
        let idle_timeout = millis(
            "upstream.idle_timeout_ms",
            f.upstream.idle_timeout_ms,
            &mut p,
        );

        let mut agents = HashMap::new();
        let mut seen_ids = std::collections::HashSet::new();
        for (i, a) in f.auth.agents.iter().enumerate() {
            let key = format!("auth.agents[{i}]");
            if a.id.is_empty() || a.id.len() > 128 || !a.id.bytes().all(|b| b.is_ascii_graphic()) {
                p.push(
                    format!("{key}.id"),
                    "must be 1 to 128 visible ASCII characters",
                );
            }
            let token = p.check(
                format!("{key}.token_sha256"),
                TokenDigest::parse_hex(&a.token_sha256),
            );
            let default_service = match &a.default_service {
                None => Some(None),
                Some(s) => p
                    .check(format!("{key}.default_service"), BusinessCode::parse(s))
                    .map(Some),
            };
            let services = a.services.as_ref().map(|list| {
                list.iter()
                    .enumerate()
                    .filter_map(|(j, s)| {
                        p.check(format!("{key}.services[{j}]"), BusinessCode::parse(s))
                    })
                    .collect::<Vec<_>>()
            });
            if let (Some(Some(d)), Some(list)) = (&default_service, &services) {
                if !list.contains(d) {
                    p.push(
                        format!("{key}.default_service"),
                        format!("{:?} is not in this agent's services", d.as_str()),
                    );
                }
            }
            if !seen_ids.insert(a.id.as_str()) {
                p.push(
                    format!("{key}.id"),
                    format!("duplicate agent id {:?}", a.id),
                );
                continue;
            }
            let rate_limit = match (a.rate_limit_per_second, a.burst) {
                (None, None) => None,
                (None, Some(_)) => {
                    p.push(format!("{key}.burst"), "needs rate_limit_per_second");
                    None
                }
                (Some(rate), burst) if rate.is_finite() && rate > 0.0 => Some(RateLimit {
                    per_second: rate,
                    burst: burst.unwrap_or_else(|| rate.ceil().max(1.0) as u32).max(1),
                }),
                (Some(_), _) => {
                    p.push(
                        format!("{key}.rate_limit_per_second"),
                        "must be a positive number",
                    );
                    None
                }
            };
            if let (Some(token), Some(default_service)) = (token, default_service) {
                agents.insert(
                    a.id.clone(),
                    Agent {
                        id: a.id.clone(),
                        token,
                        default_service,
                        services,
                        v1_policy: a.v1_policy,
                        rate_limit,
                    },
                );
            }
        }

        let retirement = retirement(&f.retirement, &agents, &mut p);
        for (key, value) in [
            ("limits.max_body_bytes", f.limits.max_body_bytes),
            ("limits.max_uri_bytes", f.limits.max_uri_bytes),
            ("limits.max_header_bytes", f.limits.max_header_bytes),
            ("limits.max_headers", f.limits.max_headers),
        ] {
            if value == 0 {
                p.push(key, "must be greater than 0");
            }
        }
        if f.limits.max_headers > http1::MAX_HEADERS {
            p.push(
                "limits.max_headers",
                format!(
                    "must be at most {} (the request parser's table)",
                    http1::MAX_HEADERS
                ),
            );
        }
        let limits = Limits {
            max_body_bytes: f.limits.max_body_bytes,
            max_uri_bytes: f.limits.max_uri_bytes,
            max_header_bytes: f.limits.max_header_bytes,
            max_headers: f.limits.max_headers,
            client_header_timeout: millis(
                "limits.client_header_timeout_ms",
                f.limits.client_header_timeout_ms,
                &mut p,
            ),
            client_body_timeout: millis(
                "limits.client_body_timeout_ms",
                f.limits.client_body_timeout_ms,
                &mut p,
            ),
            client_send_timeout: millis(
                "limits.client_send_timeout_ms",
                f.limits.client_send_timeout_ms,
                &mut p,
            ),
        };
        let health_check_interval = millis(
            "upstream.health_check_interval_ms",
            f.upstream.health_check_interval_ms,
            &mut p,
        );
        if f.upstream.tls && f.upstream.health_check_path.is_some() {
            p.push(
                "upstream.health_check_path",
                "HTTP health checks are not supported over upstream.tls; the check is then a TCP connect",
            );
        }
        if let Some(path) = &f.upstream.health_check_path {
            if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
                p.push(
                    "upstream.health_check_path",
                    "must be an absolute path without spaces",
                );
            }
        }

        let upstream_ca = match &f.upstream.tls_ca_file {
            None => None,
            Some(path) => p.check("upstream.tls_ca_file", load_ca(path)),
        };
        if !p.0.is_empty() {
            return Err(ConfigError::Invalid(p.0));
        }
        let (Some(proxy_listen), Some(admin_listen), Some(v1), Some(v2), Some(up), Some(code)) = (
            proxy_listen,
            admin_listen,
            v1_base,
            v2_base,
            upstream_base,
            v1_default_service,
        ) else {
            return Err(ConfigError::Invalid(p.0));
        };
        if !p.0.is_empty() {
            return Err(ConfigError::Invalid(p.0));
        }

        let peers: Vec<HttpPeer> = addresses
            .iter()
            .zip(&f.upstream.addresses)
            .map(|(addr, written)| {
                let sni = match &f.upstream.tls_sni {
                    Some(name) => name.clone(),
                    None => host_of(written).to_owned(),
                };
                let mut peer = HttpPeer::new(*addr, f.upstream.tls, sni);
                peer.options.connection_timeout = Some(connect_timeout);
                peer.options.idle_timeout = Some(idle_timeout);
                peer.options.verify_cert = f.upstream.tls_verify;
                peer.options.verify_hostname = f.upstream.tls_verify;
                peer.options.ca = upstream_ca.clone();
                peer
            })
            .collect();
        let pool_keys = peers.iter().map(Peer::reuse_hash).collect();

        Ok(Snapshot {
            startup: StartupSettings {
                proxy_listen,
                proxy_tls,
                admin_listen,
                threads: f.server.threads,
                grace_period_seconds: f.server.grace_period_seconds,
                work_stealing: f.server.work_stealing,
                upstream_keepalive_pool_size: f.server.upstream_keepalive_pool_size,
                watch_config: f.server.watch_config,
                upgrade_sock: f.server.upgrade_sock,
            },
            bases: Bases {
                v1,
                v2,
                upstream: up,
            },
            v1_default_service: code,
            upstream: UpstreamConfig {
                addresses,
                peers,
                pool_keys,
                connect_timeout,
                read_timeout,
                idle_timeout,
                health_check_interval,
                health_check_path: f.upstream.health_check_path,
            },
            auth: AuthConfig {
                require_on_status: f.auth.require_on_status,
                agents,
            },
            limits,
            validation: f.validation.mode,
            retirement,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";

    fn minimal() -> String {
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
token_sha256 = "{DIGEST}"
"#
        )
    }

    fn problems(text: &str) -> Vec<String> {
        match Snapshot::parse(text) {
            Ok(_) => panic!("expected the config to be refused"),
            Err(e) => e.problems().into_iter().map(|p| p.key).collect(),
        }
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let s = Snapshot::parse(&minimal()).unwrap();
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
        assert_eq!(s.auth.agents["agent-1"].token.0[0], 0x2b);
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
token_sha256 = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
services = ["ok", "bad code"]
"#;
        let keys = problems(text);
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
    fn unknown_keys_are_refused() {
        let text = minimal().replace("[v1]", "[v1]\ndefault_servce = \"X\"");
        let err = Snapshot::parse(&text).unwrap_err().to_string();
        assert!(err.contains("default_servce"), "{err}");
    }

    #[test]
    fn overlapping_bases_are_refused() {
        let text = minimal().replace("[v1]", "[v1]\nbase_path = \"/api\"");
        assert_eq!(problems(&text), vec!["v2.base_path"]);
    }

    #[test]
    fn bad_base_paths_are_refused() {
        for bad in [
            "api/v1",
            "/",
            "/api/",
            "/api//v1",
            "/api/../v1",
            "/api/v%31",
        ] {
            assert!(BasePath::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(BasePath::parse("/gw/api/v1").is_ok());
    }

    #[test]
    fn business_codes_are_single_safe_segments() {
        for bad in ["", ".", "..", "a/b", "a b", "a%2Fb", "é"] {
            assert!(BusinessCode::parse(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["ORG_DEFAULT", "a.b", "x~y-z", "..."] {
            assert!(BusinessCode::parse(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn rate_limits() {
        let s = Snapshot::parse(&(minimal() + "rate_limit_per_second = 2.5\n")).unwrap();
        assert_eq!(
            s.auth.agents["agent-1"].rate_limit,
            Some(RateLimit {
                per_second: 2.5,
                burst: 3
            })
        );
        assert_eq!(
            problems(&(minimal() + "rate_limit_per_second = 0.0\n")),
            vec!["auth.agents[0].rate_limit_per_second"]
        );
        assert_eq!(
            problems(&(minimal() + "burst = 3\n")),
            vec!["auth.agents[0].burst"]
        );
    }

    #[test]
    fn agent_default_service_must_be_in_its_services() {
        let text = minimal() + "default_service = \"OTHER\"\nservices = [\"ORG_DEFAULT\"]\n";
        assert_eq!(problems(&text), vec!["auth.agents[0].default_service"]);
    }

    #[test]
    fn zero_timeouts_and_limits_are_refused() {
        let text = minimal().replace(
            "[upstream]",
            "[limits]\nmax_body_bytes = 0\n[upstream]\nconnect_timeout_ms = 0",
        );
        let keys = problems(&text);
        assert!(keys.contains(&"upstream.connect_timeout_ms".to_string()));
        assert!(keys.contains(&"limits.max_body_bytes".to_string()));
    }

    #[test]
    fn max_headers_cannot_exceed_the_parsers_table() {
        let with = |n: usize| {
            minimal().replace(
                "[upstream]",
                &format!("[limits]\nmax_headers = {n}\n[upstream]"),
            )
        };
        assert!(Snapshot::parse(&with(http1::MAX_HEADERS)).is_ok());
        assert_eq!(
            problems(&with(http1::MAX_HEADERS + 1)),
            ["limits.max_headers"]
        );
    }
}
