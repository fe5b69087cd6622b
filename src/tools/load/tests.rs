//! Tests of the load generator's pure parts and of whole runs against a local server.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::agents::*;
use super::args::*;
use super::exec::*;
use super::html;
use super::judge::*;
use super::knee::*;
use super::plan::*;
use super::report::*;
use super::request::*;
use super::save::*;
use super::schedule::*;
use super::stats::*;
use super::threshold::*;
use super::timeline::*;
use super::transport::*;
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
    // Up to a year: anything longer would overflow the run's deadlines.
    assert_eq!(parse_duration("8760h").unwrap(), LONGEST);
    for too_long in ["8761h", "99999999999999999999s"] {
        let e = parse_duration(too_long).unwrap_err();
        assert!(matches!(e, LoadError::TooLong(_)), "{too_long}: {e}");
        assert!(e.to_string().ends_with("at most a year (8760h)"), "{e}");
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
    assert!(!t.tls);
    let t: Target = "http://localhost/gw/".parse().unwrap();
    assert_eq!(t.host_port, "localhost:80");
    assert_eq!(t.prefix, "/gw");
    // https: port 443 unless given, the host as TLS names it (no IPv6 brackets).
    let t: Target = "https://gw.example.com".parse().unwrap();
    assert!(t.tls);
    assert_eq!(
        (t.host_port.as_str(), t.host.as_str()),
        ("gw.example.com:443", "gw.example.com")
    );
    let t: Target = "https://[::1]:8443/p".parse().unwrap();
    assert_eq!(
        (t.host_port.as_str(), t.host.as_str(), t.prefix.as_str()),
        ("[::1]:8443", "::1", "/p")
    );
    for bad in ["ftp://x", "127.0.0.1:80", "http://x/?a=1", "nope"] {
        assert!(bad.parse::<Target>().is_err(), "{bad}");
    }
}

#[test]
fn a_target_with_a_user_or_a_port_not_a_number_is_refused_without_its_password() {
    for (bad, error) in [
        (
            "http://tester:load-pw@127.0.0.1:8083",
            "bad --target \"http://tester:<redacted>@127.0.0.1:8083\": must not carry a user",
        ),
        (
            "https://tester@gw.example.com/p",
            "bad --target \"https://tester@gw.example.com/p\": must not carry a user",
        ),
        // Unencoded, the password's `/` ends the authority: host `tester`, port `load`.
        (
            "http://tester:load/pw@127.0.0.1:8083",
            "bad --target \"http://tester:<redacted>@127.0.0.1:8083\": its port is not a number",
        ),
        (
            "http://127.0.0.1:gw",
            "bad --target \"http://127.0.0.1:gw\": its port is not a number",
        ),
        (
            "http://127.0.0.1:65536",
            "bad --target \"http://127.0.0.1:65536\": its port is not a number",
        ),
        (
            "https://[::1]:x/p",
            "bad --target \"https://[::1]:x/p\": its port is not a number",
        ),
    ] {
        let e = bad.parse::<Target>().unwrap_err().to_string();
        assert!(e.starts_with(error), "{bad}: {e}");
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
    assert_eq!(stages("4380h:10,4380h:0")[1].duration, LONGEST / 2);
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
        "8761h:10",
        "99999999999999999999s:10",
        "8000h:10,8000h:10",
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

#[test]
fn a_leading_pause_holds_the_first_request_until_it_ends() {
    // 2 s at 0 req/s, then 0 -> 100 over 10 s: N(t) = 5 (t - 2)² after the pause.
    let s = Schedule::ramps(stages("2s:0,10s:100"));
    assert_eq!(s.total(), 500);
    assert_eq!(s.due_at(0), Duration::from_secs(2));
    assert_eq!(s.due_by(Duration::ZERO), 0);
    assert_eq!(s.due_by(Duration::from_millis(1999)), 0);
    assert_eq!(s.due_by(Duration::from_secs(2)), 1);
    let t = s.due_at(5).as_secs_f64();
    assert!((t - 3.0).abs() < 1e-6, "{t}");
    // A pause then a jump: the first request goes with the jump.
    let s = Schedule::ramps(stages("1s:0,0s:10,1s:10"));
    assert_eq!(s.due_at(0), Duration::from_secs(1));
    assert_eq!(s.due_at(1), Duration::from_millis(1100));
    assert_eq!(s.due_by(Duration::from_millis(500)), 0);
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
        assert_eq!(t.operation, None);
    }
    // A latency of one operation, p99.9's dot and all.
    for (text, op, metric) in [
        (
            "verify_request.p99<50ms",
            Operation::VerifyRequest,
            Metric::P99,
        ),
        (
            "transaction_status.p99.9<1s",
            Operation::TransactionStatus,
            Metric::P99_9,
        ),
        (
            "credential_offer.p(90) < 2",
            Operation::CredentialOffer,
            Metric::P90,
        ),
    ] {
        let t = threshold(text);
        assert_eq!((t.operation, t.metric), (Some(op), metric), "{text}");
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
        "verify_request.errors<1%",
        "verify_request.rps>10",
        "verify.p99<1ms",
        "verify_request.p95<1ms",
        "verify_request<1ms",
    ] {
        assert!(
            matches!(bad.parse::<Threshold>(), Err(LoadError::Threshold(..))),
            "{bad}"
        );
    }
}

/// An answer to verify_request from the first agent, due at the start.
fn answer(status: u16, latency_us: u64) -> Record {
    Record {
        start_us: 0,
        latency_us,
        end: End::Answered(status),
        op: Operation::VerifyRequest,
        agent: 0,
        late: false,
    }
}

fn failure(kind: ConnErrorKind) -> Record {
    Record {
        end: End::Failed(kind),
        ..answer(0, 1_000)
    }
}

fn stats_with(latencies_us: impl IntoIterator<Item = u64>, status: u16) -> Stats {
    let mut stats = Stats::default();
    for us in latencies_us {
        stats.record(&answer(status, us));
    }
    stats
}

#[test]
fn thresholds_are_judged_against_the_report() {
    // 1000 answers of 10 µs to 10 ms, 10 of them 503, 5 connection errors: 15 failed of 1005.
    let mut stats = stats_with((1..=990).map(|i| i * 10), 200);
    for _ in 0..10 {
        stats.record(&answer(503, 10_000));
    }
    for _ in 0..5 {
        stats.record(&failure(ConnErrorKind::Io));
    }
    let mut m = Measured::new(std::time::SystemTime::now());
    m.stats = stats;
    m.stats.last_answer_us = 2_000_000;
    m.elapsed = Duration::from_secs(2);
    let r = make_report(&setup(Load::Closed(Duration::from_secs(2))), &m);
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
        &setup(Load::Closed(Duration::from_secs(1))),
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
    // The bytes a `serde_json::Value` of the same fields writes (keys in order).
    for i in 0..16 {
        for op in Operation::ALL {
            if let Some(body) = request_body(op, i, 7) {
                let value: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(value.to_string(), body, "{op:?} {i}");
            }
        }
    }
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
        agents: vec![AgentScript {
            id: "agent-1".into(),
            token: "secret".into(),
            service: String::new(),
        }],
        agent_weights: Weights::new(vec![1]).unwrap(),
        headers: Vec::new(),
        mix: mix(m),
        run: 0xab,
    }
}

/// Transaction ids the first agent was given.
fn ids(given: &[&str]) -> TxIds {
    let mut ids = TxIds::default();
    for id in given {
        ids.remember(0, id.to_string());
    }
    ids
}

#[test]
fn request_bytes_are_valid_http() {
    let s = script(DEFAULT_MIX);
    let ids = ids(&["tx-1"]);
    let mut out = BytesMut::new();
    let mut seen_post = false;
    for i in 0..50 {
        let req = s.prepare(i, &ids);
        s.write_h1(&req, &mut out);
        let op = req.op;
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
    let mut out = BytesMut::new();
    s.write_h1(&s.prepare(3, &ids(&["tx-1"])), &mut out);
    assert!(out.starts_with(b"GET /api/v1/transaction/tx-1/status HTTP/1.1\r\n"));
    // Only status reads in the mix, no id yet: a synthetic one (which a backend answers 404).
    s.write_h1(&s.prepare(3, &TxIds::default()), &mut out);
    assert!(out.starts_with(b"GET /api/v1/transaction/tx-load-000000ab-3/status "));
    // A mix with other operations sends one of those until a transaction id is known,
    // drawn with their weights.
    let s = script(DEFAULT_MIX);
    let mut counts = [0u64; Operation::COUNT];
    for i in 0..10_000 {
        let op = s.operation(i, false);
        assert_eq!(s.prepare(i, &TxIds::default()).op, op);
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

/// No `Debug` print of the arguments, the credentials, the agents or the plan shows a token
/// or a `-H` value (which may be a secret too), as no print of the config does.
#[test]
fn debug_prints_show_no_token_and_no_header_value() {
    const TOKEN: &str = "tok-3f9a1c";
    const VALUE: &str = "hdr-7c2e5b";
    let shows_none = |shown: String| {
        assert!(!shown.contains(TOKEN) && !shown.contains(VALUE), "{shown}");
        assert!(shown.contains(crate::client::redact::REDACTED), "{shown}");
    };
    let a = args(&format!(
        "--target http://127.0.0.1:1 --agent-id a --token {TOKEN} -H X-Extra:{VALUE}"
    ))
    .unwrap();
    shows_none(format!("{a:?}"));
    let plan = Plan::from_args(&a).unwrap();
    shows_none(format!("{plan:?}"));
    shows_none(format!(
        "{:?}",
        plan.script.h2_heads(http::uri::Scheme::HTTP)
    ));
    shows_none(format!(
        "{:?}",
        parse_credentials(&format!("agent_id = \"a\"\ntoken = \"{TOKEN}\"\n"), "f")
    ));
    let agents = format!("[[agents]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n");
    shows_none(format!(
        "{:?}",
        parse_agents(&agents, "a.toml", |_| unreachable!())
    ));
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
    assert_eq!(plan.connector.addr, "127.0.0.1:1".parse().unwrap());
    assert_eq!(plan.script.api, ApiVersion::V1);
    assert!(
        matches!(&plan.setup.load, Load::Open(s) if s.flat_rate() == Some(1000.0) && s.total() == 10_000)
    );
    assert!(
        matches!(Mode::from_args(&a).unwrap(), Mode::Run { thresholds } if thresholds.is_empty())
    );

    let a = args("--target http://127.0.0.1:1 --api v2 --service S1 --agent-id a --token t --rate max --mix verify_request=1 --json").unwrap();
    let plan = Plan::from_args(&a).unwrap();
    assert!(matches!(plan.setup.load, Load::Closed(d) if d == Duration::from_secs(10)));
    assert_eq!(plan.script.agents[0].service, "S1");
    assert!(a.json);

    let a = args("--target http://127.0.0.1:1 --agent-id a --token t --stages 1s:10,2s:30 --threshold p99<50ms --threshold errors<0.1% --threshold rps>1800 --report r.html").unwrap();
    let plan = Plan::from_args(&a).unwrap();
    assert!(
        matches!(&plan.setup.load, Load::Open(s) if s.flat_rate().is_none() && s.total() == 45)
    );
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
        "--target http://x --agent-id a --token t --streams 4",
        "--target http://x --agents f --agent-id a --token t",
        "--target http://x --agents f --credentials c",
        "--target http://x --agent-id a --token t --save f --find-max --slo p99<1ms",
        "--target http://x --agent-id a --token t --requests 5 --find-max --slo p99<1ms",
        "--target http://x --agent-id a --token t --cacert f --insecure",
        "--target http://x --agent-id a --token t -H nocolon",
        "--target http://x --agent-id a --token t -H X-Auth-Token:t2",
        "--target http://x --agent-id a --token t -H Host:other",
        "--target http://x --agent-id a --token t --threshold verify_request.errors<1%",
        "--target http://x --agent-id a --token t --threshold nope.p99<1ms",
        "report",
        "report f --target http://x",
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

fn setup(load: Load) -> Setup {
    Setup {
        target: "http://127.0.0.1:8083".into(),
        api: Api::V1,
        http: HttpVersion::Http1,
        load,
        connections: 4,
        streams: 1,
        mix: DEFAULT_MIX.into(),
        // Far past any answer of the local server, on a busy machine too.
        timeout: Duration::from_secs(10),
        agents: vec![AgentWeight {
            id: "agent-1".into(),
            weight: 1,
        }],
        headers: Vec::new(),
        requests: None,
    }
}

/// A run of `load` against `addr`.
fn sample_plan(load: Load, addr: SocketAddr) -> Plan {
    Plan {
        setup: setup(load),
        connector: Connector::plain(addr),
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
    stats.record(&answer(401, 50));
    stats.record(&failure(ConnErrorKind::Io));
    stats.operations = [500, 200, 100, 100, 101];
    let mut m = Measured::new(std::time::SystemTime::UNIX_EPOCH);
    m.stats = stats;
    m.stats.last_answer_us = 1_000_000;
    m.elapsed = Duration::from_secs(1);
    let mut r = make_report(&setup(flat(1000.0, 1000)), &m);
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
        &setup(Load::Closed(Duration::from_secs(1))),
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
    a.at(0, &lock).record(&answer(200, 1_000));
    a.at(0, &lock).record(&answer(200, 3_000));
    a.at(2, &lock).record(&answer(503, 9_000));
    a.flush(&lock);
    let mut b = SecondRecorder::default();
    b.at(0, &lock).record(&answer(200, 2_000));
    b.at(1, &lock).record(&failure(ConnErrorKind::Timeout));
    b.at(1, &lock).record(&Record {
        end: End::Unsent,
        ..answer(0, 0)
    });
    b.flush(&lock);
    let mut m = Measured::new(std::time::SystemTime::now());
    m.timeline = lock.into_inner().unwrap();
    m.timeline.extend_to(4);
    let r = make_report(
        &setup(Load::Open(Schedule::ramps(stages("2s:100,2s:100")))),
        &m,
    );
    let t = &r.timeline;
    assert_eq!(t.len(), 4);
    assert_eq!(t.iter().map(|s| s.t).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(t.iter().all(|s| s.span_s == 1));
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
    let closed = make_report(&setup(Load::Closed(Duration::from_secs(4))), &m);
    assert!(closed
        .timeline
        .iter()
        .all(|s| s.target_rps.is_none() && s.stage.is_none()));
    assert!(closed.stages.is_none());
}

#[test]
fn a_year_long_timeline_keeps_a_bounded_number_of_entries() {
    // A second is a few KiB: one per second of a year-long run would be ~100 GB.
    let at = |second: u64| Record {
        start_us: second * 1_000_000,
        ..answer(200, 1_000)
    };
    let mut t = Timeline::default();
    assert!(t.entries().is_empty());
    for s in 0..5 {
        t.record(&at(s));
    }
    assert_eq!((t.entries().len(), t.span()), (5, 1));
    // Past MAX_ENTRIES seconds, neighbours merge, nothing lost.
    t.record(&at(20_000));
    assert_eq!((t.entries().len(), t.span()), (2501, 8));
    assert_eq!(t.entries()[0].statuses[&200], 5);
    assert_eq!(t.entries()[2500].statuses[&200], 1);
    // The whole of a year-long run, and past it by a year's timeout.
    t.extend_to(LONGEST.as_secs() as usize);
    assert_eq!(t.span(), 8192);
    t.record(&at(2 * LONGEST.as_secs()));
    let first = t.entries()[0].clone();
    t.add(3, &first);
    assert!(t.entries().len() <= MAX_ENTRIES, "{}", t.entries().len());
    let answers: u64 = t.entries().iter().flat_map(|e| e.statuses.get(&200)).sum();
    assert_eq!(answers, 12);

    // The report says what each entry covers; the target is still a rate.
    let mut m = Measured::new(std::time::SystemTime::now());
    m.timeline.record(&at(4_999));
    m.timeline.extend_to(5_000);
    let r = make_report(&setup(flat(100.0, 5_000_000)), &m);
    assert_eq!(r.timeline.len(), 2_500);
    let last = &r.timeline[2_499];
    assert_eq!((last.t, last.span_s, last.responses), (4_998, 2, 1));
    assert_eq!(last.target_rps, Some(100.0));
}

#[test]
fn the_latency_distribution_is_the_percentile_spectrum() {
    let mut m = Measured::new(std::time::SystemTime::now());
    m.stats = stats_with((1..=10_000u64).map(|i| i * 10), 200);
    let r = make_report(&setup(flat(1000.0, 1000)), &m);
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
        &setup(flat(1000.0, 1000)),
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
    let mut setup = setup(flat(100.0, 1000));
    setup.target = "http://h/</script><script>alert(1)</script>".into();
    let r = make_report(&setup, &m);
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

#[test]
fn agents_files_give_ids_tokens_services_and_weights() {
    let text = r#"
[[agents]]
id = "agent-1"
token = "secret"
weight = 3

[[agents]]
id = "agent-2"
token_file = "tokens/agent-2"
service = "SVC2"
"#;
    let read = |path: &std::path::Path| {
        assert_eq!(path, std::path::Path::new("tokens/agent-2"));
        Ok("t2\n".to_string())
    };
    let agents = parse_agents(text, "a.toml", read).unwrap();
    assert_eq!(
        agents,
        [
            Agent {
                id: "agent-1".into(),
                token: "secret".into(),
                service: None,
                weight: 3
            },
            Agent {
                id: "agent-2".into(),
                token: "t2".into(),
                service: Some("SVC2".into()),
                weight: 1
            },
        ]
    );
    let no_file = |_: &std::path::Path| Err(std::io::Error::from(std::io::ErrorKind::NotFound));
    for (bad, why) in [
        ("", "missing field `agents`"),
        ("agents = []", "no [[agents]]"),
        ("[[agents]]\nid = \"a\"", "give one of token and token_file"),
        (
            "[[agents]]\nid = \"a\"\ntoken = \"t\"\ntoken_file = \"f\"",
            "give one of token and token_file",
        ),
        (
            "[[agents]]\nid = \"a\"\ntoken_file = \"f\"",
            "cannot read token_file f",
        ),
        (
            "[[agents]]\nid = \"\"\ntoken = \"t\"",
            "agents[0]: id must not be empty",
        ),
        (
            "[[agents]]\nid = \"a\"\ntoken = \"t\\n\"",
            "agents[0]: the token must not",
        ),
        (
            "[[agents]]\nid = \"a\"\ntoken = \"t\"\n[[agents]]\nid = \"a\"\ntoken = \"u\"",
            "agents[1]: id \"a\" given twice",
        ),
        (
            "[[agents]]\nid = \"a\"\ntoken = \"t\"\nservice = \"a/b\"",
            "agents[0]: service:",
        ),
        (
            "[[agents]]\nid = \"a\"\ntoken = \"t\"\nweight = 0",
            "every weight is zero",
        ),
        (
            "[[agents]]\nid = \"a\"\ntoken = \"t\"\nrate = 5",
            "unknown field `rate`",
        ),
    ] {
        match parse_agents(bad, "a.toml", no_file) {
            Err(e @ LoadError::AgentsFormat { .. }) => {
                let message = e.to_string();
                assert!(message.contains(why), "{bad:?}: {message}");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

/// An agents or credentials file that cannot be read is named by the key, line and column
/// of its mistake, never by its line, which may be a token's (or a token of the wrong type,
/// which the parser's message repeated).
#[test]
fn a_file_that_cannot_be_read_names_the_place_of_its_mistake_not_its_token() {
    const TOKEN: &str = "tok-61d0";
    let no_file = |_: &std::path::Path| Err(std::io::Error::from(std::io::ErrorKind::NotFound));
    for (text, shown) in [
        (
            format!("[[agents]]\nid = \"a\"\ntoken = \"{TOKEN}\" x\n"),
            "bad agents file a.toml: agents[0].token (line 3, column 20): ",
        ),
        (
            format!("[[agents]]\nid = \"a\"\n[[agents]]\nid = \"b\"\ntoken = {TOKEN}\n"),
            "bad agents file a.toml: agents[1].token (line 5, column 9): ",
        ),
        (
            "[[agents]]\nid = \"a\"\ntoken = 61040\n".to_owned(),
            "bad agents file a.toml: agents[0].token (line 3, column 9): a token must be a string",
        ),
    ] {
        let message = parse_agents(&text, "a.toml", no_file)
            .unwrap_err()
            .to_string();
        assert!(message.starts_with(shown), "{text:?}: {message}");
        assert!(
            !message.contains(TOKEN) && !message.contains("61040"),
            "{message}"
        );
        assert!(!message.contains('\n'), "one line: {message}");
    }
    for (text, shown) in [
        (
            format!("agent_id = \"a\"\ntoken = \"{TOKEN}\" x\n"),
            "bad credentials file f: token (line 2, column 20): ",
        ),
        (
            "{\"agent_id\": \"a\", \"token\": 61040}".to_owned(),
            "bad credentials file f: a token must be a string at line 1 column",
        ),
        // A token missing is not one of the wrong type.
        (
            "agent_id = \"a\"\n".to_owned(),
            "bad credentials file f: (line 1, column 1): missing field `token`",
        ),
    ] {
        let message = parse_credentials(&text, "f").unwrap_err().to_string();
        assert!(message.starts_with(shown), "{text:?}: {message}");
        assert!(
            !message.contains(TOKEN) && !message.contains("61040"),
            "{message}"
        );
    }
}

fn two_agents(m: &str) -> Script {
    let mut s = script(m);
    s.agents.push(AgentScript {
        id: "agent-2".into(),
        token: "t2".into(),
        service: String::new(),
    });
    s.agent_weights = Weights::new(vec![3, 1]).unwrap();
    s
}

#[test]
fn requests_are_spread_over_the_agents_by_weight_and_read_their_own_transactions() {
    let s = two_agents(DEFAULT_MIX);
    let n = 40_000;
    let mut by_agent = [0u64; 2];
    let mut both = [[0u64; Operation::COUNT]; 2];
    for i in 0..n {
        let agent = s.agent(i);
        by_agent[agent] += 1;
        both[agent][s.mix.pick(i) as usize] += 1;
    }
    let share = by_agent[0] as f64 / n as f64;
    assert!((share - 0.75).abs() < 0.01, "{by_agent:?}");
    // Which agent sends a request does not follow its operation: each agent gets the mix.
    let share = both[1][Operation::VerifyRequest as usize] as f64 / by_agent[1] as f64;
    assert!((share - 0.5).abs() < 0.02, "{both:?}");

    // Each agent's status reads ask for ids it was given, and its headers are its own.
    let s = two_agents("transaction_status=1");
    let mut ids = TxIds::default();
    ids.remember(0, "tx-of-1".into());
    ids.remember(1, "tx-of-2".into());
    let mut out = BytesMut::new();
    for i in 0..200 {
        let req = s.prepare(i, &ids);
        s.write_h1(&req, &mut out);
        let text = String::from_utf8(out.to_vec()).unwrap();
        let (id, token, tx) = match req.agent {
            0 => ("agent-1", "secret", "tx-of-1"),
            _ => ("agent-2", "t2", "tx-of-2"),
        };
        assert!(
            text.contains(&format!("/transaction/{tx}/status ")),
            "{text}"
        );
        assert!(
            text.contains(&format!("x-service-agent-id: {id}\r\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("x-auth-token: {token}\r\n")),
            "{text}"
        );
    }
    // An agent given no id yet reads none: its status reads become other operations.
    let s = two_agents("transaction_status=1,verify_request=1");
    let ids = ids_for(1, "tx-of-2");
    for i in 0..200 {
        let req = s.prepare(i, &ids);
        if req.agent == 0 {
            assert_eq!(req.op, Operation::VerifyRequest);
        }
    }
}

/// Transaction ids of one agent.
fn ids_for(agent: usize, id: &str) -> TxIds {
    let mut ids = TxIds::default();
    ids.remember(agent, id.into());
    ids
}

#[test]
fn headers_from_the_command_line_go_on_every_request_and_may_not_replace_framing() {
    let h: HeaderArg = "X-Trace-Case:  load-1 ".parse().unwrap();
    assert_eq!(
        (h.name.as_str(), h.value.to_str().unwrap()),
        ("x-trace-case", "load-1")
    );
    // Each is named by its header when it has one, never shown with its value (a secret,
    // maybe), nor whole when it has no name.
    for (bad, shown) in [
        ("nocolon-v4l", "bad -H: not `Name: value`"),
        (": v4l", "bad -H: the name is not an HTTP header name"),
        (
            "bad name: v4l",
            "bad -H: the name is not an HTTP header name",
        ),
        (
            "Host: v4l",
            "bad -H Host: the generator sets this header itself",
        ),
        ("content-length: 5", "bad -H content-length: the generator"),
        ("X-Auth-Token: v4l", "bad -H X-Auth-Token: the generator"),
        ("x-service-agent-id: v4l", "bad -H x-service-agent-id: the"),
        ("Connection: v4l", "bad -H Connection: the generator"),
        (
            "X-A: v4l\u{1}b",
            "bad -H X-A: the value holds a control character",
        ),
    ] {
        match bad.parse::<HeaderArg>() {
            Err(e @ LoadError::Header { .. }) => {
                let message = e.to_string();
                assert!(message.starts_with(shown), "{bad:?}: {message}");
                assert!(!message.contains("v4l"), "{bad:?}: {message}");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let mut s = script("verify_request=1");
    s.headers = vec![h, "User-Agent: my-tool/1".parse().unwrap()];
    let req = s.prepare(0, &TxIds::default());
    let mut out = BytesMut::new();
    s.write_h1(&req, &mut out);
    let text = String::from_utf8(out.to_vec()).unwrap();
    assert!(text.contains("\r\nx-trace-case: load-1\r\n"), "{text}");
    // -H replaces the generator's own user-agent rather than sending two.
    assert_eq!(text.matches("user-agent").count(), 1, "{text}");
    assert!(text.contains("user-agent: my-tool/1"), "{text}");
    let (h2, body) = s.h2_request(req, &s.h2_heads(http::uri::Scheme::HTTPS));
    assert_eq!(h2.uri(), "https://127.0.0.1:8083/api/v1/verify/request");
    assert_eq!(h2.method(), "POST");
    assert_eq!(h2.headers()["x-trace-case"], "load-1");
    assert_eq!(h2.headers()["user-agent"], "my-tool/1");
    assert_eq!(h2.headers()["x-service-agent-id"], "agent-1");
    let body = body.unwrap();
    assert_eq!(
        h2.headers()["content-length"],
        body.len().to_string().as_str()
    );
    serde_json::from_slice::<serde_json::Value>(&body).unwrap();
}

#[test]
fn latency_by_operation_and_counts_by_agent_are_in_the_report_and_judged() {
    let mut stats = Stats::default();
    let at = |op: Operation, agent: usize, end: End, latency_us: u64| Record {
        start_us: 0,
        latency_us,
        end,
        op,
        agent,
        late: false,
    };
    // verify_request answers in 10 ms, transaction_status in 1 ms; agent 1 (of 0 and 1) is
    // refused five times and loses one request to a timeout.
    for k in 0..100 {
        stats.record(&at(
            Operation::VerifyRequest,
            k % 2,
            End::Answered(200),
            10_000,
        ));
        stats.record(&at(
            Operation::TransactionStatus,
            0,
            End::Answered(200),
            1_000,
        ));
    }
    for _ in 0..5 {
        stats.record(&at(Operation::VerifyRequest, 1, End::Answered(429), 500));
    }
    stats.record(&at(
        Operation::VerifyRequest,
        1,
        End::Failed(ConnErrorKind::Timeout),
        10_000_000,
    ));
    let mut m = Measured::new(std::time::SystemTime::now());
    m.stats = stats;
    m.elapsed = Duration::from_secs(1);
    let mut setup = setup(Load::Closed(Duration::from_secs(1)));
    setup.agents.push(AgentWeight {
        id: "agent-2".into(),
        weight: 2,
    });
    let mut r = make_report(&setup, &m);
    let vr = &r.latency_by_operation["verify_request"];
    let ts = &r.latency_by_operation["transaction_status"];
    assert_eq!((vr.responses, ts.responses), (105, 100));
    assert!((ts.latency_ms.p99 - 1.0).abs() < 0.01, "{ts:?}");
    assert!((vr.latency_ms.p50 - 10.0).abs() < 0.02, "{vr:?}");
    assert!(!vr.latency_distribution.is_empty());
    assert!(!r.latency_by_operation.contains_key("credential_offer"));
    // The whole mix is both together.
    assert_eq!(r.responses, 205);
    assert!((r.latency_ms.p50 - 10.0).abs() < 0.02 || (r.latency_ms.p50 - 1.0).abs() < 0.01);
    let (a1, a2) = (&r.agents[0], &r.agents[1]);
    assert_eq!(
        (
            a1.id.as_str(),
            a1.weight,
            a1.requests,
            a1.refused,
            a1.errors
        ),
        ("agent-1", 1, 150, 0, 0)
    );
    assert_eq!(
        (
            a2.id.as_str(),
            a2.weight,
            a2.requests,
            a2.responses,
            a2.refused,
            a2.errors
        ),
        ("agent-2", 2, 56, 55, 5, 6)
    );
    assert_eq!(a2.statuses[&429], 5);
    r.thresholds = judge_all(
        &[
            threshold("transaction_status.p99<2ms"),
            threshold("verify_request.p99<2ms"),
            threshold("credential_offer.p99<2ms"),
        ],
        &r,
    );
    let passed: Vec<bool> = r.thresholds.iter().map(|v| v.passed).collect();
    assert_eq!(passed, [true, false, false]);
    assert_eq!(r.thresholds[1].operation, Some("verify_request"));
    assert!(r.thresholds[1]
        .describe()
        .starts_with("verify_request.p99<2ms (verify_request.p99 10.0"));
    // An operation that got no answer was not measured: its threshold fails.
    assert_eq!(r.thresholds[2].actual, None);
    let text = format_report(&r);
    for want in [
        "latency by operation (ms)",
        "    transaction_status ",
        "agent-2 (weight 2): 56 sent, 5 refused, 6 errors; statuses 200: 50, 429: 5",
        "FAIL  verify_request.p99<2ms (verify_request.p99 10.0",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["agents"][1]["refused"], 5);
    assert_eq!(
        v["latency_by_operation"]["verify_request"]["responses"],
        105
    );
    assert_eq!(v["thresholds"][0]["operation"], "transaction_status");
    assert_eq!(v["http"], "1.1");
}

/// A tiny keep-alive server answering every request with an InvitationResponse.
async fn fixed_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    invitation_server(None).await
}

/// [`fixed_server`], but for the request numbered `swallow` (from 0, over all connections),
/// when given: it is read and never answered, and its connection stays silent.
async fn invitation_server(swallow: Option<u64>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(AtomicU64::new(0));
    let handle = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut silent = false;
                loop {
                    let mut headers = [httparse::EMPTY_HEADER; 16];
                    let mut req = httparse::Request::new(&mut headers);
                    if let (false, Ok(httparse::Status::Complete(head))) = (silent, req.parse(&buf))
                    {
                        let len = req
                            .headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                            .map_or(0, |h| {
                                std::str::from_utf8(h.value).unwrap().parse().unwrap()
                            });
                        if buf.len() >= head + len {
                            buf.drain(..head + len);
                            if Some(seen.fetch_add(1, Ordering::SeqCst)) == swallow {
                                silent = true;
                                continue;
                            }
                            // Head and body in one write: two would meet Nagle and
                            // delayed ACKs (40 ms an answer).
                            let mut resp = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                                INVITATION.len()
                            )
                            .into_bytes();
                            resp.extend_from_slice(INVITATION);
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
    let mut plan = sample_plan(flat(400.0, 250), addr);
    let r = execute(plan.clone(), no_stop(), None).await.unwrap();
    assert_eq!(r.responses, 100, "{r:?}");
    assert_eq!(r.statuses[&200], 100);
    assert_eq!(r.errors.total, 0);
    assert_eq!(r.operations.values().sum::<u64>(), 100);
    assert!(r.elapsed_s >= 0.24, "{r:?}");
    assert!(!r.interrupted);
    assert_eq!(r.timeline.iter().map(|s| s.responses).sum::<u64>(), 100);

    // How many a closed run gets in its time is the machine's speed: only that it got some.
    plan.setup.load = Load::Closed(Duration::from_millis(100));
    let r = execute(plan, no_stop(), None).await.unwrap();
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
    let plan = sample_plan(
        Load::Open(Schedule::ramps(stages("500ms:400,500ms:0"))),
        addr,
    );
    let r = execute(plan, no_stop(), None).await.unwrap();
    assert_eq!(r.responses, 200, "{r:?}");
    assert_eq!(r.stages.as_ref().map(Vec::len), Some(2));
    assert_eq!(r.timeline.iter().map(|s| s.responses).sum::<u64>(), 200);
    assert_eq!(r.timeline[0].target_rps, Some(200.0));
    server.abort();
}

#[tokio::test]
async fn nothing_is_sent_during_a_leading_pause() {
    // 1 s at 0 req/s, then 0 -> 200 over 0.5 s: 50 requests, none due before 1 s, so none can
    // end in second 0.
    let (addr, server) = fixed_server().await;
    let plan = sample_plan(Load::Open(Schedule::ramps(stages("1s:0,500ms:200"))), addr);
    let r = execute(plan, no_stop(), None).await.unwrap();
    assert_eq!(r.responses, 50, "{r:?}");
    assert_eq!(r.timeline[0].responses, 0, "{:?}", r.timeline[0]);
    server.abort();
}

#[tokio::test]
async fn a_stop_ends_the_run_early_and_reports_what_was_measured() {
    let (addr, server) = fixed_server().await;
    for load in [flat(200.0, 60_000), Load::Closed(Duration::from_secs(60))] {
        let plan = sample_plan(load, addr);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = tokio::spawn(async move { execute(plan, stopped, None).await });
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
    let plan = sample_plan(flat(100.0, 1000), addr);
    assert!(matches!(
        execute(plan, no_stop(), None).await,
        Err(LoadError::Connect(a, _)) if a == addr
    ));
}

/// The body every local test server answers with.
const INVITATION: &[u8] =
    br#"{"status_code":200,"message_code":0,"message":"OK","transaction_id":"tx-7"}"#;

/// An h2c server answering every request `delay` after it has read it, with an
/// InvitationResponse; the heads of the requests it saw.
async fn h2_server(
    delay: Duration,
) -> (
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<http::request::Parts>>>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let heads = seen.clone();
    let handle = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let heads = heads.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let heads = heads.clone();
                    tokio::spawn(async move {
                        let (head, mut body) = req.into_parts();
                        heads.lock().unwrap().push(head);
                        while let Some(Ok(chunk)) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.len());
                        }
                        tokio::time::sleep(delay).await;
                        let answer = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/json")
                            .body(())
                            .unwrap();
                        if let Ok(mut send) = respond.send_response(answer, false) {
                            let _ = send.send_data(bytes::Bytes::from_static(INVITATION), true);
                        }
                    });
                }
            });
        }
    });
    (addr, seen, handle)
}

fn http2_plan(load: Load, addr: SocketAddr, connections: usize, streams: usize) -> Plan {
    let mut plan = sample_plan(load, addr);
    plan.setup.http = HttpVersion::Http2;
    plan.setup.connections = connections;
    plan.setup.streams = streams;
    plan
}

#[tokio::test]
async fn http2_streams_carry_every_request_with_the_headers_asked_for() {
    let (addr, seen, server) = h2_server(Duration::ZERO).await;
    let mut plan = http2_plan(flat(400.0, 250), addr, 2, 4);
    plan.script.headers = vec!["X-Trace-Case: h2".parse().unwrap()];
    let r = execute(plan.clone(), no_stop(), None).await.unwrap();
    assert_eq!(r.responses, 100, "{r:?}");
    assert_eq!(r.errors.total, 0, "{r:?}");
    assert_eq!((r.http, r.streams), ("2", 4));
    {
        let heads = seen.lock().unwrap();
        assert_eq!(heads.len(), 100);
        for head in heads.iter() {
            assert_eq!(head.version, http::Version::HTTP_2);
            assert_eq!(head.headers["x-trace-case"], "h2");
            assert_eq!(head.headers["x-service-agent-id"], "agent-1");
            assert_eq!(head.uri.authority().unwrap(), "127.0.0.1:8083");
        }
    }
    // Status reads follow: the server's transaction id was remembered and asked for.
    assert!(r.operations.contains_key("transaction_status"), "{r:?}");

    // Closed model: each stream back to back.
    plan.setup.load = Load::Closed(Duration::from_millis(100));
    let r = execute(plan, no_stop(), None).await.unwrap();
    assert!(r.responses > 0 && r.errors.total == 0, "{r:?}");
    server.abort();
}

#[tokio::test]
async fn busy_streams_show_as_latency_from_the_intended_start() {
    // 40 requests due over 0.4 s, one connection of two streams, each answer 50 ms after its
    // request: the server needs at least 20 × 50 ms = 1 s for them all, so the last, due at
    // 0.39 s, waits for a stream and is answered at least 0.6 s after it was due. Measured
    // from its send it would have taken 50 ms.
    let (addr, _, server) = h2_server(Duration::from_millis(50)).await;
    let plan = http2_plan(flat(100.0, 400), addr, 1, 2);
    let r = execute(plan, no_stop(), None).await.unwrap();
    assert_eq!(r.responses, 40, "{r:?}");
    assert_eq!(r.latency_from, "intended start");
    assert!(r.latency_ms.max >= 600.0, "{:?}", r.latency_ms);
    assert!(r.late_starts > 0, "{r:?}");
    server.abort();
}

#[tokio::test]
async fn a_request_count_ends_the_run_with_exactly_that_many_answers() {
    let (addr, server) = fixed_server().await;
    let (h2_addr, _, h2) = h2_server(Duration::ZERO).await;
    for mut plan in [
        sample_plan(flat(400.0, 60_000), addr),
        sample_plan(Load::Closed(Duration::from_secs(60)), addr),
        http2_plan(flat(400.0, 60_000), h2_addr, 2, 8),
        http2_plan(Load::Closed(Duration::from_secs(60)), h2_addr, 2, 8),
    ] {
        plan.setup.requests = Some(30);
        let r = execute(plan, no_stop(), None).await.unwrap();
        assert_eq!(r.responses, 30, "{r:?}");
        assert_eq!(
            r.operations.values().sum::<u64>(),
            30,
            "nothing sent beyond"
        );
        assert_eq!(r.requests_limit, Some(30));
        assert!(!r.interrupted && r.cancelled == 0, "{r:?}");
    }
    server.abort();
    h2.abort();
}

#[tokio::test]
async fn a_saved_run_read_back_makes_the_same_report() {
    let (addr, server) = fixed_server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.jsonl");
    let mut plan = sample_plan(flat(400.0, 250), addr);
    plan.script = two_agents(DEFAULT_MIX);
    plan.setup.agents.push(AgentWeight {
        id: "agent-2".into(),
        weight: 1,
    });
    let saver = Saver::create(&path, vec!["p99<1s".into()]).unwrap();
    let live = execute(plan, no_stop(), Some(&saver)).await.unwrap();
    saver.finish().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    // The first line, one per request, the last.
    assert_eq!(text.lines().count(), 102);
    let saved = read_saved(&path).unwrap();
    assert_eq!(saved.header.thresholds, ["p99<1s"]);
    assert_eq!(make_report(&saved.header.setup, &saved.measured), live);
    assert!(live.agents[1].requests > 0, "{live:?}");

    // Killed before its last line: read as interrupted at its last request.
    let cut: String = text.lines().take(60).map(|l| format!("{l}\n")).collect();
    let partial = read_lines(cut.as_bytes(), "cut.jsonl").unwrap();
    assert!(partial.measured.interrupted);
    assert_eq!(partial.measured.stats.ended.statuses[&200], 59);

    let line = |n: usize, s: &str| {
        let lines: Vec<&str> = text.lines().collect();
        let mut out: Vec<String> = lines[..n].iter().map(|l| l.to_string()).collect();
        out.push(s.into());
        out.join("\n")
    };
    for (bad, want) in [
        ("".to_string(), "cut.jsonl:1: the file is empty"),
        ("{}".to_string(), "cut.jsonl:1: not the first line"),
        (
            line(
                1,
                r#"{"start_us":1,"latency_us":1,"status":200,"operation":"nope","agent":"agent-1"}"#,
            ),
            "cut.jsonl:2: unknown operation \"nope\"",
        ),
        (
            line(
                1,
                r#"{"start_us":1,"latency_us":1,"status":200,"operation":"verify_request","agent":"agent-9"}"#,
            ),
            "cut.jsonl:2: agent \"agent-9\" is not in the first line",
        ),
        (
            line(
                1,
                r#"{"start_us":1,"latency_us":1,"error":"lost","operation":"verify_request","agent":"agent-1"}"#,
            ),
            "cut.jsonl:2: unknown error \"lost\"",
        ),
        (
            line(
                1,
                r#"{"start_us":1,"latency_us":1,"status":200,"error":"io","operation":"verify_request","agent":"agent-1"}"#,
            ),
            "cut.jsonl:2: give one of status and error",
        ),
        (
            line(102, "{\"start_us\":1}"),
            "cut.jsonl:103: a line after the run's last",
        ),
    ] {
        let e = read_lines(bad.as_bytes(), "cut.jsonl").unwrap_err();
        assert!(e.to_string().starts_with(want), "{e}");
    }
    server.abort();
}

/// [`invitation_server`] swallowing request `swallow`.
async fn server_swallowing(swallow: u64) -> SocketAddr {
    invitation_server(Some(swallow)).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_waiting_out_its_timeout_does_not_lower_the_throughput() {
    // 100 requests over 1 s, one of them never answered: the run waits 3 s for it, but the
    // 99 answers are in by about 1 s and the throughput is over that.
    let addr = server_swallowing(10).await;
    let mut plan = sample_plan(flat(100.0, 1000), addr);
    plan.setup.timeout = Duration::from_secs(3);
    let mut r = execute(plan, no_stop(), None).await.unwrap();
    r.thresholds = judge_all(&[threshold("rps>90")], &r);
    assert_eq!(r.responses, 99, "{r:?}");
    assert_eq!(r.errors.connection["timeout"], 1, "{r:?}");
    assert!(
        r.elapsed_s >= 3.0,
        "the run waits for it: {} s",
        r.elapsed_s
    );
    assert!(
        r.last_answer_s > 0.9 && r.last_answer_s < 1.5,
        "{} s",
        r.last_answer_s
    );
    assert!(r.throughput_rps > 90.0, "{} req/s", r.throughput_rps);
    assert!(r.thresholds_passed(), "{:?}", r.thresholds);
    assert!(
        format_report(&r).contains("to the last answer; the run ended at 3."),
        "{}",
        format_report(&r)
    );
}

#[test]
fn throughput_is_over_the_time_to_the_last_answer_merged_across_connections() {
    let at = |start_us, latency_us, end| Record {
        start_us,
        latency_us,
        end,
        ..answer(200, 0)
    };
    let mut one = Stats::default();
    one.record(&at(0, 1_000, End::Answered(200)));
    one.record(&at(1_500_000, 500_000, End::Answered(200)));
    let mut other = Stats::default();
    other.record(&at(1_000_000, 800_000, End::Answered(503)));
    // Later than any answer, but no answer.
    other.record(&at(
        1_900_000,
        10_000_000,
        End::Failed(ConnErrorKind::Timeout),
    ));
    let mut m = Measured::new(std::time::SystemTime::UNIX_EPOCH);
    m.stats.merge(&one);
    m.stats.merge(&other);
    assert_eq!(m.stats.last_answer_us, 2_000_000);
    m.elapsed = Duration::from_secs(12);
    let r = make_report(&setup(flat(2.0, 2000)), &m);
    assert_eq!((r.last_answer_s, r.elapsed_s), (2.0, 12.0));
    assert_eq!(r.throughput_rps, 1.5);
    assert!(
        format_report(&r)
            .contains("3 responses in 2.00 s, to the last answer; the run ended at 12.00 s"),
        "{}",
        format_report(&r)
    );
    // No answer: no throughput.
    let r = make_report(
        &setup(flat(2.0, 2000)),
        &Measured::new(std::time::SystemTime::UNIX_EPOCH),
    );
    assert_eq!(r.throughput_rps, 0.0);
}

/// A server that takes `n` connections, answers on them like `fixed_server`, and then stops
/// listening: later connections are refused.
async fn server_accepting(n: usize) -> SocketAddr {
    let (inner, _) = fixed_server().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for _ in 0..n {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut up = tokio::net::TcpStream::connect(inner).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_max_keeps_its_steps_when_a_later_step_cannot_connect() {
    // The first step's two connections are all the target takes: the second step cannot
    // connect, breaks, and ends the search with the first step's answer.
    let addr = server_accepting(2).await;
    let mut plan = sample_plan(flat(50.0, 300), addr);
    plan.setup.connections = 2;
    let knee = super::run::find_max(plan, &[threshold("p99<1s")], 50.0, 4, no_stop())
        .await
        .expect("the steps so far are the answer");
    assert_eq!(knee.steps.len(), 1, "{knee:?}");
    assert_eq!(knee.steps[0].held, Some(true));
    assert_eq!(
        (knee.max_rate_held, knee.lowest_rate_broken),
        (Some(50.0), Some(100.0))
    );
    let failed = knee.failed_step.as_ref().unwrap();
    assert_eq!(failed.rate, 100.0);
    assert!(
        failed.error.starts_with("cannot connect to 127.0.0.1:"),
        "{failed:?}"
    );
    let text = format_knee(&knee);
    assert!(text.contains("broke: cannot connect to"), "{text}");
    assert!(
        text.contains("highest rate that held the SLO: 50 req/s (broken at 100 req/s)"),
        "{text}"
    );

    // The first step cannot connect: nothing was measured, and that is an error.
    let refused = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        closed.local_addr().unwrap()
    };
    let plan = sample_plan(flat(50.0, 300), refused);
    let e = super::run::find_max(plan, &[threshold("p99<1s")], 50.0, 4, no_stop()).await;
    assert!(matches!(e, Err(LoadError::Connect(..))), "{e:?}");
}

/// An h2c server whose first connection takes streams and never answers them; later
/// connections answer at once.
async fn h2_server_first_connection_dead() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let dead = n == 0;
            n += 1;
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                let mut held = Vec::new();
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    if dead {
                        held.push((req, respond));
                        continue;
                    }
                    tokio::spawn(async move {
                        let (_, mut body) = req.into_parts();
                        while let Some(Ok(chunk)) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.len());
                        }
                        let answer = http::Response::builder().status(200).body(()).unwrap();
                        if let Ok(mut send) = respond.send_response(answer, false) {
                            let _ = send.send_data(bytes::Bytes::from_static(INVITATION), true);
                        }
                    });
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_connection_whose_requests_time_out_is_made_again() {
    // 40 requests over 2 s on one connection of two streams, 200 ms timeout: the first
    // connection never answers; after its first timeout the next request makes a new one.
    let addr = h2_server_first_connection_dead().await;
    let mut plan = http2_plan(flat(20.0, 2000), addr, 1, 2);
    plan.setup.timeout = Duration::from_millis(200);
    let r = execute(plan, no_stop(), None).await.unwrap();
    let timeouts = r.errors.connection.get("timeout").copied().unwrap_or(0);
    assert!(r.responses >= 30, "{:?}", r.errors);
    assert!(timeouts <= 6, "{:?}", r.errors);
    assert_eq!(r.responses + timeouts, 40, "{:?}", r.errors);
}

#[test]
fn an_h2_timeout_breaks_the_connection_and_a_reset_does_not() {
    use super::exec::h2_connection_broken;
    for kind in [
        ConnErrorKind::Timeout,
        ConnErrorKind::Io,
        ConnErrorKind::Closed,
        ConnErrorKind::Protocol,
    ] {
        assert!(h2_connection_broken(kind), "{kind:?}");
    }
    assert!(!h2_connection_broken(ConnErrorKind::Reset));
}

#[tokio::test]
async fn a_worker_that_panics_ends_the_run_with_its_panic() {
    // A timeout no `Instant` can hold (the arguments refuse it): every worker panics making
    // its deadlines. The run used to report nothing counted and exit 0.
    let (addr, server) = fixed_server().await;
    let mut plan = sample_plan(flat(100.0, 200), addr);
    plan.setup.timeout = Duration::MAX;
    let run = tokio::spawn(execute(plan, no_stop(), None)).await;
    assert!(run.expect_err("a run whose workers panicked").is_panic());
    server.abort();
}

#[test]
fn rates_past_what_a_run_can_count_are_refused() {
    for bad in ["1e300", "100000001"] {
        let e = bad.parse::<Rate>().unwrap_err();
        assert!(matches!(e, LoadError::Rate(_)), "{bad}: {e}");
        assert!(e.to_string().contains("at most 100000000"), "{e}");
    }
    assert_eq!(
        "100000000".parse::<Rate>().unwrap(),
        Rate::PerSecond(100_000_000.0)
    );
    for bad in ["1s:1e300", "1s:10,1s:100000001"] {
        let e = bad.parse::<Stages>().unwrap_err();
        assert!(e.to_string().contains("100000000"), "{bad}: {e}");
    }
    // The knee search does not double past it either.
    let (rates, best) = search(60_000_000.0, 20, f64::MAX);
    assert_eq!(rates, [60_000_000.0, 100_000_000.0]);
    assert_eq!(best, Some(100_000_000.0));
}

#[tokio::test]
async fn a_dispatcher_that_panics_ends_the_run_with_an_error() {
    // A rate the arguments refuse: within a second more requests are due than a semaphore
    // can hold, and the dispatcher panics releasing them. The workers used to send what it
    // had released and report that as the run, or with nothing released wait for ever. (The
    // timeout only stops a hang.)
    let (addr, server) = fixed_server().await;
    let mut plan = sample_plan(flat(1e19, 1000), addr);
    plan.setup.timeout = Duration::from_secs(1);
    let run = tokio::time::timeout(Duration::from_secs(60), execute(plan, no_stop(), None))
        .await
        .expect("the run ends rather than hangs");
    // Nor does it report what the workers took before the panic as a run that went fine.
    match run {
        Ok(r) => panic!("reported as a run: {} answers", r.responses),
        Err(e) => assert!(matches!(e, LoadError::Dispatcher(_)), "{e}"),
    }
    server.abort();
}

#[test]
fn latencies_as_long_as_a_run_can_make_are_kept_whole() {
    // 90 s (the cap was a minute), and the longest a run can make: a request due at the start
    // of a year-long run, taken just before its hard deadline, waiting out a year's timeout.
    let longest = 3 * LONGEST.as_secs() * 1_000_000;
    for latency_us in [90_000_000, longest] {
        let mut m = Measured::new(std::time::SystemTime::UNIX_EPOCH);
        m.stats = stats_with([1_000, latency_us], 200);
        m.elapsed = Duration::from_micros(latency_us);
        let r = make_report(&setup(flat(1.0, 2000)), &m);
        let want_ms = latency_us as f64 / 1000.0;
        // Within the histograms' significant digits: 3 for the run, 2 for a second.
        assert!(
            (r.latency_ms.max - want_ms).abs() <= want_ms * 1e-3,
            "{} ms for {want_ms} ms",
            r.latency_ms.max
        );
        let mut second = Second::new(2);
        second.record(&answer(200, latency_us));
        let max_us = second.latency_of_all().max() as f64;
        assert!(
            (max_us / 1000.0 - want_ms).abs() <= want_ms * 1e-2,
            "{max_us} µs for {want_ms} ms"
        );
    }
}

/// A server that takes connections and reads what they send, and never answers.
async fn silent_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_hard_deadline_the_rest_of_the_schedule_is_unsent_at_once() {
    // 30 000 requests due over 0.3 s on one connection to a server that never answers, 100 ms
    // timeout: a few time out, and at the hard deadline (0.4 s) the rest is unsent, counted in
    // one step and saved as one line per agent, not one by one through the gate.
    let addr = silent_server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.jsonl");
    let mut plan = sample_plan(flat(100_000.0, 300), addr);
    plan.setup.connections = 1;
    plan.setup.timeout = Duration::from_millis(100);
    plan.script = two_agents(DEFAULT_MIX);
    plan.setup.agents.push(AgentWeight {
        id: "agent-2".into(),
        weight: 1,
    });
    let saver = Saver::create(&path, Vec::new()).unwrap();
    let live = execute(plan, no_stop(), Some(&saver)).await.unwrap();
    saver.finish().unwrap();
    let timeouts = live.errors.connection["timeout"];
    assert_eq!(live.responses, 0);
    assert_eq!(timeouts + live.errors.unsent, 30_000, "{:?}", live.errors);
    assert!(live.errors.unsent > 29_000, "{:?}", live.errors);
    // Late is sent late: the unsent are not.
    assert!(live.late_starts <= timeouts, "{} late", live.late_starts);
    assert_eq!(
        live.agents.iter().map(|a| a.errors).sum::<u64>(),
        30_000,
        "{:?}",
        live.agents
    );
    assert!(live.elapsed_s < 1.0, "{} s", live.elapsed_s);

    let text = std::fs::read_to_string(&path).unwrap();
    let unsent_lines = text.lines().filter(|l| l.contains("\"unsent\"")).count();
    // The one taken past the deadline, and the rest: a line per agent.
    assert!(unsent_lines <= 3, "{unsent_lines} unsent lines");
    assert!(text.contains(",\"count\":"), "no line with a count");
    let saved = read_saved(&path).unwrap();
    assert_eq!(make_report(&saved.header.setup, &saved.measured), live);

    // A hundred times as many: still over at the hard deadline, where one at a time took
    // seconds more.
    let mut plan = sample_plan(flat(10_000_000.0, 300), addr);
    plan.setup.connections = 1;
    plan.setup.timeout = Duration::from_millis(100);
    let r = execute(plan, no_stop(), None).await.unwrap();
    assert!(r.errors.unsent > 2_900_000, "{:?}", r.errors);
    assert!(r.elapsed_s < 1.0, "{} s", r.elapsed_s);
}

#[test]
fn weights_share_a_count_out_whole() {
    let w = Weights::new(vec![3, 1, 0, 2]).unwrap();
    assert_eq!(w.share(600), [300, 100, 0, 200]);
    // 7 × 3/6 = 3.5, 7 × 1/6 = 1.17, 7 × 2/6 = 2.33: the leftover goes to the largest remainder.
    assert_eq!(w.share(7), [4, 1, 0, 2]);
    assert_eq!(w.share(0), [0, 0, 0, 0]);
    let huge = w.share(u64::MAX);
    assert_eq!(
        huge.iter().map(|&n| u128::from(n)).sum::<u128>(),
        u128::from(u64::MAX)
    );
}

#[test]
fn a_saved_count_of_unsent_is_read_as_that_many() {
    let header = r#"{"agent_gateway_load":1,"setup":SETUP,"thresholds":[],"started_at":"2025-01-01T00:00:00Z"}"#
        .replace("SETUP", &serde_json::to_string(&setup(flat(10.0, 1000))).unwrap());
    let line = |count: &str, error: &str| {
        format!(
            "{header}\n{{\"start_us\":900000,\"latency_us\":1200000,\"error\":\"{error}\",\"operation\":\"verify_request\",\"agent\":\"agent-1\"{count}}}\n"
        )
    };
    let saved = read_lines(line(",\"count\":7", "unsent").as_bytes(), "s.jsonl").unwrap();
    assert_eq!(saved.measured.stats.ended.unsent, 7);
    assert_eq!(saved.measured.stats.agents[0].unanswered, 7);
    assert_eq!(saved.measured.stats.agents[0].sent, 0);
    assert_eq!(saved.measured.timeline.entries()[2].unsent, 7);
    for bad in [
        line(",\"count\":7", "timeout"),
        line(",\"count\":0", "unsent"),
    ] {
        let e = read_lines(bad.as_bytes(), "s.jsonl").unwrap_err();
        assert!(e.to_string().contains("a count is for unsent lines"), "{e}");
    }
}

#[test]
fn an_unsent_request_is_not_a_late_start() {
    let mut stats = Stats::default();
    stats.record(&Record {
        late: true,
        ..failure(ConnErrorKind::Timeout)
    });
    stats.record(&Record {
        late: true,
        end: End::Unsent,
        ..answer(0, 1_000)
    });
    assert_eq!(stats.late_starts, 1);
}
