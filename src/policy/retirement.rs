//! Retiring v1: what happens to one v1 call under a snapshot's per-agent policy and dates,
//! sunset enforcement, the brownout schedule and a client's sunset rehearsal.
//!
//! Pure: [`decide`] takes the time as an argument, so tests drive windows and ramps with an
//! injected clock. The settings, and the signal headers rendered from them, are
//! [`crate::config::RetirementConfig`].

use std::time::SystemTime;

use crate::api::reply::V1Refusal;
use crate::config::{Agent, Brownout, RetirementConfig, V1Policy, Weekday};

/// The request header with which a client asks for its post-sunset answer now; `1` is the
/// only value that does.
pub const REHEARSAL_HEADER: &str = "x-sunset-rehearsal";

/// Whether `brownout` applies to calls by `agent` (None: no known agent).
fn applies_to(brownout: &Brownout, agent: Option<&Agent>) -> bool {
    match (&brownout.agents, agent) {
        (None, _) => true,
        (Some(list), Some(a)) => list.contains(&a.id),
        (Some(_), None) => false,
    }
}

/// The brownout window open at some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    /// When it closes: the refusals' `Retry-After`.
    end: SystemTime,
    /// The share of calls it refuses at that instant, 0 to 100.
    percent: u8,
}

/// The window of `brownout` open at `now`, if any, with the share its ramp has reached.
fn window_at(brownout: &Brownout, now: SystemTime) -> Option<Window> {
    let since_start = now.duration_since(brownout.start).ok()?;
    let length = brownout
        .end
        .duration_since(brownout.start)
        .unwrap_or_default();
    let opened = match &brownout.repeat {
        None => brownout.start,
        Some(r) => {
            let periods = since_start.as_nanos() / r.every.as_nanos();
            let opened = brownout.start + r.every * u32::try_from(periods).ok()?;
            let on_its_day = r
                .days
                .as_ref()
                .is_none_or(|days| days.contains(&Weekday::of(opened)));
            if opened >= r.until || !on_its_day {
                return None;
            }
            opened
        }
    };
    let end = opened + length;
    (now < end).then(|| Window {
        end,
        percent: ramp(brownout, now),
    })
}

/// The share the ramp of `brownout` has reached at `now`: `percent` at its start rising in a
/// straight line to `percent_end` at [`Brownout::ramp_end`], rounded down.
fn ramp(brownout: &Brownout, now: SystemTime) -> u8 {
    let (from, to) = (brownout.percent, brownout.percent_end);
    let span = brownout
        .ramp_end()
        .duration_since(brownout.start)
        .unwrap_or_default();
    let done = now
        .duration_since(brownout.start)
        .unwrap_or_default()
        .min(span);
    if span.is_zero() || from == to {
        return to;
    }
    let rise = u128::from(to - from) * done.as_millis() / span.as_millis().max(1);
    from + u8::try_from(rise).unwrap_or(to - from)
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

/// The share of `agent`'s v1 calls the brownout schedule refuses at `now`, 0 to 100: the
/// highest share of the windows open for it (the request id buckets are the same in every
/// window, so overlapping windows refuse the union of their shares, which is the largest).
pub fn brownout_percent(retirement: &RetirementConfig, agent: &Agent, now: SystemTime) -> u8 {
    if agent.v1_policy != V1Policy::Allow {
        return 0;
    }
    retirement
        .brownouts
        .iter()
        .filter(|b| applies_to(b, Some(agent)))
        .filter_map(|b| window_at(b, now))
        .map(|w| w.percent)
        .max()
        .unwrap_or(0)
}

/// A brownout window as scheduled: when it opens and closes, and the share its ramp refuses
/// as it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledWindow {
    pub start: SystemTime,
    pub end: SystemTime,
    /// 1 to 100.
    pub percent: u8,
}

/// The first window of `brownout` to open after `now`, if it has one left.
fn next_window(brownout: &Brownout, now: SystemTime) -> Option<ScheduledWindow> {
    let length = brownout
        .end
        .duration_since(brownout.start)
        .unwrap_or_default();
    let start = match &brownout.repeat {
        None => Some(brownout.start).filter(|s| *s > now)?,
        Some(r) => {
            let first = match now.duration_since(brownout.start) {
                Err(_) => 0,
                Ok(since) => u32::try_from(since.as_nanos() / r.every.as_nanos()).ok()? + 1,
            };
            // A daily window on chosen days opens within a week, if at all.
            (first..first.saturating_add(8))
                .map(|k| brownout.start + r.every * k)
                .take_while(|opened| *opened < r.until)
                .find(|opened| {
                    r.days
                        .as_ref()
                        .is_none_or(|days| days.contains(&Weekday::of(*opened)))
                })?
        }
    };
    Some(ScheduledWindow {
        start,
        end: start + length,
        percent: ramp(brownout, start),
    })
}

/// The earliest of `windows`; of windows opening together, the one refusing most.
fn earliest(windows: impl Iterator<Item = ScheduledWindow>) -> Option<ScheduledWindow> {
    windows.min_by_key(|w| (w.start, std::cmp::Reverse(w.percent)))
}

/// The next brownout window that will refuse some of `agent`'s v1 calls, opening after `now`:
/// none for an agent whose policy is not `allow`.
pub fn next_brownout_for(
    retirement: &RetirementConfig,
    agent: &Agent,
    now: SystemTime,
) -> Option<ScheduledWindow> {
    if agent.v1_policy != V1Policy::Allow {
        return None;
    }
    earliest(
        retirement
            .brownouts
            .iter()
            .filter(|b| applies_to(b, Some(agent)))
            .filter_map(|b| next_window(b, now)),
    )
}

/// The plan's next brownout window, whoever it applies to, opening after `now`.
pub fn next_brownout(retirement: &RetirementConfig, now: SystemTime) -> Option<ScheduledWindow> {
    earliest(
        retirement
            .brownouts
            .iter()
            .filter_map(|b| next_window(b, now)),
    )
}

/// Whether a v1 call by `agent` (None: no known agent) at `now` may go upstream. The policy
/// decides first; a call it lets through that asked for a `rehearsal` gets the sunset's
/// answer instead.
pub fn decide(
    retirement: &RetirementConfig,
    agent: Option<&Agent>,
    now: SystemTime,
    request_id: &str,
    rehearsal: bool,
) -> Result<(), V1Refusal> {
    policy(retirement, agent, now, request_id)?;
    if rehearsal {
        return Err(V1Refusal::Rehearsal);
    }
    Ok(())
}

/// The retirement policy alone: the agent's `v1_policy`, its sunset, the brownouts.
fn policy(
    retirement: &RetirementConfig,
    agent: Option<&Agent>,
    now: SystemTime,
    request_id: &str,
) -> Result<(), V1Refusal> {
    match agent.map_or(V1Policy::Allow, |a| a.v1_policy) {
        V1Policy::Exempt => return Ok(()),
        V1Policy::Block => return Err(V1Refusal::Blocked),
        V1Policy::Allow => {}
    }
    let sunset = retirement.terms_for(agent).dates.sunset_at;
    if retirement.enforce_sunset && sunset.is_some_and(|s| s <= now) {
        return Err(V1Refusal::Sunset);
    }
    for b in &retirement.brownouts {
        if !applies_to(b, agent) {
            continue;
        }
        if let Some(window) = window_at(b, now) {
            if bucket(request_id) < window.percent {
                return Err(V1Refusal::Brownout { until: window.end });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dates, Recurrence, Terms};
    use std::time::Duration;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    fn agent(id: &str, policy: V1Policy) -> Agent {
        Agent {
            id: id.into(),
            tokens: Vec::new(),
            default_service: None,
            services: None,
            v1_policy: policy,
            rate_limit: None,
            dates: Dates::default(),
        }
    }

    /// `decide` for a call that asks for no rehearsal.
    fn judge(
        r: &RetirementConfig,
        a: Option<&Agent>,
        now: SystemTime,
        id: &str,
    ) -> Result<(), V1Refusal> {
        decide(r, a, now, id, false)
    }

    #[test]
    fn nothing_configured_means_no_refusals() {
        let r = RetirementConfig::default();
        let a = agent("a", V1Policy::Allow);
        assert_eq!(judge(&r, Some(&a), SystemTime::now(), "x"), Ok(()));
    }

    #[test]
    fn policies() {
        let r = RetirementConfig::default();
        let now = SystemTime::now();
        assert_eq!(
            judge(&r, Some(&agent("a", V1Policy::Block)), now, "x"),
            Err(V1Refusal::Blocked)
        );
        assert_eq!(
            judge(&r, Some(&agent("a", V1Policy::Exempt)), now, "x"),
            Ok(())
        );
        assert_eq!(judge(&r, None, now, "x"), Ok(()));
    }

    #[test]
    fn a_rehearsal_gets_the_sunset_answer_unless_the_policy_refuses_first() {
        let r = RetirementConfig::default();
        let now = SystemTime::now();
        for a in [
            Some(agent("a", V1Policy::Allow)),
            Some(agent("e", V1Policy::Exempt)),
            None,
        ] {
            assert_eq!(
                decide(&r, a.as_ref(), now, "x", true),
                Err(V1Refusal::Rehearsal)
            );
        }
        // The real refusal wins: a blocked agent is counted as blocked.
        assert_eq!(
            decide(&r, Some(&agent("b", V1Policy::Block)), now, "x", true),
            Err(V1Refusal::Blocked)
        );
    }

    fn sunset(at_: &str) -> RetirementConfig {
        RetirementConfig {
            terms: Terms::new(
                Dates {
                    deprecated_at: None,
                    sunset_at: Some(at(at_)),
                },
                None,
            ),
            ..Default::default()
        }
    }

    #[test]
    fn sunset_is_enforced_only_when_asked_and_never_for_exempt_agents() {
        let mut r = sunset("2027-06-01T00:00:00Z");
        let before = at("2027-05-31T23:59:59Z");
        let after = at("2027-06-01T00:00:00Z");
        let plain = agent("a", V1Policy::Allow);
        assert_eq!(
            judge(&r, Some(&plain), after, "x"),
            Ok(()),
            "a clock alone cuts nothing off"
        );
        r.enforce_sunset = true;
        assert_eq!(judge(&r, Some(&plain), before, "x"), Ok(()));
        assert_eq!(judge(&r, Some(&plain), after, "x"), Err(V1Refusal::Sunset));
        assert_eq!(judge(&r, None, after, "x"), Err(V1Refusal::Sunset));
        assert_eq!(
            judge(&r, Some(&agent("e", V1Policy::Exempt)), after, "x"),
            Ok(())
        );
    }

    #[test]
    fn an_agent_is_cut_off_at_its_own_sunset_and_others_at_theirs() {
        let mut r = sunset("2027-06-01T00:00:00Z");
        r.enforce_sunset = true;
        let own = Dates {
            deprecated_at: None,
            sunset_at: Some(at("2027-01-01T00:00:00Z")),
        };
        r.agent_terms
            .insert("early".into(), Terms::new(own.or(r.terms.dates), None));
        let (early, other) = (
            agent("early", V1Policy::Allow),
            agent("other", V1Policy::Allow),
        );
        let between = at("2027-03-01T00:00:00Z");
        assert_eq!(
            judge(&r, Some(&early), between, "x"),
            Err(V1Refusal::Sunset)
        );
        assert_eq!(judge(&r, Some(&other), between, "x"), Ok(()));
        assert_eq!(
            judge(&r, Some(&early), at("2026-12-31T23:59:59Z"), "x"),
            Ok(())
        );
        let late = Dates {
            deprecated_at: None,
            sunset_at: Some(at("2028-01-01T00:00:00Z")),
        };
        r.agent_terms.insert("late".into(), Terms::new(late, None));
        let late_agent = agent("late", V1Policy::Allow);
        assert_eq!(
            judge(&r, Some(&late_agent), at("2027-07-01T00:00:00Z"), "x"),
            Ok(()),
            "a later date of its own keeps an agent going past the global sunset"
        );
    }

    fn once(start: &str, end: &str, percent: u8, percent_end: u8) -> Brownout {
        Brownout {
            start: at(start),
            end: at(end),
            percent,
            percent_end,
            repeat: None,
            agents: None,
        }
    }

    fn window(percent: u8, agents: Option<Vec<String>>) -> RetirementConfig {
        RetirementConfig {
            brownouts: vec![Brownout {
                agents,
                ..once(
                    "2026-12-01T10:00:00Z",
                    "2026-12-01T11:00:00Z",
                    percent,
                    percent,
                )
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_full_brownout_refuses_inside_its_window_only() {
        let r = window(100, None);
        let a = agent("a", V1Policy::Allow);
        let end = at("2026-12-01T11:00:00Z");
        assert_eq!(judge(&r, Some(&a), at("2026-12-01T09:59:59Z"), "x"), Ok(()));
        assert_eq!(
            judge(&r, Some(&a), at("2026-12-01T10:00:00Z"), "x"),
            Err(V1Refusal::Brownout { until: end })
        );
        assert_eq!(
            judge(&r, Some(&a), at("2026-12-01T10:59:59Z"), "y"),
            Err(V1Refusal::Brownout { until: end })
        );
        assert_eq!(
            judge(&r, Some(&a), end, "x"),
            Ok(()),
            "the end is exclusive"
        );
        assert_eq!(
            judge(
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
        assert!(judge(&r, Some(&agent("late", V1Policy::Allow)), t, "x").is_err());
        assert_eq!(
            judge(&r, Some(&agent("other", V1Policy::Allow)), t, "x"),
            Ok(())
        );
        assert_eq!(judge(&r, None, t, "x"), Ok(()));
    }

    #[test]
    fn a_percent_refuses_about_that_share_deterministically_by_request_id() {
        let a = agent("a", V1Policy::Allow);
        let t = at("2026-12-01T10:30:00Z");
        let ids: Vec<String> = (0..10_000).map(|i| format!("req-{i}")).collect();
        let mut previous = 0;
        for percent in [1u8, 10, 25, 50, 90, 100] {
            let r = window(percent, None);
            let refused = ids
                .iter()
                .filter(|id| judge(&r, Some(&a), t, id).is_err())
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
                    judge(&r, Some(&a), t, id),
                    judge(&r, Some(&a), t + Duration::from_secs(60), id)
                );
            }
        }
    }

    #[test]
    fn a_ramp_rises_in_a_straight_line_and_only_adds_refusals() {
        let b = once("2026-12-01T10:00:00Z", "2026-12-01T11:40:00Z", 10, 60);
        let share = |t: &str| window_at(&b, at(t)).map(|w| w.percent);
        assert_eq!(share("2026-12-01T09:59:59Z"), None);
        assert_eq!(share("2026-12-01T10:00:00Z"), Some(10));
        assert_eq!(share("2026-12-01T10:50:00Z"), Some(35));
        assert_eq!(share("2026-12-01T11:39:59Z"), Some(59));
        assert_eq!(share("2026-12-01T11:40:00Z"), None);
        let r = RetirementConfig {
            brownouts: vec![b],
            ..Default::default()
        };
        let a = agent("a", V1Policy::Allow);
        let ids: Vec<String> = (0..2_000).map(|i| format!("id-{i}")).collect();
        let mut refused_before: Vec<&String> = Vec::new();
        for minute in 0..100 {
            let t = at("2026-12-01T10:00:00Z") + Duration::from_secs(60 * minute);
            let refused: Vec<&String> = ids
                .iter()
                .filter(|id| judge(&r, Some(&a), t, id).is_err())
                .collect();
            assert!(
                refused_before.iter().all(|id| refused.contains(id)),
                "minute {minute}: an id refused earlier passed"
            );
            let expected = usize::from(window_at(&r.brownouts[0], t).unwrap().percent) * 20;
            assert!(refused.len().abs_diff(expected) <= 150, "minute {minute}");
            refused_before = refused;
        }
    }

    fn weekday_mornings() -> Brownout {
        // Every weekday 10:00-10:30 UTC, 10 % rising to 50 % by March.
        Brownout {
            repeat: Some(Recurrence {
                every: Duration::from_secs(86_400),
                until: at("2027-03-01T00:00:00Z"),
                days: Some(vec![
                    Weekday::Mon,
                    Weekday::Tue,
                    Weekday::Wed,
                    Weekday::Thu,
                    Weekday::Fri,
                ]),
            }),
            ..once("2026-12-01T10:00:00Z", "2026-12-01T10:30:00Z", 10, 50)
        }
    }

    #[test]
    fn a_recurring_window_opens_on_its_days_until_its_end_date() {
        let b = weekday_mornings();
        let open = |t: &str| window_at(&b, at(t));
        // Tuesday 1 December, the first window.
        assert_eq!(
            open("2026-12-01T10:00:00Z"),
            Some(Window {
                end: at("2026-12-01T10:30:00Z"),
                percent: 10
            })
        );
        assert_eq!(open("2026-12-01T10:30:00Z"), None);
        assert_eq!(open("2026-12-02T09:59:59Z"), None);
        assert_eq!(
            open("2026-12-02T10:15:00Z").map(|w| w.end),
            Some(at("2026-12-02T10:30:00Z"))
        );
        // Saturday and Sunday are spared; Monday is not.
        assert_eq!(open("2026-12-05T10:15:00Z"), None);
        assert_eq!(open("2026-12-06T10:15:00Z"), None);
        assert!(open("2026-12-07T10:15:00Z").is_some());
        // Halfway through the ramp (15 January 05:00) the share is 30 %.
        assert_eq!(open("2027-01-15T10:00:00Z").unwrap().percent, 30);
        // The last window is Friday 26 February's; nothing opens on or after 1 March.
        assert_eq!(open("2027-02-26T10:10:00Z").unwrap().percent, 48);
        assert_eq!(open("2027-03-01T10:10:00Z"), None);
        assert_eq!(open("2027-03-02T10:10:00Z"), None);
        // Before the first window nothing is open, at the same time of day or not.
        assert_eq!(open("2026-11-30T10:10:00Z"), None);
    }

    #[test]
    fn a_weekly_window_recurs_on_the_same_weekday() {
        let b = Brownout {
            repeat: Some(Recurrence {
                every: Duration::from_secs(7 * 86_400),
                until: at("2027-01-01T00:00:00Z"),
                days: None,
            }),
            ..once("2026-12-01T10:00:00Z", "2026-12-01T12:00:00Z", 100, 100)
        };
        assert!(window_at(&b, at("2026-12-08T11:00:00Z")).is_some());
        assert!(window_at(&b, at("2026-12-09T11:00:00Z")).is_none());
        assert!(window_at(&b, at("2026-12-29T11:59:59Z")).is_some());
        assert!(window_at(&b, at("2027-01-05T11:00:00Z")).is_none());
    }

    #[test]
    fn the_published_share_is_the_largest_open_window_for_allowed_agents_only() {
        let mut r = window(30, None);
        r.brownouts.push(Brownout {
            agents: Some(vec!["late".into()]),
            ..once("2026-12-01T10:00:00Z", "2026-12-01T12:00:00Z", 70, 70)
        });
        let t = at("2026-12-01T10:30:00Z");
        assert_eq!(brownout_percent(&r, &agent("late", V1Policy::Allow), t), 70);
        assert_eq!(brownout_percent(&r, &agent("a", V1Policy::Allow), t), 30);
        assert_eq!(brownout_percent(&r, &agent("a", V1Policy::Exempt), t), 0);
        assert_eq!(brownout_percent(&r, &agent("a", V1Policy::Block), t), 0);
        let after = at("2026-12-01T11:30:00Z");
        assert_eq!(brownout_percent(&r, &agent("a", V1Policy::Allow), after), 0);
        assert_eq!(
            brownout_percent(&r, &agent("late", V1Policy::Allow), after),
            70
        );
    }

    #[test]
    fn the_next_window_skips_the_open_one_and_the_days_off_and_ends_with_the_schedule() {
        let r = RetirementConfig {
            brownouts: vec![weekday_mornings()],
            ..Default::default()
        };
        let a = agent("a", V1Policy::Allow);
        let next = |t: &str| next_brownout_for(&r, &a, at(t));
        // Before the schedule: its first window, at its starting share.
        assert_eq!(
            next("2026-11-20T00:00:00Z"),
            Some(ScheduledWindow {
                start: at("2026-12-01T10:00:00Z"),
                end: at("2026-12-01T10:30:00Z"),
                percent: 10
            })
        );
        // During Tuesday's window, Wednesday's is next; on Friday evening, Monday's.
        let wednesday = next("2026-12-01T10:10:00Z").unwrap();
        assert_eq!(wednesday.start, at("2026-12-02T10:00:00Z"));
        assert_eq!(
            next("2026-12-04T18:00:00Z").unwrap().start,
            at("2026-12-07T10:00:00Z")
        );
        // Halfway up the ramp the next window opens at the share reached then.
        assert_eq!(next("2027-01-14T12:00:00Z").unwrap().percent, 30);
        // After Friday 26 February's window nothing is left.
        assert_eq!(next("2027-02-26T10:10:00Z"), None);
        // Blocked and exempt agents face no brownout.
        assert_eq!(
            next_brownout_for(&r, &agent("b", V1Policy::Block), at("2026-11-20T00:00:00Z")),
            None
        );
        assert_eq!(
            next_brownout(&r, at("2026-12-04T18:00:00Z")).unwrap().start,
            at("2026-12-07T10:00:00Z")
        );
    }

    #[test]
    fn an_agent_s_next_window_is_the_earliest_of_those_naming_it() {
        let r = RetirementConfig {
            brownouts: vec![
                once("2026-12-10T10:00:00Z", "2026-12-10T11:00:00Z", 20, 20),
                Brownout {
                    agents: Some(vec!["late".into()]),
                    ..once("2026-12-05T10:00:00Z", "2026-12-05T11:00:00Z", 90, 90)
                },
            ],
            ..Default::default()
        };
        let now = at("2026-12-01T00:00:00Z");
        let late = next_brownout_for(&r, &agent("late", V1Policy::Allow), now).unwrap();
        assert_eq!((late.start, late.percent), (at("2026-12-05T10:00:00Z"), 90));
        let other = next_brownout_for(&r, &agent("other", V1Policy::Allow), now).unwrap();
        assert_eq!(
            (other.start, other.percent),
            (at("2026-12-10T10:00:00Z"), 20)
        );
        assert_eq!(next_brownout(&r, now), Some(late));
        // A one-off window that has opened is no one's next.
        assert_eq!(next_brownout(&r, at("2026-12-10T10:00:00Z")), None);
    }
}
