//! `agent-gateway load`: a load generator that speaks the Agent API.
//!
//! Two models:
//! - **Open** (`--rate N`, or ramps with `--stages 30s:500,2m:2000,30s:0`): request `i` is due
//!   when the schedule has called for `i` requests (at `start + i / N` for a flat rate),
//!   whatever happened to earlier requests. A dispatcher thread releases requests on that
//!   schedule (with `nanosleep` precision, not tokio's 1 ms timer), any idle connection (or
//!   free HTTP/2 stream) takes the next one, and latency is measured from the request's
//!   *intended* start. A slow server therefore shows up as latency rather than as a politely
//!   lower send rate (no coordinated omission).
//! - **Closed** (`--rate max`): every connection (or stream) sends its next request as soon as
//!   the last answer is in; latency is measured from the actual send.
//!
//! Requests are spread over one or several agents (`--agents`) by weight, each agent's status
//! reads asking for transactions it was given. On top of a run: `--threshold` verdicts (exit 1
//! when one fails; a latency may be of one operation), `--report FILE.html` (one
//! self-contained page of charts), `--find-max --slo ...` (steps the rate up to the highest
//! that holds the SLO), `--requests N`, `--save FILE.jsonl` (a line per request, from which
//! `load report` draws the report again), and Ctrl-C, which ends a run early and still
//! reports it.
//!
//! Connections are kept alive, over TCP or TLS (`https://`: rustls, the platform's roots,
//! `--cacert`, `--insecure`): HTTP/1.1 with one request in flight, its answers read by the
//! crate's shared [`crate::http1::client`], or with `--http2` the `h2` crate's client with
//! `--streams` requests in flight. The pure parts are plain functions, tested in `tests.rs`,
//! each file using only the ones before it: the arguments, the agents, the schedule,
//! thresholds, requests, connections (`transport`), the plan; what connections count
//! (`stats`, `timeline`); the report, thresholds judged against it, its HTML; the saved file;
//! the knee search's steps. The shell (`exec`, driven by [`run()`]) only moves bytes.

use std::net::SocketAddr;

mod agents;
mod args;
mod exec;
mod html;
mod judge;
mod knee;
mod output;
mod plan;
mod replay;
mod report;
mod request;
mod run;
mod save;
mod schedule;
mod stats;
#[cfg(test)]
mod tests;
mod threshold;
mod timeline;
mod transport;

pub use args::{Api, LoadArgs, LoadCommand, Mix, Rate, ReportArgs, Stages};
pub use output::Outcome;
pub use run::run;
pub use threshold::Threshold;

use crate::client::tls::TlsError;
use transport::ConnectError;

/// Why a load run failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("bad --target {0:?}: {1}")]
    Target(String, &'static str),
    #[error("bad --rate {0:?}: give requests per second (> 0, at most {max}) or `max`", max = args::MAX_RATE)]
    Rate(String),
    #[error("bad duration {0:?}: use e.g. 10s, 500ms, 2m or plain seconds")]
    Duration(String),
    #[error("bad duration {0:?}: at most a year (8760h)")]
    TooLong(String),
    #[error("bad --stages: {0}")]
    Stages(String),
    #[error("bad threshold {0:?}: {1}")]
    Threshold(String, String),
    /// Named by its header once it has one; never its value, which may be a secret.
    #[error("bad -H{}: {why}", name.as_ref().map(|n| format!(" {n}")).unwrap_or_default())]
    Header {
        name: Option<String>,
        why: &'static str,
    },
    #[error("cannot write the report {path}: {source}")]
    Report {
        path: String,
        source: std::io::Error,
    },
    #[error("bad --mix: {0}")]
    Mix(String),
    #[error("--api v2 needs --service CODE (or a service for every agent of --agents)")]
    MissingService,
    #[error("bad --service: {0}")]
    Service(String),
    #[error("give --agent-id and --token, --credentials FILE, or --agents FILE")]
    MissingCredentials,
    #[error("cannot read credentials {path}: {source}")]
    CredentialsRead {
        path: String,
        source: std::io::Error,
    },
    #[error("bad credentials file {path}: {message}")]
    CredentialsFormat { path: String, message: String },
    #[error("cannot read the agents file {path}: {source}")]
    AgentsRead {
        path: String,
        source: std::io::Error,
    },
    #[error("bad agents file {path}: {message}")]
    AgentsFormat { path: String, message: String },
    #[error("{0}")]
    Invalid(&'static str),
    /// Its message names the CA file, or the certificate, it is about.
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("cannot connect to {0}: {1}")]
    Connect(SocketAddr, ConnectError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// What was measured is no report: requests due were never released.
    #[error("the run failed: its dispatcher panicked ({0}); no report")]
    Dispatcher(String),
    #[error("cannot write the saved run {path}: {source}")]
    Save {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot read the saved run {path}: {source}")]
    SavedRead {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    SavedFormat {
        path: String,
        line: usize,
        message: String,
    },
}
