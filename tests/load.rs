//! `agent-gateway load` against a real gateway in front of the mock v2 backend: both models,
//! both API versions, the JSON report, and errors counted by status.

mod common;

use std::process::Command;

use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use common::*;

fn load(gw: &Gateway, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("load")
        .args(["--target", &format!("http://{}", gw.proxy)])
        .args(["--agent-id", AGENT_ID, "--token", TOKEN, "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every answer a 200: status reads only ask for transaction ids the backend issued.
fn assert_all_ok(r: &serde_json::Value) {
    assert_eq!(r["statuses"]["200"], r["responses"], "{r}");
    assert_eq!(r["errors"]["total"], 0, "{r}");
}

#[test]
fn an_open_model_run_sends_on_schedule_and_reports_percentiles() {
    let mock = MockBackend::start();
    let gw = Gateway::start(&[mock.addr]);
    let r = load(
        &gw,
        &["--rate", "200", "--duration", "1s", "--connections", "4"],
    );
    assert_eq!(r["model"], "open");
    assert_eq!(r["latency_from"], "intended start");
    assert_eq!(r["responses"], 200, "{r}");
    // Status reads ask only for transactions this run created, so all is 200.
    assert_all_ok(&r);
    let ms = &r["latency_ms"];
    for (lo, hi) in [
        ("p50", "p90"),
        ("p90", "p99"),
        ("p99", "p99_9"),
        ("p99_9", "max"),
    ] {
        assert!(ms[lo].as_f64().unwrap() <= ms[hi].as_f64().unwrap(), "{ms}");
    }
    // Every operation of the default mix was exercised, and the gateway saw each request.
    let ops = r["operations"].as_object().unwrap();
    assert_eq!(ops.len(), 5, "{ops:?}");
    for op in ["verify_request", "transaction_status"] {
        let counted = gw.metric(&format!(
            "agent_gateway_requests_total{{api_version=\"v1\",code=\"200\",operation=\"{op}\"}}"
        ));
        assert_eq!(counted, ops[op].as_f64().unwrap(), "{op}");
    }
}

#[test]
fn a_closed_model_run_on_v2_counts_refusals_by_status() {
    let mock = MockBackend::start();
    let mut cfg = test_config(&[mock.addr]);
    let agent = cfg.agent_mut(AGENT_ID);
    agent.rate_limit_per_second = Some(50.0);
    agent.burst = Some(5);
    let gw = Gateway::builder(cfg).start();
    let r = load(
        &gw,
        &[
            "--rate",
            "max",
            "--duration",
            "1s",
            "--connections",
            "2",
            "--api",
            "v2",
            "--service",
            "SVC",
        ],
    );
    assert_eq!(r["model"], "closed");
    let ok = r["statuses"]["200"].as_u64().unwrap_or(0);
    let limited = r["statuses"]["429"].as_u64().unwrap_or(0);
    assert!(ok > 0 && limited > 0, "{r}");
    assert_eq!(r["errors"]["by_status"]["429"].as_u64(), Some(limited));
    assert_eq!(r["responses"].as_u64(), Some(ok + limited));
}
