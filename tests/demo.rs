//! `agent-gateway demo` on the shipped config (its ports moved to ones the harness chooses):
//! once it listens it prints the commands to try, and each works as printed, run by `sh`; and
//! the README's five-minute tour works as printed against it (its ports and `cargo run --`
//! aside).

mod common;

use std::process::Command;

use agent_gateway::config::FileConfig;
use common::markdown::commands;
use common::{free_port, loopback, metric_value, request, Gateway, ANY_PORT, BIN};

const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/gateway.toml");

/// Runs `command` with `sh -c`; its stdout, once it has succeeded.
fn sh(command: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(command).output().unwrap();
    assert!(
        out.status.success(),
        "{command}\nfailed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The JSON body after an `-i` head.
fn body_of(answer: &str) -> serde_json::Value {
    let (_, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    serde_json::from_str(body).unwrap()
}

/// The demo on the shipped config, on ports the harness chose, once it has printed its
/// commands.
fn demo() -> Gateway {
    let mut cfg = FileConfig::parse(&std::fs::read_to_string(SHIPPED).unwrap()).unwrap();
    cfg.listen.proxy = ANY_PORT.into();
    cfg.listen.admin = Some(ANY_PORT.into());
    // The demo's gateway forwards to the address configured: its mock backend's needs a port.
    cfg.upstream.addresses = vec![loopback(free_port()).to_string()];
    let gw = Gateway::builder(cfg).demo().start();
    gw.wait_until("the demo's commands", || gw.stdout().contains(" v1-usage "));
    gw
}

#[test]
fn the_readme_tour_works_as_printed_against_the_demo() {
    let gw = demo();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let tour = &readme[readme.find("## A five-minute tour").unwrap()..];
    let tour = &tour[..tour.find("\n## ").unwrap()];
    // The shipped config's ports, as the README prints them, and where the demo listens here.
    let here = |command: &str| {
        command
            .replace("127.0.0.1:8080", &gw.proxy.to_string())
            .replace("127.0.0.1:9090", &gw.admin.to_string())
            .replace("cargo run -- ", &format!("{BIN} "))
    };
    let outputs: Vec<(String, String)> = commands(tour)
        .iter()
        .map(|c| (c.clone(), sh(&here(c))))
        .collect();
    assert_eq!(outputs.len(), 8, "{outputs:#?}");
    let shown = format!("{outputs:#?}");
    let answer = |i: usize| outputs[i].1.as_str();
    assert!(answer(0).starts_with("HTTP/1.1 200 "), "{shown}");
    assert!(
        answer(0).to_ascii_lowercase().contains("\r\ndeprecation: "),
        "{shown}"
    );
    assert_eq!(body_of(answer(0))["transaction_id"], "tx-1", "{shown}");
    let v2: serde_json::Value = serde_json::from_str(answer(1)).unwrap();
    assert!(v2["transaction_id"].is_string(), "{shown}");
    let status: serde_json::Value = serde_json::from_str(answer(2)).unwrap();
    assert_eq!(status["transaction_id"], "tx-1", "{shown}");
    assert!(answer(3).starts_with("HTTP/1.1 401 "), "{shown}");
    let h2: serde_json::Value = serde_json::from_str(answer(4)).unwrap();
    assert!(h2["transaction_id"].is_string(), "{shown}");
    assert!(answer(5).contains("\"ready\""), "{shown}");
    assert!(
        answer(6).contains("agent_gateway_requests_total{"),
        "{shown}"
    );
    assert!(answer(7).contains("demo-agent"), "{shown}");
}

#[test]
fn the_demo_prints_once_it_listens_commands_that_work_as_printed() {
    let gw = demo();
    let text = gw.stdout();
    let commands: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        commands.len(),
        4,
        "a v1 call, a v2 call, metrics, v1-usage:\n{text}"
    );
    let proxy = format!("http://{}/api/", gw.proxy);
    assert!(
        commands[0].contains(&format!("{proxy}v1/verify/request ")),
        "{text}"
    );
    assert!(
        commands[1].contains(&format!("{proxy}v2/connection/")),
        "{text}"
    );

    let v1 = sh(commands[0]);
    assert!(v1.starts_with("HTTP/1.1 200 "), "{v1}");
    assert!(
        v1.to_ascii_lowercase().contains("\r\ndeprecation: "),
        "{v1}"
    );
    assert!(body_of(&v1)["transaction_id"].is_string(), "{v1}");
    let v2: serde_json::Value = serde_json::from_str(&sh(commands[1])).unwrap();
    assert!(v2["transaction_id"].is_string(), "{v2}");

    // The gateway counts a request just after answering it.
    let counted = |version: &str, operation: &str, metrics: &str| {
        let series = format!(
            "agent_gateway_requests_total{{api_version=\"{version}\",code=\"200\",operation=\"{operation}\"}}"
        );
        metric_value(metrics, &series) == Some(1.0)
    };
    gw.wait_until("both calls in the printed metrics", || {
        let metrics = sh(commands[2]);
        counted("v1", "verify_request", &metrics)
            && counted("v2", "connection_invitation", &metrics)
    });
    let usage = sh(commands[3]);
    assert!(usage.contains("demo-agent"), "{usage}");
}

/// The demo's agents are on the published tokens on purpose: `run` refuses them, at start
/// and at each reload; the demo starts on them and applies a reload that keeps them (the
/// README's tour reloads), and its tokens are let through.
#[test]
fn the_demo_runs_its_published_tokens_at_start_and_after_a_reload() {
    let gw = demo();
    // Twice: a refusal of the first would leave the generation at 1.
    for n in 1..=2 {
        let answer = request(gw.admin, "POST", "/-/reload", &[], b"");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["result"], "success", "{}", answer.text());
        assert_eq!(answer.json()["generation"], n + 1);
    }
    let demo_agent = [
        ("X-Service-Agent-Id", "demo-agent"),
        ("X-Auth-Token", "demo-token"),
    ];
    let status = request(
        gw.proxy,
        "GET",
        "/api/v1/transaction/tx-1/status",
        &demo_agent,
        b"",
    );
    // Let through to the mock backend, which knows no such transaction.
    assert_eq!(status.status, 404, "{}", status.text());
    assert_eq!(status.json()["message"], "unknown transaction");
    assert!(!gw.log().contains("accepts the token"), "{}", gw.log());
}
