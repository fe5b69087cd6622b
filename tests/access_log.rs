//! The logs, against real processes: tokens kept out of every log line, and the access log's
//! fields for every kind of answer.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use agent_gateway::config::file::AgentFile;
use common::*;

/// Extra request header lines.
type Headers<'a> = &'a [(&'a str, &'a str)];

#[test]
fn the_token_never_appears_in_the_log_even_at_trace_level() {
    const TOKEN: &str = "tok-Zq81-ZEBRA-7f3c-never-log-me";
    const WRONG: &str = "tok-Wr0ng-OKAPI-91ad-never-log-me";
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(AgentFile::new("tracer", TOKEN));
    let gw = Gateway::builder(cfg).log_level("trace").start();
    let p = gw.proxy;
    let good = [
        ("X-Service-Agent-Id", "tracer"),
        ("X-Auth-Token", TOKEN),
        ("Content-Type", "application/json"),
    ];
    let wrong = [("X-Service-Agent-Id", "tracer"), ("X-Auth-Token", WRONG)];
    let stranger = [("X-Service-Agent-Id", "stranger"), ("X-Auth-Token", TOKEN)];
    let anonymous = [("X-Auth-Token", TOKEN)];
    let cases: [(&str, &str, Headers, u16); 8] = [
        ("POST", "/api/v1/verify/request", &good, 200),
        ("GET", "/api/v2/transaction/tx-9/status", &good, 200),
        ("POST", "/api/v2/credential/SVC/offer", &good, 200),
        ("POST", "/api/v1/verify/request", &wrong, 401),
        ("POST", "/api/v1/verify/request", &stranger, 401),
        ("POST", "/api/v2/verify/response", &anonymous, 401),
        ("POST", "/not/an/operation", &good, 404),
        ("GET", "/api/v1/credential/offer", &good, 405),
    ];
    for (method, path, headers, want) in cases {
        let body: &[u8] = match path {
            "/api/v1/verify/request" => VERIFY_BODY.as_bytes(),
            "/api/v2/credential/SVC/offer" => OFFER_BODY.as_bytes(),
            _ if method == "POST" => b"{}",
            _ => b"",
        };
        let resp = request(p, method, path, headers, body);
        assert_eq!(resp.status, want, "{method} {path}");
    }
    assert_eq!(backend.count(), 3);
    gw.wait_for_access_log(cases.len());
    let log = gw.log();
    assert!(
        log.lines().any(|l| l.contains("\"level\":\"TRACE\"")),
        "RUST_LOG=trace did not take effect"
    );
    let metrics = gw.scrape();
    assert!(!metrics.contains(TOKEN) && !metrics.contains(WRONG));
    let leaks: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(TOKEN) || l.contains(WRONG))
        .collect();
    let sources: BTreeSet<String> = leaks
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| format!("{} {}", v["level"], v["target"]))
        .collect();
    assert!(
        leaks.is_empty(),
        "{} log line(s) carry an X-Auth-Token value, from {sources:?}, e.g.:\n{}",
        leaks.len(),
        leaks[0].chars().take(600).collect::<String>()
    );
}

/// The fields every access-log line carries (`upstream_ms` only when the backend answered).
const ACCESS_FIELDS: [&str; 13] = [
    "timestamp",
    "request_id",
    "method",
    "path",
    "upstream_path",
    "api_version",
    "operation",
    "agent_id",
    "status",
    "duration_ms",
    "bytes_in",
    "bytes_out",
    "auth",
];

/// One request of the access-log test and the line it must produce.
struct Logged {
    method: &'static str,
    /// The request target, query included.
    target: &'static str,
    agent: Option<&'static str>,
    body: &'static str,
    status: u16,
    upstream_path: &'static str,
    api_version: &'static str,
    operation: &'static str,
    /// `agent_id` in the log: configured agents that were identified, else empty.
    agent_id: &'static str,
    auth: &'static str,
    /// Whether the gateway read the body (it counts in `bytes_in`).
    body_read: bool,
}

#[test]
fn every_access_log_line_is_json_with_the_documented_fields() {
    let backend = backend_with_reset();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(agent_2());
    cfg.auth.agents.extend(mix_agents());
    let gw = Gateway::builder(cfg).start();
    let case = |method, target, agent, body, status| Logged {
        method,
        target,
        agent,
        body,
        status,
        upstream_path: "",
        api_version: "",
        operation: "",
        agent_id: "",
        auth: "",
        body_read: false,
    };
    let cases = [
        Logged {
            upstream_path: "/api/v2/verify/ORG_DEFAULT/request",
            api_version: "v1",
            operation: "verify_request",
            agent_id: "agent-1",
            auth: "ok",
            body_read: true,
            ..case(
                "POST",
                "/api/v1/verify/request",
                Some("agent-1"),
                VERIFY_BODY,
                200,
            )
        },
        Logged {
            upstream_path: "/api/v2/transaction/tx-1/status",
            api_version: "v2",
            operation: "transaction_status",
            agent_id: "agent-1",
            auth: "ok",
            ..case(
                "GET",
                "/api/v2/transaction/tx-1/status?session=QUERY-MARK-5521",
                Some("agent-1"),
                "",
                200,
            )
        },
        Logged {
            api_version: "v1",
            operation: "credential_offer",
            auth: "missing_headers",
            ..case("POST", "/api/v1/credential/offer", None, OFFER_BODY, 401)
        },
        Logged {
            api_version: "v2",
            operation: "verify_response",
            auth: "unknown_agent",
            ..case("POST", "/api/v2/verify/response", Some("nobody"), "{}", 401)
        },
        Logged {
            api_version: "v2",
            operation: "verify_request",
            agent_id: "agent-2",
            auth: "service_not_allowed",
            ..case(
                "POST",
                "/api/v2/verify/OTHER/request",
                Some("agent-2"),
                VERIFY_BODY,
                401,
            )
        },
        Logged {
            api_version: "none",
            operation: "unmatched",
            auth: "not_required",
            ..case("POST", "/nope", Some("agent-1"), "{}", 404)
        },
        // A wrong method on a v1 path is still a v1 call of that operation.
        Logged {
            api_version: "v1",
            operation: "verify_request",
            auth: "not_required",
            ..case("GET", "/api/v1/verify/request", Some("agent-1"), "", 405)
        },
        Logged {
            upstream_path: "/api/v2/credential/RESET/offer",
            api_version: "v2",
            operation: "credential_offer",
            agent_id: "agent-1",
            auth: "ok",
            body_read: true,
            ..case(
                "POST",
                "/api/v2/credential/RESET/offer",
                Some("agent-1"),
                OFFER_BODY,
                502,
            )
        },
        Logged {
            api_version: "v1",
            operation: "connection_invitation",
            agent_id: "retired",
            auth: "ok",
            ..case(
                "POST",
                "/api/v1/connection/invitation",
                Some("retired"),
                INVITATION_BODY,
                410,
            )
        },
        Logged {
            api_version: "v2",
            operation: "verify_request",
            agent_id: "agent-1",
            auth: "ok",
            body_read: true,
            ..case(
                "POST",
                "/api/v2/verify/S/request",
                Some("agent-1"),
                "{}",
                400,
            )
        },
        Logged {
            upstream_path: "/api/v2/transaction/t1/status",
            api_version: "v2",
            operation: "transaction_status",
            agent_id: "throttled",
            auth: "ok",
            ..case(
                "GET",
                "/api/v2/transaction/t1/status",
                Some("throttled"),
                "",
                200,
            )
        },
        Logged {
            api_version: "v2",
            operation: "transaction_status",
            agent_id: "throttled",
            auth: "ok",
            ..case(
                "GET",
                "/api/v2/transaction/t2/status",
                Some("throttled"),
                "",
                429,
            )
        },
    ];
    let mut answers = Vec::new();
    for c in &cases {
        let headers = c.agent.map(agent_headers);
        let headers: &[(&str, &str)] = headers.as_ref().map_or(&[], |h| &h[..]);
        let resp = request(gw.proxy, c.method, c.target, headers, c.body.as_bytes());
        assert_eq!(resp.status, c.status, "{} {}", c.method, c.target);
        answers.push(resp);
    }
    let access = gw.wait_for_access_log(cases.len());

    // Every line the gateway writes is one JSON object.
    let log = gw.log();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(v.is_object(), "{line}");
    }

    let by_id: BTreeMap<&str, &serde_json::Value> = access
        .iter()
        .map(|l| (l["request_id"].as_str().expect("request_id"), l))
        .collect();
    assert_eq!(by_id.len(), cases.len(), "request ids are unique");
    // Every mismatch of every line, so one run shows them all.
    let mut problems: Vec<String> = Vec::new();
    // A query string may carry data that must not be logged (see `Exchange::client_path`):
    // the access log has paths only, the client's and the upstream one.
    for l in &access {
        if l.to_string().contains("QUERY-MARK") {
            problems.push(format!("a query string is logged: {l}"));
        }
    }
    for (c, resp) in cases.iter().zip(&answers) {
        let id = resp.header("x-request-id").expect("x-request-id");
        let line = by_id
            .get(id)
            .unwrap_or_else(|| panic!("no access line for {} {} ({id})", c.method, c.target));
        let mut check = |ok: bool, what: String| {
            if !ok {
                problems.push(format!(
                    "{} {} ({}): {what}\n    {line}",
                    c.method, c.target, c.status
                ));
            }
        };
        for field in ACCESS_FIELDS {
            check(!line[field].is_null(), format!("field {field} missing"));
        }
        let ts = line["timestamp"].as_str().unwrap_or_default();
        check(
            ts.len() > 20 && ts.as_bytes()[10] == b'T' && ts.ends_with('Z'),
            format!("timestamp {ts:?} is not RFC 3339 UTC"),
        );
        let want = serde_json::json!({
            "method": c.method,
            "path": c.target.split('?').next().unwrap(),
            "upstream_path": c.upstream_path,
            "api_version": c.api_version,
            "operation": c.operation,
            "agent_id": c.agent_id,
            "status": c.status,
            "auth": c.auth,
            "level": "INFO",
            "bytes_in": if c.body_read { c.body.len() } else { 0 },
            "bytes_out": resp.body.len(),
        });
        for (k, v) in want.as_object().unwrap() {
            check(line[k] == *v, format!("{k} is {}, expected {v}", line[k]));
        }
        let duration = line["duration_ms"].as_f64().unwrap_or(-1.0);
        check(duration >= 0.0, "duration_ms is not a number >= 0".into());
        // upstream_ms: the backend's time, present exactly when the backend answered.
        let answered = c.status == 200;
        match line.get("upstream_ms").filter(|v| !v.is_null()) {
            Some(ms) => {
                check(
                    answered,
                    "upstream_ms on an answer the backend did not give".into(),
                );
                let ms = ms.as_f64().unwrap_or(-1.0);
                check(
                    (0.0..=duration).contains(&ms),
                    format!("upstream_ms {ms} outside 0..=duration_ms"),
                );
            }
            None => check(
                !answered,
                "no upstream_ms though the backend answered".into(),
            ),
        }
    }
    assert!(
        problems.is_empty(),
        "{} access-log problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// A log sink that stops reading holds up no request: once the pipe and the log buffer are
/// full, lines are dropped and counted, and what did reach the sink is whole lines.
#[test]
fn a_stalled_log_sink_drops_and_counts_lines_and_never_holds_up_a_request() {
    let backend = Backend::start();
    let mut gw = Gateway::builder(test_config(&[backend.addr]))
        .stderr_unread()
        .start();
    let dropped = "agent_gateway_log_lines_dropped_total";
    assert_eq!(gw.metric(dropped), 0.0);
    // At the harness's RUST_LOG=debug a request logs several lines: the 64 KiB pipe and the
    // 1 MiB buffer fill within a few thousand requests, each still answered.
    let mut c = Connection::open(gw.proxy);
    let request = format!(
        "{}\r\n",
        auth_head("GET", "/api/v1/transaction/tx-1/status")
    );
    let mut sent = 0;
    while gw.metric(dropped) == 0.0 {
        assert!(sent < 40_000, "{sent} requests and no line dropped");
        for _ in 0..500 {
            c.send(&request);
            assert_eq!(c.response().status, 200, "request {sent}");
            sent += 1;
        }
    }
    // Read again, then stop: what is buffered is written out before the process exits, and
    // whole lines come out of a sink that stalled mid-batch.
    let mut stderr = gw.take_stderr();
    let reader = std::thread::spawn(move || {
        let mut written = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut written).map(|_| written)
    });
    gw.terminate();
    assert!(gw.wait_exit().success());
    let written = reader.join().unwrap().unwrap();
    let lines: Vec<&str> = written.lines().collect();
    assert!(
        lines.len() > 100,
        "only {} lines reached the pipe",
        lines.len()
    );
    for line in lines {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("a torn line ({e}): {line}"));
    }
}
