//! What a config allows that works but should not, said as warnings (`run` at start and
//! at each reload that applies a config, `check-config`), never as refusals: an agent or the
//! admin listener on a token published with agent-gateway (the demo's own config uses them on
//! purpose), no agent at all, PROXY protocol headers believed from any host, and a board that
//! cannot ask its Prometheus. Here, beside the refusals, so that the command line and a
//! reload say the same.

use super::{Snapshot, TokenDigest};
use crate::client::Client;

/// The agents of the shipped `config/gateway.toml` and their tokens (the file stores only
/// their SHA-256): published with agent-gateway, so warned about in any other config, and
/// the demo's commands work as printed with them.
pub const SHIPPED_AGENTS: [(&str, &str); 2] = [
    ("demo-agent", "demo-token"),
    ("partner-agent", "partner-token"),
];

/// What a config allows that is worth a warning, not a refusal: the demo's own config accepts
/// the demo's tokens on purpose, a deployment never should.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigWarning<'a> {
    /// The agent accepts a token published with agent-gateway ([`SHIPPED_AGENTS`]):
    /// anyone who read the README can call as it.
    PublishedToken { agent: &'a str, token: &'static str },
    /// `admin.token_sha256` names a token published with agent-gateway: anyone who read the
    /// README can reload the gateway and read its config.
    PublishedAdminToken { token: &'static str },
    /// No agent is configured: every call is refused with 401.
    NoAgent,
    /// The board's Prometheus client cannot be made as configured (a credential or CA file
    /// missing, empty or malformed): the board shows this gateway's own counts meanwhile.
    PrometheusClient(String),
    /// `listen.proxy_protocol` without `listen.trusted_proxies`: any host that reaches the
    /// listener names its own client address, for the log and for the guess throttle.
    ProxyHeadersFromAnyone,
}

impl std::fmt::Display for ConfigWarning<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigWarning::PublishedToken { agent, token } => write!(
                f,
                "agent {agent:?} accepts the token {token:?}, published with agent-gateway (its \
                 README and demo config): anyone can call as this agent. Give it a token of its \
                 own: printf '%s' TOKEN | agent-gateway hash-token"
            ),
            ConfigWarning::PublishedAdminToken { token } => write!(
                f,
                "admin.token_sha256 accepts the token {token:?}, published with agent-gateway \
                 (its README and demo config): anyone who reaches the admin listener can \
                 reload the gateway and read its config. Give it a token of its own: printf \
                 '%s' TOKEN | agent-gateway hash-token"
            ),
            ConfigWarning::PrometheusClient(problem) => write!(
                f,
                "the retirement board cannot ask retirement.prometheus_url ({problem}): it shows \
                 this gateway's own counts until it can (the files are read at each use)"
            ),
            ConfigWarning::NoAgent => {
                f.write_str("no agent is configured: every call is refused with 401")
            }
            ConfigWarning::ProxyHeadersFromAnyone => f.write_str(
                "listen.proxy_protocol is on and listen.trusted_proxies is empty: any host that \
                 reaches the proxy listener may send a PROXY header naming any client address \
                 (the access log's, and the one auth.max_failures_per_minute counts). Set \
                 listen.trusted_proxies to the balancers' addresses",
            ),
        }
    }
}

/// The warnings about `agents` (id and token digest of each), by agent id.
pub fn credential_warnings<'a>(
    agents: impl IntoIterator<Item = (&'a str, &'a TokenDigest)>,
) -> Vec<ConfigWarning<'a>> {
    let mut agents: Vec<_> = agents.into_iter().collect();
    if agents.is_empty() {
        return vec![ConfigWarning::NoAgent];
    }
    agents.sort_by_key(|(id, _)| *id);
    agents
        .into_iter()
        .filter_map(|(agent, digest)| {
            let token = published_token(digest)?;
            Some(ConfigWarning::PublishedToken { agent, token })
        })
        .collect()
}

/// The published token whose digest `digest` is, if it is one.
fn published_token(digest: &TokenDigest) -> Option<&'static str> {
    SHIPPED_AGENTS
        .iter()
        .find(|(_, token)| TokenDigest::of(token.as_bytes()) == *digest)
        .map(|&(_, token)| token)
}

/// The warnings about `snapshot`: its agents', then its edge's.
pub fn snapshot_warnings(snapshot: &Snapshot) -> Vec<ConfigWarning<'_>> {
    let mut warnings = credential_warnings(
        snapshot
            .auth
            .agents
            .values()
            .flat_map(|a| a.tokens.iter().map(|t| (a.id.as_str(), &t.digest))),
    );
    warnings.extend(
        snapshot
            .admin
            .tokens
            .iter()
            .filter_map(published_token)
            .map(|token| ConfigWarning::PublishedAdminToken { token }),
    );
    let retirement = &snapshot.retirement;
    if let Some(url) = &retirement.prometheus_url {
        if let Err(e) = Client::new(url, &retirement.prometheus_client) {
            warnings.push(ConfigWarning::PrometheusClient(e.to_string()));
        }
    }
    let edge = &snapshot.edge;
    if edge.proxy_protocol && edge.trusted_proxies.is_empty() {
        warnings.push(ConfigWarning::ProxyHeadersFromAnyone);
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_on_a_published_token_is_named_with_the_token() {
        let demo = TokenDigest::of(b"demo-token");
        let partner = TokenDigest::of(b"partner-token");
        let own = TokenDigest::of(b"a token of its own");
        let agents = [("z-agent", &demo), ("mine", &own), ("a-agent", &partner)];
        assert_eq!(
            credential_warnings(agents),
            [
                ConfigWarning::PublishedToken {
                    agent: "a-agent",
                    token: "partner-token"
                },
                ConfigWarning::PublishedToken {
                    agent: "z-agent",
                    token: "demo-token"
                },
            ]
        );
        assert!(credential_warnings([("mine", &own)]).is_empty());
        let text = credential_warnings([("z-agent", &demo)])[0].to_string();
        assert!(
            text.starts_with(r#"agent "z-agent" accepts the token "demo-token""#),
            "{text}"
        );
        assert!(text.contains("hash-token"), "{text}");
    }

    #[test]
    fn no_agent_at_all_is_said() {
        assert_eq!(credential_warnings([]), [ConfigWarning::NoAgent]);
    }

    #[test]
    fn proxy_headers_believed_from_any_host_are_said() {
        use crate::config::FileConfig;
        let config = |proxy_protocol, trusted: &[&str]| {
            let backend = "127.0.0.1:9000".parse().unwrap();
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.listen.proxy_protocol = proxy_protocol;
            cfg.listen.trusted_proxies = trusted.iter().map(ToString::to_string).collect();
            cfg.snapshot()
        };
        let said = |snapshot: &Snapshot| {
            snapshot_warnings(snapshot).contains(&ConfigWarning::ProxyHeadersFromAnyone)
        };
        assert!(said(&config(true, &[])));
        assert!(!said(&config(true, &["10.0.0.0/8"])));
        assert!(!said(&config(false, &[])));
    }

    #[test]
    fn a_prometheus_credential_that_cannot_be_read_is_said() {
        use crate::config::FileConfig;
        let dir = tempfile::tempdir().unwrap();
        let config = |token_file: &std::path::Path| {
            let backend = "127.0.0.1:9000".parse().unwrap();
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.retirement.prometheus_url = Some("http://prometheus:9090".into());
            cfg.retirement.prometheus_token_file = Some(token_file.display().to_string());
            cfg.snapshot()
        };
        let said = |snapshot: &Snapshot| {
            snapshot_warnings(snapshot)
                .into_iter()
                .filter(|w| matches!(w, ConfigWarning::PrometheusClient(_)))
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
        };
        let missing = dir.path().join("token");
        let warned = said(&config(&missing));
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].contains(&missing.display().to_string()),
            "{}",
            warned[0]
        );
        std::fs::write(&missing, "t0ken\n").unwrap();
        assert!(said(&config(&missing)).is_empty());
    }

    #[test]
    fn an_admin_token_published_with_agent_gateway_is_said() {
        use crate::config::file::Digests;
        use crate::config::FileConfig;
        let config = |tokens: &[&str]| {
            let backend = "127.0.0.1:9000".parse().unwrap();
            let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
            cfg.admin.token_sha256 = Digests(
                tokens
                    .iter()
                    .map(|t| TokenDigest::of(t.as_bytes()).to_hex())
                    .collect(),
            );
            cfg.snapshot()
        };
        let admin_warnings = |snapshot: &Snapshot| {
            snapshot_warnings(snapshot)
                .into_iter()
                .filter(|w| matches!(w, ConfigWarning::PublishedAdminToken { .. }))
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
        };
        let said = admin_warnings(&config(&["an admin token of its own", "demo-token"]));
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].starts_with(r#"admin.token_sha256 accepts the token "demo-token""#));
        assert!(admin_warnings(&config(&["an admin token of its own"])).is_empty());
    }
}
