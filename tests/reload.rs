//! Live configuration against real processes and real files: every reload trigger, refusal
//! of a bad file, revocation, consistency under load, and draining on SIGTERM.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use agent_gateway::config::file::{AgentFile, AgentsFile};
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

/// Sends v1 verify requests until the backend sees `code` in the path (the config that has
/// it is applied), each answered 200 and forwarded.
fn wait_for_code(gw: &Gateway, backend: &Backend, code: &str) {
    let want = format!("/api/v2/verify/{code}/request");
    gw.wait_until(&format!("{code} to be applied"), || {
        assert_eq!(post(gw.proxy, VERIFY_V1, BODY).status, 200);
        let seen = backend.all().last().map(|r| r.target.clone());
        assert!(
            seen.is_some(),
            "answered 200 but the backend saw nothing; log:\n{}",
            gw.log()
        );
        seen.as_deref() == Some(want.as_str())
    });
}

#[test]
fn an_in_place_write_applies() {
    let backend = Backend::start();
    let gw = Gateway::builder(config_with_code(backend.addr, "FIRST")).start();
    wait_for_code(&gw, &backend, "FIRST");
    gw.write_config(&with_code(gw.config.clone(), "SECOND"));
    wait_for_code(&gw, &backend, "SECOND");
    // Counted just after the new config serves.
    gw.wait_for_metric("agent_gateway_config_generation", 2.0);
}

#[test]
fn an_atomic_rename_over_the_file_applies() {
    let backend = Backend::start();
    let gw = Gateway::builder(config_with_code(backend.addr, "FIRST")).start();
    gw.replace_config(&with_code(gw.config.clone(), "RENAMED"));
    wait_for_code(&gw, &backend, "RENAMED");
    // And again: the watch survives the inode being replaced.
    gw.replace_config(&with_code(gw.config.clone(), "RENAMED_AGAIN"));
    wait_for_code(&gw, &backend, "RENAMED_AGAIN");
}

#[test]
fn a_kubernetes_configmap_symlink_swap_applies() {
    use std::os::unix::fs::symlink;
    let backend = Backend::start();
    let cfg = config_with_code(backend.addr, "CM_ONE");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The layout the kubelet makes: gateway.toml -> ..data/gateway.toml, ..data -> ..v1. The
    // harness writes the config through the link.
    std::fs::create_dir(d.join("..v1")).unwrap();
    symlink("..v1", d.join("..data")).unwrap();
    symlink("..data/gateway.toml", d.join("gateway.toml")).unwrap();
    let cm = Gateway::builder(cfg)
        .config_path(d.join("gateway.toml"))
        .start();
    assert!(d.join("..v1/gateway.toml").is_file());
    wait_for_code(&cm, &backend, "CM_ONE");

    // The swap: a new timestamped dir, a new ..data link renamed over the old one.
    std::fs::create_dir(d.join("..v2")).unwrap();
    std::fs::write(
        d.join("..v2/gateway.toml"),
        with_code(cm.config.clone(), "CM_TWO").to_toml(),
    )
    .unwrap();
    symlink("..v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..v1")).unwrap();
    wait_for_code(&cm, &backend, "CM_TWO");
}

#[test]
fn writes_to_other_files_beside_the_config_are_not_reloads() {
    let backend = Backend::start();
    let gw = Gateway::builder(config_with_code(backend.addr, "KEPT")).start();
    wait_for_code(&gw, &backend, "KEPT");
    // The watcher looks at the file once when its watch begins (that look would read the
    // broken text below) and logs this line after it: from here only an event is a read.
    gw.wait_until("the watcher to begin", || {
        gw.log().contains("watching the config directory")
    });
    let failures = "agent_gateway_config_reloads_total{result=\"failure\"}";
    // The config's text is broken through a second name in another directory: inotify tells
    // the directory a path went through, so the watched one hears nothing, and only a reload
    // would read the file (and refuse it).
    let elsewhere = tempfile::tempdir().unwrap();
    let alias = elsewhere.path().join("alias.toml");
    std::fs::hard_link(&gw.config_path, &alias).unwrap();
    std::fs::write(&alias, "this is [not toml").unwrap();
    // A file beside the config is written to, as a log written there is.
    let log = gw.config_path.with_file_name("beside-the-config.log");
    for i in 0..20 {
        std::fs::write(&log, format!("line {i}\n")).unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    // Well past the watcher's debounce: the config was not read again.
    thread::sleep(Duration::from_millis(800));
    assert_eq!(gw.metric(failures), 0.0, "log:\n{}", gw.log());
    post(gw.proxy, VERIFY_V1, BODY);
    assert_eq!(backend.last().target, "/api/v2/verify/KEPT/request");
    // The config's own name changing is a reload (refused: the text is not TOML).
    replace_file(&gw.config_path, "this is [not toml either");
    gw.wait_for_metric(failures, 1.0);
}

/// The config is made to name an agents file at `agents` by a reload that no file event
/// announced (its text changed through a second name in another directory, then `POST
/// /-/reload`): the watcher still watches the new file from then on, and a later change to
/// it applies with no other event.
fn an_agents_file_named_by_an_admin_reload_is_watched(agents: &dyn Fn(&Gateway) -> PathBuf) {
    let backend = Backend::start();
    let gw = Gateway::builder(config_with_code(backend.addr, "KEPT")).start();
    gw.wait_until("the watcher to begin", || {
        gw.log().contains("watching the config directory")
    });
    let agents = agents(&gw);
    let write_agents = |id: &str| {
        let file = AgentsFile {
            agents: vec![AgentFile::new(id, TOKEN)],
        };
        std::fs::write(&agents, toml::to_string(&file).unwrap()).unwrap();
    };
    write_agents("filed-1");
    let mut cfg = gw.config.clone();
    cfg.auth.agents.clear();
    cfg.auth.agents_file = Some(agents.display().to_string());
    let elsewhere = tempfile::tempdir().unwrap();
    let alias = elsewhere.path().join("alias.toml");
    std::fs::hard_link(&gw.config_path, &alias).unwrap();
    std::fs::write(&alias, cfg.to_toml()).unwrap();
    let reloaded = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    let status = |id: &str| as_agent(gw.proxy, id, "POST", VERIFY_V1, &[]).status;
    assert_eq!(status("filed-1"), 200);
    write_agents("filed-2");
    gw.wait_until("the agents file's change to apply", || {
        status("filed-2") == 200
    });
    assert_eq!(status("filed-1"), 401);
}

#[test]
fn an_agents_file_in_a_new_directory_named_by_an_admin_reload_is_watched() {
    let dir = tempfile::tempdir().unwrap();
    an_agents_file_named_by_an_admin_reload_is_watched(&|_| dir.path().join("agents.toml"));
}

#[test]
fn an_agents_file_beside_the_config_named_by_an_admin_reload_is_watched() {
    an_agents_file_named_by_an_admin_reload_is_watched(&|gw| {
        gw.config_path.with_file_name("agents.toml")
    });
}

/// The agents file's directory is removed and made again (a tool that renders a fresh
/// directory, a symlinked release), which takes its watch with it: the watcher watches it
/// again once it is back, reads what it holds then, and hears its later changes, with no
/// other trigger. A revocation written there after is applied.
#[test]
fn a_directory_removed_and_made_again_is_watched_again() {
    let backend = Backend::start();
    let secrets = tempfile::tempdir().unwrap();
    let dir = secrets.path().join("agents");
    let agents = dir.join("agents.toml");
    let write_agents = |id: &str| {
        let file = AgentsFile {
            agents: vec![AgentFile::new(id, TOKEN)],
        };
        std::fs::write(&agents, toml::to_string(&file).unwrap()).unwrap();
    };
    std::fs::create_dir(&dir).unwrap();
    write_agents("filed-1");
    let mut cfg = config_with_code(backend.addr, "KEPT");
    cfg.auth.agents.clear();
    cfg.auth.agents_file = Some(agents.display().to_string());
    let gw = Gateway::builder(cfg).start();
    let status = |id: &str| as_agent(gw.proxy, id, "POST", VERIFY_V1, &[]).status;
    gw.wait_until("the watcher to watch both directories", || {
        gw.log().matches("watching the config directory").count() == 2
    });
    assert_eq!(status("filed-1"), 200);

    std::fs::remove_dir_all(&dir).unwrap();
    // Made again at once or later, the directory is watched again: here, after its removal
    // was heard.
    thread::sleep(Duration::from_millis(300));
    std::fs::create_dir(&dir).unwrap();
    write_agents("filed-2");
    gw.wait_until("the new directory's file to apply", || {
        status("filed-2") == 200
    });
    // Watched from then on: a later change applies with no other trigger.
    thread::sleep(Duration::from_millis(300));
    write_agents("filed-3");
    gw.wait_until("a later change to apply", || status("filed-3") == 200);
    assert_eq!(status("filed-2"), 401);
}

#[test]
fn sighup_reloads() {
    let backend = Backend::start();
    let mut cfg = config_with_code(backend.addr, "BEFORE_HUP");
    cfg.server.watch_config = false;
    let gw = Gateway::builder(cfg).process().start();
    gw.write_config(&with_code(gw.config.clone(), "AFTER_HUP"));
    // Without the watcher nothing changes until the signal: a window in which nothing may.
    thread::sleep(Duration::from_millis(400));
    post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(backend.last().target, "/api/v2/verify/BEFORE_HUP/request");
    gw.signal("HUP");
    wait_for_code(&gw, &backend, "AFTER_HUP");
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"success\"}",
        1.0,
    );
}

#[test]
fn post_reload_on_the_admin_listener_reloads_and_reports() {
    let backend = Backend::start();
    let mut cfg = config_with_code(backend.addr, "BEFORE_POST");
    cfg.server.watch_config = false;
    let gw = Gateway::builder(cfg).start();
    gw.write_config(&with_code(gw.config.clone(), "AFTER_POST"));
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["result"], "success");
    assert_eq!(resp.json()["generation"], 2);
    wait_for_code(&gw, &backend, "AFTER_POST");

    // A changed listener is reported as needing a restart and keeps its value.
    let mut moved = with_code(gw.config.clone(), "MOVED");
    moved.listen.proxy = loopback(free_port()).to_string();
    gw.write_config(&moved);
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(
        resp.json()["restart_required"],
        serde_json::json!(["listen.proxy"])
    );
    wait_for_code(&gw, &backend, "MOVED");

    // A bad file: 422 with every problem by key path.
    let mut bad = with_code(gw.config.clone(), "bad code!");
    let agent = bad.agent_mut(AGENT_ID);
    agent.token_sha256.0[0] = format!("zz{}", agent.token_sha256.0[0]);
    gw.write_config(&bad);
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
    // Not TOML at all, so written as text, in one step.
    replace_file(&gw.config_path, "this is [not toml");
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"failure\"}",
        1.0,
    );
    post(gw.proxy, VERIFY_V1, BODY);
    assert_eq!(backend.last().target, "/api/v2/verify/GOOD_ONE/request");
    assert_eq!(gw.metric("agent_gateway_config_generation"), 1.0);
    // Counted, then logged.
    gw.wait_until("the refusal in the log", || {
        gw.log().contains("config reload refused")
    });

    gw.write_config(&with_code(gw.config.clone(), "GOOD_TWO"));
    wait_for_code(&gw, &backend, "GOOD_TWO");
    gw.wait_for_metric("agent_gateway_config_generation", 2.0);
    assert!(gw.metric("agent_gateway_config_last_reload_success_timestamp_seconds") > 1.7e9);
}

/// A reload that gives an agent a token published with agent-gateway (the README's and the
/// demo's) is refused as `run` refuses it at start, naming the agent: the config before it
/// keeps serving, and the published token gets 401. It used to be applied, with a warning.
#[test]
fn a_reload_to_a_published_token_is_refused_as_a_start_is() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    let gw = Gateway::builder(cfg.clone()).start();

    cfg.auth
        .agents
        .push(AgentFile::new("copied-agent", "demo-token"));
    gw.write_config(&cfg);
    let resp = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(resp.status, 422, "{}", resp.text());
    let problems = &resp.json()["problems"];
    assert_eq!(problems[0]["key"], "auth.agents", "{problems}");
    let message = problems[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with(r#"agent "copied-agent" accepts the token "demo-token""#),
        "{message}"
    );
    assert_eq!(gw.metric("agent_gateway_config_generation"), 1.0);
    let copied = [
        ("X-Service-Agent-Id", "copied-agent"),
        ("X-Auth-Token", "demo-token"),
        ("Content-Type", "application/json"),
    ];
    let resp = request(gw.proxy, "POST", VERIFY_V1, &copied, BODY.as_bytes());
    assert_eq!(resp.status, 401, "{}", resp.text());
    assert_eq!(backend.count(), 0);
}

#[test]
fn a_revoked_agent_is_refused_on_its_next_request() {
    let backend = Backend::start();
    let mut cfg = config_with_code(backend.addr, "C");
    cfg.auth.agents.push(AgentFile::new("agent-2", TOKEN));
    let gw = Gateway::builder(cfg).start();
    let as_agent2 = || as_agent(gw.proxy, "agent-2", "POST", VERIFY_V1, &[]).status;
    assert_eq!(as_agent2(), 200);
    let mut revoked = gw.config.clone();
    revoked.auth.agents.retain(|a| a.id != "agent-2");
    gw.write_config(&revoked);
    gw.wait_until("agent-2 to be revoked", || as_agent2() == 401);
    assert_eq!(
        post(gw.proxy, "/api/v1/verify/request", BODY).status,
        200,
        "agent-1 is unaffected"
    );
}

/// Every request is judged under one snapshot (its v1 default code and the `Link` of its
/// answer are that snapshot's) and sent under the base of the backend when it is sent: its
/// snapshot's, or a later one's when a reload came between its start and its send, never an
/// earlier one's.
#[test]
fn under_load_with_50_reloads_each_request_keeps_its_snapshot_and_reaches_no_older_base() {
    let backend = Backend::start();
    // Each generation changes three settings at once: the upstream base, the default code
    // and the retirement link.
    let mut first = test_config(&[backend.addr]);
    first.server.watch_config = false;
    first.retirement.deprecated_at = Some("2026-01-01T00:00:00Z".into());
    let generation = |n: usize| {
        let mut cfg = with_code(first.clone(), &format!("CODE{n}"));
        cfg.upstream.base_path = format!("/gen{n}/api");
        cfg.retirement.link = Some(format!("https://example.org/gen{n}"));
        cfg
    };
    let gw = Gateway::builder(generation(0)).process().start();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, sent, proxy) = (stop.clone(), sent.clone(), gw.proxy);
            thread::spawn(move || {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let resp = post(proxy, VERIFY_V1, BODY);
                    sent.fetch_add(1, Ordering::Relaxed);
                    if resp.status != 200 {
                        failures.push(format!("status {}", resp.status));
                        continue;
                    }
                    // The code the backend saw and the link the answer carries: one snapshot.
                    let seen = resp.json()["seen"].as_str().unwrap_or_default().to_owned();
                    let code = seen.split('/').nth(4).unwrap_or_default();
                    let link = resp.header("link").unwrap_or_default();
                    let of_code = format!("example.org/gen{}>", code.trim_start_matches("CODE"));
                    if !link.contains(&of_code) {
                        failures.push(format!("{seen} answered with Link {link}"));
                    }
                }
                failures
            })
        })
        .collect();
    // Each reload (every tenth by SIGHUP, the others by POST /-/reload) once requests are
    // seen under the one before.
    for n in 1..=50 {
        let prefix = format!("/gen{}/", n - 1);
        gw.wait_until(&format!("a request under generation {}", n - 1), || {
            backend.all().iter().any(|r| r.target.starts_with(&prefix))
        });
        if n % 10 == 0 {
            gw.write_config(&generation(n));
            gw.signal("HUP");
        } else {
            gw.reload(&generation(n));
        }
    }
    gw.wait_until("a request under generation 50", || {
        backend
            .all()
            .iter()
            .any(|r| r.target.starts_with("/gen50/"))
    });
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        assert_eq!(
            w.join().unwrap(),
            Vec::<String>::new(),
            "every request must succeed, with its snapshot's code and link"
        );
    }
    let all = backend.all();
    assert_eq!(all.len(), sent.load(Ordering::Relaxed));
    let mut generations = BTreeSet::new();
    for r in &all {
        // /gen{n}/api/verify/CODE{m}/request: m is the request's snapshot, n the backend's
        // when it was sent, the same or later (a backend is followed before the snapshot
        // that moved it is served).
        let parts: Vec<&str> = r.target.split('/').collect();
        let generation = |part: &str, prefix| part.trim_start_matches(prefix).parse::<usize>();
        let base_gen = generation(parts[1], "gen").unwrap();
        let code_gen = generation(parts[4], "CODE").unwrap();
        assert!(
            base_gen >= code_gen,
            "sent under an older base than its snapshot's: {}",
            r.target
        );
        generations.insert(base_gen);
    }
    assert_eq!(
        generations,
        (0..=50).collect(),
        "requests were served under every generation"
    );
}

#[test]
fn sigterm_lets_a_slow_response_finish_then_exits() {
    let gate = Gate::new();
    let held = gate.clone();
    let backend =
        Backend::with(move |_| Action::AfterGate(held.clone(), r#"{"slow":true}"#.into()));
    let mut cfg = config_with_code(backend.addr, "C");
    // A grace period no test outlasts: only the drain can end the process in time.
    cfg.server.grace_period_seconds = 10 * PATIENCE.as_secs();
    let mut gw = Gateway::builder(cfg).process().start();
    let proxy = gw.proxy;
    let pending = thread::spawn(move || post(proxy, VERIFY_V1, BODY));
    gw.wait_until("the request to reach the backend", || backend.count() == 1);
    gw.terminate();
    gw.wait_until("the drain to start", || {
        gw.log().contains("SIGTERM: draining in-flight requests")
    });
    gate.open();
    let resp = pending.join().unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["slow"], true);
    // Once drained the process exits, long before the grace period is over.
    assert!(gw.wait_exit().success());
    // New connections are refused once it is gone.
    assert!(std::net::TcpStream::connect(proxy).is_err());
}

/// The new process waits for the listeners; a SIGHUP then (a reload asked of every process
/// by name, `pkill -HUP agent-gateway`) does not end it, as the default action of SIGHUP
/// would before the gateway's own handler is in place. `/readyz` answers 200 throughout,
/// from either process: the old one answered 503 (draining) until it exited.
#[test]
fn sigquit_hands_the_listeners_to_a_process_started_with_upgrade() {
    let backend = Backend::start();
    let sock_dir = tempfile::tempdir().unwrap();
    let mut cfg = config_with_code(backend.addr, "C");
    cfg.server.upgrade_sock = sock_dir.path().join("upgrade.sock").display().to_string();
    let mut old = Gateway::builder(cfg).process().start();
    assert_eq!(post(old.proxy, VERIFY_V1, BODY).status, 200);

    // The new process takes the old one's listeners, on the same ports; the old one keeps
    // serving for a while (pingora's close timeout, 5 s), then exits.
    let mut new = old.hand_over_with(|waiting| waiting.signal("HUP"));
    let mut served = 0;
    let deadline = Instant::now() + PATIENCE;
    while old.child().try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the old process never exited");
        assert_eq!(post(old.proxy, VERIFY_V1, BODY).status, 200);
        // Whichever process answers the probe, the address stays in service: a load
        // balancer must not take it out for a handover.
        assert_eq!(admin_get(old.admin, "/readyz").status, 200);
        served += 1;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(served > 0, "no request was sent during the handover");
    // Only the new process is left, on the same port.
    for _ in 0..5 {
        assert_eq!(post(old.proxy, VERIFY_V1, BODY).status, 200);
    }
    assert!(
        new.child().try_wait().unwrap().is_none(),
        "the new process must still be serving"
    );
}

/// A connection the old process accepted before it stopped accepting is its to answer: the
/// listeners' queue is the new process's, not this connection. Its request, begun before the
/// stop and finished after it, is served (with `Connection: close`) before the old process
/// exits, as a request in flight is; on a busy machine a connection accepted just before the
/// stop has its whole request waiting unread in the same way.
#[test]
fn a_handover_serves_the_request_of_a_connection_the_old_process_accepted() {
    let backend = Backend::start();
    let sock_dir = tempfile::tempdir().unwrap();
    let mut cfg = config_with_code(backend.addr, "C");
    cfg.server.upgrade_sock = sock_dir.path().join("upgrade.sock").display().to_string();
    let mut old = Gateway::builder(cfg).process().start();
    // Only the old process listens yet: it accepts this connection.
    let mut c = Connection::open(old.proxy);
    let request = verify_post(BODY);
    let (begun, rest) = request.split_at(20);
    c.writer.write_all(begun).unwrap();

    let _new = old.hand_over();
    old.wait_until("the old process to stop accepting", || {
        old.log().contains("stopping: no new connections")
    });
    c.writer.write_all(rest).unwrap();
    let resp = read_response(&mut c.reader).expect("the old process answers the request");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(backend.count(), 1);
    assert!(old.wait_exit().success());
}

/// A SIGQUIT with no socket of the gateway's user waiting at `server.upgrade_sock` hands the
/// listeners to nobody: with nothing there (an operator who signalled before starting
/// `run --upgrade`), or a link to a socket made elsewhere (whoever could put it there), the
/// process logs why and goes on serving. Before, pingora sent to whatever listened there, or,
/// with nothing there, failed and stopped serving with no process to take over.
#[test]
fn a_sigquit_with_no_upgrade_of_its_own_waiting_keeps_serving() {
    use std::os::unix::net::UnixListener;
    let backend = Backend::start();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("upgrade.sock");
    let mut cfg = config_with_code(backend.addr, "C");
    cfg.server.upgrade_sock = sock.display().to_string();
    let mut gw = Gateway::builder(cfg).process().start();
    let refusals = |gw: &Gateway| {
        gw.log()
            .matches("SIGQUIT: the listeners are not handed over")
            .count()
    };

    gw.signal("QUIT");
    gw.wait_until("the first refusal", || refusals(&gw) == 1);
    assert!(gw
        .log()
        .contains("no process started with --upgrade waits there"));
    assert_eq!(post(gw.proxy, VERIFY_V1, BODY).status, 200);

    let elsewhere = tempfile::tempdir().unwrap();
    let other = UnixListener::bind(elsewhere.path().join("other.sock")).unwrap();
    other.set_nonblocking(true).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("other.sock"), &sock).unwrap();
    gw.signal("QUIT");
    gw.wait_until("the second refusal", || refusals(&gw) == 2);
    assert!(gw.log().contains("symbolic link"), "{}", gw.log());
    assert_eq!(post(gw.proxy, VERIFY_V1, BODY).status, 200);
    assert!(
        matches!(other.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing was sent to the other socket"
    );
    assert!(gw.child().try_wait().unwrap().is_none(), "still running");
}

#[test]
fn get_config_shows_the_running_snapshot_with_its_load_time_and_file_hash() {
    use sha2::{Digest, Sha256};
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.retirement.sunset_at = Some("2027-06-01T02:00:00+02:00".into());
    // The watcher would load the written file a second time, after or before `POST /-/reload`:
    // the generation counts the reloads this test asks for.
    cfg.server.watch_config = false;
    let gw = Gateway::builder(cfg.clone()).start();
    let sha256 = |path: &std::path::Path| hex::encode(Sha256::digest(std::fs::read(path).unwrap()));

    let answer = admin_get(gw.admin, "/config");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    let first = answer.json();
    assert_eq!(first["generation"], 1);
    assert_eq!(first["sha256"], sha256(&gw.config_path));
    assert!(
        first["loaded_at"].as_str().unwrap().ends_with('Z'),
        "{first}"
    );
    let config = &first["config"];
    assert_eq!(
        config["listen"]["proxy"], ANY_PORT,
        "as configured, not as bound"
    );
    assert_eq!(config["retirement"]["sunset_at"], "2027-06-01T00:00:00Z");
    assert_eq!(config["auth"]["agents"][0]["token_sha256"], "<redacted>");
    assert_eq!(config["upstream"]["read_timeout_ms"], 2000);

    // A live change shows at once; a change that needs a restart shows the running value.
    cfg.retirement.quiet_days = 3;
    cfg.server.grace_period_seconds = 9;
    gw.reload(&cfg);
    let second = admin_get(gw.admin, "/config").json();
    assert_eq!(second["generation"], 2);
    assert_eq!(second["sha256"], sha256(&gw.config_path));
    assert_ne!(second["sha256"], first["sha256"]);
    assert_eq!(second["config"]["retirement"]["quiet_days"], 3);
    assert_eq!(second["config"]["server"]["grace_period_seconds"], 1);

    // The agents in a file of their own: another agent there is a change of the inputs'
    // digest, not of the config text's.
    let agents = gw.config_path.with_file_name("agents.toml");
    let write_agents = |id: &str| {
        let file = AgentsFile {
            agents: vec![AgentFile::new(id, TOKEN)],
        };
        std::fs::write(&agents, toml::to_string(&file).unwrap()).unwrap();
    };
    write_agents("filed-1");
    cfg.auth.agents.clear();
    cfg.auth.agents_file = Some("agents.toml".into());
    gw.reload(&cfg);
    let third = admin_get(gw.admin, "/config").json();
    write_agents("filed-2");
    gw.reload(&cfg);
    let fourth = admin_get(gw.admin, "/config").json();
    assert_eq!(fourth["sha256"], third["sha256"]);
    assert_ne!(fourth["inputs_sha256"], third["inputs_sha256"]);
    for shown in [&third, &fourth] {
        assert_eq!(shown["inputs_sha256"].as_str().map(str::len), Some(64));
    }
}

/// A password in a URL of the config: the Redis URL and the OTLP endpoint take one; the
/// Prometheus URL is refused one (here written with an unencoded `/`, which was read as a
/// port), as is `retirement.link` (`tests/retirement.rs`). `GET /config`, `config dump`, the log (`tracing on`, the refused reload),
/// the reload's answer and `check-config` show each with its password redacted.
#[test]
fn a_password_in_a_configured_url_is_redacted_wherever_the_url_is_shown() {
    use agent_gateway::config::RateLimitBackend;
    let secrets = ["redis-pw", "otlp-pw", "prom/pw"];
    let shown = |what: &str, text: &str| {
        for secret in secrets {
            assert!(!text.contains(secret), "{secret} in {what}:\n{text}");
        }
    };
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    cfg.rate_limit.backend = RateLimitBackend::Redis;
    cfg.rate_limit.redis_url = Some("redis://app:redis-pw@127.0.0.1:9/0".into());
    cfg.tracing.otlp_endpoint = Some("http://otel:otlp-pw@127.0.0.1:9".into());
    let gw = Gateway::builder(cfg.clone()).start();

    let answer = admin_get(gw.admin, "/config");
    assert_eq!(answer.status, 200, "{}", answer.text());
    shown("GET /config", &answer.text());
    let config = &answer.json()["config"];
    assert_eq!(
        config["tracing"]["otlp_endpoint"],
        "http://otel:<redacted>@127.0.0.1:9"
    );
    assert_eq!(
        config["rate_limit"]["redis_url"],
        "redis://app:<redacted>@127.0.0.1:9/0"
    );

    let dump = cli([
        "config".as_ref(),
        "dump".as_ref(),
        "--config".as_ref(),
        gw.config_path.as_os_str(),
    ]);
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    shown("config dump", &String::from_utf8_lossy(&dump.stdout));

    // Refused: the Prometheus URL with credentials, an OTLP endpoint over https.
    let mut bad = cfg.clone();
    bad.retirement.prometheus_url = Some("http://ops:prom/pw@prometheus:9090".into());
    bad.tracing.otlp_endpoint = Some("https://otel:otlp-pw@collector:4318".into());
    gw.write_config(&bad);
    let answer = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(answer.status, 422, "{}", answer.text());
    let mut keys: Vec<String> = answer.json()["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["retirement.prometheus_url", "tracing.otlp_endpoint"],
        "{}",
        answer.text()
    );
    shown("the reload's report", &answer.text());
    let out = cli(["check-config".as_ref(), gw.config_path.as_os_str()]);
    assert!(!out.status.success());
    shown("check-config", &String::from_utf8_lossy(&out.stderr));
    gw.wait_until("the refusal in the log", || {
        gw.log().contains("config reload refused")
    });
    assert!(gw.log().contains("tracing on"), "{}", gw.log());
    shown("the log", &gw.log());
}

/// Backends A and B, and two configs: the first in front of A under the base `/a/api`, the
/// second moving the backend to B and its base to `/b/api` at once. Only the reloads the test
/// asks for: no watcher.
fn a_move_from_a_to_b() -> (Backend, Backend, FileConfig, FileConfig) {
    a_move_between(Backend::start(), Backend::start())
}

fn a_move_between(a: Backend, b: Backend) -> (Backend, Backend, FileConfig, FileConfig) {
    let mut before = test_config(&[a.addr]);
    before.server.watch_config = false;
    before.upstream.base_path = "/a/api".into();
    let mut after = before.clone();
    after.upstream.addresses = vec![b.addr.to_string()];
    after.upstream.base_path = "/b/api".into();
    (a, b, before, after)
}

/// Every request each backend received, named `A` or `B`, with its path.
fn received(a: &Backend, b: &Backend) -> Vec<(&'static str, String)> {
    let named = |name, backend: &Backend| {
        backend
            .all()
            .into_iter()
            .map(move |r| (name, r.target))
            .collect::<Vec<_>>()
    };
    [named("A", a), named("B", b)].concat()
}

/// Whether every request went under the base of the backend it reached.
fn each_under_its_backend_s_base(received: &[(&str, String)]) -> bool {
    received.iter().all(|(backend, path)| match *backend {
        "A" => path.starts_with("/a/api/"),
        _ => path.starts_with("/b/api/"),
    })
}

/// A request admitted before a reload that moves the backend and its base at once, its body
/// still arriving, goes to the addresses in rotation when it is sent, under their base: B
/// under `/b/api`, never B under A's `/a/api`.
#[test]
fn a_request_admitted_before_a_move_goes_under_the_base_of_the_backend_it_reaches() {
    let (a, b, before, after) = a_move_from_a_to_b();
    let gw = Gateway::builder(before).start();

    let mut client = Connection::open(gw.proxy);
    let (first, rest) = BODY.split_at(1);
    client.send(verify_with(
        &format!("Content-Length: {}\r\n", BODY.len()),
        first.as_bytes(),
    ));
    // Its head read and admitted under the first snapshot; its body not yet in.
    gw.wait_for_metric("agent_gateway_in_flight_requests", 1.0);
    gw.reload(&after);
    client.send(rest);
    let answer = client.response();
    assert_eq!(answer.status, 200, "{}", answer.text());

    let received = received(&a, &b);
    assert!(
        each_under_its_backend_s_base(&received),
        "a backend got another's base: {received:?}"
    );
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].0, "B", "sent after the move: {received:?}");
    let line = gw.wait_for_access_log(1).remove(0);
    assert_eq!(line["upstream_path"], "/b/api/verify/ORG_DEFAULT/request");
}

/// A request already waiting for a connection to A when the move comes keeps the addresses
/// it was sending to, and their base: A under `/a/api`.
#[test]
fn a_request_waiting_for_a_connection_through_a_move_keeps_its_backend_s_base() {
    let gate = Gate::new();
    let held = gate.clone();
    let a = Backend::with(move |_| Action::AfterGate(held.clone(), "{}".into()));
    let (a, b, mut before, mut after) = a_move_between(a, Backend::start());
    for cfg in [&mut before, &mut after] {
        cfg.upstream.max_connections_per_address = Some(1);
        cfg.upstream.max_pending = 1;
        cfg.upstream.pending_timeout_ms = 60_000;
        cfg.upstream.read_timeout_ms = 60_000;
    }
    let gw = Gateway::builder(before).start();
    let send = || {
        let proxy = gw.proxy;
        thread::spawn(move || post(proxy, VERIFY_V1, BODY))
    };

    // One request on A's one connection, its answer held; of the next two, one waits for
    // that connection and the other finds the queue full.
    let on_the_connection = send();
    gw.wait_until("a request on A's connection", || a.count() == 1);
    let others = [send(), send()];
    gw.wait_for_metric(
        "agent_gateway_upstream_overflow_total{reason=\"queue_full\"}",
        1.0,
    );
    gw.reload(&after);
    gate.open();
    assert_eq!(on_the_connection.join().unwrap().status, 200);
    let mut statuses: Vec<u16> = others.map(|o| o.join().unwrap().status).into();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 503]);

    let received = received(&a, &b);
    assert!(
        each_under_its_backend_s_base(&received),
        "a backend got another's base: {received:?}"
    );
    assert_eq!(
        received.iter().map(|r| r.0).collect::<Vec<_>>(),
        ["A", "A"],
        "the waiting request kept its addresses: {received:?}"
    );
    // New requests go to B, under its base.
    assert_eq!(post(gw.proxy, VERIFY_V1, BODY).status, 200);
    assert_eq!(b.last().target, "/b/api/verify/ORG_DEFAULT/request");
}

/// The agents file is rewritten in place (truncated, then written) by a writer that pauses
/// half-way, longer than the watcher's debounce (a tool writing as it renders, a slow disk):
/// what is there in the meantime is a file cut short, and valid. It is never applied: an
/// agent further down keeps its access, and a token whose `not_after` is still to come in
/// the file is not accepted without it. The file as its writer closed it is applied.
#[test]
fn an_agents_file_read_half_way_through_an_in_place_write_is_not_applied() {
    use agent_gateway::config::file::TokenFile;
    use agent_gateway::config::TokenDigest;
    use std::io::Write;

    let backend = Backend::start();
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents.toml");
    let mut first = AgentFile::new("filed-1", TOKEN);
    first.tokens = vec![TokenFile {
        sha256: TokenDigest::of(b"expired-token").to_hex(),
        not_after: Some("2020-01-01T00:00:00Z".into()),
    }];
    let file = |last: &str| {
        let file = AgentsFile {
            agents: vec![first.clone(), AgentFile::new(last, TOKEN)],
        };
        toml::to_string(&file).unwrap()
    };
    std::fs::write(&agents, file("filed-2")).unwrap();
    let mut cfg = config_with_code(backend.addr, "KEPT");
    cfg.auth.agents.clear();
    cfg.auth.agents_file = Some(agents.display().to_string());
    let gw = Gateway::builder(cfg).start();
    gw.wait_until("the watcher to watch both directories", || {
        gw.log().matches("watching the config directory").count() == 2
    });
    let status = |id: &str, token: &str| {
        let headers = [
            ("X-Service-Agent-Id", id),
            ("X-Auth-Token", token),
            ("Content-Type", "application/json"),
        ];
        request(gw.proxy, "POST", VERIFY_V1, &headers, BODY.as_bytes()).status
    };
    assert_eq!(status("filed-2", TOKEN), 200);
    assert_eq!(status("filed-1", "expired-token"), 401);

    // The same agents, the last one renamed, written in two steps: up to the expired token's
    // `not_after`, then the rest.
    let text = file("filed-3");
    let cut = text.find("not_after").unwrap();
    let mut writer = std::fs::File::create(&agents).unwrap();
    writer.write_all(&text.as_bytes()[..cut]).unwrap();
    thread::sleep(Duration::from_millis(800));
    let meanwhile = (status("filed-2", TOKEN), status("filed-1", "expired-token"));
    writer.write_all(&text.as_bytes()[cut..]).unwrap();
    drop(writer);
    gw.wait_until("the whole file to apply", || {
        status("filed-3", TOKEN) == 200
    });
    assert_eq!(
        meanwhile,
        (200, 401),
        "the file cut short was applied; log:\n{}",
        gw.log()
    );
    assert_eq!(status("filed-2", TOKEN), 401);
    assert_eq!(status("filed-1", "expired-token"), 401);

    // Deleted: refused (the file cannot be read), the agents in service keep serving. Then
    // made again, by a writer that pauses half-way: read at its close only.
    std::fs::remove_file(&agents).unwrap();
    let failures = "agent_gateway_config_reloads_total{result=\"failure\"}";
    gw.wait_for_metric(failures, 1.0);
    assert_eq!(status("filed-3", TOKEN), 200);
    let text = file("filed-5");
    let mut writer = std::fs::File::create(&agents).unwrap();
    writer.write_all(&text.as_bytes()[..cut]).unwrap();
    // Past the watcher's retry of a file it could not read (1 s): that is no close either.
    thread::sleep(Duration::from_millis(1500));
    let meanwhile = (status("filed-3", TOKEN), status("filed-1", "expired-token"));
    writer.write_all(&text.as_bytes()[cut..]).unwrap();
    drop(writer);
    gw.wait_until("the made-again file to apply", || {
        status("filed-5", TOKEN) == 200
    });
    assert_eq!(meanwhile, (200, 401), "log:\n{}", gw.log());

    // A writer that keeps the file open: what it wrote is read a little later all the same.
    let mut writer = std::fs::File::create(&agents).unwrap();
    writer.write_all(file("filed-4").as_bytes()).unwrap();
    gw.wait_until("a write never closed to apply", || {
        status("filed-4", TOKEN) == 200
    });
    drop(writer);
}

/// A file the config names that could not be read is read again each second until it can be:
/// a read error can end with no event in a watched directory (too many open files; here the
/// target of a link, in a directory nobody watches, removed and put back), and a revocation in
/// the file must not wait for the next change. The retries count no failure of their own.
#[test]
fn an_agents_file_that_could_not_be_read_is_read_again_until_it_can_be() {
    let backend = Backend::start();
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("agents.toml");
    let file_of = |id: &str| {
        let file = AgentsFile {
            agents: vec![AgentFile::new(id, TOKEN)],
        };
        toml::to_string(&file).unwrap()
    };
    std::fs::write(&target, file_of("before")).unwrap();
    let link = dir.path().join("agents.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let mut cfg = config_with_code(backend.addr, "KEPT");
    cfg.auth.agents.clear();
    cfg.auth.agents_file = Some(link.display().to_string());
    let gw = Gateway::builder(cfg).start();
    gw.wait_until("the watcher to watch both directories", || {
        gw.log().matches("watching the config directory").count() == 2
    });
    let status = |id: &str| {
        let headers = [
            ("X-Service-Agent-Id", id),
            ("X-Auth-Token", TOKEN),
            ("Content-Type", "application/json"),
        ];
        request(gw.proxy, "POST", VERIFY_V1, &headers, BODY.as_bytes()).status
    };
    assert_eq!(status("before"), 200);

    std::fs::remove_file(&target).unwrap();
    let refused = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert!(refused.text().contains("cannot read"), "{}", refused.text());
    assert_eq!(status("before"), 200, "the agents in service keep serving");

    // Retried each second while unreadable, the same failure is not counted again.
    thread::sleep(Duration::from_millis(2500));
    let failures = "agent_gateway_config_reloads_total{result=\"failure\"}";
    assert_eq!(gw.metric(failures), 1.0);

    // The config itself moved away meanwhile: one more failure, and no more while it is gone.
    let away = gw.config_path.with_extension("away");
    std::fs::rename(&gw.config_path, &away).unwrap();
    gw.wait_for_metric(failures, 2.0);
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(gw.metric(failures), 2.0);
    // Back, the agents file still unreadable: a reading of its own, counted once.
    std::fs::rename(&away, &gw.config_path).unwrap();
    gw.wait_for_metric(failures, 3.0);
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(gw.metric(failures), 3.0);

    // Put back, with the old agent revoked: nothing in a watched directory changes.
    std::fs::write(&target, file_of("after")).unwrap();
    gw.wait_until("the file put back to be read", || status("after") == 200);
    assert_eq!(status("before"), 401);
    assert_eq!(gw.metric(failures), 3.0);
}
