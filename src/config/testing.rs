//! A typed config for unit tests, integration tests and benches: [`FileConfig`] filled in for
//! a gateway in front of given backends, with one agent ([`AGENT_ID`], token [`TOKEN`]).
//! Tests change its fields, never TOML text; [`FileConfig::to_toml`] writes the file a
//! spawned gateway reads. Compiled for this crate's unit tests and with the `test-util`
//! feature (which the integration tests and benches get from the dev-dependency on the crate
//! itself), never into the shipped build: its helpers panic.

use std::net::SocketAddr;

use super::file::{
    AdminFile, AgentFile, AuthFile, BrownoutFile, Digests, LimitsFile, ListenFile, RateLimitFile,
    RetirementFile, ServerFile, TracingFile, UpstreamFile, V1File, V2File, ValidationFile,
};
use super::{FileConfig, Snapshot, TokenDigest, V1Policy};

/// The agent every test config has.
pub const AGENT_ID: &str = "agent-1";
/// Its token.
pub const TOKEN: &str = "secret";
/// `v1.default_service` of every test config.
pub const DEFAULT_SERVICE: &str = "ORG_DEFAULT";

impl FileConfig {
    /// A gateway listening on `proxy`, forwarding to `upstreams`, with [`AGENT_ID`] and every
    /// other setting at its default.
    pub fn for_test(proxy: SocketAddr, upstreams: &[SocketAddr]) -> Self {
        FileConfig {
            listen: ListenFile {
                proxy: proxy.to_string(),
                ..ListenFile::default()
            },
            server: ServerFile::default(),
            v1: V1File {
                default_service: DEFAULT_SERVICE.into(),
                ..V1File::default()
            },
            v2: V2File::default(),
            upstream: UpstreamFile::new(upstreams.iter().map(ToString::to_string).collect()),
            auth: AuthFile {
                agents: vec![AgentFile::new(AGENT_ID, TOKEN)],
                ..AuthFile::default()
            },
            limits: LimitsFile::default(),
            retirement: RetirementFile::default(),
            validation: ValidationFile::default(),
            rate_limit: RateLimitFile::default(),
            tracing: TracingFile::default(),
            admin: AdminFile::default(),
        }
    }

    /// The file as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a config of plain values serializes")
    }

    /// The validated snapshot; panics on a config a test made invalid by mistake.
    pub fn snapshot(self) -> Snapshot {
        Snapshot::from_file(self).unwrap_or_else(|e| panic!("test config is invalid: {e}"))
    }

    /// The key paths of the problems of a config a test expects refused; panics when it is
    /// accepted.
    pub fn refused_keys(self) -> Vec<String> {
        match Snapshot::from_file(self) {
            Ok(_) => panic!("expected the config to be refused"),
            Err(e) => e.problems().into_iter().map(|p| p.key).collect(),
        }
    }

    /// The configured agent `id`.
    pub fn agent_mut(&mut self, id: &str) -> &mut AgentFile {
        self.auth
            .agents
            .iter_mut()
            .find(|a| a.id == id)
            .unwrap_or_else(|| panic!("no agent {id:?} in the test config"))
    }
}

impl AgentFile {
    /// An agent with `token` (stored as its digest) and nothing else set.
    pub fn new(id: &str, token: &str) -> Self {
        AgentFile {
            id: id.into(),
            token_sha256: Digests(vec![TokenDigest::of(token.as_bytes()).to_hex()]),
            tokens: Vec::new(),
            default_service: None,
            services: None,
            v1_policy: V1Policy::default(),
            rate_limit_per_second: None,
            burst: None,
            deprecated_at: None,
            sunset_at: None,
        }
    }
}

impl BrownoutFile {
    /// A brownout refusing every v1 call of every agent that is not exempt from `start` to
    /// `end` (RFC 3339), once.
    pub fn new(start: &str, end: &str) -> Self {
        BrownoutFile {
            start: start.into(),
            end: end.into(),
            percent: None,
            percent_end: None,
            repeat: None,
            until: None,
            days: None,
            agents: None,
        }
    }
}

/// A snapshot of [`FileConfig::for_test`] with placeholder addresses, for tests without
/// sockets.
pub fn snapshot() -> Snapshot {
    config().snapshot()
}

/// [`FileConfig::for_test`] with placeholder addresses, for tests without sockets.
pub fn config() -> FileConfig {
    FileConfig::for_test(
        SocketAddr::from(([127, 0, 0, 1], 8080)),
        &[SocketAddr::from(([127, 0, 0, 1], 9000))],
    )
}
