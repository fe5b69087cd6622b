//! HTTP/1.1 conformance on both hops, case by case from a differential smuggling audit
//! against nginx and HAProxy and from a soak under faults: requests sent as raw bytes to the
//! real binary, answers from raw scripted backends.

mod common;

use std::io::Read;
use std::time::Duration;

use common::*;

// ---------------------------------------------------------------------------------------------
// Requests from clients
// ---------------------------------------------------------------------------------------------

#[test]
fn an_answer_to_head_has_its_headers_and_no_body_so_the_next_answer_reads_cleanly() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    // HEAD is no operation's method: 405 on a known path, 404 elsewhere; both pipelined
    // before a GET whose answer must come next, whole.
    c.send(format!(
        "{}\r\nHEAD /nope HTTP/1.1\r\nHost: gw\r\n\r\n{}\r\n",
        auth_head("HEAD", STATUS_V1),
        auth_head("GET", "/nope")
    ));
    for want in [405, 404] {
        let head = c.head();
        assert!(head.starts_with(&format!("HTTP/1.1 {want} ")), "{head}");
        let length = head_header(&head, "content-length").expect("the length of the GET answer");
        assert!(length.parse::<usize>().unwrap() > 0, "{head}");
    }
    let get = c.response();
    assert_eq!(get.status, 404);
    assert_eq!(get.json()["message_code"], 40400);
    assert_eq!(backend.count(), 0);
}

#[test]
fn an_underscore_name_standing_for_a_header_the_gateway_controls_is_refused() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    for alias in [
        "Transfer_Encoding: chunked",
        "Content_Length: 5",
        "X_Auth_Token: other",
        "x_service_agent_id: agent-2",
        "Content_Type: text/plain",
        "X_Forwarded_For: 10.0.0.1",
        "Connection_: close",
    ] {
        let aliased = verify_with(
            &format!("{alias}\r\nContent-Length: {}\r\n", BODY.len()),
            BODY.as_bytes(),
        );
        let resp = raw(gw.proxy, &aliased).unwrap();
        if alias.starts_with("Connection_") {
            // Not an alias of anything: passed on as it came.
            assert_eq!(resp.status, 200, "{alias}");
            continue;
        }
        assert_eq!(resp.status, 400, "{alias}: {}", resp.text());
        assert_eq!(resp.json()["message_code"], 40004, "{alias}");
    }
    let plain = verify_with(
        &format!("X_Custom: 1\r\nContent-Length: {}\r\n", BODY.len()),
        BODY.as_bytes(),
    );
    assert_eq!(raw(gw.proxy, &plain).unwrap().status, 200);
    let seen = backend.all();
    assert_eq!(seen.len(), 2, "only the two harmless requests went on");
    assert_eq!(seen[1].header("x_custom"), Some("1"));
}

#[test]
fn transfer_encoding_is_chunked_exactly_once_with_ascii_whitespace_only() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let body = format!("{:x}\r\n{BODY}\r\n0\r\n\r\n", BODY.len());
    for te in [
        "Transfer-Encoding: \u{a0}chunked\r\n",
        "Transfer-Encoding: chunked\u{a0}\r\n",
        "Transfer-Encoding: chunked, chunked\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "Transfer-Encoding: \x0bchunked\r\n",
    ] {
        let resp = raw(gw.proxy, &verify_with(te, body.as_bytes())).unwrap();
        assert_eq!(resp.status, 400, "{te:?}");
        assert_eq!(resp.header("connection"), Some("close"));
    }
    assert_eq!(backend.count(), 0);
    for te in [
        "Transfer-Encoding: chunked\r\n",
        "Transfer-Encoding: \t ChunKed \t\r\n",
    ] {
        let resp = raw(gw.proxy, &verify_with(te, body.as_bytes())).unwrap();
        assert_eq!(resp.status, 200, "{te:?}: {}", resp.text());
    }
    assert_eq!(backend.count(), 2);
}

#[test]
fn chunk_lines_and_trailers_follow_the_grammar() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let te = "Transfer-Encoding: chunked\r\n";
    let size = format!("{:x}", BODY.len());
    let chunked = |size_line: &str, trailer: &str| {
        format!("{size_line}\r\n{BODY}\r\n0\r\n{trailer}\r\n").into_bytes()
    };
    for (size_line, trailer) in [
        (format!("{size} "), ""),
        (format!("{size}\t"), ""),
        (format!("{size};"), ""),
        (format!("{size};a=\"abc"), ""),
        (format!("{size};a=b c"), ""),
        (format!("{size};=b"), ""),
        (size.clone(), "X : y\r\n"),
        (size.clone(), "XYZ\r\n"),
        (size.clone(), " X: y\r\n"),
    ] {
        let resp = raw(gw.proxy, &verify_with(te, &chunked(&size_line, trailer))).unwrap();
        assert_eq!(
            resp.status,
            400,
            "{size_line:?} {trailer:?}: {}",
            resp.text()
        );
        assert_eq!(resp.json()["message_code"], 40001);
    }
    assert_eq!(backend.count(), 0);
    for (size_line, trailer) in [
        (format!("{size};a=b"), ""),
        (format!("{size} ; a = \"b \\\" c\" ;d"), ""),
        (size.clone(), "X-Checksum: abc\r\n"),
        (size.clone(), "X-Empty:\r\n"),
    ] {
        let resp = raw(gw.proxy, &verify_with(te, &chunked(&size_line, trailer))).unwrap();
        assert_eq!(
            resp.status,
            200,
            "{size_line:?} {trailer:?}: {}",
            resp.text()
        );
    }
    assert_eq!(backend.count(), 4);
}

#[test]
fn raw_non_ascii_bytes_in_the_target_are_percent_encoded_upstream() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let mut bytes =
        b"GET /api/v1/transaction/tx-\xc3\xa9/status?q=\xc3\xbc&r=1 HTTP/1.1\r\n".to_vec();
    bytes.extend_from_slice(
        b"Host: gw\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\n\r\n",
    );
    let resp = raw(gw.proxy, &bytes).unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        backend.last().target,
        "/api/v2/transaction/tx-%C3%A9/status?q=%C3%BC&r=1"
    );
    // Bytes that are not UTF-8 have no characters to stand for: refused.
    let mut bad = b"GET /api/v1/transaction/tx-\xff/status HTTP/1.1\r\n".to_vec();
    bad.extend_from_slice(
        b"Host: gw\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\n\r\n",
    );
    assert_eq!(raw(gw.proxy, &bad).unwrap().status, 400);
    assert_eq!(backend.count(), 1);
}

// ---------------------------------------------------------------------------------------------
// Responses from the backend
// ---------------------------------------------------------------------------------------------

/// A gateway in front of a backend answering every request with `answer`.
fn behind(answer: &'static [u8]) -> (Backend, Gateway) {
    let backend = Backend::with(move |_| Action::Raw(answer.to_vec()));
    let gw = Gateway::start(&[backend.addr]);
    (backend, gw)
}

#[test]
fn a_status_outside_100_to_599_is_a_502() {
    for answer in [
        &b"HTTP/1.1 000 Zero\r\nContent-Length: 2\r\n\r\nok"[..],
        b"HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 600 High\r\nContent-Length: 2\r\n\r\nok",
    ] {
        let (_backend, gw) = behind(answer);
        let resp = get(gw.proxy, STATUS_V1);
        assert_eq!(resp.status, 502, "{}", String::from_utf8_lossy(answer));
        assert_eq!(resp.json()["message_code"], 50201);
    }
}

#[test]
fn an_unsolicited_101_is_a_502_not_an_interim_answer() {
    let (_backend, gw) = behind(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: evil\r\nConnection: upgrade\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmugd",
    );
    let resp = get(gw.proxy, STATUS_V1);
    assert_eq!(resp.status, 502, "{}", resp.text());
}

#[test]
fn the_client_gets_the_gateways_own_framing_headers_never_the_backends() {
    for (answer, length) in [
        (
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"[..],
            "5",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello", "5"),
    ] {
        let (_backend, gw) = behind(answer);
        let mut c = Connection::open(gw.proxy);
        c.send(format!("{}\r\n", auth_head("GET", STATUS_V1)));
        let head = c.head();
        let lengths: Vec<&str> = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
            .collect();
        assert_eq!(lengths.len(), 1, "{head}");
        assert_eq!(head_header(&head, "content-length"), Some(length));
    }
    // A transfer coding the gateway does not speak cannot be relayed with its framing intact.
    for answer in [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ] {
        let (_backend, gw) = behind(answer);
        let resp = get(gw.proxy, STATUS_V1);
        assert_eq!(resp.status, 502, "{}", String::from_utf8_lossy(answer));
    }
}

#[test]
fn a_backend_connection_whose_answer_was_framed_ambiguously_is_never_reused() {
    for answer in [
        // Both lengths: the chunked body is relayed, the connection is not trusted after it.
        &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"[..],
        // A 204 that declares a body: its bytes may follow late.
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        let backend = Backend::with(move |_| {
            Action::RawThenLate(
                answer.to_vec(),
                Duration::from_millis(50),
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!".to_vec(),
            )
        });
        let gw = Gateway::start(&[backend.addr]);
        let mut c = Connection::open(gw.proxy);
        for _ in 0..2 {
            c.send(format!("{}\r\n", auth_head("GET", STATUS_V1)));
            // The next request goes at once: were the connection pooled, it would take it
            // before the late bytes arrive, and read them as its answer.
            let resp = c.response();
            assert!(resp.status == 200 || resp.status == 204 || resp.status == 304);
            assert_ne!(resp.text(), "EVIL!", "{}", String::from_utf8_lossy(answer));
        }
        let seen = backend.all();
        assert_eq!(
            (seen.len(), seen[1].on_connection),
            (2, 0),
            "the second request went on a new connection: {}",
            String::from_utf8_lossy(answer)
        );
    }
}

#[test]
fn unsolicited_bytes_on_an_idle_pooled_connection_keep_it_out_of_use() {
    let backend = Backend::with(|_| {
        Action::RawThenLate(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            Duration::from_millis(20),
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!".to_vec(),
        )
    });
    let gw = Gateway::start(&[backend.addr]);
    for sent in 1..=3 {
        let resp = get(gw.proxy, STATUS_V1);
        assert_eq!((resp.status, resp.text().as_str()), (200, "ok"));
        // The next request goes once the late bytes are on the idle connection.
        wait_until("the backend's late bytes", || backend.completed() == sent);
    }
    assert!(backend.all().iter().all(|r| r.on_connection == 0));
}

// ---------------------------------------------------------------------------------------------
// Over a long run: the file watcher at rest, a pooled connection that died, a body in odd pieces
// ---------------------------------------------------------------------------------------------

#[test]
fn an_idle_watcher_does_not_reload_and_one_bad_write_is_one_failure() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let reloads = |result: &str| {
        gw.metric(&format!(
            "agent_gateway_config_reloads_total{{result=\"{result}\"}}"
        ))
    };
    // Idle, with its own reads of the directory the only events: a window in which nothing
    // may be reloaded.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(gw.metric("agent_gateway_config_generation"), 1.0);
    assert_eq!(reloads("failure"), 0.0);
    // One write, made in one step (a write in place can be read half done): every event it
    // makes has been handled once the next, good, write is applied.
    replace_file(&gw.config_path, "this is [not toml");
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"failure\"}",
        1.0,
    );
    gw.replace_config(&gw.config);
    // The generation is counted last of a reload's metrics.
    gw.wait_for_metric("agent_gateway_config_generation", 2.0);
    assert_eq!(reloads("failure"), 1.0, "one bad write, one failure");
    assert_eq!(reloads("success"), 1.0);
}

#[test]
fn a_read_resent_after_its_pooled_connection_died_goes_to_the_next_address() {
    // `a` answers the first request of each connection and closes on reading the second:
    // its pooled connection looks alive and dies under the request.
    let a = Backend::with(|r| match r.on_connection {
        0 => Action::Json(r#"{"from":"a"}"#.into()),
        _ => Action::Close,
    });
    let b = Backend::with(|_| Action::Json(r#"{"from":"b"}"#.into()));
    let gw = Gateway::start(&[a.addr, b.addr]);
    // Round robin: a, b, then a again on the connection it pooled.
    for _ in 0..2 {
        assert_eq!(get(gw.proxy, STATUS_V1).status, 200);
    }
    let (a_before, b_before) = (a.count(), b.count());
    let resp = get(gw.proxy, STATUS_V1);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.json()["from"],
        "b",
        "the resend went to the next address: {}",
        gw.log()
    );
    assert_eq!((a.count(), b.count()), (a_before + 1, b_before + 1));
}

#[test]
fn a_read_resent_when_no_other_address_is_up_goes_again_to_the_same_one() {
    // `a` as above; the other address refuses connections, so its health check takes it out
    // of rotation and the resend has nowhere else to go.
    let a = Backend::with(|r| match r.on_connection {
        0 => Action::Json(r#"{"from":"a"}"#.into()),
        _ => Action::Close,
    });
    let down = ClosedPort::new();
    let gw = Gateway::start(&[a.addr, down.addr]);
    let series = format!(
        "agent_gateway_upstream_address_up{{address=\"{}\"}} 0",
        down.addr
    );
    wait_until("the refusing address to fail its health check", || {
        gw.scrape().contains(&series)
    });
    assert_eq!(get(gw.proxy, STATUS_V1).status, 200);
    // On the connection `a` pooled: reset under the request, and sent again to `a`.
    let resp = get(gw.proxy, STATUS_V1);
    assert_eq!(resp.status, 200, "{}\n{}", resp.text(), gw.log());
    assert_eq!(resp.json()["from"], "a");
}

#[test]
fn a_body_split_oddly_still_reads_as_sent() {
    // Guards the stricter chunk grammar against refusing what is valid when split at
    // every byte boundary of a valid extension.
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    let mut bytes = verify_with("Transfer-Encoding: chunked\r\n", b"");
    let body = format!(
        "{:x} ; ext = \"v\"\r\n{BODY}\r\n0\r\nT: 1\r\n\r\n",
        BODY.len()
    );
    bytes.extend_from_slice(body.as_bytes());
    for byte in bytes.chunks(1) {
        c.send(byte);
    }
    let resp = c.response();
    assert_eq!(resp.status, 200, "{}", resp.text());
    let mut rest = [0u8; 1];
    c.writer.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(
        c.reader.read(&mut rest).unwrap(),
        0,
        "nothing after the answer"
    );
    assert_eq!(backend.last().body, BODY.as_bytes());
}
