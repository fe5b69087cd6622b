//! A client nobody on this team wrote: schemathesis, driven by the gateway's own
//! `/openapi.json`, against a running gateway in front of the mock v2 backend, with valid
//! credentials. Every check it makes must pass.
//!
//! The run is bounded (examples per operation, a fixed seed, a wall-clock cap) to stay well
//! inside CI's budget. For a longer hunt, run the same command by hand with more examples:
//!
//! ```sh
//! target/py-venv/bin/python -m schemathesis.cli run http://127.0.0.1:9090/openapi.json \
//!     --url http://127.0.0.1:8080 -H 'X-Auth-Token: demo-token' \
//!     -H 'X-Service-Agent-Id: demo-agent' --checks all --max-examples 1000
//! ```
//! (with `agent-gateway demo` running).

mod common;

use std::process::Command;

use common::python::venv_bin;
use common::*;

/// Examples per operation and phase; CI's bound. Raise with `SCHEMATHESIS_MAX_EXAMPLES`.
const MAX_EXAMPLES: &str = "30";

#[test]
fn schemathesis_finds_nothing_wrong() {
    let bin = venv_bin();
    let mock = MockBackend::start();
    let gw = Gateway::start(&[mock.addr]);
    gw.wait_until("readiness", || admin_get(gw.admin, "/readyz").status == 200);

    let examples =
        std::env::var("SCHEMATHESIS_MAX_EXAMPLES").unwrap_or_else(|_| MAX_EXAMPLES.into());
    // coreutils' timeout caps the run, whatever happens to it.
    let mut run = Command::new("timeout");
    run.arg("600")
        .arg(bin.join("python"))
        .args(["-m", "schemathesis.cli", "run"])
        .arg(format!("http://{}/openapi.json", gw.admin))
        .args(["--url", &format!("http://{}", gw.proxy)])
        .args([
            "-H",
            "X-Auth-Token: secret",
            "-H",
            "X-Service-Agent-Id: agent-1",
        ])
        .args([
            "--checks",
            "all",
            "--max-examples",
            &examples,
            "--seed",
            "20261121",
        ])
        .args(["--request-timeout", "10", "--no-color"])
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(env!("CARGO_TARGET_TMPDIR"));
    let out = run.output().unwrap();
    drop(mock);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems ({}):\n{text}\n{}\ngateway log tail:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        gw.log()
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // It really exercised every operation.
    assert!(text.contains("Tested: 10"), "{text}");
}
