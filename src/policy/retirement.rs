//! Retiring v1: deprecation signals, per-agent policy, sunset enforcement and brownouts.
//!
//! Pure: [`Retirement::decide`] takes the time as an argument, so tests drive windows and
//! ramps with an injected clock. The signal headers (RFC 9745 `Deprecation`, RFC 8594
//! `Sunset`, `Link`) are rendered once when the config is loaded.

use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderValue;

use crate::config::Agent;

/// What the gateway does with an agent's v1 calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum V1Policy {
    /// Forward, subject to sunset enforcement and brownouts.
    #[default]
    Allow,
    /// Refuse every v1 call with 410.
    Block,
    /// Always forward: never blocked, browned out or sunset.
    Exempt,
}

impl V1Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            V1Policy::Allow => "allow",
            V1Policy::Block => "block",
            V1Policy::Exempt => "exempt",
        }
    }
}

/// Why a v1 call was refused with 410.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum V1Refusal {
    Blocked,
    /// Inside a brownout window; the client may retry after the window ends.
    Brownout {
        until: SystemTime,
    },
    Sunset,
}

impl V1Refusal {
    pub const REASONS: [&'static str; 3] = ["blocked", "brownout", "sunset"];

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            V1Refusal::Blocked => "blocked",
            V1Refusal::Brownout { .. } => "brownout",
            V1Refusal::Sunset => "sunset",
        }
    }
}

/// A scheduled window in which a share of v1 calls is refused, to make stragglers notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Brownout {
    pub start: SystemTime,
    pub end: SystemTime,
    /// Share of matching requests refused, 1 to 100.
    pub percent: u8,
    /// The agents it applies to; `None` means every agent that is not exempt.
    pub agents: Option<Vec<String>>,
}

impl Brownout {
    fn covers(&self, now: SystemTime, agent: Option<&Agent>) -> bool {
        self.start <= now
            && now < self.end
            && match (&self.agents, agent) {
                (None, _) => true,
                (Some(list), Some(a)) => list.contains(&a.id),
                (Some(_), None) => false,
            }
    }
}

/// The retirement settings of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct Retirement {
    pub deprecated_at: Option<SystemTime>,
    pub sunset_at: Option<SystemTime>,
    pub link: Option<String>,
    pub enforce_sunset: bool,
    pub brownouts: Vec<Brownout>,
    pub quiet_days: u32,
    /// The headers every v1 response carries, rendered once.
    pub headers: Vec<(&'static str, HeaderValue)>,
}

/// Whole seconds since the Unix epoch (0 before it).
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A stable 0..100 bucket for a request id: the same id always lands in the same bucket, so
/// a retry of the same request gets the same brownout answer.
pub fn bucket(request_id: &str) -> u8 {
    // FNV-1a: fixed, so the answer is the same in every process and every build.
    let hash = request_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % 100) as u8
}

impl Retirement {
    /// Renders the signal headers; call after the dates and link are set.
    pub fn render_headers(&mut self) {
        let mut headers = Vec::new();
        if let Some(t) = self.deprecated_at {
            // RFC 9745: a structured-field Date, `@` and Unix seconds.
            let v = format!("@{}", unix_seconds(t));
            headers.push((
                "deprecation",
                HeaderValue::from_str(&v).expect("digits are a valid header value"),
            ));
        }
        if let Some(t) = self.sunset_at {
            // RFC 8594: an HTTP-date (IMF-fixdate).
            let v = httpdate::fmt_http_date(t);
            headers.push((
                "sunset",
                HeaderValue::from_str(&v).expect("an HTTP-date is a valid header value"),
            ));
        }
        if let Some(link) = &self.link {
            let mut v = format!("<{link}>; rel=\"deprecation\"");
            if self.sunset_at.is_some() {
                v.push_str(&format!(", <{link}>; rel=\"sunset\""));
            }
            if let Ok(v) = HeaderValue::from_str(&v) {
                headers.push(("link", v));
            }
        }
        self.headers = headers;
    }

    /// Whether a v1 call by `agent` (None: unauthenticated) at `now` may go upstream.
    pub fn decide(
        &self,
        agent: Option<&Agent>,
        now: SystemTime,
        request_id: &str,
    ) -> Result<(), V1Refusal> {
        match agent.map_or(V1Policy::Allow, |a| a.v1_policy) {
            V1Policy::Exempt => return Ok(()),
            V1Policy::Block => return Err(V1Refusal::Blocked),
            V1Policy::Allow => {}
        }
        if self.enforce_sunset && self.sunset_at.is_some_and(|s| s <= now) {
            return Err(V1Refusal::Sunset);
        }
        for b in &self.brownouts {
            if b.covers(now, agent) && bucket(request_id) < b.percent {
                return Err(V1Refusal::Brownout { until: b.end });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenDigest;
    use std::time::Duration;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    fn agent(id: &str, policy: V1Policy) -> Agent {
        Agent {
            id: id.into(),
            token: TokenDigest([0; 32]),
            default_service: None,
            services: None,
            v1_policy: policy,
            rate_limit: None,
        }
    }

    #[test]
    fn headers_follow_the_rfcs() {
        let mut r = Retirement {
            deprecated_at: Some(at("2026-06-01T00:00:00Z")),
            sunset_at: Some(at("2027-06-01T00:00:00Z")),
            link: Some("https://example.org/agent-api/v2".into()),
            ..Default::default()
        };
        r.render_headers();
        let get = |n: &str| {
            r.headers
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        assert_eq!(get("deprecation").unwrap(), "@1780272000");
        assert_eq!(get("sunset").unwrap(), "Tue, 01 Jun 2027 00:00:00 GMT");
        assert_eq!(
            get("link").unwrap(),
            "<https://example.org/agent-api/v2>; rel=\"deprecation\", <https://example.org/agent-api/v2>; rel=\"sunset\""
        );
    }

    #[test]
    fn nothing_configured_means_no_headers_and_no_refusals() {
        let mut r = Retirement::default();
        r.render_headers();
        assert!(r.headers.is_empty());
        assert_eq!(
            r.decide(Some(&agent("a", V1Policy::Allow)), SystemTime::now(), "x"),
            Ok(())
        );
    }

    #[test]
    fn policies() {
        let r = Retirement::default();
        let now = SystemTime::now();
        assert_eq!(
            r.decide(Some(&agent("a", V1Policy::Block)), now, "x"),
            Err(V1Refusal::Blocked)
        );
        assert_eq!(
            r.decide(Some(&agent("a", V1Policy::Exempt)), now, "x"),
            Ok(())
        );
        assert_eq!(r.decide(None, now, "x"), Ok(()));
    }

    #[test]
    fn sunset_is_enforced_only_when_asked_and_never_for_exempt_agents() {
        let mut r = Retirement {
            sunset_at: Some(at("2027-06-01T00:00:00Z")),
            ..Default::default()
        };
        let before = at("2027-05-31T23:59:59Z");
        let after = at("2027-06-01T00:00:00Z");
        let plain = agent("a", V1Policy::Allow);
        assert_eq!(
            r.decide(Some(&plain), after, "x"),
            Ok(()),
            "a clock alone cuts nothing off"
        );
        r.enforce_sunset = true;
        assert_eq!(r.decide(Some(&plain), before, "x"), Ok(()));
        assert_eq!(r.decide(Some(&plain), after, "x"), Err(V1Refusal::Sunset));
        assert_eq!(r.decide(None, after, "x"), Err(V1Refusal::Sunset));
        assert_eq!(
            r.decide(Some(&agent("e", V1Policy::Exempt)), after, "x"),
            Ok(())
        );
    }

    fn window(percent: u8, agents: Option<Vec<String>>) -> Retirement {
        Retirement {
            brownouts: vec![Brownout {
                start: at("2026-12-01T10:00:00Z"),
                end: at("2026-12-01T11:00:00Z"),
                percent,
                agents,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_full_brownout_refuses_inside_its_window_only() {
        let r = window(100, None);
        let a = agent("a", V1Policy::Allow);
        let end = at("2026-12-01T11:00:00Z");
        assert_eq!(r.decide(Some(&a), at("2026-12-01T09:59:59Z"), "x"), Ok(()));
        assert_eq!(
            r.decide(Some(&a), at("2026-12-01T10:00:00Z"), "x"),
            Err(V1Refusal::Brownout { until: end })
        );
        assert_eq!(
            r.decide(Some(&a), at("2026-12-01T10:59:59Z"), "y"),
            Err(V1Refusal::Brownout { until: end })
        );
        assert_eq!(r.decide(Some(&a), end, "x"), Ok(()), "the end is exclusive");
        assert_eq!(
            r.decide(
                Some(&agent("e", V1Policy::Exempt)),
                at("2026-12-01T10:30:00Z"),
                "x"
            ),
            Ok(())
        );
    }

    #[test]
    fn a_brownout_can_target_named_agents() {
        let r = window(100, Some(vec!["late".into()]));
        let t = at("2026-12-01T10:30:00Z");
        assert!(r
            .decide(Some(&agent("late", V1Policy::Allow)), t, "x")
            .is_err());
        assert_eq!(
            r.decide(Some(&agent("other", V1Policy::Allow)), t, "x"),
            Ok(())
        );
        assert_eq!(r.decide(None, t, "x"), Ok(()));
    }

    #[test]
    fn a_percent_ramp_refuses_about_that_share_deterministically_by_request_id() {
        let a = agent("a", V1Policy::Allow);
        let t = at("2026-12-01T10:30:00Z");
        let ids: Vec<String> = (0..10_000).map(|i| format!("req-{i}")).collect();
        let mut previous = 0;
        for percent in [1u8, 10, 25, 50, 90, 100] {
            let r = window(percent, None);
            let refused = ids
                .iter()
                .filter(|id| r.decide(Some(&a), t, id).is_err())
                .count();
            let expected = 10_000 * usize::from(percent) / 100;
            assert!(
                refused.abs_diff(expected) <= 300,
                "{percent}%: {refused} refused"
            );
            assert!(refused >= previous, "a higher percent never refuses fewer");
            previous = refused;
            // The same id always gets the same answer.
            for id in ids.iter().take(100) {
                assert_eq!(
                    r.decide(Some(&a), t, id),
                    r.decide(Some(&a), t + Duration::from_secs(60), id)
                );
            }
        }
    }
}
