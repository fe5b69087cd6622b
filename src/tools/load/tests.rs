//! Tests of the load generator's pure parts and of whole runs against a local server.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::args::*;
use super::report::*;
use super::request::*;
use super::run::*;
use super::schedule::*;
use super::*;
use crate::api::operation::{ApiVersion, Operation};

fn mix(s: &str) -> Mix {
    s.parse().unwrap()
}

#[test]
fn mix_parses_names_and_weights() {
    let m = mix(DEFAULT_MIX);
    assert_eq!(m.weights, [50, 20, 10, 10, 10]);
    assert_eq!(m.to_string(), DEFAULT_MIX);
    let m = mix(" verify_response = 3 , transaction_status=1 ");
    assert_eq!(m.weights, [0, 3, 0, 0, 1]);
    assert_eq!(m.to_string(), "verify_response=3,transaction_status=1");
}

#[test]
fn mix_refuses_bad_input() {
    for bad in [
        "",
        "verify_request=0",
        "verify_request",
        "verify=1",
        "verify_request=-1",
        "verify_request=1.5",
        "verify_request=1,verify_request=2",
    ] {
        assert!(
            matches!(bad.parse::<Mix>(), Err(LoadError::Mix(_))),
            "{bad}"
        );
    }
}

#[test]
fn mix_draws_follow_the_weights() {
    let m = mix(DEFAULT_MIX);
    let mut counts = [0u64; Operation::COUNT];
    let n = 100_000;
    for i in 0..n {
        counts[m.pick(i) as usize] += 1;
    }
    for (count, want) in counts.iter().zip([50, 20, 10, 10, 10]) {
        let pct = *count as f64 * 100.0 / n as f64;
        assert!((pct - want as f64).abs() < 1.0, "{counts:?}");
    }
    // Zero weight is never drawn; draws are deterministic.
    let only = mix("credential_offer=1,verify_request=0");
    assert!((0..1000).all(|i| only.pick(i) == Operation::CredentialOffer));
    assert_eq!(m.pick(42), m.pick(42));
}

#[test]
fn durations_and_rates() {
    assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
    for bad in ["", "s", "0s", "10x", "-1s", "1e3"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
    assert_eq!("max".parse::<Rate>().unwrap(), Rate::Max);
    assert_eq!("5000".parse::<Rate>().unwrap(), Rate::PerSecond(5000.0));
    for bad in ["0", "-5", "fast", "inf", "NaN"] {
        assert!(bad.parse::<Rate>().is_err(), "{bad}");
    }
}

#[test]
fn targets() {
    let t: Target = "http://127.0.0.1:8083".parse().unwrap();
    assert_eq!(t.host_port, "127.0.0.1:8083");
    assert_eq!(t.authority, "127.0.0.1:8083");
    assert_eq!(t.prefix, "");
    let t: Target = "http://localhost/gw/".parse().unwrap();
    assert_eq!(t.host_port, "localhost:80");
    assert_eq!(t.prefix, "/gw");
    for bad in ["https://x", "127.0.0.1:80", "http://x/?a=1", "nope"] {
        assert!(bad.parse::<Target>().is_err(), "{bad}");
    }
}

#[test]
fn schedule_is_fixed_by_rate() {
    assert_eq!(total_requests(5000.0, Duration::from_secs(10)), 50_000);
    assert_eq!(total_requests(0.5, Duration::from_secs(3)), 2);
    assert_eq!(intended_offset(0, 5000.0), Duration::ZERO);
    assert_eq!(intended_offset(5000, 5000.0), Duration::from_secs(1));
    assert_eq!(intended_offset(1, 4000.0), Duration::from_micros(250));
    assert_eq!(due_by(Duration::ZERO, 1000.0, 10), 1);
    assert_eq!(due_by(Duration::from_micros(2500), 1000.0, 10), 3);
    assert_eq!(due_by(Duration::from_secs(5), 1000.0, 10), 10);
    // Every request counted as due is due by then.
    for us in [0u64, 999, 1000, 1001, 123_456] {
        let e = Duration::from_micros(us);
        let n = due_by(e, 1000.0, u64::MAX);
        assert!(intended_offset(n - 1, 1000.0) <= e);
        assert!(intended_offset(n, 1000.0) > e);
    }
}

fn body_json(op: Operation, i: u64) -> serde_json::Value {
    serde_json::from_str(&request_body(op, i, 7).unwrap()).unwrap()
}

#[test]
fn bodies_follow_the_spec() {
    for i in 0..8 {
        let v = body_json(Operation::VerifyRequest, i);
        assert_eq!(v["business_code"], "KYC-BASIC");
        // Rule 2: allow_multiple_read only without connection_id.
        assert!(v.get("connection_id").is_none() || v.get("allow_multiple_read").is_none());
        let v = body_json(Operation::VerifyResponse, i);
        assert!(v["presentation_id"].is_string() && v["result"].is_boolean());
        assert!(v["descriptions"][0]["lang"].is_string());
        let v = body_json(Operation::ConnectionInvitation, i);
        assert!(v["organization_name"].is_string());
        let v = body_json(Operation::CredentialOffer, i);
        assert!(v["organization_name"].is_string() && v["credential_def_id"].is_string());
        // Rule 3: credential_values whenever connection_id is given.
        if v.get("connection_id").is_some() {
            assert_eq!(v["credential_values"].as_array().unwrap().len(), 3);
        }
    }
    // Both shapes occur.
    assert!(body_json(Operation::VerifyRequest, 0)["connection_id"].is_string());
    assert!(body_json(Operation::VerifyRequest, 1)["allow_multiple_read"].is_boolean());
    assert_ne!(
        body_json(Operation::VerifyRequest, 1)["request_uid"],
        body_json(Operation::VerifyRequest, 2)["request_uid"]
    );
    assert!(request_body(Operation::TransactionStatus, 0, 7).is_none());
}

#[test]
fn paths_per_version() {
    let p = |api, op, tx| request_path("", api, "SVC", op, tx);
    assert_eq!(
        p(ApiVersion::V1, Operation::VerifyRequest, ""),
        "/api/v1/verify/request"
    );
    assert_eq!(
        p(ApiVersion::V2, Operation::VerifyRequest, ""),
        "/api/v2/verify/SVC/request"
    );
    assert_eq!(
        p(ApiVersion::V2, Operation::ConnectionInvitation, ""),
        "/api/v2/connection/SVC/invitation"
    );
    assert_eq!(
        p(ApiVersion::V1, Operation::CredentialOffer, ""),
        "/api/v1/credential/offer"
    );
    assert_eq!(
        p(ApiVersion::V2, Operation::VerifyResponse, ""),
        "/api/v2/verify/response"
    );
    assert_eq!(
        p(ApiVersion::V1, Operation::TransactionStatus, "a/b c"),
        "/api/v1/transaction/a%2Fb%20c/status"
    );
    assert_eq!(
        request_path("/gw", ApiVersion::V1, "", Operation::VerifyResponse, ""),
        "/gw/api/v1/verify/response"
    );
}

fn script(m: &str) -> Script {
    Script {
        authority: "127.0.0.1:8083".into(),
        prefix: String::new(),
        api: ApiVersion::V1,
        service: String::new(),
        agent_id: "agent-1".into(),
        token: "secret".into(),
        mix: mix(m),
        run: 0xab,
    }
}

#[test]
fn request_bytes_are_valid_http() {
    let s = script(DEFAULT_MIX);
    let ids = VecDeque::from(["tx-1".to_string()]);
    let mut out = BytesMut::new();
    let mut seen_post = false;
    for i in 0..50 {
        let op = s.write_request(i, &ids, &mut out);
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        let head = match req.parse(&out).unwrap() {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("incomplete request"),
        };
        assert_eq!(req.method, Some(op.method()));
        let get = |name: &str| {
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| std::str::from_utf8(h.value).unwrap().to_owned())
        };
        assert_eq!(get("x-service-agent-id").as_deref(), Some("agent-1"));
        assert_eq!(get("x-auth-token").as_deref(), Some("secret"));
        if op == Operation::TransactionStatus {
            assert_eq!(head, out.len());
            assert_eq!(req.path, Some("/api/v1/transaction/tx-1/status"));
        } else {
            seen_post = true;
            let len: usize = get("content-length").unwrap().parse().unwrap();
            assert_eq!(head + len, out.len());
            serde_json::from_slice::<serde_json::Value>(&out[head..]).unwrap();
        }
    }
    assert!(seen_post);
}

#[test]
fn status_reads_use_returned_transaction_ids() {
    let s = script("transaction_status=1");
    let ids = VecDeque::from(["tx-1".to_string()]);
    let mut out = BytesMut::new();
    s.write_request(3, &ids, &mut out);
    assert!(out.starts_with(b"GET /api/v1/transaction/tx-1/status HTTP/1.1\r\n"));
    // Only status reads in the mix, no id yet: a synthetic one (which a backend answers 404).
    s.write_request(3, &VecDeque::new(), &mut out);
    assert!(out.starts_with(b"GET /api/v1/transaction/tx-load-000000ab-3/status "));
    // A mix with other operations sends one of those until a transaction id is known,
    // drawn with their weights.
    let s = script(DEFAULT_MIX);
    let mut counts = [0u64; Operation::COUNT];
    for i in 0..10_000 {
        let op = s.operation(i, false);
        assert_eq!(s.write_request(i, &VecDeque::new(), &mut out), op);
        counts[op as usize] += 1;
    }
    assert_eq!(counts[Operation::TransactionStatus as usize], 0);
    // 50:20:10:10 of the 90 that are not status reads.
    let share = counts[Operation::VerifyRequest as usize] as f64 / 10_000.0;
    assert!((share - 50.0 / 90.0).abs() < 0.02, "{counts:?}");
    assert!((0..10_000).all(|i| s.operation(i, true) == s.mix.pick(i)));
    assert_eq!(
        transaction_id(br#"{"status_code":200,"transaction_id":"tx-9"}"#).as_deref(),
        Some("tx-9")
    );
    assert_eq!(transaction_id(br#"{"status_code":200}"#), None);
    assert_eq!(transaction_id(br#"{"transaction_id":".."}"#), None);
    assert_eq!(transaction_id(b"not json"), None);
}

#[test]
fn credentials_files() {
    let toml = "agent_id = \"agent-1\"\ntoken = \"secret\"\n";
    let json = r#" {"agent_id": "agent-1", "token": "secret"} "#;
    for text in [toml, json] {
        let c = parse_credentials(text, "f").unwrap();
        assert_eq!(
            (c.agent_id.as_str(), c.token.as_str()),
            ("agent-1", "secret")
        );
    }
    for bad in [
        "agent_id = \"a\"",
        "{\"agent_id\":\"\",\"token\":\"t\"}",
        "{",
    ] {
        assert!(matches!(
            parse_credentials(bad, "f"),
            Err(LoadError::CredentialsFormat { .. })
        ));
    }
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadArgs,
}

fn args(line: &str) -> Result<LoadArgs, clap::Error> {
    use clap::Parser;
    Cli::try_parse_from(std::iter::once("load").chain(line.split_whitespace())).map(|c| c.args)
}

#[test]
fn command_line() {
    let a = args("--target http://127.0.0.1:1 --agent-id a --token t").unwrap();
    assert_eq!(a.rate, Rate::PerSecond(1000.0));
    assert_eq!(a.duration, Duration::from_secs(10));
    assert_eq!(a.mix, mix(DEFAULT_MIX));
    let plan = Plan::from_args(&a).unwrap();
    assert_eq!(plan.addr, "127.0.0.1:1".parse().unwrap());
    assert_eq!(plan.script.api, ApiVersion::V1);

    let a = args("--target http://127.0.0.1:1 --api v2 --service S1 --agent-id a --token t --rate max --mix verify_request=1 --json").unwrap();
    let plan = Plan::from_args(&a).unwrap();
    assert_eq!((plan.rate, plan.script.service.as_str()), (Rate::Max, "S1"));
    assert!(a.json);

    for bad in [
        "--target https://x --agent-id a --token t",
        "--target http://x --agent-id a",
        "--target http://x --agent-id a --token t --credentials f",
        "--target http://x --agent-id a --token t --mix nope=1",
        "--target http://x --agent-id a --token t --rate 0",
    ] {
        assert!(args(bad).is_err(), "{bad}");
    }
    let plan = |line| Plan::from_args(&args(line).unwrap());
    assert!(matches!(
        plan("--target http://127.0.0.1:1 --api v2 --agent-id a --token t"),
        Err(LoadError::MissingService)
    ));
    assert!(matches!(
        plan("--target http://127.0.0.1:1 --api v2 --service a/b --agent-id a --token t"),
        Err(LoadError::Service(_))
    ));
    assert!(matches!(
        plan("--target http://127.0.0.1:1"),
        Err(LoadError::MissingCredentials)
    ));
    assert!(matches!(
        plan("--target http://127.0.0.1:1 --credentials /nonexistent/creds.toml"),
        Err(LoadError::CredentialsRead { .. })
    ));
    assert!(matches!(
        plan("--target http://127.0.0.1:1 --agent-id a --token t --connections 0"),
        Err(LoadError::Invalid(_))
    ));
}

fn sample_plan(rate: Rate) -> Plan {
    Plan {
        target_url: "http://127.0.0.1:8083".into(),
        addr: "127.0.0.1:8083".parse().unwrap(),
        rate,
        duration: Duration::from_secs(1),
        connections: 4,
        timeout: Duration::from_secs(1),
        script: script(DEFAULT_MIX),
        progress: false,
    }
}

#[test]
fn report_text_and_json() {
    let mut stats = Stats::default();
    for us in 1..=1000u64 {
        stats.record_response(200, Duration::from_micros(us * 10));
    }
    stats.record_response(401, Duration::from_micros(50));
    stats.record_error(ConnErrorKind::Io);
    stats.operations = [500, 200, 100, 100, 101];
    let r = make_report(
        &sample_plan(Rate::PerSecond(1000.0)),
        &stats,
        Duration::from_secs(1),
    );
    assert_eq!(r.responses, 1001);
    assert_eq!(r.errors.total, 2);
    assert_eq!(r.errors.by_status[&401], 1);
    assert_eq!(r.errors.connection["io"], 1);
    assert!((r.latency_ms.p50 - 5.0).abs() < 0.01, "{:?}", r.latency_ms);
    assert!((r.latency_ms.p99 - 9.9).abs() < 0.02, "{:?}", r.latency_ms);
    assert!((r.latency_ms.max - 10.0).abs() < 0.01);
    let text = format_report(&r);
    for want in [
        "open model at 1000 req/s",
        "1001.0 req/s",
        "p50 5.00",
        "p99.9",
        "by status 401: 1",
        "connection io: 1",
        "verify_request: 500",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(v["model"], "open");
    assert_eq!(v["statuses"]["200"], 1000);
    assert_eq!(v["errors"]["connection"]["io"], 1);
    assert!(v["latency_ms"]["p99_9"].is_number());
    let closed = make_report(&sample_plan(Rate::Max), &Stats::default(), Duration::ZERO);
    assert!(format_report(&closed).contains("closed model"));
    assert!(format_report(&closed).contains("errors      none"));
}

/// A tiny keep-alive server answering every request with an InvitationResponse.
async fn fixed_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut headers = [httparse::EMPTY_HEADER; 16];
                    let mut req = httparse::Request::new(&mut headers);
                    if let Ok(httparse::Status::Complete(head)) = req.parse(&buf) {
                        let len = req
                            .headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                            .map_or(0, |h| {
                                std::str::from_utf8(h.value).unwrap().parse().unwrap()
                            });
                        if buf.len() >= head + len {
                            buf.drain(..head + len);
                            let body = br#"{"status_code":200,"message_code":0,"message":"OK","transaction_id":"tx-7"}"#;
                            let resp = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            if s.write_all(resp.as_bytes()).await.is_err()
                                || s.write_all(body).await.is_err()
                            {
                                return;
                            }
                            continue;
                        }
                    }
                    match s.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    (addr, handle)
}

#[tokio::test]
async fn open_and_closed_runs_against_a_local_server() {
    let (addr, server) = fixed_server().await;
    let mut plan = sample_plan(Rate::PerSecond(400.0));
    plan.addr = addr;
    plan.duration = Duration::from_millis(250);
    let r = execute(plan.clone()).await.unwrap();
    assert_eq!(r.responses, 100, "{r:?}");
    assert_eq!(r.statuses[&200], 100);
    assert_eq!(r.errors.total, 0);
    assert_eq!(r.operations.values().sum::<u64>(), 100);
    assert!(r.elapsed_s >= 0.24, "{r:?}");

    plan.rate = Rate::Max;
    plan.duration = Duration::from_millis(100);
    let r = execute(plan).await.unwrap();
    assert!(r.responses > 10, "{r:?}");
    assert_eq!(r.errors.total, 0);
    server.abort();
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut plan = sample_plan(Rate::PerSecond(100.0));
    plan.addr = addr;
    assert!(matches!(
        execute(plan).await,
        Err(LoadError::Connect(a, _)) if a == addr
    ));
}
