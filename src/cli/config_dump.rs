//! `agent-gateway config dump`: the effective config of a file ([`dump`]), as TOML or JSON, as
//! `nginx -T` shows what nginx runs; the admin listener's `GET /config` answers the same for
//! the running snapshot. No upstream host name is looked up.

use std::path::Path;
use std::process::ExitCode;

use agent_gateway::config::{dump, Snapshot};

use super::{print_out, print_problems};

pub fn run(file: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let config = match Snapshot::load(file) {
        Ok(config) => config,
        Err(e) => {
            print_problems(file, &e);
            return Ok(ExitCode::FAILURE);
        }
    };
    let snapshot = &config;
    if json {
        print_out(&(serde_json::to_string_pretty(&dump::to_json(snapshot))? + "\n"))?;
    } else {
        let sha256 = snapshot.source.sha256.map(hex::encode).unwrap_or_default();
        print_out(&format!(
            "# The effective config of {}, sha256 {sha256}:\n\
             # defaults filled in, dates in UTC, durations in milliseconds, secrets and token\n\
             # digests redacted.\n\n{}",
            file.display(),
            dump::to_toml(snapshot)
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}
