//! The shipped Prometheus files and Grafana dashboard against the real tools: `promtool` checks
//! and unit-tests the alert rules, then a real Prometheus scrapes a running gateway and runs
//! every dashboard query and alert expression; and `v1-usage --prometheus` reads the v1 usage
//! of two replicas, one restarted, from a real Prometheus, and of one deployment of two that
//! the same Prometheus scrapes.
//!
//! Needs `prometheus` and `promtool` on PATH (Debian: `apt-get install prometheus`, which
//! `.ci/run` does). Without them these tests fail rather than pass silently.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::V1Policy;
use serde_json::Value;

use common::process::{kill, poll_until, wait_listening, wait_until_or, Listening};
use common::*;

const ALERTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/prometheus/alerts.yml");
const PROMETHEUS_YML: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/config/prometheus/prometheus.yml"
);

/// The alert rules alerts.yml must define.
const ALERT_NAMES: [&str; 17] = [
    "AgentGatewayDown",
    "AgentGatewayAbsent",
    "AgentGatewayUpstreamErrorRatioHigh",
    "AgentGatewayP99LatencyHigh",
    "AgentGatewayAuthFailureSpike",
    "AgentGatewayAuthThrottling",
    "AgentGatewayAuthGuessingSpread",
    "AgentGatewayConfigReloadFailed",
    "AgentGatewayRateLimitBackendFailing",
    "AgentGatewayDroppingLogLines",
    "AgentGatewayDroppingSpans",
    "AgentGatewayFileDescriptorsNearLimit",
    "AgentGatewayUpstreamAddressDown",
    "AgentGatewayRetiredAgentCallingV1",
    "AgentGatewayV1AgentQuiet",
    "AgentGatewayV1ShareNotFalling",
    "AgentGatewayBrownoutOverRefusing",
];

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `promtool` with `args` and requires success.
fn promtool(args: &[&str]) -> String {
    let out = Command::new(which("promtool")).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?} failed: {}",
        show(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `text` with `from` replaced by `to`, which must occur exactly once.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} once in the text");
    text.replacen(from, to, 1)
}

/// The shipped prometheus.yml, aimed at `target` with 1 s scrape and evaluation intervals and
/// the shipped alerts.yml by absolute path.
fn scrape_config(target: SocketAddr) -> String {
    fleet_scrape_config(&[target])
}

/// The shipped prometheus.yml, as [`scrape_config`], aimed at every one of `targets`.
fn fleet_scrape_config(targets: &[SocketAddr]) -> String {
    let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    shipped_scrape_config(&format!("- targets: [{}]", targets.join(", ")))
}

/// The shipped prometheus.yml, as [`scrape_config`], aimed at one target per deployment, all
/// in its one job, each with its deployment's `namespace` label: what the Prometheus
/// Operator makes of the shipped ServiceMonitor in two namespaces.
fn deployments_scrape_config(deployments: &[(&str, SocketAddr)]) -> String {
    let groups: Vec<String> = deployments
        .iter()
        .map(|(namespace, target)| {
            format!("- targets: [\"{target}\"]\n        labels: {{namespace: {namespace}}}")
        })
        .collect();
    shipped_scrape_config(&groups.join("\n      "))
}

/// The shipped prometheus.yml with 1 s scrape and evaluation intervals, the shipped alerts.yml
/// by absolute path, and `static_configs` (YAML list items, indented as the file's) in place
/// of its one target.
fn shipped_scrape_config(static_configs: &str) -> String {
    let text = std::fs::read_to_string(PROMETHEUS_YML).unwrap();
    let text = replace_once(&text, "scrape_interval: 15s", "scrape_interval: 1s");
    let text = replace_once(&text, "evaluation_interval: 15s", "evaluation_interval: 1s");
    let text = replace_once(&text, "- alerts.yml", &format!("- {ALERTS}"));
    replace_once(&text, "- targets: [\"127.0.0.1:9090\"]", static_configs)
}

// ---------------------------------------------------------------------------------------------
// promtool
// ---------------------------------------------------------------------------------------------

/// Unit tests for alerts.yml: each alert fires on the series it is meant for, at the time its
/// `for` allows, and not on its near misses. `{alerts}` is replaced by the rule file's path.
const RULE_TESTS: &str = r#"
rule_files:
  - {alerts}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # gw-a stops answering scrapes at 2m; gw-b never does.
      - series: 'up{job="agent-gateway", instance="gw-a"}'
        values: '1 1 0x20'
      - series: 'up{job="agent-gateway", instance="gw-b"}'
        values: '1x22'
      # gw-a: 10 requests/s, 1 backend error/s (10%); gw-b: 10/s with 0.05/s (0.5%).
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", code="200"}'
        values: '0+600x22'
      - series: 'agent_gateway_upstream_errors_total{job="agent-gateway", instance="gw-a", kind="connect"}'
        values: '0+60x22'
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-b", api_version="v2", operation="verify_request", code="200"}'
        values: '0+600x22'
      - series: 'agent_gateway_upstream_errors_total{job="agent-gateway", instance="gw-b", kind="timeout"}'
        values: '0+3x22'
    alert_rule_test:
      - eval_time: 1m
        alertname: AgentGatewayDown
        exp_alerts: []
      - eval_time: 4m
        alertname: AgentGatewayDown
        exp_alerts:
          - exp_labels: {severity: critical, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewaydown"
              summary: "agent-gateway gw-a is down"
              description: "Prometheus has not been able to scrape the admin listener of gw-a for a minute: the gateway process is down or its admin listener is unreachable."
      - eval_time: 3m
        alertname: AgentGatewayUpstreamErrorRatioHigh
        exp_alerts: []
      - eval_time: 10m
        alertname: AgentGatewayUpstreamErrorRatioHigh
        exp_alerts:
          - exp_labels: {severity: critical, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayupstreamerrorratiohigh"
              summary: "agent-gateway gw-a: 10% backend errors per request"
              description: "More than 5% of requests met a backend failure (connect, timeout, reset) over the last 5 minutes. Clients see 502/504 when no address answers. See the \"Upstream errors/s by kind\" panel."

  - interval: 1m
    input_series:
      # gw-a: every request takes between 0.5 s and 4 s; gw-b: all under 0.5 s.
      - series: 'agent_gateway_request_duration_seconds_bucket{job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", le="0.5"}'
        values: '0x30'
      - series: 'agent_gateway_request_duration_seconds_bucket{job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", le="4"}'
        values: '0+60x30'
      - series: 'agent_gateway_request_duration_seconds_bucket{job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", le="+Inf"}'
        values: '0+60x30'
      - series: 'agent_gateway_request_duration_seconds_bucket{job="agent-gateway", instance="gw-b", api_version="v2", operation="verify_request", le="0.5"}'
        values: '0+60x30'
      - series: 'agent_gateway_request_duration_seconds_bucket{job="agent-gateway", instance="gw-b", api_version="v2", operation="verify_request", le="4"}'
        values: '0+60x30'
      - series: 'agent_gateway_request_duration_seconds_bucket{job="agent-gateway", instance="gw-b", api_version="v2", operation="verify_request", le="+Inf"}'
        values: '0+60x30'
    alert_rule_test:
      - eval_time: 5m
        alertname: AgentGatewayP99LatencyHigh
        exp_alerts: []
      - eval_time: 15m
        alertname: AgentGatewayP99LatencyHigh
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayp99latencyhigh"
              summary: "agent-gateway gw-a: p99 latency 3.965s"
              description: "The 99th percentile of request duration (start to end of response) has been over 1 s for 10 minutes. Compare \"Backend latency p50 / p99\" to tell a slow backend from a slow gateway."

  - interval: 1m
    input_series:
      # gw-a: 2 auth failures/s of 5 requests/s; gw-b: 2/s of 100/s; gw-c: 0.5/s of 1/s.
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", code="401"}'
        values: '0+300x20'
      - series: 'agent_gateway_auth_failures_total{job="agent-gateway", instance="gw-a", reason="bad_token"}'
        values: '0+120x20'
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-b", api_version="v2", operation="verify_request", code="200"}'
        values: '0+6000x20'
      - series: 'agent_gateway_auth_failures_total{job="agent-gateway", instance="gw-b", reason="unknown_agent"}'
        values: '0+120x20'
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-c", api_version="v2", operation="verify_request", code="200"}'
        values: '0+60x20'
      - series: 'agent_gateway_auth_failures_total{job="agent-gateway", instance="gw-c", reason="unknown_agent"}'
        values: '0+30x20'
    alert_rule_test:
      - eval_time: 3m
        alertname: AgentGatewayAuthFailureSpike
        exp_alerts: []
      - eval_time: 10m
        alertname: AgentGatewayAuthFailureSpike
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayauthfailurespike"
              summary: "agent-gateway gw-a: 2 auth failures/s"
              description: "More than 1 request/s and more than 20% of requests have been refused with 401 for 5 minutes: a misconfigured client, a rotated token not yet deployed, or credential guessing. The \"Auth failures/s by reason\" panel says which."

  - interval: 1m
    input_series:
      # gw-a throttles an address at 2m; gw-b never does.
      - series: 'agent_gateway_auth_throttled_total{job="agent-gateway", instance="gw-a"}'
        values: '0 0 5x30'
      - series: 'agent_gateway_auth_throttled_total{job="agent-gateway", instance="gw-b"}'
        values: '0x32'
    alert_rule_test:
      - eval_time: 1m
        alertname: AgentGatewayAuthThrottling
        exp_alerts: []
      - eval_time: 3m
        alertname: AgentGatewayAuthThrottling
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayauththrottling"
              summary: "agent-gateway gw-a is refusing a guessing address"
              description: "A client address failed to authenticate auth.max_failures_per_minute times in a minute, and its requests got 429 for the rest of it: credential guessing, or a client on a removed token. The gateway log names the address once per minute (\"too many failed authentications\", client_addr); its access log lines have auth \"throttled\"."
      - eval_time: 20m
        alertname: AgentGatewayAuthThrottling
        exp_alerts: []

  - interval: 1m
    input_series:
      # gw-a leaves 401s untracked at 2m; gw-b never does.
      - series: 'agent_gateway_auth_failures_untracked_total{job="agent-gateway", instance="gw-a"}'
        values: '0 0 40x30'
      - series: 'agent_gateway_auth_failures_untracked_total{job="agent-gateway", instance="gw-b"}'
        values: '0x32'
    alert_rule_test:
      - eval_time: 1m
        alertname: AgentGatewayAuthGuessingSpread
        exp_alerts: []
      - eval_time: 3m
        alertname: AgentGatewayAuthGuessingSpread
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayauthguessingspread"
              summary: "agent-gateway gw-a: 401s from more addresses than it throttles"
              description: "As many client addresses as the gateway keeps had failed authentications in their minute, and the 401s of further addresses were not counted toward auth.max_failures_per_minute: those addresses are not throttled. Guessing spread over very many addresses, or a balancer whose clients all look like new ones."
      - eval_time: 20m
        alertname: AgentGatewayAuthGuessingSpread
        exp_alerts: []

  - interval: 1m
    input_series:
      # gw-a refuses one reload at 2m; gw-b only ever succeeds.
      - series: 'agent_gateway_config_reloads_total{job="agent-gateway", instance="gw-a", result="failure"}'
        values: '0 0 1x30'
      - series: 'agent_gateway_config_reloads_total{job="agent-gateway", instance="gw-b", result="failure"}'
        values: '0x32'
      - series: 'agent_gateway_config_reloads_total{job="agent-gateway", instance="gw-b", result="success"}'
        values: '0 1 2 3x30'
    alert_rule_test:
      - eval_time: 1m
        alertname: AgentGatewayConfigReloadFailed
        exp_alerts: []
      - eval_time: 3m
        alertname: AgentGatewayConfigReloadFailed
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a, result: failure}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayconfigreloadfailed"
              summary: "agent-gateway gw-a refused a config reload"
              description: "A reload of the config file (file change, SIGHUP or POST /-/reload) was refused in the last 10 minutes: the file was unreadable or invalid, and the previous config keeps serving. The gateway log and `agent-gateway check-config --config FILE` give every problem by key path."
      - eval_time: 20m
        alertname: AgentGatewayConfigReloadFailed
        exp_alerts: []

  - interval: 1m
    input_series:
      # gw-a: Redis fails from 2m on (one decision in two is not Redis'); gw-b: never.
      - series: 'agent_gateway_rate_limit_backend_errors_total{job="agent-gateway", instance="gw-a", kind="timeout"}'
        values: '0 0 0+30x20'
      - series: 'agent_gateway_rate_limit_backend_errors_total{job="agent-gateway", instance="gw-b", kind="timeout"}'
        values: '0x22'
    alert_rule_test:
      - eval_time: 4m
        alertname: AgentGatewayRateLimitBackendFailing
        exp_alerts: []
      - eval_time: 10m
        alertname: AgentGatewayRateLimitBackendFailing
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayratelimitbackendfailing"
              summary: "agent-gateway gw-a: the shared rate limit is not holding"
              description: "For 5 minutes Redis has left some of this replica's rate-limit decisions undecided (timeouts, errors, or skipped right after a failure), so rate_limit.on_redis_error applied: this replica's own buckets (\"local\"), no limit (\"allow\") or 429s (\"deny\"). See the \"Rate-limit backend errors/s by kind\" panel and the gateway log."

  - interval: 1m
    input_series:
      # gw-a's log sink stalls from 2m on; gw-b dropped a burst once, long ago.
      - series: 'agent_gateway_log_lines_dropped_total{job="agent-gateway", instance="gw-a"}'
        values: '0 0 0+500x30'
      - series: 'agent_gateway_log_lines_dropped_total{job="agent-gateway", instance="gw-b"}'
        values: '0 100x31'
    alert_rule_test:
      - eval_time: 8m
        alertname: AgentGatewayDroppingLogLines
        exp_alerts: []
      - eval_time: 20m
        alertname: AgentGatewayDroppingLogLines
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewaydroppingloglines"
              summary: "agent-gateway gw-a is dropping log lines"
              description: "For 10 minutes this replica's log sink (stderr, and whatever collects it) has been slower than its log lines: the 1 MiB log buffer was full and lines, access log included, were dropped rather than hold up requests. Check the log collector, or raise the log level. See the \"Log lines dropped/s\" panel."

  - interval: 1m
    input_series:
      # Every target of the job vanishes at 3m (the other job's stays); none comes back.
      - series: 'up{job="agent-gateway", instance="gw-a"}'
        values: '1 1 1 stale'
      - series: 'up{job="other", instance="other:9100"}'
        values: '1x20'
    alert_rule_test:
      - eval_time: 6m
        alertname: AgentGatewayAbsent
        exp_alerts: []
      - eval_time: 10m
        alertname: AgentGatewayAbsent
        exp_alerts:
          - exp_labels: {severity: critical, job: agent-gateway}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayabsent"
              summary: "Prometheus scrapes no agent-gateway target"
              description: "For 5 minutes Prometheus has had no target in job agent-gateway at all: every gateway is gone, or Prometheus no longer discovers them. AgentGatewayDown cannot fire without a target, and no other gateway alert can either."

  - interval: 1m
    input_series:
      # gw-a's collector is down from 2m on; gw-b dropped a burst once, long ago.
      - series: 'agent_gateway_trace_spans_dropped_total{job="agent-gateway", instance="gw-a", reason="export_failed"}'
        values: '0 0 0+50x30'
      - series: 'agent_gateway_trace_spans_dropped_total{job="agent-gateway", instance="gw-b", reason="queue_full"}'
        values: '0 500x31'
    alert_rule_test:
      - eval_time: 8m
        alertname: AgentGatewayDroppingSpans
        exp_alerts: []
      - eval_time: 20m
        alertname: AgentGatewayDroppingSpans
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a, reason: export_failed}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewaydroppingspans"
              summary: "agent-gateway gw-a is dropping trace spans (export_failed)"
              description: "For 10 minutes this replica has dropped spans instead of exporting them: queue_full (the export queue was full) or export_failed (the OTLP collector was down, slower than export_timeout_ms, or refused). Requests are not affected; traces are missing. See the \"Spans exported and dropped/s\" panel."

  - interval: 1m
    input_series:
      # gw-a's open descriptors climb past 80 % of 1024 at 5m; gw-b stays at half of its
      # limit; the node exporter beside them, at 95 % of its own, is not a gateway.
      - series: 'process_open_fds{job="agent-gateway", instance="gw-a"}'
        values: '500+100x4 900x30'
      - series: 'process_max_fds{job="agent-gateway", instance="gw-a"}'
        values: '1024x34'
      - series: 'process_open_fds{job="agent-gateway", instance="gw-b"}'
        values: '512x34'
      - series: 'process_max_fds{job="agent-gateway", instance="gw-b"}'
        values: '1024x34'
      - series: 'process_open_fds{job="node", instance="node:9100"}'
        values: '973x34'
      - series: 'process_max_fds{job="node", instance="node:9100"}'
        values: '1024x34'
    alert_rule_test:
      - eval_time: 10m
        alertname: AgentGatewayFileDescriptorsNearLimit
        exp_alerts: []
      - eval_time: 20m
        alertname: AgentGatewayFileDescriptorsNearLimit
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayfiledescriptorsnearlimit"
              summary: "agent-gateway gw-a uses 87.89% of its file descriptors"
              description: "For 10 minutes this process has had more than 80% of its file descriptor limit open. Every client and backend connection holds one; at the limit new connections are refused. See \"File descriptors used of the limit\" and \"In-flight requests\"."

  - interval: 1m
    input_series:
      # 10.0.0.1 is out of rotation from 2m on; 10.0.0.2 goes out for 3 minutes only.
      - series: 'agent_gateway_upstream_address_up{job="agent-gateway", instance="gw-a", address="10.0.0.1:80"}'
        values: '1 1 0x20'
      - series: 'agent_gateway_upstream_address_up{job="agent-gateway", instance="gw-a", address="10.0.0.2:80"}'
        values: '1 1 0 0 0 1x20'
    alert_rule_test:
      - eval_time: 5m
        alertname: AgentGatewayUpstreamAddressDown
        exp_alerts: []
      - eval_time: 10m
        alertname: AgentGatewayUpstreamAddressDown
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, instance: gw-a, address: "10.0.0.1:80"}
            exp_annotations:
              summary: "agent-gateway gw-a: upstream address 10.0.0.1:80 out of rotation"
              description: "For 5 minutes 10.0.0.1:80 has been out of the rotation: down at its health check, or ejected again and again after failures in a row (agent_gateway_upstream_ejections_total). The other addresses carry its share, and its connection budget with them. Check that backend instance, or remove it from upstream.addresses or its DNS name. See the \"Backend\" row."
              runbook_url: "docs/runbooks.md#agentgatewayupstreamaddressdown"

  - interval: 1m
    input_series:
      # What the replicas publish: blocked-a is blocked; late-b, vip and sunset-rehearser are
      # past their sunset (600 s after the epoch); future-c is not; vip is exempt.
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="blocked-a", v1_policy="block"}'
        values: '1x40'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-b", agent_id="blocked-a", v1_policy="block"}'
        values: '1x40'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="blocked-quiet", v1_policy="block"}'
        values: '1x40'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="late-b", v1_policy="allow"}'
        values: '1x40'
      - series: 'agent_gateway_agent_sunset_timestamp_seconds{job="agent-gateway", instance="gw-a", agent_id="late-b"}'
        values: '600x40'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="future-c", v1_policy="allow"}'
        values: '1x40'
      - series: 'agent_gateway_agent_sunset_timestamp_seconds{job="agent-gateway", instance="gw-a", agent_id="future-c"}'
        values: '1e10x40'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="vip", v1_policy="exempt"}'
        values: '1x40'
      - series: 'agent_gateway_agent_sunset_timestamp_seconds{job="agent-gateway", instance="gw-a", agent_id="vip"}'
        values: '600x40'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="sunset-rehearser", v1_policy="allow"}'
        values: '1x40'
      - series: 'agent_gateway_agent_sunset_timestamp_seconds{job="agent-gateway", instance="gw-a", agent_id="sunset-rehearser"}'
        values: '600x40'
      # What happened: blocked-a calls v1 through gw-b only, once a minute; late-b, future-c
      # and vip twice a minute; sunset-rehearser only rehearses; blocked-quiet never calls.
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="blocked-a", api_version="v1", operation="verify_request"}'
        values: '0x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-b", agent_id="blocked-a", api_version="v1", operation="verify_request"}'
        values: '0+1x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="blocked-quiet", api_version="v1", operation="verify_request"}'
        values: '0x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="late-b", api_version="v1", operation="credential_offer"}'
        values: '0+2x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="future-c", api_version="v1", operation="verify_request"}'
        values: '0+2x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="vip", api_version="v1", operation="verify_request"}'
        values: '0+2x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="sunset-rehearser", api_version="v1", operation="verify_request"}'
        values: '0+1x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="blocked-a", reason="rehearsal"}'
        values: '0x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-b", agent_id="blocked-a", reason="rehearsal"}'
        values: '0x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="blocked-quiet", reason="rehearsal"}'
        values: '0x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="late-b", reason="rehearsal"}'
        values: '0x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="future-c", reason="rehearsal"}'
        values: '0x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="vip", reason="rehearsal"}'
        values: '0x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="sunset-rehearser", reason="rehearsal"}'
        values: '0+1x40'
    alert_rule_test:
      - eval_time: 30m
        alertname: AgentGatewayRetiredAgentCallingV1
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, agent_id: blocked-a}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayretiredagentcallingv1"
              summary: "agent blocked-a still calls v1: 30 calls in the last hour"
              description: "blocked-a is blocked (v1_policy = \"block\") or past its sunset date, and still made v1 calls in the last hour, across the fleet (rehearsals not counted). It gets 410 (or, past its sunset without enforce_sunset, still reaches the backend): call the team behind blocked-a. `agent-gateway v1-usage --prometheus URL` shows which operations."
          - exp_labels: {severity: warning, job: agent-gateway, agent_id: late-b}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayretiredagentcallingv1"
              summary: "agent late-b still calls v1: 60 calls in the last hour"
              description: "late-b is blocked (v1_policy = \"block\") or past its sunset date, and still made v1 calls in the last hour, across the fleet (rehearsals not counted). It gets 410 (or, past its sunset without enforce_sunset, still reaches the backend): call the team behind late-b. `agent-gateway v1-usage --prometheus URL` shows which operations."

  - interval: 1m
    input_series:
      # buggy: 200 v1 calls per 10 minutes over two replicas, 90 % refused by brownouts under
      # a 25 % share. fine: 25 % under 25 %. sparse: all refused, but 20 calls per 10 minutes.
      # ended: 50 % under a 50 % window that closed at 15m.
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="buggy", api_version="v1", operation="verify_request"}'
        values: '0+10x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-b", agent_id="buggy", api_version="v1", operation="verify_request"}'
        values: '0+10x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="buggy", reason="brownout"}'
        values: '0+9x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-b", agent_id="buggy", reason="brownout"}'
        values: '0+9x40'
      - series: 'agent_gateway_v1_brownout_share{job="agent-gateway", instance="gw-a", agent_id="buggy"}'
        values: '0.25x40'
      - series: 'agent_gateway_v1_brownout_share{job="agent-gateway", instance="gw-b", agent_id="buggy"}'
        values: '0.25x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="fine", api_version="v1", operation="verify_request"}'
        values: '0+20x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="fine", reason="brownout"}'
        values: '0+5x40'
      - series: 'agent_gateway_v1_brownout_share{job="agent-gateway", instance="gw-a", agent_id="fine"}'
        values: '0.25x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="sparse", api_version="v1", operation="verify_request"}'
        values: '0+2x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="sparse", reason="brownout"}'
        values: '0+2x40'
      - series: 'agent_gateway_v1_brownout_share{job="agent-gateway", instance="gw-a", agent_id="sparse"}'
        values: '0.1x40'
      - series: 'agent_gateway_agent_requests_total{job="agent-gateway", instance="gw-a", agent_id="ended", api_version="v1", operation="verify_request"}'
        values: '0+20x40'
      - series: 'agent_gateway_v1_refusals_total{job="agent-gateway", instance="gw-a", agent_id="ended", reason="brownout"}'
        values: '0+10x15 150x25'
      - series: 'agent_gateway_v1_brownout_share{job="agent-gateway", instance="gw-a", agent_id="ended"}'
        values: '0.5x15 0x25'
    alert_rule_test:
      - eval_time: 5m
        alertname: AgentGatewayBrownoutOverRefusing
        exp_alerts: []
      - eval_time: 30m
        alertname: AgentGatewayBrownoutOverRefusing
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway, agent_id: buggy}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewaybrownoutoverrefusing"
              summary: "brownouts refused 90% of buggy's v1 calls"
              description: "Over 10 minutes, brownouts refused far more of buggy's v1 calls than its schedule's share (more than 1.5 times it plus 10 points, over at least 100 calls). Suspect a gateway bug, replicas on different configs, or a client retrying with the same X-Request-Id (each retry is refused again). See \"Brownout: share refused vs configured\"."
"#;

/// Unit tests of the retirement alerts that look back weeks (quiet agents, the v1 share week
/// over week), evaluated hourly so that 15 days of series stay quick.
const LONG_RULE_TESTS: &str = r#"
rule_files:
  - {alerts}
evaluation_interval: 1h
tests:
  - interval: 1h
    input_series:
      # Prometheus has scraped gw-a since the start. "never" never called v1; "old" last
      # called 12 hours in (43200 s); "recent" on day 12 (1036800 s); "blocked" is blocked.
      - series: 'agent_gateway_build_info{job="agent-gateway", instance="gw-a", version="0.1.0"}'
        values: '1x400'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="never", v1_policy="allow"}'
        values: '1x400'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="old", v1_policy="allow"}'
        values: '1x400'
      - series: 'agent_gateway_v1_last_seen_timestamp_seconds{job="agent-gateway", instance="gw-a", agent_id="old"}'
        values: '_x12 43200x388'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="recent", v1_policy="allow"}'
        values: '1x400'
      - series: 'agent_gateway_v1_last_seen_timestamp_seconds{job="agent-gateway", instance="gw-a", agent_id="recent"}'
        values: '_x288 1036800x112'
      - series: 'agent_gateway_agent_info{job="agent-gateway", instance="gw-a", agent_id="blocked", v1_policy="block"}'
        values: '1x400'
    alert_rule_test:
      # Day 10: Prometheus does not hold 14 days yet, so nobody is known to be quiet.
      - eval_time: 10d
        alertname: AgentGatewayV1AgentQuiet
        exp_alerts: []
      - eval_time: 15d
        alertname: AgentGatewayV1AgentQuiet
        exp_alerts:
          - exp_labels: {severity: info, job: agent-gateway, agent_id: never}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayv1agentquiet"
              summary: "agent never has made no v1 call for 14 days: safe to block"
              description: "No replica has seen a v1 call by never for 14 days, and Prometheus holds the gateway's metrics from at least that long ago. Set its v1_policy to \"block\" (a reminder, not a page; `agent-gateway v1-usage --prometheus URL` double-checks)."
          - exp_labels: {severity: info, job: agent-gateway, agent_id: old}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayv1agentquiet"
              summary: "agent old has made no v1 call for 14 days: safe to block"
              description: "No replica has seen a v1 call by old for 14 days, and Prometheus holds the gateway's metrics from at least that long ago. Set its v1_policy to \"block\" (a reminder, not a page; `agent-gateway v1-usage --prometheus URL` double-checks)."

  - interval: 1h
    input_series:
      # v1 steady at 10/h; v2 10/h the first week, 20/h after: the share falls, 50 % to 33 %.
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", code="200"}'
        values: '0+10x400'
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-a", api_version="v2", operation="verify_request", code="200"}'
        values: '0+10x168 1680+20x232'
    alert_rule_test:
      - eval_time: 15d
        alertname: AgentGatewayV1ShareNotFalling
        exp_alerts: []

  - interval: 1h
    input_series:
      # v1 and v2 both steady at 10/h, v1 over two replicas: the share stays at 50 %.
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", code="200"}'
        values: '0+5x400'
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-b", api_version="v1", operation="verify_request", code="200"}'
        values: '0+5x400'
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-a", api_version="v2", operation="connection_invitation", code="200"}'
        values: '0+10x400'
    alert_rule_test:
      # A week in, there is no week before to compare with.
      - eval_time: 6d
        alertname: AgentGatewayV1ShareNotFalling
        exp_alerts: []
      - eval_time: 15d
        alertname: AgentGatewayV1ShareNotFalling
        exp_alerts:
          - exp_labels: {severity: warning, job: agent-gateway}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayv1sharenotfalling"
              summary: "v1 share not falling: 50% of requests this week"
              description: "The share of requests on v1 over the last 7 days fell by less than 5 % of itself from the 7 days before, across the fleet. The retirement has stalled: \"v1 requests/s by agent\" shows who keeps it up; raise the pressure (brownout ramps, per-agent sunset dates)."

  - interval: 1h
    input_series:
      # Two environments in one Prometheus: prod's v1 share falls, 50 % to 33 %; staging's
      # stays at 50 %. Summed together it falls (50 % to 40 %) and staging's stall would hide.
      - series: 'agent_gateway_requests_total{namespace="prod", job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", code="200"}'
        values: '0+10x400'
      - series: 'agent_gateway_requests_total{namespace="prod", job="agent-gateway", instance="gw-a", api_version="v2", operation="verify_request", code="200"}'
        values: '0+10x168 1680+20x232'
      - series: 'agent_gateway_requests_total{namespace="staging", job="agent-gateway", instance="gw-a", api_version="v1", operation="verify_request", code="200"}'
        values: '0+10x400'
      - series: 'agent_gateway_requests_total{namespace="staging", job="agent-gateway", instance="gw-a", api_version="v2", operation="verify_request", code="200"}'
        values: '0+10x400'
    alert_rule_test:
      - eval_time: 15d
        alertname: AgentGatewayV1ShareNotFalling
        exp_alerts:
          - exp_labels: {severity: warning, namespace: staging, job: agent-gateway}
            exp_annotations:
              runbook_url: "docs/runbooks.md#agentgatewayv1sharenotfalling"
              summary: "v1 share not falling: 50% of requests this week"
              description: "The share of requests on v1 over the last 7 days fell by less than 5 % of itself from the 7 days before, across the fleet. The retirement has stalled: \"v1 requests/s by agent\" shows who keeps it up; raise the pressure (brownout ramps, per-agent sunset dates)."

  - interval: 1h
    input_series:
      # No v1 at all is not a stall.
      - series: 'agent_gateway_requests_total{job="agent-gateway", instance="gw-a", api_version="v2", operation="connection_invitation", code="200"}'
        values: '0+10x400'
    alert_rule_test:
      - eval_time: 15d
        alertname: AgentGatewayV1ShareNotFalling
        exp_alerts: []
"#;

#[test]
fn promtool_accepts_the_shipped_rules_and_config_and_the_alerts_fire_as_designed() {
    let out = promtool(&["check", "rules", ALERTS]);
    assert!(
        out.contains(&format!("{} rules found", ALERT_NAMES.len())),
        "{out}"
    );
    // Checks the config and, through rule_files, alerts.yml beside it.
    promtool(&["check", "config", PROMETHEUS_YML]);

    let dir = tempfile::tempdir().unwrap();
    let generated = dir.path().join("prometheus.yml");
    std::fs::write(&generated, scrape_config("127.0.0.1:9090".parse().unwrap())).unwrap();
    promtool(&["check", "config", generated.to_str().unwrap()]);

    let tests = dir.path().join("alerts_test.yml");
    std::fs::write(&tests, RULE_TESTS.replace("{alerts}", ALERTS)).unwrap();
    let long_tests = dir.path().join("alerts_long_test.yml");
    std::fs::write(&long_tests, LONG_RULE_TESTS.replace("{alerts}", ALERTS)).unwrap();
    promtool(&[
        "test",
        "rules",
        tests.to_str().unwrap(),
        long_tests.to_str().unwrap(),
    ]);
}

// ---------------------------------------------------------------------------------------------
// A real Prometheus
// ---------------------------------------------------------------------------------------------

/// A Prometheus server on a free loopback port with its data in a temporary directory.
/// Killed on drop.
struct Prometheus {
    addr: SocketAddr,
    child: Child,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts it on `config` and waits until it listens and is ready (on another port if
    /// one was taken meanwhile).
    fn start(config: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        promtool(&["check", "config", config_path.to_str().unwrap()]);
        let log_path = dir.path().join("prometheus.log");
        let (addr, child) = loop {
            let addr = loopback(free_port());
            let mut child = Command::new(which("prometheus"))
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log_path).unwrap())
                .spawn()
                .unwrap();
            let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
            let in_use = Some("address already in use");
            match wait_listening(&mut child, &[addr.port()], "Prometheus", in_use, log) {
                Listening::Yes => break (addr, child),
                Listening::PortTaken => kill(&mut child),
            }
        };
        let prom = Prometheus { addr, child, dir };
        wait_until_or(
            "Prometheus to be ready",
            || request(addr, "GET", "/-/ready", &[], b"").status == 200,
            || prom.log(),
        );
        prom
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path; the JSON answer (Prometheus answers JSON on errors too).
    fn api(&self, path: &str) -> Value {
        let resp = request(self.addr, "GET", path, &[], b"");
        serde_json::from_slice(&resp.body).unwrap_or_else(|e| {
            panic!(
                "{path}: not JSON ({e}), status {}: {}",
                resp.status,
                resp.text()
            )
        })
    }

    /// Evaluates `expr` now: `Ok(result list)`, or `Err` with Prometheus' error.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let v = self.api(&format!("/api/v1/query?query={}", urlencode(expr)));
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        let data = &v["data"];
        match data["resultType"].as_str() {
            Some("vector") | Some("matrix") => Ok(data["result"].as_array().unwrap().clone()),
            // A scalar or string result is one value.
            _ => Ok(vec![data["result"].clone()]),
        }
    }

    /// The alerts Prometheus holds now (pending or firing), as (name, state, labels).
    fn alerts(&self) -> Vec<(String, String, Value)> {
        let v = self.api("/api/v1/alerts");
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap().to_string(),
                    a["state"].as_str().unwrap().to_string(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A dashboard query with Grafana's variables replaced as Grafana would for a 1 s scrape
/// interval and a short time range; any `$` left over is an unknown variable.
fn grafana_to_promql(expr: &str) -> String {
    let mut out = expr.to_string();
    for (var, value) in [
        ("__rate_interval", "1m"),
        ("__interval_ms", "15000"),
        ("__interval", "15s"),
        ("__range_ms", "300000"),
        ("__range_s", "300"),
        ("__range", "5m"),
        ("job", ".+"),
        ("namespace", ".*"),
        ("instance", ".+"),
    ] {
        out = out
            .replace(&format!("${{{var}}}"), value)
            .replace(&format!("${var}"), value);
    }
    assert!(!out.contains('$'), "unknown Grafana variable in {expr}");
    out
}

/// `label_values(metric, label)` as a PromQL query for the same values, and the label.
fn variable_to_promql(query: &str) -> (String, String) {
    let args = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unsupported variable query {query}"));
    let (metric, label) = args.rsplit_once(',').expect("label_values(metric, label)");
    let metric = grafana_to_promql(metric.trim());
    (
        format!("group by ({}) ({metric})", label.trim()),
        label.trim().to_owned(),
    )
}

#[test]
fn a_real_prometheus_scrapes_the_gateway_and_runs_every_dashboard_and_alert_query() {
    // Fail at once, with the install hint, when either tool is missing.
    which("prometheus");
    which("promtool");

    // The gateway reloads only when asked, so the reload counter moves only when the test says.
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    cfg.auth.agents.extend(mix_agents());
    let gw = Gateway::builder(cfg).start();

    // Traffic of every kind the dashboard charts, until the queries have been run.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, proxy) = (stop.clone(), gw.proxy);
        thread::spawn(move || {
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) {
                sent += send_traffic_mix(proxy);
                thread::sleep(Duration::from_millis(100));
            }
            sent
        })
    };

    let prom = Prometheus::start(&scrape_config(gw.admin));
    prom.wait_until("Prometheus to scrape the gateway", || {
        prom.query("up{job=\"agent-gateway\"} == 1")
            .is_ok_and(|r| !r.is_empty())
    });

    // Every dashboard query parses, and returns data once a few scrapes are in.
    let dash = dashboard();
    let queries = dashboard_queries(&dash);
    let mut pending: Vec<(String, String)> = queries
        .iter()
        .map(|q| {
            (
                format!("{} [{}]", q.panel, q.ref_id),
                grafana_to_promql(&q.expr),
            )
        })
        .collect();
    poll_until(
        "every dashboard query to return data",
        || {
            pending.retain(|(what, expr)| match prom.query(expr) {
                Err(e) => panic!("dashboard panel {what}: Prometheus refused\n{expr}\n{e}"),
                Ok(r) => r.is_empty(),
            });
            pending.clone()
        },
        Vec::is_empty,
        |left| {
            let lines: Vec<String> = left.iter().map(|(w, e)| format!("  {w}: {e}")).collect();
            format!("queries without data:\n{}", lines.join("\n"))
        },
    );
    // The variables list this gateway: its job, no namespace outside Kubernetes (where "All"
    // matches series without one), its instance.
    let admin = gw.admin.to_string();
    for q in dashboard_variable_queries(&dash) {
        let (promql, label) = variable_to_promql(&q);
        let want = match label.as_str() {
            "job" => "agent-gateway",
            "namespace" => "",
            "instance" => admin.as_str(),
            other => panic!("unexpected variable over {other}"),
        };
        let r = prom.query(&promql).unwrap();
        assert!(
            r.iter()
                .any(|s| s["metric"][&label].as_str().unwrap_or("") == want),
            "variable {q}: {r:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let sent = traffic.join().expect("traffic thread");
    assert!(sent > 0);

    // Every alert rule is loaded, evaluates without error, and its expression parses.
    let mut rules: Vec<(String, String)> = Vec::new();
    prom.wait_until("every alert rule evaluated", || {
        let v = prom.api("/api/v1/rules?type=alert");
        rules.clear();
        let mut healthy = true;
        for group in v["data"]["groups"].as_array().into_iter().flatten() {
            for r in group["rules"].as_array().into_iter().flatten() {
                let name = r["name"].as_str().unwrap_or_default().to_string();
                assert_ne!(r["health"], "err", "rule {name}: {}", r["lastError"]);
                healthy &= r["health"] == "ok";
                rules.push((name, r["query"].as_str().unwrap_or_default().to_string()));
            }
        }
        healthy && !rules.is_empty()
    });
    let mut names: Vec<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    let mut want = ALERT_NAMES.to_vec();
    want.sort_unstable();
    assert_eq!(names, want, "alert rules loaded from {ALERTS}");
    for (name, expr) in &rules {
        if let Err(e) = prom.query(expr) {
            panic!("alert {name}: Prometheus refused\n{expr}\n{e}");
        }
    }
    // The traffic's blocked agent, past its own sunset too, still calls v1: that, fleet-wide
    // and naming it, is the only alert healthy traffic raises.
    prom.wait_until(
        "AgentGatewayRetiredAgentCallingV1 to fire for \"retired\"",
        || {
            prom.alerts().iter().any(|(name, state, labels)| {
                name == "AgentGatewayRetiredAgentCallingV1"
                    && state == "firing"
                    && labels["agent_id"] == "retired"
            })
        },
    );
    let raised: Vec<(String, String)> = prom
        .alerts()
        .into_iter()
        .map(|(name, _, labels)| (name, labels["agent_id"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert_eq!(
        raised,
        [(
            "AgentGatewayRetiredAgentCallingV1".to_owned(),
            "retired".to_owned()
        )],
        "alerts with a healthy gateway"
    );

    // A refused reload raises AgentGatewayConfigReloadFailed.
    std::fs::write(&gw.config_path, "[listen]\nproxy = \"nonsense\"\n").unwrap();
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(resp.status, 422, "{}", resp.text());
    prom.wait_until("AgentGatewayConfigReloadFailed to fire", || {
        prom.alerts().iter().any(|(name, state, labels)| {
            name == "AgentGatewayConfigReloadFailed"
                && state == "firing"
                && labels["instance"] == gw.admin.to_string().as_str()
        })
    });

    // A gateway that stops answering scrapes makes AgentGatewayDown pending (it fires after
    // its `for: 1m`).
    let admin_addr = gw.admin.to_string();
    drop(gw);
    prom.wait_until("AgentGatewayDown to be pending", || {
        prom.alerts().iter().any(|(name, state, labels)| {
            name == "AgentGatewayDown"
                && state == "pending"
                && labels["instance"] == admin_addr.as_str()
        })
    });
}

// ---------------------------------------------------------------------------------------------
// v1-usage --prometheus: a fleet of two, one restarted
// ---------------------------------------------------------------------------------------------

impl Prometheus {
    /// The value of an expression that yields one series, if it yields one.
    fn value(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        let [one] = result.as_slice() else {
            return None;
        };
        one["value"][1].as_str()?.parse().ok()
    }

    /// Waits until `expr` yields exactly `want`.
    fn wait_for(&self, expr: &str, want: f64) {
        self.wait_until(&format!("{expr} == {want} in Prometheus"), || {
            self.value(expr) == Some(want)
        });
    }

    /// [`wait_until`], with Prometheus' log on failure.
    fn wait_until(&self, what: &str, cond: impl FnMut() -> bool) {
        wait_until_or(what, cond, || format!("Prometheus log:\n{}", self.log()));
    }
}

/// A call through `proxy` by `agent`; its status.
fn call(proxy: SocketAddr, agent: &str, method: &str, path: &str) -> u16 {
    as_agent(proxy, agent, method, path, &[]).status
}

/// `agent-gateway v1-usage --prometheus URL` with `args`: its standard output.
fn v1_usage(prom: &Prometheus, args: &[&str]) -> String {
    let url = format!("http://{}", prom.addr);
    let out = cli(["v1-usage", "--prometheus", &url].iter().chain(args));
    assert!(out.status.success(), "v1-usage failed: {}", show(&out));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn v1_usage_from_prometheus_sums_two_replicas_across_a_restart() {
    which("prometheus");
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    cfg.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
    cfg.auth.agents.extend([
        AgentFile {
            v1_policy: V1Policy::Block,
            sunset_at: Some("2026-06-01T00:00:00Z".into()),
            ..AgentFile::new("blocked", TOKEN)
        },
        AgentFile::new("old", TOKEN),
        AgentFile::new("idle", TOKEN),
    ]);
    // Two replicas of one config, each on ports of its own.
    let a = Gateway::builder(cfg.clone()).start();
    let b = Gateway::builder(cfg).start();
    let (a_proxy, a_admin, b_proxy) = (a.proxy, a.admin, b.proxy);
    let on_a =
        |metric: &str| format!("sum({metric}{{instance=\"{a_admin}\",agent_id!=\"unknown\"}})");
    let everywhere = "sum(agent_gateway_agent_requests_total{agent_id!=\"unknown\"})";

    // Calls served before Prometheus first scrapes the replicas (it is not even running):
    // each replica started inside the window, so its first scrape's values count in full.
    let sent_before = [
        call(a_proxy, "agent-1", "POST", "/api/v1/verify/request"),
        call(a_proxy, "agent-1", "POST", "/api/v1/verify/request"),
        call(a_proxy, "agent-1", "POST", "/api/v1/verify/request"),
        call(a_proxy, "agent-1", "GET", "/api/v1/transaction/t-1/status"),
        call(a_proxy, "agent-1", "POST", "/api/v2/credential/S/offer"),
        call(a_proxy, "agent-1", "POST", "/api/v2/credential/S/offer"),
        call(b_proxy, "agent-1", "POST", "/api/v1/verify/request"),
        call(b_proxy, "old", "POST", "/api/v1/connection/invitation"),
        call(b_proxy, "old", "POST", "/api/v1/connection/invitation"),
        call(b_proxy, "blocked", "POST", "/api/v1/verify/request"),
        call(b_proxy, "blocked", "POST", "/api/v2/verify/S/request"),
    ];
    assert_eq!(
        sent_before,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 410, 200]
    );
    let prom = Prometheus::start(&fleet_scrape_config(&[a_admin, b.admin]));
    prom.wait_for(everywhere, 11.0);

    // Replica a restarts on the same addresses: its counters start again from zero. It serves
    // fewer calls (4) than it had counted (6) before Prometheus scrapes it again, so the drop
    // that marks the restart is seen whether that scrape comes before or after them.
    let a = a.restart();
    let sent_after = [
        call(a.proxy, "agent-1", "POST", "/api/v1/verify/request"),
        call(a.proxy, "agent-1", "POST", "/api/v1/verify/request"),
        call(a.proxy, "old", "POST", "/api/v1/connection/invitation"),
        call(a.proxy, "old", "POST", "/api/v2/verify/response"),
    ];
    assert_eq!(sent_after, [200; 4]);
    prom.wait_for(&on_a("agent_gateway_agent_requests_total"), 4.0);

    let report: Value = serde_json::from_str(&v1_usage(&prom, &["--json"])).unwrap();
    let agents = report["agents"].as_array().unwrap();
    let ids: Vec<&str> = agents
        .iter()
        .map(|a| a["agent_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["agent-1", "blocked", "idle", "old"]);
    let find = |id: &str| agents.iter().find(|a| a["agent_id"] == id).unwrap();
    let counts = |id: &str, version: &str| {
        let all = find(id)[version].as_object().unwrap();
        let mut nonzero: Vec<(String, u64)> = all
            .iter()
            .map(|(op, n)| (op.clone(), n.as_u64().unwrap()))
            .filter(|(_, n)| *n > 0)
            .collect();
        nonzero.sort();
        assert_eq!(all.len(), 5, "every operation, at zero too");
        nonzero
    };
    let ops = |list: &[(&str, u64)]| -> Vec<(String, u64)> {
        list.iter().map(|(o, n)| (o.to_string(), *n)).collect()
    };
    // Exactly what was sent, over both replicas and across a's restart.
    assert_eq!(
        counts("agent-1", "v1_requests"),
        ops(&[("transaction_status", 1), ("verify_request", 6)])
    );
    assert_eq!(
        counts("agent-1", "v2_requests"),
        ops(&[("credential_offer", 2)])
    );
    assert_eq!(
        counts("old", "v1_requests"),
        ops(&[("connection_invitation", 3)])
    );
    assert_eq!(counts("old", "v2_requests"), ops(&[("verify_response", 1)]));
    assert_eq!(
        counts("blocked", "v1_requests"),
        ops(&[("verify_request", 1)])
    );
    assert_eq!(
        counts("blocked", "v2_requests"),
        ops(&[("verify_request", 1)])
    );
    assert_eq!(counts("idle", "v1_requests"), ops(&[]));

    assert_eq!(find("blocked")["v1_policy"], "block");
    assert_eq!(find("blocked")["sunset_at"], "2026-06-01T00:00:00Z");
    assert_eq!(find("old")["v1_policy"], "allow");
    assert_eq!(find("old")["sunset_at"], "2027-06-01T00:00:00Z");
    for id in ["agent-1", "blocked", "old"] {
        let (first, last) = (&find(id)["first_v1_call"], &find(id)["last_v1_call"]);
        assert!(
            first.is_string() && last.is_string(),
            "{id}: {first} {last}"
        );
        assert!(first.as_str() <= last.as_str(), "{id}");
    }
    assert_eq!(find("idle")["last_v1_call"], Value::Null);
    // Prometheus holds seconds of data, not quiet_days: nobody is safe to block, and the
    // report says why.
    assert!(agents.iter().all(|a| a["safe_to_block"] == false));
    assert_eq!(report["quiet_days"], 14);
    let note = report["coverage_note"].as_str().unwrap();
    assert!(note.contains("fewer than quiet_days = 14"), "{note}");

    let table = v1_usage(&prom, &[]);
    let row = |id: &str| -> Vec<String> {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no row for {id} in\n{table}"));
        line.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(&row("agent-1")[..4], ["agent-1", "allow", "7", "2"]);
    assert_eq!(&row("old")[..4], ["old", "allow", "3", "1"]);
    assert_eq!(&row("idle")[..5], ["idle", "allow", "0", "0", "never"]);
    assert!(table.contains("note: Prometheus' data covers"), "{table}");

    // A gateway with retirement.prometheus_url shows the same fleet on its board, and says so.
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.prometheus_url = Some(format!("http://{}", prom.addr));
    cfg.auth
        .agents
        .extend([AgentFile::new("old", TOKEN), AgentFile::new("idle", TOKEN)]);
    let viewer = Gateway::builder(cfg).start();
    let board = admin_get(viewer.admin, "/");
    assert_eq!(board.status, 200);
    let html = board.text();
    assert!(html.contains("<main data-source=\"fleet\">"), "{html}");
    assert!(
        html.contains(&format!(
            "Counts from the fleet: every replica http://{} scrapes, over the last 30 days",
            prom.addr
        )),
        "{html}"
    );
    // The fleet's counts, not the viewer's (which served nothing).
    assert!(board_row(&html, "agent-1")
        .contains("<td class=\"num calling\">7</td><td class=\"num\">2</td>"));
    assert!(board_row(&html, "old")
        .contains("<td class=\"num calling\">3</td><td class=\"num\">1</td>"));
    assert!(
        board_row(&html, "blocked").contains("not configured here"),
        "{}",
        board_row(&html, "blocked")
    );
    assert!(
        html.contains("Safe to block: Prometheus&#39; data covers"),
        "{html}"
    );
}

// ---------------------------------------------------------------------------------------------
// v1-usage --prometheus-selector: one deployment of two in one Prometheus
// ---------------------------------------------------------------------------------------------

#[test]
fn v1_usage_with_a_selector_reports_one_deployment_of_two_that_prometheus_scrapes() {
    which("prometheus");
    let backend = Backend::start();
    let deployment = |agents: [&str; 2]| {
        let mut cfg = test_config(&[backend.addr]);
        cfg.server.watch_config = false;
        cfg.auth
            .agents
            .extend(agents.map(|id| AgentFile::new(id, TOKEN)));
        Gateway::builder(cfg).start()
    };
    // Staging and prod both have "shared", which calls v1 on staging only, and an agent of
    // their own.
    let staging = deployment(["shared", "staging-only"]);
    let prod = deployment(["shared", "prod-only"]);
    let sent = [
        call(staging.proxy, "shared", "POST", "/api/v1/verify/request"),
        call(staging.proxy, "shared", "POST", "/api/v1/verify/request"),
        call(
            staging.proxy,
            "staging-only",
            "POST",
            "/api/v1/verify/request",
        ),
        call(
            prod.proxy,
            "prod-only",
            "POST",
            "/api/v1/connection/invitation",
        ),
        call(prod.proxy, "shared", "POST", "/api/v2/verify/S/request"),
    ];
    assert_eq!(sent, [200; 5]);
    let prom = Prometheus::start(&deployments_scrape_config(&[
        ("staging", staging.admin),
        ("prod", prod.admin),
    ]));
    prom.wait_for(
        "sum(agent_gateway_agent_requests_total{agent_id!=\"unknown\"})",
        5.0,
    );

    let report = |args: &[&str]| -> Value {
        let args: Vec<&str> = ["--json"].iter().chain(args).copied().collect();
        serde_json::from_str(&v1_usage(&prom, &args)).unwrap()
    };
    let ids = |r: &Value| -> Vec<String> {
        let agents = r["agents"].as_array().unwrap().iter();
        agents
            .map(|a| a["agent_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let agent = |r: &Value, id: &str| -> Value {
        let mut agents = r["agents"].as_array().unwrap().iter();
        agents.find(|a| a["agent_id"] == id).unwrap().clone()
    };
    let calls = |r: &Value, id: &str, version: &str| -> u64 {
        let by_operation = agent(r, id)[version].as_object().unwrap().clone();
        by_operation.values().map(|n| n.as_u64().unwrap()).sum()
    };

    // Without a selector, both deployments as one fleet: staging's calls count against
    // "shared" and "staging-only" is listed.
    let both = report(&[]);
    assert_eq!(
        ids(&both),
        [AGENT_ID, "prod-only", "shared", "staging-only"]
    );
    assert_eq!(calls(&both, "shared", "v1_requests"), 2);
    assert!(agent(&both, "shared")["last_v1_call"].is_string());

    // With one, prod alone: its agents, its counts, its calls' times.
    let selector = r#"job="agent-gateway",namespace="prod""#;
    let prod_only = report(&["--prometheus-selector", selector]);
    assert_eq!(ids(&prod_only), [AGENT_ID, "prod-only", "shared"]);
    assert_eq!(calls(&prod_only, "shared", "v1_requests"), 0);
    assert_eq!(calls(&prod_only, "shared", "v2_requests"), 1);
    assert_eq!(calls(&prod_only, "prod-only", "v1_requests"), 1);
    assert_eq!(agent(&prod_only, "shared")["first_v1_call"], Value::Null);
    assert_eq!(agent(&prod_only, "shared")["last_v1_call"], Value::Null);
    assert!(agent(&prod_only, "prod-only")["last_v1_call"].is_string());
    // Braces or none, the same; the table says whose counts it shows.
    let table = v1_usage(
        &prom,
        &["--prometheus-selector", &format!("{{ {selector} }}")],
    );
    assert!(!table.contains("staging-only"), "{table}");
    assert!(
        table.contains(&format!(
            "(every replica http://{} scrapes that matches {{{selector}}}, over the last 30days)",
            prom.addr
        )),
        "{table}"
    );
    // A regular expression accepted here is one Prometheus runs as written.
    let by_regex = report(&[
        "--prometheus-selector",
        r#"job="agent-gateway",namespace=~"pro[d]|x\\d+""#,
    ]);
    assert_eq!(ids(&by_regex), ids(&prod_only));
    // What is not label matchers is refused before any query.
    let url = format!("http://{}", prom.addr);
    let out = cli([
        "v1-usage",
        "--prometheus",
        &url,
        "--prometheus-selector",
        r#"namespace=~"pro(""#,
    ]);
    assert!(!out.status.success(), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "the value of namespace is not a regular expression (at character 12): unclosed group"
        ),
        "{}",
        show(&out)
    );
    let out = cli([
        "v1-usage",
        "--prometheus",
        &url,
        "--prometheus-selector",
        r#"namespace="prod"} or vector(1)"#,
    ]);
    assert!(!out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--prometheus-selector")
            && stderr.contains("expected `,` or the end, found `}` (at character 17)"),
        "{stderr}"
    );

    // A gateway with retirement.prometheus_selector shows prod alone on its board.
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.prometheus_url = Some(url.clone());
    cfg.retirement.prometheus_selector = Some(selector.into());
    let viewer = Gateway::builder(cfg).start();
    let board = admin_get(viewer.admin, "/");
    assert_eq!(board.status, 200);
    let html = board.text();
    assert!(html.contains("<main data-source=\"fleet\">"), "{html}");
    assert!(
        html.contains(&format!(
            "Counts from the fleet: every replica {url} scrapes that matches \
             {{job=&quot;agent-gateway&quot;,namespace=&quot;prod&quot;}}, over the last 30 days"
        )),
        "{html}"
    );
    assert!(!html.contains("staging-only"), "{html}");
    assert!(board_row(&html, "prod-only")
        .contains("<td class=\"num calling\">1</td><td class=\"num\">0</td>"));
    assert!(board_row(&html, "shared").contains("<td class=\"num\">0</td><td class=\"num\">1</td>"));
}
