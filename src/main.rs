//! The `agent-gateway` command line: the binary's edge, where errors become `anyhow`.
//! Parsing and dispatch are here; each command is a file of `cli/`.

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::LogArgs;

/// mimalloc, with `--features mimalloc`: within noise of the system's malloc on CPU per request
/// (about 3 % less over six alternating runs), for 11 MiB more idle RSS and 1 KiB more per
/// connection, so the default is the system's malloc.
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
        #[arg(long, short, default_value = "config/gateway.toml")]
        config: PathBuf,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Validate a config file: exit 0 when valid, else print every problem and exit 1.
    CheckConfig {
        /// The TOML config file.
        file: PathBuf,
        /// Check upstream host names for their form without looking them up: for CI away from
        /// the DNS the gateway will run with (a Kubernetes Service name, say).
        #[arg(long)]
        no_resolve: bool,
    },
    /// Read a token on stdin and print the hex SHA-256 to put in `token_sha256`.
    HashToken,
    /// Print the OpenAPI 3.1 document of the proxy's public interface for a config.
    Openapi {
        #[arg(long, short, default_value = "config/gateway.toml")]
        config: PathBuf,
    },
    /// Print which agents still call v1: from a running gateway's admin listener (what it saw
    /// since it started), or with --prometheus from the whole fleet a Prometheus scrapes.
    V1Usage {
        /// The admin listener's base URL.
        #[arg(long, default_value = "http://127.0.0.1:9090")]
        admin: String,
        /// A Prometheus that scrapes every replica (base URL, with its route prefix if any):
        /// counts summed over replicas and restarts.
        #[arg(long, conflicts_with = "admin")]
        prometheus: Option<String>,
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
        Command::Demo { config, log } => cli::demo::run(&config, &log),
        Command::CheckConfig { file, no_resolve } => cli::check_config::run(&file, no_resolve),
        Command::HashToken => cli::hash_token::run(),
        Command::Openapi { config } => cli::openapi::run(&config),
        Command::V1Usage {
            prometheus: Some(base),
            window,
            json,
            ..
        } => cli::v1_usage::from_prometheus(&base, window, json),
        Command::V1Usage {
            admin,
            prometheus: None,
            json,
            ..
        } => cli::v1_usage::from_admin(&admin, json),
        Command::Load(args) => cli::load::run(*args),
        Command::MockBackend {
            listen,
            base_path,
            threads,
            log,
        } => cli::mock_backend::run(listen, &base_path, threads, &log),
    }
}
