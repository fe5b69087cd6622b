//! A validated run: what to send (the script), how fast (the load model), to which address,
//! over how many connections; and what the command does with it (one run, or `--find-max`).
//! Made from the command line's arguments before anything is sent.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use crate::config::BusinessCode;

use super::args::{parse_credentials, splitmix64, Api, Credentials, LoadArgs, Rate, Target};
use super::request::Script;
use super::schedule::Schedule;
use super::threshold::Threshold;
use super::LoadError;

/// How requests are started.
#[derive(Debug, Clone)]
pub enum Load {
    /// On a fixed schedule, whatever the answers do.
    Open(Schedule),
    /// Back to back on each connection, for this long (`--rate max`).
    Closed(Duration),
}

impl Load {
    /// How long the run sends.
    pub fn duration(&self) -> Duration {
        match self {
            Load::Open(s) => s.duration(),
            Load::Closed(d) => *d,
        }
    }
}

/// A validated run, ready to execute.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target_url: String,
    pub addr: SocketAddr,
    pub load: Load,
    pub connections: usize,
    pub timeout: Duration,
    pub script: Script,
    /// Write the one-second progress line to stderr.
    pub progress: bool,
}

/// What the command does with its plan.
#[derive(Debug, Clone)]
pub enum Mode {
    /// One run, judged against `--threshold`s.
    Run { thresholds: Vec<Threshold> },
    /// `--find-max`: flat steps of the plan's duration from `start` req/s, each judged
    /// against the SLO.
    FindMax {
        slo: Vec<Threshold>,
        start: f64,
        max_steps: usize,
    },
}

pub(super) fn run_id() -> u64 {
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
        let load = match (&args.stages, args.rate) {
            (Some(stages), _) => Load::Open(Schedule::ramps(stages.0.clone())),
            (None, Rate::PerSecond(r)) => Load::Open(Schedule::flat(r, args.duration)),
            (None, Rate::Max) if args.find_max => {
                return Err(LoadError::Invalid(
                    "--find-max steps an open model: give the first step's rate as --rate N",
                ))
            }
            (None, Rate::Max) => Load::Closed(args.duration),
        };
        if let Load::Open(schedule) = &load {
            if schedule.total() == 0 {
                return Err(LoadError::Invalid(
                    "the schedule sends no request (--rate × --duration, or the stages, make less than one)",
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
            load,
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

impl Mode {
    /// The mode the arguments ask for; the plan's rate is the first step's under `--find-max`.
    pub fn from_args(args: &LoadArgs) -> Result<Self, LoadError> {
        if !args.find_max {
            return Ok(Mode::Run {
                thresholds: args.threshold.clone(),
            });
        }
        let Rate::PerSecond(start) = args.rate else {
            return Err(LoadError::Invalid(
                "--find-max steps an open model: give the first step's rate as --rate N",
            ));
        };
        if args.max_steps == 0 {
            return Err(LoadError::Invalid("--max-steps must be at least 1"));
        }
        Ok(Mode::FindMax {
            slo: args.slo.clone(),
            start,
            max_steps: args.max_steps,
        })
    }
}

pub(super) fn read_credentials(path: &Path) -> Result<Credentials, LoadError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::CredentialsRead {
        path: shown.clone(),
        source,
    })?;
    parse_credentials(&text, &shown)
}
