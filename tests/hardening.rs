//! Bad input, hostile clients and failing backends against real processes. Every row of the
//! bad-input table in `docs/hardening.md` is backed by a test here or in `tests/gateway.rs`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::ValidationMode;
use common::paused::{self, PausedBackend, PausedGateway};
use common::*;

#[test]
fn each_schema_rule_gets_400_naming_field_and_rule_and_nothing_is_forwarded() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let cases = [
        ("/api/v1/verify/request", "not json", "rule not_json"),
        ("/api/v1/verify/request", "[1,2]", "rule not_object"),
        ("/api/v1/verify/request", "{}", "business_code"),
        (
            "/api/v2/verify/S/request",
            r#"{"business_code":7}"#,
            "rule type",
        ),
        (
            "/api/v1/verify/request",
            r#"{"business_code":"B","connection_id":"c","allow_multiple_read":true}"#,
            "rule allow_multiple_read_with_connection",
        ),
        (
            "/api/v1/connection/invitation",
            r#"{"allow_multiple_read":true}"#,
            "organization_name",
        ),
        (
            "/api/v1/credential/offer",
            r#"{"organization_name":"O"}"#,
            "credential_def_id",
        ),
        (
            "/api/v1/credential/offer",
            r#"{"organization_name":"O","credential_def_id":"D","connection_id":"c"}"#,
            "rule credential_values_required",
        ),
        (
            "/api/v2/credential/S/offer",
            r#"{"organization_name":"O","credential_def_id":"D","credential_values":[{"name":"n","value":"v"}]}"#,
            "credential_values[0].mime_type",
        ),
        (
            "/api/v1/verify/response",
            r#"{"descriptions":[{"lang":"en"}]}"#,
            "descriptions[0].message",
        ),
        ("/api/v1/verify/response", r#"{"result":"yes"}"#, "result"),
    ];
    for (path, body, named) in cases {
        let resp = post(gw.proxy, path, body);
        assert_eq!(resp.status, 400, "{path} {body}");
        let json = resp.json();
        assert_eq!(json["message_code"], 40002);
        let message = json["message"].as_str().unwrap();
        assert!(
            message.contains(named),
            "{body}: {message:?} should name {named}"
        );
    }
    assert_eq!(backend.count(), 0);
    let failures = gw.metric(
        "agent_gateway_validation_failures_total{operation=\"credential_offer\",rule=\"credential_values_required\"}",
    );
    assert_eq!(failures, 1.0);
}

#[test]
fn valid_bodies_are_forwarded_byte_identical_whatever_their_formatting() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let bodies = [
        // Whitespace, key order, unicode escapes, unknown fields and nulls all kept as sent.
        "{\n  \"zeta\": [1, 2, {\"deep\": null}],\n  \"business_code\" : \"caf\\u00e9 \u{1F600}\"\n}",
        r#"{"business_code":"B","allow_multiple_read":false,"request_uid":"r-1","extra":{"a":1}}"#,
    ];
    for body in bodies {
        let resp = post(gw.proxy, "/api/v1/verify/request", body);
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(backend.last().body, body.as_bytes());
    }
    // Well over pingora's 64 KiB retry buffer.
    let values: Vec<String> = (0..3000)
        .map(|i| {
            format!(
                r#"{{"name":"attr{i}","mime_type":"text/plain","value":"{}"}}"#,
                "v".repeat(40)
            )
        })
        .collect();
    let big = format!(
        r#"{{"organization_name":"O","credential_def_id":"D","connection_id":"c","credential_values":[{}]}}"#,
        values.join(",")
    );
    assert!(big.len() > 200 * 1024);
    let resp = post(gw.proxy, "/api/v1/credential/offer", &big);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(backend.last().body, big.as_bytes());
}

#[test]
fn report_mode_forwards_and_counts_and_off_mode_skips() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.validation.mode = ValidationMode::Report;
    let gw = Gateway::builder(cfg).start();
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", "{}").status, 200);
    assert_eq!(backend.last().body, b"{}");
    assert_eq!(
        gw.metric("agent_gateway_validation_failures_total{operation=\"verify_request\",rule=\"required\"}"),
        1.0
    );
    drop(gw);
    let mut cfg = test_config(&[backend.addr]);
    cfg.validation.mode = ValidationMode::Off;
    let gw = Gateway::builder(cfg).start();
    assert_eq!(
        post(gw.proxy, "/api/v1/verify/request", "not json").status,
        200
    );
    assert_eq!(backend.last().body, b"not json");
    assert_eq!(
        gw.metric("agent_gateway_validation_failures_total{operation=\"verify_request\",rule=\"not_json\"}"),
        0.0
    );
}

#[test]
fn a_post_that_is_not_json_gets_415() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let auth = [
        ("X-Service-Agent-Id", "agent-1"),
        ("X-Auth-Token", "secret"),
    ];
    let mut with_type = auth.to_vec();
    with_type.push(("Content-Type", "text/plain"));
    for headers in [&auth[..], &with_type[..]] {
        let resp = request(
            gw.proxy,
            "POST",
            "/api/v1/verify/request",
            headers,
            BODY.as_bytes(),
        );
        assert_eq!(resp.status, 415);
        assert_eq!(resp.json()["message_code"], 41500);
    }
    let mut charset = auth.to_vec();
    charset.push(("Content-Type", "Application/JSON; charset=utf-8"));
    let resp = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &charset,
        BODY.as_bytes(),
    );
    assert_eq!(resp.status, 200);
    assert_eq!(backend.count(), 1);
}

#[test]
fn oversized_targets_and_headers_get_414_and_431() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.max_uri_bytes = 200;
    cfg.limits.max_header_bytes = 2000;
    cfg.limits.max_headers = 20;
    let gw = Gateway::builder(cfg).start();
    let long = format!("/api/v1/transaction/{}/status", "x".repeat(300));
    assert_eq!(get(gw.proxy, &long).status, 414);
    let long_query = format!("/api/v1/transaction/t/status?{}", "q".repeat(300));
    assert_eq!(get(gw.proxy, &long_query).status, 414);

    let big_value = "v".repeat(3000);
    let mut h = AUTH.to_vec();
    h.push(("X-Big", &big_value));
    let resp = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &h,
        BODY.as_bytes(),
    );
    assert_eq!(
        (resp.status, resp.json()["message_code"].as_i64()),
        (431, Some(43100))
    );

    let names: Vec<String> = (0..30).map(|i| format!("X-Many-{i}")).collect();
    let mut h = AUTH.to_vec();
    for n in &names {
        h.push((n, "1"));
    }
    assert_eq!(
        request(
            gw.proxy,
            "POST",
            "/api/v1/verify/request",
            &h,
            BODY.as_bytes()
        )
        .status,
        431
    );

    // Over pingora's own 1 MiB header cap: still a 431, not a silent close.
    let huge = format!(
        "GET /api/v1/transaction/t/status HTTP/1.1\r\nHost: x\r\nX-Huge: {}\r\n\r\n",
        "h".repeat(1100 * 1024)
    );
    let resp = raw(gw.proxy, huge.as_bytes()).expect("an answer, not a reset");
    assert_eq!(resp.status, 431);
    assert_eq!(backend.count(), 0);
}

#[test]
fn control_bytes_and_broken_requests_get_400_and_never_reach_the_backend() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let cases: [&[u8]; 5] = [
        b"GET /api/v1/transaction/a\x00b/status HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/v1/transaction/a%00b/status HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/v1/transaction/a%0d%0aX-Evil:%201/status HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /api/v1/verify/request HTTP/1.1\r\nHost: x\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\nX-Evil: a\rb\r\nContent-Length: 2\r\n\r\n{}",
        b"NOT HTTP AT ALL\r\n\r\n",
    ];
    for req in cases {
        let resp = raw(gw.proxy, req)
            .unwrap_or_else(|| panic!("no answer to {:?}", String::from_utf8_lossy(req)));
        assert_eq!(resp.status, 400, "{:?}", String::from_utf8_lossy(req));
    }
    assert_eq!(backend.count(), 0);
}

/// A header the gateway decides on, or the host a request is for, can be read one way only:
/// what it checked is what the backend gets.
#[test]
fn content_type_and_host_are_read_one_way_and_forwarded_as_checked() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let head = |target: &str, extra: &str| {
        format!(
            "POST {target} HTTP/1.1\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\n\
             {extra}Content-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
            BODY.len()
        )
    };
    for (extra, status, code) in [
        // Checked as JSON in its first copy, it could be read as a form in its second.
        (
            "Host: gw\r\nContent-Type: application/json\r\n\
             Content-Type: application/x-www-form-urlencoded\r\n",
            415,
            41500,
        ),
        // RFC 9112 §3.2: a request with two Host lines gets 400.
        (
            "Host: gw\r\nHost: internal.example\r\nContent-Type: application/json\r\n",
            400,
            40003,
        ),
        // And so does an HTTP/1.1 request with none: the backend is never sent a made-up one.
        ("Content-Type: application/json\r\n", 400, 40003),
    ] {
        let resp = raw(gw.proxy, head(VERIFY_V1, extra).as_bytes()).expect("an answer");
        assert_eq!(
            (resp.status, resp.json()["message_code"].as_i64()),
            (status, Some(code)),
            "{extra:?}"
        );
    }
    // User information in an absolute-form target is an error (RFC 9110 §4.2.4).
    let userinfo = head(
        "http://user:pw@gw.example/api/v1/verify/request",
        "Content-Type: application/json\r\n",
    );
    assert_eq!(raw(gw.proxy, userinfo.as_bytes()).unwrap().status, 400);
    assert_eq!(backend.count(), 0);

    // An absolute-form target names the host: it replaces the client's Host (RFC 9112 §3.2.2).
    let absolute = head(
        "http://gw.example:8080/api/v1/verify/request",
        "Host: internal.example\r\nContent-Type: application/json\r\n",
    );
    assert_eq!(raw(gw.proxy, absolute.as_bytes()).unwrap().status, 200);
    assert_eq!(
        headers_named(&backend.last().headers, "host"),
        ["gw.example:8080"]
    );
    // HTTP/1.0 predates Host: a request without one is served, and the HTTP/1.1 backend gets
    // one Host line.
    let http10 =
        head(VERIFY_V1, "Content-Type: application/json\r\n").replacen("HTTP/1.1", "HTTP/1.0", 1);
    assert_eq!(raw(gw.proxy, http10.as_bytes()).unwrap().status, 200);
    assert_eq!(
        headers_named(&backend.last().headers, "host"),
        ["localhost"]
    );
    // An HTTP/1.1 absolute-form target names the host without a Host line.
    let absolute_only = head(
        "http://gw.example/api/v1/verify/request",
        "Content-Type: application/json\r\n",
    );
    assert_eq!(raw(gw.proxy, absolute_only.as_bytes()).unwrap().status, 200);
    assert_eq!(
        headers_named(&backend.last().headers, "host"),
        ["gw.example"]
    );
}

/// RFC 9112 §3.2: a `Host` with an invalid value gets 400, and a host (RFC 3986 `uri-host`)
/// holds no `@`: user information there, or in an absolute-form target, is refused with the
/// malformed-request answer, never forwarded, and its password is in no answer or log line.
#[test]
fn user_information_in_host_or_target_is_refused_and_never_forwarded() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let head = |target: &str, host: &str| {
        format!(
            "POST {target} HTTP/1.1\r\n{host}X-Service-Agent-Id: agent-1\r\n\
             X-Auth-Token: secret\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
            BODY.len()
        )
    };
    let absolute = "http://u:hunter2@gw.example/api/v1/verify/request";
    let cases = [
        head(VERIFY_V1, "Host: u:hunter2@127.0.0.1:1\r\n"),
        head(VERIFY_V1, "Host: u@gw.example\r\n"),
        head(VERIFY_V1, "Host: @gw.example\r\n"),
        head(absolute, ""),
        head(absolute, "Host: gw.example\r\n"),
        // The target names the host, but the Host line sent with it is still invalid.
        head(
            "http://gw.example/api/v1/verify/request",
            "Host: u:hunter2@gw.example\r\n",
        ),
    ];
    for req in &cases {
        let resp = raw(gw.proxy, req.as_bytes()).expect("an answer");
        let body = resp.json();
        assert_eq!(
            (resp.status, body["message_code"].as_i64()),
            (400, Some(40003)),
            "{req:?}"
        );
        assert!(body["message"].is_string(), "{body}");
        assert!(!String::from_utf8_lossy(&resp.body).contains("hunter2"));
    }
    assert_eq!(backend.count(), 0);
    gw.wait_for_access_log(cases.len());
    assert!(!gw.log().contains("hunter2"), "{}", gw.log());
    // A Host naming a host and port alone is still served.
    let plain = head(VERIFY_V1, "Host: 127.0.0.1:1\r\n");
    assert_eq!(raw(gw.proxy, plain.as_bytes()).unwrap().status, 200);
    assert_eq!(backend.count(), 1);
}

/// Header names are looked up by a key of their length, first and last byte before their
/// bytes are compared: a name that shares the key of a credential or framing header is
/// another header, and a name in any case is the header.
#[test]
fn headers_are_found_by_their_whole_name_in_any_case_never_by_a_name_like_it() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let length = format!("Content-Length: {}\r\n", BODY.len());
    let verify = |credentials: &str, more: &str| {
        let mut raw = format!(
            "POST {VERIFY_V1} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\
             {credentials}{more}{length}\r\n"
        )
        .into_bytes();
        raw.extend_from_slice(BODY.as_bytes());
        raw
    };
    let ok = format!("x-SERVICE-agent-ID: {AGENT_ID}\r\nX-AUTH-TOKEN: {TOKEN}\r\n");
    assert_eq!(raw(gw.proxy, &verify(&ok, "")).unwrap().status, 200);
    // `X-Auth-Tokem`: the length, first and last byte of `X-Auth-Token`, not its name.
    let twin = format!("X-Service-Agent-Id: {AGENT_ID}\r\nX-Auth-Tokem: {TOKEN}\r\n");
    assert_eq!(raw(gw.proxy, &verify(&twin, "")).unwrap().status, 401);
    assert_eq!(backend.count(), 1);
    // `Transfer-Encodixg: chunked` frames nothing: forwarded as sent, the body read by its
    // Content-Length.
    let answer = raw(gw.proxy, &verify(&ok, "Transfer-Encodixg: chunked\r\n")).unwrap();
    assert_eq!(answer.status, 200);
    let seen = backend.last();
    assert_eq!(seen.header("transfer-encodixg"), Some("chunked"));
    assert_eq!(seen.header("transfer-encoding"), None);
    assert_eq!(seen.body, BODY.as_bytes());
    assert_eq!(backend.count(), 2);
}

/// How often a slow client sends its next byte.
const DRIBBLE: Duration = Duration::from_millis(100);

#[tokio::test(start_paused = true)]
async fn a_slowloris_client_is_cut_off_while_others_are_served() {
    let backend = PausedBackend::start().await;
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.client_header_timeout_ms = 3000;
    cfg.limits.client_body_timeout_ms = 3000;
    let gw = PausedGateway::start(&cfg).await;
    // A slow header: a few bytes of it, then a byte now and then.
    let slow_header = paused::slow_client(
        gw.proxy,
        b"GET /api/v1/transaction/t/status HTTP/1.1\r\nHost: x\r\n",
        b"X",
        DRIBBLE,
    )
    .await;
    // A slow body: the whole header, then a byte of the body now and then.
    let body_head = verify_with("Content-Length: 1000\r\n", b"{");
    let slow_body = paused::slow_client(gw.proxy, &body_head, b" ", DRIBBLE).await;
    // Meanwhile normal clients are served, the first while both slow ones are connected.
    assert_eq!(paused::post(gw.proxy, VERIFY_V1, BODY).await, 200);
    assert!(
        !slow_header.is_finished() && !slow_body.is_finished(),
        "a slow client was cut off before a normal one was served"
    );
    let mut served = 1;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !slow_header.is_finished() || !slow_body.is_finished() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slow clients were never cut off"
        );
        assert_eq!(paused::post(gw.proxy, VERIFY_V1, BODY).await, 200);
        served += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both were cut off (a slow client's task ends only when the gateway closes on it), the
    // slow body with 408.
    let body_answer = slow_body.await.unwrap();
    let body_answer = String::from_utf8_lossy(&body_answer);
    assert!(body_answer.starts_with("HTTP/1.1 408"), "{body_answer}");
    assert_eq!(backend.count(), served);
}

#[test]
fn an_agent_over_its_rate_limit_gets_429_and_strangers_cannot_spend_its_budget() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    let agent = cfg.agent_mut(AGENT_ID);
    // Practically no refill while the test runs: what it allows is exactly the burst.
    agent.rate_limit_per_second = Some(0.001);
    agent.burst = Some(3);
    let gw = Gateway::builder(cfg).start();
    // Unauthenticated and wrong-token traffic in the agent's name first.
    for _ in 0..10 {
        let h = [("X-Service-Agent-Id", "agent-1"), ("X-Auth-Token", "wrong")];
        assert_eq!(
            request(
                gw.proxy,
                "POST",
                "/api/v1/verify/request",
                &h,
                BODY.as_bytes()
            )
            .status,
            401
        );
    }
    for _ in 0..3 {
        assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
    }
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 429);
    assert_eq!(resp.json()["message_code"], 42900);
    // One emission interval (1000 s) after the burst, less the time the test took.
    let retry: u64 = resp.header("retry-after").unwrap().parse().unwrap();
    assert!((900..=1000).contains(&retry), "{retry}");
    assert_eq!(backend.count(), 3);
    assert_eq!(
        gw.metric("agent_gateway_rate_limited_total{agent_id=\"agent-1\"}"),
        1.0
    );
}

#[test]
fn a_dead_address_leaves_the_rotation_and_returns() {
    // `a` listens on a port held for the test: dropped, its address refuses connections
    // (and no other process can take it) until it listens there again.
    let a_port = ClosedPort::new();
    let (a, b) = (Backend::start_on(&a_port), Backend::start());
    let mut cfg = test_config(&[a.addr, b.addr]);
    cfg.upstream.health_check_interval_ms = 100;
    let gw = Gateway::builder(cfg).start();
    gw.wait_until("ready", || admin_get(gw.admin, "/readyz").status == 200);
    drop(a);
    // Once the check notices, every request goes to b, none fails.
    gw.wait_until("a to leave the rotation", || {
        gw.log().contains("out of rotation")
    });
    let before = b.count();
    for _ in 0..10 {
        assert_eq!(post(gw.proxy, VERIFY_V1, BODY).status, 200);
    }
    assert_eq!(b.count(), before + 10);
    assert_eq!(
        admin_get(gw.admin, "/readyz").status,
        200,
        "one address is still up"
    );
    let a = Backend::start_on(&a_port);
    gw.wait_until("a to return", || gw.log().contains("back in rotation"));
    for _ in 0..10 {
        assert_eq!(post(gw.proxy, VERIFY_V1, BODY).status, 200);
    }
    assert!(a.count() >= 4, "a got {} of 10 after returning", a.count());
}

#[test]
fn failing_backends_never_get_a_post_twice_and_the_gateway_keeps_serving() {
    let cases: Vec<(&str, Action, Option<u16>)> = vec![
        ("closed before answering", Action::Close, Some(502)),
        ("silent past the read timeout", Action::Hang, Some(504)),
        ("closed mid-body", Action::CloseMidBody, None),
        ("stalled mid-body", Action::StallMidBody, None),
        // Broken before any of the body could go out: the gateway answers for it.
        (
            "broken chunked framing from the first byte",
            Action::Raw(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{\"status_code\":200}"
                    .to_vec(),
            ),
            Some(502),
        ),
        (
            "a head, then silent past the read timeout",
            Action::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n".to_vec()),
            Some(504),
        ),
    ];
    for (name, action, status) in cases {
        let action = Arc::new(std::sync::Mutex::new(Some(action)));
        let backend = Backend::with(move |_| match action.lock().unwrap().take() {
            Some(a) => a,
            None => Action::Json("{}".into()),
        });
        let gw = Gateway::start(&[backend.addr]);
        let mut c = Connection::open(gw.proxy);
        c.send(verify_post(BODY));
        match status {
            Some(code) => {
                let head = c.head();
                assert!(
                    head.starts_with(&format!("HTTP/1.1 {code}")),
                    "{name}: {head}"
                );
            }
            // The header was already sent: the connection is closed, the body left short.
            None => {
                let got = c.rest();
                let text = String::from_utf8_lossy(&got);
                assert!(
                    text.starts_with("HTTP/1.1 200") && text.ends_with("{\"partial\":"),
                    "{name}: {text}"
                );
            }
        }
        // Once the exchange is recorded, any (wrong) resend has been made.
        gw.wait_for_access_log(1);
        assert_eq!(
            backend.count(),
            1,
            "{name}: the POST reached the backend more than once"
        );
        // The gateway keeps serving.
        assert_eq!(post(gw.proxy, VERIFY_V1, BODY).status, 200, "{name}");
    }
}

/// What RFC 9112 says, read as it says: `close` on any `Connection` line of a backend's answer
/// ends its connection, and a length with leading zeros, from either side, is its number.
#[test]
fn close_on_any_connection_line_and_lengths_with_leading_zeros() {
    let backend = Backend::with(|r| {
        Action::Raw(if r.target.contains("/status") {
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}".to_vec()
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Length: 0000000000000000019\r\n\r\n{\"status_code\":200}"
                .to_vec()
        })
    });
    let gw = Gateway::start(&[backend.addr]);
    for _ in 0..2 {
        assert_eq!(get(gw.proxy, "/api/v1/transaction/t/status").status, 200);
        assert_eq!(
            backend.last().on_connection,
            0,
            "a later keep-alive line does not undo close: never reused"
        );
    }
    let mut c = Connection::open(gw.proxy);
    // Twenty zeros, then the length: the 18 digits a length may have come after them.
    c.send(verify_with(
        &format!("Content-Length: {:0>22}\r\n", BODY.len()),
        BODY.as_bytes(),
    ));
    let resp = c.response();
    assert_eq!(
        (resp.status, resp.text().as_str()),
        (200, r#"{"status_code":200}"#)
    );
    let seen = backend.last();
    assert_eq!(seen.body, BODY.as_bytes());
    assert_eq!(
        seen.header("content-length"),
        Some(BODY.len().to_string().as_str())
    );
}

/// The race the notes on pingora warn of: a kept-alive upstream connection the backend closes
/// after reading the next request, without answering. The POST must not be resent (it may
/// have been acted on); the idempotent GET status read is resent once, on a fresh connection.
#[test]
fn a_kept_alive_connection_closed_after_reading_never_gets_a_post_twice() {
    let backend = Backend::with(|r| {
        if r.on_connection == 1 {
            Action::Close
        } else {
            Action::Json("{}".into())
        }
    });
    let gw = Gateway::start(&[backend.addr]);
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 502);
    assert_eq!(backend.count(), 2, "the POST was resent");
    let reused = backend.all()[1].on_connection;
    assert_eq!(
        reused, 1,
        "the second POST did not go on the kept-alive connection"
    );

    drop(gw);
    let before = backend.count();
    let gw = Gateway::start(&[backend.addr]);
    assert_eq!(get(gw.proxy, "/api/v1/transaction/t/status").status, 200);
    assert_eq!(get(gw.proxy, "/api/v1/transaction/t/status").status, 200);
    let seen: Vec<usize> = backend.all()[before..]
        .iter()
        .map(|r| r.on_connection)
        .collect();
    assert_eq!(
        seen,
        vec![0, 1, 0],
        "the GET is resent once, on a new connection"
    );
}
