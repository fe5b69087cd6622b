//! The `agent-gateway` command line: the binary's edge, where errors become `anyhow`.
//! Parsing and dispatch are here; each command is a file of `cli/`.

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use agent_gateway::client::ClientOptions;
use agent_gateway::config::SeriesSelector;
use clap::{Parser, Subcommand};

use cli::{ConfigFile, LogArgs};

/// mimalloc (the default feature `mimalloc`): a request's allocations cost a few instructions
/// each where glibc's malloc takes its slow path for most of them (docs/performance.md);
/// `--no-default-features` builds on the system's malloc.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "agent-gateway",
    version,
    about = "Serves v1 and v2 of the Agent REST Service in front of a v2 backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Run {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Take over the listening sockets of a running gateway (after SIGQUIT to it).
        #[arg(long)]
        upgrade: bool,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Run the gateway and, in the same process, the mock v2 backend on the config's first
    /// upstream address: a working demo with nothing else to set up.
    Demo {
        #[command(flatten)]
        config: ConfigFile,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Validate a config file: exit 0 when valid, else print every problem, in the order of
    /// the file, and exit 1.
    CheckConfig {
        /// The TOML config file.
        #[arg(long, short, value_name = "FILE", required_unless_present = "file")]
        config: Option<PathBuf>,
        /// The config file given without --config: the form of earlier builds, kept for one
        /// release (use --config).
        #[arg(value_name = "FILE", conflicts_with = "config")]
        file: Option<PathBuf>,
        /// Check upstream host names for their form without looking them up: for CI away from
        /// the DNS the gateway will run with (a Kubernetes Service name, say).
        #[arg(long)]
        no_resolve: bool,
        /// Read the files the config names under MOUNTED (a Secret's mount in the pod) from
        /// LOCAL (the files the Secret is made of), e.g. in a kustomize overlay:
        /// --mount /etc/agent-gateway-secrets=. (repeatable)
        #[arg(long, value_name = "MOUNTED=LOCAL")]
        mount: Vec<agent_gateway::config::Mount>,
    },
    /// The effective config.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Read a token on stdin and print the hex SHA-256 to put in `token_sha256`.
    HashToken,
    /// Print the OpenAPI 3.1 document of the proxy's public interface for a config (no
    /// upstream host name is looked up).
    Openapi {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Print which agents still call v1: from a running gateway's admin listener (what it saw
    /// since it started), or with --prometheus from the whole fleet a Prometheus scrapes.
    V1Usage {
        /// The admin listener's base URL.
        #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:9090")]
        admin: String,
        /// A Prometheus that scrapes every replica: its base URL, http:// or https://, with its
        /// route prefix if any and `user:password@` for basic auth. Counts summed over
        /// replicas and restarts.
        #[arg(long, value_name = "URL", conflicts_with_all = ["admin", "admin_token_file"])]
        prometheus: Option<String>,
        /// A file holding the admin token (`[admin] token_sha256` is its digest) to send as
        /// `Authorization: Bearer`; a trailing newline is not part of it.
        #[arg(long, value_name = "FILE")]
        admin_token_file: Option<PathBuf>,
        /// With --prometheus: PEM CA certificates its certificate must chain to, instead of
        /// the platform's.
        #[arg(long, value_name = "FILE", requires = "prometheus")]
        prometheus_ca_file: Option<PathBuf>,
        /// With --prometheus: a file holding a bearer token to send (Grafana Cloud, Amazon
        /// Managed Prometheus through a signing proxy, Mimir, Thanos behind an auth proxy).
        #[arg(long, value_name = "FILE", requires = "prometheus")]
        prometheus_token_file: Option<PathBuf>,
        /// With --prometheus: a file holding `user:password` for basic auth (rather than in
        /// the URL, where other users can see it).
        #[arg(
            long,
            value_name = "FILE",
            requires = "prometheus",
            conflicts_with = "prometheus_token_file"
        )]
        prometheus_basic_auth_file: Option<PathBuf>,
        /// With --prometheus: PromQL label matchers that pick one deployment's replicas out of
        /// a Prometheus that scrapes several, as `retirement.prometheus_selector` takes them:
        /// `job="agent-gateway",namespace="prod"` (braces optional). Every query is
        /// restricted to the series they match.
        #[arg(long, value_name = "MATCHERS", requires = "prometheus")]
        prometheus_selector: Option<SeriesSelector>,
        /// With --prometheus: how far back to count (`30d`, `12h`, ...).
        #[arg(long, default_value = "30d", requires = "prometheus")]
        window: humantime::Duration,
        /// Print the JSON (the shape of /v1-usage) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Generate load against a gateway (or any Agent API endpoint) and report latencies.
    Load(Box<agent_gateway::tools::load::LoadArgs>),
    /// Run the mock v2 backend alone.
    MockBackend {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
        /// Base path of the v2 operations.
        #[arg(long, default_value = "/api/v2")]
        base_path: String,
        /// Worker threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[command(flatten)]
        log: LogArgs,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective config: every default filled in, dates in UTC, durations in
    /// milliseconds, secrets and token digests redacted (no upstream host name is looked up).
    /// An invalid file: every problem, and exit 1.
    Dump {
        #[command(flatten)]
        config: ConfigFile,
        /// Print JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        // `agent-gateway openapi | head` is not a failure.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-gateway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            config,
            upgrade,
            log,
        } => cli::run::run(&config, upgrade, &log),
        Command::Demo { config, log } => cli::demo::run(&config.config, &log),
        Command::CheckConfig {
            config,
            file,
            no_resolve,
            mount,
        } => {
            if let Some(file) = &file {
                eprintln!(
                    "agent-gateway: note: `check-config {0}` is deprecated and goes in a later \
                     release; use `check-config --config {0}`",
                    file.display()
                );
            }
            let path = config.or(file).expect("clap requires --config or FILE");
            cli::check_config::run(&path, no_resolve, &mount)
        }
        Command::Config {
            command: ConfigCommand::Dump { config, json },
        } => cli::config_dump::run(&config.config, json),
        Command::HashToken => cli::hash_token::run(),
        Command::Openapi { config } => cli::openapi::run(&config.config),
        Command::V1Usage {
            prometheus: Some(url),
            prometheus_ca_file,
            prometheus_token_file,
            prometheus_basic_auth_file,
            prometheus_selector,
            window,
            json,
            ..
        } => {
            let options = ClientOptions {
                ca_file: prometheus_ca_file,
                token_file: prometheus_token_file,
                basic_auth_file: prometheus_basic_auth_file,
            };
            let selector = prometheus_selector.unwrap_or_default();
            cli::v1_usage::from_prometheus(&url, &options, &selector, window, json)
        }
        Command::V1Usage {
            admin,
            prometheus: None,
            admin_token_file,
            json,
            ..
        } => {
            let options = ClientOptions {
                token_file: admin_token_file,
                ..ClientOptions::default()
            };
            cli::v1_usage::from_admin(&admin, &options, json)
        }
        Command::Load(args) => cli::load::run(*args),
        Command::MockBackend {
            listen,
            base_path,
            threads,
            log,
        } => cli::mock_backend::run(listen, &base_path, threads, &log),
    }
}
