//! Retiring v1: what happens to one v1 call under a snapshot's per-agent policy, sunset
//! enforcement and brownouts.
//!
//! Pure: [`decide`] takes the time as an argument, so tests drive windows and ramps with an
//! injected clock. The settings, and the signal headers rendered from them, are
//! [`crate::config::Retirement`].

use std::time::SystemTime;

use crate::api::reply::V1Refusal;
use crate::config::{Agent, Brownout, Retirement, V1Policy};

/// Whether `brownout` applies to a call by `agent` (None: unauthenticated) at `now`.
fn covers(brownout: &Brownout, now: SystemTime, agent: Option<&Agent>) -> bool {
    brownout.start <= now
        && now < brownout.end
        && match (&brownout.agents, agent) {
            (None, _) => true,
            (Some(list), Some(a)) => list.contains(&a.id),
            (Some(_), None) => false,
        }
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

/// Whether a v1 call by `agent` (None: unauthenticated) at `now` may go upstream.
pub fn decide(
    retirement: &Retirement,
    agent: Option<&Agent>,
    now: SystemTime,
    request_id: &str,
) -> Result<(), V1Refusal> {
    match agent.map_or(V1Policy::Allow, |a| a.v1_policy) {
        V1Policy::Exempt => return Ok(()),
        V1Policy::Block => return Err(V1Refusal::Blocked),
        V1Policy::Allow => {}
    }
    if retirement.enforce_sunset && retirement.sunset_at.is_some_and(|s| s <= now) {
        return Err(V1Refusal::Sunset);
    }
    for b in &retirement.brownouts {
        if covers(b, now, agent) && bucket(request_id) < b.percent {
            return Err(V1Refusal::Brownout { until: b.end });
        }
    }
    Ok(())
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
    fn nothing_configured_means_no_refusals() {
        let r = Retirement::default();
        assert_eq!(
            decide(
                &r,
                Some(&agent("a", V1Policy::Allow)),
                SystemTime::now(),
                "x"
            ),
            Ok(())
        );
    }

    #[test]
    fn policies() {
        let r = Retirement::default();
        let now = SystemTime::now();
        assert_eq!(
            decide(&r, Some(&agent("a", V1Policy::Block)), now, "x"),
            Err(V1Refusal::Blocked)
        );
        assert_eq!(
            decide(&r, Some(&agent("a", V1Policy::Exempt)), now, "x"),
            Ok(())
        );
        assert_eq!(decide(&r, None, now, "x"), Ok(()));
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
            decide(&r, Some(&plain), after, "x"),
            Ok(()),
            "a clock alone cuts nothing off"
        );
        r.enforce_sunset = true;
        assert_eq!(decide(&r, Some(&plain), before, "x"), Ok(()));
        assert_eq!(decide(&r, Some(&plain), after, "x"), Err(V1Refusal::Sunset));
        assert_eq!(decide(&r, None, after, "x"), Err(V1Refusal::Sunset));
        assert_eq!(
            decide(&r, Some(&agent("e", V1Policy::Exempt)), after, "x"),
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
        assert_eq!(
            decide(&r, Some(&a), at("2026-12-01T09:59:59Z"), "x"),
            Ok(())
        );
        assert_eq!(
            decide(&r, Some(&a), at("2026-12-01T10:00:00Z"), "x"),
            Err(V1Refusal::Brownout { until: end })
        );
        assert_eq!(
            decide(&r, Some(&a), at("2026-12-01T10:59:59Z"), "y"),
            Err(V1Refusal::Brownout { until: end })
        );
        assert_eq!(
            decide(&r, Some(&a), end, "x"),
            Ok(()),
            "the end is exclusive"
        );
        assert_eq!(
            decide(
                &r,
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
        assert!(decide(&r, Some(&agent("late", V1Policy::Allow)), t, "x").is_err());
        assert_eq!(
            decide(&r, Some(&agent("other", V1Policy::Allow)), t, "x"),
            Ok(())
        );
        assert_eq!(decide(&r, None, t, "x"), Ok(()));
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
                .filter(|id| decide(&r, Some(&a), t, id).is_err())
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
                    decide(&r, Some(&a), t, id),
                    decide(&r, Some(&a), t + Duration::from_secs(60), id)
                );
            }
        }
    }
}
