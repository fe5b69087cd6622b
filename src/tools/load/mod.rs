//! `agent-gateway load`: a load generator that speaks the Agent API.
//!
//! Two models:
//! - **Open** (`--rate N`): request `i` is due at `start + i / N`, whatever happened to earlier
//!   requests. A dispatcher thread releases requests on that schedule (with `nanosleep`
//!   precision, not tokio's 1 ms timer), any idle connection takes the next one, and latency is
//!   measured from the request's *intended* start. A slow server therefore shows up as latency
//!   rather than as a politely lower send rate (no coordinated omission).
//! - **Closed** (`--rate max`): every connection sends its next request as soon as the last
//!   answer is in; latency is measured from the actual send.
//!
//! The client is a minimal HTTP/1.1 keep-alive client over a plain `TcpStream` (http only),
//! one request in flight per connection. The pure parts (mix, schedule, bodies, request bytes,
//! response framing, the report) are plain functions tested below; the shell only moves bytes.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::{self, Write as _};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::api::operation::{ApiVersion, Operation};
use crate::api::route::build_path;
use crate::config::BusinessCode;
use crate::http1::client::{ClientError, ResponseReader};
use crate::http1::RequestWriter;
use crate::policy::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};

/// The default operation mix, in percent.
pub const DEFAULT_MIX: &str = "verify_request=50,verify_response=20,connection_invitation=10,credential_offer=10,transaction_status=10";

/// Largest latency the histograms hold (larger values are clamped): one minute, in µs.
const MAX_LATENCY_US: u64 = 60_000_000;
/// Transaction ids remembered per connection for status reads.
const TX_POOL: usize = 256;

/// The largest answer read; anything larger is a protocol error for a load test.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Command-line arguments of `agent-gateway load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Base URL, http only (`http://127.0.0.1:8080`); a path in it is a prefix before `/api/v1`.
    #[arg(long, value_parser = check_target)]
    pub target: String,
    /// Requests per second on a fixed schedule (open model), or `max`: each connection sends
    /// back to back (closed model).
    #[arg(long, default_value = "1000")]
    pub rate: Rate,
    /// How long to send: `10s`, `500ms`, `2m`, or plain seconds.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Client connections (kept alive, one request in flight each).
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Operation weights, `name=weight,...` over verify_request, verify_response,
    /// connection_invitation, credential_offer, transaction_status.
    #[arg(long, default_value = DEFAULT_MIX)]
    pub mix: Mix,
    /// Interface version to call.
    #[arg(long, value_enum, default_value = "v1")]
    pub api: Api,
    /// Service business code put in v2 paths (required with `--api v2`).
    #[arg(long)]
    pub service: Option<String>,
    /// Sent as X-Service-Agent-Id.
    #[arg(long, requires = "token", conflicts_with = "credentials")]
    pub agent_id: Option<String>,
    /// Sent as X-Auth-Token (prefer --credentials: a command line is visible to other users).
    #[arg(long, requires = "agent_id", conflicts_with = "credentials")]
    pub token: Option<String>,
    /// A TOML or JSON file with `agent_id` and `token`.
    #[arg(long)]
    pub credentials: Option<PathBuf>,
    /// Per-request time limit; also how long to wait for stragglers after the run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Runtime threads (default: the CPUs this process may run on).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object on stdout instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// Why a load run failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("bad --target {0:?}: {1}")]
    Target(String, &'static str),
    #[error("bad --rate {0:?}: give requests per second (> 0) or `max`")]
    Rate(String),
    #[error("bad duration {0:?}: use e.g. 10s, 500ms, 2m or plain seconds")]
    Duration(String),
    #[error("bad --mix: {0}")]
    Mix(String),
    #[error("--api v2 needs --service CODE")]
    MissingService,
    #[error("bad --service: {0}")]
    Service(String),
    #[error("give --agent-id and --token, or --credentials FILE")]
    MissingCredentials,
    #[error("cannot read credentials {path}: {source}")]
    CredentialsRead {
        path: String,
        source: std::io::Error,
    },
    #[error("bad credentials file {path}: {message}")]
    CredentialsFormat { path: String, message: String },
    #[error("{0}")]
    Invalid(&'static str),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("cannot connect to {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

// ---------------------------------------------------------------------------------------------
// Arguments: pure parsing.
// ---------------------------------------------------------------------------------------------

/// Where to send: `Host` header value, socket address to resolve, and a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as given, for the report.
    pub url: String,
    /// The `Host` header (`host[:port]` as written in the URL).
    pub authority: String,
    /// `host:port` to resolve.
    pub host_port: String,
    /// Path prefix without a trailing slash (usually empty).
    pub prefix: String,
}

impl FromStr for Target {
    type Err = LoadError;

    fn from_str(s: &str) -> Result<Self, LoadError> {
        let bad = |why| LoadError::Target(s.to_owned(), why);
        let uri: http::Uri = s.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(_) => return Err(bad("only http:// is supported")),
            None => return Err(bad("needs http://")),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if uri.query().is_some() {
            return Err(bad("no query string, please"));
        }
        let port = authority.port_u16().unwrap_or(80);
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(Target {
            url: s.to_owned(),
            authority: authority.as_str().to_owned(),
            host_port: format!("{}:{port}", authority.host()),
            prefix,
        })
    }
}

/// Checks `--target` while the arguments are parsed; kept as text so `LoadArgs` stays small.
fn check_target(s: &str) -> Result<String, LoadError> {
    s.parse::<Target>().map(|_| s.to_owned())
}

/// Requests per second, or as fast as the connections go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    Max,
    PerSecond(f64),
}

impl FromStr for Rate {
    type Err = LoadError;

    fn from_str(s: &str) -> Result<Self, LoadError> {
        if s.eq_ignore_ascii_case("max") {
            return Ok(Rate::Max);
        }
        match s.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Rate::PerSecond(r)),
            _ => Err(LoadError::Rate(s.to_owned())),
        }
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h`, `1.5s` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, LoadError> {
    let bad = || LoadError::Duration(s.to_owned());
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "us" | "µs" => n / 1_000_000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(bad());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// The interface version to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    V1,
    V2,
}

impl Api {
    fn version(self) -> ApiVersion {
        match self {
            Api::V1 => ApiVersion::V1,
            Api::V2 => ApiVersion::V2,
        }
    }
}

/// Relative weights of the operations (indexed like [`Operation::ALL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    weights: [u32; Operation::COUNT],
    total: u64,
}

impl FromStr for Mix {
    type Err = LoadError;

    fn from_str(s: &str) -> Result<Self, LoadError> {
        let mut weights = [0u32; Operation::COUNT];
        let mut seen = [false; Operation::COUNT];
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, weight) = item
                .split_once('=')
                .ok_or_else(|| LoadError::Mix(format!("{item:?} is not name=weight")))?;
            let name = name.trim();
            let op = Operation::ALL
                .into_iter()
                .find(|o| o.as_str() == name)
                .ok_or_else(|| {
                    LoadError::Mix(format!(
                        "unknown operation {name:?} (known: {})",
                        Operation::ALL.map(Operation::as_str).join(", ")
                    ))
                })?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|_| LoadError::Mix(format!("weight of {name} is not a whole number")))?;
            let i = op as usize;
            if seen[i] {
                return Err(LoadError::Mix(format!("{name} given twice")));
            }
            seen[i] = true;
            weights[i] = weight;
        }
        let total = weights.iter().map(|&w| u64::from(w)).sum();
        if total == 0 {
            return Err(LoadError::Mix("all weights are zero".into()));
        }
        Ok(Mix { weights, total })
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (op, w) in Operation::ALL.iter().zip(self.weights) {
            if w > 0 {
                if !first {
                    f.write_str(",")?;
                }
                write!(f, "{}={w}", op.as_str())?;
                first = false;
            }
        }
        Ok(())
    }
}

/// A well-mixed 64-bit hash (splitmix64's finalizer): request index → pseudo-random draw.
fn splitmix64(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Mix {
    /// The operation of request `i`: a deterministic draw with the mix's weights.
    pub fn pick(&self, i: u64) -> Operation {
        let mut r = splitmix64(i) % self.total;
        for (op, w) in Operation::ALL.iter().zip(self.weights) {
            let w = u64::from(w);
            if r < w {
                return *op;
            }
            r -= w;
        }
        unreachable!("r < total, the sum of the weights")
    }
}

/// Agent credentials as read from `--credentials`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Credentials {
    pub agent_id: String,
    pub token: String,
}

/// Parses a credentials file's text: JSON when it starts with `{`, TOML otherwise.
pub fn parse_credentials(text: &str, path: &str) -> Result<Credentials, LoadError> {
    let format = |message: String| LoadError::CredentialsFormat {
        path: path.to_owned(),
        message,
    };
    let creds: Credentials = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format(e.to_string()))?
    } else {
        toml::from_str(text).map_err(|e| format(e.to_string()))?
    };
    if creds.agent_id.is_empty() || creds.token.is_empty() {
        return Err(format("agent_id and token must not be empty".into()));
    }
    Ok(creds)
}

// ---------------------------------------------------------------------------------------------
// The schedule.
// ---------------------------------------------------------------------------------------------

/// How many requests an open run of `rate` per second over `duration` sends.
pub fn total_requests(rate: f64, duration: Duration) -> u64 {
    (rate * duration.as_secs_f64()).round() as u64
}

/// When request `i` is due, relative to the start of the run.
pub fn intended_offset(i: u64, rate: f64) -> Duration {
    Duration::from_nanos((i as f64 * 1e9 / rate) as u64)
}

/// How many requests are due `elapsed` into the run (requests `0..n`), at most `total`.
pub fn due_by(elapsed: Duration, rate: f64, total: u64) -> u64 {
    let n = (elapsed.as_secs_f64() * rate).floor() as u64 + 1;
    n.min(total)
}

// ---------------------------------------------------------------------------------------------
// Requests: bodies, paths, bytes.
// ---------------------------------------------------------------------------------------------

/// A realistic JSON body for `op` (spec section 2), varied by request index `i`.
/// `None` for the status read, which has no body.
pub fn request_body(op: Operation, i: u64, run: u64) -> Option<String> {
    let uid = format!("load-{run:08x}-{i}");
    let connection = format!("conn-{:012x}", splitmix64(i ^ run) & 0xffff_ffff_ffff);
    let body = match op {
        // Rule 1/2: with a connection_id the request goes there and allow_multiple_read does
        // not apply; without one, a pairwise connection is made first.
        Operation::VerifyRequest if i % 4 == 0 => json!({
            "business_code": "KYC-BASIC",
            "connection_id": connection,
            "request_uid": uid,
        }),
        Operation::VerifyRequest => json!({
            "business_code": "KYC-BASIC",
            "allow_multiple_read": i % 2 == 0,
            "request_uid": uid,
        }),
        Operation::VerifyResponse => json!({
            "presentation_id": format!("pres-{:016x}", splitmix64(i.wrapping_add(run))),
            "result": i % 10 != 0,
            "descriptions": [
                {"lang": "en", "message": "Proof of identity verified"},
                {"lang": "fr", "message": "Preuve d'identité vérifiée"},
            ],
        }),
        Operation::ConnectionInvitation => json!({
            "organization_name": "Acme Verification Services",
            "allow_multiple_read": i % 3 == 0,
            "request_uid": uid,
        }),
        // Rule 3: credential_values are mandatory with a connection_id.
        Operation::CredentialOffer if i % 2 == 0 => json!({
            "organization_name": "Acme Verification Services",
            "credential_def_id": "Th7MpTaRZVRYnPiabds81Y:3:CL:12:membership",
            "request_uid": uid,
            "connection_id": connection,
            "credential_values": [
                {"name": "given_name", "mime_type": "text/plain", "value": "Ada"},
                {"name": "family_name", "mime_type": "text/plain", "value": "Lovelace"},
                {"name": "member_since", "mime_type": "text/plain", "value": "2024-01-15"},
            ],
            "comment": "Your membership credential",
        }),
        Operation::CredentialOffer => json!({
            "organization_name": "Acme Verification Services",
            "credential_def_id": "Th7MpTaRZVRYnPiabds81Y:3:CL:12:membership",
            "request_uid": uid,
            "comment": "Scan to receive your membership credential",
        }),
        Operation::TransactionStatus => return None,
    };
    Some(body.to_string())
}

/// Percent-encodes everything but RFC 3986 unreserved characters: a transaction id from a
/// response becomes exactly one path segment.
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The request path of `op` under `prefix` for the given version and service code: the
/// gateway's own path shapes, with the segments filled in.
pub fn request_path(
    prefix: &str,
    api: ApiVersion,
    service: &str,
    op: Operation,
    transaction_id: &str,
) -> String {
    let base = format!("{prefix}/api/{}", api.as_str());
    build_path(
        &base,
        api,
        op,
        service,
        &encode_segment(transaction_id),
        None,
    )
}

/// Everything needed to write request `i`; shared by every connection.
#[derive(Debug, Clone)]
pub struct Script {
    pub authority: String,
    pub prefix: String,
    pub api: ApiVersion,
    pub service: String,
    pub agent_id: String,
    pub token: String,
    pub mix: Mix,
    /// Distinguishes this run's request_uids and synthetic ids from another run's.
    pub run: u64,
}

impl Script {
    /// Writes request `i` into `out` (cleared first) and returns its operation. Status reads
    /// use a transaction id from `tx_ids` when there is one, else a synthetic id.
    pub fn write_request(
        &self,
        i: u64,
        tx_ids: &VecDeque<String>,
        out: &mut BytesMut,
    ) -> Operation {
        let op = self.mix.pick(i);
        let synthetic;
        let tx = if op == Operation::TransactionStatus {
            match tx_ids.len() {
                0 => {
                    synthetic = format!("tx-load-{:08x}-{i}", self.run);
                    synthetic.as_str()
                }
                n => tx_ids[(splitmix64(i) % n as u64) as usize].as_str(),
            }
        } else {
            ""
        };
        let path = request_path(&self.prefix, self.api, &self.service, op, tx);
        let body = request_body(op, i, self.run);
        out.clear();
        let mut w = RequestWriter::new(out, op.method(), &path);
        w.header("host", &self.authority)
            .header("user-agent", "agent-gateway-load")
            .header("accept", "application/json")
            .header(AGENT_ID_HEADER, &self.agent_id)
            .header(AUTH_TOKEN_HEADER, &self.token);
        if let Some(b) = &body {
            w.header("content-type", "application/json")
                .number("content-length", b.len() as u64);
        }
        w.end();
        if let Some(b) = body {
            out.extend_from_slice(b.as_bytes());
        }
        op
    }
}

// ---------------------------------------------------------------------------------------------
// Responses.
// ---------------------------------------------------------------------------------------------

/// The `transaction_id` of an InvitationResponse-like body, when it has a usable one.
pub fn transaction_id(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct WithTx {
        transaction_id: Option<String>,
    }
    let id = serde_json::from_slice::<WithTx>(body)
        .ok()?
        .transaction_id?;
    (!id.is_empty() && id.len() <= 256 && id != "." && id != "..").then_some(id)
}

// ---------------------------------------------------------------------------------------------
// Results and the report.
// ---------------------------------------------------------------------------------------------

/// How an exchange failed without an HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConnErrorKind {
    Connect,
    Timeout,
    /// The server closed the connection before a whole response.
    Closed,
    /// A read or write failed (reset, broken pipe).
    Io,
    Protocol,
}

impl ConnErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnErrorKind::Connect => "connect",
            ConnErrorKind::Timeout => "timeout",
            ConnErrorKind::Closed => "closed",
            ConnErrorKind::Io => "io",
            ConnErrorKind::Protocol => "protocol",
        }
    }
}

/// One connection's tally; merged into the run's at the end.
#[derive(Debug, Clone)]
pub struct Stats {
    pub latency_us: Histogram<u64>,
    pub statuses: BTreeMap<u16, u64>,
    pub conn_errors: BTreeMap<ConnErrorKind, u64>,
    pub operations: [u64; Operation::COUNT],
    /// Scheduled requests never sent: the run's hard deadline had passed.
    pub unsent: u64,
    /// Open model: requests that started more than 1 ms after they were due (no idle
    /// connection, or a busy client).
    pub late_starts: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("static histogram bounds are valid"),
            statuses: BTreeMap::new(),
            conn_errors: BTreeMap::new(),
            operations: [0; Operation::COUNT],
            unsent: 0,
            late_starts: 0,
        }
    }
}

impl Stats {
    pub fn record_response(&mut self, status: u16, latency: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, MAX_LATENCY_US);
        self.latency_us.saturating_record(us);
        *self.statuses.entry(status).or_default() += 1;
    }

    pub fn record_error(&mut self, kind: ConnErrorKind) {
        *self.conn_errors.entry(kind).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Stats) {
        self.latency_us
            .add(&other.latency_us)
            .expect("histograms share bounds");
        for (k, v) in &other.statuses {
            *self.statuses.entry(*k).or_default() += v;
        }
        for (k, v) in &other.conn_errors {
            *self.conn_errors.entry(*k).or_default() += v;
        }
        for (a, b) in self.operations.iter_mut().zip(other.operations) {
            *a += b;
        }
        self.unsent += other.unsent;
        self.late_starts += other.late_starts;
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
    pub mean: f64,
}

/// Failures: HTTP statuses other than 2xx, and exchanges that got no status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Errors {
    pub total: u64,
    pub by_status: BTreeMap<u16, u64>,
    pub connection: BTreeMap<&'static str, u64>,
    pub unsent: u64,
}

/// The result of a run, printed as text or JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub target: String,
    pub api: &'static str,
    /// `open` (fixed schedule) or `closed` (`--rate max`).
    pub model: &'static str,
    /// Requests per second asked for (open model).
    pub rate: Option<f64>,
    pub connections: usize,
    pub mix: String,
    /// From the first scheduled request to the last answer.
    pub elapsed_s: f64,
    /// Exchanges that got an HTTP response (any status).
    pub responses: u64,
    pub throughput_rps: f64,
    /// Open model: from each request's intended start; closed model: from its send.
    pub latency_from: &'static str,
    pub latency_ms: Latency,
    pub statuses: BTreeMap<u16, u64>,
    pub errors: Errors,
    pub late_starts: u64,
    pub operations: BTreeMap<&'static str, u64>,
}

/// Builds the report from the merged stats of a run.
pub fn make_report(plan: &Plan, stats: &Stats, elapsed: Duration) -> Report {
    let h = &stats.latency_us;
    let ms = |us: u64| us as f64 / 1000.0;
    let responses: u64 = stats.statuses.values().sum();
    let by_status: BTreeMap<u16, u64> = stats
        .statuses
        .iter()
        .filter(|(s, _)| !(200..300).contains(*s))
        .map(|(s, n)| (*s, *n))
        .collect();
    let connection: BTreeMap<&'static str, u64> = stats
        .conn_errors
        .iter()
        .map(|(k, n)| (k.as_str(), *n))
        .collect();
    let total = by_status.values().sum::<u64>() + connection.values().sum::<u64>() + stats.unsent;
    let secs = elapsed.as_secs_f64();
    let (model, rate, latency_from) = match plan.rate {
        Rate::Max => ("closed", None, "send"),
        Rate::PerSecond(r) => ("open", Some(r), "intended start"),
    };
    Report {
        target: plan.target_url.clone(),
        api: plan.script.api.as_str(),
        model,
        rate,
        connections: plan.connections,
        mix: plan.script.mix.to_string(),
        elapsed_s: secs,
        responses,
        throughput_rps: if secs > 0.0 {
            responses as f64 / secs
        } else {
            0.0
        },
        latency_from,
        latency_ms: Latency {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        },
        statuses: stats.statuses.clone(),
        errors: Errors {
            total,
            by_status,
            connection,
            unsent: stats.unsent,
        },
        late_starts: stats.late_starts,
        operations: Operation::ALL
            .iter()
            .zip(stats.operations)
            .filter(|(_, n)| *n > 0)
            .map(|(op, n)| (op.as_str(), n))
            .collect(),
    }
}

fn join_counts<K: fmt::Display>(items: impl IntoIterator<Item = (K, u64)>) -> String {
    items
        .into_iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The human-readable report.
pub fn format_report(r: &Report) -> String {
    let mut out = String::new();
    let model = match r.rate {
        Some(rate) => format!("open model at {rate} req/s"),
        None => "closed model (--rate max)".to_string(),
    };
    let _ = writeln!(
        out,
        "{} (api {}): {model}, {} connections, mix {}",
        r.target, r.api, r.connections, r.mix
    );
    let _ = writeln!(
        out,
        "  throughput  {:.1} req/s ({} responses in {:.2} s)",
        r.throughput_rps, r.responses, r.elapsed_s
    );
    let l = &r.latency_ms;
    let _ = writeln!(
        out,
        "  latency     p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms  (from {})",
        l.p50, l.p90, l.p99, l.p99_9, l.max, r.latency_from
    );
    let _ = writeln!(out, "  statuses    {}", join_counts(r.statuses.clone()));
    if r.errors.total == 0 {
        let _ = writeln!(out, "  errors      none");
    } else {
        let mut parts = Vec::new();
        if !r.errors.by_status.is_empty() {
            parts.push(format!(
                "by status {}",
                join_counts(r.errors.by_status.clone())
            ));
        }
        if !r.errors.connection.is_empty() {
            parts.push(format!(
                "connection {}",
                join_counts(r.errors.connection.clone())
            ));
        }
        if r.errors.unsent > 0 {
            parts.push(format!("unsent (past the deadline) {}", r.errors.unsent));
        }
        let _ = writeln!(
            out,
            "  errors      {} ({})",
            r.errors.total,
            parts.join("; ")
        );
    }
    if r.late_starts > 0 {
        let _ = writeln!(
            out,
            "  late starts {} requests started > 1 ms after due (more --connections may help)",
            r.late_starts
        );
    }
    let _ = writeln!(out, "  operations  {}", join_counts(r.operations.clone()));
    out
}

/// The one-second progress line written to stderr while running.
pub fn progress_line(second: u64, done_in_second: u64, done: u64, errors: u64) -> String {
    format!("[{second:>4}s] {done_in_second:>8} req/s  total {done:>10}  errors {errors}")
}

// ---------------------------------------------------------------------------------------------
// The shell: resolve, connect, run, print.
// ---------------------------------------------------------------------------------------------

/// A validated run, ready to execute.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target_url: String,
    pub addr: SocketAddr,
    pub rate: Rate,
    pub duration: Duration,
    pub connections: usize,
    pub timeout: Duration,
    pub script: Script,
    /// Write the one-second progress line to stderr.
    pub progress: bool,
}

fn run_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    splitmix64(nanos ^ u64::from(std::process::id())) & 0xffff_ffff
}

impl Plan {
    /// Checks the arguments, reads the credentials and resolves the target.
    pub fn from_args(args: &LoadArgs) -> Result<Self, LoadError> {
        if args.connections == 0 {
            return Err(LoadError::Invalid("--connections must be at least 1"));
        }
        if let Rate::PerSecond(r) = args.rate {
            if total_requests(r, args.duration) == 0 {
                return Err(LoadError::Invalid(
                    "--rate × --duration is less than one request",
                ));
            }
        }
        let service = match (args.api, &args.service) {
            (Api::V2, None) => return Err(LoadError::MissingService),
            (_, Some(code)) => BusinessCode::parse(code)
                .map_err(LoadError::Service)?
                .as_str()
                .to_owned(),
            (Api::V1, None) => String::new(),
        };
        let creds = match (&args.agent_id, &args.token, &args.credentials) {
            (Some(agent_id), Some(token), None) => Credentials {
                agent_id: agent_id.clone(),
                token: token.clone(),
            },
            (None, None, Some(path)) => read_credentials(path)?,
            _ => return Err(LoadError::MissingCredentials),
        };
        for v in [&creds.agent_id, &creds.token] {
            if v.bytes().any(|b| b.is_ascii_control()) {
                return Err(LoadError::Invalid(
                    "agent id and token must not hold control characters",
                ));
            }
        }
        let target: Target = args.target.parse()?;
        let host_port = &target.host_port;
        let addr = host_port
            .to_socket_addrs()
            .map_err(|e| LoadError::Resolve(host_port.clone(), e))?
            .next()
            .ok_or_else(|| {
                LoadError::Resolve(
                    host_port.clone(),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
                )
            })?;
        Ok(Plan {
            target_url: target.url.clone(),
            addr,
            rate: args.rate,
            duration: args.duration,
            connections: args.connections,
            timeout: args.timeout,
            script: Script {
                authority: target.authority,
                prefix: target.prefix,
                api: args.api.version(),
                service,
                agent_id: creds.agent_id,
                token: creds.token,
                mix: args.mix.clone(),
                run: run_id(),
            },
            progress: true,
        })
    }
}

fn read_credentials(path: &Path) -> Result<Credentials, LoadError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::CredentialsRead {
        path: shown.clone(),
        source,
    })?;
    parse_credentials(&text, &shown)
}

/// Runs a load test and prints its report.
pub fn run(args: LoadArgs) -> Result<(), LoadError> {
    let plan = Plan::from_args(&args)?;
    let threads = args
        .threads
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1);
    let runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .map_err(LoadError::Runtime)?;
    let report = runtime.block_on(execute(plan))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("a report always serializes")
        );
    } else {
        print!("{}", format_report(&report));
    }
    Ok(())
}

/// What every connection task shares.
struct Shared {
    plan: Plan,
    /// Open model: one permit per request that is due.
    gate: Semaphore,
    /// The next request index to take.
    next: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
}

/// Connects every connection, runs the schedule and returns the report.
pub async fn execute(plan: Plan) -> Result<Report, LoadError> {
    let mut conns = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        conns.push(Conn::open(plan.addr).await?);
    }
    let progress = plan.progress;
    let shared = Arc::new(Shared {
        plan,
        gate: Semaphore::new(0),
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    });
    // A short lead so every task is parked on the gate when the first request is due.
    let start = Instant::now() + Duration::from_millis(5);
    let stop = Arc::new(AtomicBool::new(false));

    let dispatcher = match shared.plan.rate {
        Rate::PerSecond(rate) => {
            let shared = shared.clone();
            let stop = stop.clone();
            Some(std::thread::spawn(move || {
                dispatch(&shared, rate, start, &stop);
            }))
        }
        Rate::Max => None,
    };
    let reporter = progress.then(|| tokio::spawn(report_progress(shared.clone(), start)));

    let mut tasks = tokio::task::JoinSet::new();
    for conn in conns {
        let shared = shared.clone();
        tasks.spawn(async move { worker(shared, conn, start).await });
    }
    let mut stats = Stats::default();
    while let Some(result) = tasks.join_next().await {
        if let Ok(s) = result {
            stats.merge(&s);
        }
    }
    let elapsed = Instant::now().saturating_duration_since(start);
    stop.store(true, Ordering::Relaxed);
    if let Some(d) = dispatcher {
        let _ = d.join();
    }
    if let Some(r) = reporter {
        r.abort();
    }
    Ok(make_report(&shared.plan, &stats, elapsed))
}

/// Releases requests when they are due. A thread of its own, because `nanosleep` keeps the
/// schedule to tens of µs where tokio's timer rounds to whole milliseconds.
fn dispatch(shared: &Shared, rate: f64, start: Instant, stop: &AtomicBool) {
    let total = total_requests(rate, shared.plan.duration);
    let mut released = 0;
    while released < total && !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < start {
            std::thread::sleep(start - now);
            continue;
        }
        let due = due_by(now - start, rate, total);
        if due > released {
            shared.gate.add_permits((due - released) as usize);
            released = due;
        }
        if released < total {
            let next = start + intended_offset(released, rate);
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }
    // One more permit per connection: each takes an index past the end and stops.
    shared.gate.add_permits(shared.plan.connections);
}

async fn report_progress(shared: Arc<Shared>, start: Instant) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(start + Duration::from_secs(1)),
        Duration::from_secs(1),
    );
    let mut last = 0;
    let mut second = 0;
    loop {
        tick.tick().await;
        second += 1;
        let done = shared.done.load(Ordering::Relaxed);
        let failed = shared.failed.load(Ordering::Relaxed);
        eprintln!("{}", progress_line(second, done - last, done, failed));
        last = done;
    }
}

/// One connection's loop over the schedule (open) or back to back until the end (closed).
async fn worker(shared: Arc<Shared>, mut conn: Conn, start: Instant) -> Stats {
    let plan = &shared.plan;
    let mut stats = Stats::default();
    let mut tx_ids = VecDeque::with_capacity(TX_POOL);
    let mut req = BytesMut::with_capacity(1024);
    let end = start + plan.duration;
    let hard_deadline = end + plan.timeout;
    tokio::time::sleep_until(start.into()).await;
    loop {
        let (i, due) = match plan.rate {
            Rate::PerSecond(rate) => {
                match shared.gate.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => break,
                }
                let i = shared.next.fetch_add(1, Ordering::Relaxed);
                if i >= total_requests(rate, plan.duration) {
                    break;
                }
                (i, Some(start + intended_offset(i, rate)))
            }
            Rate::Max => {
                if Instant::now() >= end {
                    break;
                }
                (shared.next.fetch_add(1, Ordering::Relaxed), None)
            }
        };
        let sent = Instant::now();
        if sent >= hard_deadline {
            stats.unsent += 1;
            shared.failed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if due.is_some_and(|d| sent > d + Duration::from_millis(1)) {
            stats.late_starts += 1;
        }
        let op = plan.script.write_request(i, &tx_ids, &mut req);
        stats.operations[op as usize] += 1;
        let outcome = tokio::time::timeout(plan.timeout, conn.exchange(&req)).await;
        let finished = Instant::now();
        match outcome {
            Ok(Ok(status)) => {
                stats.record_response(status, finished - due.unwrap_or(sent));
                shared.done.fetch_add(1, Ordering::Relaxed);
                if !(200..300).contains(&status) {
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                } else if op != Operation::TransactionStatus {
                    if let Some(id) = transaction_id(conn.body()) {
                        if tx_ids.len() == TX_POOL {
                            tx_ids.pop_front();
                        }
                        tx_ids.push_back(id);
                    }
                }
            }
            Ok(Err(kind)) => {
                stats.record_error(kind);
                shared.failed.fetch_add(1, Ordering::Relaxed);
                if kind == ConnErrorKind::Connect && plan.rate == Rate::Max {
                    // Do not spin on a refused port.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Err(_) => {
                conn.reset();
                stats.record_error(ConnErrorKind::Timeout);
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    stats
}

/// One kept-alive client connection, reconnected after it breaks.
struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    responses: ResponseReader,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Result<Self, LoadError> {
        let stream = connect(addr)
            .await
            .map_err(|e| LoadError::Connect(addr, e))?;
        Ok(Conn {
            addr,
            stream: Some(stream),
            responses: ResponseReader::default(),
        })
    }

    fn reset(&mut self) {
        self.stream = None;
        self.responses.clear();
    }

    /// Sends one request and reads its response: its status, its body in
    /// [`Self::body`].
    async fn exchange(&mut self, req: &[u8]) -> Result<u16, ConnErrorKind> {
        if self.stream.is_none() {
            self.stream = Some(
                connect(self.addr)
                    .await
                    .map_err(|_| ConnErrorKind::Connect)?,
            );
        }
        let stream = self.stream.as_mut().expect("connected above");
        let result = match stream.write_all(req).await {
            Ok(()) => self
                .responses
                .read(stream, MAX_RESPONSE_BYTES)
                .await
                .map_err(|e| match e {
                    ClientError::Io(_) => ConnErrorKind::Io,
                    ClientError::Closed => ConnErrorKind::Closed,
                    ClientError::Malformed | ClientError::TooLarge(_) => ConnErrorKind::Protocol,
                }),
            Err(_) => Err(ConnErrorKind::Io),
        };
        match result {
            Ok(()) if self.responses.keep_alive() => Ok(self.responses.status()),
            Ok(()) => {
                let status = self.responses.status();
                self.reset();
                Ok(status)
            }
            Err(kind) => {
                self.reset();
                Err(kind)
            }
        }
    }

    /// The body of the last response.
    fn body(&self) -> &[u8] {
        self.responses.body()
    }
}

async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn mix(s: &str) -> Mix {
        s.parse().unwrap()
    }

    #[test]
    fn mix_parses_names_and_weights() {
        let m = mix(DEFAULT_MIX);
        assert_eq!(m.weights, [50, 20, 10, 10, 10]);
        assert_eq!(m.to_string(), DEFAULT_MIX);
        let m = mix(" verify_response = 3 , transaction_status=1 ");
        assert_eq!(m.weights, [0, 3, 0, 0, 1]);
        assert_eq!(m.to_string(), "verify_response=3,transaction_status=1");
    }

    #[test]
    fn mix_refuses_bad_input() {
        for bad in [
            "",
            "verify_request=0",
            "verify_request",
            "verify=1",
            "verify_request=-1",
            "verify_request=1.5",
            "verify_request=1,verify_request=2",
        ] {
            assert!(
                matches!(bad.parse::<Mix>(), Err(LoadError::Mix(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn mix_draws_follow_the_weights() {
        let m = mix(DEFAULT_MIX);
        let mut counts = [0u64; Operation::COUNT];
        let n = 100_000;
        for i in 0..n {
            counts[m.pick(i) as usize] += 1;
        }
        for (count, want) in counts.iter().zip([50, 20, 10, 10, 10]) {
            let pct = *count as f64 * 100.0 / n as f64;
            assert!((pct - want as f64).abs() < 1.0, "{counts:?}");
        }
        // Zero weight is never drawn; draws are deterministic.
        let only = mix("credential_offer=1,verify_request=0");
        assert!((0..1000).all(|i| only.pick(i) == Operation::CredentialOffer));
        assert_eq!(m.pick(42), m.pick(42));
    }

    #[test]
    fn durations_and_rates() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["", "s", "0s", "10x", "-1s", "1e3"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!("max".parse::<Rate>().unwrap(), Rate::Max);
        assert_eq!("5000".parse::<Rate>().unwrap(), Rate::PerSecond(5000.0));
        for bad in ["0", "-5", "fast", "inf", "NaN"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
    }

    #[test]
    fn targets() {
        let t: Target = "http://127.0.0.1:8083".parse().unwrap();
        assert_eq!(t.host_port, "127.0.0.1:8083");
        assert_eq!(t.authority, "127.0.0.1:8083");
        assert_eq!(t.prefix, "");
        let t: Target = "http://localhost/gw/".parse().unwrap();
        assert_eq!(t.host_port, "localhost:80");
        assert_eq!(t.prefix, "/gw");
        for bad in ["https://x", "127.0.0.1:80", "http://x/?a=1", "nope"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }

    #[test]
    fn schedule_is_fixed_by_rate() {
        assert_eq!(total_requests(5000.0, Duration::from_secs(10)), 50_000);
        assert_eq!(total_requests(0.5, Duration::from_secs(3)), 2);
        assert_eq!(intended_offset(0, 5000.0), Duration::ZERO);
        assert_eq!(intended_offset(5000, 5000.0), Duration::from_secs(1));
        assert_eq!(intended_offset(1, 4000.0), Duration::from_micros(250));
        assert_eq!(due_by(Duration::ZERO, 1000.0, 10), 1);
        assert_eq!(due_by(Duration::from_micros(2500), 1000.0, 10), 3);
        assert_eq!(due_by(Duration::from_secs(5), 1000.0, 10), 10);
        // Every request counted as due is due by then.
        for us in [0u64, 999, 1000, 1001, 123_456] {
            let e = Duration::from_micros(us);
            let n = due_by(e, 1000.0, u64::MAX);
            assert!(intended_offset(n - 1, 1000.0) <= e);
            assert!(intended_offset(n, 1000.0) > e);
        }
    }

    fn body_json(op: Operation, i: u64) -> serde_json::Value {
        serde_json::from_str(&request_body(op, i, 7).unwrap()).unwrap()
    }

    #[test]
    fn bodies_follow_the_spec() {
        for i in 0..8 {
            let v = body_json(Operation::VerifyRequest, i);
            assert_eq!(v["business_code"], "KYC-BASIC");
            // Rule 2: allow_multiple_read only without connection_id.
            assert!(v.get("connection_id").is_none() || v.get("allow_multiple_read").is_none());
            let v = body_json(Operation::VerifyResponse, i);
            assert!(v["presentation_id"].is_string() && v["result"].is_boolean());
            assert!(v["descriptions"][0]["lang"].is_string());
            let v = body_json(Operation::ConnectionInvitation, i);
            assert!(v["organization_name"].is_string());
            let v = body_json(Operation::CredentialOffer, i);
            assert!(v["organization_name"].is_string() && v["credential_def_id"].is_string());
            // Rule 3: credential_values whenever connection_id is given.
            if v.get("connection_id").is_some() {
                assert_eq!(v["credential_values"].as_array().unwrap().len(), 3);
            }
        }
        // Both shapes occur.
        assert!(body_json(Operation::VerifyRequest, 0)["connection_id"].is_string());
        assert!(body_json(Operation::VerifyRequest, 1)["allow_multiple_read"].is_boolean());
        assert_ne!(
            body_json(Operation::VerifyRequest, 1)["request_uid"],
            body_json(Operation::VerifyRequest, 2)["request_uid"]
        );
        assert!(request_body(Operation::TransactionStatus, 0, 7).is_none());
    }

    #[test]
    fn paths_per_version() {
        let p = |api, op, tx| request_path("", api, "SVC", op, tx);
        assert_eq!(
            p(ApiVersion::V1, Operation::VerifyRequest, ""),
            "/api/v1/verify/request"
        );
        assert_eq!(
            p(ApiVersion::V2, Operation::VerifyRequest, ""),
            "/api/v2/verify/SVC/request"
        );
        assert_eq!(
            p(ApiVersion::V2, Operation::ConnectionInvitation, ""),
            "/api/v2/connection/SVC/invitation"
        );
        assert_eq!(
            p(ApiVersion::V1, Operation::CredentialOffer, ""),
            "/api/v1/credential/offer"
        );
        assert_eq!(
            p(ApiVersion::V2, Operation::VerifyResponse, ""),
            "/api/v2/verify/response"
        );
        assert_eq!(
            p(ApiVersion::V1, Operation::TransactionStatus, "a/b c"),
            "/api/v1/transaction/a%2Fb%20c/status"
        );
        assert_eq!(
            request_path("/gw", ApiVersion::V1, "", Operation::VerifyResponse, ""),
            "/gw/api/v1/verify/response"
        );
    }

    fn script(m: &str) -> Script {
        Script {
            authority: "127.0.0.1:8083".into(),
            prefix: String::new(),
            api: ApiVersion::V1,
            service: String::new(),
            agent_id: "agent-1".into(),
            token: "secret".into(),
            mix: mix(m),
            run: 0xab,
        }
    }

    #[test]
    fn request_bytes_are_valid_http() {
        let s = script(DEFAULT_MIX);
        let mut out = BytesMut::new();
        let mut seen_post = false;
        for i in 0..50 {
            let op = s.write_request(i, &VecDeque::new(), &mut out);
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut req = httparse::Request::new(&mut headers);
            let head = match req.parse(&out).unwrap() {
                httparse::Status::Complete(n) => n,
                httparse::Status::Partial => panic!("incomplete request"),
            };
            assert_eq!(req.method, Some(op.method()));
            let get = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| std::str::from_utf8(h.value).unwrap().to_owned())
            };
            assert_eq!(get("x-service-agent-id").as_deref(), Some("agent-1"));
            assert_eq!(get("x-auth-token").as_deref(), Some("secret"));
            if op == Operation::TransactionStatus {
                assert_eq!(head, out.len());
                assert!(req.path.unwrap().contains("/transaction/tx-load-000000ab-"));
            } else {
                seen_post = true;
                let len: usize = get("content-length").unwrap().parse().unwrap();
                assert_eq!(head + len, out.len());
                serde_json::from_slice::<serde_json::Value>(&out[head..]).unwrap();
            }
        }
        assert!(seen_post);
    }

    #[test]
    fn status_reads_use_returned_transaction_ids() {
        let s = script("transaction_status=1");
        let ids = VecDeque::from(["tx-1".to_string()]);
        let mut out = BytesMut::new();
        s.write_request(3, &ids, &mut out);
        assert!(out.starts_with(b"GET /api/v1/transaction/tx-1/status HTTP/1.1\r\n"));
        assert_eq!(
            transaction_id(br#"{"status_code":200,"transaction_id":"tx-9"}"#).as_deref(),
            Some("tx-9")
        );
        assert_eq!(transaction_id(br#"{"status_code":200}"#), None);
        assert_eq!(transaction_id(br#"{"transaction_id":".."}"#), None);
        assert_eq!(transaction_id(b"not json"), None);
    }

    #[test]
    fn credentials_files() {
        let toml = "agent_id = \"agent-1\"\ntoken = \"secret\"\n";
        let json = r#" {"agent_id": "agent-1", "token": "secret"} "#;
        for text in [toml, json] {
            let c = parse_credentials(text, "f").unwrap();
            assert_eq!(
                (c.agent_id.as_str(), c.token.as_str()),
                ("agent-1", "secret")
            );
        }
        for bad in [
            "agent_id = \"a\"",
            "{\"agent_id\":\"\",\"token\":\"t\"}",
            "{",
        ] {
            assert!(matches!(
                parse_credentials(bad, "f"),
                Err(LoadError::CredentialsFormat { .. })
            ));
        }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: LoadArgs,
    }

    fn args(line: &str) -> Result<LoadArgs, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("load").chain(line.split_whitespace())).map(|c| c.args)
    }

    #[test]
    fn command_line() {
        let a = args("--target http://127.0.0.1:1 --agent-id a --token t").unwrap();
        assert_eq!(a.rate, Rate::PerSecond(1000.0));
        assert_eq!(a.duration, Duration::from_secs(10));
        assert_eq!(a.mix, mix(DEFAULT_MIX));
        let plan = Plan::from_args(&a).unwrap();
        assert_eq!(plan.addr, "127.0.0.1:1".parse().unwrap());
        assert_eq!(plan.script.api, ApiVersion::V1);

        let a = args("--target http://127.0.0.1:1 --api v2 --service S1 --agent-id a --token t --rate max --mix verify_request=1 --json").unwrap();
        let plan = Plan::from_args(&a).unwrap();
        assert_eq!((plan.rate, plan.script.service.as_str()), (Rate::Max, "S1"));
        assert!(a.json);

        for bad in [
            "--target https://x --agent-id a --token t",
            "--target http://x --agent-id a",
            "--target http://x --agent-id a --token t --credentials f",
            "--target http://x --agent-id a --token t --mix nope=1",
            "--target http://x --agent-id a --token t --rate 0",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
        let plan = |line| Plan::from_args(&args(line).unwrap());
        assert!(matches!(
            plan("--target http://127.0.0.1:1 --api v2 --agent-id a --token t"),
            Err(LoadError::MissingService)
        ));
        assert!(matches!(
            plan("--target http://127.0.0.1:1 --api v2 --service a/b --agent-id a --token t"),
            Err(LoadError::Service(_))
        ));
        assert!(matches!(
            plan("--target http://127.0.0.1:1"),
            Err(LoadError::MissingCredentials)
        ));
        assert!(matches!(
            plan("--target http://127.0.0.1:1 --credentials /nonexistent/creds.toml"),
            Err(LoadError::CredentialsRead { .. })
        ));
        assert!(matches!(
            plan("--target http://127.0.0.1:1 --agent-id a --token t --connections 0"),
            Err(LoadError::Invalid(_))
        ));
    }

    fn sample_plan(rate: Rate) -> Plan {
        Plan {
            target_url: "http://127.0.0.1:8083".into(),
            addr: "127.0.0.1:8083".parse().unwrap(),
            rate,
            duration: Duration::from_secs(1),
            connections: 4,
            timeout: Duration::from_secs(1),
            script: script(DEFAULT_MIX),
            progress: false,
        }
    }

    #[test]
    fn report_text_and_json() {
        let mut stats = Stats::default();
        for us in 1..=1000u64 {
            stats.record_response(200, Duration::from_micros(us * 10));
        }
        stats.record_response(401, Duration::from_micros(50));
        stats.record_error(ConnErrorKind::Io);
        stats.operations = [500, 200, 100, 100, 101];
        let r = make_report(
            &sample_plan(Rate::PerSecond(1000.0)),
            &stats,
            Duration::from_secs(1),
        );
        assert_eq!(r.responses, 1001);
        assert_eq!(r.errors.total, 2);
        assert_eq!(r.errors.by_status[&401], 1);
        assert_eq!(r.errors.connection["io"], 1);
        assert!((r.latency_ms.p50 - 5.0).abs() < 0.01, "{:?}", r.latency_ms);
        assert!((r.latency_ms.p99 - 9.9).abs() < 0.02, "{:?}", r.latency_ms);
        assert!((r.latency_ms.max - 10.0).abs() < 0.01);
        let text = format_report(&r);
        for want in [
            "open model at 1000 req/s",
            "1001.0 req/s",
            "p50 5.00",
            "p99.9",
            "by status 401: 1",
            "connection io: 1",
            "verify_request: 500",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["model"], "open");
        assert_eq!(v["statuses"]["200"], 1000);
        assert_eq!(v["errors"]["connection"]["io"], 1);
        assert!(v["latency_ms"]["p99_9"].is_number());
        let closed = make_report(&sample_plan(Rate::Max), &Stats::default(), Duration::ZERO);
        assert!(format_report(&closed).contains("closed model"));
        assert!(format_report(&closed).contains("errors      none"));
    }

    /// A tiny keep-alive server answering every request with an InvitationResponse.
    async fn fixed_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut headers = [httparse::EMPTY_HEADER; 16];
                        let mut req = httparse::Request::new(&mut headers);
                        if let Ok(httparse::Status::Complete(head)) = req.parse(&buf) {
                            let len = req
                                .headers
                                .iter()
                                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                                .map_or(0, |h| {
                                    std::str::from_utf8(h.value).unwrap().parse().unwrap()
                                });
                            if buf.len() >= head + len {
                                buf.drain(..head + len);
                                let body = br#"{"status_code":200,"message_code":0,"message":"OK","transaction_id":"tx-7"}"#;
                                let resp = format!(
                                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                                    body.len()
                                );
                                if s.write_all(resp.as_bytes()).await.is_err()
                                    || s.write_all(body).await.is_err()
                                {
                                    return;
                                }
                                continue;
                            }
                        }
                        match s.read_buf(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                });
            }
        });
        (addr, handle)
    }

    #[tokio::test]
    async fn open_and_closed_runs_against_a_local_server() {
        let (addr, server) = fixed_server().await;
        let mut plan = sample_plan(Rate::PerSecond(400.0));
        plan.addr = addr;
        plan.duration = Duration::from_millis(250);
        let r = execute(plan.clone()).await.unwrap();
        assert_eq!(r.responses, 100, "{r:?}");
        assert_eq!(r.statuses[&200], 100);
        assert_eq!(r.errors.total, 0);
        assert_eq!(r.operations.values().sum::<u64>(), 100);
        assert!(r.elapsed_s >= 0.24, "{r:?}");

        plan.rate = Rate::Max;
        plan.duration = Duration::from_millis(100);
        let r = execute(plan).await.unwrap();
        assert!(r.responses > 10, "{r:?}");
        assert_eq!(r.errors.total, 0);
        server.abort();
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connect_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let mut plan = sample_plan(Rate::PerSecond(100.0));
        plan.addr = addr;
        assert!(matches!(
            execute(plan).await,
            Err(LoadError::Connect(a, _)) if a == addr
        ));
    }
}
