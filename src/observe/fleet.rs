//! Who still calls v1 across a whole fleet, from a Prometheus that scrapes every replica: the
//! same [`UsageReport`] as `/v1-usage`, summed over replicas and across restarts, so a
//! replica's restart loses nothing Prometheus scraped.
//!
//! The fleet is every replica of `agent_gateway_build_info` that a [`SeriesSelector`] selects
//! (`retirement.prometheus_selector`, `v1-usage --prometheus-selector`; none: every one), and
//! every metric each query names is restricted to the same series, so a Prometheus that also
//! scrapes another deployment (staging beside prod) reports this one alone.
//!
//! [`fleet_report`] asks its [`Prometheus`] a few instant queries and builds the report from
//! the answers; the HTTP is [`crate::observe::prometheus`]'s, so the queries and the report
//! are tested here against a scripted Prometheus, and against a real one in
//! `tests/prometheus_e2e.rs`.
//!
//! Counts are exact where Prometheus holds them. `increase()` extrapolates to the ends of its
//! range, so each replica's counters are read over a range that ends at that replica's own
//! last scrape (`@`), which leaves nothing to extrapolate at the end; `increase()` adds back a
//! restart's counter reset. It counts from a series' first sample, so for a replica that
//! started inside the window (`agent_gateway_start_time_seconds`) the values of its first
//! scrape are added: the calls it served before Prometheus first saw it. Not in Prometheus at
//! all: calls a replica served after its last scrape, and calls a restarted replica served
//! before its first scrape when its counter had not dropped below the last value scraped.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::api::operation::{ApiVersion, Operation};
use crate::config::{SeriesSelector, DEFAULT_QUIET_DAYS, UNKNOWN_AGENT};
use crate::observe::usage::{
    coverage_note, format_time, quiet_period, safe_to_block, AgentReport, UsageReport,
};

/// Why the fleet's report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("cannot query Prometheus: {0}")]
    Fetch(String),
    #[error("Prometheus refused `{query}`: {message}")]
    Refused { query: String, message: String },
    #[error(
        "Prometheus answered `{query}` with something that is not an instant vector: {reason}"
    )]
    BadAnswer { query: String, reason: String },
}

/// One series of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// A Prometheus server's HTTP API, as far as the report needs it.
pub trait Prometheus {
    /// The answer body of `GET /api/v1/query?query=promql[&time=at]` (Prometheus answers JSON
    /// on errors too), whatever its status.
    fn query(
        &mut self,
        promql: &str,
        at: Option<SystemTime>,
    ) -> impl Future<Output = Result<Vec<u8>, FleetError>> + Send;
}

/// The `/api/v1/query` answer.
#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<AnswerData>,
}

#[derive(Deserialize)]
struct AnswerData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<VectorSample>,
}

#[derive(Deserialize)]
struct VectorSample {
    metric: BTreeMap<String, String>,
    /// `[unix seconds, "value"]`.
    value: (f64, String),
}

/// Runs `promql` at `at` and reads its instant vector.
async fn vector(
    prom: &mut impl Prometheus,
    promql: &str,
    at: Option<SystemTime>,
) -> Result<Vec<Sample>, FleetError> {
    let body = prom.query(promql, at).await?;
    let bad = |reason: String| FleetError::BadAnswer {
        query: promql.to_owned(),
        reason,
    };
    let answer: Answer = serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
    if answer.status != "success" {
        return Err(FleetError::Refused {
            query: promql.to_owned(),
            message: answer.error.unwrap_or(answer.status),
        });
    }
    let data = answer.data.ok_or_else(|| bad("no data".into()))?;
    if data.result_type != "vector" {
        return Err(bad(format!("a {}", data.result_type)));
    }
    data.result
        .into_iter()
        .map(|s| {
            let value = s.value.1.parse().map_err(|_| bad(s.value.1.clone()))?;
            Ok(Sample {
                labels: s.metric,
                value,
            })
        })
        .collect()
}

/// The instant vector `promql` yields at Prometheus' present.
pub async fn instant(prom: &mut impl Prometheus, promql: &str) -> Result<Vec<Sample>, FleetError> {
    vector(prom, promql, None).await
}

/// A time as a PromQL `@` or query time: Unix seconds with milliseconds.
fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn time_at(seconds: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(seconds.max(0.0))
}

/// A duration as a PromQL range, in whole milliseconds (at least 1).
fn range(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// The resolution of the subqueries that find each replica's first and last scrape: fine
/// enough to see every scrape (Prometheus looks back 5 minutes from each step), coarse enough
/// to stay cheap over a long window.
fn step(window: Duration) -> Duration {
    (window / 10_000).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// How far before the window a replica's first scrape is looked for, so that one scraped
/// since before the window is not taken for one that started inside it.
const BEFORE_WINDOW: Duration = Duration::from_secs(600);

/// The series that say a replica is there.
const BUILD_INFO: &str = "agent_gateway_build_info";

/// Every replica's latest scrape in the window, by its `job` and `instance`: the instant query
/// finds the live ones exactly, the subquery the ones that have gone.
fn last_scrapes_query(window: Duration, fleet: &SeriesSelector) -> String {
    let build_info = fleet.select(BUILD_INFO);
    format!(
        "max by (job, instance) (timestamp({build_info})) or max by (job, instance) \
         (max_over_time(timestamp({build_info})[{}:{}]))",
        range(window),
        range(step(window))
    )
}

/// Every replica's first scrape in the window (and [`BEFORE_WINDOW`]), to a subquery step:
/// how far back Prometheus' data goes. The instant query stands in while a replica's data is
/// younger than one step. A step shows the latest scrape before it, so the first scrape is at
/// most a step and Prometheus' lookback before the time found ([`exact_first_scrapes_query`]).
fn first_scrapes_query(window: Duration, fleet: &SeriesSelector) -> String {
    let build_info = fleet.select(BUILD_INFO);
    format!(
        "min by (job, instance) (min_over_time(timestamp({build_info})[{}:{}]) or \
         timestamp({build_info}))",
        range(window + BEFORE_WINDOW),
        range(step(window))
    )
}

/// A replica as Prometheus knows it.
#[derive(Debug, Clone, PartialEq)]
struct Replica {
    job: String,
    instance: String,
    /// Its series: the fleet's selector, its `job` and its `instance`.
    series: SeriesSelector,
    first_scrape: SystemTime,
    last_scrape: SystemTime,
    /// It started inside the window: its counters went up from zero inside it.
    born: bool,
}

impl Replica {
    /// `metric`, restricted to this replica.
    fn select(&self, metric: &str) -> String {
        self.series.select(metric)
    }
}

/// Prometheus' lookback: how far before its time an instant selector finds a sample.
const LOOKBACK: Duration = Duration::from_secs(300);

/// The first scrape of each of `replicas` exactly, searched up to a step and the lookback
/// before the time [`first_scrapes_query`] found, and a second after it (the steps of a
/// subquery fall on whole seconds): a subquery with 1 s steps sees every scrape 1 s or more
/// apart, and each step the latest scrape before it.
fn exact_first_scrapes_query(replicas: &[&Replica], window: Duration) -> Option<String> {
    let searched = range(step(window) + LOOKBACK + Duration::from_secs(1));
    let parts: Vec<String> = replicas
        .iter()
        .map(|r| {
            format!(
                "min_over_time(timestamp({})[{searched}:1s] @ {:.3})",
                r.select(BUILD_INFO),
                unix_seconds(r.first_scrape + Duration::from_secs(1))
            )
        })
        .collect();
    (!parts.is_empty()).then(|| format!("min by (job, instance) ({})", parts.join(" or ")))
}

/// `f(replica)` for every replica, joined by `or` under `sum by (labels)`; `None` for none.
fn union(replicas: &[&Replica], labels: &str, f: impl Fn(&Replica) -> String) -> Option<String> {
    let parts: Vec<String> = replicas.iter().map(|r| f(r)).collect();
    (!parts.is_empty()).then(|| format!("sum by ({labels}) ({})", parts.join(" or ")))
}

/// The counter of every agent's calls by version and operation.
const REQUESTS: &str = "agent_gateway_agent_requests_total";
/// What the counts are summed by.
const COUNT_LABELS: &str = "agent_id, api_version, operation";

/// The calls counted between each replica's first and last scrape in the window, summed. Each
/// replica is read up to its own last scrape, and one that started inside the window from
/// its first (a millisecond before, as Prometheus 3 leaves a range's start out), so
/// `increase()` has nothing to extrapolate at either end. One running since before the
/// window is read from the window's start, as `increase()` always is.
fn increase_query(replicas: &[Replica], window_start: SystemTime) -> Option<String> {
    let live: Vec<&Replica> = replicas
        .iter()
        .filter(|r| r.last_scrape > window_start)
        .collect();
    union(&live, COUNT_LABELS, |r| {
        let start = match r.born {
            true => r.first_scrape - Duration::from_millis(1),
            false => window_start,
        };
        let span = r.last_scrape.duration_since(start).unwrap_or_default();
        format!(
            "increase({}[{}] @ {:.3})",
            r.select(REQUESTS),
            range(span),
            unix_seconds(r.last_scrape)
        )
    })
}

/// The start time of each of `replicas` as of its first scrape.
fn start_times_query(replicas: &[&Replica]) -> Option<String> {
    union(replicas, "job, instance", |r| {
        format!(
            "{} @ {:.3}",
            r.select("agent_gateway_start_time_seconds"),
            unix_seconds(r.first_scrape)
        )
    })
}

/// The calls each of `replicas` had served by its first scrape, summed.
fn first_scrape_query(replicas: &[&Replica]) -> Option<String> {
    union(replicas, COUNT_LABELS, |r| {
        format!(
            "{} @ {:.3}",
            r.select(REQUESTS),
            unix_seconds(r.first_scrape)
        )
    })
}

/// Queries at one instant: Prometheus' present as the report started, over the fleet's series.
struct Queries<'a, P> {
    prom: &'a mut P,
    at: SystemTime,
    fleet: &'a SeriesSelector,
}

impl<P: Prometheus> Queries<'_, P> {
    async fn ask(&mut self, promql: &str) -> Result<Vec<Sample>, FleetError> {
        vector(self.prom, promql, Some(self.at)).await
    }

    /// Asks `promql` if there is one; a query over no replica has an empty answer.
    async fn ask_if(&mut self, promql: Option<String>) -> Result<Vec<Sample>, FleetError> {
        match promql {
            Some(q) => self.ask(&q).await,
            None => Ok(Vec::new()),
        }
    }
}

/// The usage report of the fleet `fleet` selects, for the `window` up to Prometheus' present.
pub async fn fleet_report(
    prom: &mut impl Prometheus,
    window: Duration,
    fleet: &SeriesSelector,
) -> Result<UsageReport, FleetError> {
    // Prometheus' clock, not ours: a range ending "now" must end where its data does.
    let now = vector(prom, "vector(time())", None)
        .await?
        .first()
        .map(|s| time_at(s.value))
        .ok_or_else(|| FleetError::BadAnswer {
            query: "vector(time())".into(),
            reason: "an empty vector".into(),
        })?;
    let mut q = Queries {
        prom,
        at: now,
        fleet,
    };
    let window_start = now.checked_sub(window).unwrap_or(SystemTime::UNIX_EPOCH);
    let replicas = replicas(&mut q, window, window_start).await?;
    let mut counts = q.ask_if(increase_query(&replicas, window_start)).await?;
    // What a replica that started inside the window had counted, from zero, by its first
    // scrape: calls it served before Prometheus first saw it.
    let born: Vec<&Replica> = replicas.iter().filter(|r| r.born).collect();
    counts.extend(q.ask_if(first_scrape_query(&born)).await?);
    Ok(assemble(Answers {
        now,
        window_start,
        coverage: replicas.iter().map(|r| r.first_scrape).min(),
        latest_scrape: replicas.iter().map(|r| r.last_scrape).max(),
        counts,
        gauges: agent_gauges(&mut q, window).await?,
    }))
}

/// A sample's value as a time, by the `job` and `instance` of its replica.
fn by_replica(samples: Vec<Sample>) -> BTreeMap<(String, String), SystemTime> {
    samples
        .iter()
        .map(|s| {
            let key = (s.label("job").to_owned(), s.label("instance").to_owned());
            (key, time_at(s.value))
        })
        .collect()
}

/// Every replica scraped in the window: its first and last scrape, and whether it started
/// inside the window.
async fn replicas(
    q: &mut Queries<'_, impl Prometheus>,
    window: Duration,
    window_start: SystemTime,
) -> Result<Vec<Replica>, FleetError> {
    let fleet = q.fleet;
    let lasts = by_replica(q.ask(&last_scrapes_query(window, fleet)).await?);
    let firsts = by_replica(q.ask(&first_scrapes_query(window, fleet)).await?);
    let mut replicas: Vec<Replica> = lasts
        .into_iter()
        .map(|((job, instance), last_scrape)| Replica {
            first_scrape: firsts
                .get(&(job.clone(), instance.clone()))
                .copied()
                .unwrap_or(last_scrape),
            series: fleet
                .and_equal("job", &job)
                .and_equal("instance", &instance),
            job,
            instance,
            last_scrape,
            born: false,
        })
        .collect();
    // Replicas first scraped inside the window may have started inside it: their first scrape
    // to the second, and their start time then.
    let recent: Vec<&Replica> = replicas
        .iter()
        .filter(|r| r.first_scrape >= window_start)
        .collect();
    let exact = by_replica(q.ask_if(exact_first_scrapes_query(&recent, window)).await?);
    for r in &mut replicas {
        if let Some(t) = exact.get(&(r.job.clone(), r.instance.clone())) {
            r.first_scrape = *t;
        }
    }
    let recent: Vec<&Replica> = replicas
        .iter()
        .filter(|r| exact.contains_key(&(r.job.clone(), r.instance.clone())))
        .collect();
    let started = by_replica(q.ask_if(start_times_query(&recent)).await?);
    for r in &mut replicas {
        let key = (r.job.clone(), r.instance.clone());
        r.born = started.get(&key).is_some_and(|t| *t >= window_start);
    }
    Ok(replicas)
}

/// What the replicas published of each agent over the window: its first and last v1 call,
/// its policy, its dates; and `quiet_days`.
struct AgentGauges {
    first: Vec<Sample>,
    last: Vec<Sample>,
    /// When each (agent, policy) pair was last published.
    policies: Vec<Sample>,
    deprecations: Vec<Sample>,
    sunsets: Vec<Sample>,
    quiet_days: Option<u32>,
}

async fn agent_gauges(
    q: &mut Queries<'_, impl Prometheus>,
    window: Duration,
) -> Result<AgentGauges, FleetError> {
    let w = range(window);
    let fleet = q.fleet;
    let first = q
        .ask(&format!(
            "min by (agent_id) (min_over_time({}[{w}]))",
            fleet.select("agent_gateway_v1_first_seen_timestamp_seconds")
        ))
        .await?;
    let last = q
        .ask(&format!(
            "max by (agent_id) (max_over_time({}[{w}]))",
            fleet.select("agent_gateway_v1_last_seen_timestamp_seconds")
        ))
        .await?;
    let info = fleet.select("agent_gateway_agent_info");
    let policies = q
        .ask(&format!(
            "max by (agent_id, v1_policy) (timestamp({info})) or \
             max by (agent_id, v1_policy) (max_over_time(timestamp({info})[{w}:{}]))",
            range(step(window))
        ))
        .await?;
    let dates = |name: &str| {
        format!(
            "max by (agent_id) (last_over_time({}[{w}]))",
            fleet.select(name)
        )
    };
    let deprecations = q
        .ask(&dates("agent_gateway_agent_deprecation_timestamp_seconds"))
        .await?;
    let sunsets = q
        .ask(&dates("agent_gateway_agent_sunset_timestamp_seconds"))
        .await?;
    let quiet_days = q
        .ask(&format!(
            "max(last_over_time({}[{w}]))",
            fleet.select("agent_gateway_retirement_quiet_days")
        ))
        .await?;
    Ok(AgentGauges {
        first,
        last,
        policies,
        deprecations,
        sunsets,
        quiet_days: quiet_days.first().map(|s| s.value as u32),
    })
}

/// What Prometheus answered, read.
struct Answers {
    now: SystemTime,
    window_start: SystemTime,
    /// The earliest scrape in the window.
    coverage: Option<SystemTime>,
    /// The latest scrape of any replica.
    latest_scrape: Option<SystemTime>,
    counts: Vec<Sample>,
    gauges: AgentGauges,
}

/// The `v1_policy` of an agent no replica publishes any longer.
const REMOVED: &str = "removed";

/// How long after the fleet's latest scrape an agent's policy may have last been published
/// and still be current: Prometheus' lookback.
const STILL_CONFIGURED: Duration = Duration::from_secs(300);

/// A sample's value as a time, by its `agent_id`.
fn by_agent(samples: &[Sample]) -> BTreeMap<String, SystemTime> {
    samples
        .iter()
        .map(|s| (s.label("agent_id").to_owned(), time_at(s.value)))
        .collect()
}

/// The policy published last, per agent, and when.
fn latest_policies(samples: &[Sample]) -> BTreeMap<String, (f64, String)> {
    let mut policies: BTreeMap<String, (f64, String)> = BTreeMap::new();
    for s in samples {
        let (agent, policy) = (s.label("agent_id"), s.label("v1_policy"));
        let latest = policies
            .entry(agent.to_owned())
            .or_insert((s.value, policy.into()));
        if s.value > latest.0 {
            *latest = (s.value, policy.into());
        }
    }
    policies
}

/// `id`'s calls under `version`, by operation (every operation, 0 for none).
fn calls(counts: &[Sample], id: &str, version: ApiVersion) -> BTreeMap<String, u64> {
    Operation::ALL
        .iter()
        .map(|op| {
            let n: f64 = counts
                .iter()
                .filter(|s| {
                    s.label("agent_id") == id
                        && s.label("api_version") == version.as_str()
                        && s.label("operation") == op.as_str()
                })
                .map(|s| s.value)
                .sum();
            (op.as_str().to_owned(), n.round().max(0.0) as u64)
        })
        .collect()
}

fn assemble(a: Answers) -> UsageReport {
    let g = &a.gauges;
    let (first, last) = (by_agent(&g.first), by_agent(&g.last));
    let (deprecations, sunsets) = (by_agent(&g.deprecations), by_agent(&g.sunsets));
    let policies = latest_policies(&g.policies);
    let mut ids: BTreeSet<String> = policies.keys().cloned().collect();
    ids.extend(a.counts.iter().map(|s| s.label("agent_id").to_owned()));
    ids.extend(last.keys().cloned());
    // Callers that were not a configured agent are counted together, and are no one to block.
    ids.remove(UNKNOWN_AGENT);
    ids.remove("");

    let quiet_days = g.quiet_days.unwrap_or(DEFAULT_QUIET_DAYS);
    let known_since = a.coverage.map_or(a.now, |c| c.max(a.window_start));
    let agents = ids
        .into_iter()
        .map(|id| {
            let v1_policy = match (policies.get(&id), a.latest_scrape) {
                (Some((published, policy)), Some(latest))
                    if time_at(*published) + STILL_CONFIGURED >= latest =>
                {
                    policy.clone()
                }
                _ => REMOVED.to_owned(),
            };
            let last_v1 = last.get(&id).copied();
            AgentReport {
                safe_to_block: safe_to_block(
                    &v1_policy,
                    a.now,
                    quiet_period(quiet_days),
                    known_since,
                    last_v1,
                ),
                v1_policy,
                deprecated_at: deprecations.get(&id).map(|t| format_time(*t)),
                sunset_at: sunsets.get(&id).map(|t| format_time(*t)),
                v1_requests: calls(&a.counts, &id, ApiVersion::V1),
                v2_requests: calls(&a.counts, &id, ApiVersion::V2),
                first_v1_call: first.get(&id).map(|t| format_time(*t)),
                last_v1_call: last_v1.map(format_time),
                agent_id: id,
            }
        })
        .collect();
    UsageReport {
        observed_since: format_time(known_since),
        quiet_days,
        coverage_note: coverage_note(a.now, quiet_days, known_since, "Prometheus' data"),
        agents,
    }
}

/// The metrics `promql` names that are not restricted to `fleet`: the braces after each
/// `agent_gateway_*` name must hold `fleet`'s matchers, in their order, among others.
#[cfg(test)]
pub(crate) fn unrestricted<'q>(promql: &'q str, fleet: &SeriesSelector) -> Vec<&'q str> {
    let matchers = format!(",{},", fleet.matchers());
    promql
        .match_indices("agent_gateway_")
        .filter_map(|(start, _)| {
            let end = promql[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(promql.len(), |n| start + n);
            let braces = promql[end..]
                .strip_prefix('{')
                .and_then(|a| a.split_once('}'))
                .map(|(inside, _)| format!(",{inside},"));
            let restricted = braces.is_some_and(|b| b.contains(&matchers));
            (!restricted).then_some(&promql[start..end])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    fn secs(t: &str) -> f64 {
        unix_seconds(at(t))
    }

    use tokio_test::block_on;

    /// The report of every replica `prom` scrapes, over `window`.
    fn every_replica(prom: &mut Scripted, window: Duration) -> Result<UsageReport, FleetError> {
        block_on(fleet_report(prom, window, &SeriesSelector::default()))
    }

    type Labels<'a> = Vec<(&'a str, &'a str)>;

    /// A Prometheus that answers each query from a script, by the start of its text with
    /// `fleet`'s matchers taken out, and records what it was asked.
    struct Scripted {
        answers: Vec<(&'static str, String)>,
        asked: Vec<(String, Option<SystemTime>)>,
        fleet: SeriesSelector,
    }

    impl Scripted {
        /// The query asked that starts with `start`.
        fn asked(&self, start: &str) -> Option<&str> {
            self.asked
                .iter()
                .map(|(q, _)| q.as_str())
                .find(|q| q.starts_with(start))
        }
    }

    fn vector_json(samples: &[(Labels<'_>, f64)]) -> String {
        let result: Vec<serde_json::Value> = samples
            .iter()
            .map(|(labels, v)| {
                let metric: BTreeMap<&str, &str> = labels.iter().copied().collect();
                serde_json::json!({"metric": metric, "value": [0, v.to_string()]})
            })
            .collect();
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
            .to_string()
    }

    impl Prometheus for Scripted {
        async fn query(
            &mut self,
            promql: &str,
            at: Option<SystemTime>,
        ) -> Result<Vec<u8>, FleetError> {
            self.asked.push((promql.to_owned(), at));
            let matchers = self.fleet.matchers();
            let unscoped = match matchers.is_empty() {
                true => promql.to_owned(),
                false => promql
                    .replace(&format!("{{{matchers}}}"), "")
                    .replace(&format!("{{{matchers},"), "{"),
            };
            let answer = self
                .answers
                .iter()
                .find(|(start, _)| unscoped.starts_with(start))
                .map_or_else(|| vector_json(&[]), |(_, a)| a.clone());
            Ok(answer.into_bytes())
        }
    }

    fn replica(instance: &str) -> Labels<'_> {
        vec![("job", "gw"), ("instance", instance)]
    }

    fn agent(id: &str) -> Labels<'_> {
        vec![("agent_id", id)]
    }

    fn calls<'a>(id: &'a str, version: &'a str, operation: &'a str) -> Labels<'a> {
        vec![
            ("agent_id", id),
            ("api_version", version),
            ("operation", operation),
        ]
    }

    const LAST_SCRAPES: &str = "max by (job, instance) (timestamp";
    const FIRST_SCRAPES: &str =
        "min by (job, instance) (min_over_time(timestamp(agent_gateway_build_info)[";
    const EXACT_FIRST_SCRAPES: &str =
        "min by (job, instance) (min_over_time(timestamp(agent_gateway_build_info{";
    const INCREASE: &str = "sum by (agent_id, api_version, operation) (increase";
    const START_TIMES: &str = "sum by (job, instance) (agent_gateway_start_time_seconds";
    const AT_FIRST_SCRAPE: &str = "sum by (agent_id, api_version, operation) (agent_gateway";

    /// Prometheus' now is 2027-01-31T12:00:00Z, so a 30-day window starts on the 1st at noon.
    /// gw-a has been scraped since before the window; gw-b since the 10th, having started just
    /// before, and gone on the 20th; gw-c since the 12th, though it started in December.
    fn fleet() -> Scripted {
        Scripted {
            answers: vec![
                (
                    "vector(time())",
                    vector_json(&[(vec![], secs("2027-01-31T12:00:00Z"))]),
                ),
                (
                    LAST_SCRAPES,
                    vector_json(&[
                        (replica("gw-a:9090"), secs("2027-01-31T11:59:58.250Z")),
                        (replica("gw-b:9090"), secs("2027-01-20T10:00:00Z")),
                        (replica("gw-c:9090"), secs("2027-01-31T11:59:59Z")),
                    ]),
                ),
                (
                    FIRST_SCRAPES,
                    vector_json(&[
                        (replica("gw-a:9090"), secs("2027-01-01T11:55:00Z")),
                        (replica("gw-b:9090"), secs("2027-01-10T00:00:00Z")),
                        (replica("gw-c:9090"), secs("2027-01-12T00:00:00Z")),
                    ]),
                ),
                (
                    EXACT_FIRST_SCRAPES,
                    vector_json(&[
                        (replica("gw-b:9090"), secs("2027-01-09T23:59:59Z")),
                        (replica("gw-c:9090"), secs("2027-01-11T23:59:30Z")),
                    ]),
                ),
                (
                    INCREASE,
                    vector_json(&[
                        (calls("old", "v1", "verify_request"), 39.9999),
                        (calls("old", "v2", "credential_offer"), 3.0),
                        (calls("unknown", "v1", "verify_request"), 7.0),
                        (calls("quiet", "v1", "verify_request"), 0.0),
                    ]),
                ),
                (
                    START_TIMES,
                    vector_json(&[
                        (replica("gw-b:9090"), secs("2027-01-09T23:59:50Z")),
                        (replica("gw-c:9090"), secs("2026-12-01T00:00:00Z")),
                    ]),
                ),
                (
                    AT_FIRST_SCRAPE,
                    vector_json(&[(calls("old", "v1", "verify_request"), 2.0)]),
                ),
                (
                    "min by (agent_id) (min_over_time(agent_gateway_v1_first",
                    vector_json(&[(agent("old"), secs("2027-01-02T08:00:00Z"))]),
                ),
                (
                    "max by (agent_id) (max_over_time(agent_gateway_v1_last",
                    vector_json(&[
                        (agent("old"), secs("2027-01-30T09:00:00Z")),
                        (agent("quiet"), secs("2027-01-05T09:00:00Z")),
                        (agent("unknown"), secs("2027-01-30T09:00:00Z")),
                    ]),
                ),
                (
                    "max by (agent_id, v1_policy)",
                    vector_json(&[
                        (
                            vec![("agent_id", "old"), ("v1_policy", "allow")],
                            secs("2027-01-10T00:00:00Z"),
                        ),
                        (
                            vec![("agent_id", "old"), ("v1_policy", "block")],
                            secs("2027-01-31T11:59:58Z"),
                        ),
                        (
                            vec![("agent_id", "quiet"), ("v1_policy", "allow")],
                            secs("2027-01-31T11:59:58Z"),
                        ),
                        (
                            vec![("agent_id", "gone"), ("v1_policy", "allow")],
                            secs("2027-01-15T00:00:00Z"),
                        ),
                    ]),
                ),
                (
                    "max by (agent_id) (last_over_time(agent_gateway_agent_sunset",
                    vector_json(&[(agent("old"), secs("2027-03-01T00:00:00Z"))]),
                ),
                (
                    "max(last_over_time(agent_gateway_retirement_quiet_days",
                    vector_json(&[(vec![], 14.0)]),
                ),
            ],
            asked: Vec::new(),
            fleet: SeriesSelector::default(),
        }
    }

    #[test]
    fn each_replica_is_counted_up_to_its_own_last_scrape_at_prometheus_time() {
        let mut prom = fleet();
        every_replica(&mut prom, 30 * DAY).unwrap();
        let now = at("2027-01-31T12:00:00Z");
        assert_eq!(prom.asked[0], ("vector(time())".into(), None));
        assert!(prom.asked[1..].iter().all(|(_, t)| *t == Some(now)));
        // From the window's start (the 1st at noon), or from the first scrape of gw-b, which
        // started inside the window, to each replica's own last scrape.
        assert_eq!(
            prom.asked(INCREASE).unwrap(),
            "sum by (agent_id, api_version, operation) (\
             increase(agent_gateway_agent_requests_total{job=\"gw\",instance=\"gw-a:9090\"}[2591998250ms] @ 1801396798.250) or \
             increase(agent_gateway_agent_requests_total{job=\"gw\",instance=\"gw-b:9090\"}[900001001ms] @ 1800439200.000) or \
             increase(agent_gateway_agent_requests_total{job=\"gw\",instance=\"gw-c:9090\"}[2591999000ms] @ 1801396799.000))"
        );
        // Only replicas first scraped inside the window may have started inside it; their
        // first scrape is found to the second, up to a step and the lookback before the step's.
        assert_eq!(
            prom.asked(EXACT_FIRST_SCRAPES).unwrap(),
            "min by (job, instance) (\
             min_over_time(timestamp(agent_gateway_build_info{job=\"gw\",instance=\"gw-b:9090\"})[361000ms:1s] @ 1799539201.000) or \
             min_over_time(timestamp(agent_gateway_build_info{job=\"gw\",instance=\"gw-c:9090\"})[361000ms:1s] @ 1799712001.000))"
        );
        assert_eq!(
            prom.asked(START_TIMES).unwrap(),
            "sum by (job, instance) (\
             agent_gateway_start_time_seconds{job=\"gw\",instance=\"gw-b:9090\"} @ 1799539199.000 or \
             agent_gateway_start_time_seconds{job=\"gw\",instance=\"gw-c:9090\"} @ 1799711970.000)"
        );
        // gw-b did: what it had counted by its first scrape is added; gw-c did not.
        assert_eq!(
            prom.asked(AT_FIRST_SCRAPE).unwrap(),
            "sum by (agent_id, api_version, operation) (\
             agent_gateway_agent_requests_total{job=\"gw\",instance=\"gw-b:9090\"} @ 1799539199.000)"
        );
        // Subqueries see every scrape: their step is well under Prometheus' 5 m lookback.
        let firsts = prom.asked(FIRST_SCRAPES).unwrap();
        assert!(firsts.contains("[2592600000ms:60000ms]"), "{firsts}");
        assert_eq!(step(Duration::from_secs(600)), Duration::from_secs(1));
    }

    #[test]
    fn the_report_has_the_shape_of_v1_usage() {
        let report = every_replica(&mut fleet(), 30 * DAY).unwrap();
        let ids: Vec<&str> = report.agents.iter().map(|a| a.agent_id.as_str()).collect();
        assert_eq!(
            ids,
            ["gone", "old", "quiet"],
            "configured or seen, never \"unknown\""
        );
        let old = &report.agents[1];
        assert_eq!(old.v1_requests["verify_request"], 42);
        assert_eq!(old.v1_requests["credential_offer"], 0);
        assert_eq!(old.v2_requests["credential_offer"], 3);
        assert_eq!(old.v1_policy, "block", "the policy published last");
        assert_eq!(old.first_v1_call.as_deref(), Some("2027-01-02T08:00:00Z"));
        assert_eq!(old.last_v1_call.as_deref(), Some("2027-01-30T09:00:00Z"));
        assert_eq!(old.sunset_at.as_deref(), Some("2027-03-01T00:00:00Z"));
        assert!(!old.safe_to_block);
        // Quiet since the 5th, and Prometheus holds data for the whole window.
        let quiet = &report.agents[2];
        assert!(quiet.safe_to_block);
        assert_eq!(report.agents[0].v1_policy, REMOVED);
        assert_eq!(report.observed_since, "2027-01-01T12:00:00Z");
        assert_eq!(report.quiet_days, 14);
        assert_eq!(report.coverage_note, None);
    }

    #[test]
    fn without_data_covering_quiet_days_nobody_is_safe_to_block_and_the_report_says_why() {
        // One replica, scraped since the 25th.
        let mut prom = fleet();
        prom.answers[1].1 = vector_json(&[(replica("gw-a:9090"), secs("2027-01-31T11:59:58Z"))]);
        prom.answers[2].1 = vector_json(&[(replica("gw-a:9090"), secs("2027-01-25T00:00:00Z"))]);
        let report = every_replica(&mut prom, 30 * DAY).unwrap();
        assert!(report.agents.iter().all(|a| !a.safe_to_block));
        let note = report.coverage_note.unwrap();
        assert!(
            note.starts_with("Prometheus' data covers 6.5 days (since 2027-01-25T00:00:00Z), fewer than quiet_days = 14"),
            "{note}"
        );
        // A window shorter than quiet_days cannot tell either.
        let report = every_replica(&mut fleet(), 7 * DAY).unwrap();
        assert!(report.agents.iter().all(|a| !a.safe_to_block));
        assert!(report.coverage_note.is_some());
    }

    #[test]
    fn an_empty_prometheus_gives_an_empty_report_and_a_refusal_is_an_error() {
        let mut empty = Scripted {
            answers: vec![("vector(time())", vector_json(&[(vec![], 1.8e9)]))],
            asked: Vec::new(),
            fleet: SeriesSelector::default(),
        };
        let report = every_replica(&mut empty, 30 * DAY).unwrap();
        assert!(report.agents.is_empty());
        assert_eq!(empty.asked(INCREASE), None, "no replica, no count query");
        let mut refusing = Scripted {
            answers: vec![(
                "",
                r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#.into(),
            )],
            asked: Vec::new(),
            fleet: SeriesSelector::default(),
        };
        let e = every_replica(&mut refusing, DAY).unwrap_err().to_string();
        assert_eq!(e, "Prometheus refused `vector(time())`: parse error");
    }

    #[test]
    fn every_metric_of_every_query_is_restricted_to_the_selected_fleet() {
        let prod = SeriesSelector::parse(r#"namespace="prod",job=~"gw|agent-gateway""#).unwrap();
        let mut prom = fleet();
        prom.fleet = prod.clone();
        let report = block_on(fleet_report(&mut prom, 30 * DAY, &prod)).unwrap();
        // Every query, replica discovery and gauges included, and each replica's own.
        let naming_metrics: Vec<&str> = prom
            .asked
            .iter()
            .map(|(q, _)| q.as_str())
            .filter(|q| q.contains("agent_gateway_"))
            .collect();
        assert_eq!(
            naming_metrics.len(),
            prom.asked.len() - 1,
            "all but vector(time())"
        );
        for q in naming_metrics {
            assert_eq!(unrestricted(q, &prod), Vec::<&str>::new(), "{q}");
        }
        assert!(prom.asked(INCREASE).unwrap().starts_with(
            "sum by (agent_id, api_version, operation) (increase(agent_gateway_agent_requests_total\
             {namespace=\"prod\",job=~\"gw|agent-gateway\",job=\"gw\",instance=\"gw-a:9090\"}["
        ));
        // Prometheus answered the same, so the report is the same as without the selector.
        let unscoped = every_replica(&mut fleet(), 30 * DAY);
        assert_eq!(
            serde_json::to_value(report).unwrap(),
            serde_json::to_value(unscoped.unwrap()).unwrap()
        );
        // And the check above sees a metric left out.
        assert_eq!(
            unrestricted(
                "agent_gateway_a{namespace=\"prod\",job=~\"gw|agent-gateway\"} or \
                 agent_gateway_b[5m] or agent_gateway_c{job=\"gw\"} or \
                 agent_gateway_d{code=\"1\",namespace=\"prod\",job=~\"gw|agent-gateway\"} or \
                 agent_gateway_e{job=~\"gw|agent-gateway\",namespace=\"prod\"}",
                &prod
            ),
            ["agent_gateway_b", "agent_gateway_c", "agent_gateway_e"]
        );
    }
}
