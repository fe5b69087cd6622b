//! `agent-gateway check-config`: exit 0 when a config file is valid, else print every problem,
//! in the order of the file, and exit 1.

use std::path::Path;
use std::process::ExitCode;

use agent_gateway::config::{ConfigError, Snapshot};

use super::print_problems;

pub fn run(file: &Path, no_resolve: bool) -> anyhow::Result<ExitCode> {
    match check(file, no_resolve) {
        Ok(()) => {
            println!("{}: ok", file.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            print_problems(file, &e);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Validates the file at `path`, looking upstream names up unless `no_resolve`.
fn check(path: &Path, no_resolve: bool) -> Result<(), ConfigError> {
    if no_resolve {
        Snapshot::load_unresolved(path).map(drop)
    } else {
        Snapshot::load(path).map(drop)
    }
}
