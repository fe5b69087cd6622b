//! `agent-gateway check-config`: exit 0 when a config file is valid, else print every problem,
//! in the order of the file, and exit 1. A valid file may also get warnings on stderr about
//! its credentials (an agent on a token published with agent-gateway, no agent at all), which
//! do not fail it.

use std::path::Path;
use std::process::ExitCode;

use agent_gateway::config::{ConfigError, Snapshot};

use super::credentials::snapshot_credential_warnings;

use super::print_problems;

pub fn run(file: &Path, no_resolve: bool) -> anyhow::Result<ExitCode> {
    match check(file, no_resolve) {
        Ok(snapshot) => {
            for warning in snapshot_credential_warnings(&snapshot) {
                eprintln!("{}: warning: {warning}", file.display());
            }
            println!("{}: ok", file.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            print_problems(file, &e);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Validates the file at `path` (and the agents file it names), looking upstream names up
/// unless `no_resolve`.
fn check(path: &Path, no_resolve: bool) -> Result<Snapshot, ConfigError> {
    if no_resolve {
        Snapshot::load_unresolved(path).map(|u| u.snapshot().clone())
    } else {
        Snapshot::load(path)
    }
}
