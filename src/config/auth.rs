//! `[auth]`: the configured agents, each validated into an [`Agent`], and the limit on failed
//! authentications. The agents of `auth.agents_file` are validated here too, after the inline
//! ones (`config/mod.rs` reads the file and puts their problems back in it).

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::time::SystemTime;

use super::file::{AgentFile, AuthFile, Digests};
use super::problems::Problems;
use super::types::{parse_time, BusinessCode, Dates, TokenDigest, V1Policy};

/// One token an agent may authenticate with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentToken {
    pub digest: TokenDigest,
    /// The digest's first 8 hex digits: how metrics and logs name the token.
    pub label: String,
    /// From this time on the token fails as a wrong one does (`[[auth.agents.tokens]]`).
    pub not_after: Option<SystemTime>,
}

impl AgentToken {
    pub fn new(digest: TokenDigest, not_after: Option<SystemTime>) -> Self {
        AgentToken {
            label: digest.label(),
            digest,
            not_after,
        }
    }

    /// Whether the token is accepted at `now`.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.not_after.is_none_or(|end| now < end)
    }
}

/// A configured client of the gateway.
#[derive(Debug, Clone)]
pub struct Agent {
    pub id: String,
    /// Every token it may use: all are accepted (until their `not_after`), so a rotation adds
    /// the new one, lets the client move to it, then removes the old one.
    pub tokens: Vec<AgentToken>,
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

/// The configured agents by id. Hashed with FNV, not SipHash: a lookup is made for every
/// request, and the table's keys come from the config, so a client choosing the id it sends
/// cannot make a long chain of them.
pub type AgentTable = HashMap<String, Agent, fnv::FnvBuildHasher>;

/// Authentication settings and the agent table, keyed by agent id.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub require_on_status: bool,
    pub agents: AgentTable,
    /// 401s a client address may get in a minute before its requests are refused with 429.
    pub max_failures_per_minute: Option<NonZeroU32>,
}

/// The digests of `list` (one or a list), each problem under `key` (`key[j]` in a list).
pub(super) fn digests(list: &Digests, key: &str, p: &mut Problems) -> Vec<TokenDigest> {
    let one = list.0.len() == 1;
    list.0
        .iter()
        .enumerate()
        .filter_map(|(j, d)| {
            let at = if one {
                key.to_owned()
            } else {
                format!("{key}[{j}]")
            };
            p.check(at, TokenDigest::parse_hex(d))
        })
        .collect()
}

/// Validates `[auth]` (with the agents file's agents after the inline ones); an agent with a
/// problem is left out (and the problem reported).
pub(super) fn auth(f: &AuthFile, p: &mut Problems) -> AuthConfig {
    let mut agents = AgentTable::default();
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
    let max_failures_per_minute = f.max_failures_per_minute.and_then(|n| {
        let limit = NonZeroU32::new(n);
        if limit.is_none() {
            p.push(
                "auth.max_failures_per_minute",
                "must be greater than 0 (leave it out for no limit)",
            );
        }
        limit
    });
    AuthConfig {
        require_on_status: f.require_on_status,
        agents,
        max_failures_per_minute,
    }
}

/// An agent's tokens: `token_sha256` (one or a list) and `[[tokens]]`, at least one, each
/// named apart by its first 8 hex digits (the metric's label).
fn tokens(a: &AgentFile, key: &str, p: &mut Problems) -> Vec<AgentToken> {
    let plain = digests(&a.token_sha256, &format!("{key}.token_sha256"), p)
        .into_iter()
        .map(|digest| AgentToken::new(digest, None));
    let timed = a.tokens.iter().enumerate().filter_map(|(j, t)| {
        let at = format!("{key}.tokens[{j}]");
        let digest = p.check(format!("{at}.sha256"), TokenDigest::parse_hex(&t.sha256));
        let not_after = match &t.not_after {
            None => Some(None),
            Some(when) => p
                .check(format!("{at}.not_after"), parse_time(when))
                .map(Some),
        };
        Some(AgentToken::new(digest?, not_after?))
    });
    let all: Vec<AgentToken> = plain.chain(timed).collect();
    if a.token_sha256.is_empty() && a.tokens.is_empty() {
        p.push(
            format!("{key}.token_sha256"),
            "required: the SHA-256 of the agent's token (agent-gateway hash-token), or [[tokens]]",
        );
    }
    let mut labels = HashSet::new();
    if !all.iter().all(|t| labels.insert(t.label.as_str())) {
        p.push(
            format!("{key}.token_sha256"),
            "two tokens of this agent begin with the same 8 hex digits (the same token twice?): \
             metrics name a token by them",
        );
    }
    all
}

/// The `agent_id` under which metrics count the requests of callers that are no configured
/// agent: no agent may have it, or its counts would mix with strangers' and the fleet's
/// reports would leave it out.
pub const UNKNOWN_AGENT: &str = "unknown";

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
    } else if a.id == UNKNOWN_AGENT {
        p.push(
            format!("{key}.id"),
            "\"unknown\" is reserved: the metrics' agent_id of callers that are no agent",
        );
    }
    let tokens = tokens(a, key, p);
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
        tokens,
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

    /// `unknown` is the metrics' agent of callers that are no agent: no agent may be called so.
    #[test]
    fn no_agent_may_be_called_unknown() {
        let mut f = testing::config();
        f.agent_mut(AGENT_ID).id = UNKNOWN_AGENT.into();
        assert_eq!(f.refused_keys(), ["auth.agents[0].id"]);
    }
}
