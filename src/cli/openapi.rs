//! `agent-gateway openapi`: the OpenAPI 3.1 document of the proxy's public interface under a
//! config, on stdout. The document names no backend, so no host name is looked up: it works
//! away from the DNS the config will run with (a Kubernetes ConfigMap, off-cluster).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use agent_gateway::api::openapi;
use agent_gateway::config::Snapshot;

use super::print_out;

pub fn run(config: &Path) -> anyhow::Result<ExitCode> {
    let config =
        Snapshot::load(config).with_context(|| format!("invalid config {}", config.display()))?;
    let doc = serde_json::to_string_pretty(&openapi::document(&config))?;
    print_out(&(doc + "\n"))?;
    Ok(ExitCode::SUCCESS)
}
