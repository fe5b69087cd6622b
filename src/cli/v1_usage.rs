//! `agent-gateway v1-usage`: which agents still call v1, from a running gateway's admin
//! listener (what it saw since it started) or from a Prometheus that scrapes the whole fleet;
//! plain HTTP GETs to either.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};

use agent_gateway::http1::{client, percent_encode};
use agent_gateway::observe::fleet::{self, FleetError, Prometheus};
use agent_gateway::observe::usage::UsageReport;

use super::print_out;

/// How long the CLI waits for one answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of an answer the CLI reads.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// The fleet's v1 usage over `window` from the Prometheus at `base`, as a table or JSON.
pub fn from_prometheus(
    base: &str,
    window: humantime::Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut api = PrometheusApi {
        base: base.to_owned(),
    };
    let report = fleet::fleet_report(&mut api, *window)
        .with_context(|| format!("the fleet's v1 usage from {base}"))?;
    if json {
        print_out(&(serde_json::to_string(&report)? + "\n"))?;
    } else {
        print_out(&report.to_table())?;
        print_out(&format!(
            "(every replica {base} scrapes, over the last {window})\n"
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One gateway's v1 usage from its admin listener at `admin`, as a table or its JSON.
pub fn from_admin(admin: &str, json: bool) -> anyhow::Result<ExitCode> {
    let body = admin_get(admin, "/v1-usage")?;
    if json {
        print_out(&(body + "\n"))?;
    } else {
        let report: UsageReport = serde_json::from_str(&body)
            .context("the admin listener's /v1-usage is not a usage report")?;
        print_out(&report.to_table())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A GET of `path` under `base` (`http://host:port`, optionally with a path prefix): the
/// status and body of the answer.
fn http_get(base: &str, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let rest = base
        .strip_prefix("http://")
        .with_context(|| format!("{base} is not an http:// URL"))?
        .trim_end_matches('/');
    let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let target = format!("{prefix}{path}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let answer = runtime.block_on(async {
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(authority)
                .await
                .with_context(|| format!("cannot connect to {authority}"))?;
            client::get(&mut stream, authority, &target, MAX_ANSWER)
                .await
                .with_context(|| format!("reading {base}{path}"))
        };
        tokio::time::timeout(ANSWER_TIMEOUT, fetch)
            .await
            .with_context(|| format!("{base}{path} did not answer in time"))?
    })?;
    Ok((answer.status(), answer.body().to_vec()))
}

/// A GET of `path` on the admin listener at `base` (`http://host:port`): the body of a 200.
fn admin_get(base: &str, path: &str) -> anyhow::Result<String> {
    let (status, body) = http_get(base, path).context("--admin")?;
    if status != 200 {
        bail!("{base}{path} answered {status}");
    }
    String::from_utf8(body).context("the answer is not UTF-8")
}

/// A Prometheus server's query API at `base` (`http://host:port`, or with the path prefix of
/// its `--web.route-prefix`).
struct PrometheusApi {
    base: String,
}

impl Prometheus for PrometheusApi {
    fn query(&mut self, promql: &str, at: Option<SystemTime>) -> Result<Vec<u8>, FleetError> {
        let mut path = format!("/api/v1/query?query={}", percent_encode(promql));
        if let Some(t) = at {
            let secs = t
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            path.push_str(&format!("&time={secs:.3}"));
        }
        // Prometheus answers errors in JSON too, with a 4xx or 5xx status: the body says why.
        let (_status, body) =
            http_get(&self.base, &path).map_err(|e| FleetError::Fetch(format!("{e:#}")))?;
        Ok(body)
    }
}
