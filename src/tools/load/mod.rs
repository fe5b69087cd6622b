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
//! parts are plain functions, tested in `tests.rs`, each file using only the ones before it:
//! the arguments, the schedule, thresholds, request bytes, the plan; what connections count
//! (`stats`, `timeline`); the report, thresholds judged against it, its HTML; the knee
//! search's steps. The shell ([`run()`]) only moves bytes.

use std::net::SocketAddr;

mod args;
mod html;
mod judge;
mod knee;
mod plan;
mod report;
mod request;
mod run;
mod schedule;
mod stats;
#[cfg(test)]
mod tests;
mod threshold;
mod timeline;

pub use args::{Api, LoadArgs, Mix, Rate, Stages};
pub use run::{run, Outcome};
pub use threshold::Threshold;

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
