//! TLS on the proxy listener and to the backend, with a CA generated in the test.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use agent_gateway::config::FileConfig;
use common::pki::TestPki;
use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(ca_file: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS backend that answers every request 200 and counts them.
fn tls_backend(pki: &TestPki) -> (SocketAddr, Arc<AtomicUsize>) {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&pki.key).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (config, seen) = (config.clone(), seen.clone());
            thread::spawn(move || {
                let tls = rustls::ServerConnection::new(config).unwrap();
                let mut stream = BufReader::new(rustls::StreamOwned::new(tls, conn));
                loop {
                    let mut head = String::new();
                    let mut length = 0;
                    loop {
                        let mut line = String::new();
                        if stream.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                        head.push_str(&line);
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    stream.read_exact(&mut body).unwrap();
                    seen.fetch_add(1, Ordering::SeqCst);
                    let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                    // A path with `unhealthy` in it is what a failing health check reads.
                    let status = if path.contains("unhealthy") { 503 } else { 200 };
                    let answer = format!(
                        r#"{{"status_code":{status},"message_code":0,"message":"OK","seen":"{path}"}}"#
                    );
                    let out = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if stream.get_mut().write_all(out.as_bytes()).is_err() {
                        return;
                    }
                    let _ = stream.get_mut().flush();
                }
            });
        }
    });
    (addr, count)
}

#[test]
fn the_proxy_listener_speaks_tls() {
    let pki = TestPki::localhost("gw");
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    pki.serve_on(&mut cfg);
    let gw = Gateway::builder(cfg).start();

    let tls = rustls::ClientConnection::new(
        client_config(&pki.ca),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let tcp = TcpStream::connect(gw.proxy).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::StreamOwned::new(tls, tcp);
    stream.write_all(&verify_post(BODY)).unwrap();
    let resp = read_response(&mut BufReader::new(stream)).expect("a response over TLS");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(backend.last().target, "/api/v2/verify/ORG_DEFAULT/request");

    // Plain HTTP on the TLS port gets no HTTP answer.
    let plain = raw(
        gw.proxy,
        b"GET /api/v1/transaction/t/status HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert!(plain.is_none_or(|r| r.status != 200));
}

/// Whether a handshake with `proxy`, trusting only `ca_file`, succeeds: the certificate it
/// serves is one that CA issued.
fn serves_a_certificate_of(proxy: SocketAddr, ca_file: &str) -> bool {
    let mut tls = rustls::ClientConnection::new(
        client_config(ca_file),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let mut tcp = TcpStream::connect(proxy).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    while tls.is_handshaking() {
        if tls.complete_io(&mut tcp).is_err() {
            return false;
        }
    }
    true
}

/// cert-manager or certbot writes a renewed certificate and key over the files the config
/// names: the watcher sees them, and the next handshakes get the new certificate, with no
/// restart. A key written before its certificate (a renewal half done) is refused, and the
/// pair in service goes on serving.
#[test]
fn a_certificate_renewed_over_its_files_is_served_without_a_restart() {
    let (old, renewed) = (TestPki::localhost("old"), TestPki::localhost("renewed"));
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = true;
    let secret = tempfile::tempdir().unwrap();
    let (cert, key) = (secret.path().join("tls.crt"), secret.path().join("tls.key"));
    let install = |from: &str, to: &std::path::Path| {
        replace_file(to, &std::fs::read_to_string(from).unwrap());
    };
    install(&old.cert, &cert);
    install(&old.key, &key);
    cfg.listen.tls_cert = Some(cert.display().to_string());
    cfg.listen.tls_key = Some(key.display().to_string());
    let gw = Gateway::builder(cfg).start();
    assert!(serves_a_certificate_of(gw.proxy, &old.ca));

    install(&renewed.key, &key);
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"failure\"}",
        1.0,
    );
    assert!(serves_a_certificate_of(gw.proxy, &old.ca));

    install(&renewed.cert, &cert);
    gw.wait_until("the renewed certificate to be served", || {
        serves_a_certificate_of(gw.proxy, &renewed.ca)
    });
    assert!(!serves_a_certificate_of(gw.proxy, &old.ca));
    gw.wait_until("the swap to be logged", || {
        gw.log()
            .contains("the proxy listener serves a new certificate")
    });
}

/// TLS turned off by a reload takes a restart: until then the listener serves the certificate
/// it has, and `/config` still names its files, so that something says what is served.
#[test]
fn tls_turned_off_by_a_reload_keeps_serving_and_naming_its_certificate() {
    let pki = TestPki::localhost("kept");
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.server.watch_config = false;
    pki.serve_on(&mut cfg);
    let gw = Gateway::builder(cfg.clone()).start();
    cfg.listen.tls_cert = None;
    cfg.listen.tls_key = None;
    let report = gw.reload(&cfg);
    assert_eq!(
        report["restart_required"],
        serde_json::json!(["listen.tls_cert"])
    );
    assert!(serves_a_certificate_of(gw.proxy, &pki.ca));
    let shown = admin_get(gw.admin, "/config").json();
    assert_eq!(shown["config"]["listen"]["tls_cert"], pki.cert.as_str());
}

/// A key that is not the certificate's is a problem of the config, named by `check-config`
/// and refused at start; it used to pass both and make `run` panic as it built the listener.
#[test]
fn a_key_that_is_not_the_certificates_is_a_config_problem() {
    let (a, b) = (TestPki::localhost("a"), TestPki::localhost("b"));
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.tls_cert = Some(a.cert.clone());
    cfg.listen.tls_key = Some(b.key.clone());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, cfg.to_toml()).unwrap();
    let checked = cli(["check-config", "--config", path.to_str().unwrap()]);
    let problems = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success());
    assert!(
        problems.contains("listen.tls_key")
            && problems.contains("is not the key of the certificate"),
        "{problems}"
    );
    let run = Gateway::builder(cfg).process().exit_status();
    assert!(!run.success());
    assert_ne!(run.code(), Some(101), "a panic, not a refusal");
}

/// A gateway speaking TLS to `backend`, addressed as `localhost` (the name its certificate
/// carries), verifying against `ca_file` (default: the system roots) and sending `sni`
/// (default: that host name).
fn tls_upstream(backend: SocketAddr, ca_file: Option<&str>, sni: Option<&str>) -> Gateway {
    Gateway::builder(tls_upstream_config(backend, ca_file, sni)).start()
}

fn tls_upstream_config(
    backend: SocketAddr,
    ca_file: Option<&str>,
    sni: Option<&str>,
) -> FileConfig {
    let mut cfg = test_config(&[]);
    cfg.upstream.addresses = vec![format!("localhost:{}", backend.port())];
    cfg.upstream.tls = true;
    cfg.upstream.tls_ca_file = ca_file.map(Into::into);
    cfg.upstream.tls_sni = sni.map(Into::into);
    cfg
}

#[test]
fn http_health_checks_work_over_tls() {
    let pki = TestPki::localhost("backend");
    let (backend, count) = tls_backend(&pki);
    let ready = |path: &str| {
        let mut cfg = tls_upstream_config(backend, Some(&pki.ca), None);
        cfg.upstream.health_check_path = Some(path.into());
        cfg.upstream.health_check_interval_ms = 100;
        // Readiness then follows the health checks' verdict.
        cfg.server.readiness_requires_upstream = true;
        let gw = Gateway::builder(cfg).start();
        let mut verdict = admin_get(gw.admin, "/readyz");
        // "Not checked yet" is a 503 too: wait for the checker's first verdict.
        gw.wait_until("a health-check verdict", || {
            verdict = admin_get(gw.admin, "/readyz");
            !verdict.text().contains("not checked yet")
        });
        assert!(
            count.load(Ordering::SeqCst) > 0,
            "the check reached the backend"
        );
        verdict.status
    };
    assert_eq!(ready("/healthz"), 200, "a 200 over TLS is healthy");
    count.store(0, Ordering::SeqCst);
    assert_eq!(ready("/unhealthy"), 503, "a 503 over TLS is not");
}

#[test]
fn tls_to_the_backend_verifies_its_certificate_against_the_configured_ca() {
    let pki = TestPki::localhost("backend");
    let (backend, count) = tls_backend(&pki);

    let gw = tls_upstream(backend, Some(&pki.ca), None);
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["seen"], "/api/v2/verify/ORG_DEFAULT/request");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn an_untrusted_or_misnamed_backend_certificate_is_refused() {
    let pki = TestPki::localhost("backend");
    let other = TestPki::localhost("other");
    let (backend, count) = tls_backend(&pki);

    // Verification is on by default: a CA that did not sign the backend's certificate...
    let gw = tls_upstream(backend, Some(&other.ca), None);
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 502);
    drop(gw);
    // ...and the system roots, which know nothing of the test CA...
    let gw = tls_upstream(backend, None, None);
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 502);
    drop(gw);
    // ...and the right CA but a name the certificate does not carry.
    let gw = tls_upstream(backend, Some(&pki.ca), Some("not-localhost.example"));
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 502);
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "no request may cross an unverified connection"
    );
}

/// The backend's CA rotated over the file `upstream.tls_ca_file` names (a trust bundle a
/// Secret or cert-manager's trust-manager updates): the watcher applies it, and new
/// connections are verified against it without a restart. The file was read once at start,
/// and the addresses kept the peers of the CA they were made with.
#[test]
fn a_backend_ca_rotated_over_its_file_is_trusted_without_a_restart() {
    let (old, new) = (TestPki::localhost("old-ca"), TestPki::localhost("new-ca"));
    // The backend's certificate is already the new CA's.
    let (backend, count) = tls_backend(&new);
    let trust = tempfile::tempdir().unwrap();
    let ca_file = trust.path().join("ca.crt");
    let install = |from: &str| replace_file(&ca_file, &std::fs::read_to_string(from).unwrap());
    install(&old.ca);
    let mut cfg = tls_upstream_config(backend, Some(&ca_file.display().to_string()), None);
    cfg.server.watch_config = true;
    let gw = Gateway::builder(cfg).start();
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 502);
    assert_eq!(count.load(Ordering::SeqCst), 0);

    install(&new.ca);
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"success\"}",
        1.0,
    );
    let resp = post(gw.proxy, "/api/v1/verify/request", BODY);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(count.load(Ordering::SeqCst), 1);

    // And back: the connection verified against the CA that is gone is not used either.
    install(&old.ca);
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"success\"}",
        2.0,
    );
    assert_eq!(post(gw.proxy, "/api/v1/verify/request", BODY).status, 502);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// A Prometheus behind TLS that wants `authorization` (tests/common/fake_prometheus.py),
/// stopped when dropped.
struct FakePrometheus {
    server: std::process::Child,
    port: u16,
    pki: TestPki,
}

impl FakePrometheus {
    fn start(authorization: &str) -> FakePrometheus {
        let pki = TestPki::localhost("prometheus");
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/common/fake_prometheus.py"
        );
        let mut server = std::process::Command::new("python3")
            .args([script, &pki.cert, &pki.key, authorization])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut port = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        FakePrometheus {
            server,
            port: port.trim().parse().unwrap(),
            pki,
        }
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// `v1-usage --prometheus` with `args` against a [`FakePrometheus`] that wants
/// `authorization`: the command's output.
fn v1_usage_over_tls(authorization: &str, url_auth: &str, args: &[&str]) -> std::process::Output {
    let prom = FakePrometheus::start(authorization);
    let url = format!("https://{url_auth}localhost:{}", prom.port);
    cli([
        "v1-usage",
        "--prometheus",
        &url,
        "--prometheus-ca-file",
        &prom.pki.ca,
    ]
    .iter()
    .chain(args))
}

#[test]
fn the_board_reads_a_prometheus_over_https_with_a_token_from_a_file() {
    let prom = FakePrometheus::start("Bearer t0ken");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    let url = format!("https://localhost:{}", prom.port);
    cfg.retirement.prometheus_url = Some(url.clone());
    cfg.retirement.prometheus_ca_file = Some(prom.pki.ca.clone());
    cfg.retirement.prometheus_token_file = Some(token.display().to_string());
    let gw = Gateway::builder(cfg).start();
    let html = admin_get(gw.admin, "/").text();
    assert!(
        html.contains(&format!(
            "Counts from the fleet: every replica {url} scrapes"
        )),
        "{html}"
    );
    // A token the proxy refuses: the board says so, and shows the gateway's own counts.
    std::fs::write(&token, "stale\n").unwrap();
    let html = admin_get(gw.admin, "/").text();
    assert!(
        html.contains("answered 401 (check the credentials)"),
        "{html}"
    );
    assert!(html.contains("<main data-source=\"gateway\">"), "{html}");
}

#[test]
fn v1_usage_reads_a_prometheus_over_https_with_a_token_or_basic_auth() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let pair = dir.path().join("basic");
    std::fs::write(&pair, "reader:s3cret\n").unwrap();
    let text = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let token_file = token.to_str().unwrap();
    let out = v1_usage_over_tls("Bearer t0ken", "", &["--prometheus-token-file", token_file]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("(every replica https://localhost:"),
        "{}",
        text(&out)
    );

    // "reader:s3cret" in base64, from a file or from the URL.
    let basic = "Basic cmVhZGVyOnMzY3JldA==";
    let pair_file = pair.to_str().unwrap();
    let out = v1_usage_over_tls(basic, "", &["--prometheus-basic-auth-file", pair_file]);
    assert!(out.status.success(), "{}", text(&out));
    let out = v1_usage_over_tls(basic, "reader:s3cret@", &["--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["agents"], serde_json::json!([]));

    // Refused credentials are named as such, and the password is never shown.
    let out = v1_usage_over_tls(basic, "reader:wrong@", &[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("answered 401 (check the credentials)"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("wrong"), "{}", text(&out));
}

/// A client that opens a TLS connection and sends its ClientHello a byte now and then (or
/// nothing at all) is cut off within `limits.client_header_timeout_ms`, as a slow request head
/// is: before, the handshake had 60 s, so each such connection held its place six times as
/// long as a slowloris on a plain listener.
#[tokio::test(start_paused = true)]
async fn a_slow_tls_handshake_is_cut_off_as_a_slow_head_is() {
    use common::paused::{slow_client, PausedBackend, PausedClient, PausedGateway};
    let pki = TestPki::localhost("slow");
    let backend = PausedBackend::start().await;
    let mut cfg = test_config(&[backend.addr]);
    pki.serve_on(&mut cfg);
    cfg.limits.client_header_timeout_ms = 3000;
    let gw = PausedGateway::start(&cfg).await;
    let started = tokio::time::Instant::now();
    // A handshake record announced 16 KiB long, its bytes sent one every 100 ms.
    let slow = slow_client(
        gw.proxy,
        &[0x16, 0x03, 0x01, 0x40, 0x00],
        &[0x01],
        Duration::from_millis(100),
    )
    .await;
    let mut silent = PausedClient::open(gw.proxy).await;
    let slow_cut = async {
        slow.await.unwrap();
        started.elapsed()
    };
    let silent_cut = async {
        silent.closed().await;
        started.elapsed()
    };
    let bound = Duration::from_secs(10);
    let (slow_after, silent_after) =
        tokio::time::timeout(bound, async { tokio::join!(slow_cut, silent_cut) })
            .await
            .expect("a slow or silent TLS client was not cut off within 10 s");
    for after in [slow_after, silent_after] {
        assert!(after < Duration::from_millis(3500), "{after:?}");
    }
}

/// A TLS client that closes (its close_notify, then its FIN) while its request waits for a
/// backend connection has the request sent nowhere, as a plaintext one does: the hang-up is
/// seen on the socket under the TLS stream, past the close_notify's bytes.
#[test]
fn a_tls_client_that_closes_while_its_request_waits_has_it_sent_nowhere() {
    let pki = TestPki::localhost("leaving");
    let gate = Gate::new();
    let (backend, mut cfg) = held_behind_one_connection(&gate);
    pki.serve_on(&mut cfg);
    let gw = Gateway::builder(cfg).start();
    let tls_client = || {
        let tls = rustls::ClientConnection::new(
            client_config(&pki.ca),
            ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        let tcp = TcpStream::connect(gw.proxy).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        rustls::StreamOwned::new(tls, tcp)
    };
    let mut first = tls_client();
    first.write_all(&verify_post_with_id("first")).unwrap();
    gw.wait_until("the first at the backend", || backend.count() == 1);
    let mut leaving = tls_client();
    leaving.write_all(&verify_post_with_id("gone")).unwrap();
    gw.wait_for_metric("agent_gateway_in_flight_requests", 2.0);
    leaving.conn.send_close_notify();
    leaving.flush().unwrap();
    drop(leaving);

    let answer = |stream| read_response(&mut BufReader::new(stream)).unwrap().status;
    let third = || {
        let mut third = tls_client();
        third.write_all(&verify_post_with_id("third")).unwrap();
        answer(third)
    };
    assert_sent_nowhere(&gw, &backend, &gate, || answer(first), third);
}
