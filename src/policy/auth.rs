//! Authentication of `X-Service-Agent-Id` / `X-Auth-Token` against the configured agents.
//!
//! Pure: header bytes, a snapshot's agent table and the time in, an agent and the token it
//! used, or a reason, out. Every failure answers the same 401 to the client; the reason
//! exists for metrics and logs only.

use std::time::SystemTime;

use subtle::{Choice, ConstantTimeEq};

use crate::config::{Agent, AgentToken, AuthConfig, TokenDigest};

pub const AUTH_TOKEN_HEADER: &str = "x-auth-token";
pub const AGENT_ID_HEADER: &str = "x-service-agent-id";

listed_enum! {
    /// Why a request was refused with 401 (the label is used in metrics and logs).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum AuthFailure {
        MissingHeaders => "missing_headers",
        UnknownAgent => "unknown_agent",
        BadToken => "bad_token",
        ServiceNotAllowed => "service_not_allowed",
    }
}

/// The index of the digest among `candidates` that equals `digest`: every candidate is
/// compared, in constant time, whichever matches.
pub fn matching_digest<'d>(
    digest: &TokenDigest,
    candidates: impl IntoIterator<Item = &'d TokenDigest>,
) -> Option<usize> {
    let mut found = None;
    for (i, candidate) in candidates.into_iter().enumerate() {
        if bool::from(digests_equal(candidate, digest)) {
            found = Some(i);
        }
    }
    found
}

/// Whether two digests are equal, in a time that does not depend on where they differ: their
/// differences gathered as four 64-bit words, then one comparison. `subtle`'s comparison of
/// byte slices hides each of the 32 bytes' comparisons from the optimiser on its own, some
/// 250 instructions a request where this takes about 20.
fn digests_equal(a: &TokenDigest, b: &TokenDigest) -> Choice {
    let words = |d: &TokenDigest| {
        // Typed, so that a digest of another size does not compile here.
        let bytes: &[u8; 32] = &d.0;
        let mut w = [0u64; 4];
        for (word, bytes) in w.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_ne_bytes(bytes.try_into().expect("8-byte chunks"));
        }
        w
    };
    let (a, b) = (words(a), words(b));
    let differ = (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]);
    differ.ct_eq(&0)
}

/// Finds the agent named by `agent_id` and checks `token` against each of its tokens in
/// constant time; a token past its `not_after` at `now` fails as a wrong one does.
///
/// The token is hashed even when the agent is unknown, so timing does not tell which agent
/// ids exist.
pub fn authenticate<'a>(
    auth: &'a AuthConfig,
    agent_id: Option<&[u8]>,
    token: Option<&[u8]>,
    now: SystemTime,
) -> Result<(&'a Agent, &'a AgentToken), AuthFailure> {
    let (Some(agent_id), Some(token)) = (agent_id, token) else {
        return Err(AuthFailure::MissingHeaders);
    };
    if agent_id.is_empty() || token.is_empty() {
        return Err(AuthFailure::MissingHeaders);
    }
    let digest = TokenDigest::of(token);
    let agent = std::str::from_utf8(agent_id)
        .ok()
        .and_then(|id| auth.agents.get(id))
        .ok_or(AuthFailure::UnknownAgent)?;
    let matched = matching_digest(&digest, agent.tokens.iter().map(|t| &t.digest))
        .map(|i| &agent.tokens[i])
        .filter(|t| t.valid_at(now));
    matched.map(|t| (agent, t)).ok_or(AuthFailure::BadToken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BusinessCode;
    use std::time::Duration;

    const NOW: SystemTime = SystemTime::UNIX_EPOCH;

    fn token(t: &[u8], not_after: Option<SystemTime>) -> AgentToken {
        AgentToken::new(TokenDigest::of(t), not_after)
    }

    fn table() -> AuthConfig {
        let agent = Agent {
            id: "agent-1".into(),
            tokens: vec![token(b"secret", None)],
            default_service: None,
            services: Some(vec![BusinessCode::parse("ALLOWED").unwrap()]),
            v1_policy: Default::default(),
            rate_limit: None,
            dates: Default::default(),
        };
        AuthConfig {
            require_on_status: true,
            agents: [("agent-1".to_string(), agent)].into_iter().collect(),
            max_failures_per_minute: None,
        }
    }

    #[test]
    fn digests_are_equal_only_when_every_byte_is() {
        let digest = TokenDigest::of(b"secret");
        assert!(bool::from(digests_equal(&digest, &digest.clone())));
        for byte in [0, 7, 8, 31] {
            for bit in [0x01, 0x80] {
                let mut other = digest.clone();
                other.0[byte] ^= bit;
                assert!(
                    !bool::from(digests_equal(&digest, &other)),
                    "byte {byte}, bit {bit:#x}"
                );
            }
        }
    }

    #[test]
    fn valid_credentials_find_the_agent() {
        let t = table();
        let (agent, used) = authenticate(&t, Some(b"agent-1"), Some(b"secret"), NOW).unwrap();
        assert_eq!(agent.id, "agent-1");
        assert_eq!(used.digest, TokenDigest::of(b"secret"));
    }

    #[test]
    fn every_listed_token_works_until_its_not_after() {
        let mut t = table();
        let end = NOW + Duration::from_secs(60);
        t.agents.get_mut("agent-1").unwrap().tokens =
            vec![token(b"old", Some(end)), token(b"new", None)];
        let auth = |tok: &[u8], at| {
            authenticate(&t, Some(b"agent-1"), Some(tok), at).map(|(_, used)| used.digest.clone())
        };
        assert_eq!(auth(b"old", NOW), Ok(TokenDigest::of(b"old")));
        assert_eq!(auth(b"new", NOW), Ok(TokenDigest::of(b"new")));
        assert_eq!(
            auth(b"old", end - Duration::from_secs(1)),
            Ok(TokenDigest::of(b"old"))
        );
        // From not_after on, the old token is a wrong one; the new one goes on.
        assert_eq!(auth(b"old", end), Err(AuthFailure::BadToken));
        assert_eq!(auth(b"new", end), Ok(TokenDigest::of(b"new")));
        assert_eq!(auth(b"secret", NOW), Err(AuthFailure::BadToken));
    }

    #[test]
    fn the_matching_digest_is_found_among_all() {
        let list = [
            TokenDigest::of(b"a"),
            TokenDigest::of(b"b"),
            TokenDigest::of(b"c"),
        ];
        assert_eq!(matching_digest(&TokenDigest::of(b"c"), &list), Some(2));
        assert_eq!(matching_digest(&TokenDigest::of(b"a"), &list), Some(0));
        assert_eq!(matching_digest(&TokenDigest::of(b"d"), &list), None);
        assert_eq!(matching_digest(&TokenDigest::of(b"d"), []), None);
    }

    #[test]
    fn each_failure_has_its_reason() {
        let t = table();
        let cases: [(Option<&str>, Option<&str>, AuthFailure); 5] = [
            (None, Some("secret"), AuthFailure::MissingHeaders),
            (Some("agent-1"), None, AuthFailure::MissingHeaders),
            (Some(""), Some("secret"), AuthFailure::MissingHeaders),
            (Some("agent-2"), Some("secret"), AuthFailure::UnknownAgent),
            (Some("agent-1"), Some("secreT"), AuthFailure::BadToken),
        ];
        for (id, token, want) in cases {
            let got = authenticate(&t, id.map(str::as_bytes), token.map(str::as_bytes), NOW);
            assert_eq!(got.unwrap_err(), want);
        }
        let not_utf8 = authenticate(&t, Some(b"\xff"), Some(b"secret"), NOW);
        assert_eq!(not_utf8.unwrap_err(), AuthFailure::UnknownAgent);
    }

    #[test]
    fn services_allow_list() {
        let t = table();
        let agent = &t.agents["agent-1"];
        assert!(agent.may_use("ALLOWED"));
        assert!(!agent.may_use("OTHER"));
        assert!(!agent.may_use("ALLOWED%2F"));
    }
}
