//! REDbot, Mark Nottingham's HTTP linter (a client nobody here wrote), on each kind of answer
//! the gateway gives: its own refusals (400, 401, 404, 405, 410, 413, 414, 415, 429), a v1 and
//! a v2 answer relayed from the mock backend, and every admin endpoint. Every note it rates a
//! warning or worse must be one docs/hardening.md explains ("What an HTTP linter says"); any
//! other fails the test, with REDbot's summary.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::V1Policy;
use common::python::venv_bin;
use common::*;
use serde_json::{json, Value};

const HARDENING: &str = include_str!("../docs/hardening.md");

/// The warnings docs/hardening.md explains: the note, and the status it may come with (0: any).
const EXPLAINED: [(&str, u16); 3] = [
    // Every v1 answer: v1 is deprecated, and its Deprecation header says so.
    ("DEPRECATION_PAST", 0),
    // REDbot rates the status of the answer to its own request, made bad on purpose here.
    ("STATUS_BAD_REQUEST", 400),
    ("STATUS_URI_TOO_LONG", 414),
];

/// REDbot's verdict on each of `requests` (`{"url", "method", "headers", "body"}`), in order.
fn redbot(requests: &[Value]) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/redbot_check.py");
    let mut child = Command::new("timeout")
        .arg("120")
        .arg(venv_bin().join("python"))
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = serde_json::to_vec(requests).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "redbot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn call(url: String, method: &str, headers: &[(&str, &str)], body: &str) -> Value {
    json!({"url": url, "method": method, "headers": headers, "body": body})
}

#[test]
fn redbot_warns_of_nothing_that_is_not_explained() {
    let mock = MockBackend::start();
    let mut cfg = test_config(&[mock.addr]);
    cfg.retirement.deprecated_at = Some("2026-01-01T00:00:00Z".into());
    cfg.retirement.sunset_at = Some("2030-01-01T00:00:00Z".into());
    cfg.limits.max_body_bytes = 80;
    cfg.limits.max_uri_bytes = 128;
    let mut blocked = AgentFile::new("blocked", TOKEN);
    blocked.v1_policy = V1Policy::Block;
    let mut throttled = AgentFile::new("throttled", TOKEN);
    throttled.rate_limit_per_second = Some(0.001);
    throttled.burst = Some(1);
    cfg.auth.agents.extend([blocked, throttled]);
    let gw = Gateway::builder(cfg).start();
    gw.wait_until("readiness", || admin_get(gw.admin, "/readyz").status == 200);
    // The throttled agent's one request of its burst: REDbot's is over the limit.
    let first = as_agent(
        gw.proxy,
        "throttled",
        "POST",
        "/api/v2/verify/ORG_DEFAULT/request",
        &[],
    );
    assert_eq!(first.status, 200);

    let proxy = |path: &str| format!("http://{}{path}", gw.proxy);
    let admin = |path: &str| format!("http://{}{path}", gw.admin);
    let agent = |id: &'static str| [("X-Service-Agent-Id", id), ("X-Auth-Token", TOKEN)];
    let json_type = ("Content-Type", "application/json");
    let [id, token] = agent(AGENT_ID);
    let with_json = [id, token, json_type];
    let v1_verify = proxy("/api/v1/verify/request");
    let cases: Vec<(u16, Value)> = vec![
        (200, call(v1_verify.clone(), "POST", &with_json, BODY)),
        (
            200,
            call(
                proxy("/api/v2/verify/ORG_DEFAULT/request"),
                "POST",
                &with_json,
                BODY,
            ),
        ),
        (
            400,
            call(
                proxy("/api/v1/transaction/a%00b/status"),
                "GET",
                &[id, token],
                "",
            ),
        ),
        (
            401,
            call(proxy("/api/v1/transaction/tx-1/status"), "GET", &[], ""),
        ),
        (404, call(proxy("/nothing/here"), "GET", &[], "")),
        (405, call(v1_verify.clone(), "GET", &[], "")),
        (
            410,
            call(
                v1_verify.clone(),
                "POST",
                &[agent("blocked")[0], agent("blocked")[1], json_type],
                BODY,
            ),
        ),
        (
            413,
            call(v1_verify.clone(), "POST", &with_json, &"x".repeat(200)),
        ),
        (
            414,
            call(
                proxy(&format!("/api/v1/transaction/{}/status", "t".repeat(200))),
                "GET",
                &[],
                "",
            ),
        ),
        (415, call(v1_verify.clone(), "POST", &[id, token], BODY)),
        (
            429,
            call(
                proxy("/api/v2/verify/ORG_DEFAULT/request"),
                "POST",
                &[agent("throttled")[0], agent("throttled")[1], json_type],
                BODY,
            ),
        ),
        (200, call(admin("/metrics"), "GET", &[], "")),
        (200, call(admin("/healthz"), "GET", &[], "")),
        (200, call(admin("/readyz"), "GET", &[], "")),
        (200, call(admin("/v1-usage"), "GET", &[], "")),
        (200, call(admin("/openapi.json"), "GET", &[], "")),
        (200, call(admin("/config"), "GET", &[], "")),
        (200, call(admin("/"), "GET", &[], "")),
        (404, call(admin("/nothing"), "GET", &[], "")),
    ];
    let requests: Vec<Value> = cases.iter().map(|(_, r)| r.clone()).collect();
    let verdicts = redbot(&requests);

    let mut unexplained = Vec::new();
    for ((status, request), verdict) in cases.iter().zip(&verdicts) {
        let what = format!("{} {}", request["method"], request["url"]);
        assert_eq!(verdict["status"], *status, "{what}: {verdict}");
        for note in verdict["notes"].as_array().unwrap() {
            let level = note["level"].as_str().unwrap();
            let id = note["id"].as_str().unwrap();
            if matches!(level, "GOOD" | "INFO") {
                continue;
            }
            let explained = EXPLAINED
                .iter()
                .any(|(e, with)| *e == id && (*with == 0 || with == status));
            if !explained {
                unexplained.push(format!("{what}: {level} {id}: {}", note["summary"]));
            }
        }
        if request["url"]
            .as_str()
            .unwrap()
            .contains(&gw.admin.to_string())
        {
            let ids: Vec<&str> = verdict["notes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["id"].as_str().unwrap())
                .collect();
            assert!(ids.contains(&"STORE_NO_STORE"), "{what}: {ids:?}");
        }
    }
    assert!(
        unexplained.is_empty(),
        "unexplained:\n{}",
        unexplained.join("\n")
    );
    for (id, _) in EXPLAINED {
        assert!(
            HARDENING.contains(id),
            "docs/hardening.md does not explain {id}"
        );
    }
}
