//! Authentication of `X-Service-Agent-Id` / `X-Auth-Token` against the configured agents.
//!
//! Pure: header bytes and a snapshot's agent table in, an agent or a reason out. Every
//! failure answers the same 401 to the client; the reason exists for metrics and logs only.

use subtle::ConstantTimeEq;

use crate::config::{Agent, AuthConfig, TokenDigest};

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
    let digest = TokenDigest::of(token);
    let agent = std::str::from_utf8(agent_id)
        .ok()
        .and_then(|id| auth.agents.get(id))
        .ok_or(AuthFailure::UnknownAgent)?;
    if bool::from(agent.token.0.ct_eq(&digest.0)) {
        Ok(agent)
    } else {
        Err(AuthFailure::BadToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BusinessCode;
    use std::collections::HashMap;

    fn table() -> AuthConfig {
        let agent = Agent {
            id: "agent-1".into(),
            token: TokenDigest::of(b"secret"),
            default_service: None,
            services: Some(vec![BusinessCode::parse("ALLOWED").unwrap()]),
            v1_policy: Default::default(),
            rate_limit: None,
            dates: Default::default(),
        };
        AuthConfig {
            require_on_status: true,
            agents: HashMap::from([("agent-1".to_string(), agent)]),
        }
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
