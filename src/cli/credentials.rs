//! Credentials in a config that work but should not, said as warnings (`run` at start,
//! `check-config`), never as refusals: an agent on a token published with agent-gateway (the
//! demo's own config uses them on purpose), and no agent at all.

use agent_gateway::config::{Snapshot, TokenDigest};

use super::demo::SHIPPED_AGENTS;

/// What a config's agents say of its credentials that is worth a warning, not a refusal: the
/// demo's own config accepts the demo's tokens on purpose, a deployment never should.
#[derive(Debug, PartialEq, Eq)]
pub enum CredentialWarning<'a> {
    /// The agent accepts a token published with agent-gateway ([`SHIPPED_AGENTS`]):
    /// anyone who read the README can call as it.
    PublishedToken { agent: &'a str, token: &'static str },
    /// No agent is configured: every call is refused with 401.
    NoAgent,
}

impl std::fmt::Display for CredentialWarning<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialWarning::PublishedToken { agent, token } => write!(
                f,
                "agent {agent:?} accepts the token {token:?}, published with agent-gateway (its \
                 README and demo config): anyone can call as this agent. Give it a token of its \
                 own: printf '%s' TOKEN | agent-gateway hash-token"
            ),
            CredentialWarning::NoAgent => {
                f.write_str("no agent is configured: every call is refused with 401")
            }
        }
    }
}

/// The warnings about `agents` (id and token digest of each), by agent id.
pub fn credential_warnings<'a>(
    agents: impl IntoIterator<Item = (&'a str, &'a TokenDigest)>,
) -> Vec<CredentialWarning<'a>> {
    let mut agents: Vec<_> = agents.into_iter().collect();
    if agents.is_empty() {
        return vec![CredentialWarning::NoAgent];
    }
    agents.sort_by_key(|(id, _)| *id);
    agents
        .into_iter()
        .filter_map(|(agent, digest)| {
            let (_, token) = SHIPPED_AGENTS
                .iter()
                .find(|(_, token)| TokenDigest::of(token.as_bytes()) == *digest)?;
            Some(CredentialWarning::PublishedToken { agent, token })
        })
        .collect()
}

/// The warnings about the agents of `snapshot`.
pub fn snapshot_credential_warnings(snapshot: &Snapshot) -> Vec<CredentialWarning<'_>> {
    credential_warnings(
        snapshot
            .auth
            .agents
            .values()
            .flat_map(|a| a.tokens.iter().map(|t| (a.id.as_str(), &t.digest))),
    )
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
                CredentialWarning::PublishedToken {
                    agent: "a-agent",
                    token: "partner-token"
                },
                CredentialWarning::PublishedToken {
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
        assert_eq!(credential_warnings([]), [CredentialWarning::NoAgent]);
    }
}
