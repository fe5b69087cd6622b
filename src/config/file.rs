//! The config file as written: serde structs that mirror the TOML one to one, each refusing
//! keys it does not know. They are also the file's schema ([`super::schema`]): a key that
//! takes milliseconds is named `*_ms`, and gets its duration sibling (`read_timeout = "2s"`)
//! from that name alone ([`super::document`] reads a file's text into these).
//!
//! Every default is written once, here: each section is `#[serde(default)]` with a `Default`
//! impl, and a key the file must set (`listen.proxy`, `upstream.addresses`, an agent's `id`)
//! defaults to empty, which validation refuses as missing, with the file's other problems.
//! Nothing here is trusted: [`super::Snapshot::from_file`] turns a [`FileConfig`] into the
//! validated snapshot that the gateway actually runs on.

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::client::redact::redact_url;

/// The public v2 base, which is also the backend's unless `upstream.base_path` says otherwise.
const V2_BASE: &str = "/api/v2";

/// The whole TOML document.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub listen: ListenFile,
    #[serde(default)]
    pub server: ServerFile,
    #[serde(default)]
    pub v1: V1File,
    #[serde(default)]
    pub v2: V2File,
    #[serde(default)]
    pub upstream: UpstreamFile,
    #[serde(default)]
    pub auth: AuthFile,
    #[serde(default)]
    pub limits: LimitsFile,
    #[serde(default)]
    pub retirement: RetirementFile,
    #[serde(default)]
    pub validation: ValidationFile,
    #[serde(default)]
    pub rate_limit: RateLimitFile,
    #[serde(default)]
    pub tracing: TracingFile,
    #[serde(default)]
    pub admin: AdminFile,
}

/// The agents file (`auth.agents_file`): `[[agents]]` tables in the shape of `[[auth.agents]]`,
/// kept apart from the config so that the credentials can live in a secret of their own.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsFile {
    #[serde(default)]
    pub agents: Vec<AgentFile>,
}

/// `[listen]`: where the gateway accepts connections.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenFile {
    /// `ip:port` of the proxy listener (required).
    pub proxy: String,
    /// `ip:port` of the admin listener (`/metrics`, `/healthz`, `/readyz`, `POST /-/reload`);
    /// absent: none.
    pub admin: Option<String>,
    /// PEM certificate chain: with `tls_key`, the proxy listener speaks TLS.
    pub tls_cert: Option<String>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<String>,
    /// Serve HTTP/2 to clients that ask for it: ALPN `h2` on the TLS listener, the HTTP/2
    /// preface (prior knowledge, h2c) on a plaintext one. Every other connection is HTTP/1.1.
    pub http2: bool,
    /// Addresses and networks (`10.0.0.0/8`, `192.0.2.7`) of the proxies in front of the
    /// gateway: from such a peer, the client is the right-most untrusted `X-Forwarded-For`
    /// address. Empty: `X-Forwarded-For` is never believed.
    pub trusted_proxies: Vec<String>,
    /// Every connection to the proxy listener opens with a PROXY protocol header (v1 or v2), as
    /// AWS NLB and HAProxy send it: its source address is the peer's.
    pub proxy_protocol: bool,
}

impl Default for ListenFile {
    fn default() -> Self {
        Self {
            proxy: String::new(),
            admin: None,
            tls_cert: None,
            tls_key: None,
            http2: true,
            trusted_proxies: Vec::new(),
            proxy_protocol: false,
        }
    }
}

/// `[server]`: the process: threads, runtimes, shutdown and upgrades.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerFile {
    /// Worker threads of the proxy service; absent, one per CPU the process may run on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Seconds that SIGTERM waits for in-flight requests before exiting.
    pub grace_period_seconds: u64,
    /// Tokio's work-stealing runtime (true) or one single-threaded runtime per thread.
    pub work_stealing: bool,
    /// Idle kept-alive connections per upstream pool.
    pub upstream_keepalive_pool_size: usize,
    /// Reload when the config file changes on disk (SIGHUP and `POST /-/reload` always work).
    pub watch_config: bool,
    /// Unix socket over which SIGQUIT hands the listeners to a process started with `--upgrade`,
    /// in a directory only the gateway's user (or root) can write.
    pub upgrade_sock: String,
    /// `/readyz` also fails while no upstream address passes its health check. Off by default:
    /// a backend outage is the gateway's to answer (502/504), not a reason to leave the Service.
    pub readiness_requires_upstream: bool,
}

impl Default for ServerFile {
    fn default() -> Self {
        Self {
            threads: None,
            grace_period_seconds: 5,
            // One single-threaded runtime per thread measured 1.09x the requests/s of tokio's
            // work-stealing runtime (benches/compare.sh).
            work_stealing: false,
            upstream_keepalive_pool_size: 256,
            watch_config: true,
            // systemd's `RuntimeDirectory=agent-gateway`: a directory only the service's user
            // can write ([`super::upgrade_sock`]). Where it is not made, only root could make it.
            upgrade_sock: "/run/agent-gateway/upgrade.sock".into(),
            readiness_requires_upstream: false,
        }
    }
}

/// `[v1]`: the legacy interface.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct V1File {
    /// Where v1 is served.
    pub base_path: String,
    /// The business code put into the v2 path of a v1 call whose agent has none of its own
    /// (required: the empty default is refused).
    pub default_service: String,
}

impl Default for V1File {
    fn default() -> Self {
        Self {
            base_path: "/api/v1".into(),
            default_service: String::new(),
        }
    }
}

/// `[v2]`: the current interface.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct V2File {
    /// Where v2 is served; must not overlap `v1.base_path`.
    pub base_path: String,
}

impl Default for V2File {
    fn default() -> Self {
        Self {
            base_path: V2_BASE.into(),
        }
    }
}

/// `[upstream]`: the v2 backend.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamFile {
    /// One or more `host:port` (required): an IP address, or a name whose every A/AAAA record
    /// is an address of the rotation, looked up again as its TTL says.
    pub addresses: Vec<String>,
    /// Speak TLS to the backend.
    pub tls: bool,
    /// PEM CA certificates the backend's certificate must chain to (default: the system's).
    pub tls_ca_file: Option<String>,
    /// Server name sent and verified (default: the host part of each address).
    pub tls_sni: Option<String>,
    /// Verify the backend's certificate and name. Turning this off is for tests only.
    pub tls_verify: bool,
    /// The backend's v2 base, under which requests are forwarded.
    pub base_path: String,
    /// Time allowed to connect (and complete a TLS handshake) to the backend.
    pub connect_timeout_ms: u64,
    /// Time allowed for each read from the backend.
    pub read_timeout_ms: u64,
    /// How long an idle kept-alive upstream connection stays in the pool.
    pub idle_timeout_ms: u64,
    /// How often each address is health-checked.
    pub health_check_interval_ms: u64,
    /// `GET` this path for the check (a 2xx or 3xx answer is healthy); absent: a TCP connect.
    pub health_check_path: Option<String>,
    /// A name is looked up again no sooner than this after an answer, whatever its TTL.
    pub dns_min_ttl_ms: u64,
    /// A name is looked up again no later than this after an answer, whatever its TTL.
    pub dns_max_ttl_ms: u64,
    /// DNS servers (`ip:port`, or an IP for port 53) asked instead of `/etc/resolv.conf`'s.
    pub resolvers: Vec<String>,
    /// Start even when a name of `addresses` does not resolve (it joins once it does).
    pub allow_unresolved_at_start: bool,
    /// The most connections open to one address, idle ones included; absent: unlimited.
    pub max_connections_per_address: Option<usize>,
    /// The most requests waiting for a connection, all addresses together; past it, 503.
    pub max_pending: usize,
    /// The longest a request waits for a connection before it is answered 503.
    pub pending_timeout_ms: u64,
    /// Consecutive failures (connect, reset, protocol, an answer broken before its body) that
    /// eject an address; 0: never.
    pub eject_after_failures: u32,
    /// How long a first ejection lasts; each repeat doubles it, up to a cap.
    pub eject_ms: u64,
}

impl UpstreamFile {
    /// The backend at `addresses`, every other setting at its default.
    pub fn new(addresses: Vec<String>) -> Self {
        Self {
            addresses,
            ..Self::default()
        }
    }
}

impl Default for UpstreamFile {
    fn default() -> Self {
        Self {
            addresses: Vec::new(),
            tls: false,
            tls_ca_file: None,
            tls_sni: None,
            tls_verify: true,
            base_path: V2_BASE.into(),
            connect_timeout_ms: 1000,
            read_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            health_check_interval_ms: 1000,
            health_check_path: None,
            dns_min_ttl_ms: 1000,
            dns_max_ttl_ms: 300_000,
            resolvers: Vec::new(),
            allow_unresolved_at_start: false,
            max_connections_per_address: None,
            max_pending: 1024,
            pending_timeout_ms: 5000,
            eject_after_failures: 3,
            eject_ms: 10_000,
        }
    }
}

/// `[auth]`: who may call, and with what.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthFile {
    /// Whether `GET .../status` needs credentials too (every POST does).
    pub require_on_status: bool,
    /// A file of `[[agents]]` (relative to the config's directory), read and watched with the
    /// config: the agents' digests kept out of the config, in a secret of their own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents_file: Option<String>,
    /// Failed authentications (401s) a client address may have in a minute; past it, its
    /// requests get 429 until the minute is over. Absent: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_failures_per_minute: Option<u32>,
    /// `[[auth.agents]]`: the gateway's clients.
    pub agents: Vec<AgentFile>,
}

impl Default for AuthFile {
    fn default() -> Self {
        Self {
            require_on_status: true,
            agents_file: None,
            max_failures_per_minute: None,
            agents: Vec::new(),
        }
    }
}

/// A hex SHA-256 digest, as `[[auth.agents.tokens]] sha256` takes it. Of a value of another
/// type the message never repeats the value, as for [`Digests`].
fn one_digest<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    String::deserialize(d).map_err(|_: D::Error| de::Error::custom("must be a hex SHA-256 digest"))
}

/// One SHA-256 digest or a list of them, as `token_sha256` takes: `"ab12.."` or
/// `["ab12..", "cd34.."]` (written back the way it came: one as a string).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Digests(pub Vec<String>);

impl Digests {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Digests {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_str(one),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Digests {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OneOrMany;
        impl<'de> Visitor<'de> for OneOrMany {
            type Value = Digests;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a hex SHA-256 digest or a list of them")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Digests, E> {
                Ok(Digests(vec![v.to_owned()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Digests, A::Error> {
                let mut all = Vec::new();
                while let Some(one) = seq.next_element::<String>()? {
                    all.push(one);
                }
                Ok(Digests(all))
            }
        }
        // Of a value of another type the message says what is expected and never repeats
        // the value: a token pasted here by mistake stays out of every problem report.
        d.deserialize_any(OneOrMany).map_err(|_: D::Error| {
            de::Error::custom("must be a hex SHA-256 digest or a list of them")
        })
    }
}

/// `[[auth.agents]]`: one client of the gateway.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    /// What it sends as `X-Service-Agent-Id`: 1 to 128 visible ASCII characters, unique
    /// (required).
    #[serde(default)]
    pub id: String,
    /// The SHA-256 of its `X-Auth-Token`, in hex, or a list of them (each token in it is
    /// accepted: a rotation adds the new one, then removes the old one); the token itself is
    /// never configured. This or `tokens` is required.
    #[serde(default, skip_serializing_if = "Digests::is_empty")]
    pub token_sha256: Digests,
    /// `[[auth.agents.tokens]]`: tokens with a planned end (`not_after`), beside or instead of
    /// `token_sha256`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenFile>,
    /// Its business code for v1 calls, instead of `v1.default_service`.
    pub default_service: Option<String>,
    /// The only business codes it may reach, v1 or v2 (absent: any).
    pub services: Option<Vec<String>>,
    /// What happens to its v1 calls: `allow` (the default), `block` or `exempt`.
    #[serde(default)]
    pub v1_policy: super::V1Policy,
    /// Sustained requests per second this agent may make (absent: unlimited).
    pub rate_limit_per_second: Option<f64>,
    /// Requests it may make at once above the sustained rate (default: one second's worth).
    pub burst: Option<u32>,
    /// RFC 3339 time: this agent's `Deprecation`, instead of `retirement.deprecated_at`.
    pub deprecated_at: Option<String>,
    /// RFC 3339 time: this agent's `Sunset` (and, with `retirement.enforce_sunset`, its
    /// cut-off), instead of `retirement.sunset_at`.
    pub sunset_at: Option<String>,
}

/// `[[auth.agents.tokens]]`: one token of an agent, which may expire.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    /// The SHA-256 of the token, in hex (required).
    #[serde(default, deserialize_with = "one_digest")]
    pub sha256: String,
    /// RFC 3339 time: from then on the token fails as a wrong one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
}

/// `[limits]`: what a client may send, and how slowly.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsFile {
    /// Largest request body accepted; larger gets 413, and is never buffered.
    pub max_body_bytes: usize,
    /// Longest request target (path and query) accepted; longer gets 414.
    pub max_uri_bytes: usize,
    /// Largest total of header names and values accepted; larger gets 431.
    pub max_header_bytes: usize,
    /// Most header fields accepted; more gets 431.
    pub max_headers: usize,
    /// Time allowed to receive a request header (also bounds keep-alive idle time).
    pub client_header_timeout_ms: u64,
    /// Time allowed to receive a whole request body.
    pub client_body_timeout_ms: u64,
    /// Time a client may leave the gateway's answer unread before the connection is closed.
    pub client_send_timeout_ms: u64,
    /// Streams an HTTP/2 client may have open at once on one connection.
    pub h2_max_concurrent_streams: u32,
}

impl Default for LimitsFile {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            max_uri_bytes: 8 * 1024,
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            client_header_timeout_ms: 10_000,
            client_body_timeout_ms: 10_000,
            client_send_timeout_ms: 10_000,
            h2_max_concurrent_streams: 100,
        }
    }
}

/// `[validation]`: what happens to request bodies that break the spec's schemas.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationFile {
    /// `enforce` (the default: 400), `report` (forward, count and log) or `off`.
    pub mode: super::ValidationMode,
}

/// `retirement.quiet_days` when the file does not set it; also what `v1-usage --prometheus`
/// assumes when no replica published its own.
pub const DEFAULT_QUIET_DAYS: u32 = 14;

/// `[retirement]`: the end of v1: its dates, the link, enforcement and brownouts.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetirementFile {
    /// RFC 3339 time, sent as `Deprecation: @<unix seconds>` on v1 responses.
    pub deprecated_at: Option<String>,
    /// RFC 3339 time, sent as an HTTP-date `Sunset` header on v1 responses.
    pub sunset_at: Option<String>,
    /// Where clients learn about the migration; sent as `Link` with rel deprecation/sunset.
    pub link: Option<String>,
    /// Refuse v1 for every non-exempt agent once `sunset_at` has passed.
    pub enforce_sunset: bool,
    /// An agent with no v1 call for this many days is reported as safe to block.
    pub quiet_days: u32,
    /// `[[retirement.brownouts]]`: scheduled windows that refuse a share of v1 calls.
    pub brownouts: Vec<BrownoutFile>,
    /// A Prometheus that scrapes every replica: the admin listener's retirement board shows
    /// the fleet's figures from it, as `v1-usage --prometheus` does.
    pub prometheus_url: Option<String>,
    /// PEM CA certificates `prometheus_url`'s certificate must chain to.
    pub prometheus_ca_file: Option<String>,
    /// A file holding a bearer token for `prometheus_url`, read at each use.
    pub prometheus_token_file: Option<String>,
    /// A file holding `user:password` for `prometheus_url`, read at each use.
    pub prometheus_basic_auth_file: Option<String>,
    /// PromQL label matchers (`job="agent-gateway",namespace="prod"`) that pick this
    /// deployment's series out of `prometheus_url`, when it scrapes others too.
    pub prometheus_selector: Option<String>,
}

impl Default for RetirementFile {
    fn default() -> Self {
        Self {
            deprecated_at: None,
            sunset_at: None,
            link: None,
            enforce_sunset: false,
            quiet_days: DEFAULT_QUIET_DAYS,
            brownouts: Vec::new(),
            prometheus_url: None,
            prometheus_ca_file: None,
            prometheus_token_file: None,
            prometheus_basic_auth_file: None,
            prometheus_selector: None,
        }
    }
}

/// By hand, so that a password in `link` or `prometheus_url` (each refused one, but held here
/// as written until validation refuses it) is never printed; each field named, so that one
/// added later is placed here too.
impl std::fmt::Debug for RetirementFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            deprecated_at,
            sunset_at,
            link,
            enforce_sunset,
            quiet_days,
            brownouts,
            prometheus_url,
            prometheus_ca_file,
            prometheus_token_file,
            prometheus_basic_auth_file,
            prometheus_selector,
        } = self;
        f.debug_struct("RetirementFile")
            .field("deprecated_at", deprecated_at)
            .field("sunset_at", sunset_at)
            .field("link", &link.as_deref().map(redact_url))
            .field("enforce_sunset", enforce_sunset)
            .field("quiet_days", quiet_days)
            .field("brownouts", brownouts)
            .field("prometheus_url", &prometheus_url.as_deref().map(redact_url))
            .field("prometheus_ca_file", prometheus_ca_file)
            .field("prometheus_token_file", prometheus_token_file)
            .field("prometheus_basic_auth_file", prometheus_basic_auth_file)
            .field("prometheus_selector", prometheus_selector)
            .finish()
    }
}

/// `[[retirement.brownouts]]`: one window, or with `repeat` a window that recurs until `until`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BrownoutFile {
    /// RFC 3339 time: the (first) window's start (required).
    #[serde(default)]
    pub start: String,
    /// RFC 3339 time: the (first) window's end (required).
    #[serde(default)]
    pub end: String,
    /// Share of v1 calls refused at `start`, 1 to 100 (default 100).
    pub percent: Option<u8>,
    /// Share refused at the end of the schedule (`end`, or `until` when recurring), rising
    /// linearly from `percent` (default: `percent`, a flat share).
    pub percent_end: Option<u8>,
    /// The window recurs every day or every week, keeping its time of day and length.
    pub repeat: Option<super::Repeat>,
    /// RFC 3339 time: no window starts at or after it (required with `repeat`).
    pub until: Option<String>,
    /// With `repeat = "daily"`: only windows that start on these UTC days (`mon` to `sun`).
    pub days: Option<Vec<super::Weekday>>,
    /// The agents it applies to (absent: every agent that is not exempt).
    pub agents: Option<Vec<String>>,
}

/// `[rate_limit]`: where the per-agent limits are kept.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitFile {
    /// `local` (this process's buckets) or `redis` (shared by every replica).
    pub backend: super::RateLimitBackend,
    /// `redis://[user:password@]host:port/db`, or `rediss://` for TLS.
    pub redis_url: Option<String>,
    /// A file holding the Redis password (relative to the config's directory; a trailing
    /// newline is not part of it), instead of a password in `redis_url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_password_file: Option<String>,
    /// PEM CAs a `rediss://` server's certificate must chain to (default: the system's).
    pub redis_ca_file: Option<String>,
    /// What a rate-limited agent's request gets when Redis does not answer in time.
    pub on_redis_error: super::OnRedisError,
    /// Bound on each Redis call, in milliseconds.
    pub timeout_ms: u64,
    /// Put before each agent id to make its Redis key.
    pub key_prefix: String,
}

impl Default for RateLimitFile {
    fn default() -> Self {
        Self {
            backend: super::RateLimitBackend::Local,
            redis_url: None,
            redis_password_file: None,
            redis_ca_file: None,
            on_redis_error: super::OnRedisError::Local,
            timeout_ms: 50,
            key_prefix: "agent-gateway:".into(),
        }
    }
}

/// By hand, so that a password in `redis_url` is never printed; each field named, so that one
/// added later is placed here too.
impl std::fmt::Debug for RateLimitFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            backend,
            redis_url,
            redis_password_file,
            redis_ca_file,
            on_redis_error,
            timeout_ms,
            key_prefix,
        } = self;
        f.debug_struct("RateLimitFile")
            .field("backend", backend)
            .field("redis_url", &redis_url.as_deref().map(redact_url))
            .field("redis_password_file", redis_password_file)
            .field("redis_ca_file", redis_ca_file)
            .field("on_redis_error", on_redis_error)
            .field("timeout_ms", timeout_ms)
            .field("key_prefix", key_prefix)
            .finish()
    }
}

/// `[tracing]`: W3C trace context and spans exported over OTLP/HTTP (protobuf).
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingFile {
    /// The collector's OTLP/HTTP base URL (`http://host:4318`); spans go to its `/v1/traces`.
    /// Absent: tracing is off.
    pub otlp_endpoint: Option<String>,
    /// Share of new traces recorded, 0.0-1.0. Parent-based: a request that arrives with a
    /// `traceparent` follows its sampled flag instead.
    pub sample_ratio: f64,
    /// `service.name` of every span.
    pub service_name: String,
    /// Finished spans waiting for export; past this they are dropped (and counted).
    pub max_queue_size: usize,
    /// Most spans in one export request.
    pub max_export_batch_size: usize,
    /// Longest a finished span waits before its batch is sent.
    pub scheduled_delay_ms: u64,
    /// How long one export may take before it counts as failed.
    pub export_timeout_ms: u64,
}

impl Default for TracingFile {
    fn default() -> Self {
        // OpenTelemetry's own defaults (OTEL_BSP_*), except the timeout: an export that hangs
        // holds up the ones behind it, so it gives up after 10 s rather than 30.
        Self {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: "agent-gateway".into(),
            max_queue_size: 2048,
            max_export_batch_size: 512,
            scheduled_delay_ms: 5000,
            export_timeout_ms: 10_000,
        }
    }
}

/// By hand, so that a password in `otlp_endpoint` is never printed; each field named, so that
/// one added later is placed here too.
impl std::fmt::Debug for TracingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            otlp_endpoint,
            sample_ratio,
            service_name,
            max_queue_size,
            max_export_batch_size,
            scheduled_delay_ms,
            export_timeout_ms,
        } = self;
        f.debug_struct("TracingFile")
            .field("otlp_endpoint", &otlp_endpoint.as_deref().map(redact_url))
            .field("sample_ratio", sample_ratio)
            .field("service_name", service_name)
            .field("max_queue_size", max_queue_size)
            .field("max_export_batch_size", max_export_batch_size)
            .field("scheduled_delay_ms", scheduled_delay_ms)
            .field("export_timeout_ms", export_timeout_ms)
            .finish()
    }
}

/// `[admin]`: who may use the admin listener.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminFile {
    /// The SHA-256 of the admin token, in hex, or a list of them: when set, every admin
    /// endpoint but `/healthz`, `/readyz` and `/metrics` needs `Authorization: Bearer <token>`
    /// (the GET endpoints also take it as a browser's Basic password).
    #[serde(skip_serializing_if = "Digests::is_empty")]
    pub token_sha256: Digests,
    /// `/metrics` needs the admin token too.
    pub protect_metrics: bool,
}
