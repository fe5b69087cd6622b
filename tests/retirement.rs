//! Retiring v1 against real processes: signal headers, policies, brownouts, sunset,
//! `/v1-usage` and the `v1-usage` command, and policy changes on hot reload.

mod common;

use std::process::Command;
use std::time::{Duration, SystemTime};

use agent_gateway::config::file::{AgentFile, BrownoutFile};
use agent_gateway::config::testing::TOKEN;
use agent_gateway::config::V1Policy;
use common::*;

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Agent `id` (token [`TOKEN`]) with v1 policy `policy`.
fn agent(id: &str, policy: V1Policy) -> AgentFile {
    AgentFile {
        v1_policy: policy,
        ..AgentFile::new(id, TOKEN)
    }
}

/// A brownout from `start` to `end` for every agent that is not exempt.
fn brownout(start: SystemTime, end: SystemTime, percent: Option<u8>) -> BrownoutFile {
    BrownoutFile {
        start: rfc3339(start),
        end: rfc3339(end),
        percent,
        agents: None,
    }
}

fn as_agent(
    gw: &Gateway,
    id: &str,
    method: &str,
    path: &str,
    request_id: Option<&str>,
) -> Response {
    let mut h = vec![
        ("X-Service-Agent-Id", id),
        ("X-Auth-Token", TOKEN),
        ("Content-Type", "application/json"),
    ];
    if let Some(r) = request_id {
        h.push(("X-Request-Id", r));
    }
    request(
        gw.proxy,
        method,
        path,
        &h,
        if method == "POST" {
            BODY.as_bytes()
        } else {
            b""
        },
    )
}

#[test]
fn v1_responses_carry_the_deprecation_signals_and_v2_ones_do_not() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.deprecated_at = Some("2026-06-01T00:00:00Z".into());
    cfg.retirement.sunset_at = Some("2027-06-01T00:00:00Z".into());
    cfg.retirement.link = Some("https://example.org/agent-api/v2".into());
    let gw = Gateway::builder(cfg).start();
    let v1 = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(v1.status, 200);
    assert_eq!(v1.header("deprecation"), Some("@1780272000"));
    assert_eq!(v1.header("sunset"), Some("Tue, 01 Jun 2027 00:00:00 GMT"));
    assert_eq!(
        v1.header("link"),
        Some("<https://example.org/agent-api/v2>; rel=\"deprecation\", <https://example.org/agent-api/v2>; rel=\"sunset\"")
    );
    // The gateway's own answers to v1 calls carry them too.
    let refused = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &[],
        BODY.as_bytes(),
    );
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("deprecation"), Some("@1780272000"));

    let v2 = post(gw.proxy, "/api/v2/verify/S/request", BODY);
    assert_eq!(v2.status, 200);
    for h in ["deprecation", "sunset", "link"] {
        assert_eq!(v2.header(h), None, "{h} on a v2 response");
    }
}

#[test]
fn blocked_agents_get_410_naming_the_v2_path_and_nothing_is_forwarded() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("legacy", V1Policy::Block));
    let gw = Gateway::builder(cfg).start();
    let cases = [
        (
            "POST",
            "/api/v1/verify/request",
            "use POST /api/v2/verify/{service_business_code}/request instead",
        ),
        (
            "POST",
            "/api/v1/verify/response",
            "use POST /api/v2/verify/response instead",
        ),
        (
            "POST",
            "/api/v1/connection/invitation",
            "use POST /api/v2/connection/{service_business_code}/invitation instead",
        ),
        (
            "POST",
            "/api/v1/credential/offer",
            "use POST /api/v2/credential/{service_business_code}/offer instead",
        ),
        (
            "GET",
            "/api/v1/transaction/t/status",
            "use GET /api/v2/transaction/{transaction_id}/status instead",
        ),
    ];
    for (method, path, hint) in cases {
        let resp = as_agent(&gw, "legacy", method, path, None);
        assert_eq!(resp.status, 410, "{path}");
        let body = resp.json();
        assert_eq!(body["status_code"], 410);
        assert_eq!(body["message_code"], 41001);
        assert!(body["message"].as_str().unwrap().ends_with(hint), "{body}");
    }
    assert_eq!(backend.count(), 0);
    // v2 is unaffected; other agents too.
    assert_eq!(
        as_agent(&gw, "legacy", "POST", "/api/v2/verify/S/request", None).status,
        200
    );
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
    assert_eq!(
        gw.metric("agent_gateway_v1_refusals_total{agent_id=\"legacy\",reason=\"blocked\"}"),
        5.0
    );
}

#[test]
fn a_brownout_window_refuses_with_retry_after_and_spares_exempt_agents() {
    let backend = Backend::start();
    let now = SystemTime::now();
    let end = now + Duration::from_secs(3600);
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("vip", V1Policy::Exempt));
    cfg.auth.agents.push(agent("plain", V1Policy::Allow));
    let started = now - Duration::from_secs(3600);
    cfg.retirement.brownouts.push(brownout(started, end, None));
    let gw = Gateway::builder(cfg).start();
    let resp = as_agent(&gw, "plain", "POST", "/api/v1/verify/request", None);
    assert_eq!(resp.status, 410);
    assert_eq!(resp.json()["message_code"], 41002);
    assert_eq!(
        resp.header("retry-after"),
        Some(httpdate::fmt_http_date(end).as_str())
    );
    assert_eq!(
        as_agent(&gw, "vip", "POST", "/api/v1/verify/request", None).status,
        200
    );
    assert_eq!(
        as_agent(&gw, "plain", "POST", "/api/v2/verify/S/request", None).status,
        200
    );
    assert_eq!(backend.count(), 2);
    assert_eq!(
        gw.metric("agent_gateway_v1_refusals_total{agent_id=\"plain\",reason=\"brownout\"}"),
        1.0
    );
}

#[test]
fn a_partial_brownout_answers_the_same_request_id_the_same_way() {
    let backend = Backend::start();
    let now = SystemTime::now();
    let mut cfg = test_config(&[backend.addr]);
    let (start, end) = (
        now - Duration::from_secs(60),
        now + Duration::from_secs(3600),
    );
    cfg.retirement
        .brownouts
        .push(brownout(start, end, Some(50)));
    let gw = Gateway::builder(cfg).start();
    let mut refused = 0;
    for i in 0..40 {
        let id = format!("retry-me-{i}");
        let first = as_agent(&gw, "agent-1", "POST", "/api/v1/verify/request", Some(&id)).status;
        let again = as_agent(&gw, "agent-1", "POST", "/api/v1/verify/request", Some(&id)).status;
        assert_eq!(first, again, "{id} answered differently on retry");
        if first == 410 {
            refused += 1;
        }
    }
    assert!(
        (8..=32).contains(&refused),
        "about half of 40 ids should be refused, got {refused}"
    );
}

#[test]
fn sunset_is_enforced_only_when_configured() {
    let backend = Backend::start();
    let past = rfc3339(SystemTime::now() - Duration::from_secs(86_400));
    let mut lenient = test_config(&[backend.addr]);
    lenient.retirement.sunset_at = Some(past.clone());
    let gw = Gateway::builder(lenient).start();
    assert_eq!(
        post(gw.proxy, "/api/v1/verify/request", BODY).status,
        200,
        "no cut-off by a clock alone"
    );
    drop(gw);
    let mut strict = test_config(&[backend.addr]);
    strict.retirement.sunset_at = Some(past);
    strict.auth.agents.push(agent("vip", V1Policy::Exempt));
    strict.retirement.enforce_sunset = true;
    let gw = Gateway::builder(strict).start();
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(
        (resp.status, resp.json()["message_code"].as_i64()),
        (410, Some(41003))
    );
    assert_eq!(
        as_agent(&gw, "vip", "POST", "/api/v1/verify/request", None).status,
        200
    );
    assert_eq!(post(gw.proxy, "/api/v2/verify/S/request", BODY).status, 200);
}

#[test]
fn a_policy_change_applies_on_hot_reload() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("moving", V1Policy::Allow));
    let gw = Gateway::builder(cfg).start();
    let with_policy = |policy| {
        let mut cfg = gw.config.clone();
        cfg.agent_mut("moving").v1_policy = policy;
        cfg.to_toml()
    };
    assert_eq!(
        as_agent(&gw, "moving", "POST", "/api/v1/verify/request", None).status,
        200
    );
    std::fs::write(&gw.config_path, with_policy(V1Policy::Block)).unwrap();
    wait_until(2, "the block to apply", || {
        as_agent(&gw, "moving", "POST", "/api/v1/verify/request", None).status == 410
    });
    std::fs::write(&gw.config_path, with_policy(V1Policy::Exempt)).unwrap();
    wait_until(2, "the exemption to apply", || {
        as_agent(&gw, "moving", "POST", "/api/v1/verify/request", None).status == 200
    });
}

#[test]
fn v1_usage_reports_a_known_mix() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent("old", V1Policy::Allow));
    cfg.auth.agents.push(agent("new", V1Policy::Block));
    cfg.retirement.quiet_days = 0;
    let gw = Gateway::builder(cfg).start();
    for _ in 0..3 {
        as_agent(&gw, "old", "POST", "/api/v1/verify/request", None);
    }
    as_agent(&gw, "old", "GET", "/api/v1/transaction/t/status", None);
    as_agent(&gw, "old", "POST", "/api/v2/credential/S/offer", None);
    as_agent(&gw, "new", "POST", "/api/v2/verify/S/request", None);
    as_agent(&gw, "new", "POST", "/api/v1/verify/response", None); // refused, still a v1 call

    let report = get(gw.admin, "/v1-usage").json();
    let agents = report["agents"].as_array().unwrap();
    let find = |id: &str| agents.iter().find(|a| a["agent_id"] == id).unwrap().clone();
    let old = find("old");
    assert_eq!(old["v1_requests"]["verify_request"], 3);
    assert_eq!(old["v1_requests"]["transaction_status"], 1);
    assert_eq!(old["v2_requests"]["credential_offer"], 1);
    assert_eq!(old["v1_policy"], "allow");
    assert!(old["first_v1_call"].is_string() && old["last_v1_call"].is_string());
    let new = find("new");
    assert_eq!(new["v1_policy"], "block");
    assert_eq!(new["v1_requests"]["verify_response"], 1);
    assert_eq!(new["v2_requests"]["verify_request"], 1);
    // agent-1 made no call at all: with quiet_days = 0 it is safe to block.
    assert_eq!(find("agent-1")["safe_to_block"], true);
    assert_eq!(find("agent-1")["last_v1_call"], serde_json::Value::Null);
    assert!(gw.metric("agent_gateway_v1_last_seen_timestamp_seconds{agent_id=\"old\"}") > 1.7e9);

    let out = Command::new(BIN)
        .args(["v1-usage", "--admin", &format!("http://{}", gw.admin)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("AGENT"), "{table}");
    let old_row = table
        .lines()
        .find(|l| l.starts_with("old "))
        .expect("a row for old");
    let cells: Vec<&str> = old_row.split_whitespace().collect();
    assert_eq!(&cells[..4], &["old", "allow", "4", "1"]);
}
