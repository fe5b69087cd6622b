//! A validated run: what it was asked to do as its report describes it (the [`Setup`], which a
//! saved run keeps), what to send (the script), to which address and how (the connector);
//! and what the command does with it (one run, or `--find-max`). Made from the command
//! line's arguments before anything is sent.

use std::net::ToSocketAddrs;
use std::path::Path;
use std::time::Duration;

use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};

use crate::client::tls::{client_config, Trust};
use crate::config::BusinessCode;

use super::agents::{read_agents, single, Agent};
use super::args::{
    parse_credentials, splitmix64, Api, Credentials, HttpVersion, LoadArgs, Rate, Target, Weights,
};
use super::request::{AgentScript, Script};
use super::schedule::Schedule;
use super::threshold::Threshold;
use super::transport::Connector;
use super::LoadError;

/// How requests are started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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

/// An agent as a report names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentWeight {
    pub id: String,
    pub weight: u32,
}

/// What a run was asked to do, as its report describes it and its saved file keeps it: no
/// address, no credential.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    /// The URL as given.
    pub target: String,
    pub api: Api,
    pub http: HttpVersion,
    pub load: Load,
    pub connections: usize,
    /// Requests in flight at once per connection (HTTP/2 streams; 1 for HTTP/1.1).
    pub streams: usize,
    pub mix: String,
    pub timeout: Duration,
    pub agents: Vec<AgentWeight>,
    /// The names of the `-H` headers (their values may be secrets).
    pub headers: Vec<String>,
    /// `--requests`: the run ends once this many answers are in.
    pub requests: Option<u64>,
}

/// A validated run, ready to execute.
#[derive(Debug, Clone)]
pub struct Plan {
    pub setup: Setup,
    pub connector: Connector,
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
    /// Checks the arguments, reads the credentials, resolves the target and makes its TLS
    /// settings.
    pub fn from_args(args: &LoadArgs) -> Result<Self, LoadError> {
        if args.connections == 0 {
            return Err(LoadError::Invalid("--connections must be at least 1"));
        }
        if args.streams == 0 {
            return Err(LoadError::Invalid("--streams must be at least 1"));
        }
        if args.requests == Some(0) {
            return Err(LoadError::Invalid("--requests must be at least 1"));
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
        let default_service = args
            .service
            .as_deref()
            .map(|code| {
                BusinessCode::parse(code)
                    .map(|c| c.as_str().to_owned())
                    .map_err(LoadError::Service)
            })
            .transpose()?;
        // Each agent with the code of its v2 paths: its own, else --service.
        let agents = agents_of(args)?
            .into_iter()
            .map(|a| {
                let service = match args.api {
                    Api::V1 => String::new(),
                    Api::V2 => a
                        .service
                        .clone()
                        .or_else(|| default_service.clone())
                        .ok_or(LoadError::MissingService)?,
                };
                Ok((a, service))
            })
            .collect::<Result<Vec<(Agent, String)>, LoadError>>()?;
        let target_text = args
            .target
            .as_deref()
            .ok_or(LoadError::Invalid("give --target URL"))?;
        let target: Target = target_text.parse()?;
        if !target.tls && (args.cacert.is_some() || args.insecure) {
            return Err(LoadError::Invalid(
                "--cacert and --insecure are for an https:// target",
            ));
        }
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
        let http = if args.http2 {
            HttpVersion::Http2
        } else {
            HttpVersion::Http1
        };
        let connector = if target.tls {
            let trust = match (&args.cacert, args.insecure) {
                (Some(file), _) => Trust::CaFile(file.clone()),
                (None, true) => Trust::Insecure,
                (None, false) => Trust::Platform,
            };
            let alpn: &[u8] = match http {
                HttpVersion::Http1 => b"http/1.1",
                HttpVersion::Http2 => b"h2",
            };
            let config = client_config(&trust, &[alpn])?;
            let name = ServerName::try_from(target.host.clone())
                .map_err(|_| LoadError::Target(target_text.to_owned(), "no host TLS can name"))?;
            Connector::tls(addr, config, name)
        } else {
            Connector::plain(addr)
        };
        let setup = Setup {
            target: target.url.clone(),
            api: args.api,
            http,
            load,
            connections: args.connections,
            streams: match http {
                HttpVersion::Http1 => 1,
                HttpVersion::Http2 => args.streams,
            },
            mix: args.mix.to_string(),
            timeout: args.timeout,
            agents: agents
                .iter()
                .map(|(a, _)| AgentWeight {
                    id: a.id.clone(),
                    weight: a.weight,
                })
                .collect(),
            headers: args.headers.iter().map(|h| h.name.to_string()).collect(),
            requests: args.requests,
        };
        let agent_weights = Weights::new(agents.iter().map(|(a, _)| a.weight).collect())
            .ok_or(LoadError::Invalid("every agent's weight is zero"))?;
        Ok(Plan {
            setup,
            connector,
            script: Script {
                authority: target.authority,
                prefix: target.prefix,
                api: args.api.version(),
                agents: agents
                    .into_iter()
                    .map(|(a, service)| AgentScript {
                        id: a.id,
                        token: a.token,
                        service,
                    })
                    .collect(),
                agent_weights,
                headers: args.headers.clone(),
                mix: args.mix.clone(),
                run: run_id(),
            },
            progress: true,
        })
    }
}

/// The agents the arguments give: `--agents`, `--credentials`, or `--agent-id`/`--token`.
fn agents_of(args: &LoadArgs) -> Result<Vec<Agent>, LoadError> {
    match (&args.agent_id, &args.token, &args.credentials, &args.agents) {
        (Some(agent_id), Some(token), None, None) => single(agent_id.clone(), token.clone()),
        (None, None, Some(path), None) => {
            let creds = read_credentials(path)?;
            single(creds.agent_id, creds.token)
        }
        (None, None, None, Some(path)) => read_agents(path),
        _ => Err(LoadError::MissingCredentials),
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
