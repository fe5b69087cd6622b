//! HTTP/2 for clients, against the real binary, with clients nobody here wrote: curl over TLS
//! (ALPN) and with prior knowledge (h2c), the Python `h2` library for streams and for the
//! known attacks as raw frames, and h2load for many concurrent streams.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::net::SocketAddr;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

use agent_gateway::config::FileConfig;
use common::curl::{curl, header_args, https_args};
use common::pki::TestPki;
use common::python::venv_bin;
use common::*;
use serde_json::{json, Value};

const H2CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/h2client.py");

/// A command of tests/common/h2client.py running against the gateway: what it reports on
/// stderr as it happens, and its JSON result once it ends.
struct H2Client {
    child: Child,
    events: Lines<BufReader<ChildStderr>>,
}

impl H2Client {
    fn spawn(command: &str, addr: SocketAddr, args: &[&str]) -> H2Client {
        let mut child = Command::new(venv_bin().join("python"))
            .arg(H2CLIENT)
            .arg(command)
            .arg(addr.ip().to_string())
            .arg(addr.port().to_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python runs");
        let events = BufReader::new(child.stderr.take().unwrap()).lines();
        H2Client { child, events }
    }

    /// Reads its stderr until it has reported `event` `n` times (it gives up, and the test
    /// fails, within its own socket timeouts).
    fn wait_for(&mut self, event: &str, n: usize) {
        let mut seen = 0;
        let mut other = Vec::new();
        while seen < n {
            match self.events.next() {
                Some(Ok(line)) if line == event => seen += 1,
                Some(Ok(line)) => other.push(line),
                _ => panic!(
                    "h2client ended after {seen} of {n} {event:?}:\n{}",
                    other.join("\n")
                ),
            }
        }
    }

    /// Gives a command that waits for a cue (a line on its stdin) its cue.
    fn cue(&mut self) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Its JSON result, once it ends; it must succeed.
    fn result(self) -> Value {
        let H2Client { child, events } = self;
        let rest = std::thread::spawn(move || events.map_while(Result::ok).collect::<Vec<_>>());
        let out = child.wait_with_output().unwrap();
        let stderr = rest.join().unwrap().join("\n");
        assert!(out.status.success(), "h2client failed:\n{stderr}");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

/// Runs a command of tests/common/h2client.py against `addr` to its end; its JSON output.
fn h2client(command: &str, addr: SocketAddr, args: &[&str]) -> Value {
    H2Client::spawn(command, addr, args).result()
}

/// Streams on one connection: (method, path, extra headers, body) each.
fn streams(addr: SocketAddr, spec: Value) -> Vec<Value> {
    let answers = h2client("requests", addr, &[&spec.to_string()]);
    answers.as_array().unwrap().clone()
}

/// Header pairs as the Python client takes them: names in lower case, as HTTP/2 wants.
fn h2_headers(headers: &[(&str, &str)]) -> Value {
    headers
        .iter()
        .map(|(n, v)| json!([n.to_ascii_lowercase(), v]))
        .collect()
}

/// curl's answer to an authenticated `args` request on the gateway.
fn curl_as_agent(args: &[&str], url_args: Vec<String>) -> common::curl::CurlAnswer {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(header_args(&AUTH));
    all.extend(url_args);
    curl(all)
}

#[test]
fn a_plaintext_port_serves_h2c_with_prior_knowledge_and_http11_alike() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let url = format!("http://{}{VERIFY_V1}", gw.proxy);
    let h2c = curl_as_agent(
        &["--http2-prior-knowledge", "-X", "POST", "-d", BODY],
        vec![url.clone()],
    );
    assert_eq!((h2c.version.as_str(), h2c.status), ("2", 200), "{h2c:?}");
    assert!(
        h2c.body.contains("/api/v2/verify/ORG_DEFAULT/request"),
        "{h2c:?}"
    );
    let seen = backend.last();
    assert_eq!(seen.body, BODY.as_bytes());
    assert!(seen.header("x-request-id").is_some());
    assert_eq!(seen.header("host"), Some(gw.proxy.to_string().as_str()));

    let http11 = curl_as_agent(&["--http1.1", "-X", "POST", "-d", BODY], vec![url]);
    assert_eq!((http11.version.as_str(), http11.status), ("1.1", 200));
    assert_eq!(backend.count(), 2, "each request forwarded once");
}

#[test]
fn the_tls_listener_offers_h2_by_alpn_and_http11_to_those_who_ask() {
    let pki = TestPki::localhost("gw");
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    pki.serve_on(&mut cfg);
    let gw = Gateway::builder(cfg).start();
    for (flag, want) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let answer = curl_as_agent(&[flag], https_args(gw.proxy, &pki, STATUS_V1));
        assert_eq!(
            (answer.version.as_str(), answer.status),
            (want, 200),
            "{flag}: {answer:?}"
        );
    }
    assert_eq!(backend.count(), 2);
}

#[test]
fn http2_off_serves_only_http11_on_both_listeners() {
    let pki = TestPki::localhost("gw");
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.http2 = false;
    let plain = Gateway::builder(cfg.clone()).start();
    let url = format!("http://{}{STATUS_V1}", plain.proxy);
    let h2c = curl_as_agent(&["--http2-prior-knowledge"], vec![url]);
    assert_ne!(h2c.status, 200, "no h2c when http2 is off");

    pki.serve_on(&mut cfg);
    let tls = Gateway::builder(cfg).start();
    let answer = curl_as_agent(&["--http2"], https_args(tls.proxy, &pki, STATUS_V1));
    assert_eq!(
        (answer.version.as_str(), answer.status),
        ("1.1", 200),
        "ALPN offers only http/1.1"
    );
}

#[test]
fn every_stream_gets_what_an_http11_request_gets() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.max_body_bytes = 2048;
    cfg.retirement.deprecated_at = Some("2026-06-01T00:00:00Z".into());
    let gw = Gateway::builder(cfg).start();
    let big = format!(r#"{{"business_code":"{}"}}"#, "x".repeat(4000));
    let auth_headers = || h2_headers(&AUTH);
    let answers = streams(
        gw.proxy,
        json!([
            {"method": "POST", "path": VERIFY_V1, "headers": auth_headers(), "body": BODY},
            {"method": "POST", "path": "/api/v2/verify/SVC/request", "headers": auth_headers(), "body": BODY},
            {"method": "POST", "path": VERIFY_V1, "headers": [["x-service-agent-id", "agent-1"], ["x-auth-token", "wrong"]], "body": "{}"},
            {"method": "GET", "path": "/nope", "headers": auth_headers()},
            {"method": "GET", "path": VERIFY_V1, "headers": auth_headers()},
            {"method": "POST", "path": VERIFY_V1, "headers": [["x-service-agent-id", "agent-1"], ["x-auth-token", "secret"], ["content-type", "text/plain"]], "body": "{}"},
            {"method": "POST", "path": VERIFY_V1, "headers": auth_headers(), "body": "{}"},
            {"method": "POST", "path": VERIFY_V1, "headers": auth_headers(), "body": big},
            {"method": "HEAD", "path": "/nope", "headers": auth_headers()},
            {"method": "GET", "path": STATUS_V1, "headers": [["x-service-agent-id", "agent-1"], ["x-auth-token", "secret"], ["x-big", "y".repeat(40_000)]]},
        ]),
    );
    let got: Vec<(u64, String)> = answers
        .iter()
        .map(|a| {
            let body: Value =
                serde_json::from_str(a["body"].as_str().unwrap()).unwrap_or(Value::Null);
            (
                a["status"].as_u64().unwrap_or(0),
                body["message_code"].to_string(),
            )
        })
        .collect();
    let want = [
        (200, "0"),
        (200, "0"),
        (401, "null"),
        (404, "40400"),
        (405, "40500"),
        (415, "41500"),
        (400, "40002"),
        (413, "41300"),
        (404, "null"),
        (431, "43100"),
    ];
    for (i, ((status, code), (want_status, want_code))) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (*status, code.as_str()),
            (want_status, want_code),
            "stream {i}: {}",
            answers[i]
        );
    }
    // v1 answers carry the retirement signals, v2 ones not; every answer its request id.
    assert_eq!(answers[0]["headers"]["deprecation"], "@1780272000");
    assert!(answers[1]["headers"]["deprecation"].is_null());
    assert!(answers
        .iter()
        .all(|a| a["headers"]["x-request-id"].is_string()));
    assert_eq!(answers[2]["body"], "\"not authorized\"");
    assert_eq!(answers[8]["body"], "", "no body in an answer to HEAD");
    assert!(answers[8]["headers"]["content-length"].is_string());
    assert_eq!(backend.count(), 2, "only the two admitted requests went on");
    let logged = gw.wait_for_access_log(answers.len());
    assert!(logged.iter().all(|l| l["protocol"] == "h2"), "{logged:?}");
}

/// A stream that names no host (neither `:authority` nor `Host`) is refused and not
/// forwarded: the backend is never sent a host of the gateway's making. pingora answers it
/// 400, with no body, before the stream reaches the gateway (RFC 9113 §8.1.1); admission
/// would refuse it too (40003).
#[test]
fn a_stream_that_names_no_host_is_refused() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let answers = streams(
        gw.proxy,
        json!([
            {"method": "GET", "path": STATUS_V1, "headers": h2_headers(&AUTH), "no_authority": true},
            {"method": "GET", "path": STATUS_V1, "headers": h2_headers(&AUTH)},
        ]),
    );
    assert_eq!(answers[0]["status"], 400, "{}", answers[0]);
    assert_eq!(answers[1]["status"], 200, "{}", answers[1]);
    assert_eq!(backend.count(), 1);
}

/// What HTTP/2 and HTTP/1.1 say differently is translated: a client's cookie crumbs reach the
/// backend as one line (RFC 9113 §8.2.3), and a backend's `TE` or `Upgrade`, which HTTP/2 may
/// not carry, is dropped rather than costing the client its answer.
#[test]
fn cookies_and_hop_headers_cross_between_http2_and_http11() {
    let backend = Backend::with(|_| {
        Action::Raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTE: gzip\r\nUpgrade: h2c\r\n\r\n{}".to_vec(),
        )
    });
    let gw = Gateway::start(&[backend.addr]);
    let mut headers = AUTH.to_vec();
    headers.extend([("cookie", "a=1"), ("cookie", "b=2")]);
    let answers = streams(
        gw.proxy,
        json!([{"method": "GET", "path": STATUS_V1, "headers": h2_headers(&headers)}]),
    );
    assert_eq!(
        (&answers[0]["status"], &answers[0]["body"]),
        (&json!(200), &json!("{}"))
    );
    assert!(answers[0]["headers"]["te"].is_null() && answers[0]["headers"]["upgrade"].is_null());
    assert_eq!(
        headers_named(&backend.last().headers, "cookie"),
        ["a=1; b=2"]
    );
}

/// A backend answer whose framing breaks before any of its body went out is the gateway's to
/// answer, on HTTP/2 as on HTTP/1.1: the stream gets the 502, not an empty reset.
#[test]
fn a_stream_whose_backend_answer_breaks_before_its_body_gets_a_502() {
    let backend = Backend::with(|_| {
        Action::Raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{\"status_code\":200}".to_vec(),
        )
    });
    let gw = Gateway::start(&[backend.addr]);
    let answers = streams(
        gw.proxy,
        json!([{"method": "GET", "path": STATUS_V1, "headers": h2_headers(&AUTH)}]),
    );
    assert_eq!(answers[0]["status"], json!(502), "{answers:?}");
    let body: Value = serde_json::from_str(answers[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["message_code"], 50201, "{body}");
    let line = gw.wait_for_access_log(1).pop().unwrap();
    assert_eq!(
        (&line["status"], &line["protocol"]),
        (&json!(502), &json!("h2"))
    );
}

#[test]
fn h2load_many_concurrent_streams_reach_the_backend_exactly_once_each() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body.json");
    std::fs::write(&body, BODY).unwrap();
    let out = Command::new(which("h2load"))
        .args(["-n", "2000", "-c", "4", "-m", "32", "-d"])
        .arg(&body)
        .args(header_args(&AUTH))
        .arg(format!("http://{}{VERIFY_V1}", gw.proxy))
        .output()
        .expect("h2load runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("2000 succeeded, 0 failed, 0 errored"),
        "{report}"
    );
    assert!(report.contains("status codes: 2000 2xx"), "{report}");
    assert_eq!(backend.count(), 2000);
    gw.wait_for_metric(
        "agent_gateway_requests_by_protocol_total{protocol=\"h2\"}",
        2000.0,
    );
    assert_eq!(
        gw.metric("agent_gateway_connections_total{protocol=\"h2\"}"),
        4.0
    );
}

/// A gateway (its test config changed by `edit`) in front of a backend, to be attacked.
fn under_attack(edit: impl FnOnce(&mut FileConfig)) -> (Backend, Gateway) {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    edit(&mut cfg);
    (backend, Gateway::builder(cfg).start())
}

fn still_served(gw: &Gateway) {
    let resp = get(gw.proxy, STATUS_V1);
    assert_eq!(resp.status, 200, "another client is still served");
}

#[test]
fn rapid_reset_streams_neither_reach_the_backend_in_bulk_nor_stop_the_gateway() {
    let (backend, gw) = under_attack(|_| {});
    let result = h2client("rapid-reset", gw.proxy, &["1000", STATUS_V1]);
    assert!(
        result["goaway"].as_u64() == Some(11) || result["closed"] == true,
        "the attacking connection is told to calm down or closed: {result}"
    );
    assert!(
        backend.count() < 100,
        "{} of 1000 reset streams reached the backend",
        backend.count()
    );
    still_served(&gw);
}

/// A client that resets each stream as its body ends (gone before any answer) has its
/// requests sent nowhere, and each is counted and logged as nginx logs it, 499 ("client
/// closed request"), not as a status 0 no HTTP answer has.
#[test]
fn streams_reset_as_their_body_ends_are_counted_and_logged_as_499() {
    let (backend, gw) = under_attack(|_| {});
    h2client("cancelled-posts", gw.proxy, &["5", VERIFY_V1]);
    let logged = gw.wait_for_access_log(5);
    let cancelled = logged.iter().filter(|l| l["status"] == 499).count();
    // The reset comes with the body's end: the gateway sees it before it would send, but a
    // request it had sent already is answered as usual.
    assert_eq!(cancelled + backend.count(), 5, "{logged:#?}");
    assert!(cancelled > 0, "{logged:#?}");
    assert!(logged
        .iter()
        .all(|l| l["status"] != 499 || l["client_aborted"] == true));
    let metrics = gw.scrape();
    assert!(!metrics.contains("code=\"0\""), "{metrics}");
    assert_eq!(
        gw.metric("agent_gateway_requests_total{api_version=\"v1\",code=\"499\",operation=\"verify_request\"}"),
        cancelled as f64
    );
}

/// A stream reset while its request waits for a backend connection (the budget spent) is
/// sent nowhere, and logged as 499; its place in the queue goes to the request behind it.
#[test]
fn a_stream_reset_while_its_request_waited_is_sent_nowhere() {
    // The Python tools first (built once, in seconds): the request held at the backend is
    // not to wait that long.
    venv_bin();
    let gate = Gate::new();
    let (backend, cfg) = held_behind_one_connection(&gate);
    let gw = Gateway::builder(cfg).start();
    let first = post_on_a_thread(&gw, "first");
    gw.wait_until("the first at the backend", || backend.count() == 1);
    let mut client = H2Client::spawn("reset-on-cue", gw.proxy, &[VERIFY_V1, "gone"]);
    client.wait_for("sent", 1);
    gw.wait_for_metric("agent_gateway_in_flight_requests", 2.0);
    client.cue();
    client.wait_for("reset", 1);

    assert_sent_nowhere_in_plaintext(&gw, &backend, &gate, first);
    client.cue();
    client.result();
}

#[test]
fn a_continuation_flood_ends_its_connection() {
    let (backend, gw) = under_attack(|_| {});
    let result = h2client("continuation-flood", gw.proxy, &["10000"]);
    assert!(
        result["goaway"].is_u64() || result["closed"] == true,
        "the flooding connection is ended: {result}"
    );
    assert!(
        result["sent"].as_u64().unwrap() < 10000,
        "it stopped reading: {result}"
    );
    assert_eq!(backend.count(), 0);
    still_served(&gw);
}

fn rss_kib(gw: &Gateway) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

#[test]
fn settings_and_ping_floods_are_bounded_and_their_connections_closed() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.client_header_timeout_ms = 1500;
    // A process of its own: its RSS is the gateway's alone.
    let gw = Gateway::builder(cfg).process().start();
    let before = rss_kib(&gw);
    for flood in ["settings-flood", "ping-flood"] {
        let result = h2client(flood, gw.proxy, &["200000"]);
        // A connection that opens no stream is closed after the header timeout, whatever
        // frames it sends; until then the flood is answered as fast as it is read. (The
        // client reads for 30 s at most: a connection left open fails here.)
        assert!(
            result["goaway"].is_u64() || result["closed"] == true,
            "{flood}: {result}"
        );
        still_served(&gw);
    }
    let grown = rss_kib(&gw).saturating_sub(before);
    assert!(grown < 64 * 1024, "RSS grew {grown} KiB under the floods");
}

#[test]
fn a_stream_left_idle_gets_408_and_an_idle_connection_is_closed() {
    let (backend, gw) = under_attack(|cfg| {
        cfg.limits.client_body_timeout_ms = 500;
        cfg.limits.client_header_timeout_ms = 1000;
    });
    let result = h2client("idle-stream", gw.proxy, &[VERIFY_V1]);
    assert_eq!(result["status"], 408, "{result}");
    assert!(result["body"].as_str().unwrap().contains("40800"));
    // A GOAWAY, then the connection closed a second later though the client, which sends
    // nothing, never acks its PING. The client waits 30 s at most.
    let result = h2client("idle-connection", gw.proxy, &[]);
    assert!(
        result["goaway"] == 0 && result["closed"] == true,
        "{result}"
    );
    assert!(result["seconds"].as_f64().unwrap() < 5.0, "{result}");
    assert_eq!(backend.count(), 0);
}

/// A backend whose answers wait until the test opens `gate`.
fn gated_backend(gate: &Gate) -> Backend {
    let gate = gate.clone();
    Backend::with(move |_| {
        Action::AfterGate(
            gate.clone(),
            r#"{"status_code":200,"message_code":0,"message":"slow"}"#.into(),
        )
    })
}

#[test]
fn streams_past_the_limit_are_refused_not_queued() {
    let gate = Gate::new();
    let backend = gated_backend(&gate);
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.h2_max_concurrent_streams = 2;
    let gw = Gateway::builder(cfg).start();
    let get = json!({"method": "GET", "path": STATUS_V1, "headers": h2_headers(&AUTH[..2])});
    let spec = json!([get, get, get, get, get]).to_string();
    let mut client = H2Client::spawn("requests", gw.proxy, &[&spec]);
    // Two streams held open at the backend, the three past the limit refused meanwhile.
    client.wait_for("reset", 3);
    gate.open();
    let answers = client.result();
    let answers = answers.as_array().unwrap();
    let served = answers.iter().filter(|a| a["status"] == 200).count();
    let refused = answers.iter().filter(|a| a["reset"] == 7).count();
    assert_eq!((served, refused), (2, 3), "{answers:?}");
    assert_eq!(backend.count(), 2);
}

/// A gateway in front of a backend that holds its answers until `gate` opens, with a grace
/// period no test outlasts: only the drain can end it.
fn draining_gateway(gate: &Gate, edit: impl FnOnce(&mut FileConfig)) -> (Backend, Gateway) {
    let backend = gated_backend(gate);
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.grace_period_seconds = 10 * PATIENCE.as_secs();
    edit(&mut cfg);
    // Signals: a process.
    (backend, Gateway::builder(cfg).process().start())
}

/// A slow stream on `gw` once its request is at the backend.
fn slow_stream(gw: &Gateway, backend: &Backend) -> H2Client {
    let client = H2Client::spawn("slow-stream", gw.proxy, &[STATUS_V1]);
    gw.wait_until("the request to reach the backend", || backend.count() == 1);
    client
}

#[test]
fn sigterm_sends_goaway_and_lets_the_open_stream_finish() {
    let gate = Gate::new();
    let (backend, gw) = draining_gateway(&gate, |_| {});
    let mut client = slow_stream(&gw, &backend);
    gw.terminate();
    client.wait_for("goaway", 1);
    gate.open();
    let result = client.result();
    assert_eq!(result["status"], 200, "{result}");
    assert!(
        result["body"].as_str().unwrap().contains("slow"),
        "{result}"
    );
    assert_eq!(
        result["goaway_first"], true,
        "a GOAWAY came before the answer: {result}"
    );
}

#[test]
fn sigquit_hands_over_with_a_goaway_that_lets_the_open_stream_finish() {
    let gate = Gate::new();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("upgrade.sock");
    let (backend, old) = draining_gateway(&gate, |cfg| {
        cfg.server.upgrade_sock = sock.display().to_string();
    });
    let mut client = slow_stream(&old, &backend);
    let new = old.hand_over();
    client.wait_for("goaway", 1);
    gate.open();
    let result = client.result();
    assert_eq!(result["status"], 200, "{result}");
    assert_eq!(result["goaway_first"], true, "{result}");
    // The new process serves HTTP/2 on the same port.
    let url = format!("http://{}{STATUS_V1}", new.proxy);
    let h2c = curl_as_agent(&["--http2-prior-knowledge"], vec![url]);
    assert_eq!((h2c.version.as_str(), h2c.status), ("2", 200));
}

/// A gateway process that may have one connection to a gated backend, and whose HTTP/2
/// connections are cut a second into a drain; with the directory of its upgrade socket, for
/// a handover.
fn cut_a_second_into_its_drain(gate: &Gate) -> (Backend, Gateway, tempfile::TempDir) {
    let (backend, mut cfg) = held_behind_one_connection(gate);
    cfg.server.grace_period_seconds = 1;
    let sock_dir = tempfile::tempdir().unwrap();
    cfg.server.upgrade_sock = sock_dir.path().join("upgrade.sock").display().to_string();
    (backend, Gateway::builder(cfg).process().start(), sock_dir)
}

/// A stream its client reset is the client's doing, even when its connection is cut at the
/// drain deadline before the gateway notices the reset (it does when the answer comes): logged
/// with the backend's status and `client_aborted`, not as the gateway's cut.
#[test]
fn a_stream_its_client_reset_before_the_drain_cut_is_still_the_clients() {
    let gate = Gate::new();
    let (backend, mut old, _sock_dir) = cut_a_second_into_its_drain(&gate);
    let mut client = H2Client::spawn("reset-on-cue", old.proxy, &[VERIFY_V1, "reset-then-cut"]);
    client.wait_for("sent", 1);
    old.wait_until("the request at the backend", || backend.count() == 1);
    client.cue();
    client.wait_for("reset", 1);
    // The handover's GOAWAY, then its drain deadline (1 s) cuts the connection, which the
    // client keeps open: nothing to wait on but the deadline.
    let _new = old.hand_over();
    std::thread::sleep(Duration::from_millis(2_500));
    gate.open();
    old.wait_exit();
    client.cue();
    let logged = old.access_log();
    assert_eq!(
        who_ended(&logged),
        [(json!(200), json!(true), Value::Null)],
        "{logged:#?}"
    );
}

/// Streams still open when an HTTP/2 connection's drain deadline passes are cut by the
/// gateway, not given up by their client: logged 503 with `client_aborted` false and
/// `closed_by_gateway`, never 499, whether the stream waited for a backend connection or had
/// its answer come after the cut (nothing of it went out).
#[test]
fn streams_the_drain_deadline_cuts_are_logged_as_the_gateways_503() {
    let gate = Gate::new();
    let (backend, mut old, _sock_dir) = cut_a_second_into_its_drain(&gate);
    // One stream at the backend, the other waiting for the one connection it may have.
    let client = H2Client::spawn("slow-stream", old.proxy, &[STATUS_V1, "2"]);
    old.wait_until("the first at the backend", || backend.count() == 1);
    old.wait_for_metric("agent_gateway_in_flight_requests", 2.0);
    // A handover: the old process drains for pingora's 5 s after the deadline its HTTP/2
    // connections have (`server.grace_period_seconds` from the GOAWAY), time to log the cut.
    let _new = old.hand_over();
    let result = client.result();
    assert_eq!(result["goaway_first"], true, "{result}");
    assert_eq!(result["closed_with_streams_open"], true, "{result}");
    // The backend answers the first once its connection is gone.
    gate.open();
    old.wait_exit();
    let logged = old.access_log();
    let cut = (json!(503), json!(false), json!(true));
    assert_eq!(who_ended(&logged), [cut.clone(), cut], "{logged:#?}");
}

/// A client that does not take its stream's answer (it opens no flow-control window past the
/// first 64 KiB) within `limits.client_send_timeout_ms` has the stream cut by the gateway:
/// reset, so that the part it got (a body of no declared length) is not taken for the whole
/// answer, and logged so: the backend's status (its head went out), `client_aborted` false,
/// `closed_by_gateway`. The client did not reset it; it was too slow.
#[test]
fn a_stream_whose_client_does_not_read_its_answer_is_reset_as_the_gateways_cut() {
    venv_bin();
    let big = vec![b'x'; 1 << 20];
    let backend = Backend::with(move |_| Action::Chunked(big.clone(), 64 << 10));
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.client_send_timeout_ms = 500;
    let gw = Gateway::builder(cfg).start();
    let result = H2Client::spawn("slow-stream", gw.proxy, &[STATUS_V1]).result();
    assert_eq!(result["status"], 200, "{result}");
    let stream = &result["streams"][0];
    assert_eq!(
        (&stream["done"], &stream["reset"]),
        (&json!(true), &json!(2)),
        "reset (INTERNAL_ERROR), not ended: {stream}"
    );
    let logged = gw.wait_for_access_log(1);
    assert_eq!(
        who_ended(&logged),
        [(json!(200), json!(false), json!(true))],
        "{logged:#?}"
    );
}

/// A stream the client opens as its idle connection's GOAWAY reaches it (the two cross on the
/// wire) is served to its end like any request, however long its backend takes: the second
/// an idle connection gets after its GOAWAY is for one with no stream open. The connection
/// closes after the answer, whether the client acked the GOAWAY's PING (the final GOAWAY
/// names the stream) or never did (a second later).
#[test]
fn a_stream_that_crosses_an_idle_connections_goaway_is_served_to_its_end() {
    venv_bin();
    let gate = Gate::new();
    let backend = gated_backend(&gate);
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.client_header_timeout_ms = 500;
    cfg.upstream.read_timeout_ms = 10_000;
    let gw = Gateway::builder(cfg).start();
    let pings = ["ack", "no-ack"];
    let mut clients =
        pings.map(|ping| H2Client::spawn("cross-goaway", gw.proxy, &[STATUS_V1, ping]));
    for client in &mut clients {
        client.wait_for("goaway", 1);
    }
    gw.wait_until("both streams at the backend", || backend.count() == 2);
    // The backend answers past the second the idle connections had.
    std::thread::sleep(Duration::from_millis(1500));
    gate.open();
    for (client, ping) in clients.into_iter().zip(pings) {
        let result = client.result();
        assert_eq!(result["status"], 200, "{ping}: {result}");
        assert!(
            result["body"].as_str().unwrap().contains("slow"),
            "{ping}: {result}"
        );
        let closed_after = result["closed_after_answer"].as_f64();
        assert!(closed_after.is_some_and(|s| s < 5.0), "{ping}: {result}");
        if ping == "ack" {
            assert_eq!(result["goaways"], json!([i32::MAX, 1]), "{result}");
        }
    }
    let logged = gw.wait_for_access_log(2);
    assert!(
        logged
            .iter()
            .all(|l| l["status"] == 200 && l["closed_by_gateway"].is_null()),
        "{logged:#?}"
    );
}

/// A drain that comes while a stream that crossed its idle connection's GOAWAY is served
/// applies its own deadline, `server.grace_period_seconds`: the stream is then cut as any
/// stream a drain outlasts, and logged as the gateway's 503.
#[test]
fn a_drain_during_an_idle_close_cuts_the_crossing_stream_at_its_own_deadline() {
    venv_bin();
    let gate = Gate::new();
    let (backend, mut cfg) = held_behind_one_connection(&gate);
    cfg.limits.client_header_timeout_ms = 500;
    cfg.server.grace_period_seconds = 1;
    let sock_dir = tempfile::tempdir().unwrap();
    cfg.server.upgrade_sock = sock_dir.path().join("upgrade.sock").display().to_string();
    let mut old = Gateway::builder(cfg).process().start();
    let mut client = H2Client::spawn("cross-goaway", old.proxy, &[STATUS_V1, "ack"]);
    client.wait_for("goaway", 1);
    old.wait_until("the stream at the backend", || backend.count() == 1);
    // A handover: the old process outlives its connections' drain deadline by pingora's 5 s,
    // time to log the cut.
    let _new = old.hand_over();
    let result = client.result();
    assert_eq!(result["closed_with_stream_open"], true, "{result}");
    gate.open();
    old.wait_exit();
    let logged = old.access_log();
    let cut = (json!(503), json!(false), json!(true));
    assert_eq!(who_ended(&logged), [cut], "{logged:#?}");
}
