//! `agent-gateway run`: the gateway on a config file, until a signal ends the process. A
//! config that accepts a published token is refused, at start and at a reload
//! ([`agent_gateway::config::published`]); at start, and at each reload that applies a config,
//! it warns about what works but should not ([`agent_gateway::config::warnings`]: no agent,
//! a board that cannot ask its Prometheus).

use std::path::Path;
use std::process::ExitCode;

use agent_gateway::app::listeners::{ListenAddrs, Listeners};
use agent_gateway::app::reload::warn_of;
use agent_gateway::app::server::{self, BuildOptions};
use agent_gateway::app::signals;
use agent_gateway::config::published::PublishedTokens;

use super::{load_store, LogArgs};

/// With `upgrade`, the listeners are taken over from the running process (after its SIGQUIT)
/// rather than bound.
pub fn run(config: &Path, upgrade: bool, log: &LogArgs) -> anyhow::Result<ExitCode> {
    signals::ignore_sighup_until_handled();
    let logs = log.init();
    let store = load_store(config, PublishedTokens::Refused)?;
    warn_of(&store.current().load());
    let startup = store.current().load().startup.clone();
    let addrs = ListenAddrs::configured(&startup, None);
    let listeners = if upgrade {
        Listeners::inherit(&addrs, &startup.upgrade_sock)?
    } else {
        Listeners::bind(&addrs)?
    };
    let options = BuildOptions {
        logs: Some(logs),
        ..Default::default()
    };
    let gateway = server::build(store, prometheus::default_registry(), options)?;
    server::run(gateway, listeners)
}
