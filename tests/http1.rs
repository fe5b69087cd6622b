//! The gateway's own HTTP/1.1: pipelining, `Expect: 100-continue`, framing that could be read
//! two ways, HTTP/1.0 clients, backend framings, and the kept-alive backend pool.

mod common;

use std::io::Read;
use std::time::Duration;

use agent_gateway::config::testing::TOKEN;
use common::paused::{self, PausedBackend, PausedGateway};
use common::*;
use serde_json::json;

#[test]
fn pipelined_requests_are_answered_in_order_and_forwarded_once_each() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    let mut burst = verify_post(BODY);
    burst.extend_from_slice(auth_head("GET", "/api/v1/transaction/tx-9/status").as_bytes());
    burst.extend_from_slice(b"\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    c.send(burst);
    let (first, second, third) = (c.response(), c.response(), c.response());
    assert_eq!((first.status, second.status, third.status), (200, 200, 404));
    assert_eq!(
        first.header("x-upstream-path"),
        Some("/api/v2/verify/ORG_DEFAULT/request")
    );
    assert_eq!(
        second.header("x-upstream-path"),
        Some("/api/v2/transaction/tx-9/status")
    );
    let seen = backend.all();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, BODY.as_bytes());
    assert_eq!((seen[1].method.as_str(), seen[1].body.len()), ("GET", 0));
}

#[test]
fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    let expect = format!("Expect: 100-continue\r\nContent-Length: {}\r\n", BODY.len());
    c.send(verify_with(&expect, b""));
    let mut interim = [0u8; 25];
    c.reader.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send(BODY);
    assert_eq!(c.response().status, 200);
    let seen = backend.last();
    assert_eq!(seen.body, BODY.as_bytes());
    assert_eq!(seen.header("expect"), None, "Expect is hop-by-hop");
}

#[test]
fn framing_that_could_be_read_two_ways_is_400_and_never_forwarded() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    for framing in [
        "Content-Length: 71\r\nTransfer-Encoding: chunked\r\n",
        "Content-Length: 71\r\nContent-Length: 72\r\n",
        "Content-Length: +71\r\n",
        "Transfer-Encoding: gzip\r\n",
    ] {
        let resp = raw(gw.proxy, &verify_with(framing, BODY.as_bytes()))
            .unwrap_or_else(|| panic!("no answer with {framing:?}"));
        assert_eq!(resp.status, 400, "{framing:?}");
        assert_eq!(resp.header("connection"), Some("close"), "{framing:?}");
    }
    assert_eq!(backend.count(), 0);
}

#[test]
fn http10_clients_get_close_unless_they_ask_and_never_chunked() {
    let body: Vec<u8> = (0..5000).map(|i| b'a' + (i % 26) as u8).collect();
    let chunked = body.clone();
    let backend = Backend::with(move |r| {
        if r.target.contains("tx-chunked") {
            Action::Chunked(chunked.clone(), 700)
        } else {
            Action::Json("{}".into())
        }
    });
    let gw = Gateway::start(&[backend.addr]);
    let auth = "X-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\n";

    // Keep-alive asked for: kept, and said so.
    let mut c = Connection::open(gw.proxy);
    c.send(format!(
        "GET /api/v1/transaction/t1/status HTTP/1.0\r\nConnection: keep-alive\r\n{auth}\r\n"
    ));
    let resp = c.response();
    assert_eq!(
        (resp.status, resp.header("connection")),
        (200, Some("keep-alive"))
    );
    // The backend still got a Host header.
    assert_eq!(backend.last().header("host"), Some("localhost"));

    // Not asked for: closed after the answer. A chunked backend answer arrives decoded.
    c.send(format!(
        "GET /api/v1/transaction/tx-chunked/status HTTP/1.0\r\n{auth}\r\n"
    ));
    let rest = c.rest();
    let text = String::from_utf8_lossy(&rest);
    let split = text.find("\r\n\r\n").expect("a whole head") + 4;
    let head = text[..split].to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert_eq!(&rest[split..], &body[..]);
}

#[test]
fn a_close_delimited_backend_answer_reaches_an_http11_client_chunked_on_a_kept_connection() {
    let backend = Backend::with(|_| Action::CloseDelimited(r#"{"status_code":200}"#.into()));
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    c.send(verify_post(BODY));
    let resp = c.response();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    assert_eq!(
        resp.header("connection"),
        None,
        "the client's connection is kept"
    );
    assert_eq!(resp.text(), r#"{"status_code":200}"#);
    // The same client connection serves on; the spent backend connection was not pooled.
    c.send(verify_post(BODY));
    assert_eq!(c.response().status, 200);
    assert_eq!(backend.count(), 2);
}

#[test]
fn a_close_delimited_answer_cut_short_never_reads_as_whole() {
    // The head and part of a body of no stated length, then nothing until the read timeout.
    let backend = Backend::with(|_| {
        Action::Raw(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"partial\":".to_vec(),
        )
    });
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    c.send(verify_post(BODY));
    let head = c.head().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    // The gateway gives up on the backend and closes: the last chunk never came, so the
    // client knows the body is cut (close-delimited, this close would have ended it whole).
    let rest = c.rest();
    assert_eq!(
        rest,
        b"b\r\n{\"partial\":\r\n",
        "{}",
        String::from_utf8_lossy(&rest)
    );
    let line = gw.wait_for_access_log(1).pop().unwrap();
    assert_eq!(line["answer_broken"], true, "{line}");
}

#[tokio::test(start_paused = true)]
async fn backend_connections_are_reused_until_idle_timeout() {
    let backend = PausedBackend::start().await;
    let mut cfg = test_config(&[backend.addr]);
    cfg.upstream.idle_timeout_ms = 300;
    let gw = PausedGateway::start(&cfg).await;
    let on_connection = || async {
        assert_eq!(
            paused::post(gw.proxy, "/api/v1/verify/request", BODY).await,
            200
        );
        backend.last().on_connection
    };
    assert_eq!(on_connection().await, 0);
    assert_eq!(
        on_connection().await,
        1,
        "a kept-alive backend connection is reused"
    );
    // The clock is the test's: the idle connection expires in no time.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(on_connection().await, 0, "an expired one is not");
}

#[test]
fn a_backend_connection_closed_while_idle_is_not_used_for_the_next_post() {
    let backend = Backend::with(|_| Action::JsonThenClose(r#"{"status_code":200}"#.into()));
    let gw = Gateway::start(&[backend.addr]);
    for sent in 1..=5 {
        assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
        // The backend has closed the connection before the next request is sent.
        wait_until("the backend to close its connection", || {
            backend.completed() == sent
        });
    }
    let seen = backend.all();
    assert_eq!(seen.len(), 5);
    assert!(seen.iter().all(|r| r.on_connection == 0));
}

#[test]
fn a_chunked_body_ended_by_a_bare_lf_is_refused_not_read_past() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    // Another parser could end this body at `0\r\n\n` and see a second request after it.
    let smuggled = verify_with(
        "Transfer-Encoding: chunked\r\n",
        format!(
            "{:x}\r\n{BODY}\r\n0\r\n\nGET /api/v1/transaction/t/status HTTP/1.1\r\nHost: x\r\n\r\n",
            BODY.len()
        )
        .as_bytes(),
    );
    let resp = raw(gw.proxy, &smuggled).expect("an answer");
    assert_eq!(
        (resp.status, resp.json()["message_code"].as_i64()),
        (400, Some(40001))
    );
    assert_eq!(backend.count(), 0);
}

#[test]
fn backend_framing_headers_are_made_consistent_for_the_client() {
    let backend = Backend::with(|r| {
        Action::Raw(if r.target.contains("both") {
            // Content-Length and chunked: the body is the chunked one, the length is wrong.
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec()
        } else {
            // A coding the gateway does not speak (chunked not final, the body would run to the
            // close): refused as nginx refuses it, never relayed with framing of its own.
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\nConnection: close\r\n\r\nzipped".to_vec()
        })
    });
    let gw = Gateway::start(&[backend.addr]);
    let resp = get(gw.proxy, "/api/v1/transaction/both/status");
    assert_eq!((resp.status, resp.text().as_str()), (200, "hello"));
    assert_eq!(resp.header("content-length"), None);
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));

    let resp = get(gw.proxy, "/api/v1/transaction/gz/status");
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert_eq!(resp.json()["message_code"], 50201);
}

#[test]
fn a_refusal_does_not_wait_for_a_body_the_client_holds_back_for_100_continue() {
    let backend = Backend::start();
    // A body timeout far past the socket's read timeout: waiting for the body fails the test.
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.client_body_timeout_ms = 60_000;
    let gw = Gateway::builder(cfg).start();
    let mut c = Connection::open(gw.proxy);
    c.send(format!(
        "POST /api/v1/verify/request HTTP/1.1\r\nHost: x\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: wrong\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    ));
    let resp = c.response();
    assert_eq!(resp.status, 401);
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(backend.count(), 0);
}

/// A client that does not read its answer within `limits.client_send_timeout_ms` is cut off
/// by the gateway, and logged so: the backend's status (its head went out), `client_aborted`
/// false, `closed_by_gateway`. The client did not hang up; it was too slow.
#[test]
fn a_client_that_does_not_read_its_answer_is_cut_off_as_the_gateways_doing() {
    // Far more than the socket buffers between backend, gateway and client can hold.
    let big = vec![b'x'; 64 << 20];
    let backend = Backend::with(move |_| Action::Chunked(big.clone(), 1 << 20));
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.client_send_timeout_ms = 500;
    let gw = Gateway::builder(cfg).start();
    let mut never_read = Connection::open(gw.proxy);
    never_read.send(format!(
        "{}\r\n",
        auth_head("GET", "/api/v1/transaction/big/status")
    ));
    gw.wait_until("the request to start", || backend.count() == 1);
    gw.wait_for_metric("agent_gateway_in_flight_requests", 0.0);
    let logged = gw.wait_for_access_log(1);
    assert_eq!(
        who_ended(&logged),
        [(json!(200), json!(false), json!(true))],
        "{logged:#?}"
    );
}

#[test]
fn a_credential_sent_twice_is_refused_whichever_copy_is_right() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    for (first, second) in [("secret", "wrong"), ("wrong", "secret")] {
        let h = [
            ("X-Service-Agent-Id", "agent-1"),
            ("X-Auth-Token", first),
            ("X-Auth-Token", second),
            ("Content-Type", "application/json"),
        ];
        let resp = request(
            gw.proxy,
            "POST",
            "/api/v1/verify/request",
            &h,
            BODY.as_bytes(),
        );
        assert_eq!(resp.status, 401, "{first}, {second}");
    }
    assert_eq!(backend.count(), 0);
}

/// Declared hop-by-hop, a header the gateway admitted the request on would be dropped on the
/// way, and the backend would get the request without the credentials, content type or host
/// it was admitted on: refused, whichever of them, in any case, and nothing is forwarded.
#[test]
fn connection_naming_a_header_the_gateway_decides_on_is_refused() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    for listed in [
        "keep-alive, X-Auth-Token, X-Service-Agent-Id",
        "x-service-agent-id",
        "Host",
        "close, content-type",
    ] {
        let mut h = AUTH.to_vec();
        h.push(("Connection", listed));
        let resp = request(gw.proxy, "POST", VERIFY_V1, &h, VERIFY_BODY.as_bytes());
        assert_eq!(resp.status, 400, "{listed}: {}", resp.text());
        assert_eq!(resp.json()["message_code"], 40005, "{listed}");
    }
    assert_eq!(backend.count(), 0);
    let mut h = AUTH.to_vec();
    h.push(("Connection", "X-Client-Hop"));
    let resp = request(gw.proxy, "POST", VERIFY_V1, &h, VERIFY_BODY.as_bytes());
    assert_eq!(
        resp.status, 200,
        "another header may still be declared hop-by-hop"
    );
    assert_eq!(backend.last().header("x-auth-token"), Some(TOKEN));
}

/// Headers that would tell the backend another path, method or client than the gateway
/// admitted are not forwarded; the request is, with the rest of its headers.
#[test]
fn routing_and_address_overrides_do_not_reach_the_backend() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let overrides = [
        ("X-Original-URL", "/api/v2/verify/OTHER/request"),
        ("X-Rewrite-URL", "/api/v2/verify/OTHER/request"),
        ("X-HTTP-Method-Override", "DELETE"),
        ("X-HTTP-Method", "DELETE"),
        ("X-Method-Override", "DELETE"),
        ("Forwarded", "for=10.0.0.1;host=internal"),
        ("X-Real-IP", "127.0.0.1"),
        ("X-Forwarded-Host", "internal"),
        ("X-Forwarded-Port", "8443"),
    ];
    let mut h = AUTH.to_vec();
    h.extend(overrides);
    h.push(("X-Also-Kept", "1"));
    let resp = request(gw.proxy, "POST", VERIFY_V1, &h, VERIFY_BODY.as_bytes());
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = backend.last();
    for (name, _) in overrides {
        assert_eq!(seen.header(name), None, "{name} reached the backend");
    }
    assert_eq!(seen.header("x-also-kept"), Some("1"));
    assert_eq!(seen.header("x-auth-token"), Some(TOKEN));
}

#[test]
fn headers_named_in_connection_are_hop_by_hop_both_ways() {
    let backend = Backend::with(|_| {
        Action::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: X-Backend-Hop\r\nX-Backend-Hop: 1\r\nX-Kept: 1\r\n\r\n{}".to_vec())
    });
    let gw = Gateway::start(&[backend.addr]);
    let h = [
        ("X-Service-Agent-Id", "agent-1"),
        ("X-Auth-Token", "secret"),
        ("Connection", "X-Client-Hop"),
        ("X-Client-Hop", "1"),
        ("X-Also-Kept", "1"),
    ];
    let resp = request(gw.proxy, "GET", "/api/v1/transaction/t/status", &h, b"");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-backend-hop"), None);
    assert_eq!(resp.header("x-kept"), Some("1"));
    let seen = backend.last();
    assert_eq!(seen.header("x-client-hop"), None);
    assert_eq!(seen.header("connection"), None);
    assert_eq!(seen.header("x-also-kept"), Some("1"));
}
