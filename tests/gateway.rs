//! The core gateway against real processes: routing table, bodies, auth, refusals, upstream
//! failures, config errors and the small CLI commands.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use agent_gateway::config::file::{AgentFile, Digests};
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::FileConfig;
use common::*;
use sha2::{Digest, Sha256};

#[test]
fn every_route_of_both_versions_is_forwarded_as_the_table_says() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let cases = [
        (
            "POST",
            "/api/v1/verify/request",
            "/api/v2/verify/ORG_DEFAULT/request",
        ),
        ("POST", "/api/v1/verify/response", "/api/v2/verify/response"),
        (
            "POST",
            "/api/v1/connection/invitation",
            "/api/v2/connection/ORG_DEFAULT/invitation",
        ),
        (
            "POST",
            "/api/v1/credential/offer",
            "/api/v2/credential/ORG_DEFAULT/offer",
        ),
        (
            "GET",
            "/api/v1/transaction/tx-42/status",
            "/api/v2/transaction/tx-42/status",
        ),
        (
            "POST",
            "/api/v2/verify/SVC/request",
            "/api/v2/verify/SVC/request",
        ),
        ("POST", "/api/v2/verify/response", "/api/v2/verify/response"),
        (
            "POST",
            "/api/v2/connection/SVC/invitation",
            "/api/v2/connection/SVC/invitation",
        ),
        (
            "POST",
            "/api/v2/credential/SVC/offer",
            "/api/v2/credential/SVC/offer",
        ),
        (
            "GET",
            "/api/v2/transaction/tx-42/status",
            "/api/v2/transaction/tx-42/status",
        ),
    ];
    for (i, (method, path, upstream)) in cases.iter().enumerate() {
        let body = format!(
            r#"{{"n": {i}, "business_code":"B","organization_name":"O","credential_def_id":"D"}}"#
        );
        let body = if *method == "POST" {
            body.as_bytes()
        } else {
            b""
        };
        let resp = request(gw.proxy, method, path, &AUTH, body);
        assert_eq!(resp.status, 200, "{method} {path}: {}", resp.text());
        let seen = backend.last();
        assert_eq!(backend.count(), i + 1);
        assert_eq!(
            (seen.method.as_str(), seen.target.as_str()),
            (*method, *upstream)
        );
        assert_eq!(seen.body, body, "{path}: body must arrive byte-identical");
        // The backend's answer comes back untouched.
        assert_eq!(resp.json()["seen"], *upstream);
        assert_eq!(resp.header("x-upstream-path"), Some(*upstream));
    }
}

#[test]
fn auth_headers_pass_unchanged_and_request_id_and_forwarded_for_are_set() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    let seen = backend.last();
    assert_eq!(seen.header("x-service-agent-id"), Some("agent-1"));
    assert_eq!(seen.header("x-auth-token"), Some("secret"));
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    let minted = seen
        .header("x-request-id")
        .expect("a request id is generated")
        .to_string();
    assert_eq!(resp.header("x-request-id"), Some(minted.as_str()));

    // A sane client id is kept; an insane one is replaced.
    let mut h = AUTH.to_vec();
    h.push(("X-Request-Id", "client-id-1"));
    let resp = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &h,
        BODY.as_bytes(),
    );
    assert_eq!(backend.last().header("x-request-id"), Some("client-id-1"));
    assert_eq!(resp.header("x-request-id"), Some("client-id-1"));
    h.pop();
    h.push(("X-Request-Id", "bad id with spaces"));
    request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &h,
        BODY.as_bytes(),
    );
    assert_ne!(
        backend.last().header("x-request-id"),
        Some("bad id with spaces")
    );
}

#[test]
fn query_strings_pass_through_verbatim() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    post(gw.proxy, "/api/v1/verify/request?x=1&y=a%2Fb&z", BODY);
    assert_eq!(
        backend.last().target,
        "/api/v2/verify/ORG_DEFAULT/request?x=1&y=a%2Fb&z"
    );
    get(gw.proxy, "/api/v2/transaction/t/status?verbose");
    assert_eq!(
        backend.last().target,
        "/api/v2/transaction/t/status?verbose"
    );
}

/// A body of `len` bytes of valid JSON with varied content.
fn big_json(len: usize) -> Vec<u8> {
    let mut s = String::from(
        r#"{"business_code":"B","organization_name":"O","credential_def_id":"D","pad":""#,
    );
    let mut i = 0u32;
    while s.len() < len - 2 {
        s.push(char::from(b'a' + (i % 26) as u8));
        i += 1;
    }
    s.push_str("\"}");
    s.into_bytes()
}

#[test]
fn large_bodies_arrive_byte_identical_with_content_length() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let body = big_json(300 * 1024);
    let resp = request(gw.proxy, "POST", "/api/v1/credential/offer", &AUTH, &body);
    assert_eq!(resp.status, 200);
    assert_eq!(backend.last().body, body);
}

#[test]
fn chunked_request_bodies_arrive_byte_identical() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let body = big_json(200 * 1024);
    let mut req = b"POST /api/v2/verify/S/request HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for c in body.chunks(7000) {
        req.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        req.extend_from_slice(c);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let resp = raw(gw.proxy, &req).unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    let seen = backend.last();
    assert_eq!(seen.body, body);
    assert_eq!(
        seen.header("content-length"),
        Some(body.len().to_string().as_str())
    );
}

#[test]
fn large_chunked_responses_come_back_byte_identical() {
    let payload = big_json(500 * 1024);
    let sent = payload.clone();
    let backend = Backend::with(move |_| Action::Chunked(sent.clone(), 10_000));
    let gw = Gateway::start(&[backend.addr]);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, payload);
}

#[test]
fn bodies_over_the_limit_get_413_and_are_not_forwarded() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.max_body_bytes = 1000;
    let gw = Gateway::builder(cfg).start();
    let resp = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &AUTH,
        &big_json(1001),
    );
    assert_eq!(resp.status, 413);
    assert_eq!(resp.json()["status_code"], 413);
    // Chunked, so the size is only found out while reading.
    let mut req = b"POST /api/v1/verify/request HTTP/1.1\r\nHost: x\r\nX-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        req.extend_from_slice(b"190\r\n");
        req.extend_from_slice(&[b' '; 400]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(raw(gw.proxy, &req).unwrap().status, 413);
    // Exactly at the limit is fine.
    let resp = request(
        gw.proxy,
        "POST",
        "/api/v1/verify/request",
        &AUTH,
        &big_json(1000),
    );
    assert_eq!(resp.status, 200);
    assert_eq!(backend.count(), 1);
}

#[test]
fn every_auth_failure_is_the_same_401_and_never_reaches_the_backend() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(AgentFile {
        services: Some(vec!["ONLY".into()]),
        ..AgentFile::new("agent-2", TOKEN)
    });
    let gw = Gateway::builder(cfg).start();
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("/api/v1/verify/request", vec![]),
        ("/api/v1/verify/request", vec![("X-Auth-Token", "secret")]),
        (
            "/api/v1/verify/request",
            vec![("X-Service-Agent-Id", "agent-1")],
        ),
        (
            "/api/v1/verify/request",
            vec![("X-Service-Agent-Id", "nobody"), ("X-Auth-Token", "secret")],
        ),
        (
            "/api/v1/verify/request",
            vec![("X-Service-Agent-Id", "agent-1"), ("X-Auth-Token", "wrong")],
        ),
        (
            "/api/v2/verify/OTHER/request",
            vec![
                ("X-Service-Agent-Id", "agent-2"),
                ("X-Auth-Token", "secret"),
            ],
        ),
        // agent-2's allow-list lacks the global v1 default.
        (
            "/api/v1/credential/offer",
            vec![
                ("X-Service-Agent-Id", "agent-2"),
                ("X-Auth-Token", "secret"),
            ],
        ),
        ("/api/v2/transaction/t/status", vec![]),
    ];
    for (path, headers) in &cases {
        let method = if path.ends_with("status") {
            "GET"
        } else {
            "POST"
        };
        let resp = request(gw.proxy, method, path, headers, BODY.as_bytes());
        assert_eq!(resp.status, 401, "{path} {headers:?}");
        assert_eq!(resp.body, b"\"not authorized\"");
        assert_eq!(resp.header("content-type"), Some("application/json"));
    }
    assert_eq!(backend.count(), 0, "a refused request reached the backend");
    // The allowed service does pass.
    let ok = request(
        gw.proxy,
        "POST",
        "/api/v2/verify/ONLY/request",
        &[
            ("X-Service-Agent-Id", "agent-2"),
            ("X-Auth-Token", "secret"),
            ("Content-Type", "application/json"),
        ],
        BODY.as_bytes(),
    );
    assert_eq!(ok.status, 200);
}

#[test]
fn status_reads_without_credentials_when_configured() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.require_on_status = false;
    let gw = Gateway::builder(cfg).start();
    let resp = request(gw.proxy, "GET", "/api/v1/transaction/t1/status", &[], b"");
    assert_eq!(resp.status, 200);
    assert_eq!(backend.last().target, "/api/v2/transaction/t1/status");
    // POSTs still need them.
    assert_eq!(
        request(
            gw.proxy,
            "POST",
            "/api/v1/verify/request",
            &[],
            BODY.as_bytes()
        )
        .status,
        401
    );
}

#[test]
fn agent_default_service_overrides_the_global_one() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.push(AgentFile {
        default_service: Some("AGENT3_SVC".into()),
        ..AgentFile::new("agent-3", TOKEN)
    });
    let gw = Gateway::builder(cfg).start();
    let h = [
        ("X-Service-Agent-Id", "agent-3"),
        ("X-Auth-Token", "secret"),
        ("Content-Type", "application/json"),
    ];
    request(
        gw.proxy,
        "POST",
        "/api/v1/connection/invitation",
        &h,
        BODY.as_bytes(),
    );
    assert_eq!(
        backend.last().target,
        "/api/v2/connection/AGENT3_SVC/invitation"
    );
}

#[test]
fn unknown_paths_wrong_methods_and_bad_segments_are_not_forwarded() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    for path in [
        "/",
        "/api/v1",
        "/api/v1beta/verify/request",
        "/api/v2/verify/request",
        "/admin",
        "/api/v3/x",
    ] {
        let resp = post(gw.proxy, path, BODY);
        assert_eq!(resp.status, 404, "{path}");
        assert_eq!(resp.json()["status_code"], 404);
        assert_eq!(resp.json()["message_code"], 40400);
    }
    let resp = get(gw.proxy, "/api/v1/verify/request");
    assert_eq!((resp.status, resp.header("allow")), (405, Some("POST")));
    let resp = post(gw.proxy, "/api/v2/transaction/x/status", BODY);
    assert_eq!((resp.status, resp.header("allow")), (405, Some("GET")));
    for path in [
        "/api/v1/transaction/../status",
        "/api/v1/transaction/%2e%2e/status",
        "/api/v1/transaction/%2E/status",
        "/api/v2/verify/./request",
        "/api/v1//verify/request",
        "/api/v2/../v1/verify/request",
    ] {
        let resp = get(gw.proxy, path);
        assert_eq!(resp.status, 400, "{path}");
        assert_eq!(resp.json()["message_code"], 40000);
    }
    assert_eq!(backend.count(), 0);
}

#[test]
fn encoded_bytes_in_segments_are_forwarded_exactly() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    get(gw.proxy, "/api/v1/transaction/a%2Fb/status");
    assert_eq!(backend.last().target, "/api/v2/transaction/a%2Fb/status");
    post(gw.proxy, "/api/v2/credential/S%2Fx%20y/offer", BODY);
    assert_eq!(backend.last().target, "/api/v2/credential/S%2Fx%20y/offer");
}

#[test]
fn refused_connection_is_502_and_the_next_address_is_tried() {
    let closed = ClosedPort::new();
    let dead = closed.addr;
    let gw = Gateway::start(&[dead]);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 502);
    assert_eq!(resp.json()["message_code"], 50200);

    // With a live address beside the dead one, every request succeeds.
    let backend = Backend::start();
    let gw = Gateway::start(&[dead, backend.addr]);
    for _ in 0..6 {
        assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
    }
    assert_eq!(backend.count(), 6);
}

#[test]
fn a_connect_past_the_connect_timeout_is_504_and_the_next_address_is_tried() {
    let silent = SilentPort::new();
    let gw = Gateway::start(&[silent.addr]);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 504);
    assert_eq!(resp.json()["message_code"], 50400);

    let backend = Backend::start();
    let gw = Gateway::start(&[silent.addr, backend.addr]);
    for _ in 0..4 {
        assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
    }
    assert_eq!(backend.count(), 4);
}

#[test]
fn requests_are_spread_round_robin() {
    let (a, b) = (Backend::start(), Backend::start());
    let gw = Gateway::start(&[a.addr, b.addr]);
    for _ in 0..10 {
        assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
    }
    assert_eq!((a.count(), b.count()), (5, 5));
}

#[test]
fn a_backend_silent_past_the_read_timeout_is_504_and_the_post_is_not_resent() {
    let backend = Backend::with(|_| Action::Hang);
    let gw = Gateway::start(&[backend.addr]);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 504);
    assert_eq!(resp.json()["message_code"], 50400);
    assert_eq!(backend.count(), 1, "a timed-out POST must not be resent");
}

#[test]
fn a_post_the_backend_dropped_is_502_and_never_resent() {
    let backend = Backend::with(|_| Action::Close);
    let gw = Gateway::start(&[backend.addr]);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 502);
    assert_eq!(resp.json()["message_code"], 50201);
    assert_eq!(backend.count(), 1);
}

#[test]
fn a_response_cut_mid_body_closes_the_client_connection_and_the_gateway_serves_on() {
    let backend = Backend::with(|r| {
        if r.target.ends_with("/request") {
            Action::CloseMidBody
        } else {
            Action::Json("{}".into())
        }
    });
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    c.send(verify_post(r#"{"business_code":"B"}"#));
    // The rest of the connection: it ends once the gateway closes it (a kept-open one would
    // fail the read when its timeout runs out).
    let got = c.rest();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        got.len() < text.find("\r\n\r\n").unwrap() + 4 + 100,
        "the full body cannot have arrived"
    );
    assert_eq!(get(gw.proxy, "/api/v1/transaction/t/status").status, 200);
}

#[test]
fn keep_alive_connections_serve_many_requests() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let mut c = Connection::open(gw.proxy);
    for i in 0..20 {
        let body = format!("{{\"result\":true,\"presentation_id\":\"p{i}\"}}");
        c.send(format!(
            "{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            auth_head("POST", "/api/v1/verify/response"),
            body.len()
        ));
        assert_eq!(c.response().status, 200);
        // A refusal on the same connection keeps it usable too.
        c.send("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(c.response().status, 404);
    }
    assert_eq!(backend.count(), 20);
}

#[test]
fn check_config_reports_every_problem_by_key_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let mut bad = FileConfig::for_test(loopback(1), &[loopback(1)]);
    bad.listen.proxy = "nonsense".into();
    bad.v1.default_service = "has space".into();
    bad.upstream.addresses.push("no-port-here".into());
    bad.auth.agents = vec![
        AgentFile {
            token_sha256: Digests(vec!["abc".into()]),
            ..AgentFile::new("a", TOKEN)
        },
        AgentFile::new("a", TOKEN),
    ];
    std::fs::write(&path, bad.to_toml()).unwrap();
    let out = cli([
        "check-config".as_ref(),
        "--config".as_ref(),
        path.as_os_str(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for key in [
        "listen.proxy",
        "v1.default_service",
        "upstream.addresses[1]",
        "auth.agents[0].token_sha256",
        "auth.agents[1].id",
    ] {
        assert!(err.contains(key), "{key} missing from:\n{err}");
    }
    // The gateway itself refuses to start on it.
    let run = Gateway::builder(bad).config_path(&path).exit_status();
    assert!(!run.success());

    // Unknown keys and values of the wrong type are refused with the rest, in the order of the
    // file, each with its line and column (a typed config cannot have them: this file is text).
    std::fs::write(
        &path,
        "[listen]\nproxy = \"127.0.0.1:1\"\nprxy = 1\n[upstream]\naddresses=[\"127.0.0.1:2\"]\n\
         read_timeout = \"soon\"\n[v1]\ndefault_service=\"a b\"\n[retirement]\nquiet_days = \"14\"\n",
    )
    .unwrap();
    let out = cli([
        "check-config".as_ref(),
        "--config".as_ref(),
        path.as_os_str(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().skip(1).map(str::trim).collect();
    let starts = [
        "listen.prxy (line 3, column 1): unknown key; did you mean proxy?",
        "upstream.read_timeout (line 6, column 1): \"soon\" is not a duration",
        "v1.default_service (line 8, column 1): ",
        "retirement.quiet_days (line 10, column 14): invalid type: string \"14\"",
    ];
    assert_eq!(lines.len(), starts.len(), "{err}");
    for (line, start) in lines.iter().zip(starts) {
        assert!(
            line.starts_with(start),
            "{start} is not the start of {line}:\n{err}"
        );
    }

    // The form of earlier builds, FILE without --config, works with a note.
    let out = cli(["check-config".as_ref(), path.as_os_str()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("note: `check-config "), "{err}");
    assert!(err.contains("listen.prxy (line 3"), "{err}");
}

/// `check-config --no-resolve` of `cfg`, written to a file of its own.
fn check_config_no_resolve(cfg: &FileConfig) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, cfg.to_toml()).unwrap();
    cli([
        "check-config".as_ref(),
        "--no-resolve".as_ref(),
        "--config".as_ref(),
        path.as_os_str(),
    ])
}

/// The process sent SIGQUIT hands its listeners to whatever listens at `server.upgrade_sock`:
/// in a directory another user can write (a shared sticky `/tmp`, a group-writable one), that
/// user could make the socket first and take the proxy's and the admin listener's traffic.
/// `check-config`, `run` and `run --upgrade` refuse such a directory, naming the key; root,
/// which the tests run as in CI, is refused it too.
#[test]
fn an_upgrade_socket_in_a_directory_others_can_write_is_refused() {
    for mode in [0o1777, 0o777, 0o770] {
        let shared = tempfile::tempdir().unwrap();
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let mut cfg = test_config(&[loopback(1)]);
        cfg.server.upgrade_sock = shared.path().join("upgrade.sock").display().to_string();
        let shown = shared.path().display().to_string();

        let out = check_config_no_resolve(&cfg);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mode {mode:o}: {err}");
        assert!(
            err.contains("server.upgrade_sock") && err.contains(&shown),
            "mode {mode:o}: {err}"
        );

        for upgrade in [false, true] {
            let mut builder = Gateway::builder(cfg.clone()).process();
            if upgrade {
                builder = builder.arg("--upgrade");
            }
            let (status, log) = builder.refusal();
            assert!(!status.success(), "mode {mode:o}, --upgrade {upgrade}");
            assert_ne!(status.code(), Some(101), "a panic, not a refusal:\n{log}");
            assert!(
                log.contains("server.upgrade_sock") && log.contains(&shown),
                "mode {mode:o}, --upgrade {upgrade}:\n{log}"
            );
        }
    }
}

/// The default `server.upgrade_sock` (`/run/agent-gateway/upgrade.sock`, systemd's
/// `RuntimeDirectory=`) passes where that directory is not made, as on a developer's machine:
/// only root can make it in `/run`. So does a directory only the gateway's user can write.
#[test]
fn the_default_upgrade_socket_and_one_in_a_private_directory_pass() {
    let private = tempfile::tempdir().unwrap();
    let mut cfg = test_config(&[loopback(1)]);
    assert_eq!(cfg.server.upgrade_sock, "/run/agent-gateway/upgrade.sock");
    for sock in [None, Some(private.path().join("upgrade.sock"))] {
        if let Some(sock) = sock {
            cfg.server.upgrade_sock = sock.display().to_string();
        }
        let out = check_config_no_resolve(&cfg);
        assert!(
            out.status.success(),
            "{}: {}",
            cfg.server.upgrade_sock,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `run --upgrade` whose socket cannot be made (its directory is missing) ends with an error
/// naming the socket, not with pingora's panic on the failed bind.
#[test]
fn an_upgrade_that_cannot_make_its_socket_is_an_error_not_a_panic() {
    let private = tempfile::tempdir().unwrap();
    let sock = private.path().join("missing").join("upgrade.sock");
    let mut cfg = test_config(&[loopback(1)]);
    cfg.server.upgrade_sock = sock.display().to_string();
    let (status, log) = Gateway::builder(cfg).process().arg("--upgrade").refusal();
    assert!(!status.success(), "{log}");
    assert_ne!(status.code(), Some(101), "a panic, not an error:\n{log}");
    assert!(log.contains(&sock.display().to_string()), "{log}");
}

#[test]
fn config_dump_prints_the_effective_config_without_secrets_and_openapi_needs_no_dns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let mut cfg = FileConfig::for_test(loopback(1), &[loopback(2)]);
    // A backend by a name only a cluster's DNS knows.
    cfg.upstream.addresses = vec!["backend.agent-gateway.svc.cluster.invalid:8080".into()];
    cfg.retirement.sunset_at = Some("2027-06-01T02:00:00+02:00".into());
    std::fs::write(&path, cfg.to_toml()).unwrap();
    let config = ["--config".as_ref(), path.as_os_str()];

    let out = cli([["config".as_ref(), "dump".as_ref()].as_slice(), &config].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("sunset_at = \"2027-06-01T00:00:00Z\""),
        "{text}"
    );
    assert!(text.contains("token_sha256 = \"<redacted>\""), "{text}");
    assert!(text.contains("max_body_bytes = 1048576"), "{text}");
    let json = cli([
        ["config".as_ref(), "dump".as_ref(), "--json".as_ref()].as_slice(),
        &config,
    ]
    .concat());
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["upstream"]["read_timeout_ms"], 30_000);

    let openapi = cli([["openapi".as_ref()].as_slice(), &config].concat());
    assert!(
        openapi.status.success(),
        "{}",
        String::from_utf8_lossy(&openapi.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&openapi.stdout).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");

    // An invalid file: every problem, exit 1.
    std::fs::write(&path, "[listen]\nproxy = 1\n").unwrap();
    let out = cli([["config".as_ref(), "dump".as_ref()].as_slice(), &config].concat());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listen.proxy (line 2, column 9)"), "{err}");
    assert!(err.contains("upstream.addresses"), "{err}");
}

/// A config that gives an agent a token published with agent-gateway (the README's and the
/// demo's) is refused by `run` at start and by `check-config`, naming the agent and the token:
/// anyone who read the README could call as that agent. It was only warned about.
#[test]
fn an_agent_on_the_demo_token_is_refused_at_start_and_by_check_config() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth
        .agents
        .push(AgentFile::new("copied-agent", "demo-token"));
    let refusal = r#"agent "copied-agent" accepts the token "demo-token""#;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, cfg.to_toml()).unwrap();
    let out = cli(["check-config".as_ref(), path.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("auth.agents: {refusal}")),
        "{stderr}"
    );
    assert!(!stderr.contains(AGENT_ID), "only that agent: {stderr}");

    let out = cli(["run".as_ref(), "--config".as_ref(), path.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(refusal), "{stderr}");
    assert_eq!(backend.count(), 0);
}

/// The shipped config is the demo's: `check-config` refuses it for the published tokens it
/// accepts, as `run` does, and for nothing else; the demo runs it (`tests/demo.rs`).
#[test]
fn the_shipped_config_is_refused_only_for_its_published_tokens_outside_the_demo() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/gateway.toml");
    let out = cli(["check-config", path]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let problems: Vec<&str> = stderr.lines().filter(|l| l.starts_with("  ")).collect();
    let refusals = [
        ("demo-agent", "demo-token"),
        ("partner-agent", "partner-token"),
    ]
    .map(|(agent, token)| format!(r#"  auth.agents: agent "{agent}" accepts the token "{token}""#));
    assert_eq!(problems.len(), refusals.len(), "{stderr}");
    for (problem, refusal) in problems.iter().zip(&refusals) {
        assert!(problem.starts_with(refusal.as_str()), "{stderr}");
    }
}

/// `hash-token` with `stdin` on its standard input.
fn hash_token(stdin: &[u8]) -> std::process::Output {
    let mut child = Command::new(BIN)
        .arg("hash-token")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn hash_token_prints_the_hex_sha256_of_stdin() {
    let token = "3f9c1a7e5b2d8c4f6a0e1b9d7c5a3f8e";
    let out = hash_token(format!("{token}\n").as_bytes());
    assert!(out.status.success());
    // The digest from the reference implementation, not from the gateway's own code.
    let sha256 = hex::encode(Sha256::digest(token));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), sha256);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "a long token is not warned of"
    );
}

/// A short token is hashed with a warning (its 8-digit label on `/metrics` could be checked
/// offline against guesses), and a published one is refused, as `run` refuses its digest.
#[test]
fn hash_token_warns_of_a_short_token_and_refuses_a_published_one() {
    let out = hash_token(b"secret\n");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        hex::encode(Sha256::digest(b"secret"))
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("warning: this token is 6 bytes"),
        "{stderr}"
    );

    let out = hash_token(b"demo-token\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "no digest printed");
    assert!(stderr.contains("published with agent-gateway"), "{stderr}");
}

#[test]
fn the_mock_backend_serves_the_v2_operations_behind_the_gateway() {
    let mock = MockBackend::start();
    let gw = Gateway::start(&[mock.addr]);
    let resp = post(
        gw.proxy,
        "/api/v1/verify/request",
        r#"{"business_code":"KYC"}"#,
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    let tx = resp.json()["transaction_id"].as_str().unwrap().to_string();
    let status = get(gw.proxy, &format!("/api/v1/transaction/{tx}/status"));
    assert_eq!(status.status, 200);
    assert_eq!(status.json()["transaction_id"], tx.as_str());
    assert_eq!(
        get(gw.proxy, "/api/v2/transaction/never-issued/status").status,
        404
    );
    // The mock checks required fields.
    let resp = post(
        gw.proxy,
        "/api/v2/credential/S/offer",
        r#"{"organization_name":"o"}"#,
    );
    assert_eq!(resp.status, 400);
}

/// The entries of a `--help` section (`Options:`, `Arguments:`, `Commands:`): each entry's
/// first line and whether text follows it (on its line, or indented on the next).
fn help_entries<'t>(help: &'t str, section: &str) -> Vec<(&'t str, bool)> {
    let lines: Vec<&str> = help.lines().collect();
    let Some(start) = lines.iter().position(|l| *l == section) else {
        return Vec::new();
    };
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut entries = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        if line.is_empty() || !line.starts_with(' ') {
            break;
        }
        if indent(line) > 6 {
            continue;
        }
        let inline = line.trim().contains("  ");
        let next = lines
            .get(i + 1)
            .is_some_and(|n| indent(n) > indent(line) + 2);
        entries.push((line.trim(), inline || next));
    }
    entries
}

#[test]
fn every_command_and_flag_has_help_text() {
    let mut missing = Vec::new();
    let mut commands = vec![Vec::<String>::new()];
    while let Some(path) = commands.pop() {
        let out = cli(path.iter().map(String::as_str).chain(["--help"]));
        assert!(out.status.success(), "{path:?} --help");
        let help = String::from_utf8(out.stdout).unwrap();
        for section in ["Arguments:", "Options:"] {
            for (entry, documented) in help_entries(&help, section) {
                if !documented {
                    missing.push(format!("{} {entry}", path.join(" ")));
                }
            }
        }
        for (entry, documented) in help_entries(&help, "Commands:") {
            let name = entry.split_whitespace().next().unwrap().to_owned();
            if name == "help" {
                continue;
            }
            if !documented {
                missing.push(format!("{} {name}", path.join(" ")));
            }
            commands.push(path.iter().cloned().chain([name]).collect());
        }
    }
    assert!(missing.is_empty(), "without help text: {missing:?}");
}
