//! `agent-gateway v1-usage`: which agents still call v1, from a running gateway's admin
//! listener (what it saw since it started) or from a Prometheus that scrapes the whole fleet
//! (over HTTPS with credentials if it needs them); GETs through [`agent_gateway::client`].

use std::process::ExitCode;

use anyhow::{bail, Context};

use agent_gateway::client::{Client, ClientOptions};
use agent_gateway::config::SeriesSelector;
use agent_gateway::observe::fleet;
use agent_gateway::observe::prometheus::PrometheusApi;
use agent_gateway::observe::usage::UsageReport;

use super::print_out;

/// A current-thread runtime for the command's few requests.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// The v1 usage over `window` of the fleet `selector` selects (every replica for none) in the
/// Prometheus at `url`, reached as `options` say, as a table or JSON.
pub fn from_prometheus(
    url: &str,
    options: &ClientOptions,
    selector: &SeriesSelector,
    window: humantime::Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let report = runtime()?.block_on(async {
        let mut api = PrometheusApi::new(url, options).context("--prometheus")?;
        let base = api.base();
        fleet::fleet_report(&mut api, *window, selector)
            .await
            .with_context(|| format!("the fleet's v1 usage from {base}"))
            .map(|report| (report, base))
    });
    let (report, base) = report?;
    if json {
        print_out(&(serde_json::to_string(&report)? + "\n"))?;
    } else {
        print_out(&report.to_table())?;
        let matching = match selector.is_empty() {
            true => String::new(),
            false => format!(" that matches {selector}"),
        };
        print_out(&format!(
            "(every replica {base} scrapes{matching}, over the last {window})\n"
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One gateway's v1 usage from its admin listener at `admin` (with the admin token of
/// `options`, if any), as a table or its JSON.
pub fn from_admin(admin: &str, options: &ClientOptions, json: bool) -> anyhow::Result<ExitCode> {
    let answer = runtime()?.block_on(async {
        let client = Client::new(admin, options).context("--admin")?;
        anyhow::Ok(client.get("/v1-usage").await?)
    })?;
    if answer.status == 401 {
        bail!("{admin}/v1-usage needs the admin token: --admin-token-file FILE");
    }
    if answer.status != 200 {
        bail!("{admin}/v1-usage answered {}", answer.status);
    }
    let body = String::from_utf8(answer.body.to_vec()).context("the answer is not UTF-8")?;
    if json {
        print_out(&(body + "\n"))?;
    } else {
        let report: UsageReport = serde_json::from_str(&body)
            .context("the admin listener's /v1-usage is not a usage report")?;
        print_out(&report.to_table())?;
    }
    Ok(ExitCode::SUCCESS)
}
