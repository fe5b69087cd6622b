//! Live configuration against real processes and real files: every reload trigger, refusal
//! of a bad file, revocation, consistency under load, and draining on SIGTERM.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// A gateway whose v1 default service is `code`; `extra` is appended to [`config`].
fn text(gw_ports: (u16, u16), backend: SocketAddr, code: &str, extra: &str) -> String {
    config(gw_ports.0, gw_ports.1, &[backend], extra).replace("ORG_DEFAULT", code)
}

fn start(backend: SocketAddr, code: &str, extra: &str) -> (Gateway, (u16, u16)) {
    let ports = (free_port(), free_port());
    let gw = Gateway::start_with(&text(ports, backend, code, extra), ports.0, ports.1, &[]);
    (gw, ports)
}

/// Sends v1 verify requests until the backend sees `code` in the path; panics after 1 s.
fn seen_within_a_second(gw: &Gateway, backend: &Backend, code: &str) {
    let want = format!("/api/v2/verify/{code}/request");
    let start = Instant::now();
    loop {
        assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 200);
        if backend.last().target == want {
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
    let (gw, ports) = start(backend.addr, "FIRST", "");
    seen_within_a_second(&gw, &backend, "FIRST");
    std::fs::write(&gw.config_path, text(ports, backend.addr, "SECOND", "")).unwrap();
    seen_within_a_second(&gw, &backend, "SECOND");
    assert_eq!(gw.metric("agent_gateway_config_generation"), 2.0);
}

#[test]
fn an_atomic_rename_over_the_file_applies() {
    let backend = Backend::start();
    let (gw, ports) = start(backend.addr, "FIRST", "");
    atomic_write(&gw.config_path, &text(ports, backend.addr, "RENAMED", ""));
    seen_within_a_second(&gw, &backend, "RENAMED");
    // And again: the watch survives the inode being replaced.
    atomic_write(
        &gw.config_path,
        &text(ports, backend.addr, "RENAMED_AGAIN", ""),
    );
    seen_within_a_second(&gw, &backend, "RENAMED_AGAIN");
}

#[test]
fn a_kubernetes_configmap_symlink_swap_applies() {
    use std::os::unix::fs::symlink;
    let backend = Backend::start();
    let ports = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    // The layout the kubelet makes: gateway.toml -> ..data/gateway.toml, ..data -> ..v1
    std::fs::create_dir(d.join("..v1")).unwrap();
    std::fs::write(
        d.join("..v1/gateway.toml"),
        text(ports, backend.addr, "CM_ONE", ""),
    )
    .unwrap();
    symlink("..v1", d.join("..data")).unwrap();
    symlink("..data/gateway.toml", d.join("gateway.toml")).unwrap();

    let config_path = d.join("gateway.toml");
    let cm = Gateway::run_file(dir, config_path, ports.0, ports.1, &[]);
    seen_within_a_second(&cm, &backend, "CM_ONE");

    // The swap: a new timestamped dir, a new ..data link renamed over the old one.
    std::fs::create_dir(d.join("..v2")).unwrap();
    std::fs::write(
        d.join("..v2/gateway.toml"),
        text(ports, backend.addr, "CM_TWO", ""),
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
    let extra = "[server]\nwatch_config = false";
    let no_watch = |code: &str, ports| {
        text(ports, backend.addr, code, "").replace("[server]", &format!("{extra}\n"))
    };
    let ports = (free_port(), free_port());
    let gw = Gateway::start_with(&no_watch("BEFORE_HUP", ports), ports.0, ports.1, &[]);
    std::fs::write(&gw.config_path, no_watch("AFTER_HUP", ports)).unwrap();
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
    let ports = (free_port(), free_port());
    let no_watch = |code: &str| {
        text(ports, backend.addr, code, "").replace("[server]", "[server]\nwatch_config = false")
    };
    let gw = Gateway::start_with(&no_watch("BEFORE_POST"), ports.0, ports.1, &[]);
    std::fs::write(&gw.config_path, no_watch("AFTER_POST")).unwrap();
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["result"], "success");
    assert_eq!(resp.json()["generation"], 2);
    seen_within_a_second(&gw, &backend, "AFTER_POST");

    // A changed listener is reported as needing a restart and keeps its value.
    let moved = no_watch("MOVED").replace(
        &format!("127.0.0.1:{}", ports.0),
        &format!("127.0.0.1:{}", free_port()),
    );
    std::fs::write(&gw.config_path, moved).unwrap();
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(
        resp.json()["restart_required"],
        serde_json::json!(["listen.proxy"])
    );
    seen_within_a_second(&gw, &backend, "MOVED");

    // A bad file: 422 with every problem by key path.
    let bad = no_watch("bad code!").replace("token_sha256 = \"", "token_sha256 = \"zz");
    std::fs::write(&gw.config_path, bad).unwrap();
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
    let (gw, ports) = start(backend.addr, "GOOD_ONE", "");
    std::fs::write(&gw.config_path, "this is [not toml").unwrap();
    wait_until(2, "the failure to be counted", || {
        gw.metric("agent_gateway_config_reloads_total{result=\"failure\"}") == 1.0
    });
    post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(backend.last().target, "/api/v2/verify/GOOD_ONE/request");
    assert_eq!(gw.metric("agent_gateway_config_generation"), 1.0);
    assert!(gw.log().contains("config reload refused"));

    std::fs::write(&gw.config_path, text(ports, backend.addr, "GOOD_TWO", "")).unwrap();
    seen_within_a_second(&gw, &backend, "GOOD_TWO");
    assert_eq!(gw.metric("agent_gateway_config_generation"), 2.0);
    assert!(gw.metric("agent_gateway_config_last_reload_success_timestamp_seconds") > 1.7e9);
}

#[test]
fn a_revoked_agent_is_refused_on_its_next_request() {
    let backend = Backend::start();
    let extra = format!("[[auth.agents]]\nid = \"agent-2\"\ntoken_sha256 = \"{SECRET_SHA256}\"\n");
    let (gw, ports) = start(backend.addr, "C", &extra);
    let as_agent2 = || {
        request(
            gw.proxy,
            "POST",
            "/api/v1/verify/request",
            &[
                ("X-Service-Agent-Id", "agent-2"),
                ("X-Auth-Token", "secret"),
                ("Content-Type", "application/json"),
            ],
            BODY.as_bytes(),
        )
        .status
    };
    assert_eq!(as_agent2(), 200);
    std::fs::write(&gw.config_path, text(ports, backend.addr, "C", "")).unwrap();
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
    let gen_text = |ports, n: usize| {
        text(ports, backend.addr, &format!("CODE{n}"), "").replace(
            "[upstream]",
            &format!("[upstream]\nbase_path = \"/gen{n}/api\""),
        )
    };
    let ports = (free_port(), free_port());
    let gw = Gateway::start_with(&gen_text(ports, 0), ports.0, ports.1, &[]);
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
        atomic_write(&gw.config_path, &gen_text(ports, n));
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
    let ports = (free_port(), free_port());
    let with_grace = text(ports, backend.addr, "C", "")
        .replace("grace_period_seconds = 1", "grace_period_seconds = 5");
    let mut gw = Gateway::start_with(&with_grace, ports.0, ports.1, &[]);
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
    let ports = (free_port(), free_port());
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("upgrade.sock");
    let cfg = text(ports, backend.addr, "C", "").replace(
        "[server]",
        &format!("[server]\nupgrade_sock = \"{}\"", sock.display()),
    );
    let mut old = Gateway::start_with(&cfg, ports.0, ports.1, &[]);
    assert_eq!(post(old.proxy, "/api/v1/verify/request", BODY).status, 200);

    // The new binary waits on the upgrade socket for the old one's listeners.
    let log = std::fs::File::create(sock_dir.path().join("new.log")).unwrap();
    let mut new = std::process::Command::new(BIN)
        .args(["run", "--upgrade", "--config"])
        .arg(&old.config_path)
        .stderr(log)
        .spawn()
        .unwrap();
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
        new.try_wait().unwrap().is_none(),
        "the new process must still be serving"
    );
    let _ = new.kill();
    let _ = new.wait();
}
