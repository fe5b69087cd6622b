//! The binary's commands, one file each (`main.rs` parses the command line and calls the
//! command's `run`), and what several of them share: the log flags, a config file loaded into
//! a live store, pingora's options, writing to stdout.

pub mod check_config;
pub mod config_dump;
pub mod demo;
pub mod hash_token;
pub mod load;
pub mod mock_backend;
pub mod openapi;
pub mod run;
pub mod v1_usage;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use agent_gateway::app::logging::{self, LogFormat, Logs};
use agent_gateway::app::reload::ConfigStore;
use agent_gateway::config::published::PublishedTokens;
use agent_gateway::config::{ConfigError, Snapshot};

/// `--config FILE`, defaulting to the shipped config: what `demo`, `openapi` and `config dump`
/// read (`run` requires its own, `check-config` takes one or, for one release, a FILE).
#[derive(Args)]
pub struct ConfigFile {
    /// The TOML config file.
    #[arg(
        long,
        short,
        value_name = "FILE",
        default_value = "config/gateway.toml"
    )]
    pub config: PathBuf,
}

#[derive(Args)]
pub struct LogArgs {
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

impl LogArgs {
    /// Installs the process's logs as these flags say.
    fn init(&self) -> Logs {
        logging::init(self.log_format, &self.log_level)
    }
}

/// Loads the config file into a live store that reloads from the same path.
/// The config at `path`, loaded to serve: refused (at start, and at each reload) when it
/// accepts a published token and `published` says so.
fn load_store(path: &Path, published: PublishedTokens) -> anyhow::Result<ConfigStore> {
    let snapshot = Snapshot::load(path)
        .and_then(|snapshot| published.check(&snapshot).map(|()| snapshot))
        .with_context(|| format!("invalid config {}", path.display()))?;
    let mut store = ConfigStore::new(
        snapshot,
        Some(path.to_path_buf()),
        prometheus::default_registry(),
    )?;
    store.published_tokens(published);
    Ok(store)
}

/// Prints every problem of the config file at `path` on stderr, in the order of the file.
fn print_problems(path: &Path, e: &ConfigError) {
    eprintln!("{}: invalid", path.display());
    for p in e.problems() {
        eprintln!("  {p}");
    }
}

/// Writes `text` to stdout, reporting a closed pipe as an error rather than panicking.
fn print_out(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}
