//! `agent-gateway run`: the gateway on a config file, until a signal ends the process.

use std::path::Path;
use std::process::ExitCode;

use agent_gateway::app::server::{self, BuildOptions};

use super::{load_store, pingora_opt, LogArgs};

pub fn run(config: &Path, upgrade: bool, log: &LogArgs) -> anyhow::Result<ExitCode> {
    let logs = log.init();
    let store = load_store(config)?;
    let options = BuildOptions {
        pingora_opt: Some(pingora_opt(upgrade)),
        logs: Some(logs),
        ..Default::default()
    };
    server::build(store, prometheus::default_registry(), options)?.run_forever()
}
