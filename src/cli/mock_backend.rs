//! `agent-gateway mock-backend`: the mock v2 backend alone, until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use agent_gateway::app::listeners;
use agent_gateway::app::serve::serve_app;
use agent_gateway::config::BasePath;
use agent_gateway::tools::mock_backend::MockBackend;
use pingora::apps::http_app::HttpServer;

use super::LogArgs;

pub fn run(
    listen: SocketAddr,
    base_path: &str,
    threads: usize,
    log: &LogArgs,
) -> anyhow::Result<ExitCode> {
    log.init();
    let base = BasePath::parse(base_path).map_err(anyhow::Error::msg)?;
    let listener = listeners::bind(listen)?;
    let app = Arc::new(HttpServer::new_app(MockBackend::new(base)));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    runtime.block_on(serve_app(listener, app, terminated()));
    Ok(ExitCode::SUCCESS)
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
