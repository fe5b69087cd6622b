//! The command line: its arguments ([`LoadArgs`]) and their values, parsed and checked:
//! targets, rates, durations, the mix, credentials.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::operation::{ApiVersion, Operation};
use crate::client::port_is_a_number;
use crate::client::redact::{redact_url, REDACTED};

use super::agents::{toml_mistake, Token};
use super::schedule::Stage;
use super::threshold::Threshold;
use super::LoadError;

/// The longest `--duration`, `--timeout` and `--stages` total: a year, far past any load test.
/// It keeps every deadline of a run (its start + the duration + twice the timeout) within what
/// an `Instant` can hold, where a longer one panicked every connection.
pub const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);

/// The highest `--rate` and `--stages` target, far past what one client sends. A year of it
/// (3.2e15 requests) stays a whole number in an `f64` and within a semaphore's permits (2^61),
/// so the dispatcher's counts cannot overflow; an unbounded rate made it panic.
pub const MAX_RATE: f64 = 100_000_000.0;

/// The default operation mix, in percent.
pub const DEFAULT_MIX: &str = "verify_request=50,verify_response=20,connection_invitation=10,credential_offer=10,transaction_status=10";

/// Command-line arguments of `agent-gateway load`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct LoadArgs {
    /// Instead of a run: redraw the report of a run saved with --save.
    #[command(subcommand)]
    pub command: Option<LoadCommand>,
    /// Base URL, `http://` or `https://` (`https://gw.example.com`), with no user or password;
    /// a path in it is a prefix before `/api/v1`.
    #[arg(long, required = true, value_parser = TargetArg)]
    pub target: Option<String>,
    /// Trust only the CA certificates of this PEM file for an https:// target (instead of the
    /// platform's roots).
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub cacert: Option<PathBuf>,
    /// Do not check the https:// target's certificate (a test deployment's self-signed one).
    #[arg(long)]
    pub insecure: bool,
    /// Speak HTTP/2: ALPN `h2` on an https:// target, prior knowledge (h2c) on http://.
    #[arg(long)]
    pub http2: bool,
    /// With --http2: requests in flight at once on each connection (each on its stream).
    #[arg(long, default_value_t = 1, requires = "http2")]
    pub streams: usize,
    /// Requests per second on a fixed schedule (open model), or `max`: each connection sends
    /// back to back (closed model). With --find-max: the first step's rate.
    #[arg(long, default_value = "1000")]
    pub rate: Rate,
    /// How long to send: `10s`, `500ms`, `2m`, or plain seconds. With --find-max: each step's
    /// length.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Ramps instead of a flat --rate: `DURATION:RATE,...` (e.g. `30s:500,2m:2000,30s:0`),
    /// each stage moving the open model's rate linearly from the previous target (0 at the
    /// start) to its own; `0s:RATE` jumps. The run lasts the stages' total.
    #[arg(long, conflicts_with_all = ["rate", "duration", "find_max"])]
    pub stages: Option<Stages>,
    /// End the run once this many answers are in (or at the end of its --duration or
    /// --stages, whichever comes first).
    #[arg(long, value_name = "N", conflicts_with = "find_max")]
    pub requests: Option<u64>,
    /// Pass/fail threshold, repeatable: `p99<50ms`, `errors<0.1%`, `rps>1800`, or a latency
    /// of one operation, `verify_request.p99<50ms` (metrics p50, p90, p99, p99.9, max, mean,
    /// errors, rps; <, <=, >, >=). A failed one makes the exit status 1.
    #[arg(long, value_name = "EXPR")]
    pub threshold: Vec<Threshold>,
    /// Write the report as one self-contained HTML page (charts over time, the latency
    /// distribution, parameters, verdicts) to this file.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Write one JSON line per request to this file as the run goes (intended start, latency,
    /// status or error, operation, agent); `load report FILE` redraws the report from it.
    #[arg(long, value_name = "FILE.jsonl", conflicts_with = "find_max")]
    pub save: Option<PathBuf>,
    /// Find the highest rate that holds the --slo: flat steps of --duration from --rate,
    /// doubling until one breaks it, then bisecting to within 5%.
    #[arg(long, requires = "slo", conflicts_with = "threshold")]
    pub find_max: bool,
    /// What a --find-max step must hold, in --threshold's syntax (e.g. `p99<10ms`); repeatable.
    #[arg(long, value_name = "EXPR", requires = "find_max")]
    pub slo: Vec<Threshold>,
    /// The most steps --find-max runs.
    #[arg(long, default_value_t = 12, requires = "find_max")]
    pub max_steps: usize,
    /// Client connections (kept alive; one request in flight each, or --streams with --http2).
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Operation weights, `name=weight,...` over verify_request, verify_response,
    /// connection_invitation, credential_offer, transaction_status.
    #[arg(long, default_value = DEFAULT_MIX)]
    pub mix: Mix,
    /// Interface version to call.
    #[arg(long, value_enum, default_value = "v1")]
    pub api: Api,
    /// Service business code put in v2 paths (required with `--api v2`, unless every agent
    /// of --agents has its own).
    #[arg(long)]
    pub service: Option<String>,
    /// Sent as X-Service-Agent-Id.
    #[arg(long, requires = "token", conflicts_with_all = ["credentials", "agents"])]
    pub agent_id: Option<String>,
    /// Sent as X-Auth-Token (prefer --credentials: a command line is visible to other users).
    #[arg(long, requires = "agent_id", conflicts_with_all = ["credentials", "agents"])]
    pub token: Option<Token>,
    /// A TOML or JSON file with `agent_id` and `token`.
    #[arg(long, conflicts_with = "agents")]
    pub credentials: Option<PathBuf>,
    /// A TOML file of `[[agents]]` (`id`, `token` or `token_file`, optional `service` and
    /// `weight`): requests are spread over them by weight.
    #[arg(long, value_name = "FILE")]
    pub agents: Option<PathBuf>,
    /// A header sent with every request, `Name: value`; repeatable.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE", value_parser = HeaderArgParser)]
    pub headers: Vec<HeaderArg>,
    /// Per-request time limit. Requests still due are sent for up to this long after the
    /// schedule's end (later ones count as unsent), each with its full limit: a run can end up
    /// to twice this after its --duration.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Runtime threads (default: the CPUs this process may run on).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object on stdout instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// What `agent-gateway load` does other than a run.
#[derive(Debug, clap::Subcommand)]
pub enum LoadCommand {
    /// Redraw the report of a run saved with --save, without the target: the same text,
    /// JSON and HTML as the run's own.
    Report(ReportArgs),
}

/// Arguments of `agent-gateway load report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The file the run wrote with --save.
    #[arg(value_name = "FILE.jsonl")]
    pub file: PathBuf,
    /// Judge these thresholds instead of the run's own; repeatable.
    #[arg(long, value_name = "EXPR")]
    pub threshold: Vec<Threshold>,
    /// Write the HTML report to this file.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Print the JSON report instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// The protocol a run speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HttpVersion {
    #[serde(rename = "1.1")]
    Http1,
    #[serde(rename = "2")]
    Http2,
}

impl HttpVersion {
    /// As the report shows it: `1.1` or `2`.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpVersion::Http1 => "1.1",
            HttpVersion::Http2 => "2",
        }
    }
}

/// Where to send: `Host` header value, socket address to resolve, and a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as given, for the report.
    pub url: String,
    /// `https://`: TLS to the target, the host named in it (SNI) and checked by the certificate.
    pub tls: bool,
    /// The host without port or IPv6 brackets: the name TLS asks for and checks.
    pub host: String,
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
        let bad = |why| LoadError::Target(redact_url(s), why);
        let uri: http::Uri = s.parse().map_err(|_| bad("not a URL"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(_) => return Err(bad("only http:// and https:// are supported")),
            None => return Err(bad("needs http:// or https://")),
        };
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if uri.query().is_some() {
            return Err(bad("no query string, please"));
        }
        // It would go in every request's Host and in the report; the gateway takes no basic
        // auth.
        if authority.as_str().contains('@') {
            return Err(bad(
                "must not carry a user or password (the agent's credentials are --agent-id \
                 and --token, --credentials or --agents)",
            ));
        }
        if !port_is_a_number(authority) {
            return Err(bad("its port is not a number from 0 to 65535"));
        }
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(Target {
            url: s.to_owned(),
            tls,
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            authority: authority.as_str().to_owned(),
            host_port: format!("{}:{port}", authority.host()),
            prefix,
        })
    }
}

/// Checks `--target` while the arguments are parsed; kept as text so `LoadArgs` stays small.
/// A target refused is a usage error (exit 2) in its own words: clap's would repeat the
/// value as given, a password with it.
#[derive(Clone)]
pub(super) struct TargetArg;

impl clap::builder::TypedValueParser for TargetArg {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let text = value
            .to_str()
            .ok_or_else(|| refused(cmd, "bad --target: not UTF-8".into()))?;
        text.parse::<Target>()
            .map(|_| text.to_owned())
            .map_err(|e| refused(cmd, e.to_string()))
    }
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
            Ok(r) if r > 0.0 && r <= MAX_RATE => Ok(Rate::PerSecond(r)),
            _ => Err(LoadError::Rate(s.to_owned())),
        }
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h`, `1.5s` or plain seconds, at most [`LONGEST`].
pub fn parse_duration(s: &str) -> Result<Duration, LoadError> {
    match parse_seconds(s) {
        Some(secs) if secs > LONGEST.as_secs_f64() => Err(LoadError::TooLong(s.to_owned())),
        Some(secs) if secs > 0.0 => {
            Duration::try_from_secs_f64(secs).map_err(|_| LoadError::Duration(s.to_owned()))
        }
        _ => Err(LoadError::Duration(s.to_owned())),
    }
}

/// A duration in seconds as [`parse_duration`] reads it, zero allowed; `None` when malformed.
fn parse_seconds(s: &str) -> Option<f64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "us" | "µs" => n / 1_000_000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then_some(secs)
}

/// `--stages`: `DURATION:RATE,...`, each stage moving the open model's rate linearly from the
/// previous stage's target (zero before the first) to its own over its duration. A stage of
/// `0s` jumps.
#[derive(Debug, Clone, PartialEq)]
pub struct Stages(pub Vec<Stage>);

impl FromStr for Stages {
    type Err = LoadError;

    fn from_str(s: &str) -> Result<Self, LoadError> {
        let bad = |item: &str, why: &str| LoadError::Stages(format!("{item:?}: {why}"));
        let mut stages = Vec::new();
        for item in s.split(',').map(str::trim) {
            let (duration, target) = item
                .split_once(':')
                .ok_or_else(|| bad(item, "not DURATION:RATE (e.g. 30s:500)"))?;
            let secs = parse_seconds(duration)
                .ok_or_else(|| bad(item, "the duration is not e.g. 30s, 2m, 500ms or 0s"))?;
            let duration = Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|d| *d <= LONGEST)
                .ok_or_else(|| bad(item, "the duration is longer than a year (8760h)"))?;
            let target = match target.trim().parse::<f64>() {
                Ok(r) if r > MAX_RATE => {
                    return Err(bad(
                        item,
                        &format!("the rate is more than {MAX_RATE} requests per second"),
                    ))
                }
                Ok(r) if r >= 0.0 => r,
                _ => {
                    return Err(bad(
                        item,
                        "the rate is not a number of requests per second >= 0",
                    ))
                }
            };
            stages.push(Stage { duration, target });
        }
        if stages.iter().all(|s| s.duration.is_zero()) {
            return Err(LoadError::Stages("the stages last no time".into()));
        }
        if stages.iter().map(|s| s.duration).sum::<Duration>() > LONGEST {
            return Err(LoadError::Stages(
                "the stages last longer than a year (8760h)".into(),
            ));
        }
        Ok(Stages(stages))
    }
}

/// The interface version to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    V1,
    V2,
}

impl Api {
    pub(super) fn version(self) -> ApiVersion {
        match self {
            Api::V1 => ApiVersion::V1,
            Api::V2 => ApiVersion::V2,
        }
    }
}

/// Relative weights of the operations (indexed like [`Operation::ALL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    pub(super) weights: [u32; Operation::COUNT],
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
pub(super) fn splitmix64(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Mix {
    /// The operation of request `i`: a deterministic draw with the mix's weights.
    pub fn pick(&self, i: u64) -> Operation {
        let k =
            draw(&self.weights, self.total, splitmix64(i)).expect("a mix has a weight above zero");
        Operation::ALL[k]
    }

    /// A draw for request `i` among the operations other than `not`, with their weights;
    /// `None` when the mix has no other.
    pub fn pick_other_than(&self, i: u64, not: Operation) -> Option<Operation> {
        let mut weights = self.weights;
        weights[not as usize] = 0;
        let total = weights.iter().map(|&w| u64::from(w)).sum();
        draw(&weights, total, splitmix64(i)).map(|k| Operation::ALL[k])
    }
}

/// The index whose share of `total` (the sum of `weights`) the random number `r` falls in;
/// `None` when every weight is zero.
pub(super) fn draw(weights: &[u32], total: u64, r: u64) -> Option<usize> {
    if total == 0 {
        return None;
    }
    let mut r = r % total;
    for (k, w) in weights.iter().enumerate() {
        let w = u64::from(*w);
        if r < w {
            return Some(k);
        }
        r -= w;
    }
    unreachable!("r < total, the sum of the weights")
}

/// Relative weights of a list (the agents of a run), for deterministic draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights {
    weights: Vec<u32>,
    total: u64,
}

impl Weights {
    /// `None` when every weight is zero (or there is none).
    pub fn new(weights: Vec<u32>) -> Option<Weights> {
        let total = weights.iter().map(|&w| u64::from(w)).sum();
        (total > 0).then_some(Weights { weights, total })
    }

    /// The index the random number `r` draws.
    pub fn pick(&self, r: u64) -> usize {
        draw(&self.weights, self.total, r).expect("weights with a total above zero")
    }

    /// `n` shared out by weight in whole numbers that add up to `n` (the largest remainders
    /// get the leftovers, the first on a tie): what many draws come to, without drawing each.
    pub fn share(&self, n: u64) -> Vec<u64> {
        let total = u128::from(self.total);
        let exact = |w: u32| u128::from(n) * u128::from(w);
        let mut shares: Vec<u64> = self
            .weights
            .iter()
            .map(|&w| (exact(w) / total) as u64)
            .collect();
        let left = n - shares.iter().sum::<u64>();
        let mut by_remainder: Vec<usize> = (0..shares.len()).collect();
        by_remainder.sort_by_key(|&k| std::cmp::Reverse(exact(self.weights[k]) % total));
        for &k in by_remainder.iter().take(left as usize) {
            shares[k] += 1;
        }
        shares
    }
}

/// `-H 'Name: value'`: a header sent with every request.
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderArg {
    /// Lower case, as HTTP/2 sends it (HTTP/1.1 names are case-insensitive).
    pub name: http::HeaderName,
    pub value: http::HeaderValue,
}

/// By hand, so that the value, which may be a secret (an `Authorization`), is never printed.
impl fmt::Debug for HeaderArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { name, value: _ } = self;
        f.debug_struct("HeaderArg")
            .field("name", name)
            .field("value", &REDACTED)
            .finish()
    }
}

/// Headers the generator writes itself for each request (framing, the connection, the
/// credentials of the agent the request is from): `-H` may not set them.
const OWN_HEADERS: [&str; 11] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "x-service-agent-id",
    "x-auth-token",
];

/// A refused `-H` names its header, as written, only once it is one: an argument with no `:`
/// or no header name before it (`Authorization Bearer ...`) may hold the secret anywhere.
impl FromStr for HeaderArg {
    type Err = LoadError;

    fn from_str(s: &str) -> Result<Self, LoadError> {
        let unnamed = |why| LoadError::Header { name: None, why };
        let (written, value) = s
            .split_once(':')
            .ok_or_else(|| unnamed("not `Name: value`"))?;
        let written = written.trim();
        let name = http::HeaderName::from_bytes(written.as_bytes())
            .map_err(|_| unnamed("the name is not an HTTP header name"))?;
        let bad = |why| LoadError::Header {
            name: Some(written.to_owned()),
            why,
        };
        if OWN_HEADERS.contains(&name.as_str()) {
            return Err(bad(
                "the generator sets this header itself (the agents' credentials come from --agents, --credentials or --agent-id/--token)",
            ));
        }
        let value = http::HeaderValue::from_str(value.trim())
            .map_err(|_| bad("the value holds a control character"))?;
        Ok(HeaderArg { name, value })
    }
}

/// Parses `-H` while the arguments are parsed: a header refused is a usage error (exit 2) in
/// its own words, which name the header, not its value; clap's would repeat the argument.
#[derive(Clone)]
pub(super) struct HeaderArgParser;

impl clap::builder::TypedValueParser for HeaderArgParser {
    type Value = HeaderArg;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<HeaderArg, clap::Error> {
        let text = value
            .to_str()
            .ok_or_else(|| refused(cmd, "bad -H: not UTF-8".into()))?;
        text.parse()
            .map_err(|e: LoadError| refused(cmd, e.to_string()))
    }
}

/// An argument refused in `message`, a usage error (exit 2), without clap's own words, which
/// repeat the value as given.
fn refused(cmd: &clap::Command, message: String) -> clap::Error {
    clap::Error::raw(clap::error::ErrorKind::ValueValidation, message + "\n").with_cmd(cmd)
}

/// Agent credentials as read from `--credentials`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Credentials {
    pub agent_id: String,
    pub token: Token,
}

impl Credentials {
    /// The names its keys have: an error in its file names no other.
    const KEYS: &'static [&'static str] = &["agent_id", "token"];
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
        toml::from_str(text).map_err(|e| format(toml_mistake(text, &e, Credentials::KEYS)))?
    };
    if creds.agent_id.is_empty() || creds.token.as_str().is_empty() {
        return Err(format("agent_id and token must not be empty".into()));
    }
    Ok(creds)
}
