//! The edge, against the real server: who is calling (PROXY protocol v1 and v2 from raw
//! bytes, trusted `X-Forwarded-For`), guessers slowed down per address, token rotation
//! through the agents file under load, and the admin token.

mod common;

use std::io::{BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_gateway::config::file::{AgentFile, AgentsFile, Digests};
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::TokenDigest;
use agent_gateway::proxy::MAX_FAILED_AUTH_ADDRESSES;
use common::*;

fn digest(token: &str) -> String {
    TokenDigest::of(token.as_bytes()).to_hex()
}

/// `Basic` credentials (RFC 7617): what a browser sends once a user typed them.
fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// The challenge that makes a browser ask for a user name and password.
const BASIC_CHALLENGE: &str = "Basic realm=\"agent-gateway admin\", charset=\"UTF-8\"";

/// A browser's Fetch Metadata: `Sec-Fetch-Site`, `-Mode`, `-Dest` and `-User`.
type Fetch = [&'static str; 4];
/// Another site's page loads the URL as an image.
const IMAGE: Fetch = ["cross-site", "no-cors", "image", ""];
/// Another site's script sends the window there, with no click.
const SCRIPT_NAVIGATION: Fetch = ["cross-site", "navigate", "document", ""];
/// A person clicks a link (or submits a form) on another site's page.
const LINK_FOLLOWED: Fetch = ["cross-site", "navigate", "document", "?1"];
/// The listener's own page (the board reloading itself).
const OWN_PAGE: Fetch = ["same-origin", "navigate", "document", ""];
/// Typed into the address bar, or a bookmark.
const TYPED: Fetch = ["none", "navigate", "document", "?1"];

/// The headers a browser sends for `fetch` (an empty value: not sent).
fn fetch_metadata(fetch: Fetch) -> Vec<(&'static str, &'static str)> {
    [
        "Sec-Fetch-Site",
        "Sec-Fetch-Mode",
        "Sec-Fetch-Dest",
        "Sec-Fetch-User",
    ]
    .into_iter()
    .zip(fetch)
    .filter(|(_, value)| !value.is_empty())
    .collect()
}

/// Every `WWW-Authenticate` of `answer`, in order.
fn challenges(answer: &Response) -> Vec<&str> {
    headers_named(&answer.headers, "www-authenticate")
}

/// An authenticated GET of a v1 status by [`AGENT_ID`] with `token`, as raw bytes.
fn status_request(token: &str, extra: &str) -> Vec<u8> {
    format!(
        "GET /api/v1/transaction/tx-1/status HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\
         X-Service-Agent-Id: {AGENT_ID}\r\nX-Auth-Token: {token}\r\n{extra}\r\n"
    )
    .into_bytes()
}

/// Sends `bytes` to `to` from the local address `from` and reads one response; `None` when
/// the gateway closes the connection first.
fn send_from(from: IpAddr, to: SocketAddr, bytes: &[u8]) -> Option<Response> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::new(from, 0).into()).unwrap();
    socket.connect(&to.into()).unwrap();
    let mut stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream.write_all(bytes).ok()?;
    read_response(&mut BufReader::new(stream))
}

#[test]
fn proxy_protocol_v1_and_v2_name_the_client_and_a_broken_header_closes_the_connection() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.proxy_protocol = true;
    let gw = Gateway::builder(cfg).start();

    let mut v1 = b"PROXY TCP4 203.0.113.9 10.0.0.1 51000 8080\r\n".to_vec();
    v1.extend(status_request(
        TOKEN,
        "User-Agent: sdk/1.0\r\nX-Request-Id: pp-v1\r\n",
    ));
    let answer = raw(gw.proxy, &v1).expect("an answer after a v1 header");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        backend.last().header("x-forwarded-for"),
        Some("203.0.113.9")
    );
    let line = gw.access_line("pp-v1");
    assert_eq!(line["client_addr"], "203.0.113.9");
    assert_eq!(line["user_agent"], "sdk/1.0");

    let addresses: ppp::v2::Addresses = (
        "[2001:db8::7]:443".parse::<SocketAddr>().unwrap(),
        "[2001:db8::1]:8080".parse::<SocketAddr>().unwrap(),
    )
        .into();
    let mut v2 = ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Proxy,
        ppp::v2::Protocol::Stream,
        addresses,
    )
    .build()
    .unwrap();
    v2.extend(status_request(TOKEN, "X-Request-Id: pp-v2\r\n"));
    let answer = raw(gw.proxy, &v2).expect("an answer after a v2 header");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(gw.access_line("pp-v2")["client_addr"], "2001:db8::7");

    // A balancer's health check (LOCAL) keeps the TCP peer.
    let mut local = ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Local,
        ppp::v2::Protocol::Unspecified,
        ppp::v2::Addresses::Unspecified,
    )
    .build()
    .unwrap();
    local.extend(status_request(TOKEN, "X-Request-Id: pp-local\r\n"));
    assert_eq!(raw(gw.proxy, &local).unwrap().status, 200);
    assert_eq!(gw.access_line("pp-local")["client_addr"], "127.0.0.1");

    let forwarded = backend.count();
    let mut wrong_version = v2.clone();
    wrong_version[12] = 0x31;
    let broken: [&[u8]; 4] = [
        &status_request(TOKEN, ""),
        b"PROXY TCP4 999.0.113.9 10.0.0.1 51000 8080\r\nGET / HTTP/1.1\r\n\r\n",
        b"PROXY TCP9 203.0.113.9 10.0.0.1 51000 8080\r\nGET / HTTP/1.1\r\n\r\n",
        &wrong_version,
    ];
    for bytes in broken {
        assert!(
            raw(gw.proxy, bytes).is_none(),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(
        backend.count(),
        forwarded,
        "nothing of a broken header is forwarded"
    );

    // With trusted proxies, only they may send a header: any other peer is closed.
    let mut cfg = gw.config.clone();
    cfg.listen.trusted_proxies = vec!["10.0.0.0/8".into()];
    gw.reload(&cfg);
    assert!(
        raw(gw.proxy, &v1).is_none(),
        "a header from an untrusted peer"
    );
    assert_eq!(backend.count(), forwarded);
}

#[test]
fn a_relayed_connection_whose_source_the_header_does_not_give_has_no_client_to_believe() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.proxy_protocol = true;
    cfg.listen.trusted_proxies = vec!["127.0.0.0/8".into()];
    let gw = Gateway::builder(cfg).start();
    // A header, then a request with what the relayed client wrote, which the balancer
    // (trusted) passes on as it came; answered 200.
    let send = |mut header: Vec<u8>, id: &str| {
        let forged = "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n";
        header.extend(status_request(
            TOKEN,
            &format!("{forged}X-Request-Id: {id}\r\n"),
        ));
        let answer = raw(gw.proxy, &header).expect("an answer after the header");
        assert_eq!(answer.status, 200, "{id}: {}", answer.text());
    };
    send(b"PROXY UNKNOWN\r\n".to_vec(), "pp-unknown");
    assert_eq!(gw.access_line("pp-unknown")["client_addr"], "");
    let seen = backend.last();
    assert_eq!(seen.header("x-forwarded-for"), None);
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));

    // The balancer's own connection (LOCAL) is the balancer: a trusted proxy.
    let local = ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Local,
        ppp::v2::Protocol::Unspecified,
        ppp::v2::Addresses::Unspecified,
    )
    .build()
    .unwrap();
    send(local, "pp-local");
    assert_eq!(gw.access_line("pp-local")["client_addr"], "6.6.6.6");
}

#[test]
fn check_config_warns_of_proxy_headers_believed_from_any_host() {
    let mut cfg = test_config(&[SocketAddr::from(([127, 0, 0, 1], 9))]);
    cfg.listen.proxy_protocol = true;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let check = |cfg: &agent_gateway::config::FileConfig| {
        std::fs::write(&path, cfg.to_toml()).unwrap();
        let out = cli(["check-config", "--config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "a warning, not a refusal: {stderr}");
        stderr
    };
    let warned = check(&cfg);
    assert!(
        warned.contains("listen.trusted_proxies is empty"),
        "{warned}"
    );
    cfg.listen.trusted_proxies = vec!["10.0.0.0/8".into()];
    let quiet = check(&cfg);
    assert!(!quiet.contains("trusted_proxies"), "{quiet}");
}

#[test]
fn only_a_trusted_proxy_says_who_the_client_is_and_by_which_scheme() {
    // An empty X-Forwarded-For among them adds no entry.
    let extra = "X-Forwarded-For:\r\nX-Forwarded-For: 6.6.6.6, 198.51.100.1\r\n\
                 X-Forwarded-Proto: https\r\n";
    // (trusted proxies, the client logged, the scheme the backend is told)
    let cases = [
        (vec!["127.0.0.0/8".to_string()], "198.51.100.1", "https"),
        (Vec::new(), "127.0.0.1", "http"),
    ];
    for (i, (trusted, client, scheme)) in cases.into_iter().enumerate() {
        let backend = Backend::start();
        let mut cfg = test_config(&[backend.addr]);
        cfg.listen.trusted_proxies = trusted;
        let gw = Gateway::builder(cfg).start();
        let id = format!("xff-{i}");
        let head = format!("{extra}X-Request-Id: {id}\r\n");
        assert_eq!(
            raw(gw.proxy, &status_request(TOKEN, &head)).unwrap().status,
            200
        );
        assert_eq!(gw.access_line(&id)["client_addr"], client);
        let seen = backend.last();
        // The peer is appended whoever it is; the scheme is the gateway's unless trusted.
        let forwarded = "6.6.6.6, 198.51.100.1, 127.0.0.1";
        assert_eq!(seen.header("x-forwarded-for"), Some(forwarded));
        assert_eq!(seen.header("x-forwarded-proto"), Some(scheme));
    }
}

#[test]
fn an_ipv4_client_of_a_dual_stack_listener_is_its_ipv4_address() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.proxy = "[::]:0".into();
    // The balancer as a dual-stack listener shows an IPv4 peer, pasted from a log.
    cfg.listen.trusted_proxies = vec!["::ffff:127.0.0.1".into()];
    let gw = Gateway::builder(cfg).start();
    let by_ipv4 = SocketAddr::from(([127, 0, 0, 1], gw.proxy.port()));
    let head = "X-Forwarded-For: 198.51.100.1\r\nX-Request-Id: dual-stack\r\n";
    let answer = raw(by_ipv4, &status_request(TOKEN, head)).expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(gw.access_line("dual-stack")["client_addr"], "198.51.100.1");
    assert_eq!(
        backend.last().header("x-forwarded-for"),
        Some("198.51.100.1, 127.0.0.1")
    );
}

#[test]
fn a_guessing_address_gets_429_while_another_keeps_working() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.max_failures_per_minute = Some(3);
    cfg.retirement.deprecated_at = Some("2026-01-01T00:00:00Z".into());
    let gw = Gateway::builder(cfg).start();
    let guesser: IpAddr = "127.0.0.2".parse().unwrap();
    let client: IpAddr = "127.0.0.1".parse().unwrap();
    for i in 0..3 {
        let wrong = send_from(
            guesser,
            gw.proxy,
            &status_request(&format!("guess-{i}"), ""),
        );
        assert_eq!(wrong.unwrap().status, 401);
    }
    // Past the limit, even the right token is not checked.
    for _ in 0..2 {
        let refused = send_from(guesser, gw.proxy, &status_request(TOKEN, "")).unwrap();
        assert_eq!(refused.status, 429, "{}", refused.text());
        assert_eq!(refused.json()["message_code"], 42902);
        let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        // A v1 call's answer, with a v1 call's signals.
        assert_eq!(refused.header("deprecation"), Some("@1767225600"));
    }
    let fine = send_from(client, gw.proxy, &status_request(TOKEN, "")).unwrap();
    assert_eq!(fine.status, 200, "{}", fine.text());
    assert_eq!(gw.metric("agent_gateway_auth_throttled_total"), 2.0);
    // Counted with the v1 calls they are, though their credentials were never checked.
    assert_eq!(
        gw.metric(
            "agent_gateway_requests_total{api_version=\"v1\",code=\"429\",operation=\"transaction_status\"}"
        ),
        2.0
    );
    let log = gw.log();
    assert_eq!(
        log.matches("too many failed authentications").count(),
        1,
        "{log}"
    );
}

/// A guess spread over more addresses than the throttle keeps: each address past
/// [`MAX_FAILED_AUTH_ADDRESSES`] in the minute is not tracked, and its 401 is counted as such, so the
/// spread shows on a dashboard. The addresses come from a trusted proxy's X-Forwarded-For,
/// pipelined over a few connections.
#[test]
fn failures_past_the_tracked_addresses_are_counted_as_untracked() {
    const CONNECTIONS: u32 = 4;
    let spread = MAX_FAILED_AUTH_ADDRESSES as u32 + 2;
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.max_failures_per_minute = Some(5);
    cfg.listen.trusted_proxies = vec!["127.0.0.1".into()];
    let gw = Gateway::builder(cfg).log_level("warn").start();
    let start = std::time::Instant::now();
    let senders: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let proxy = gw.proxy;
            std::thread::spawn(move || {
                let mut conn = Connection::open(proxy);
                let mut reader = conn.reader.get_ref().try_clone().unwrap();
                let answers = std::thread::spawn(move || {
                    let mut reader = BufReader::with_capacity(1 << 16, &mut reader);
                    let mut unauthorized = 0;
                    while let Some(answer) = read_response(&mut reader) {
                        unauthorized += u32::from(answer.status == 401);
                    }
                    unauthorized
                });
                let mut batch = Vec::new();
                let mine = (c..spread).step_by(CONNECTIONS as usize);
                let last = mine.clone().next_back();
                for n in mine {
                    let close = if Some(n) == last {
                        "close"
                    } else {
                        "keep-alive"
                    };
                    let client = std::net::Ipv4Addr::from_bits((10 << 24) + n);
                    batch.extend_from_slice(
                        format!(
                            "GET {STATUS_V1} HTTP/1.1\r\nHost: gw\r\nConnection: {close}\r\n\
                             X-Forwarded-For: {client}\r\nX-Service-Agent-Id: {AGENT_ID}\r\n\
                             X-Auth-Token: wrong\r\n\r\n"
                        )
                        .as_bytes(),
                    );
                    if batch.len() > 1 << 16 {
                        conn.send(&batch);
                        batch.clear();
                    }
                }
                conn.send(&batch);
                answers.join().unwrap()
            })
        })
        .collect();
    let unauthorized: u32 = senders.into_iter().map(|s| s.join().unwrap()).sum();
    assert_eq!(unauthorized, spread, "every guess got its 401");
    // Each address's window lasts a minute from its first failure: the count holds for a
    // run shorter than that (about 4 s here).
    let took = start.elapsed();
    assert_eq!(
        gw.metric("agent_gateway_auth_failures_untracked_total"),
        2.0,
        "the guesses took {took:?}; past a minute the first windows are over and make room"
    );
    assert_eq!(
        gw.metric("agent_gateway_auth_failures_total{reason=\"bad_token\"}"),
        f64::from(spread)
    );
}

#[test]
fn a_token_rotates_through_the_agents_file_under_load_with_no_failed_request() {
    let backend = Backend::start();
    let dir = tempfile::tempdir().unwrap();
    // The agents file as a Kubernetes Secret mounts it: a symlink through `..data`.
    let secret = dir.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    let agents = |tokens: &[&str]| {
        let mut agent = AgentFile::new(AGENT_ID, TOKEN);
        agent.token_sha256 = Digests(tokens.iter().map(|t| digest(t)).collect());
        toml::to_string(&AgentsFile {
            agents: vec![agent],
        })
        .unwrap()
    };
    let swap = |n: usize, text: &str| {
        let version = secret.join(format!("..v{n}"));
        std::fs::create_dir(&version).unwrap();
        std::fs::write(version.join("agents.toml"), text).unwrap();
        let link = secret.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..v{n}"), &link).unwrap();
        std::fs::rename(&link, secret.join("..data")).unwrap();
    };
    swap(1, &agents(&["old-token"]));
    std::os::unix::fs::symlink("..data/agents.toml", secret.join("agents.toml")).unwrap();
    let mut cfg = test_config(&[backend.addr]);
    cfg.auth.agents.clear();
    cfg.auth.agents_file = Some("secret/agents.toml".into());
    let gw = Gateway::builder(cfg)
        .config_path(dir.path().join("gateway.toml"))
        .start();

    let use_new = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (use_new, stop) = (use_new.clone(), stop.clone());
            let (sent, failed, proxy) = (sent.clone(), failed.clone(), gw.proxy);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let token = if use_new.load(Ordering::Relaxed) {
                        "new-token"
                    } else {
                        "old-token"
                    };
                    let status = raw(proxy, &status_request(token, "")).map(|r| r.status);
                    sent.fetch_add(1, Ordering::Relaxed);
                    if status != Some(200) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let sent_past = |n: usize| {
        let at = sent.load(Ordering::Relaxed) + n;
        wait_until("requests sent", || sent.load(Ordering::Relaxed) >= at);
    };
    sent_past(50);
    // 1. Add the new token beside the old one.
    swap(2, &agents(&["old-token", "new-token"]));
    gw.wait_for_metric("agent_gateway_config_generation", 2.0);
    sent_past(50);
    // 2. The client moves to the new token.
    use_new.store(true, Ordering::Relaxed);
    sent_past(50);
    // 3. The old token is no longer used: remove it.
    swap(3, &agents(&["new-token"]));
    gw.wait_for_metric("agent_gateway_config_generation", 3.0);
    sent_past(50);
    stop.store(true, Ordering::Relaxed);
    for thread in load {
        thread.join().unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "of {}",
        sent.load(Ordering::Relaxed)
    );
    let scrape = gw.scrape();
    for token in ["old-token", "new-token"] {
        let label = &digest(token)[..8];
        let series = format!(
            "agent_gateway_agent_token_last_used_timestamp_seconds{{agent_id=\"{AGENT_ID}\",token=\"{label}\"}}"
        );
        assert!(
            metric_value(&scrape, &series).is_some_and(|t| t > 0.0),
            "{series}"
        );
    }
    let old = raw(gw.proxy, &status_request("old-token", "")).unwrap();
    assert_eq!(old.status, 401, "the removed token fails");

    // A broken agents file keeps the last good agents, and says why.
    swap(4, "[[agents]]\nid = \"agent-1\"\ntoken_sha256 = \"nope\"\n");
    gw.wait_for_metric(
        "agent_gateway_config_reloads_total{result=\"failure\"}",
        1.0,
    );
    assert_eq!(
        raw(gw.proxy, &status_request("new-token", ""))
            .unwrap()
            .status,
        200
    );
    assert!(gw.log().contains("agents[0].token_sha256"), "{}", gw.log());
}

/// An address of this host that is not loopback: the one the kernel would send from towards
/// a documentation address (a UDP `connect` sends nothing). A connection from it to this host's
/// own listener arrives as another host's would.
fn this_hosts_other_address() -> IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    probe
        .connect("198.51.100.1:9")
        .expect("this test needs an address that is not loopback: a route off the host");
    let ip = probe.local_addr().unwrap().ip();
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    ip
}

/// A gateway with no admin token and its admin listener on every address: its backend, the
/// gateway, and the listener by loopback and by this host's other address.
fn without_an_admin_token() -> (Backend, Gateway, SocketAddr, SocketAddr) {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.admin = Some("0.0.0.0:0".into());
    let gw = Gateway::builder(cfg).start();
    let port = gw.admin.port();
    let local = SocketAddr::from(([127, 0, 0, 1], port));
    let remote = SocketAddr::new(this_hosts_other_address(), port);
    (backend, gw, local, remote)
}

#[test]
fn without_an_admin_token_the_admin_endpoints_answer_loopback_only() {
    let (_backend, _gw, local, remote) = without_an_admin_token();
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(admin_get(remote, open).status, 200, "{open}");
    }
    for admin in ["/config", "/v1-usage", "/openapi.json", "/"] {
        let refused = admin_get(remote, admin);
        assert_eq!(refused.status, 403, "{admin}");
        assert_eq!(refused.json()["message_code"], 40300);
        assert!(refused.json()["message"]
            .as_str()
            .is_some_and(|m| m.contains("admin.token_sha256")));
        assert_eq!(admin_get(local, admin).status, 200, "{admin}");
    }
    assert_eq!(request(remote, "POST", "/-/reload", &[], b"").status, 403);
    assert_eq!(request(local, "POST", "/-/reload", &[], b"").status, 200);

    // A browser on this host presents its loopback address by itself: not for what another
    // site's page makes it ask for. A link a person followed opens the board, never a reload.
    let board = |fetch| request(local, "GET", "/", &fetch_metadata(fetch), b"");
    let image = board(IMAGE);
    assert_eq!(image.status, 403);
    assert_eq!(image.json()["message_code"], 40301);
    assert_eq!(board(SCRIPT_NAVIGATION).status, 403);
    assert_eq!(board(LINK_FOLLOWED).status, 200);
    assert_eq!(board(OWN_PAGE).status, 200);
    let reload = |fetch| request(local, "POST", "/-/reload", &fetch_metadata(fetch), b"");
    assert_eq!(
        reload(LINK_FOLLOWED).status,
        403,
        "a form another site submits"
    );
    assert_eq!(reload(OWN_PAGE).status, 200);
}

#[test]
fn without_an_admin_token_loopback_is_both_ends_a_loopback_name_and_a_page_of_its_own() {
    let (_backend, _gw, local, pods_address) = without_an_admin_token();
    let port = local.port();
    let generation = || admin_get(local, "/config").json()["generation"].clone();
    let before = generation();

    // A sidecar proxy (Istio's) relays its network from a loopback address to the pod's.
    let relayed = send_from(
        IpAddr::from([127, 0, 0, 6]),
        pods_address,
        b"POST /-/reload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .expect("an answer");
    assert_eq!(relayed.status, 403);
    assert_eq!(relayed.json()["message_code"], 40300);

    // DNS rebinding: another site's name, made to resolve to 127.0.0.1; from loopback, by a
    // browser that sends no Fetch Metadata to a name that is not a loopback one.
    let rebound = [("Host", "rebind.attacker.example:9090")];
    for (method, path) in [
        ("GET", "/config"),
        ("GET", "/v1-usage"),
        ("POST", "/-/reload"),
    ] {
        let refused = request(local, method, path, &rebound, b"");
        assert_eq!(refused.status, 403, "{method} {path}");
        assert_eq!(refused.json()["message_code"], 40302);
    }
    assert_eq!(request(local, "GET", "/metrics", &rebound, b"").status, 200);
    for name in ["localhost", "127.0.0.1", "[::1]"] {
        let host = format!("{name}:{port}");
        let named = request(local, "GET", "/config", &[("Host", &host)], b"");
        assert_eq!(named.status, 200, "{host}");
    }

    // A form on another site's page, posted by a browser that sends no Fetch Metadata: its
    // Origin says where it comes from.
    let form = |origin: &str| request(local, "POST", "/-/reload", &[("Origin", origin)], b"");
    let forged = form("http://attacker.example");
    assert_eq!(forged.status, 403);
    assert_eq!(forged.json()["message_code"], 40301);
    assert_eq!(form("null").status, 403);
    assert_eq!(generation(), before, "no refused request reloaded");
    assert_eq!(form(&format!("http://127.0.0.1:{port}")).status, 200);
    let after_one = generation();
    assert_ne!(after_one, before);

    // A body that cannot be read is not acted on.
    let broken = raw(
        local,
        b"POST /-/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    )
    .expect("an answer");
    assert_eq!(broken.status, 400);
    assert_eq!(broken.json()["message_code"], 40001);
    assert_eq!(generation(), after_one);
}

#[test]
fn with_an_admin_token_only_the_probes_and_metrics_are_open() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.admin.token_sha256 = Digests(vec![digest("admin-old"), digest("admin-new")]);
    let gw = Gateway::builder(cfg.clone()).process().start();
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(admin_get(gw.admin, open).status, 200, "{open}");
    }
    for closed in ["/config", "/v1-usage", "/openapi.json", "/"] {
        let refused = admin_get(gw.admin, closed);
        assert_eq!(refused.status, 401, "{closed}");
        assert_eq!(challenges(&refused), ["Bearer", BASIC_CHALLENGE]);
        assert_eq!(refused.json()["message_code"], 40100);
        let wrong = request(
            gw.admin,
            "GET",
            closed,
            &[("Authorization", "Bearer nope")],
            b"",
        );
        assert_eq!(wrong.status, 401, "{closed}");
        for token in ["admin-old", "admin-new"] {
            for authorization in [format!("Bearer {token}"), basic("on-call", token)] {
                let allowed = request(
                    gw.admin,
                    "GET",
                    closed,
                    &[("Authorization", &authorization)],
                    b"",
                );
                assert_eq!(allowed.status, 200, "{closed} {authorization}");
            }
        }
        let wrong = request(
            gw.admin,
            "GET",
            closed,
            &[("Authorization", &basic("admin-new", "nope"))],
            b"",
        );
        assert_eq!(
            wrong.status, 401,
            "{closed}: the user name is not the token"
        );
    }
    // A reload changes the gateway: the bearer token only, never a browser's Basic credentials.
    let refused = request(gw.admin, "POST", "/-/reload", &[], b"");
    assert_eq!(refused.status, 401);
    assert_eq!(challenges(&refused), ["Bearer"]);
    let by_basic = request(
        gw.admin,
        "POST",
        "/-/reload",
        &[("Authorization", &basic("on-call", "admin-new"))],
        b"",
    );
    assert_eq!(by_basic.status, 401);
    assert_eq!(challenges(&by_basic), ["Bearer"]);
    // A browser's Basic credentials on what another site's page made it ask for: refused.
    // From the board's own page, typed, or a link a person followed: served.
    let board_by = |authorization: &str, fetch| {
        let mut headers = fetch_metadata(fetch);
        headers.push(("Authorization", authorization));
        request(gw.admin, "GET", "/", &headers, b"")
    };
    let browser = basic("on-call", "admin-new");
    let image = board_by(&browser, IMAGE);
    assert_eq!(image.status, 403);
    assert_eq!(image.json()["message_code"], 40301);
    assert_eq!(board_by(&browser, SCRIPT_NAVIGATION).status, 403);
    for fetch in [LINK_FOLLOWED, OWN_PAGE, TYPED] {
        assert_eq!(board_by(&browser, fetch).status, 200, "{fetch:?}");
    }
    // A bearer token, which no browser sends by itself, whatever the request says of itself.
    assert_eq!(board_by("Bearer admin-new", IMAGE).status, 200);

    // The CLI's admin client sends the token from a file.
    let token_file = gw.dir.path().join("admin-token");
    std::fs::write(&token_file, "admin-new\n").unwrap();
    let admin_url = format!("http://{}", gw.admin);
    let out = cli(["v1-usage", "--admin", &admin_url, "--json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--admin-token-file"));
    let token_arg = token_file.display().to_string();
    let out = cli([
        "v1-usage",
        "--admin",
        &admin_url,
        "--admin-token-file",
        &token_arg,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // protect_metrics closes /metrics too, live.
    cfg.admin.protect_metrics = true;
    gw.write_config(&cfg);
    let reloaded = request(
        gw.admin,
        "POST",
        "/-/reload",
        &[("Authorization", "Bearer admin-old")],
        b"",
    );
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    assert_eq!(admin_get(gw.admin, "/metrics").status, 401);
    assert_eq!(admin_get(gw.admin, "/healthz").status, 200);
}

/// A request refused on its head is answered at once, its body never read, and its
/// connection closed: a caller with no right to the admin listener cannot make it read a body
/// without end. An admitted one's body is read, to 64 KiB, before anything is done.
#[test]
fn an_admin_request_is_refused_before_its_body_is_read_and_a_long_body_is_refused() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.admin.token_sha256 = Digests(vec![digest("admin-token")]);
    let gw = Gateway::builder(cfg).start();
    let generation = || {
        let answer = request(
            gw.admin,
            "GET",
            "/config",
            &[("Authorization", "Bearer admin-token")],
            b"",
        );
        answer.json()["generation"].clone()
    };
    let before = generation();

    // No token, and a chunked body that has only begun.
    let mut c = Connection::open(gw.admin);
    c.send(
        b"POST /-/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n",
    );
    c.send([b'x'; 0x800]);
    let refused = c.response();
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["message_code"], 40100);
    // Closed after the answer: an end, or a reset for the body left unread; a connection
    // kept open would time out here instead.
    let mut rest = Vec::new();
    match std::io::Read::read_to_end(&mut c.reader, &mut rest) {
        Ok(_) => assert!(rest.is_empty(), "{rest:?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }

    // The token, and a body longer than any admin client sends.
    let long = request(
        gw.admin,
        "POST",
        "/-/reload",
        &[("Authorization", "Bearer admin-token")],
        &[b'x'; 64 * 1024 + 1],
    );
    assert_eq!(long.status, 413);
    assert_eq!(long.json()["message_code"], 41300);
    assert_eq!(generation(), before, "nothing was reloaded");

    // A short one is read and the reload done.
    let reloaded = request(
        gw.admin,
        "POST",
        "/-/reload",
        &[("Authorization", "Bearer admin-token")],
        b"{}",
    );
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    assert_ne!(generation(), before);
}

/// Headers other than `X-Forwarded-Proto` and `X-Forwarded-For` by which frameworks learn the
/// scheme (Rack and Spring read `X-Forwarded-Ssl: on` and `X-Forwarded-Scheme`, Rack before
/// `X-Forwarded-Proto`), the path prefix (`X-Forwarded-Prefix`: Spring, Werkzeug, ASP.NET) or
/// the client's address (`Client-IP`: Rails; `True-Client-IP`, `X-Client-IP`,
/// `X-Cluster-Client-IP`) are a client's own word, as `Forwarded` and `X-Real-IP` are: a
/// client of a plain-HTTP listener would be served as if it had come over TLS, or with links
/// under a prefix of its choosing.
#[test]
fn a_client_s_word_on_its_scheme_prefix_or_address_does_not_reach_the_backend() {
    let backend = Backend::start();
    let gw = Gateway::start(&[backend.addr]);
    let claims = [
        ("X-Forwarded-Ssl", "on"),
        ("X-Forwarded-Scheme", "https"),
        ("X-Forwarded-Prefix", "/evil"),
        ("Client-IP", "10.0.0.1"),
        ("True-Client-IP", "10.0.0.1"),
        ("X-Client-IP", "10.0.0.1"),
        ("X-Cluster-Client-IP", "10.0.0.1"),
    ];
    let mut head = String::new();
    for (name, value) in claims {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let answer = raw(gw.proxy, &status_request(TOKEN, &head)).expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = backend.last();
    for (name, _) in claims {
        assert_eq!(seen.header(name), None, "{name} reached the backend");
    }
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    // Written with underscores, as CGI reads them, they are refused as the others are.
    let aliased = status_request(TOKEN, "X_Forwarded_Ssl: on\r\n");
    let refused = raw(gw.proxy, &aliased).expect("an answer");
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(refused.json()["message_code"], 40004);
}

/// An empty `X-Forwarded-For` line is ignored wherever it is: the backend gets no empty entry
/// (and the client on its right), and the gateway, too, takes the client from the entries.
#[test]
fn an_empty_x_forwarded_for_after_the_client_does_not_make_the_proxy_the_client() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.trusted_proxies = vec!["127.0.0.0/8".into()];
    let gw = Gateway::builder(cfg).start();
    let head = "X-Forwarded-For: 198.51.100.1\r\nX-Forwarded-For:\r\nX-Request-Id: xff-empty\r\n";
    let answer = raw(gw.proxy, &status_request(TOKEN, head)).expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        backend.last().header("x-forwarded-for"),
        Some("198.51.100.1, 127.0.0.1")
    );
    assert_eq!(gw.access_line("xff-empty")["client_addr"], "198.51.100.1");
}

/// The admin listener answers everyone its probes: a client that sends a request head a
/// byte now and then, or nothing, must not hold a connection (a file descriptor the proxy
/// listener shares) for longer than a slow head on the proxy listener may.
#[tokio::test(start_paused = true)]
async fn a_slow_head_on_the_admin_listener_is_cut_off() {
    use common::paused::{slow_client, PausedBackend, PausedGateway};
    let backend = PausedBackend::start().await;
    let mut cfg = test_config(&[backend.addr]);
    cfg.limits.client_header_timeout_ms = 3000;
    let gw = PausedGateway::start(&cfg).await;
    let started = tokio::time::Instant::now();
    let slow = slow_client(
        gw.admin,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ",
        b"x",
        Duration::from_millis(100),
    )
    .await;
    tokio::time::timeout(Duration::from_secs(30), slow)
        .await
        .expect("a slow head on the admin listener was not cut off within 30 s")
        .unwrap();
    let after = started.elapsed();
    assert!(after < Duration::from_millis(3500), "{after:?}");

    // Nor is one that sends empty lines now and then, which a parser skips before a request
    // line: they end no head.
    let started = tokio::time::Instant::now();
    let blank = slow_client(gw.admin, b"\r\n", b"\r\n", Duration::from_millis(500)).await;
    tokio::time::timeout(Duration::from_secs(30), blank)
        .await
        .expect("empty lines held an admin connection past 30 s")
        .unwrap();
    let after = started.elapsed();
    assert!(after < Duration::from_millis(3500), "{after:?}");

    // A connection that sends nothing is cut off as soon.
    let mut silent = common::paused::PausedClient::open(gw.admin).await;
    let started = tokio::time::Instant::now();
    assert!(silent.closed().await);
    assert!(started.elapsed() < Duration::from_millis(3500));

    // A kept-alive connection between requests is not a slow head: its next request, longer
    // than the timeout after its last, is answered.
    let probe = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let mut kept = common::paused::PausedClient::open(gw.admin).await;
    kept.send(probe).await;
    assert_eq!(kept.status().await.unwrap(), 200);
    tokio::time::sleep(Duration::from_secs(5)).await;
    kept.send(probe).await;
    assert_eq!(kept.status().await.unwrap(), 200);
}

/// A balancer's PROXY v1 header may reach the gateway in pieces, split wherever TCP splits it:
/// each piece is waited for until the header's line ends. `ppp` takes a line cut just after the
/// space before the destination port for a malformed one (an empty port), which closed the
/// connection of a client the balancer had relayed.
#[test]
fn a_proxy_v1_header_split_anywhere_is_waited_for() {
    let backend = Backend::start();
    let mut cfg = test_config(&[backend.addr]);
    cfg.listen.proxy_protocol = true;
    cfg.listen.trusted_proxies = vec!["127.0.0.1".into()];
    let gw = Gateway::builder(cfg).start();
    let header = b"PROXY TCP4 203.0.113.9 10.0.0.1 51000 8080\r\n";
    let cut = header.len() - "8080\r\n".len();
    for (i, at) in [cut, cut - 1, 6, header.len() - 1].into_iter().enumerate() {
        let id = format!("pp-split-{i}");
        let mut stream = TcpStream::connect(gw.proxy).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(&header[..at]).unwrap();
        // The first piece is read alone.
        std::thread::sleep(Duration::from_millis(200));
        let mut rest = header[at..].to_vec();
        rest.extend(status_request(TOKEN, &format!("X-Request-Id: {id}\r\n")));
        let answer = stream
            .write_all(&rest)
            .ok()
            .and_then(|()| read_response(&mut BufReader::new(stream)));
        let head = String::from_utf8_lossy(&header[..at]);
        let answer = answer.unwrap_or_else(|| panic!("closed after {head:?}"));
        assert_eq!(answer.status, 200, "{head:?}: {}", answer.text());
        assert_eq!(gw.access_line(&id)["client_addr"], "203.0.113.9");
    }
}
