//! The tokens published with agent-gateway (its README's and its demo config's): anyone who
//! read them can call as an agent that accepts one, or reload and read the config of a
//! gateway whose admin listener does. A config that accepts one is refused wherever it would
//! serve (`run`, at start and at each reload) and by `check-config`; only `demo`, whose
//! shipped config uses them on purpose, runs one.

use std::sync::LazyLock;

use super::{ConfigError, Problem, Snapshot, TokenDigest};

/// The agents of the shipped `config/gateway.toml` and their tokens (the file stores only
/// their SHA-256): what the demo prints, and what no other config may accept.
pub const SHIPPED_AGENTS: [(&str, &str); 2] = [
    ("demo-agent", "demo-token"),
    ("partner-agent", "partner-token"),
];

/// Whether a config may accept the published tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishedTokens {
    /// Refused, as a problem of the config: every command that serves, but the demo.
    Refused,
    /// Accepted: the demo, whose config uses them on purpose.
    Accepted,
}

impl PublishedTokens {
    /// `snapshot` as this allows it: refused, naming each agent (by id) and the admin
    /// listener that accepts a published token, when it does and they are refused.
    pub fn check(self, snapshot: &Snapshot) -> Result<(), ConfigError> {
        let problems = match self {
            PublishedTokens::Refused => problems(snapshot),
            PublishedTokens::Accepted => Vec::new(),
        };
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

/// The published tokens' digests, made once: a config is checked at each reload, each of
/// its agents' tokens against all of them.
static PUBLISHED: LazyLock<[(TokenDigest, &str); SHIPPED_AGENTS.len()]> =
    LazyLock::new(|| SHIPPED_AGENTS.map(|(_, token)| (TokenDigest::of(token.as_bytes()), token)));

/// The published token whose digest `digest` is, if it is one.
pub fn published_token(digest: &TokenDigest) -> Option<&'static str> {
    PUBLISHED
        .iter()
        .find(|(published, _)| published == digest)
        .map(|&(_, token)| token)
}

/// A problem for each agent (in the order of their ids) and admin token that is published.
fn problems(snapshot: &Snapshot) -> Vec<Problem> {
    let mut agents: Vec<_> = snapshot
        .auth
        .agents
        .values()
        .flat_map(|a| a.tokens.iter().map(|t| (a.id.as_str(), &t.digest)))
        .filter_map(|(agent, digest)| Some((agent, published_token(digest)?)))
        .collect();
    agents.sort_unstable();
    let agents = agents.into_iter().map(|(agent, token)| {
        problem(
            "auth.agents",
            format!(
                "agent {agent:?} accepts the token {token:?}, published with agent-gateway (its \
                 README and demo config): anyone could call as this agent"
            ),
        )
    });
    let admin = (snapshot.admin.tokens.iter())
        .filter_map(published_token)
        .map(|token| {
            problem(
                "admin.token_sha256",
                format!(
                    "accepts the token {token:?}, published with agent-gateway (its README and \
                     demo config): anyone who reaches the admin listener could reload the \
                     gateway and read its config"
                ),
            )
        });
    agents.chain(admin).collect()
}

fn problem(key: &str, message: String) -> Problem {
    Problem {
        key: key.to_owned(),
        message: format!(
            "{message}. Give it a token of its own: printf '%s' TOKEN | agent-gateway \
             hash-token (only `agent-gateway demo` runs the published ones)"
        ),
        at: None,
        file: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::AgentFile;
    use crate::config::file::Digests;
    use crate::config::FileConfig;

    fn config(agents: &[(&str, &str)], admin_tokens: &[&str]) -> Snapshot {
        let backend = "127.0.0.1:9000".parse().unwrap();
        let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
        cfg.auth.agents = agents
            .iter()
            .map(|&(id, token)| AgentFile::new(id, token))
            .collect();
        cfg.admin.token_sha256 = Digests(
            admin_tokens
                .iter()
                .map(|t| TokenDigest::of(t.as_bytes()).to_hex())
                .collect(),
        );
        cfg.snapshot()
    }

    fn refused(snapshot: &Snapshot) -> Vec<String> {
        match PublishedTokens::Refused.check(snapshot) {
            Ok(()) => Vec::new(),
            Err(e) => e.problems().iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn each_agent_and_admin_token_on_a_published_token_is_named_with_it() {
        let snapshot = config(
            &[
                ("z-agent", "demo-token"),
                ("mine", "a token of its own"),
                ("a-agent", "partner-token"),
            ],
            &["an admin token of its own", "demo-token"],
        );
        let said = refused(&snapshot);
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(said[0]
            .starts_with(r#"auth.agents: agent "a-agent" accepts the token "partner-token""#));
        assert!(
            said[1].starts_with(r#"auth.agents: agent "z-agent" accepts the token "demo-token""#)
        );
        assert!(said[2].starts_with(r#"admin.token_sha256: accepts the token "demo-token""#));
        assert!(said.iter().all(|s| s.contains("hash-token")), "{said:?}");
    }

    #[test]
    fn tokens_of_their_own_pass_and_the_demo_accepts_the_published_ones() {
        let own = config(&[("mine", "a token of its own")], &["an admin token"]);
        assert!(refused(&own).is_empty());
        let demo = config(&[("demo-agent", "demo-token")], &["partner-token"]);
        assert_eq!(refused(&demo).len(), 2);
        assert!(PublishedTokens::Accepted.check(&demo).is_ok());
    }
}
