//! `agent-gateway demo`: the gateway and, in the same process, the mock v2 backend on the
//! config's first upstream address; and what it prints once it listens: the commands to try
//! against the config it runs (a v1 call, the v2 call, the metrics, `v1-usage`), with its
//! addresses and, where the demo can know it, a token that works. The text is a shell script:
//! comments and commands.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use agent_gateway::api::operation::{ApiVersion, Operation};
use agent_gateway::api::route::build_path;
use agent_gateway::app::listeners::{ListenAddrs, Listeners};
use agent_gateway::app::server::{self, BuildOptions};
use agent_gateway::config::published::{PublishedTokens, SHIPPED_AGENTS};
use agent_gateway::config::{Agent, Snapshot, TokenDigest};
use agent_gateway::policy::auth::{AGENT_ID_HEADER, AUTH_TOKEN_HEADER};

use super::{load_store, print_out, LogArgs};

pub fn run(config: &Path, log: &LogArgs) -> anyhow::Result<ExitCode> {
    agent_gateway::app::signals::ignore_sighup_until_handled();
    let logs = log.init();
    // The shipped config's agents are on the published tokens on purpose: accepted, and no
    // warning at start nor at a reload (the README's tour edits the config).
    let mut store = load_store(config, PublishedTokens::Accepted)?;
    store.without_warnings();
    let snapshot = store.current().load_full();
    let backend = snapshot.upstream.targets[0]
        .address()
        .context("the demo serves its mock backend on upstream.addresses[0], an IP address")?;
    let addrs = ListenAddrs::configured(&snapshot.startup, Some(backend));
    let listeners = Listeners::bind(&addrs)?;
    let at = listeners.local_addrs()?;
    tracing::info!(proxy = %at.proxy, %backend, "demo: gateway with the mock v2 backend");
    let options = BuildOptions {
        mock_backend: true,
        logs: Some(logs),
    };
    let gateway = server::build(store, prometheus::default_registry(), options)?;
    let exe = std::env::current_exe().context("cannot tell this program's path")?;
    // The listeners are open: every command printed can be tried at once.
    print_out(&try_these(&snapshot, &at, &exe))?;
    server::run(gateway, listeners)
}

/// The v1 call's body (a verify request without a connection, so the mock pairs first).
const V1_BODY: &str = r#"{"business_code":"KYC-BASIC","allow_multiple_read":true}"#;
/// The v2 call's body.
const V2_BODY: &str = r#"{"organization_name":"Example Org"}"#;

/// `text` quoted for a POSIX shell.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Where a client on this machine reaches a listener bound to `addr` (a wildcard address is
/// reached on loopback).
fn reachable(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

/// The agent the commands use and its token: the first shipped agent the config has with its
/// shipped token, else the first agent by id, with a placeholder for the token.
fn credentials(snapshot: &Snapshot) -> Option<(&Agent, String)> {
    let agents = &snapshot.auth.agents;
    let shipped = SHIPPED_AGENTS.iter().find_map(|&(id, token)| {
        let agent = agents.get(id)?;
        agent
            .tokens
            .iter()
            .any(|t| t.digest == TokenDigest::of(token.as_bytes()))
            .then(|| (agent, token.to_string()))
    });
    shipped.or_else(|| {
        let agent = agents.values().min_by(|a, b| a.id.cmp(&b.id))?;
        Some((agent, format!("<the token of {}>", agent.id)))
    })
}

/// The commands to try, as a shell script, for the listeners bound `at`; `exe` is this binary,
/// for `v1-usage`.
fn try_these(snapshot: &Snapshot, at: &ListenAddrs, exe: &Path) -> String {
    let bases = &snapshot.bases;
    let (scheme, insecure) = match snapshot.startup.proxy_tls {
        true => ("https", " -k"),
        false => ("http", ""),
    };
    let proxy = format!("{scheme}://{}", reachable(at.proxy));
    let default_code = snapshot.v1_default_service.as_str();
    let (headers, v1_code, v2_code) = match credentials(snapshot) {
        Some((agent, token)) => {
            let v1_code = agent
                .default_service
                .as_ref()
                .map_or(default_code, |c| c.as_str());
            let v2_code = match &agent.services {
                Some(codes) if !agent.may_use(v1_code) && !codes.is_empty() => codes[0].as_str(),
                _ => v1_code,
            };
            let headers = format!(
                " -H {} -H {}",
                sh_quote(&format!("{AGENT_ID_HEADER}: {}", agent.id)),
                sh_quote(&format!("{AUTH_TOKEN_HEADER}: {token}")),
            );
            (headers, v1_code, v2_code)
        }
        None => (String::new(), default_code, default_code),
    };
    let json = " -H 'content-type: application/json'";
    let v1 = Operation::VerifyRequest;
    let v2 = Operation::ConnectionInvitation;
    let v1_path = build_path(bases.v1.as_str(), ApiVersion::V1, v1, "", "", None);
    let v1_upstream = build_path(
        bases.upstream.as_str(),
        ApiVersion::V2,
        v1,
        v1_code,
        "",
        None,
    );
    let v2_path = build_path(bases.v2.as_str(), ApiVersion::V2, v2, v2_code, "", None);

    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# agent-gateway demo: the proxy listens on {proxy}, the mock v2 backend on {}.",
        at.mock_backend
            .map_or_else(|| "(none)".to_owned(), |a| a.to_string())
    );
    out.push_str("# Try, in another terminal:\n\n");
    let _ = writeln!(
        out,
        "# v1: forwarded to {v1_upstream}; -i shows the Deprecation, Sunset and Link headers"
    );
    let _ = writeln!(
        out,
        "curl -s -i{insecure} -X POST {proxy}{v1_path}{json}{headers} -d {}\n",
        sh_quote(V1_BODY)
    );
    out.push_str("# v2: the service code in the path is kept\n");
    let _ = writeln!(
        out,
        "curl -s{insecure} -X POST {proxy}{v2_path}{json}{headers} -d {}\n",
        sh_quote(V2_BODY)
    );
    match at.admin {
        Some(admin) => {
            let admin = format!("http://{}", reachable(admin));
            out.push_str("# what the proxy answered, by version, operation and status\n");
            let _ = writeln!(
                out,
                "curl -s {admin}/metrics | grep agent_gateway_requests_total\n"
            );
            out.push_str("# who still calls v1\n");
            let _ = writeln!(
                out,
                "{} v1-usage --admin {admin}",
                sh_quote(&exe.to_string_lossy())
            );
        }
        None => out.push_str("# /metrics and v1-usage need an admin listener: set listen.admin\n"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_gateway::config::file::AgentFile;
    use agent_gateway::config::testing::{AGENT_ID, DEFAULT_SERVICE};
    use agent_gateway::config::FileConfig;

    const SHIPPED: &str = include_str!("../../config/gateway.toml");
    const EXE: &str = "/opt/agent gateway/agent-gateway";

    fn shipped() -> FileConfig {
        toml::from_str(SHIPPED).unwrap()
    }

    /// The commands for `snapshot`'s listeners as configured.
    fn as_configured(snapshot: &Snapshot) -> String {
        let backend = snapshot.upstream.targets[0].address().unwrap();
        let at = ListenAddrs::configured(&snapshot.startup, Some(backend));
        try_these(snapshot, &at, Path::new(EXE))
    }

    fn commands(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    #[test]
    fn the_shipped_agents_tokens_are_the_ones_the_shipped_config_stores() {
        let snapshot = shipped().snapshot();
        for (id, token) in SHIPPED_AGENTS {
            let agent = &snapshot.auth.agents[id];
            assert!(
                agent
                    .tokens
                    .iter()
                    .any(|t| t.digest == TokenDigest::of(token.as_bytes())),
                "{id}"
            );
        }
    }

    #[test]
    fn on_the_shipped_config_the_four_commands_use_its_ports_and_the_demo_token() {
        let text = as_configured(&shipped().snapshot());
        assert_eq!(
            commands(&text),
            [
                "curl -s -i -X POST http://127.0.0.1:8080/api/v1/verify/request \
                 -H 'content-type: application/json' -H 'x-service-agent-id: demo-agent' \
                 -H 'x-auth-token: demo-token' \
                 -d '{\"business_code\":\"KYC-BASIC\",\"allow_multiple_read\":true}'",
                "curl -s -X POST http://127.0.0.1:8080/api/v2/connection/ORG_DEFAULT/invitation \
                 -H 'content-type: application/json' -H 'x-service-agent-id: demo-agent' \
                 -H 'x-auth-token: demo-token' -d '{\"organization_name\":\"Example Org\"}'",
                "curl -s http://127.0.0.1:9090/metrics | grep agent_gateway_requests_total",
                "'/opt/agent gateway/agent-gateway' v1-usage --admin http://127.0.0.1:9090",
            ]
        );
        assert!(
            text.contains("# v1: forwarded to /api/v2/verify/ORG_DEFAULT/request;"),
            "{text}"
        );
        assert!(
            text.contains("the mock v2 backend on 127.0.0.1:9000"),
            "{text}"
        );
    }

    #[test]
    fn the_commands_follow_the_config_bases_addresses_and_tls() {
        let mut cfg = shipped();
        cfg.listen.proxy = "0.0.0.0:18080".into();
        cfg.listen.admin = Some("[::]:19090".into());
        cfg.v1.base_path = "/legacy".into();
        cfg.v2.base_path = "/agents/v2".into();
        cfg.upstream.base_path = "/backend".into();
        let mut snapshot = cfg.snapshot();
        // Set here rather than in the file, which would have to name a real certificate.
        snapshot.startup.proxy_tls = true;
        let text = as_configured(&snapshot);
        let commands = commands(&text);
        assert!(
            commands[0].starts_with(
                "curl -s -i -k -X POST https://127.0.0.1:18080/legacy/verify/request "
            ),
            "{text}"
        );
        assert!(
            commands[1].starts_with(
                "curl -s -k -X POST https://127.0.0.1:18080/agents/v2/connection/ORG_DEFAULT/invitation "
            ),
            "{text}"
        );
        assert!(
            commands[2].starts_with("curl -s http://[::1]:19090/metrics "),
            "{text}"
        );
        assert!(
            commands[3].ends_with(" v1-usage --admin http://[::1]:19090"),
            "{text}"
        );
        assert!(
            text.contains("forwarded to /backend/verify/ORG_DEFAULT/request"),
            "{text}"
        );
    }

    #[test]
    fn an_agent_limited_to_other_services_gets_its_own_codes() {
        let mut cfg = shipped();
        cfg.auth.agents.retain(|a| a.id == "partner-agent");
        let text = as_configured(&cfg.clone().snapshot());
        let lines = commands(&text);
        assert!(
            lines[0].contains("-H 'x-auth-token: partner-token'"),
            "{text}"
        );
        assert!(
            text.contains("forwarded to /api/v2/verify/PARTNER/request"),
            "{text}"
        );
        assert!(
            lines[1].contains("/api/v2/connection/PARTNER/invitation "),
            "{text}"
        );

        let mut limited = AgentFile::new("limited", "its-token");
        limited.services = Some(vec!["OTHER".into()]);
        cfg.auth.agents = vec![limited];
        let text = as_configured(&cfg.snapshot());
        assert!(
            commands(&text)[1].contains("/api/v2/connection/OTHER/invitation "),
            "{text}"
        );
    }

    #[test]
    fn an_agent_whose_token_the_demo_cannot_know_gets_a_placeholder() {
        let proxy = "127.0.0.1:8080".parse().unwrap();
        let upstream = "127.0.0.1:9000".parse().unwrap();
        let cfg = FileConfig::for_test(proxy, &[upstream]);
        let text = as_configured(&cfg.snapshot());
        let commands = commands(&text);
        let expected = format!(
            "-H 'x-service-agent-id: {AGENT_ID}' -H 'x-auth-token: <the token of {AGENT_ID}>'"
        );
        assert!(commands[0].contains(&expected), "{text}");
        assert!(
            commands[1].contains(&format!("/api/v2/connection/{DEFAULT_SERVICE}/invitation ")),
            "{text}"
        );
        assert_eq!(commands.len(), 2, "no admin listener, no metrics: {text}");
        assert!(text.contains("set listen.admin"), "{text}");
    }

    #[test]
    fn quoting_keeps_a_single_quote_inside_one_shell_word() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("/a b/c"), "'/a b/c'");
    }
}
