//! Authentication of `X-Service-Agent-Id` / `X-Auth-Token` against the configured agents.
//!
//! Pure: header bytes and a snapshot's agent table in, an agent or a reason out. Every
//! failure answers the same 401 to the client; the reason exists for metrics and logs only.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{Agent, AuthConfig};

pub const AUTH_TOKEN_HEADER: &str = "x-auth-token";
pub const AGENT_ID_HEADER: &str = "x-service-agent-id";

/// Why a request was refused with 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthFailure {
    MissingHeaders,
    UnknownAgent,
    BadToken,
    ServiceNotAllowed,
}

impl AuthFailure {
    pub const ALL: [AuthFailure; 4] = [
        AuthFailure::MissingHeaders,
        AuthFailure::UnknownAgent,
        AuthFailure::BadToken,
        AuthFailure::ServiceNotAllowed,
    ];

    /// The label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::MissingHeaders => "missing_headers",
            AuthFailure::UnknownAgent => "unknown_agent",
            AuthFailure::BadToken => "bad_token",
            AuthFailure::ServiceNotAllowed => "service_not_allowed",
        }
    }
}

/// Hex SHA-256 of a token, as written in `token_sha256`.
pub fn hash_token(token: &[u8]) -> String {
    hex::encode(Sha256::digest(token))
}

/// Finds the agent named by `agent_id` and checks `token` against its digest in constant time.
///
/// The token is hashed even when the agent is unknown, so timing does not tell which agent
/// ids exist.
pub fn authenticate<'a>(
    auth: &'a AuthConfig,
    agent_id: Option<&[u8]>,
    token: Option<&[u8]>,
) -> Result<&'a Agent, AuthFailure> {
    let (Some(agent_id), Some(token)) = (agent_id, token) else {
        return Err(AuthFailure::MissingHeaders);
    };
    if agent_id.is_empty() || token.is_empty() {
        return Err(AuthFailure::MissingHeaders);
    }
    let digest: [u8; 32] = Sha256::digest(token).into();
    let agent = std::str::from_utf8(agent_id)
        .ok()
        .and_then(|id| auth.agents.get(id))
        .ok_or(AuthFailure::UnknownAgent)?;
    if bool::from(agent.token.0.ct_eq(&digest)) {
        Ok(agent)
    } else {
        Err(AuthFailure::BadToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BusinessCode, TokenDigest};
    use std::collections::HashMap;

    fn table() -> AuthConfig {
        let agent = Agent {
            id: "agent-1".into(),
            token: TokenDigest::parse_hex(&hash_token(b"secret")).unwrap(),
            default_service: None,
            services: Some(vec![BusinessCode::parse("ALLOWED").unwrap()]),
            v1_policy: Default::default(),
            rate_limit: None,
        };
        AuthConfig {
            require_on_status: true,
            agents: HashMap::from([("agent-1".to_string(), agent)]),
        }
    }

    #[test]
    fn hash_token_is_hex_sha256() {
        assert_eq!(
            hash_token(b"secret"),
            "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
        );
    }

    #[test]
    fn valid_credentials_find_the_agent() {
        let t = table();
        let agent = authenticate(&t, Some(b"agent-1"), Some(b"secret")).unwrap();
        assert_eq!(agent.id, "agent-1");
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
            let got = authenticate(&t, id.map(str::as_bytes), token.map(str::as_bytes));
            assert_eq!(got.unwrap_err(), want);
        }
        let not_utf8 = authenticate(&t, Some(b"\xff"), Some(b"secret"));
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
