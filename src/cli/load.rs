//! `agent-gateway load` and `agent-gateway load report FILE.jsonl`: the load generator
//! ([`agent_gateway::tools::load`]); its exit status says whether the thresholds held.

use std::process::ExitCode;

use agent_gateway::tools::load::{self, LoadArgs};

pub fn run(args: LoadArgs) -> anyhow::Result<ExitCode> {
    let outcome = load::run(args)?;
    Ok(ExitCode::from(outcome.exit_code()))
}
