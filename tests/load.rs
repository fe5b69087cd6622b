//! `agent-gateway load` against a real gateway in front of the mock v2 backend: both models,
//! both API versions, ramps, thresholds and the exit status, Ctrl-C, the knee search, the JSON
//! report, errors counted by status; over TLS and HTTP/2 with several agents, one of them
//! limited; a run saved and its report redrawn without the target; and the HTML report as
//! headless Chromium draws it.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use common::pki::TestPki;
use common::*;

/// A gateway in front of the mock v2 backend, the test agent limited to `limit` (rate per
/// second, burst) when given.
fn gateway_on_the_mock(limit: Option<(f64, u32)>) -> (MockBackend, Gateway) {
    let mock = MockBackend::start();
    let mut cfg = test_config(&[mock.addr]);
    if let Some((rate, burst)) = limit {
        let agent = cfg.agent_mut(AGENT_ID);
        agent.rate_limit_per_second = Some(rate);
        agent.burst = Some(burst);
    }
    (mock, Gateway::builder(cfg).start())
}

/// The second agent of [`gateway_with_agents`], limited to [`LIMITED`].
const AGENT_2: &str = "agent-2";
const TOKEN_2: &str = "secret-2";
/// Its rate limit: 20 requests a second, 5 at once above that.
const LIMITED: (f64, u32) = (20.0, 5);

/// A gateway in front of the mock v2 backend with two agents, and the `--agents` file that
/// sends as both ([`agents_file`]).
struct TwoAgents {
    mock: MockBackend,
    gw: Gateway,
    /// Holds the agents file and whatever else a test writes.
    dir: tempfile::TempDir,
    /// The agents file's path.
    agents: String,
}

/// [`TwoAgents`]: the test agent, unlimited, and [`AGENT_2`], limited to [`LIMITED`]; the
/// gateway serving TLS with `pki`'s certificate when given.
fn gateway_with_agents(pki: Option<&TestPki>) -> TwoAgents {
    let mock = MockBackend::start();
    let mut cfg = test_config(&[mock.addr]);
    let mut limited = AgentFile::new(AGENT_2, TOKEN_2);
    limited.rate_limit_per_second = Some(LIMITED.0);
    limited.burst = Some(LIMITED.1);
    cfg.auth.agents.push(limited);
    if let Some(pki) = pki {
        pki.serve_on(&mut cfg);
    }
    let dir = tempfile::tempdir().unwrap();
    let agents = agents_file(dir.path());
    TwoAgents {
        mock,
        gw: Gateway::builder(cfg).start(),
        dir,
        agents,
    }
}

/// An `--agents` file in `dir`: the test agent with weight 3, [`AGENT_2`] (its token in a
/// file of its own) with weight 1.
fn agents_file(dir: &Path) -> String {
    std::fs::write(dir.join("agent-2.token"), format!("{TOKEN_2}\n")).unwrap();
    let path = dir.join("agents.toml");
    std::fs::write(
        &path,
        format!(
            "[[agents]]\nid = \"{AGENT_ID}\"\ntoken = \"{TOKEN}\"\nweight = 3\n\n\
             [[agents]]\nid = \"{AGENT_2}\"\ntoken_file = \"agent-2.token\"\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// `agent-gateway load` against `target`, credentials and all from `args`.
fn load_at(target: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("load").args(["--target", target]).args(args);
    cmd
}

/// Runs `load_at` to the end, as the test agent.
fn load_output_at(target: &str, args: &[&str]) -> Output {
    load_at(
        target,
        &[&["--agent-id", AGENT_ID, "--token", TOKEN], args].concat(),
    )
    .output()
    .unwrap()
}

/// Runs `load_at` with `--json`, expecting success, and returns the report.
fn load_json_at(target: &str, args: &[&str]) -> serde_json::Value {
    let out = load_at(target, &[args, &["--json"]].concat())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `agent-gateway load` against the gateway's proxy listener, with the test agent.
fn load_command(gw: &Gateway, args: &[&str]) -> Command {
    load_at(
        &format!("http://{}", gw.proxy),
        &[&["--agent-id", AGENT_ID, "--token", TOKEN], args].concat(),
    )
}

/// Runs it to the end.
fn load_output(gw: &Gateway, args: &[&str]) -> Output {
    load_command(gw, args).output().unwrap()
}

/// Runs it with `--json`, expecting success, and returns the report.
fn load(gw: &Gateway, args: &[&str]) -> serde_json::Value {
    let out = load_output(gw, &[args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every answer a 200: status reads only ask for transaction ids the backend issued.
fn assert_all_ok(r: &serde_json::Value) {
    assert_eq!(r["statuses"]["200"], r["responses"], "{r}");
    assert_eq!(r["errors"]["total"], 0, "{r}");
}

#[test]
fn an_open_model_run_sends_on_schedule_and_reports_percentiles() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let r = load(
        &gw,
        &["--rate", "200", "--duration", "1s", "--connections", "4"],
    );
    assert_eq!(r["model"], "open");
    assert_eq!(r["latency_from"], "intended start");
    assert_eq!(r["responses"], 200, "{r}");
    // Status reads ask only for transactions this run created, so all is 200.
    assert_all_ok(&r);
    let ms = &r["latency_ms"];
    for (lo, hi) in [
        ("p50", "p90"),
        ("p90", "p99"),
        ("p99", "p99_9"),
        ("p99_9", "max"),
    ] {
        assert!(ms[lo].as_f64().unwrap() <= ms[hi].as_f64().unwrap(), "{ms}");
    }
    // Every operation of the default mix was exercised, and the gateway saw each request.
    let ops = r["operations"].as_object().unwrap();
    assert_eq!(ops.len(), 5, "{ops:?}");
    for op in ["verify_request", "transaction_status"] {
        gw.wait_for_metric(
            &format!(
                "agent_gateway_requests_total{{api_version=\"v1\",code=\"200\",operation=\"{op}\"}}"
            ),
            ops[op].as_f64().unwrap(),
        );
    }
}

#[test]
fn a_closed_model_run_on_v2_counts_refusals_by_status() {
    let (_mock, gw) = gateway_on_the_mock(Some((50.0, 5)));
    let r = load(
        &gw,
        &[
            "--rate",
            "max",
            "--duration",
            "1s",
            "--connections",
            "2",
            "--api",
            "v2",
            "--service",
            "SVC",
        ],
    );
    assert_eq!(r["model"], "closed");
    let ok = r["statuses"]["200"].as_u64().unwrap_or(0);
    let limited = r["statuses"]["429"].as_u64().unwrap_or(0);
    assert!(ok > 0 && limited > 0, "{r}");
    assert_eq!(r["errors"]["by_status"]["429"].as_u64(), Some(limited));
    assert_eq!(r["responses"].as_u64(), Some(ok + limited));
}

#[test]
fn a_ramp_sends_what_its_stages_call_for_and_shows_them_in_progress() {
    let (_mock, gw) = gateway_on_the_mock(None);
    // 0 -> 200 req/s over 1 s (100 requests), 200 held for 1 s (200), 200 -> 0 over 2 s (200).
    let out = load_output(
        &gw,
        &[
            "--stages",
            "1s:200,1s:200,2s:0",
            "--connections",
            "4",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["model"], "open");
    assert_eq!(r["rate"], serde_json::Value::Null);
    assert_eq!(r["duration_s"], 4.0);
    assert_eq!(r["stages"][1]["target_rps"], 200.0);
    assert_eq!(r["responses"], 500, "{r}");
    assert_all_ok(&r);
    // The timeline: every answer in some second, the schedule's target and stage beside it.
    let timeline = r["timeline"].as_array().unwrap();
    let answered: u64 = timeline
        .iter()
        .map(|s| s["responses"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, 500);
    let targets: Vec<f64> = timeline[..4]
        .iter()
        .map(|s| s["target_rps"].as_f64().unwrap())
        .collect();
    assert_eq!(targets, [100.0, 200.0, 150.0, 50.0]);
    let stages: Vec<u64> = timeline[..4]
        .iter()
        .map(|s| s["stage"].as_u64().unwrap())
        .collect();
    assert_eq!(stages, [1, 2, 3, 3]);
    // The progress line of each second says the stage and what it called for.
    let progress = stderr(&out);
    for want in [
        "stage 1/3 target      100 req/s",
        "stage 2/3 target      200 req/s",
    ] {
        assert!(progress.contains(want), "{want:?} not in\n{progress}");
    }
}

#[test]
fn thresholds_gate_the_exit_status_and_each_verdict_is_in_the_json() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let base = ["--rate", "100", "--duration", "1s", "--connections", "2"];
    // All pass: exit 0.
    let out = load_output(
        &gw,
        &[
            &base[..],
            &["--threshold", "p99<60s", "--threshold", "errors<=100%"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pass  p99<60s (p99 "), "{text}");
    // One fails: exit 1, the failed one named on stderr, every verdict in the JSON.
    let out = load_output(
        &gw,
        &[
            &base[..],
            &[
                "--threshold",
                "p99<60s",
                "--threshold",
                "errors<=100%",
                "--threshold",
                "rps>1000000",
                "--json",
            ],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("1 of 3 thresholds failed: rps>1000000 (rps "),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts = r["thresholds"].as_array().unwrap();
    let passed: Vec<(&str, bool)> = verdicts
        .iter()
        .map(|v| {
            (
                v["threshold"].as_str().unwrap(),
                v["passed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        passed,
        [
            ("p99<60s", true),
            ("errors<=100%", true),
            ("rps>1000000", false)
        ]
    );
    assert_eq!(verdicts[0]["limit"], 60_000.0);
    assert_eq!(verdicts[0]["unit"], "ms");
    assert_eq!(verdicts[2]["actual"], r["throughput_rps"]);
}

#[test]
fn an_error_threshold_fails_when_the_gateway_refuses_over_the_agents_rate() {
    let (_mock, gw) = gateway_on_the_mock(Some((50.0, 5)));
    let out = load_output(
        &gw,
        &[
            "--rate",
            "max",
            "--duration",
            "1s",
            "--connections",
            "2",
            "--mix",
            "verify_request=1",
            "--threshold",
            "errors<0.1%",
            "--threshold",
            "p99<60s",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("1 of 2 thresholds failed: errors<0.1% (errors "),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors = &r["thresholds"][0];
    assert_eq!(errors["passed"], false);
    let refused = r["statuses"]["429"].as_u64().unwrap();
    let ratio = refused as f64 / r["responses"].as_f64().unwrap();
    assert!(
        (errors["actual"].as_f64().unwrap() - ratio).abs() < 1e-9,
        "{r}"
    );
    assert_eq!(r["thresholds"][1]["passed"], true);
}

/// The series of the gateway's 429s to an agent over its rate.
fn limited_series(agent: &str) -> String {
    format!("agent_gateway_rate_limited_total{{agent_id=\"{agent}\"}}")
}

/// Checks a run's agents: [`agents_file`]'s two, every request of the unlimited one answered
/// 200, the limited one refused some with 429; they add up to `total`. Returns the refusals.
fn assert_agents_counted(r: &serde_json::Value, total: u64) -> u64 {
    let agents = r["agents"].as_array().unwrap();
    let (a1, a2) = (&agents[0], &agents[1]);
    assert_eq!(
        (&a1["id"], &a1["weight"]),
        (&AGENT_ID.into(), &3.into()),
        "{r}"
    );
    assert_eq!(
        (&a2["id"], &a2["weight"]),
        (&AGENT_2.into(), &1.into()),
        "{r}"
    );
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    assert_eq!(n(&a1["requests"]) + n(&a2["requests"]), total, "{r}");
    // Weights 3 and 1.
    assert!(n(&a1["requests"]) > 2 * n(&a2["requests"]), "{r}");
    assert_eq!(
        a1["statuses"],
        serde_json::json!({"200": a1["requests"]}),
        "{r}"
    );
    assert_eq!((n(&a1["refused"]), n(&a1["errors"])), (0, 0), "{r}");
    let refused = n(&a2["refused"]);
    assert!(refused > 0, "{r}");
    assert_eq!(a2["statuses"]["429"].as_u64(), Some(refused), "{r}");
    assert_eq!(n(&a2["errors"]), refused, "{r}");
    refused
}

/// A `--target` with user information would send it in every request's `Host` and show it in
/// each report (the text, the JSON, the HTML page's title); the gateway takes credentials as
/// headers, never basic auth. A port that is not a number went to port 80. Each is a usage
/// error, as clap's own (exit 2), before anything is sent, and the error shows no password.
#[test]
fn a_target_with_a_user_or_a_port_not_a_number_is_refused_before_anything_is_sent() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let at = gw.proxy;
    for (target, why) in [
        (
            format!("http://tester:load-pw@{at}"),
            "must not carry a user or password",
        ),
        (
            format!("http://tester@{at}"),
            "must not carry a user or password",
        ),
        // Unencoded, the password's `/` ends the authority: host `tester`, port `load`.
        (
            format!("http://tester:load/pw@{at}"),
            "its port is not a number",
        ),
        (format!("http://{}:gw", at.ip()), "its port is not a number"),
    ] {
        let args = ["--rate", "20", "--duration", "1s", "--json", "--report"];
        let out = load_output_at(&target, &[&args[..], &[html.to_str().unwrap()]].concat());
        let report = std::fs::read_to_string(&html).unwrap_or_default();
        let shown = [stderr(&out), stdout(&out), report].concat();
        for password in ["load-pw", "load/pw"] {
            assert!(!shown.contains(password), "{target}: {shown}");
        }
        assert_eq!(out.status.code(), Some(2), "{target}: {shown}");
        assert!(stderr(&out).contains(why), "{target}: {}", stderr(&out));
    }
    assert_eq!(gw.access_log(), Vec::<serde_json::Value>::new());
}

/// Nothing listens there: a test of arguments refused before a connection is tried.
const NOWHERE: &str = "http://127.0.0.1:1";

/// A refused `-H` is a usage error (exit 2) that names its header, when it has a name, and
/// what is wrong, never its value, which may be a secret (an `Authorization`): as clap's own
/// error would, the generator's echoed the argument whole.
#[test]
fn a_refused_header_says_what_is_wrong_without_its_value() {
    const SECRET: &str = "s3cret-4b7e";
    let credentials = ["--agent-id", AGENT_ID, "--token", TOKEN];
    for (header, why) in [
        (
            format!("X-Auth-Token: {SECRET}"),
            "bad -H X-Auth-Token: the generator sets this header itself",
        ),
        (
            format!("Authorization: Bearer {SECRET}\u{1}"),
            "bad -H Authorization: the value holds a control character",
        ),
        (
            format!("Authorization Bearer {SECRET}"),
            "bad -H: not `Name: value`",
        ),
        (
            format!("Bearer {SECRET}: x"),
            "bad -H: the name is not an HTTP header name",
        ),
    ] {
        let out = load_at(NOWHERE, &[&credentials[..], &["-H", &header]].concat())
            .output()
            .unwrap();
        let shown = [stderr(&out), stdout(&out)].concat();
        assert!(!shown.contains(SECRET), "{header:?}: {shown}");
        assert_eq!(out.status.code(), Some(2), "{header:?}: {shown}");
        assert!(stderr(&out).contains(why), "{header:?}: {shown}");
    }
}

/// A credentials or agents file that cannot be read names the key, line and column of its
/// mistake and what it is, never its line, which may be a `token = ...` line: the TOML
/// parser's error quoted the line, and the message of a token of the wrong type its value.
#[test]
fn a_credentials_or_agents_file_that_cannot_be_read_shows_no_token() {
    const SECRET: &str = "s3cret-4b7e";
    const DIGITS: &str = "48151623429";
    let dir = tempfile::tempdir().unwrap();
    for (flag, name, text, secret, why) in [
        (
            "--agents",
            "agents.toml",
            format!("[[agents]]\nid = \"a\"\ntoken = \"{SECRET}\" weight = 2\n"),
            SECRET,
            "agents.toml: agents[0].token (line 3, column 23): ",
        ),
        (
            "--agents",
            "agents.toml",
            format!("[[agents]]\nid = \"a\"\ntoken = \"{SECRET}\n"),
            SECRET,
            "agents.toml: agents[0].token (line 3, column ",
        ),
        (
            "--agents",
            "agents.toml",
            format!("[[agents]]\nid = \"a\"\nweight = 1\ntoken = {DIGITS}\n"),
            DIGITS,
            "agents.toml: agents[0].token (line 4, column 9): a token must be a string",
        ),
        (
            "--credentials",
            "creds.toml",
            format!("agent_id = \"a\"\ntoken = \"{SECRET}\" x\n"),
            SECRET,
            "creds.toml: token (line 2, column 23): ",
        ),
        (
            "--credentials",
            "creds.json",
            format!("{{\"agent_id\": \"a\", \"token\": {DIGITS}}}"),
            DIGITS,
            "creds.json: a token must be a string at line 1",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &text).unwrap();
        let out = load_at(NOWHERE, &[flag, path.to_str().unwrap()])
            .output()
            .unwrap();
        let shown = [stderr(&out), stdout(&out)].concat();
        assert!(!shown.contains(secret), "{text:?}: {shown}");
        assert_eq!(out.status.code(), Some(1), "{text:?}: {shown}");
        assert!(stderr(&out).contains(why), "{text:?}: {shown}");
    }
}

#[test]
fn over_tls_several_agents_share_the_load_and_only_the_limited_one_is_refused() {
    let pki = TestPki::for_host("load", "127.0.0.1");
    let TwoAgents {
        mock: _mock,
        gw,
        dir: _dir,
        agents,
    } = gateway_with_agents(Some(&pki));
    let target = format!("https://{}", gw.proxy);
    let quick = ["--agents", &agents, "--rate", "20", "--duration", "1s"];

    // The test CA is not one of the platform's: refused before anything is sent, saying why.
    let out = load_at(&target, &quick).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("TLS handshake: invalid peer certificate: UnknownIssuer"),
        "{}",
        stderr(&out)
    );
    // --insecure takes any certificate.
    let r = load_json_at(&target, &[&quick[..], &["--insecure"]].concat());
    assert_eq!(r["responses"], 20, "{r}");

    // With the CA, over HTTP/1.1 and over HTTP/2 (ALPN): the unlimited agent is answered
    // every time, the limited one (about 50 req/s of its 20) is refused, and the gateway's
    // count of its refusals is the report's.
    let mut refused_so_far = 0;
    for http2 in [false, true] {
        let mut args = vec![
            "--agents",
            &agents,
            "--cacert",
            &pki.ca,
            "--rate",
            "200",
            "--duration",
            "1s",
            "--connections",
            "4",
            "--mix",
            "verify_request=1",
        ];
        if http2 {
            args.extend(["--http2", "--streams", "4"]);
        }
        let r = load_json_at(&target, &args);
        assert_eq!(r["http"], if http2 { "2" } else { "1.1" }, "{r}");
        assert_eq!(r["responses"], 200, "{r}");
        refused_so_far += assert_agents_counted(&r, 200);
        gw.wait_for_metric(&limited_series(AGENT_2), refused_so_far as f64);
    }
    gw.wait_for_metric("agent_gateway_connections_total{protocol=\"h2\"}", 4.0);
}

#[test]
fn h2c_streams_through_two_agents_end_after_the_answers_asked_for_and_judge_each_operation() {
    let TwoAgents {
        mock: _mock,
        gw,
        dir: _dir,
        agents,
    } = gateway_with_agents(None);
    // 400 req/s through both agents for up to 10 s, ended at 300 answers; a threshold on one
    // operation's latency that holds, one on another's that cannot.
    let out = load_at(
        &format!("http://{}", gw.proxy),
        &[
            "--agents",
            &agents,
            "--http2",
            "--streams",
            "8",
            "--connections",
            "2",
            "--rate",
            "400",
            "--duration",
            "10s",
            "--requests",
            "300",
            "--threshold",
            "verify_request.p99<60s",
            "--threshold",
            "transaction_status.p50<1us",
            "--json",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "1 of 2 thresholds failed: transaction_status.p50<1us (transaction_status.p50 "
        ),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&r["http"], &r["streams"]), (&"2".into(), &8.into()));
    assert_eq!(
        (&r["responses"], &r["requests_limit"]),
        (&300.into(), &300.into())
    );
    assert_eq!(r["interrupted"], false);
    // The unlimited agent answered every time, the limited one (about 100 req/s of its 20)
    // refused some, as the gateway counted them.
    let refused = assert_agents_counted(&r, 300);
    gw.wait_for_metric(&limited_series(AGENT_2), refused as f64);
    // Every operation's latency, adding up to the whole mix's answers.
    let by_op = r["latency_by_operation"].as_object().unwrap();
    assert_eq!(by_op.len(), 5, "{by_op:?}");
    let answered: u64 = by_op
        .values()
        .map(|o| o["responses"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, 300);
    for (op, o) in by_op {
        let l = &o["latency_ms"];
        assert!(l["p50"].as_f64() <= l["p99"].as_f64(), "{op}: {l}");
        assert_eq!(o["responses"], r["operations"][op], "{op}");
    }
    let verdicts = &r["thresholds"];
    assert_eq!(
        (&verdicts[0]["operation"], &verdicts[0]["passed"]),
        (&"verify_request".into(), &true.into())
    );
    assert_eq!(verdicts[1]["passed"], false);
    // The gateway was spoken to over HTTP/2 on the two connections asked for.
    gw.wait_for_metric(
        "agent_gateway_requests_by_protocol_total{protocol=\"h2\"}",
        300.0,
    );
    gw.wait_for_metric("agent_gateway_connections_total{protocol=\"h2\"}", 2.0);
}

#[test]
fn a_saved_run_is_redrawn_the_same_without_the_target() {
    let TwoAgents {
        mock,
        gw,
        dir,
        agents,
    } = gateway_with_agents(None);
    let saved = dir.path().join("run.jsonl").display().to_string();
    let live = load_json_at(
        &format!("http://{}", gw.proxy),
        &[
            "--agents",
            &agents,
            "--rate",
            "150",
            "--duration",
            "1s",
            "--connections",
            "4",
            "--threshold",
            "p99<60s",
            "-H",
            "X-Load-Case: saved",
            "--save",
            &saved,
        ],
    );
    assert_agents_counted(&live, 150);
    assert_eq!(live["headers"], serde_json::json!(["x-load-case"]));
    // The first line, a line per request, the last.
    let lines = std::fs::read_to_string(&saved).unwrap();
    assert_eq!(lines.lines().count(), 152);
    assert!(!lines.contains(TOKEN_2), "no credential in the file");
    drop(gw);
    drop(mock);

    let report = |args: &[&str]| {
        Command::new(BIN)
            .args(["load", "report", &saved])
            .args(args)
            .output()
            .unwrap()
    };
    let out = report(&["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let redrawn: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(redrawn, live);
    let out = report(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "agent-2 (weight 1): ",
        "pass  p99<60s",
        "latency by operation",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let html = dir.path().join("redrawn.html");
    let out = report(&["--report", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&format!(
        "\"started_at\":\"{}\"",
        live["started_at"].as_str().unwrap()
    )));
    // Other thresholds, judged on the same run.
    let out = report(&["--threshold", "rps>1000000"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("1 of 1 thresholds failed: rps>1000000"));
}

/// Waits until a progress line reports answers, then returns the lines read so far; the rest
/// of stderr is drained by a thread into the returned handle.
fn wait_for_answers(
    child: &mut std::process::Child,
) -> (Vec<String>, std::thread::JoinHandle<Vec<String>>) {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .expect("stderr ended before a progress line")
            .unwrap();
        let answered = line.starts_with('[')
            && line
                .split("total")
                .nth(1)
                .and_then(|t| t.split_whitespace().next())
                .is_some_and(|n| n != "0");
        seen.push(line);
        if answered {
            break;
        }
    }
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
    (seen, rest)
}

#[test]
fn ctrl_c_ends_the_run_early_and_still_prints_and_writes_the_report() {
    let (_mock, gw) = gateway_on_the_mock(None);
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("interrupted.html");
    for json in [true, false] {
        let mut cmd = load_command(
            &gw,
            &[
                "--rate",
                "100",
                "--duration",
                "60s",
                "--connections",
                "2",
                "--threshold",
                "p99<60s",
                "--report",
                html.to_str().unwrap(),
            ],
        );
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (_, rest) = wait_for_answers(&mut child);
        signal(child.id(), "INT");
        let out = child.wait_with_output().unwrap();
        let err = rest.join().unwrap().join("\n");
        // Interrupted, thresholds passed on what was measured: 130, as for SIGINT.
        assert_eq!(out.status.code(), Some(130), "{err}");
        assert!(err.contains("interrupted: stopping"), "{err}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if json {
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(r["interrupted"], true);
            let responses = r["responses"].as_u64().unwrap();
            // Some answers, far fewer than the 6000 planned.
            assert!(responses > 0 && responses < 6000, "{r}");
            assert_all_ok(&r);
            assert_eq!(r["thresholds"][0]["passed"], true);
            let answered: u64 = r["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["responses"].as_u64().unwrap())
                .sum();
            assert_eq!(answered, responses);
        } else {
            assert!(stdout.contains("interrupted by Ctrl-C after"), "{stdout}");
            assert!(stdout.contains("throughput"), "{stdout}");
        }
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains("\"interrupted\":true"));
        std::fs::remove_file(&html).unwrap();
    }
}

#[test]
fn find_max_reports_the_highest_rate_that_held_the_slo() {
    // The knee: above 150 req/s (and a burst of 120) the gateway answers 429. A 1 s step at
    // r req/s from a full bucket has about r - 270 refused, so `errors<5%` holds up to about
    // 284 req/s: 50, 100 and 200 hold, 400 breaks. The burst is wide enough that 100 holds
    // even if the generator, stalled on a busy machine, sends a whole second's requests at
    // once, and 400 breaks unless it sends them over more than 1.7 s.
    let (_mock, gw) = gateway_on_the_mock(Some((150.0, 120)));
    let out = load_output(
        &gw,
        &[
            "--find-max",
            "--slo",
            "errors<5%",
            "--slo",
            "p99<30s",
            "--rate",
            "50",
            "--duration",
            "1s",
            "--max-steps",
            "6",
            "--connections",
            "8",
            "--mix",
            "verify_request=1",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let k: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(k["mode"], "find_max");
    assert_eq!(k["slo"], serde_json::json!(["errors<5%", "p99<30s"]));
    let steps = k["steps"].as_array().unwrap();
    let rate = |s: &serde_json::Value| s["rate"].as_f64().unwrap();
    // Doubling from 50 while the SLO holds; 400 cannot (about 37% refused).
    assert_eq!(rate(&steps[0]), 50.0);
    assert_eq!(rate(&steps[1]), 100.0);
    assert!(steps.len() <= 6);
    for s in steps {
        // Each step is a whole run at its rate, judged on its own verdicts.
        let r = &s["report"];
        assert_eq!(r["rate"].as_f64(), Some(rate(s)));
        let all_passed = r["thresholds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["passed"] == true);
        assert_eq!(s["held"].as_bool(), Some(all_passed), "{s}");
        if rate(s) >= 400.0 {
            assert_eq!(s["held"], false, "{s}");
        }
    }
    let held_max = steps
        .iter()
        .filter(|s| s["held"] == true)
        .map(rate)
        .fold(0.0, f64::max);
    let best = k["max_rate_held"].as_f64().unwrap();
    assert_eq!(best, held_max);
    assert!((100.0..300.0).contains(&best), "{k}");
    let broken = k["lowest_rate_broken"].as_f64().unwrap();
    assert!(broken > best);
    // The text says the same.
    let out = load_output(
        &gw,
        &[
            "--find-max",
            "--slo",
            "errors<5%",
            "--rate",
            "50",
            "--duration",
            "1s",
            "--max-steps",
            "2",
            "--mix",
            "verify_request=1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("highest rate that held the SLO: 100 req/s (no step broke it"),
        "{text}"
    );
}

#[test]
fn find_max_exits_1_when_no_rate_holds_the_slo() {
    let (_mock, gw) = gateway_on_the_mock(None);
    // Nothing answers within a microsecond.
    let out = load_output(
        &gw,
        &[
            "--find-max",
            "--slo",
            "p50<1us",
            "--rate",
            "4",
            "--duration",
            "1s",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no rate held the SLO"));
    let k: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(k["max_rate_held"], serde_json::Value::Null);
    // 4, 2, 1 req/s, then it gives up.
    let rates: Vec<f64> = k["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["rate"].as_f64().unwrap())
        .collect();
    assert_eq!(rates, [4.0, 2.0, 1.0]);
}

/// The value of attribute `name` in the start tag `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    Some(&tag[start..start + tag[start..].find('"')?])
}

/// A chart as the browser left it: its plot area in page pixels and its drawn series
/// (name, points, colour).
#[derive(Debug)]
struct DrawnChart {
    plot_box: [u32; 4],
    series: Vec<(String, u64, [u8; 3])>,
}

fn drawn_chart(dom: &str, id: &str) -> DrawnChart {
    let open = dom
        .match_indices("<svg")
        .map(|(i, _)| &dom[i..])
        .find(|s| attr(&s[..s.find('>').unwrap()], "id") == Some(id))
        .unwrap_or_else(|| panic!("no chart {id} in the page"));
    let tag = &open[..open.find('>').unwrap()];
    let plot_box: Vec<u32> = attr(tag, "data-plot-box")
        .unwrap_or_else(|| panic!("chart {id} has no plot box: the script did not finish"))
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    let body = &open[..open.find("</svg>").unwrap()];
    let series = body
        .match_indices('<')
        .map(|(i, _)| &body[i..i + body[i..].find('>').unwrap()])
        .filter(|t| attr(t, "class").is_some_and(|c| c.starts_with("series")))
        .map(|t| {
            let colour = attr(t, "stroke").or_else(|| attr(t, "fill")).unwrap();
            let hex = colour.strip_prefix('#').expect("hex colours");
            let c = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap();
            (
                attr(t, "data-series").unwrap().to_owned(),
                attr(t, "data-points").unwrap().parse().unwrap(),
                [c(0), c(2), c(4)],
            )
        })
        .collect();
    DrawnChart {
        plot_box: plot_box.try_into().unwrap(),
        series,
    }
}

/// An RGB screenshot.
struct Screenshot {
    width: u32,
    height: u32,
    rgb: Vec<[u8; 3]>,
}

fn read_png(path: &Path) -> Screenshot {
    let decoder = png::Decoder::new(BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let step = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    Screenshot {
        width: info.width,
        height: info.height,
        rgb: buf[..info.buffer_size()]
            .chunks(step)
            .map(|p| [p[0], p[1], p[2]])
            .collect(),
    }
}

impl Screenshot {
    /// Pixels inside `b` (x, y, width, height) within 40 of `colour` on every channel.
    fn count_near(&self, b: [u32; 4], colour: [u8; 3]) -> usize {
        let [x0, y0, w, h] = b;
        assert!(
            x0 + w <= self.width && y0 + h <= self.height,
            "{b:?} off the screenshot"
        );
        (y0..y0 + h)
            .flat_map(|y| (x0..x0 + w).map(move |x| (x, y)))
            .filter(|&(x, y)| {
                let p = self.rgb[(y * self.width + x) as usize];
                p.iter().zip(colour).all(|(a, b)| a.abs_diff(b) <= 40)
            })
            .count()
    }
}

#[test]
fn the_html_report_draws_its_charts_in_a_headless_browser() {
    // A ramp through two agents, the second over its limit at the top.
    let TwoAgents {
        mock: _mock,
        gw,
        dir,
        agents,
    } = gateway_with_agents(None);
    let html: PathBuf = dir.path().join("report.html");
    let r = load_json_at(
        &format!("http://{}", gw.proxy),
        &[
            "--agents",
            &agents,
            "--stages",
            "1s:150,1s:150,1s:0",
            "--connections",
            "4",
            "--threshold",
            "p99<60s",
            "--report",
            html.to_str().unwrap(),
        ],
    );
    assert!(r["agents"][1]["refused"].as_u64().unwrap() > 0, "{r}");
    let seconds = r["timeline"].as_array().unwrap().len() as u64;
    let url = format!("file://{}", html.display());

    // The page after its script ran: every chart drawn, with a point per second. Both runs
    // lay the page out in the same window, so the plot areas found here are where the
    // screenshot has them.
    let window = "--window-size=1280,4000";
    let out = chromium(
        &dir.path().join("profile-dom"),
        &[window, "--dump-dom", &url],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let dom = String::from_utf8(out.stdout).unwrap();
    assert!(dom.contains("data-drawn=\"7\""), "{dom}");
    assert!(dom.contains("Load test of http://"), "{dom}");
    for want in ["p99&lt;60s", ">pass<", "stage 2", "1s:150,1s:150,1s:0"] {
        assert!(dom.contains(want), "{want:?} not in the page");
    }
    let charts: Vec<(&str, DrawnChart)> = [
        "throughput",
        "latency",
        "statuses",
        "distribution",
        "operation-latency",
        "operation-distribution",
        "agents",
    ]
    .into_iter()
    .map(|id| (id, drawn_chart(&dom, id)))
    .collect();
    let names = |c: &DrawnChart| c.series.iter().map(|s| s.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&charts[0].1),
        ["target (the schedule)", "responses per second"]
    );
    assert_eq!(names(&charts[1].1), ["p50", "p90", "p99", "p99.9", "max"]);
    assert!(names(&charts[2].1).contains(&"HTTP 200".to_string()));
    for (id, chart) in &charts[..2] {
        for (name, points, _) in &chart.series {
            // The target stops with the schedule; answers may straggle into one more second.
            assert!(
                *points + 1 >= seconds && *points <= seconds,
                "{id} {name}: {points} points for {seconds} seconds"
            );
        }
    }
    let distribution = &charts[3].1.series[0];
    assert_eq!(
        distribution.1,
        r["latency_distribution"].as_array().unwrap().len() as u64
    );
    // A line per operation answered: its p99 second by second, and its distribution next to
    // the whole mix's.
    let ops: Vec<String> = [
        "verify_request",
        "verify_response",
        "connection_invitation",
        "credential_offer",
        "transaction_status",
    ]
    .into_iter()
    .filter(|op| r["latency_by_operation"].get(op).is_some())
    .map(String::from)
    .collect();
    assert_eq!(ops.len(), 5, "{r}");
    assert_eq!(names(&charts[4].1), ops);
    assert_eq!(
        names(&charts[5].1),
        [ops.clone(), vec!["all (the mix)".to_string()]].concat()
    );
    for (name, points, _) in &charts[5].1.series[..5] {
        let want = r["latency_by_operation"][name]["latency_distribution"]
            .as_array()
            .unwrap()
            .len() as u64;
        assert_eq!(*points, want, "{name}");
    }
    // Each agent's requests by how they ended: answered, and the limited one's refusals.
    assert_eq!(names(&charts[6].1), ["answered 2xx", "refused (4xx)"]);
    assert_eq!(charts[6].1.series[0].1, 2, "a bar per agent");
    assert_eq!(charts[6].1.series[1].1, 1, "only the limited agent refused");
    for want in [">agent-2<", "refused (4xx)", "all (the mix)"] {
        assert!(dom.contains(want), "{want:?} not in the page");
    }

    // And what a person sees: each series' colour painted inside its chart's plot area.
    let png = dir.path().join("report.png");
    let out = chromium(
        &dir.path().join("profile-shot"),
        &[window, &format!("--screenshot={}", png.display()), &url],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let shot = read_png(&png);
    for (id, chart) in &charts {
        for (name, _, colour) in &chart.series {
            let n = shot.count_near(chart.plot_box, *colour);
            assert!(
                n >= 15,
                "{id} {name}: {n} pixels of {colour:?} in {:?}",
                chart.plot_box
            );
        }
    }
}
