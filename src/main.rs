//! The `agent-gateway` command line: the binary's edge, where errors become `anyhow`.
//! Parsing and dispatch are here; commands with logic of their own are in `cli/`.

mod cli;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};

use agent_gateway::config::{BasePath, ConfigError, Snapshot};

/// mimalloc, with `--features mimalloc`. It once gave 1.5x the requests/s of glibc malloc, when
/// pingora's HTTP sessions allocated dozens of objects per request; with a handful per request
/// now, six alternating runs put it within noise (about 3 % less CPU per request), for 11 MiB
/// more idle RSS and 1 KiB more per connection, so the default is the system's malloc.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use agent_gateway::app::listeners::{self, ListenAddrs, Listeners};
use agent_gateway::app::logging::{self, LogFormat};
use agent_gateway::app::reload::ConfigStore;
use agent_gateway::app::serve::serve_app;
use agent_gateway::app::server::{self, BuildOptions};
use agent_gateway::observe::fleet;
use agent_gateway::observe::usage::UsageReport;
use agent_gateway::tools::mock_backend::MockBackend;
use pingora::apps::http_app::HttpServer;

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

#[derive(Args)]
struct LogArgs {
    /// Log line format.
    #[arg(
        long,
        value_enum,
        default_value = "json",
        env = "AGENT_GATEWAY_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// Log level or filter when RUST_LOG is not set (e.g. `info`, `agent_gateway=debug`).
    #[arg(long, default_value = "info")]
    log_level: String,
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

/// Loads the config file into a live store that reloads from the same path.
fn load_store(path: &Path) -> anyhow::Result<ConfigStore> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let snapshot =
        Snapshot::parse(&text).with_context(|| format!("invalid config {}", path.display()))?;
    Ok(ConfigStore::new(
        snapshot,
        Some(path.to_path_buf()),
        text,
        prometheus::default_registry(),
    )?)
}

/// Validates the file at `path`, looking upstream names up unless `no_resolve`.
fn check_config(path: &Path, no_resolve: bool) -> Result<(), ConfigError> {
    if no_resolve {
        Snapshot::check_file_without_lookup(path)
    } else {
        Snapshot::load(path).map(drop)
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Writes `text` to stdout, reporting a closed pipe as an error rather than panicking.
fn print_out(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
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
        } => {
            let logs = logging::init(log.log_format, &log.log_level);
            let store = load_store(&config)?;
            let startup = store.current().load().startup.clone();
            let addrs = ListenAddrs::configured(&startup, None);
            let listeners = if upgrade {
                Listeners::inherit(&addrs, &startup.upgrade_sock)?
            } else {
                Listeners::bind(&addrs)?
            };
            let options = BuildOptions {
                logs: Some(logs),
                ..Default::default()
            };
            let gateway = server::build(store, prometheus::default_registry(), options)?;
            server::run(gateway, listeners)
        }
        Command::Demo { config, log } => {
            let logs = logging::init(log.log_format, &log.log_level);
            let store = load_store(&config)?;
            let snapshot = store.current().load_full();
            let backend = snapshot.upstream.backends[0].addr;
            let addrs = ListenAddrs::configured(&snapshot.startup, Some(backend));
            let listeners = Listeners::bind(&addrs)?;
            let at = listeners.local_addrs()?;
            tracing::info!(proxy = %addrs.proxy, %backend, "demo: gateway with the mock v2 backend");
            let options = BuildOptions {
                mock_backend: true,
                logs: Some(logs),
            };
            let gateway = server::build(store, prometheus::default_registry(), options)?;
            let exe = std::env::current_exe().context("cannot tell this program's path")?;
            print_out(&cli::demo::try_these(&snapshot, &at, &exe))?;
            server::run(gateway, listeners)
        }
        Command::CheckConfig { file, no_resolve } => match check_config(&file, no_resolve) {
            Ok(()) => {
                println!("{}: ok", file.display());
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{}: invalid", file.display());
                for p in e.problems() {
                    eprintln!("  {p}");
                }
                Ok(ExitCode::FAILURE)
            }
        },
        Command::HashToken => {
            let mut token = String::new();
            std::io::stdin()
                .read_to_string(&mut token)
                .context("reading the token from stdin")?;
            // A trailing newline from `echo` or a terminal is not part of the token.
            let token = token.strip_suffix('\n').unwrap_or(&token);
            let token = token.strip_suffix('\r').unwrap_or(token);
            if token.is_empty() {
                bail!("no token on stdin");
            }
            println!(
                "{}",
                agent_gateway::config::TokenDigest::of(token.as_bytes()).to_hex()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Openapi { config } => {
            let snapshot = Snapshot::load(&config)
                .with_context(|| format!("invalid config {}", config.display()))?;
            let doc =
                serde_json::to_string_pretty(&agent_gateway::api::openapi::document(&snapshot))?;
            print_out(&(doc + "\n"))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::V1Usage {
            prometheus: Some(base),
            window,
            json,
            ..
        } => {
            let mut api = cli::PrometheusApi { base: base.clone() };
            let report = fleet::fleet_report(&mut api, *window)
                .with_context(|| format!("the fleet's v1 usage from {base}"))?;
            if json {
                print_out(&(serde_json::to_string(&report)? + "\n"))?;
            } else {
                print_out(&report.to_table())?;
                print_out(&format!(
                    "(every replica {base} scrapes, over the last {window})\n"
                ))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::V1Usage {
            admin,
            prometheus: None,
            json,
            ..
        } => {
            let body = cli::admin_get(&admin, "/v1-usage")?;
            if json {
                print_out(&(body + "\n"))?;
            } else {
                let report: UsageReport = serde_json::from_str(&body)
                    .context("the admin listener's /v1-usage is not a usage report")?;
                print_out(&report.to_table())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Load(args) => {
            let outcome = agent_gateway::tools::load::run(*args)?;
            Ok(ExitCode::from(outcome.exit_code()))
        }
        Command::MockBackend {
            listen,
            base_path,
            threads,
            log,
        } => {
            logging::init(log.log_format, &log.log_level);
            let base = BasePath::parse(&base_path).map_err(anyhow::Error::msg)?;
            let listener = listeners::bind(listen)?;
            let app = Arc::new(HttpServer::new_app(MockBackend::new(base)));
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()?;
            runtime.block_on(serve_app(listener, app, terminated()));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
