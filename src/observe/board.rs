//! The retirement board's figures (`GET /` on the admin listener): per agent, the plan (its
//! policy, dates, brownout share now and in its next window) beside what happened (v1 and v2
//! calls, last v1 call, safe to block, rate-limit refusals), and above them the share of
//! traffic still on v1 and the plan's next dated events.
//!
//! [`board`] is a plain function over a snapshot, the time and [`Figures`]: a [`UsageReport`]
//! (this gateway's `/v1-usage`, or the fleet's as `v1-usage --prometheus` reads it, with the
//! same field names and the same caveats for `safe_to_block`) and the two figures the report
//! lacks. [`fleet_figures`] reads them from a Prometheus with the PromQL the shipped dashboard
//! runs ([`v1_share_query`], [`rate_limited_query`]; a test holds the dashboard to them). The
//! page itself is the admin listener's (`src/app/board.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::config::{SeriesSelector, Snapshot, V1Policy};
use crate::observe::fleet::{self, FleetError, Prometheus};
use crate::observe::usage::{format_time, AgentReport, UsageReport};
use crate::policy::retirement::{
    brownout_percent, next_brownout, next_brownout_for, ScheduledWindow,
};

/// How far back the board counts when it reads the fleet's figures: `v1-usage --prometheus`'s
/// default window.
pub const FLEET_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// The range over which "now" is measured from Prometheus.
pub const NOW_RANGE: &str = "5m";

/// The share of v1 among v1 and v2 requests over `range`, for the series `scope` selects
/// (label matchers, comma-separated; empty for every series): the dashboard's "Share of
/// traffic still on v1" with its template variables as `scope`.
pub fn v1_share_query(scope: &str, range: &str) -> String {
    let and = if scope.is_empty() { "" } else { "," };
    format!(
        "sum(rate(agent_gateway_requests_total{{api_version=\"v1\"{and}{scope}}}[{range}]))\n/\n\
         sum(rate(agent_gateway_requests_total{{api_version=~\"v1|v2\"{and}{scope}}}[{range}]))"
    )
}

/// Each agent's 429s for being over its rate limit over `range`, for the series `scope`
/// selects: the dashboard's "429s by agent in the time range".
pub fn rate_limited_query(scope: &str, range: &str) -> String {
    format!("sort_desc(sum by (agent_id) (increase(agent_gateway_rate_limited_total{{{scope}}}[{range}])))")
}

/// Where the board's counts come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// This gateway's own counts since it started.
    Gateway,
    /// Every replica a Prometheus scrapes that `selector` (PromQL, braces and all) selects,
    /// empty for every one, over `window`.
    Fleet {
        prometheus: String,
        selector: String,
        window_days: u64,
    },
    /// `retirement.prometheus_url` is set but could not be read: this gateway's counts instead.
    GatewayInstead { prometheus: String, error: String },
}

/// What happened, from this gateway or the fleet.
#[derive(Debug)]
pub struct Figures {
    pub usage: UsageReport,
    /// `agent_gateway_rate_limited_total` by agent, over the span of `usage`'s counts.
    pub rate_limited: BTreeMap<String, u64>,
    /// The share of v1 among v1 and v2 requests: over [`NOW_RANGE`] from Prometheus, since
    /// the start for one gateway; `None` without any.
    pub v1_share: Option<f64>,
    pub source: Source,
}

/// A brownout window on the board.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowRow {
    pub start: String,
    pub end: String,
    /// The share of v1 calls it refuses as it opens, 0 to 1.
    pub share: f64,
    /// How long until it opens ("in 3 d 4 h").
    pub opens_in: String,
}

/// A dated event of the plan and the agents it concerns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanEvent {
    pub at: String,
    pub in_: String,
    pub agents: Vec<String>,
}

/// One agent: `/v1-usage`'s entry, and what the plan does to it next.
#[derive(Debug, Serialize)]
pub struct AgentRow {
    #[serde(flatten)]
    pub usage: AgentReport,
    /// Configured on this gateway (a fleet's report also lists agents only seen in Prometheus).
    pub configured: bool,
    /// The share of its v1 calls the brownout schedule refuses now, 0 to 1.
    pub brownout_share: f64,
    pub next_brownout: Option<WindowRow>,
    pub rate_limited: u64,
}

impl AgentRow {
    pub fn v1_total(&self) -> u64 {
        self.usage.v1_requests.values().sum()
    }

    pub fn v2_total(&self) -> u64 {
        self.usage.v2_requests.values().sum()
    }
}

/// The whole board.
#[derive(Debug, Serialize)]
pub struct Board {
    pub generated_at: String,
    pub source: Source,
    /// What the counts cover, in words.
    pub shown: String,
    pub v1_share: Option<f64>,
    /// The span `v1_share` is measured over, in words ("since this gateway started").
    pub v1_share_over: String,
    pub next_brownout: Option<PlanEvent>,
    /// The share the next brownout refuses as it opens, 0 to 1.
    pub next_brownout_share: Option<f64>,
    pub next_sunset: Option<PlanEvent>,
    pub quiet_days: u32,
    /// Why nobody is called safe to block yet, as `/v1-usage` says it.
    pub coverage_note: Option<String>,
    pub agents: Vec<AgentRow>,
}

/// A span as a person reads it on a board: the two largest units ("3 d 4 h", "12 min").
pub fn span_text(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, minutes) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{s} s"),
        (0, 0, m) => format!("{m} min"),
        (0, h, m) => format!("{h} h {m} min"),
        (d, h, _) => format!("{d} d {h} h"),
    }
}

fn opens_in(now: SystemTime, at: SystemTime) -> String {
    format!(
        "in {}",
        span_text(at.duration_since(now).unwrap_or_default())
    )
}

fn window_row(w: ScheduledWindow, now: SystemTime) -> WindowRow {
    WindowRow {
        start: format_time(w.start),
        end: format_time(w.end),
        share: f64::from(w.percent) / 100.0,
        opens_in: opens_in(now, w.start),
    }
}

/// The board of `snapshot`'s plan and `figures` at `now`.
pub fn board(snapshot: &Snapshot, figures: Figures, now: SystemTime) -> Board {
    let retirement = &snapshot.retirement;
    let agents = &snapshot.auth.agents;
    let rows: Vec<AgentRow> = figures
        .usage
        .agents
        .into_iter()
        .map(|usage| {
            let agent = agents.get(&usage.agent_id);
            AgentRow {
                configured: agent.is_some(),
                brownout_share: agent.map_or(0.0, |a| {
                    f64::from(brownout_percent(retirement, a, now)) / 100.0
                }),
                next_brownout: agent
                    .and_then(|a| next_brownout_for(retirement, a, now))
                    .map(|w| window_row(w, now)),
                rate_limited: figures
                    .rate_limited
                    .get(&usage.agent_id)
                    .copied()
                    .unwrap_or(0),
                usage,
            }
        })
        .collect();

    let plan_brownout = next_brownout(retirement, now);
    let next_brownout = plan_brownout.map(|w| PlanEvent {
        at: format_time(w.start),
        in_: opens_in(now, w.start),
        agents: rows
            .iter()
            .filter(|r| r.next_brownout.as_ref().map(|n| &n.start) == Some(&format_time(w.start)))
            .map(|r| r.usage.agent_id.clone())
            .collect(),
    });
    // Sunsets still to come for agents they will stop: blocked agents are stopped already,
    // exempt ones never are.
    let mut sunsets: Vec<(SystemTime, &str)> = agents
        .values()
        .filter(|a| a.v1_policy == V1Policy::Allow)
        .filter_map(|a| {
            let sunset = retirement.terms_for(Some(a)).dates.sunset_at?;
            (sunset > now).then_some((sunset, a.id.as_str()))
        })
        .collect();
    sunsets.sort();
    let next_sunset = sunsets.first().map(|(first, _)| PlanEvent {
        at: format_time(*first),
        in_: opens_in(now, *first),
        agents: sunsets
            .iter()
            .filter(|(t, _)| t == first)
            .map(|(_, id)| (*id).to_owned())
            .collect(),
    });

    let (shown, v1_share_over) = match &figures.source {
        Source::Fleet {
            prometheus,
            selector,
            window_days,
        } => (
            format!(
                "the fleet: every replica {prometheus} scrapes{}, over the last {window_days} days",
                matching(selector)
            ),
            format!("over the last {NOW_RANGE}, fleet-wide"),
        ),
        Source::Gateway | Source::GatewayInstead { .. } => (
            format!(
                "this gateway alone, since it started ({})",
                figures.usage.observed_since
            ),
            "since this gateway started".to_owned(),
        ),
    };
    Board {
        generated_at: format_time(now),
        source: figures.source,
        shown,
        v1_share: figures.v1_share,
        v1_share_over,
        next_brownout_share: plan_brownout.map(|w| f64::from(w.percent) / 100.0),
        next_brownout,
        next_sunset,
        quiet_days: figures.usage.quiet_days,
        coverage_note: figures.usage.coverage_note,
        agents: rows,
    }
}

/// The share of v1 among `v1` and `v2` calls; `None` when there were none.
pub fn share(v1: u64, v2: u64) -> Option<f64> {
    let total = v1 + v2;
    (total > 0).then(|| v1 as f64 / total as f64)
}

/// ` that matches {selector}` for a fleet chosen by `selector`; nothing for every replica.
fn matching(selector: &str) -> String {
    match selector.is_empty() {
        true => String::new(),
        false => format!(" that matches {selector}"),
    }
}

/// The figures of the fleet `selector` selects, from `prom`: [`fleet::fleet_report`] over
/// [`FLEET_WINDOW`], the v1 share over [`NOW_RANGE`] and each agent's 429s over the window, as
/// the dashboard queries them with the selector's matchers as their scope.
pub async fn fleet_figures(
    prom: &mut impl Prometheus,
    prometheus: String,
    selector: &SeriesSelector,
) -> Result<Figures, FleetError> {
    let usage = fleet::fleet_report(prom, FLEET_WINDOW, selector).await?;
    let scope = selector.matchers();
    let share = fleet::instant(prom, &v1_share_query(&scope, NOW_RANGE)).await?;
    let window = format!("{}d", FLEET_WINDOW.as_secs() / 86_400);
    let limited = fleet::instant(prom, &rate_limited_query(&scope, &window)).await?;
    Ok(Figures {
        usage,
        rate_limited: limited
            .iter()
            .map(|s| {
                let id = s.labels.get("agent_id").cloned().unwrap_or_default();
                (id, s.value.round() as u64)
            })
            .collect(),
        v1_share: share.first().map(|s| s.value).filter(|v| v.is_finite()),
        source: Source::Fleet {
            prometheus,
            selector: selector.to_string(),
            window_days: FLEET_WINDOW.as_secs() / 86_400,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::{AgentFile, BrownoutFile};
    use crate::config::testing;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    /// A plan on 1 December 2026: "old" is allowed with a sunset in March, "early" with one
    /// in January, "gone" blocked, "vip" exempt; a weekday-morning brownout for everyone
    /// allowed, and a stronger one-off for "early" alone.
    fn plan() -> Snapshot {
        let mut f = testing::config();
        f.auth.agents = vec![
            AgentFile::new("early", testing::TOKEN),
            AgentFile {
                v1_policy: V1Policy::Block,
                ..AgentFile::new("gone", testing::TOKEN)
            },
            AgentFile::new("old", testing::TOKEN),
            AgentFile {
                v1_policy: V1Policy::Exempt,
                ..AgentFile::new("vip", testing::TOKEN)
            },
        ];
        f.agent_mut("early").sunset_at = Some("2027-01-15T00:00:00Z".into());
        f.retirement.sunset_at = Some("2027-03-01T00:00:00Z".into());
        f.retirement.brownouts = vec![
            BrownoutFile {
                percent: Some(10),
                percent_end: Some(50),
                repeat: Some(crate::config::Repeat::Daily),
                until: Some("2027-03-01T00:00:00Z".into()),
                ..BrownoutFile::new("2026-12-01T10:00:00Z", "2026-12-01T10:30:00Z")
            },
            BrownoutFile {
                percent: Some(80),
                agents: Some(vec!["early".into()]),
                ..BrownoutFile::new("2026-12-01T14:00:00Z", "2026-12-01T15:00:00Z")
            },
        ];
        f.snapshot()
    }

    fn report(agents: &[(&str, &str, u64, u64)]) -> UsageReport {
        UsageReport {
            observed_since: "2026-11-20T00:00:00Z".into(),
            quiet_days: 14,
            coverage_note: Some("this gateway's count covers 11.4 days".into()),
            agents: agents
                .iter()
                .map(|(id, policy, v1, v2)| AgentReport {
                    agent_id: (*id).into(),
                    v1_policy: (*policy).into(),
                    deprecated_at: None,
                    sunset_at: None,
                    v1_requests: [("verify_request".to_owned(), *v1)].into(),
                    v2_requests: [("verify_request".to_owned(), *v2)].into(),
                    first_v1_call: None,
                    last_v1_call: None,
                    safe_to_block: false,
                })
                .collect(),
        }
    }

    #[test]
    fn each_agent_gets_its_brownout_now_and_next_and_its_refusals() {
        let figures = Figures {
            usage: report(&[
                ("early", "allow", 5, 1),
                ("gone", "block", 2, 9),
                ("old", "allow", 30, 0),
                ("removed", "removed", 1, 0),
                ("vip", "exempt", 7, 7),
            ]),
            rate_limited: [("old".to_owned(), 4)].into(),
            v1_share: share(45, 17),
            source: Source::Gateway,
        };
        // Inside the first morning window.
        let b = board(&plan(), figures, at("2026-12-01T10:10:00Z"));
        let row = |id: &str| b.agents.iter().find(|r| r.usage.agent_id == id).unwrap();
        assert_eq!(row("old").brownout_share, 0.1);
        assert_eq!(row("old").rate_limited, 4);
        assert_eq!(row("old").v1_total(), 30);
        let next = row("old").next_brownout.clone().unwrap();
        assert_eq!(next.start, "2026-12-02T10:00:00Z");
        assert_eq!(next.opens_in, "in 23 h 50 min");
        // "early"'s own window opens first, at its own share.
        let early = row("early").next_brownout.clone().unwrap();
        assert_eq!(
            (early.start.as_str(), early.share),
            ("2026-12-01T14:00:00Z", 0.8)
        );
        // Blocked, exempt and unconfigured agents face no brownout.
        for id in ["gone", "vip", "removed"] {
            assert_eq!(row(id).brownout_share, 0.0, "{id}");
            assert_eq!(row(id).next_brownout, None, "{id}");
        }
        assert!(!row("removed").configured);
        // The plan's next events: early's window this afternoon, and early's sunset.
        let brownout = b.next_brownout.unwrap();
        assert_eq!(brownout.at, "2026-12-01T14:00:00Z");
        assert_eq!(brownout.agents, ["early"]);
        assert_eq!(b.next_brownout_share, Some(0.8));
        let sunset = b.next_sunset.unwrap();
        assert_eq!(
            (sunset.at.as_str(), sunset.agents.clone()),
            ("2027-01-15T00:00:00Z", vec!["early".to_owned()])
        );
        assert_eq!(b.v1_share, Some(45.0 / 62.0));
        assert_eq!(b.v1_share_over, "since this gateway started");
        assert_eq!(
            b.shown,
            "this gateway alone, since it started (2026-11-20T00:00:00Z)"
        );
        assert!(
            b.coverage_note.is_some(),
            "the caveat of /v1-usage goes along"
        );
    }

    #[test]
    fn after_the_last_window_and_sunset_nothing_is_next() {
        let figures = Figures {
            usage: report(&[("old", "allow", 0, 0)]),
            rate_limited: BTreeMap::new(),
            v1_share: share(0, 0),
            source: Source::Fleet {
                prometheus: "http://prom:9090".into(),
                selector: String::new(),
                window_days: 30,
            },
        };
        let b = board(&plan(), figures, at("2027-03-02T00:00:00Z"));
        assert_eq!(b.next_brownout, None);
        assert_eq!(b.next_sunset, None);
        assert_eq!(b.v1_share, None);
        assert_eq!(b.agents[0].next_brownout, None);
        assert_eq!(
            b.shown,
            "the fleet: every replica http://prom:9090 scrapes, over the last 30 days"
        );
        assert_eq!(b.v1_share_over, "over the last 5m, fleet-wide");
    }

    /// A Prometheus with no series, at 2027-01-15T00:00:00Z, that records what it was asked.
    #[derive(Default)]
    struct Empty {
        asked: Vec<String>,
    }

    impl Prometheus for Empty {
        async fn query(
            &mut self,
            promql: &str,
            _at: Option<SystemTime>,
        ) -> Result<Vec<u8>, FleetError> {
            self.asked.push(promql.to_owned());
            let result = match promql {
                "vector(time())" => r#"[{"metric":{},"value":[0,"1799884800"]}]"#,
                _ => "[]",
            };
            Ok(format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":{result}}}}}"#
            )
            .into_bytes())
        }
    }

    #[test]
    fn the_fleets_figures_are_those_of_the_selected_series_and_say_so() {
        let prod = SeriesSelector::parse(r#"job="agent-gateway",namespace="prod""#).unwrap();
        let mut prom = Empty::default();
        let figures =
            tokio_test::block_on(fleet_figures(&mut prom, "http://prom:9090".into(), &prod))
                .unwrap();
        assert!(prom.asked.len() > 2, "{:?}", prom.asked);
        for q in &prom.asked {
            assert_eq!(fleet::unrestricted(q, &prod), Vec::<&str>::new(), "{q}");
        }
        assert!(prom
            .asked
            .iter()
            .any(|q| q.starts_with("sum(rate(agent_gateway_requests_total")));
        assert!(prom.asked.iter().any(|q| q.starts_with("sort_desc(")));
        let b = board(&plan(), figures, at("2027-01-15T00:00:00Z"));
        assert_eq!(
            b.shown,
            "the fleet: every replica http://prom:9090 scrapes that matches \
             {job=\"agent-gateway\",namespace=\"prod\"}, over the last 30 days"
        );
    }

    #[test]
    fn spans_read_in_their_two_largest_units() {
        let text = |s: u64| span_text(Duration::from_secs(s));
        assert_eq!(text(42), "42 s");
        assert_eq!(text(600), "10 min");
        assert_eq!(text(3 * 3600 + 120), "3 h 2 min");
        assert_eq!(text(2 * 86_400 + 5 * 3600 + 59), "2 d 5 h");
    }

    #[test]
    fn the_queries_take_a_scope_or_none() {
        assert_eq!(
            v1_share_query("", "5m"),
            "sum(rate(agent_gateway_requests_total{api_version=\"v1\"}[5m]))\n/\n\
             sum(rate(agent_gateway_requests_total{api_version=~\"v1|v2\"}[5m]))"
        );
        assert_eq!(
            rate_limited_query("job=~\"$job\"", "$__range"),
            "sort_desc(sum by (agent_id) (increase(agent_gateway_rate_limited_total{job=~\"$job\"}[$__range])))"
        );
    }
}
