//! `agent-gateway mock-backend`: the mock v2 backend alone, until a signal ends the process.

use std::net::SocketAddr;
use std::process::ExitCode;

use agent_gateway::app::server;
use agent_gateway::config::BasePath;

use super::LogArgs;

pub fn run(
    listen: SocketAddr,
    base_path: &str,
    threads: usize,
    log: &LogArgs,
) -> anyhow::Result<ExitCode> {
    log.init();
    let base = BasePath::parse(base_path).map_err(anyhow::Error::msg)?;
    server::build_mock_backend(listen, base, threads).run_forever()
}
