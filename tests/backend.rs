//! The backend as it really is: names whose addresses change (a real DNS server the test
//! runs), a connection budget with a bounded queue (connections counted at the backend), an
//! address that dies between health checks (passive ejection), and clients that leave while
//! their requests wait for a connection.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use agent_gateway::config::FileConfig;
use common::dns::Dns;
use common::*;

const TARGET: &str = "/api/v2/transaction/tx-42/status";
const NAME: &str = "backend.test";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Two default backends on one port, at 127.0.0.1 and 127.0.0.2.
fn two_backends_on_one_port() -> (Backend, Backend) {
    let first = Backend::start();
    let second = TcpListener::bind(SocketAddr::new(ip("127.0.0.2"), first.addr.port())).unwrap();
    (first, Backend::listening(second))
}

/// The config of a gateway whose one upstream address is `NAME` at `port`, asked of `dns`.
fn config_on_name(dns: &Dns, port: u16) -> FileConfig {
    let mut cfg = test_config(&[]);
    cfg.upstream.addresses = vec![format!("{NAME}:{port}")];
    cfg.upstream.resolvers = vec![dns.addr.to_string()];
    cfg
}

/// A gateway whose one upstream address is `NAME` at `port`, asked of `dns`.
fn gateway_on_name(dns: &Dns, port: u16) -> Gateway {
    Gateway::builder(config_on_name(dns, port)).start()
}

#[test]
fn traffic_follows_the_name_as_dns_changes_with_no_failed_request() {
    let (first, second) = two_backends_on_one_port();
    let dns = Dns::start(&[(NAME, ip("127.0.0.1")), (NAME, ip("127.0.0.2"))]);
    let gw = gateway_on_name(&dns, first.addr.port());

    // Two records: both addresses take requests.
    for _ in 0..6 {
        assert_eq!(get(gw.proxy, TARGET).status, 200);
    }
    assert!(
        first.count() > 0 && second.count() > 0,
        "{} / {}",
        first.count(),
        second.count()
    );

    // Clients keep calling while the name moves to 127.0.0.2 alone: none fails.
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, failed, proxy) = (stop.clone(), failed.clone(), gw.proxy);
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if get(proxy, TARGET).status != 200 {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    dns.answer(&[(NAME, ip("127.0.0.2"))]);
    wait_until("the set to be 127.0.0.2 alone", || {
        let metrics = gw.scrape();
        metrics.contains("agent_gateway_upstream_address_up{address=\"127.0.0.2:")
            && !metrics.contains("agent_gateway_upstream_address_up{address=\"127.0.0.1:")
    });
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.join().unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during the move"
    );

    // From now on the old address gets nothing, pooled connections included.
    let before = first.count();
    for _ in 0..6 {
        assert_eq!(get(gw.proxy, TARGET).status, 200);
    }
    assert_eq!(
        first.count(),
        before,
        "a request went to the address that left"
    );
}

#[test]
fn a_stopped_dns_server_leaves_the_last_good_addresses_serving() {
    let backend = Backend::start();
    let mut dns = Dns::start(&[(NAME, ip("127.0.0.1"))]);
    let gw = gateway_on_name(&dns, backend.addr.port());
    assert_eq!(get(gw.proxy, TARGET).status, 200);
    dns.stop();
    gw.wait_for_metric_at_least(
        &format!("agent_gateway_upstream_dns_errors_total{{name=\"{NAME}\"}}"),
        1.0,
    );
    for _ in 0..4 {
        assert_eq!(get(gw.proxy, TARGET).status, 200);
    }
}

#[test]
fn a_name_that_does_not_resolve_at_start_stops_the_gateway_unless_allowed() {
    let dns = Dns::start(&[("other.test", ip("127.0.0.1"))]);
    let mut cfg = test_config(&[]);
    cfg.upstream.addresses = vec![format!("{NAME}:80")];
    cfg.upstream.resolvers = vec![dns.addr.to_string()];
    assert!(!Gateway::builder(cfg.clone())
        .process()
        .exit_status()
        .success());
    cfg.upstream.allow_unresolved_at_start = true;
    let gw = Gateway::builder(cfg).start();
    // Nothing to send to: the gateway's own 502, sent nowhere.
    assert_eq!(get(gw.proxy, TARGET).status, 502);
}

/// A name that does not resolve fails `check-config`, as it stops `run`, unless
/// `upstream.allow_unresolved_at_start`, with which `run` starts: a warning then, and the file
/// passes. `check-config` asks the resolvers `run` asks (`upstream.resolvers`): a name only
/// they know passes.
#[test]
fn check_config_looks_names_up_as_run_does_and_warns_where_run_starts_anyway() {
    let dns = Dns::start(&[("other.test", ip("127.0.0.1"))]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let check = |name: &str, allowed: bool| {
        let mut cfg = test_config(&[]);
        cfg.upstream.addresses = vec![format!("{name}:80")];
        cfg.upstream.resolvers = vec![dns.addr.to_string()];
        cfg.upstream.allow_unresolved_at_start = allowed;
        std::fs::write(&path, cfg.to_toml()).unwrap();
        let out = cli([
            "check-config".as_ref(),
            "--config".as_ref(),
            path.as_os_str(),
        ]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (passed, said) = check("other.test", false);
    assert!(passed && said.is_empty(), "{said}");
    let unknown = format!("upstream.addresses[0]: \"{NAME}\" does not resolve");
    let (passed, said) = check(NAME, false);
    assert!(!passed);
    assert!(said.contains(&unknown), "{said}");
    let (passed, said) = check(NAME, true);
    assert!(passed, "{said}");
    assert!(said.contains(&format!("warning: {unknown}")), "{said}");
}

/// A backend that holds every answer until `gate` opens and counts the connections open to
/// it that carried a request (the health check's bare connect carries none, and is no
/// proxied connection): how many are open now, and the most it saw at once.
struct CountingBackend {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

fn counting_backend(gate: Gate) -> CountingBackend {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (counting, seen) = (open.clone(), most.clone());
    thread::spawn(move || {
        let open = counting;
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let (open, seen, gate) = (open.clone(), seen.clone(), gate.clone());
            thread::spawn(move || {
                let mut counted = false;
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                loop {
                    // A GET: its head is the whole request.
                    let mut line = String::new();
                    let mut ended = false;
                    while reader.read_line(&mut line).unwrap_or(0) > 0 {
                        if line == "\r\n" {
                            ended = true;
                            break;
                        }
                        line.clear();
                    }
                    if !ended {
                        break;
                    }
                    if !counted {
                        counted = true;
                        let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                        seen.fetch_max(now, Ordering::SeqCst);
                    }
                    gate.wait();
                    let body = r#"{"status_code":200,"message_code":0,"message":"OK"}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(answer.as_bytes()).is_err() {
                        break;
                    }
                }
                if counted {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
    });
    CountingBackend { addr, open, most }
}

#[test]
fn a_budget_of_four_connections_queues_the_rest_and_refuses_past_the_queue() {
    let gate = Gate::new();
    let backend = counting_backend(gate.clone());
    let mut cfg = test_config(&[backend.addr]);
    cfg.upstream.max_connections_per_address = Some(4);
    cfg.upstream.max_pending = 8;
    cfg.upstream.pending_timeout_ms = 60_000;
    cfg.upstream.read_timeout_ms = 60_000;
    let gw = Gateway::builder(cfg).start();

    // 20 at once against answers held back: 4 on connections, 8 waiting, 8 refused.
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let proxy = gw.proxy;
            thread::spawn(move || get(proxy, TARGET))
        })
        .collect();
    gw.wait_for_metric(
        "agent_gateway_upstream_overflow_total{reason=\"queue_full\"}",
        8.0,
    );
    gate.open();
    let answers: Vec<Response> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    let refused: Vec<&Response> = answers.iter().filter(|a| a.status != 200).collect();
    assert_eq!(refused.len(), 8, "only a full queue refuses");
    for r in refused {
        assert_eq!(r.status, 503);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.json()["message_code"], 50300);
    }
    assert!(
        backend.most.load(Ordering::SeqCst) <= 4,
        "the backend saw {} connections at once",
        backend.most.load(Ordering::SeqCst)
    );
    assert_eq!(
        gw.metric("agent_gateway_upstream_overflow_total{reason=\"timeout\"}"),
        0.0
    );
}

#[test]
fn an_address_that_dies_is_tried_by_at_most_eject_after_failures_requests() {
    let alive = Backend::start();
    let dying_port = ClosedPort::new();
    let dying = Backend::start_on(&dying_port);
    let mut cfg = test_config(&[alive.addr, dying_port.addr]);
    // Active checks off in effect: one at start, the next in an hour.
    cfg.upstream.health_check_interval_ms = 3_600_000;
    cfg.upstream.eject_after_failures = 3;
    // `/readyz` waits for the first health check only then: without it, the check could
    // find the address already dead, and no request would try it.
    cfg.server.readiness_requires_upstream = true;
    let gw = Gateway::builder(cfg).start();
    wait_until("the first health check", || {
        admin_get(gw.admin, "/readyz").status == 200
    });
    drop(dying);

    for _ in 0..12 {
        assert_eq!(get(gw.proxy, TARGET).status, 200);
    }
    let tried = gw.metric("agent_gateway_upstream_errors_total{kind=\"connect\"}");
    assert!(tried <= 3.0, "{tried} requests tried the dead address");
    let series = format!(
        "agent_gateway_upstream_ejections_total{{address=\"{}\"}}",
        dying_port.addr
    );
    assert_eq!(gw.metric(&series), 1.0);
    assert_eq!(
        gw.metric(&format!(
            "agent_gateway_upstream_address_up{{address=\"{}\"}}",
            dying_port.addr
        )),
        0.0
    );
}

/// A gateway over a healthy backend and one that answers every request as `broken` says,
/// health checks out of the way and an address ejected after two failures in a row; with the
/// two backends, healthy and broken, and the series of the broken one's ejections.
fn beside_a_healthy_one(
    broken: impl Fn(&Recorded) -> Action + Send + Sync + 'static,
    edit: impl FnOnce(&mut FileConfig),
) -> (Gateway, [Backend; 2], String) {
    let alive = Backend::start();
    let broken = Backend::with(broken);
    let mut cfg = test_config(&[alive.addr, broken.addr]);
    cfg.upstream.health_check_interval_ms = 3_600_000;
    cfg.upstream.eject_after_failures = 2;
    cfg.upstream.eject_ms = 60_000;
    edit(&mut cfg);
    let ejections = format!(
        "agent_gateway_upstream_ejections_total{{address=\"{}\"}}",
        broken.addr
    );
    (Gateway::builder(cfg).start(), [alive, broken], ejections)
}

/// An answer that breaks before any of its body (here, chunked framing broken from its first
/// byte) is answered with the gateway's 502, and counts against its address as a failed
/// exchange does: an address that only sends such answers is ejected.
#[test]
fn an_address_whose_answers_break_before_their_body_is_ejected() {
    let (gw, [_alive, broken], ejections) = beside_a_healthy_one(
        |_| {
            Action::Raw(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{\"status_code\":200}"
                    .to_vec(),
            )
        },
        |_| {},
    );
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(post(gw.proxy, VERIFY_V1, VERIFY_BODY).status);
    }
    assert_eq!(gw.metric(&ejections), 1.0, "{statuses:?}\n{}", gw.log());
    assert_eq!(broken.count(), 2, "ejected after its second broken answer");
    assert_eq!(
        statuses.iter().filter(|&&s| s == 502).count(),
        2,
        "{statuses:?}"
    );
    for _ in 0..4 {
        assert_eq!(post(gw.proxy, VERIFY_V1, VERIFY_BODY).status, 200);
    }
}

/// An answer that breaks off mid-body, after part of it went to the client (the access log's
/// `answer_broken`), counts against its address as one that breaks before its body does: how
/// much of it had gone out is the backend's packets' timing, not its health. An address whose
/// answers all break mid-body is ejected.
#[test]
fn an_address_whose_answers_break_mid_body_is_ejected() {
    // A close counts however much of the answer had gone out; a stall past the read timeout
    // is a slow backend, and never does.
    for (case, closes) in [("a close", true), ("a stall", false)] {
        let (gw, [_alive, broken], ejections) = beside_a_healthy_one(
            move |_| match closes {
                true => Action::CloseMidBody,
                false => Action::StallMidBody,
            },
            |cfg| cfg.upstream.read_timeout_ms = 200,
        );
        let statuses: Vec<_> = (0..8)
            .map(|i| raw(gw.proxy, &verify_post_with_id(&format!("r{i}"))).map(|r| r.status))
            .collect();
        let logged = gw.wait_for_access_log(8);
        let cut = logged.iter().filter(|l| l["answer_broken"] == true).count();
        let (sent_to_it, ejections_seen) = if closes { (2, 1.0) } else { (4, 0.0) };
        let context = format!("{case}: {statuses:?}\n{logged:#?}\n{}", gw.log());
        assert_eq!(cut, sent_to_it, "{context}");
        assert_eq!(broken.count(), sent_to_it, "{context}");
        assert_eq!(gw.metric(&ejections), ejections_seen, "{context}");
        let whole = statuses.iter().filter(|s| **s == Some(200)).count();
        assert_eq!(whole, 8 - sent_to_it, "{context}");
    }
}

#[test]
fn a_check_that_only_connects_does_not_end_an_ejection_for_resets() {
    // Accepts every connection, and closes each that sends a request without answering.
    let resetting = TcpListener::bind("127.0.0.1:0").unwrap();
    let resetting_addr = resetting.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    thread::spawn(move || {
        for conn in resetting.incoming() {
            let Ok(conn) = conn else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || {
                // A health check closes at once; a request is read, then dropped unanswered.
                let _ = BufReader::new(conn).fill_buf().map(|b| b.len());
            });
        }
    });
    let alive = Backend::start();
    let mut cfg = test_config(&[alive.addr, resetting_addr]);
    cfg.upstream.health_check_interval_ms = 100;
    cfg.upstream.eject_after_failures = 2;
    cfg.upstream.eject_ms = 60_000;
    let gw = Gateway::builder(cfg).start();
    let ejections =
        format!("agent_gateway_upstream_ejections_total{{address=\"{resetting_addr}\"}}");
    // POSTs, which are never resent: each the resetting address gets fails.
    for _ in 0..20 {
        if gw.metric(&ejections) == 1.0 {
            break;
        }
        post(gw.proxy, VERIFY_V1, VERIFY_BODY);
    }
    assert_eq!(gw.metric(&ejections), 1.0, "{}", gw.log());
    // Three more checks connect to it, and pass.
    let checked = accepted.load(Ordering::SeqCst);
    wait_until("three more health checks", || {
        accepted.load(Ordering::SeqCst) >= checked + 3
    });
    let up = format!("agent_gateway_upstream_address_up{{address=\"{resetting_addr}\"}}");
    assert_eq!(gw.metric(&up), 0.0, "still ejected");
    for _ in 0..6 {
        assert_eq!(post(gw.proxy, VERIFY_V1, VERIFY_BODY).status, 200);
    }
}

/// A backend on `listener` that reads each request's head, holds it until `gate` opens, then
/// closes the connection unanswered (a reset, as the gateway sees it); how many requests it
/// has read. A health check's bare connect carries none.
fn unanswering(listener: TcpListener, gate: Gate) -> Arc<AtomicUsize> {
    let read = Arc::new(AtomicUsize::new(0));
    let counted = read.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (counted, gate) = (counted.clone(), gate.clone());
            thread::spawn(move || {
                let mut reader = BufReader::new(conn);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 {
                    if line == "\r\n" {
                        counted.fetch_add(1, Ordering::SeqCst);
                        gate.wait();
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    read
}

/// `NAME` answering 127.0.0.1 and 127.0.0.2 on one port, where 127.0.0.1 holds every request
/// until the gate opens and then closes it unanswered, and 127.0.0.2 answers; ejection after
/// one failure, active checks off in effect. Returns with one GET held at 127.0.0.1.
struct HeldAtOne {
    gw: Gateway,
    dns: Dns,
    gate: Gate,
    port: u16,
    held: thread::JoinHandle<Response>,
    _answering: Backend,
}

fn a_request_held_at_127_0_0_1() -> HeldAtOne {
    let gate = Gate::new();
    let failing = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = failing.local_addr().unwrap().port();
    let answering =
        Backend::listening(TcpListener::bind(SocketAddr::new(ip("127.0.0.2"), port)).unwrap());
    let read = unanswering(failing, gate.clone());
    let dns = Dns::start(&[(NAME, ip("127.0.0.1")), (NAME, ip("127.0.0.2"))]);
    let mut cfg = config_on_name(&dns, port);
    cfg.upstream.eject_after_failures = 1;
    cfg.upstream.health_check_interval_ms = 3_600_000;
    cfg.upstream.read_timeout_ms = 60_000;
    let gw = Gateway::builder(cfg).start();
    // The rotation alternates: one of the first two requests is held at 127.0.0.1.
    let held = loop {
        let proxy = gw.proxy;
        let call = thread::spawn(move || get(proxy, TARGET));
        wait_until("the request answered or held", || {
            call.is_finished() || read.load(Ordering::SeqCst) > 0
        });
        if read.load(Ordering::SeqCst) > 0 {
            break call;
        }
        assert_eq!(call.join().unwrap().status, 200);
    };
    HeldAtOne {
        gw,
        dns,
        gate,
        port,
        held,
        _answering: answering,
    }
}

impl HeldAtOne {
    /// Waits until the gateway's set is `ip` alone.
    fn wait_for_set(&self, ip: &str, other: &str) {
        let (port, gw) = (self.port, &self.gw);
        wait_until(&format!("the set to be {ip} alone"), || {
            let metrics = gw.scrape();
            metrics.contains(&format!(
                "agent_gateway_upstream_address_up{{address=\"{ip}:{port}\"}}"
            )) && !metrics.contains(&format!("address=\"{other}:{port}\""))
        });
    }

    /// Lets the held request fail; its answer.
    fn fail_the_held_request(self) -> (Gateway, Response) {
        self.gate.open();
        let answer = self.held.join().unwrap();
        drop(self.dns);
        (self.gw, answer)
    }
}

/// An address that leaves the name while a request to it is in flight, and fails that
/// request, is not ejected: it is in no rotation to leave, and its ejection series, removed
/// when it left, would come back and stay for good (one more per address DNS ever gave).
#[test]
fn a_failure_after_its_address_left_the_name_leaves_no_series_behind() {
    let held = a_request_held_at_127_0_0_1();
    held.dns.answer(&[(NAME, ip("127.0.0.2"))]);
    held.wait_for_set("127.0.0.2", "127.0.0.1");
    let port = held.port;
    let (gw, answer) = held.fail_the_held_request();
    assert_eq!(answer.status, 502);
    let metrics = gw.settled_scrape();
    let left = format!("address=\"127.0.0.1:{port}\"");
    assert!(
        !metrics.lines().any(|l| l.contains(&left)),
        "a series of the address that left:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains(&left))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// An address whose request fails after DNS made it the only one is not ejected: the
/// addresses that would take requests instead are those of the set now, not of the set the
/// request started with.
#[test]
fn the_last_address_of_a_name_is_not_ejected_for_the_set_a_request_started_with() {
    let held = a_request_held_at_127_0_0_1();
    held.dns.answer(&[(NAME, ip("127.0.0.1"))]);
    held.wait_for_set("127.0.0.1", "127.0.0.2");
    let port = held.port;
    let (gw, answer) = held.fail_the_held_request();
    assert_eq!(answer.status, 502);
    let up = format!("agent_gateway_upstream_address_up{{address=\"127.0.0.1:{port}\"}}");
    assert_eq!(gw.metric(&up), 1.0, "{}", gw.log());
}

/// A reload that raises `upstream.max_connections_per_address` lets the requests waiting at
/// the old budget connect at once, and those that come after, rather than queue them all
/// behind the first, held to the old budget until a connection comes back (or answered 503
/// at `upstream.pending_timeout_ms`) while the new budget has room.
#[test]
fn a_reload_that_raises_the_budget_lets_the_waiting_requests_connect() {
    let gate = Gate::new();
    let backend = counting_backend(gate.clone());
    let mut cfg = test_config(&[backend.addr]);
    cfg.upstream.max_connections_per_address = Some(1);
    cfg.upstream.pending_timeout_ms = 4_000;
    cfg.upstream.read_timeout_ms = 60_000;
    let gw = Gateway::builder(cfg.clone()).start();
    let call = || {
        let proxy = gw.proxy;
        thread::spawn(move || get(proxy, TARGET))
    };
    let mut calls: Vec<_> = (0..3).map(|_| call()).collect();
    wait_until("one request at the backend, two waiting", || {
        backend.most.load(Ordering::SeqCst) == 1
            && metric_value(&gw.scrape(), "agent_gateway_in_flight_requests") == Some(3.0)
    });
    cfg.upstream.max_connections_per_address = Some(4);
    gw.reload(&cfg);
    calls.push(call());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while backend.most.load(Ordering::SeqCst) < 4 && std::time::Instant::now() < deadline {
        thread::sleep(std::time::Duration::from_millis(10));
    }
    let most = backend.most.load(Ordering::SeqCst);
    gate.open();
    let statuses: Vec<u16> = calls
        .into_iter()
        .map(|c| c.join().unwrap().status)
        .collect();
    assert_eq!(most, 4, "the requests did not connect under the new budget");
    assert_eq!(statuses, [200; 4]);
}

/// A POST whose client hangs up while the request waits for a backend connection (the
/// budget spent) is sent nowhere: the backend never carries it out, its place in the queue
/// goes to the request behind it, and it is counted and logged as nginx logs it, 499.
#[test]
fn a_post_whose_client_hung_up_while_it_waited_is_sent_nowhere() {
    let gate = Gate::new();
    let (backend, cfg) = held_behind_one_connection(&gate);
    let gw = Gateway::builder(cfg).start();
    let first = post_on_a_thread(&gw, "first");
    gw.wait_until("the first at the backend", || backend.count() == 1);
    let mut leaving = Connection::open(gw.proxy);
    leaving.send(verify_post_with_id("gone"));
    gw.wait_for_metric("agent_gateway_in_flight_requests", 2.0);
    drop(leaving);

    assert_sent_nowhere_in_plaintext(&gw, &backend, &gate, first);
    assert_eq!(
        gw.metric("agent_gateway_requests_total{api_version=\"v1\",code=\"499\",operation=\"verify_request\"}"),
        1.0
    );
}

/// Bytes that come while a request waits (the client's next request, pipelined) are no
/// hang-up: both requests are sent and answered in order. A hang-up after them still is one.
#[test]
fn a_request_pipelined_behind_a_waiting_one_is_no_hang_up_and_a_close_after_it_is() {
    let gate = Gate::new();
    let (backend, cfg) = held_behind_one_connection(&gate);
    let gw = Gateway::builder(cfg).start();
    let first = post_on_a_thread(&gw, "first");
    gw.wait_until("the first at the backend", || backend.count() == 1);
    let mut pipelining = Connection::open(gw.proxy);
    pipelining.send(verify_post_with_id("second"));
    gw.wait_for_metric("agent_gateway_in_flight_requests", 2.0);
    pipelining.send(verify_post_with_id("third"));
    let mut leaving = Connection::open(gw.proxy);
    leaving.send(verify_post_with_id("gone"));
    gw.wait_for_metric("agent_gateway_in_flight_requests", 3.0);
    leaving.send(verify_post_with_id("gone-next"));
    // The watch sees these bytes before the close: no event tells the test when, so it
    // gives the gateway a moment.
    thread::sleep(std::time::Duration::from_millis(200));
    drop(leaving);

    assert_eq!(gw.access_line("gone")["status"], 499);
    gate.open();
    assert_eq!(first.join().unwrap().map(|r| r.status), Some(200));
    assert_eq!(pipelining.response().status, 200);
    assert_eq!(pipelining.response().status, 200);
    assert_eq!(backend.request_ids(), ["first", "second", "third"]);
}

/// A client that shuts its sending side while its request waits counts as gone, as nginx
/// counts it: the request is sent nowhere, and the client reads the connection's end, no
/// answer.
#[test]
fn a_client_that_half_closes_while_its_request_waits_counts_as_gone() {
    let gate = Gate::new();
    let (backend, cfg) = held_behind_one_connection(&gate);
    let gw = Gateway::builder(cfg).start();
    let first = post_on_a_thread(&gw, "first");
    gw.wait_until("the first at the backend", || backend.count() == 1);
    let mut half_closing = Connection::open(gw.proxy);
    half_closing.send(verify_post_with_id("half-closed"));
    gw.wait_for_metric("agent_gateway_in_flight_requests", 2.0);
    half_closing
        .writer
        .shutdown(std::net::Shutdown::Write)
        .unwrap();

    assert_eq!(gw.access_line("half-closed")["status"], 499);
    assert_eq!(
        half_closing.rest(),
        b"",
        "no answer, and the connection's end"
    );
    gate.open();
    assert_eq!(first.join().unwrap().map(|r| r.status), Some(200));
    assert_eq!(backend.request_ids(), ["first"]);
}

/// The config of a gateway allowed one connection to each of `addresses`, whose requests wait
/// 3 s at most for one, and whose reads on a connection held at a backend do not time out.
fn one_connection_each(addresses: &[SocketAddr]) -> FileConfig {
    let mut cfg = test_config(addresses);
    cfg.upstream.max_connections_per_address = Some(1);
    cfg.upstream.pending_timeout_ms = 3_000;
    cfg.upstream.read_timeout_ms = 60_000;
    cfg
}

/// A GET of `TARGET` sent to `gw` on a thread of its own; its answer.
fn get_on_a_thread(gw: &Gateway) -> thread::JoinHandle<Response> {
    let proxy = gw.proxy;
    thread::spawn(move || get(proxy, TARGET))
}

/// The series of `address`'s requests waiting for a connection.
fn pending_at(address: SocketAddr) -> String {
    format!("agent_gateway_upstream_pending{{address=\"{address}\"}}")
}

/// `agent_gateway_upstream_pending` counts the requests waiting for a connection to each
/// address, its budget spent, and none once they have one.
#[test]
fn the_pending_gauge_counts_the_requests_waiting_at_each_address() {
    let gate = Gate::new();
    let held = Backend::gated(&gate);
    let gw = Gateway::builder(one_connection_each(&[held.addr])).start();
    assert_eq!(gw.metric(&pending_at(held.addr)), 0.0);

    let first = get_on_a_thread(&gw);
    gw.wait_until("the first held", || held.count() == 1);
    let waiting: Vec<_> = (0..2).map(|_| get_on_a_thread(&gw)).collect();
    gw.wait_for_metric(&pending_at(held.addr), 2.0);
    assert_eq!(held.count(), 1, "the waiting were sent nowhere");
    gate.open();
    for request in waiting.into_iter().chain([first]) {
        assert_eq!(request.join().unwrap().status, 200);
    }
    assert_eq!(gw.metric(&pending_at(held.addr)), 0.0);
}

/// An address whose one connection is busy while the queue is full (`upstream.max_pending`)
/// is passed for the next address with room: the address a request starts at, and the one it
/// moves on to after a refused connect. Both used to answer 503 (50300) while the address
/// after them could take the request.
#[test]
fn an_address_whose_queue_is_full_is_passed_for_one_with_room() {
    let gate = Gate::new();
    let held = Backend::gated(&gate);
    let refusing_port = ClosedPort::new();
    let refusing = Backend::start_on(&refusing_port);
    let free = Backend::start();
    let mut cfg = one_connection_each(&[refusing_port.addr, held.addr, free.addr]);
    cfg.upstream.max_pending = 0;
    // Active checks off in effect (one at start, the next in an hour) and no ejection: the
    // refusing address stays in the rotation.
    cfg.upstream.health_check_interval_ms = 3_600_000;
    cfg.upstream.eject_after_failures = 0;
    cfg.server.readiness_requires_upstream = true;
    let gw = Gateway::builder(cfg).start();
    gw.wait_until("the first health check", || {
        admin_get(gw.admin, "/readyz").status == 200
    });
    drop(refusing);

    // Each request starts one address further in the rotation. The first is refused, moves
    // on to the held address and is held there.
    let first = get_on_a_thread(&gw);
    gw.wait_until("the first held", || held.count() == 1);
    // The second starts at the held address, the third at the free one, and the fourth is
    // refused and moves on to the held one.
    let statuses: Vec<u16> = (0..3).map(|_| get(gw.proxy, TARGET).status).collect();
    assert_eq!(statuses, [200; 3]);
    assert_eq!((held.count(), free.count()), (1, 3));
    gate.open();
    assert_eq!(first.join().unwrap().status, 200);
}

/// A request the rotation starts at an address whose one connection is busy goes to the next
/// address with room rather than wait for that connection, as nginx's round robin passes a
/// server at its `max_conns` and HAProxy's a server at its `maxconn`.
#[test]
fn a_request_goes_to_an_address_with_room_rather_than_wait_at_a_busy_one() {
    let gate = Gate::new();
    let held = Backend::gated(&gate);
    let free = Backend::start();
    let gw = Gateway::builder(one_connection_each(&[held.addr, free.addr])).start();

    let first = get_on_a_thread(&gw);
    gw.wait_until("the first held", || held.count() == 1);
    // The second starts at the free address, the third at the held one.
    let statuses: Vec<u16> = (0..2).map(|_| get(gw.proxy, TARGET).status).collect();
    assert_eq!(statuses, [200; 2]);
    assert_eq!((held.count(), free.count()), (1, 2));
    gate.open();
    assert_eq!(first.join().unwrap().status, 200);
}

/// A request waiting for a connection to its address (every address's one connection busy)
/// takes the one that comes back first, at whichever address, as HAProxy's queue hands a
/// request to the first server with a connection free; it used to wait for its own address's,
/// and got 503 (50300) at `upstream.pending_timeout_ms` while another address had one idle.
#[test]
fn a_waiting_request_takes_a_connection_freed_at_another_address() {
    let (held_long, held_short) = (Gate::new(), Gate::new());
    let long = Backend::gated(&held_long);
    let short = Backend::gated(&held_short);
    let gw = Gateway::builder(one_connection_each(&[long.addr, short.addr])).start();

    let first = get_on_a_thread(&gw);
    gw.wait_until("the first held", || long.count() == 1);
    let second = get_on_a_thread(&gw);
    gw.wait_until("the second held", || short.count() == 1);
    // The third starts at the first's address, and waits: no address has a connection free.
    let third = get_on_a_thread(&gw);
    gw.wait_for_metric(&pending_at(long.addr), 1.0);
    held_short.open();
    assert_eq!(second.join().unwrap().status, 200);
    assert_eq!(third.join().unwrap().status, 200);
    assert_eq!((long.count(), short.count()), (1, 2));
    held_long.open();
    assert_eq!(first.join().unwrap().status, 200);
}

/// A read resent after its kept-alive connection was reset, to an address whose one
/// connection is busy, waits for that connection up to `upstream.pending_timeout_ms` from the
/// resend, as any request does. Its wait used to count from its first exchange: one the
/// backend held past the pending timeout before it closed the connection left the resend no
/// wait at all, and the read got 503 (50300) at once.
#[test]
fn a_read_resent_after_a_long_first_exchange_still_waits_for_a_connection() {
    const PENDING_MS: u64 = 2_000;
    let gate = Gate::new();
    let held = Backend::gated(&gate);
    // Answers the first request of each connection; holds the next past the pending timeout,
    // then closes its connection unanswered.
    let closing = Backend::with(|r| {
        if r.on_connection > 0 {
            thread::sleep(std::time::Duration::from_millis(PENDING_MS + 500));
            return Action::Close;
        }
        Action::Json(r#"{"status_code":200,"message_code":0,"message":"OK"}"#.into())
    });
    let mut cfg = one_connection_each(&[held.addr, closing.addr]);
    cfg.upstream.pending_timeout_ms = PENDING_MS;
    let gw = Gateway::builder(cfg).start();

    // The first is held at `held`; the second starts at `closing`, whose connection it leaves
    // in the pool.
    let first = get_on_a_thread(&gw);
    gw.wait_until("the first held", || held.count() == 1);
    assert_eq!(get(gw.proxy, TARGET).status, 200);
    gw.wait_for_metric(
        &format!(
            "agent_gateway_upstream_connections{{address=\"{}\",state=\"idle\"}}",
            closing.addr
        ),
        1.0,
    );
    // The third starts at `held` (busy) and takes that idle connection, which the backend
    // closes under it; the resend goes to `held`, and waits there for the first's connection.
    let third = get_on_a_thread(&gw);
    gw.wait_until("the resend to wait at `held`", || {
        let waiting = metric_value(&gw.scrape(), &pending_at(held.addr));
        waiting == Some(1.0) || third.is_finished()
    });
    gate.open();
    let resp = third.join().unwrap();
    assert_eq!(resp.status, 200, "{}\n{}", resp.text(), gw.log());
    assert_eq!(first.join().unwrap().status, 200);
    let on_connection = |b: &Backend| b.all().iter().map(|r| r.on_connection).collect::<Vec<_>>();
    assert_eq!(
        on_connection(&closing),
        [0, 1],
        "the third went once to `closing`, reused"
    );
    assert_eq!(
        on_connection(&held),
        [0, 0],
        "and was resent to `held` on a new connection"
    );
    assert_eq!(
        gw.metric("agent_gateway_upstream_errors_total{kind=\"reset\"}"),
        1.0
    );
    assert_eq!(
        gw.metric("agent_gateway_upstream_overflow_total{reason=\"timeout\"}"),
        0.0
    );
}

/// A gateway in front of a counting backend with a budget of 4 connections, and 4 GETs sent
/// at once, each on a connection of its own, held at the backend until `gate` opens; the
/// gateway's config, to reload.
fn four_connections_held(
    backend: &CountingBackend,
) -> (Gateway, FileConfig, Vec<thread::JoinHandle<Response>>) {
    let mut cfg = test_config(&[backend.addr]);
    cfg.upstream.max_connections_per_address = Some(4);
    cfg.upstream.read_timeout_ms = 60_000;
    let gw = Gateway::builder(cfg.clone()).start();
    let calls = (0..4)
        .map(|_| {
            let proxy = gw.proxy;
            thread::spawn(move || get(proxy, TARGET))
        })
        .collect();
    wait_until("four connections at the backend", || {
        backend.open.load(Ordering::SeqCst) == 4
    });
    (gw, cfg, calls)
}

/// Waits up to 2 s (a sweep is immediate; the idle timeout is a minute) until the backend
/// has at most `want` connections open; how many it has.
fn open_settles_at(backend: &CountingBackend, want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while backend.open.load(Ordering::SeqCst) > want && std::time::Instant::now() < deadline {
        thread::sleep(std::time::Duration::from_millis(10));
    }
    backend.open.load(Ordering::SeqCst)
}

/// A reload that lowers `upstream.max_connections_per_address` closes the idle connections
/// past the new cap at once: the backend sees no more connections than the operator allows,
/// where the pool used to keep them (and requests to use them, past the cap) until they sat
/// idle for `upstream.idle_timeout_ms`.
#[test]
fn a_reload_that_lowers_the_budget_closes_the_idle_connections_past_it() {
    let gate = Gate::new();
    let backend = counting_backend(gate.clone());
    let (gw, mut cfg, calls) = four_connections_held(&backend);
    gate.open();
    for call in calls {
        assert_eq!(call.join().unwrap().status, 200);
    }
    let idle = format!(
        "agent_gateway_upstream_connections{{address=\"{}\",state=\"idle\"}}",
        backend.addr
    );
    gw.wait_for_metric(&idle, 4.0);

    cfg.upstream.max_connections_per_address = Some(1);
    gw.reload(&cfg);
    assert_eq!(open_settles_at(&backend, 1), 1, "{}", gw.log());
    for _ in 0..4 {
        assert_eq!(get(gw.proxy, TARGET).status, 200);
    }
    assert_eq!(backend.open.load(Ordering::SeqCst), 1);
    assert_eq!(gw.metric(&idle), 1.0);
}

/// A reload that lowers `upstream.max_connections_per_address` while connections carry
/// requests lets those requests finish, then keeps only as many of their connections as the
/// new cap allows.
#[test]
fn a_reload_that_lowers_the_budget_keeps_no_busy_connection_past_it() {
    let gate = Gate::new();
    let backend = counting_backend(gate.clone());
    let (gw, mut cfg, calls) = four_connections_held(&backend);
    cfg.upstream.max_connections_per_address = Some(1);
    gw.reload(&cfg);
    gate.open();
    for call in calls {
        assert_eq!(call.join().unwrap().status, 200);
    }
    assert_eq!(open_settles_at(&backend, 1), 1, "{}", gw.log());
    let idle = format!(
        "agent_gateway_upstream_connections{{address=\"{}\",state=\"idle\"}}",
        backend.addr
    );
    assert_eq!(gw.metric(&idle), 1.0);
}

/// An address whose health check hangs until its timeout delays the checks of no other: one
/// that comes back is in rotation again within `upstream.health_check_interval_ms`, where it
/// used to wait for the hung check to time out (the checks of a round ran one after another).
#[test]
fn a_health_check_that_hangs_delays_no_other_address() {
    // Accepts every connection and reads the check's request, never answering it.
    let hanging = TcpListener::bind("127.0.0.1:0").unwrap();
    let hanging_addr = hanging.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    thread::spawn(move || {
        for conn in hanging.incoming() {
            let Ok(conn) = conn else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || until_closed(conn));
        }
    });
    let returning_port = ClosedPort::new();
    let mut cfg = test_config(&[hanging_addr, returning_port.addr]);
    cfg.upstream.health_check_path = Some("/health".into());
    cfg.upstream.health_check_interval_ms = 100;
    // A check's limit: connect_timeout_ms and at most 2 s of read_timeout_ms, 3 s here.
    cfg.upstream.connect_timeout_ms = 1000;
    cfg.upstream.read_timeout_ms = 2000;
    let gw = Gateway::builder(cfg).start();
    let up = format!(
        "agent_gateway_upstream_address_up{{address=\"{}\"}}",
        returning_port.addr
    );
    gw.wait_for_metric(&up, 0.0);

    // Back just as a check of the hanging address begins.
    let checks = accepted.load(Ordering::SeqCst);
    wait_until("a check of the hanging address", || {
        accepted.load(Ordering::SeqCst) > checks
    });
    let _returning = Backend::start_on(&returning_port);
    let back = std::time::Instant::now();
    let deadline = back + std::time::Duration::from_millis(1500);
    while gw.metric(&up) != 1.0 && std::time::Instant::now() < deadline {
        thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        gw.metric(&up),
        1.0,
        "not back in rotation {:?} after it came back",
        back.elapsed()
    );
}

/// Reads and drops what comes until the peer closes the connection.
fn until_closed(mut conn: std::net::TcpStream) {
    let _ = std::io::copy(&mut conn, &mut std::io::sink());
}
