//! Tests of the load generator's pure parts and of whole runs against a local server.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::args::*;
use super::html;
use super::judge::*;
use super::knee::*;
use super::plan::*;
use super::report::*;
use super::request::*;
use super::run::*;
use super::schedule::*;
use super::stats::*;
use super::threshold::*;
use super::timeline::*;
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
fn durations_and_rates_parse_and_bad_ones_are_refused() {
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
fn targets_parse_into_address_authority_and_prefix() {
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
fn a_flat_schedule_is_fixed_by_rate() {
    let s = Schedule::flat(5000.0, Duration::from_secs(10));
    assert_eq!(s.total(), 50_000);
    assert_eq!(s.flat_rate(), Some(5000.0));
    assert_eq!(Schedule::flat(0.5, Duration::from_secs(3)).total(), 2);
    assert_eq!(s.due_at(0), Duration::ZERO);
    assert_eq!(s.due_at(5000), Duration::from_secs(1));
    assert_eq!(
        Schedule::flat(4000.0, Duration::from_secs(1)).due_at(1),
        Duration::from_micros(250)
    );
    let s = Schedule::flat(1000.0, Duration::from_millis(10));
    assert_eq!(s.due_by(Duration::ZERO), 1);
    assert_eq!(s.due_by(Duration::from_micros(2500)), 3);
    assert_eq!(s.due_by(Duration::from_secs(5)), 10);
    // Every request counted as due is due by then, and the next one is not.
    let s = Schedule::flat(1000.0, Duration::from_secs(1000));
    for us in [0u64, 999, 1000, 1001, 123_456] {
        let e = Duration::from_micros(us);
        let n = s.due_by(e);
        assert!(s.due_at(n - 1) <= e);
        assert!(s.due_at(n) > e);
    }
    assert_eq!(s.target_in_second(3), 1000.0);
}

fn stages(s: &str) -> Vec<Stage> {
    s.parse::<Stages>().unwrap().0
}

#[test]
fn stages_parse_durations_and_targets() {
    let st = stages("30s:500, 2m:2000,30s:0");
    assert_eq!(
        st,
        vec![
            Stage {
                duration: Duration::from_secs(30),
                target: 500.0
            },
            Stage {
                duration: Duration::from_secs(120),
                target: 2000.0
            },
            Stage {
                duration: Duration::from_secs(30),
                target: 0.0
            },
        ]
    );
    // A zero-length stage is a jump.
    assert_eq!(stages("0s:100,1s:100")[0].duration, Duration::ZERO);
    for bad in [
        "",
        "30s",
        "30s:",
        ":500",
        "30x:500",
        "30s:-1",
        "30s:fast",
        "30s:inf",
        "0s:100",
        "1s:10,,1s:0",
    ] {
        assert!(
            matches!(bad.parse::<Stages>(), Err(LoadError::Stages(_))),
            "{bad}"
        );
    }
}

#[test]
fn ramps_move_the_rate_linearly_from_stage_to_stage() {
    // 0 -> 500 over 30 s, 500 -> 2000 over 2 min, 2000 -> 0 over 30 s.
    let s = Schedule::ramps(stages("30s:500,2m:2000,30s:0"));
    assert_eq!(s.flat_rate(), None);
    assert_eq!(s.duration(), Duration::from_secs(180));
    // The areas under the rate: 7 500 + 150 000 + 30 000.
    assert_eq!(s.total(), 187_500);
    let called = |secs: f64| s.called_for(Duration::from_secs_f64(secs));
    assert!((called(30.0) - 7_500.0).abs() < 1e-6);
    assert!((called(150.0) - 157_500.0).abs() < 1e-6);
    assert!((called(180.0) - 187_500.0).abs() < 1e-6);
    // Linear inside a stage: the rate halfway up the first ramp is 250, so its second
    // [15, 16) calls for the mean of 250 and 258.33.
    assert!((s.target_in_second(15) - (250.0 + 500.0 * 16.0 / 30.0) / 2.0).abs() < 1e-6);
    assert!((s.target_in_second(90) - (500.0 + 1500.0 * 60.5 / 120.0)).abs() < 1e-6);
    assert!((s.target_in_second(179) - (2000.0 * 0.5 / 30.0)).abs() < 1e-6);
    assert_eq!(s.target_in_second(180), 0.0);
    assert_eq!(s.stage_at(Duration::from_secs(0)), 0);
    assert_eq!(s.stage_at(Duration::from_secs(30)), 1);
    assert_eq!(s.stage_at(Duration::from_secs(149)), 1);
    assert_eq!(s.stage_at(Duration::from_secs(150)), 2);
    assert_eq!(s.stage_at(Duration::from_secs(999)), 2);
    // Request i is due when N reaches i: on the first ramp N(t) = 500 t² / 60.
    assert_eq!(s.due_at(0), Duration::ZERO);
    let t = s.due_at(7_500).as_secs_f64();
    assert!((t - 30.0).abs() < 1e-6, "{t}");
    let t = s.due_at(1_000).as_secs_f64();
    assert!((t - (1_000.0f64 * 60.0 / 500.0).sqrt()).abs() < 1e-6, "{t}");
    // Due times rise, stay within the run, and agree with due_by.
    let mut last = Duration::ZERO;
    for i in (0..s.total()).step_by(997).chain([s.total() - 1]) {
        let due = s.due_at(i);
        assert!(due >= last && due <= s.duration(), "{i}: {due:?}");
        last = due;
        let n = s.due_by(due + Duration::from_nanos(1));
        assert!(n > i, "{i}: due_by {n}");
        assert!(s.due_by(due.saturating_sub(Duration::from_micros(1))) <= i.max(1));
    }
    assert_eq!(s.due_by(Duration::from_secs(1000)), s.total());
}

#[test]
fn stages_of_zero_length_jump_and_a_zero_rate_pauses() {
    // A jump to 100 req/s held 2 s, a pause of 1 s, then 50 req/s for 2 s.
    let s = Schedule::ramps(stages("0s:100,2s:100,0s:0,1s:0,0s:50,2s:50"));
    assert_eq!(s.total(), 300);
    assert_eq!(s.due_at(100), Duration::from_secs(1));
    assert_eq!(s.due_at(199), Duration::from_millis(1990));
    // Nothing is due during the pause; the next request waits for its end.
    assert_eq!(s.due_at(200), Duration::from_secs(2));
    assert_eq!(s.due_at(201), Duration::from_millis(3020));
    assert_eq!(s.target_in_second(2), 0.0);
    assert_eq!(s.target_in_second(3), 50.0);
    assert_eq!(s.due_by(Duration::from_millis(2500)), 201);
}

fn threshold(s: &str) -> Threshold {
    s.parse().unwrap()
}

#[test]
fn thresholds_parse_metrics_units_and_comparisons() {
    let cases: [(&str, Metric, Cmp, f64); 11] = [
        ("p99<50ms", Metric::P99, Cmp::Lt, 50.0),
        ("p50 <= 2", Metric::P50, Cmp::Le, 2.0),
        ("p90<1.5s", Metric::P90, Cmp::Lt, 1500.0),
        ("p99.9<800us", Metric::P99_9, Cmp::Lt, 0.8),
        ("p(99.9)<1ms", Metric::P99_9, Cmp::Lt, 1.0),
        ("max<=2s", Metric::Max, Cmp::Le, 2000.0),
        ("mean<1ms", Metric::Mean, Cmp::Lt, 1.0),
        ("errors<0.1%", Metric::Errors, Cmp::Lt, 0.001),
        ("errors<=0.02", Metric::Errors, Cmp::Le, 0.02),
        ("rps>1800", Metric::Rps, Cmp::Gt, 1800.0),
        ("rps >= 1800/s", Metric::Rps, Cmp::Ge, 1800.0),
    ];
    for (text, metric, cmp, limit) in cases {
        let t = threshold(text);
        assert_eq!((t.metric, t.cmp), (metric, cmp), "{text}");
        assert!((t.limit - limit).abs() < 1e-12, "{text}: {}", t.limit);
        assert_eq!(t.text, text.trim());
    }
    for bad in [
        "p99",
        "p95<1ms",
        "p(95)<1ms",
        "latency<1ms",
        "p99<",
        "p99<fast",
        "p99<-1ms",
        "p99<1h",
        "errors<5",
        "errors<101%",
        "errors<1ms",
        "rps>1800ms",
        "<5",
    ] {
        assert!(
            matches!(bad.parse::<Threshold>(), Err(LoadError::Threshold(..))),
            "{bad}"
        );
    }
}

fn stats_with(latencies_us: impl IntoIterator<Item = u64>, status: u16) -> Stats {
    let mut stats = Stats::default();
    for us in latencies_us {
        stats.ended.record_response(status, us);
    }
    stats
}

#[test]
fn thresholds_are_judged_against_the_report() {
    // 1000 answers of 10 µs to 10 ms, 10 of them 503, 5 connection errors: 15 failed of 1005.
    let mut stats = stats_with((1..=990).map(|i| i * 10), 200);
    for _ in 0..10 {
        stats.ended.record_response(503, 10_000);
    }
    for _ in 0..5 {
        stats.ended.record_error(ConnErrorKind::Io);
    }
    let mut m = Measured::new(std::time::SystemTime::now());
    m.stats = stats;
    m.elapsed = Duration::from_secs(2);
    let r = make_report(&sample_plan(Load::Closed(Duration::from_secs(2))), &m);
    assert!((r.error_ratio().unwrap() - 15.0 / 1005.0).abs() < 1e-12);
    assert_eq!(r.throughput_rps, 500.0);
    let v = |t: &str| threshold(t).judge(&r);
    assert!(v("p99<11ms").passed);
    assert!(!v("p99<9ms").passed);
    assert!(v("p50<=5.01ms").passed && !v("p50>5.01ms").passed);
    assert!(v("max<=10.01ms").passed);
    assert!(v("errors<1.5%").passed && !v("errors<1.4%").passed);
    assert!(v("rps>=500").passed && !v("rps>500").passed);
    let verdict = v("rps>1800");
    assert_eq!(
        (verdict.metric, verdict.op, verdict.unit, verdict.limit),
        ("rps", ">", "req/s", 1800.0)
    );
    assert_eq!(verdict.actual, Some(500.0));
    assert_eq!(verdict.describe(), "rps>1800 (rps 500.0 req/s)");
    assert_eq!(v("errors<1%").describe(), "errors<1% (errors 1.4925%)");
    // A run that measured nothing fails every latency and error threshold: no answer is not
    // a fast answer.
    let empty = make_report(
        &sample_plan(Load::Closed(Duration::from_secs(1))),
        &Measured::new(std::time::SystemTime::now()),
    );
    for t in ["p99<1s", "max<1s", "errors<1%"] {
        let verdict = threshold(t).judge(&empty);
        assert!(!verdict.passed && verdict.actual.is_none(), "{t}");
        assert!(verdict.describe().ends_with("(nothing measured)"));
    }
    let verdicts = judge_all(&[threshold("p99<11ms"), threshold("rps>1800")], &r);
    assert_eq!(verdicts.iter().filter(|v| v.passed).count(), 1);
}

/// Runs a search against a server whose SLO holds up to `knee` req/s.
fn search(start: f64, max_steps: usize, knee: f64) -> (Vec<f64>, Option<f64>) {
    let mut s = KneeSearch::new(start, max_steps);
    let mut rates = Vec::new();
    while let Some(rate) = s.next_rate() {
        rates.push(rate);
        s.record(rate, rate <= knee);
    }
    (rates, s.best())
}

#[test]
fn the_knee_search_doubles_then_bisects_to_within_five_percent() {
    let (rates, best) = search(1000.0, 20, 3000.0);
    assert_eq!(
        rates,
        [1000.0, 2000.0, 4000.0, 3000.0, 3500.0, 3250.0, 3125.0]
    );
    assert_eq!(best, Some(3000.0));
    // Broken at the first step: halve until one holds, then bisect.
    let (rates, best) = search(1000.0, 20, 300.0);
    assert_eq!(rates[..4], [1000.0, 500.0, 250.0, 375.0]);
    let best = best.unwrap();
    assert!(
        (300.0 / (1.0 + PRECISION)..=300.0).contains(&best),
        "{best}"
    );
    // Out of steps: the best so far.
    let (rates, best) = search(100.0, 3, 1e9);
    assert_eq!((rates, best), (vec![100.0, 200.0, 400.0], Some(400.0)));
    // Nothing holds, even at the lowest rate: no answer.
    let (rates, best) = search(8.0, 20, 0.0);
    assert_eq!((rates, best), (vec![8.0, 4.0, 2.0, 1.0], None));
    // Every search ends with the lowest broken rate within 5% above the best, or out of steps.
    for knee in [1.0, 7.0, 99.0, 1234.0, 5000.0, 77_777.0] {
        let mut s = KneeSearch::new(1000.0, 40);
        while let Some(rate) = s.next_rate() {
            s.record(rate, rate <= knee);
        }
        let (held, broke) = (s.best().unwrap(), s.lowest_broken().unwrap());
        assert!(held <= knee && broke > knee, "{knee}: {held} {broke}");
        assert!(
            broke - held <= (held * PRECISION).max(1.0),
            "{knee}: {held} {broke}"
        );
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
fn request_paths_follow_the_api_version_and_the_service() {
    let cases = [
        (
            "",
            ApiVersion::V1,
            Operation::VerifyRequest,
            "",
            "/api/v1/verify/request",
        ),
        (
            "",
            ApiVersion::V2,
            Operation::VerifyRequest,
            "",
            "/api/v2/verify/SVC/request",
        ),
        (
            "",
            ApiVersion::V2,
            Operation::ConnectionInvitation,
            "",
            "/api/v2/connection/SVC/invitation",
        ),
        (
            "",
            ApiVersion::V1,
            Operation::CredentialOffer,
            "",
            "/api/v1/credential/offer",
        ),
        (
            "",
            ApiVersion::V2,
            Operation::VerifyResponse,
            "",
            "/api/v2/verify/response",
        ),
        (
            "",
            ApiVersion::V1,
            Operation::TransactionStatus,
            "a/b c",
            "/api/v1/transaction/a%2Fb%20c/status",
        ),
        (
            "/gw",
            ApiVersion::V1,
            Operation::VerifyResponse,
            "",
            "/gw/api/v1/verify/response",
        ),
    ];
    for (prefix, api, op, tx, want) in cases {
        assert_eq!(
            request_path(prefix, api, "SVC", op, tx),
            want,
            "{api:?} {op:?}"
        );
    }
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
fn credentials_files_are_read_as_toml_or_json() {
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
fn the_command_line_makes_the_plan_and_refuses_what_cannot_run() {
    let a = args("--target http://127.0.0.1:1 --agent-id a --token t").unwrap();
    assert_eq!(a.rate, Rate::PerSecond(1000.0));
    assert_eq!(a.duration, Duration::from_secs(10));
    assert_eq!(a.mix, mix(DEFAULT_MIX));
    let plan = Plan::from_args(&a).unwrap();
    assert_eq!(plan.addr, "127.0.0.1:1".parse().unwrap());
    assert_eq!(plan.script.api, ApiVersion::V1);
    assert!(
        matches!(&plan.load, Load::Open(s) if s.flat_rate() == Some(1000.0) && s.total() == 10_000)
    );
    assert!(
        matches!(Mode::from_args(&a).unwrap(), Mode::Run { thresholds } if thresholds.is_empty())
    );

    let a = args("--target http://127.0.0.1:1 --api v2 --service S1 --agent-id a --token t --rate max --mix verify_request=1 --json").unwrap();
    let plan = Plan::from_args(&a).unwrap();
    assert!(matches!(plan.load, Load::Closed(d) if d == Duration::from_secs(10)));
    assert_eq!(plan.script.service, "S1");
    assert!(a.json);

    let a = args("--target http://127.0.0.1:1 --agent-id a --token t --stages 1s:10,2s:30 --threshold p99<50ms --threshold errors<0.1% --threshold rps>1800 --report r.html").unwrap();
    let plan = Plan::from_args(&a).unwrap();
    assert!(matches!(&plan.load, Load::Open(s) if s.flat_rate().is_none() && s.total() == 45));
    assert_eq!(a.report.as_deref(), Some(std::path::Path::new("r.html")));
    let Mode::Run { thresholds } = Mode::from_args(&a).unwrap() else {
        panic!("a run")
    };
    assert_eq!(
        thresholds
            .iter()
            .map(|t| t.text.as_str())
            .collect::<Vec<_>>(),
        ["p99<50ms", "errors<0.1%", "rps>1800"]
    );

    let a = args("--target http://127.0.0.1:1 --agent-id a --token t --find-max --slo p99<10ms --rate 500 --duration 5s --max-steps 4").unwrap();
    let Mode::FindMax {
        slo,
        start,
        max_steps,
    } = Mode::from_args(&a).unwrap()
    else {
        panic!("a search")
    };
    assert_eq!((slo.len(), start, max_steps), (1, 500.0, 4));

    for bad in [
        "--target https://x --agent-id a --token t",
        "--target http://x --agent-id a",
        "--target http://x --agent-id a --token t --credentials f",
        "--target http://x --agent-id a --token t --mix nope=1",
        "--target http://x --agent-id a --token t --rate 0",
        "--target http://x --agent-id a --token t --stages 1s:10 --rate 5",
        "--target http://x --agent-id a --token t --stages 1s:10 --duration 5s",
        "--target http://x --agent-id a --token t --stages 1s",
        "--target http://x --agent-id a --token t --threshold p98<1ms",
        "--target http://x --agent-id a --token t --find-max",
        "--target http://x --agent-id a --token t --slo p99<1ms",
        "--target http://x --agent-id a --token t --max-steps 3",
        "--target http://x --agent-id a --token t --find-max --slo p99<1ms --stages 1s:10",
        "--target http://x --agent-id a --token t --find-max --slo p99<1ms --threshold p99<1ms",
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
    assert!(matches!(
        plan("--target http://127.0.0.1:1 --agent-id a --token t --stages 10s:0"),
        Err(LoadError::Invalid(_))
    ));
    assert!(matches!(
        plan("--target http://127.0.0.1:1 --agent-id a --token t --find-max --slo p99<1ms --rate max"),
        Err(LoadError::Invalid(_))
    ));
}

fn sample_plan(load: Load) -> Plan {
    Plan {
        target_url: "http://127.0.0.1:8083".into(),
        addr: "127.0.0.1:8083".parse().unwrap(),
        load,
        connections: 4,
        // Far past any answer of the local server, on a busy machine too.
        timeout: Duration::from_secs(10),
        script: script(DEFAULT_MIX),
        progress: false,
    }
}

fn flat(rate: f64, ms: u64) -> Load {
    Load::Open(Schedule::flat(rate, Duration::from_millis(ms)))
}

#[test]
fn the_report_counts_errors_and_percentiles_in_text_and_json() {
    let mut stats = stats_with((1..=1000u64).map(|us| us * 10), 200);
    stats.ended.record_response(401, 50);
    stats.ended.record_error(ConnErrorKind::Io);
    stats.operations = [500, 200, 100, 100, 101];
    let mut m = Measured::new(std::time::SystemTime::UNIX_EPOCH);
    m.stats = stats;
    m.elapsed = Duration::from_secs(1);
    let mut r = make_report(&sample_plan(flat(1000.0, 1000)), &m);
    r.thresholds = judge_all(&[threshold("p99<1ms"), threshold("errors<1%")], &r);
    assert_eq!(r.responses, 1001);
    assert_eq!(r.errors.total, 2);
    assert_eq!(r.errors.by_status[&401], 1);
    assert_eq!(r.errors.connection["io"], 1);
    assert!((r.latency_ms.p50 - 5.0).abs() < 0.01, "{:?}", r.latency_ms);
    assert!((r.latency_ms.p99 - 9.9).abs() < 0.02, "{:?}", r.latency_ms);
    assert!((r.latency_ms.max - 10.0).abs() < 0.01);
    assert_eq!(r.started_at, "1970-01-01T00:00:00Z");
    assert!(!r.thresholds_passed());
    let text = format_report(&r);
    for want in [
        "open model at 1000 req/s",
        "1001.0 req/s",
        "p50 5.00",
        "p99.9",
        "by status 401: 1",
        "connection io: 1",
        "verify_request: 500",
        "FAIL  p99<1ms (p99 9.9",
        "pass  errors<1% (errors 0.1996%)",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(v["model"], "open");
    assert_eq!(v["statuses"]["200"], 1000);
    assert_eq!(v["errors"]["connection"]["io"], 1);
    assert!(v["latency_ms"]["p99_9"].is_number());
    assert_eq!(v["thresholds"][0]["threshold"], "p99<1ms");
    assert_eq!(v["thresholds"][0]["passed"], false);
    assert_eq!(v["thresholds"][1]["passed"], true);
    assert_eq!(v["thresholds"][1]["unit"], "ratio");
    let closed = make_report(
        &sample_plan(Load::Closed(Duration::from_secs(1))),
        &Measured::new(std::time::SystemTime::now()),
    );
    assert!(format_report(&closed).contains("closed model"));
    assert!(format_report(&closed).contains("errors      none"));
    assert!(!format_report(&closed).contains("thresholds"));
}

#[test]
fn the_timeline_reports_each_second_against_the_schedule() {
    let lock = std::sync::Mutex::new(Timeline::default());
    // Two connections: one answers in seconds 0 and 2, the other in 0 and fails in 1.
    let mut a = SecondRecorder::default();
    a.at(0, &lock).record_response(200, 1_000);
    a.at(0, &lock).record_response(200, 3_000);
    a.at(2, &lock).record_response(503, 9_000);
    a.flush(&lock);
    let mut b = SecondRecorder::default();
    b.at(0, &lock).record_response(200, 2_000);
    b.at(1, &lock).record_error(ConnErrorKind::Timeout);
    b.at(1, &lock).unsent += 1;
    b.flush(&lock);
    let mut m = Measured::new(std::time::SystemTime::now());
    m.timeline = lock.into_inner().unwrap();
    m.timeline.extend_to(4);
    let plan = sample_plan(Load::Open(Schedule::ramps(stages("2s:100,2s:100"))));
    let r = make_report(&plan, &m);
    let t = &r.timeline;
    assert_eq!(t.len(), 4);
    assert_eq!(t.iter().map(|s| s.t).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(t[0].responses, 3);
    assert_eq!(t[0].statuses[&200], 3);
    let l = t[0].latency_ms.as_ref().unwrap();
    assert!(
        (l.p50 - 2.0).abs() < 0.02 && (l.max - 3.0).abs() < 0.03,
        "{l:?}"
    );
    assert_eq!(t[1].responses, 0);
    assert!(t[1].latency_ms.is_none());
    assert_eq!(t[1].errors["timeout"], 1);
    assert_eq!(t[1].errors["unsent"], 1);
    assert_eq!(t[2].statuses[&503], 1);
    assert!(t[3].statuses.is_empty() && t[3].errors.is_empty());
    // The targets: 0 -> 100 over 2 s (25 then 75 requests), then 100 flat.
    let targets: Vec<f64> = t.iter().map(|s| s.target_rps.unwrap()).collect();
    assert_eq!(targets, [25.0, 75.0, 100.0, 100.0]);
    let stage: Vec<usize> = t.iter().map(|s| s.stage.unwrap()).collect();
    assert_eq!(stage, [1, 1, 2, 2]);
    let st = r.stages.as_ref().unwrap();
    assert_eq!(
        (st.len(), st[1].duration_s, st[1].target_rps),
        (2, 2.0, 100.0)
    );
    assert_eq!(r.rate, None);
    // A closed run has no targets or stages.
    let closed = make_report(&sample_plan(Load::Closed(Duration::from_secs(4))), &m);
    assert!(closed
        .timeline
        .iter()
        .all(|s| s.target_rps.is_none() && s.stage.is_none()));
    assert!(closed.stages.is_none());
}

#[test]
fn the_latency_distribution_is_the_percentile_spectrum() {
    let mut m = Measured::new(std::time::SystemTime::now());
    m.stats = stats_with((1..=10_000u64).map(|i| i * 10), 200);
    let r = make_report(&sample_plan(flat(1000.0, 1000)), &m);
    let d = &r.latency_distribution;
    assert!(d.len() > 20, "{}", d.len());
    assert!(d
        .windows(2)
        .all(|w| w[0].percentile <= w[1].percentile && w[0].latency_ms <= w[1].latency_ms));
    assert_eq!(d.last().unwrap().percentile, 100.0);
    assert_eq!(d.last().unwrap().latency_ms, r.latency_ms.max);
    // Uniform from 0.01 to 100 ms: the 90th percentile is near 90 ms.
    let p90 = d.iter().find(|p| p.percentile >= 90.0).unwrap();
    assert!((p90.latency_ms - 90.0).abs() < 1.0, "{p90:?}");
    let empty = make_report(
        &sample_plan(flat(1000.0, 1000)),
        &Measured::new(std::time::SystemTime::now()),
    );
    assert!(empty.latency_distribution.is_empty());
}

#[test]
fn progress_lines_show_the_stage_and_target() {
    let ramp = ProgressTarget {
        rate: 1450.0,
        stage: Some((2, 3)),
    };
    let line = progress_line(12, Some(ramp), 1448, 9000, 3);
    assert!(
        line.contains("stage 2/3") && line.contains("target     1450 req/s"),
        "{line}"
    );
    assert!(
        line.contains("1448 req/s") && line.contains("errors 3"),
        "{line}"
    );
    let flat = progress_line(
        1,
        Some(ProgressTarget {
            rate: 500.0,
            stage: None,
        }),
        500,
        500,
        0,
    );
    assert!(
        flat.contains("target      500 req/s") && !flat.contains("stage"),
        "{flat}"
    );
    assert!(!progress_line(1, None, 5, 5, 0).contains("target"));
}

#[test]
fn the_html_page_is_self_contained_and_carries_the_report() {
    let mut m = Measured::new(std::time::SystemTime::now());
    m.stats = stats_with([100, 200, 300], 200);
    let mut plan = sample_plan(flat(100.0, 1000));
    plan.target_url = "http://h/</script><script>alert(1)</script>".into();
    let r = make_report(&plan, &m);
    let page = html::run_page(&r);
    assert!(page.starts_with("<!DOCTYPE html>"));
    // Nothing fetched from anywhere: no src/href attributes, imports or url()s, and a policy
    // that forbids it anyway.
    for bad in ["src=", "href=", "@import", "<link", "//fonts", "cdn"] {
        assert!(!page.contains(bad), "{bad} in the page");
    }
    // url() only for the charts' own clip paths.
    assert!(page
        .match_indices("url(")
        .all(|(i, _)| page[i + 4..].starts_with('#')));
    assert!(page.contains("default-src 'none'"));
    // The data cannot end its script element; the title is escaped.
    assert_eq!(
        page.matches("</script>").count(),
        2,
        "only the page's own two"
    );
    assert!(page.contains("<title>load test of http://h/&lt;/script&gt;"));
    let start = page.find("id=\"report-data\">").unwrap() + "id=\"report-data\">".len();
    let end = start + page[start..].find("</script>").unwrap();
    let data: serde_json::Value = serde_json::from_str(&page[start..end]).unwrap();
    assert_eq!(data, serde_json::to_value(&r).unwrap());
    assert!(
        page.contains("function chart(spec)"),
        "the drawing script is inlined"
    );
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
                            // Head and body in one write: two would meet Nagle and
                            // delayed ACKs (40 ms an answer).
                            let mut resp = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            resp.extend_from_slice(body);
                            if s.write_all(&resp).await.is_err() {
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

fn no_stop() -> tokio::sync::watch::Receiver<bool> {
    tokio::sync::watch::channel(false).1
}

#[tokio::test]
async fn open_and_closed_runs_against_a_local_server_count_every_answer() {
    let (addr, server) = fixed_server().await;
    let mut plan = sample_plan(flat(400.0, 250));
    plan.addr = addr;
    let r = execute(plan.clone(), no_stop()).await.unwrap();
    assert_eq!(r.responses, 100, "{r:?}");
    assert_eq!(r.statuses[&200], 100);
    assert_eq!(r.errors.total, 0);
    assert_eq!(r.operations.values().sum::<u64>(), 100);
    assert!(r.elapsed_s >= 0.24, "{r:?}");
    assert!(!r.interrupted);
    assert_eq!(r.timeline.iter().map(|s| s.responses).sum::<u64>(), 100);

    // How many a closed run gets in its time is the machine's speed: only that it got some.
    plan.load = Load::Closed(Duration::from_millis(100));
    let r = execute(plan, no_stop()).await.unwrap();
    assert!(r.responses > 0, "{r:?}");
    assert_eq!(r.errors.total, 0);
    assert_eq!(
        r.timeline.iter().map(|s| s.responses).sum::<u64>(),
        r.responses
    );
    server.abort();
}

#[tokio::test]
async fn a_ramp_sends_every_request_its_stages_call_for() {
    let (addr, server) = fixed_server().await;
    // 0 -> 400 req/s over 0.5 s (100 requests), 400 -> 0 over 0.5 s (100 more).
    let mut plan = sample_plan(Load::Open(Schedule::ramps(stages("500ms:400,500ms:0"))));
    plan.addr = addr;
    let r = execute(plan, no_stop()).await.unwrap();
    assert_eq!(r.responses, 200, "{r:?}");
    assert_eq!(r.stages.as_ref().map(Vec::len), Some(2));
    assert_eq!(r.timeline.iter().map(|s| s.responses).sum::<u64>(), 200);
    assert_eq!(r.timeline[0].target_rps, Some(200.0));
    server.abort();
}

#[tokio::test]
async fn a_stop_ends_the_run_early_and_reports_what_was_measured() {
    let (addr, server) = fixed_server().await;
    for load in [flat(200.0, 60_000), Load::Closed(Duration::from_secs(60))] {
        let mut plan = sample_plan(load);
        plan.addr = addr;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = tokio::spawn(execute(plan, stopped));
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.send(true).unwrap();
        let r = run.await.unwrap().unwrap();
        assert!(r.interrupted, "{r:?}");
        // Whatever was answered before the stop is in the report, and nothing after it.
        assert!(r.responses < 12_000, "{}", r.responses);
        assert_eq!(r.errors.total, 0, "{r:?}");
        assert_eq!(
            r.timeline.iter().map(|s| s.responses).sum::<u64>(),
            r.responses
        );
    }
    server.abort();
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    // A socket holds the port without listening: connections are refused, and no other
    // process can start listening there meanwhile.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = held.local_addr().unwrap();
    let mut plan = sample_plan(flat(100.0, 1000));
    plan.addr = addr;
    assert!(matches!(
        execute(plan, no_stop()).await,
        Err(LoadError::Connect(a, _)) if a == addr
    ));
}
