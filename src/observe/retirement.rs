//! The retirement plan as metrics: each configured agent's v1 policy, its dates and the
//! brownout share it is under, and `quiet_days`. Counters say what happened; these say what
//! was meant to, so fleet-wide alert rules and `v1-usage --prometheus` can join the two by
//! `agent_id` across every replica.
//!
//! They follow the config and the clock, not requests, so [`RetirementMetrics::publish`] sets
//! them from the current snapshot at each scrape (the admin listener calls it before encoding
//! `/metrics`); an agent removed by a reload disappears at the next scrape.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::SystemTime;

use prometheus::{Gauge, GaugeVec, Opts, Registry};

use crate::config::Snapshot;
use crate::policy::retirement::brownout_percent;

/// Seconds since the Unix epoch, with fractions, as Prometheus timestamps are written.
fn unix_f64(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The label sets one publication set, so the next can remove the ones no longer true.
#[derive(Default)]
struct Published {
    info: BTreeSet<(String, &'static str)>,
    deprecation: BTreeSet<String>,
    sunset: BTreeSet<String>,
    share: BTreeSet<String>,
}

/// The gauges of the retirement plan.
pub struct RetirementMetrics {
    info: GaugeVec,
    deprecation: GaugeVec,
    sunset: GaugeVec,
    brownout_share: GaugeVec,
    quiet_days: Gauge,
    /// Also makes concurrent scrapes publish one after the other.
    published: Mutex<Published>,
}

impl RetirementMetrics {
    /// Creates and registers the gauges in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let info = GaugeVec::new(
            Opts::new(
                "agent_gateway_agent_info",
                "Always 1 for each configured agent; v1_policy is its policy (allow, block, exempt).",
            ),
            &["agent_id", "v1_policy"],
        )?;
        let deprecation = GaugeVec::new(
            Opts::new(
                "agent_gateway_agent_deprecation_timestamp_seconds",
                "Unix time of the Deprecation date each agent's v1 answers carry (its own, else retirement.deprecated_at).",
            ),
            &["agent_id"],
        )?;
        let sunset = GaugeVec::new(
            Opts::new(
                "agent_gateway_agent_sunset_timestamp_seconds",
                "Unix time of the Sunset date each agent's v1 answers carry (its own, else retirement.sunset_at).",
            ),
            &["agent_id"],
        )?;
        let brownout_share = GaugeVec::new(
            Opts::new(
                "agent_gateway_v1_brownout_share",
                "Share (0 to 1) of each agent's v1 calls the brownout schedule refuses now.",
            ),
            &["agent_id"],
        )?;
        let quiet_days = Gauge::new(
            "agent_gateway_retirement_quiet_days",
            "retirement.quiet_days: days without a v1 call after which an agent is safe to block.",
        )?;
        registry.register(Box::new(info.clone()))?;
        registry.register(Box::new(deprecation.clone()))?;
        registry.register(Box::new(sunset.clone()))?;
        registry.register(Box::new(brownout_share.clone()))?;
        registry.register(Box::new(quiet_days.clone()))?;
        Ok(Self {
            info,
            deprecation,
            sunset,
            brownout_share,
            quiet_days,
            published: Mutex::new(Published::default()),
        })
    }

    /// Sets every gauge from `snapshot` as of `now`, and removes the series of agents, policies
    /// and dates it no longer has.
    pub fn publish(&self, snapshot: &Snapshot, now: SystemTime) {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = Published::default();
        let retirement = &snapshot.retirement;
        for (id, agent) in &snapshot.auth.agents {
            let policy = agent.v1_policy.as_str();
            self.info.with_label_values(&[id, policy]).set(1.0);
            next.info.insert((id.clone(), policy));
            let dates = retirement.terms_for(Some(agent)).dates;
            if let Some(t) = dates.deprecated_at {
                self.deprecation.with_label_values(&[id]).set(unix_f64(t));
                next.deprecation.insert(id.clone());
            }
            if let Some(t) = dates.sunset_at {
                self.sunset.with_label_values(&[id]).set(unix_f64(t));
                next.sunset.insert(id.clone());
            }
            let share = f64::from(brownout_percent(retirement, agent, now)) / 100.0;
            self.brownout_share.with_label_values(&[id]).set(share);
            next.share.insert(id.clone());
        }
        self.quiet_days.set(f64::from(retirement.quiet_days));
        // Every field, without `..`: a new kind of series does not compile until its stale
        // label sets are removed.
        let Published {
            info,
            deprecation,
            sunset,
            share,
        } = &*published;
        for (id, policy) in info.difference(&next.info) {
            let _ = self.info.remove_label_values(&[id.as_str(), policy]);
        }
        for (gauge, before, now) in [
            (&self.deprecation, deprecation, &next.deprecation),
            (&self.sunset, sunset, &next.sunset),
            (&self.brownout_share, share, &next.share),
        ] {
            for id in before.difference(now) {
                let _ = gauge.remove_label_values(&[id]);
            }
        }
        *published = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::{AgentFile, BrownoutFile};
    use crate::config::testing::{self, AGENT_ID, TOKEN};
    use crate::config::V1Policy;
    use prometheus::{Encoder, TextEncoder};

    fn exposition(registry: &Registry) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn the_plan_follows_the_config_and_the_clock() {
        let registry = Registry::new();
        let m = RetirementMetrics::register(&registry).unwrap();
        let mut f = testing::config();
        f.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
        f.retirement.quiet_days = 21;
        f.auth.agents.push(AgentFile {
            v1_policy: V1Policy::Block,
            deprecated_at: Some("2026-06-01T00:00:00Z".into()),
            ..AgentFile::new("old", TOKEN)
        });
        f.retirement.brownouts.push(BrownoutFile {
            percent: Some(20),
            percent_end: Some(60),
            ..BrownoutFile::new("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")
        });
        m.publish(&f.clone().snapshot(), at("2026-12-01T10:30:00Z"));
        let text = exposition(&registry);
        for line in [
            "agent_gateway_agent_info{agent_id=\"agent-1\",v1_policy=\"allow\"} 1",
            "agent_gateway_agent_info{agent_id=\"old\",v1_policy=\"block\"} 1",
            "agent_gateway_agent_sunset_timestamp_seconds{agent_id=\"agent-1\"} 1811808000",
            "agent_gateway_agent_sunset_timestamp_seconds{agent_id=\"old\"} 1811808000",
            "agent_gateway_agent_deprecation_timestamp_seconds{agent_id=\"old\"} 1780272000",
            "agent_gateway_v1_brownout_share{agent_id=\"agent-1\"} 0.4",
            "agent_gateway_v1_brownout_share{agent_id=\"old\"} 0",
            "agent_gateway_retirement_quiet_days 21",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("deprecation_timestamp_seconds{agent_id=\"agent-1\"}"));

        // A reload: agent-1 is blocked, "old" is gone; the window has closed.
        f.auth.agents.pop();
        f.agent_mut(AGENT_ID).v1_policy = V1Policy::Block;
        m.publish(&f.snapshot(), at("2026-12-01T11:00:00Z"));
        let text = exposition(&registry);
        assert!(
            text.contains("agent_gateway_agent_info{agent_id=\"agent-1\",v1_policy=\"block\"} 1")
        );
        assert!(text.contains("agent_gateway_v1_brownout_share{agent_id=\"agent-1\"} 0"));
        for gone in ["v1_policy=\"allow\"", "agent_id=\"old\""] {
            assert!(!text.contains(gone), "{gone} still in\n{text}");
        }
    }
}
