//! Who still calls v1: per-agent request counts since start, first and last v1 call, and the
//! report `/v1-usage` answers with (`v1-usage --prometheus` builds the same report for a whole
//! fleet, [`super::fleet`]).
//!
//! Counting is lock-free on the request path (a read lock to find the agent's counters, then
//! atomics); only an agent's first request takes the write lock. Only configured agents are
//! tracked, so memory is bounded by the config.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::api::operation::{ApiVersion, Operation};
use crate::config::unix_seconds;
use crate::config::{Snapshot, V1Policy};

/// One agent's usage since the gateway started.
#[derive(Default)]
pub struct AgentUsage {
    /// `[version][operation]`, in the order of [`ApiVersion::ALL`] and [`Operation::ALL`].
    counts: [[AtomicU64; Operation::COUNT]; ApiVersion::COUNT],
    /// Unix seconds; 0 means never.
    first_v1: AtomicU64,
    last_v1: AtomicU64,
}

/// Usage of every configured agent since the gateway started.
pub struct UsageTracker {
    started: SystemTime,
    agents: RwLock<HashMap<String, Arc<AgentUsage>>>,
}

impl Default for UsageTracker {
    fn default() -> Self {
        Self {
            started: SystemTime::now(),
            agents: RwLock::new(HashMap::new()),
        }
    }
}

/// `/v1-usage`: one entry per configured agent.
#[derive(Debug, Serialize, Deserialize)]
pub struct UsageReport {
    /// Counting started here (the gateway's start); nothing earlier is known.
    pub observed_since: String,
    pub quiet_days: u32,
    /// What the report could not know: why no agent can be called safe to block yet (the
    /// data covers less than `quiet_days`). `None` when it covers them.
    #[serde(default)]
    pub coverage_note: Option<String>,
    pub agents: Vec<AgentReport>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct AgentReport {
    pub agent_id: String,
    pub v1_policy: String,
    /// The dates that apply to this agent (its own, else `[retirement]`'s), RFC 3339.
    #[serde(default)]
    pub deprecated_at: Option<String>,
    #[serde(default)]
    pub sunset_at: Option<String>,
    /// Requests by operation name.
    pub v1_requests: BTreeMap<String, u64>,
    pub v2_requests: BTreeMap<String, u64>,
    pub first_v1_call: Option<String>,
    pub last_v1_call: Option<String>,
    /// No v1 call for `quiet_days`, and the gateway has watched at least that long.
    pub safe_to_block: bool,
}

fn rfc3339(secs: u64) -> Option<String> {
    (secs > 0).then(|| format_time(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)))
}

pub use crate::config::format_time;

/// `quiet_days` as a duration.
pub fn quiet_period(quiet_days: u32) -> Duration {
    Duration::from_secs(u64::from(quiet_days) * 86_400)
}

/// Whether an agent on `v1_policy` whose last v1 call was `last_v1` (None: none seen) is safe
/// to block at `now`: it is still allowed v1 (one blocked already, or exempt by choice, is not
/// for blocking), and has made no v1 call for `quiet`, in data that covers at least that long
/// (from `known_since`). A wrong "yes" blocks a live client, so anything not known counts
/// against it.
pub fn safe_to_block(
    v1_policy: &str,
    now: SystemTime,
    quiet: Duration,
    known_since: SystemTime,
    last_v1: Option<SystemTime>,
) -> bool {
    let covered = now.duration_since(known_since).unwrap_or_default() >= quiet;
    let quiet_since = now.checked_sub(quiet).unwrap_or(SystemTime::UNIX_EPOCH);
    v1_policy == V1Policy::Allow.as_str()
        && covered
        && last_v1.is_none_or(|last| last < quiet_since)
}

/// Why nobody is safe to block when the data, from `known_since` (`what` says whose), covers
/// less than `quiet_days` at `now`; `None` when it covers them.
pub fn coverage_note(
    now: SystemTime,
    quiet_days: u32,
    known_since: SystemTime,
    what: &str,
) -> Option<String> {
    let covered = now.duration_since(known_since).unwrap_or_default();
    (covered < quiet_period(quiet_days)).then(|| {
        format!(
            "{what} covers {:.1} days (since {}), fewer than quiet_days = {quiet_days}: a v1 call \
             before that is not known, so no agent is called safe to block",
            covered.as_secs_f64() / 86_400.0,
            format_time(known_since),
        )
    })
}

impl UsageTracker {
    /// When counting started: the gateway's start.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// Counts one request of a configured agent at `now`; true when it is the agent's first
    /// v1 call since the gateway started.
    pub fn record(
        &self,
        agent_id: &str,
        version: ApiVersion,
        operation: Operation,
        now: SystemTime,
    ) -> bool {
        self.agent(agent_id).record(version, operation, now)
    }

    /// The usage of the configured agent `agent_id`, to count into without looking it up
    /// again.
    pub fn agent(&self, agent_id: &str) -> Arc<AgentUsage> {
        super::with_entry(&self.agents, agent_id, AgentUsage::default, Arc::clone)
    }

    /// The report for every agent of `snapshot`, judged at `now`.
    pub fn report(&self, snapshot: &Snapshot, now: SystemTime) -> UsageReport {
        let quiet_days = snapshot.retirement.quiet_days;
        let quiet = quiet_period(quiet_days);
        let agents = self.agents.read().unwrap_or_else(|e| e.into_inner());
        let mut ids: Vec<&String> = snapshot.auth.agents.keys().collect();
        ids.sort();
        let reports = ids
            .into_iter()
            .map(|id| {
                let agent = &snapshot.auth.agents[id];
                let empty = AgentUsage::default();
                let usage = agents.get(id).map_or(&empty, |u| u.as_ref());
                let by_op = |v: usize| {
                    Operation::ALL
                        .iter()
                        .map(|op| {
                            (
                                op.as_str().to_owned(),
                                usage.counts[v][*op as usize].load(Ordering::Relaxed),
                            )
                        })
                        .collect()
                };
                let last = usage.last_v1.load(Ordering::Relaxed);
                let last_v1 =
                    (last > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_secs(last));
                let dates = snapshot.retirement.terms_for(Some(agent)).dates;
                AgentReport {
                    agent_id: id.clone(),
                    v1_policy: agent.v1_policy.as_str().to_owned(),
                    deprecated_at: dates.deprecated_at.map(format_time),
                    sunset_at: dates.sunset_at.map(format_time),
                    v1_requests: by_op(ApiVersion::V1 as usize),
                    v2_requests: by_op(ApiVersion::V2 as usize),
                    first_v1_call: rfc3339(usage.first_v1.load(Ordering::Relaxed)),
                    last_v1_call: rfc3339(last),
                    safe_to_block: safe_to_block(
                        agent.v1_policy.as_str(),
                        now,
                        quiet,
                        self.started,
                        last_v1,
                    ),
                }
            })
            .collect();
        UsageReport {
            observed_since: format_time(self.started),
            quiet_days,
            coverage_note: coverage_note(now, quiet_days, self.started, "this gateway's count"),
            agents: reports,
        }
    }
}

impl AgentUsage {
    /// Counts one request at `now`; true when it is the agent's first v1 call since the
    /// gateway started.
    pub fn record(&self, version: ApiVersion, operation: Operation, now: SystemTime) -> bool {
        self.counts[version as usize][operation as usize].fetch_add(1, Ordering::Relaxed);
        if version != ApiVersion::V1 {
            return false;
        }
        let secs = unix_seconds(now);
        // Each changes at most once a second, the first only once: a load before each, so
        // that a call that changes neither takes no locked read-modify-write.
        if self.last_v1.load(Ordering::Relaxed) < secs {
            self.last_v1.fetch_max(secs, Ordering::Relaxed);
        }
        self.first_v1.load(Ordering::Relaxed) == 0
            && self
                .first_v1
                .compare_exchange(0, secs, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

impl UsageReport {
    /// The report as a table for a person at a terminal.
    pub fn to_table(&self) -> String {
        let mut rows = vec![[
            "AGENT".to_owned(),
            "POLICY".to_owned(),
            "V1 CALLS".to_owned(),
            "V2 CALLS".to_owned(),
            "LAST V1 CALL".to_owned(),
            "SAFE TO BLOCK".to_owned(),
            "SUNSET".to_owned(),
        ]];
        for a in &self.agents {
            rows.push([
                a.agent_id.clone(),
                a.v1_policy.clone(),
                a.v1_requests.values().sum::<u64>().to_string(),
                a.v2_requests.values().sum::<u64>().to_string(),
                a.last_v1_call.clone().unwrap_or_else(|| "never".into()),
                if a.safe_to_block { "yes" } else { "no" }.to_owned(),
                a.sunset_at.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        let widths: Vec<usize> = (0..7)
            .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in &rows {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out.push_str(&format!(
            "\nobserved since {}; safe to block = no v1 call for {} days (and watched that long)\n",
            self.observed_since, self.quiet_days
        ));
        if let Some(note) = &self.coverage_note {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::AgentFile;
    use crate::config::{testing, V1Policy};

    /// Agents "a" and "b" (exempt from the retirement policy), and no other.
    fn snapshot(quiet_days: u32) -> Snapshot {
        let mut f = testing::config();
        f.retirement.quiet_days = quiet_days;
        let mut b = AgentFile::new("b", testing::TOKEN);
        b.v1_policy = V1Policy::Exempt;
        f.auth.agents = vec![AgentFile::new("a", testing::TOKEN), b];
        f.snapshot()
    }

    #[test]
    fn counts_and_first_last_v1_calls() {
        let u = UsageTracker::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        u.record("a", ApiVersion::V1, Operation::VerifyRequest, t0);
        u.record(
            "a",
            ApiVersion::V1,
            Operation::VerifyRequest,
            t0 + Duration::from_secs(60),
        );
        u.record(
            "a",
            ApiVersion::V2,
            Operation::CredentialOffer,
            t0 + Duration::from_secs(90),
        );
        let r = u.report(&snapshot(14), t0 + Duration::from_secs(120));
        let a = &r.agents[0];
        assert_eq!(a.agent_id, "a");
        assert_eq!(a.v1_requests["verify_request"], 2);
        assert_eq!(a.v2_requests["credential_offer"], 1);
        assert_eq!(a.first_v1_call.as_deref(), Some("2027-01-15T08:00:00Z"));
        assert_eq!(a.last_v1_call.as_deref(), Some("2027-01-15T08:01:00Z"));
        assert_eq!(r.agents[1].v1_policy, "exempt");
        assert_eq!(r.agents[1].v1_requests["verify_request"], 0);
        let table = r.to_table();
        assert!(table.starts_with("AGENT  POLICY"), "{table}");
        assert!(
            table.contains("a      allow   2         1         2027-01-15T08:01:00Z  no"),
            "{table}"
        );
        assert!(
            table.contains("b      exempt  0         0         never"),
            "{table}"
        );
    }

    #[test]
    fn safe_to_block_needs_a_quiet_period_the_gateway_watched() {
        let u = UsageTracker::default();
        let day = Duration::from_secs(86_400);
        let now = SystemTime::now();
        // Not watched for 14 days yet: nobody is known to be quiet.
        assert!(!u.report(&snapshot(14), now).agents[0].safe_to_block);
        // On day 15 "a" (never called) is quiet; "b" is exempt, never for blocking.
        let r = u.report(&snapshot(14), now + 15 * day);
        assert!(r.agents[0].safe_to_block);
        assert!(!r.agents[1].safe_to_block);
        // "a" calls v1 on day 20: not quiet on day 30, quiet again by day 35.
        u.record(
            "a",
            ApiVersion::V1,
            Operation::VerifyResponse,
            now + 20 * day,
        );
        assert!(!u.report(&snapshot(14), now + 30 * day).agents[0].safe_to_block);
        assert!(u.report(&snapshot(14), now + 35 * day).agents[0].safe_to_block);
    }
}
