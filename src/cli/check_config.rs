//! `agent-gateway check-config`: exit 0 when a config file is valid, else print every problem,
//! in the order of the file, and exit 1. A token published with agent-gateway is a problem
//! too, as `run` refuses it ([`agent_gateway::config::published`]), said once the file is
//! otherwise valid (it is looked for among the validated agents). A valid file may also get
//! warnings on stderr ([`agent_gateway::config::warnings`]: no agent, a board that cannot ask
//! its Prometheus; and a name that does not resolve where `run` starts anyway), which do not
//! fail it.

use std::path::Path;
use std::process::ExitCode;

use agent_gateway::config::published::PublishedTokens;
use agent_gateway::config::warnings::snapshot_warnings;
use agent_gateway::config::{ConfigError, Host, Mount, Problem, Snapshot};
use agent_gateway::proxy::names;

use super::print_problems;

pub fn run(file: &Path, no_resolve: bool, mounts: &[Mount]) -> anyhow::Result<ExitCode> {
    match check(file, no_resolve, mounts) {
        Ok((snapshot, unresolved)) => {
            for warning in snapshot_warnings(&snapshot) {
                eprintln!("{}: warning: {warning}", file.display());
            }
            for name in unresolved {
                eprintln!(
                    "{}: warning: {}: {}; the gateway starts without its addresses \
                     (upstream.allow_unresolved_at_start) and looks it up again",
                    file.display(),
                    name.key,
                    name.message
                );
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

/// Validates the file at `path` (and the files it names, those under a mount read from its
/// source), and looks its upstream names up unless `no_resolve` (once, as the proxy looks
/// them up: the gateway itself follows them as their TTL says). A name that does not resolve is
/// a problem, or, with `upstream.allow_unresolved_at_start`, which `run` starts with, one of
/// the names returned beside the snapshot, to warn of.
fn check(
    path: &Path,
    no_resolve: bool,
    mounts: &[Mount],
) -> Result<(Snapshot, Vec<Problem>), ConfigError> {
    let snapshot = Snapshot::read_mounted(path, mounts)?.result?;
    PublishedTokens::Refused.check(&snapshot)?;
    if no_resolve {
        return Ok((snapshot, Vec::new()));
    }
    let upstream = &snapshot.upstream;
    let unresolved = names::unresolved(&upstream.dns, &upstream.names()).map_err(|message| {
        ConfigError::Invalid(vec![Problem {
            key: "upstream.resolvers".into(),
            message,
            at: None,
            file: None,
        }])
    })?;
    let problems: Vec<Problem> = upstream
        .targets
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let Host::Name(name) = &t.host else {
                return None;
            };
            let (_, why) = unresolved.iter().find(|(n, _)| n == name)?;
            Some(Problem {
                key: format!("upstream.addresses[{i}]"),
                message: format!("{name:?} does not resolve ({why})"),
                at: None,
                file: None,
            })
        })
        .collect();
    if problems.is_empty() || snapshot.upstream.dns.allow_unresolved_at_start {
        Ok((snapshot, problems))
    } else {
        Err(ConfigError::Invalid(problems))
    }
}
