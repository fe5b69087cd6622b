//! `agent-gateway load`: a load generator that speaks the Agent API.
//!
//! Two models:
//! - **Open** (`--rate N`, or ramps with `--stages 30s:500,2m:2000,30s:0`): request `i` is due
//!   when the schedule has called for `i` requests (at `start + i / N` for a flat rate),
//!   whatever happened to earlier requests. A dispatcher thread releases requests on that
//!   schedule (with `nanosleep` precision, not tokio's 1 ms timer), any idle connection takes
//!   the next one, and latency is measured from the request's *intended* start. A slow server
//!   therefore shows up as latency rather than as a politely lower send rate (no coordinated
//!   omission).
//! - **Closed** (`--rate max`): every connection sends its next request as soon as the last
//!   answer is in; latency is measured from the actual send.
//!
//! On top of a run: `--threshold` verdicts (exit 1 when one fails), `--report FILE.html` (one
//! self-contained page of charts), `--find-max --slo ...` (steps the rate up to the highest
//! that holds the SLO), and Ctrl-C, which ends a run early and still reports it.
//!
//! Each connection is a kept-alive HTTP/1.1 client over a plain `TcpStream` (http only), one
//! request in flight, its answers read by the crate's shared [`crate::http1::client`]. The pure
//! parts (arguments, the schedule, thresholds, the knee search's steps, request bytes, the
//! report and its HTML) are plain functions, tested in `tests.rs`; the shell ([`run()`]) only
//! moves bytes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod args;
mod html;
mod knee;
mod report;
mod request;
mod run;
mod schedule;
#[cfg(test)]
mod tests;
mod threshold;
mod timeline;

use args::{check_target, parse_duration};
pub use args::{Api, Mix, Rate, Stages};
pub use run::{run, Outcome};
pub use threshold::Threshold;

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
    /// Pass/fail threshold, repeatable: `p99<50ms`, `errors<0.1%`, `rps>1800` (metrics p50,
    /// p90, p99, p99.9, max, mean, errors, rps; <, <=, >, >=). A failed one makes the exit
    /// status 1.
    #[arg(long, value_name = "EXPR")]
    pub threshold: Vec<Threshold>,
    /// Write the report as one self-contained HTML page (charts over time, the latency
    /// distribution, parameters, verdicts) to this file.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
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
    #[error("bad --stages: {0}")]
    Stages(String),
    #[error("bad threshold {0:?}: {1}")]
    Threshold(String, String),
    #[error("cannot write the report {path}: {source}")]
    Report {
        path: String,
        source: std::io::Error,
    },
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
