//! `[auth]`: the configured agents, each validated into an [`Agent`].

use std::collections::{HashMap, HashSet};

use super::file::{AgentFile, AuthFile};
use super::problems::Problems;
use super::types::{parse_time, BusinessCode, Dates, TokenDigest, V1Policy};

/// A configured client of the gateway.
#[derive(Debug, Clone)]
pub struct Agent {
    pub id: String,
    pub token: TokenDigest,
    /// Overrides `v1.default_service` for this agent's v1 calls.
    pub default_service: Option<BusinessCode>,
    /// When set, the only business codes this agent may reach (v1 or v2).
    pub services: Option<Vec<BusinessCode>>,
    /// What happens to this agent's v1 calls.
    pub v1_policy: V1Policy,
    pub rate_limit: Option<RateLimit>,
    /// This agent's own retirement dates; one not set here is `[retirement]`'s.
    pub dates: Dates,
}

impl Agent {
    /// Whether this agent may act on the service `code` (a raw path segment).
    pub fn may_use(&self, code: &str) -> bool {
        match &self.services {
            None => true,
            Some(allowed) => allowed.iter().any(|c| c.as_str() == code),
        }
    }
}

/// A token bucket's settings: `per_second` sustained, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

/// Authentication settings and the agent table, keyed by agent id.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub require_on_status: bool,
    pub agents: HashMap<String, Agent>,
}

/// Validates `[auth]`; an agent with a problem is left out (and the problem reported).
pub(super) fn auth(f: &AuthFile, p: &mut Problems) -> AuthConfig {
    let mut agents = HashMap::new();
    let mut seen_ids = HashSet::new();
    for (i, a) in f.agents.iter().enumerate() {
        let key = format!("auth.agents[{i}]");
        if !seen_ids.insert(a.id.as_str()) {
            check_fields(a, &key, p);
            p.push(
                format!("{key}.id"),
                format!("duplicate agent id {:?}", a.id),
            );
            continue;
        }
        if let Some(agent) = check_fields(a, &key, p) {
            agents.insert(a.id.clone(), agent);
        }
    }
    AuthConfig {
        require_on_status: f.require_on_status,
        agents,
    }
}

/// One agent's fields, every problem reported under `key`.
fn check_fields(a: &AgentFile, key: &str, p: &mut Problems) -> Option<Agent> {
    if a.id.is_empty() {
        p.push(
            format!("{key}.id"),
            "required: what the agent sends as X-Service-Agent-Id",
        );
    } else if a.id.len() > 128 || !a.id.bytes().all(|b| b.is_ascii_graphic()) {
        p.push(
            format!("{key}.id"),
            "must be 1 to 128 visible ASCII characters",
        );
    }
    let token = p.check(
        format!("{key}.token_sha256"),
        TokenDigest::parse_hex(&a.token_sha256),
    );
    let default_service = match &a.default_service {
        None => Some(None),
        Some(s) => p
            .check(format!("{key}.default_service"), BusinessCode::parse(s))
            .map(Some),
    };
    let services = a.services.as_ref().map(|list| {
        list.iter()
            .enumerate()
            .filter_map(|(j, s)| p.check(format!("{key}.services[{j}]"), BusinessCode::parse(s)))
            .collect::<Vec<_>>()
    });
    if let (Some(Some(d)), Some(list)) = (&default_service, &services) {
        if !list.contains(d) {
            p.push(
                format!("{key}.default_service"),
                format!("{:?} is not in this agent's services", d.as_str()),
            );
        }
    }
    let rate_limit = match (a.rate_limit_per_second, a.burst) {
        (None, None) => None,
        (None, Some(_)) => {
            p.push(format!("{key}.burst"), "needs rate_limit_per_second");
            None
        }
        (Some(rate), burst) if rate.is_finite() && rate > 0.0 => Some(RateLimit {
            per_second: rate,
            burst: burst.unwrap_or_else(|| rate.ceil().max(1.0) as u32).max(1),
        }),
        (Some(_), _) => {
            p.push(
                format!("{key}.rate_limit_per_second"),
                "must be a positive number",
            );
            None
        }
    };
    let date = |field: &str, value: &Option<String>, p: &mut Problems| {
        let value = value.as_deref()?;
        p.check(format!("{key}.{field}"), parse_time(value))
    };
    let dates = Dates {
        deprecated_at: date("deprecated_at", &a.deprecated_at, p),
        sunset_at: date("sunset_at", &a.sunset_at, p),
    };
    Some(Agent {
        id: a.id.clone(),
        token: token?,
        default_service: default_service?,
        services,
        v1_policy: a.v1_policy,
        rate_limit,
        dates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{self, AGENT_ID};

    #[test]
    fn rate_limits() {
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).rate_limit_per_second = Some(2.5);
        assert_eq!(
            f.snapshot().auth.agents[AGENT_ID].rate_limit,
            Some(RateLimit {
                per_second: 2.5,
                burst: 3
            })
        );
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).rate_limit_per_second = Some(0.0);
        assert_eq!(f.refused_keys(), ["auth.agents[0].rate_limit_per_second"]);
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).burst = Some(3);
        assert_eq!(f.refused_keys(), ["auth.agents[0].burst"]);
    }

    #[test]
    fn agent_default_service_must_be_in_its_services() {
        let mut f = testing::config();
        let agent = f.agent_mut(AGENT_ID);
        agent.default_service = Some("OTHER".into());
        agent.services = Some(vec!["ORG_DEFAULT".into()]);
        assert_eq!(f.refused_keys(), ["auth.agents[0].default_service"]);
    }
}
