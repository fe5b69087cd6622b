//! Live configuration against real processes and real files: every reload trigger, refusal
//! of a bad file, revocation, consistency under load, and draining on SIGTERM.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::FileConfig;
use common::*;

/// `cfg` with v1 default service `code`: the change most tests here reload, seen in the path
/// the backend receives.
fn with_code(mut cfg: FileConfig, code: &str) -> FileConfig {
    cfg.v1.default_service = code.into();
    cfg
}

/// The harness config in front of `backend`, with v1 default service `code`.
fn config_with_code(backend: SocketAddr, code: &str) -> FileConfig {
    with_code(test_config(&[backend]), code)
}

/// Writes `cfg` over the file `gw` runs on, in place.
fn rewrite(gw: &Gateway, cfg: &FileConfig) {
    std::fs::write(&gw.config_path, cfg.to_toml()).unwrap();
}

/// Sends v1 verify requests until the backend sees `code` in the path; panics after 1 s.
fn seen_within_a_second(gw: &Gateway, backend: &Backend, code: &str) {
    let want = format!("/api/v2/verify/{code}/request");
    let start = Instant::now();
    loop {
        assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
        let seen = backend.all().last().map(|r| r.target.clone());
        assert!(
            seen.is_some(),
            "answered 200 but the backend saw nothing; log:\n{}",
            gw.log()
        );
        if seen.as_deref() == Some(want.as_str()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{code} not applied within 1 s; log:\n{}",
            gw.log()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn atomic_write(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn an_in_place_write_applies() {
    let backend = Backend::start();
    let gw = Gateway::builder(config_with_code(backend.addr, "FIRST")).start();
    seen_within_a_second(&gw, &backend, "FIRST");
    rewrite(&gw, &with_code(gw.config.clone(), "SECOND"));
    seen_within_a_second(&gw, &backend, "SECOND");
    assert_eq!(gw.metric("agent_gateway_config_generation"), 2.0);
}

#[test]
fn an_atomic_rename_over_the_file_applies() {
    let backend = Backend::start();
    let gw = Gateway::builder(config_with_code(backend.addr, "FIRST")).start();
    let renamed = with_code(gw.config.clone(), "RENAMED");
    atomic_write(&gw.config_path, &renamed.to_toml());
    seen_within_a_second(&gw, &backend, "RENAMED");
    // And again: the watch survives the inode being replaced.
    let renamed_again = with_code(gw.config.clone(), "RENAMED_AGAIN");
    atomic_write(&gw.config_path, &renamed_again.to_toml());
    seen_within_a_second(&gw, &backend, "RENAMED_AGAIN");
}

#[test]
fn a_kubernetes_configmap_symlink_swap_applies() {
    use std::os::unix::fs::symlink;
    let backend = Backend::start();
    let cfg = config_with_code(backend.addr, "CM_ONE");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The layout the kubelet makes: gateway.toml -> ..data/gateway.toml, ..data -> ..v1
    std::fs::create_dir(d.join("..v1")).unwrap();
    std::fs::write(d.join("..v1/gateway.toml"), cfg.to_toml()).unwrap();
    symlink("..v1", d.join("..data")).unwrap();
    symlink("..data/gateway.toml", d.join("gateway.toml")).unwrap();

    let cm = Gateway::builder(cfg.clone())
        .config_path(d.join("gateway.toml"))
        .start();
    seen_within_a_second(&cm, &backend, "CM_ONE");

    // The swap: a new timestamped dir, a new ..data link renamed over the old one.
    std::fs::create_dir(d.join("..v2")).unwrap();
    std::fs::write(
        d.join("..v2/gateway.toml"),
        with_code(cfg, "CM_TWO").to_toml(),
    )
    .unwrap();
    symlink("..v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..v1")).unwrap();
    seen_within_a_second(&cm, &backend, "CM_TWO");
}

#[test]
fn sighup_reloads() {
    let backend = Backend::start();
    let mut cfg = config_with_code(backend.addr, "BEFORE_HUP");
    cfg.server.watch_config = false;
    let gw = Gateway::builder(cfg).start();
    rewrite(&gw, &with_code(gw.config.clone(), "AFTER_HUP"));
    // Without the watcher nothing changes until the signal.
    thread::sleep(Duration::from_millis(400));
    post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(backend.last().target, "/api/v2/verify/BEFORE_HUP/request");
    signal(gw.child.id(), "HUP");
    seen_within_a_second(&gw, &backend, "AFTER_HUP");
    assert_eq!(
        gw.metric("agent_gateway_config_reloads_total{result=\"success\"}"),
        1.0
    );
}

#[test]
fn post_reload_on_the_admin_listener_reloads_and_reports() {
    let backend = Backend::start();
    let mut cfg = config_with_code(backend.addr, "BEFORE_POST");
    cfg.server.watch_config = false;
    let gw = Gateway::builder(cfg).start();
    rewrite(&gw, &with_code(gw.config.clone(), "AFTER_POST"));
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["result"], "success");
    assert_eq!(resp.json()["generation"], 2);
    seen_within_a_second(&gw, &backend, "AFTER_POST");

    // A changed listener is reported as needing a restart and keeps its value.
    let mut moved = with_code(gw.config.clone(), "MOVED");
    moved.listen.proxy = loopback(free_port()).to_string();
    rewrite(&gw, &moved);
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(
        resp.json()["restart_required"],
        serde_json::json!(["listen.proxy"])
    );
    seen_within_a_second(&gw, &backend, "MOVED");

    // A bad file: 422 with every problem by key path.
    let mut bad = with_code(gw.config.clone(), "bad code!");
    let agent = bad.agent_mut(AGENT_ID);
    agent.token_sha256 = format!("zz{}", agent.token_sha256);
    rewrite(&gw, &bad);
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(resp.status, 422);
    let keys: Vec<String> = resp.json()["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        keys,
        vec!["v1.default_service", "auth.agents[0].token_sha256"]
    );
}

#[test]
fn an_invalid_file_keeps_the_old_config_and_a_later_valid_one_applies() {
    let backend = Backend::start();
    let gw = Gateway::builder(config_with_code(backend.addr, "GOOD_ONE")).start();
    // Not TOML at all, so written as text.
    std::fs::write(&gw.config_path, "this is [not toml").unwrap();
    wait_until(2, "the failure to be counted", || {
        gw.metric("agent_gateway_config_reloads_total{result=\"failure\"}") == 1.0
    });
    post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(backend.last().target, "/api/v2/verify/GOOD_ONE/request");
    assert_eq!(gw.metric("agent_gateway_config_generation"), 1.0);
    assert!(gw.log().contains("config reload refused"));

    rewrite(&gw, &with_code(gw.config.clone(), "GOOD_TWO"));
    seen_within_a_second(&gw, &backend, "GOOD_TWO");
    assert_eq!(gw.metric("agent_gateway_config_generation"), 2.0);
    assert!(gw.metric("agent_gateway_config_last_reload_success_timestamp_seconds") > 1.7e9);
}

#[test]
fn a_revoked_agent_is_refused_on_its_next_request() {
    let backend = Backend::start();
    let mut cfg = config_with_code(backend.addr, "C");
    cfg.auth.agents.push(AgentFile::new("agent-2", TOKEN));
    let gw = Gateway::builder(cfg).start();
    let as_agent2 = || {
        request(
            gw.proxy,
            "POST",
            "/api/v1/verify/request",
            &[
                ("X-Service-Agent-Id", "agent-2"),
                ("X-Auth-Token", TOKEN),
                ("Content-Type", "application/json"),
            ],
            BODY.as_bytes(),
        )
        .status
    };
    assert_eq!(as_agent2(), 200);
    let mut revoked = gw.config.clone();
    revoked.auth.agents.retain(|a| a.id != "agent-2");
    rewrite(&gw, &revoked);
    wait_until(1, "agent-2 to be revoked", || as_agent2() == 401);
    assert_eq!(
        post(gw.proxy, "/api/v1/verify/request", BODY).status,
        200,
        "agent-1 is unaffected"
    );
}

#[test]
fn under_load_with_50_reloads_every_request_sees_one_whole_snapshot() {
    let backend = Backend::start();
    // Each generation changes two settings at once: the upstream base and the default code.
    let first = test_config(&[backend.addr]);
    let generation = |n: usize| {
        let mut cfg = with_code(first.clone(), &format!("CODE{n}"));
        cfg.upstream.base_path = format!("/gen{n}/api");
        cfg
    };
    let gw = Gateway::builder(generation(0)).start();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, sent, proxy) = (stop.clone(), sent.clone(), gw.proxy);
            thread::spawn(move || {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let resp = post(proxy, "/api/v1/verify/request", BODY);
                    sent.fetch_add(1, Ordering::Relaxed);
                    if resp.status != 200 {
                        failures.push(resp.status);
                    }
                }
                failures
            })
        })
        .collect();
    for n in 1..=50 {
        atomic_write(&gw.config_path, &generation(n).to_toml());
        thread::sleep(Duration::from_millis(60));
        if n % 10 == 0 {
            signal(gw.child.id(), "HUP");
        }
    }
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        assert_eq!(
            w.join().unwrap(),
            Vec::<u16>::new(),
            "every request must succeed"
        );
    }
    let all = backend.all();
    assert_eq!(all.len(), sent.load(Ordering::Relaxed));
    let mut generations = std::collections::BTreeSet::new();
    for r in &all {
        // /gen{n}/api/verify/CODE{m}/request with n == m, or the request mixed two snapshots.
        let parts: Vec<&str> = r.target.split('/').collect();
        let base_gen = parts[1].trim_start_matches("gen");
        let code_gen = parts[4].trim_start_matches("CODE");
        assert_eq!(base_gen, code_gen, "mixed snapshot in {}", r.target);
        generations.insert(base_gen.parse::<usize>().unwrap());
    }
    assert!(
        generations.len() > 10,
        "too few generations seen under load: {generations:?}"
    );
    assert!(generations.contains(&50));
}

#[test]
fn sigterm_lets_a_slow_response_finish_then_exits() {
    let backend =
        Backend::with(|_| Action::Delay(Duration::from_millis(1500), r#"{"slow":true}"#.into()));
    let mut cfg = config_with_code(backend.addr, "C");
    cfg.server.grace_period_seconds = 5;
    let mut gw = Gateway::builder(cfg).start();
    let proxy = gw.proxy;
    let pending = thread::spawn(move || post(proxy, "/api/v1/verify/request", BODY));
    wait_until(2, "the request to reach the backend", || {
        backend.count() == 1
    });
    let signalled = Instant::now();
    gw.terminate();
    let resp = pending.join().unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["slow"], true);
    // Once drained the process exits, well before pingora's own 300 s default.
    let mut exited = None;
    while signalled.elapsed() < Duration::from_secs(10) {
        if let Some(status) = gw.child.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert!(exited.is_some(), "gateway still running 10 s after SIGTERM");
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "exit waited for the whole grace period instead of the drain"
    );
    // New connections are refused once it is gone.
    assert!(std::net::TcpStream::connect(proxy).is_err());
}

#[test]
fn sigquit_hands_the_listeners_to_a_process_started_with_upgrade() {
    let backend = Backend::start();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("upgrade.sock");
    let mut cfg = config_with_code(backend.addr, "C");
    cfg.server.upgrade_sock = sock.display().to_string();
    let mut old = Gateway::builder(cfg).start();
    assert_eq!(post(old.proxy, "/api/v1/verify/request", BODY).status, 200);

    // The new binary waits on the upgrade socket for the old one's listeners (on the same
    // ports, so they are already accepting when it starts).
    let mut new = Gateway::builder(old.config.clone())
        .arg("--upgrade")
        .config_path(&old.config_path)
        .start();
    wait_until(10, "the upgrade socket", || sock.exists());
    signal(old.child.id(), "QUIT");

    // Requests keep succeeding while the old process hands over and exits.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut served = 0;
    while old.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "old process never exited");
        assert_eq!(post(old.proxy, "/api/v1/verify/request", BODY).status, 200);
        served += 1;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(served > 0);
    // Only the new process is left, on the same port.
    for _ in 0..5 {
        assert_eq!(post(old.proxy, "/api/v1/verify/request", BODY).status, 200);
    }
    assert!(
        new.child.try_wait().unwrap().is_none(),
        "the new process must still be serving"
    );
}
