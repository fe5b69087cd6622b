//! `agent-gateway demo` on the shipped config (its ports moved to ones the harness chooses):
//! once it listens it prints the commands to try, and each works as printed, run by `sh`.

mod common;

use std::process::Command;

use agent_gateway::config::FileConfig;
use common::{free_port, loopback, metric_value, Gateway, ANY_PORT};

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

#[test]
fn the_demo_prints_once_it_listens_commands_that_work_as_printed() {
    let mut cfg: FileConfig = toml::from_str(&std::fs::read_to_string(SHIPPED).unwrap()).unwrap();
    cfg.listen.proxy = ANY_PORT.into();
    cfg.listen.admin = Some(ANY_PORT.into());
    // The demo's gateway forwards to the address configured: its mock backend's needs a port.
    cfg.upstream.addresses = vec![loopback(free_port()).to_string()];
    let gw = Gateway::builder(cfg).demo().start();
    gw.wait_until("the demo's commands", || gw.stdout().contains(" v1-usage "));
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
