//! Shared test harness: the real `agent-gateway` binary on free loopback ports, run on a typed
//! config ([`test_config`], changed field by field, spawned by [`Gateway::builder`]), a
//! recording backend that stores every request it receives, and a raw HTTP/1.1 client that
//! sends bytes exactly as written (so tests control framing, encodings and bad input).
#![allow(dead_code)]

pub mod otlp;
pub mod pki;
pub mod python;
pub mod redis;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::testing::{AGENT_ID, TOKEN};
use agent_gateway::config::{FileConfig, V1Policy};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-gateway");

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The harness's config: [`FileConfig::for_test`] (agent [`AGENT_ID`], token [`TOKEN`]) in
/// front of `upstreams`, with proxy and admin listeners on free loopback ports. Two threads and
/// a one-second grace period keep start and stop quick; the upstream timeouts are short so
/// tests of a dead or slow backend finish in a few seconds.
pub fn test_config(upstreams: &[SocketAddr]) -> FileConfig {
    let mut cfg = FileConfig::for_test(loopback(free_port()), upstreams);
    cfg.listen.admin = Some(loopback(free_port()).to_string());
    cfg.server.threads = 2;
    cfg.server.grace_period_seconds = 1;
    cfg.upstream.connect_timeout_ms = 500;
    cfg.upstream.read_timeout_ms = 2000;
    cfg
}

/// `agent-gateway mock-backend`, the v2 backend the demo runs, on a free loopback port.
/// Killed on drop.
pub struct MockBackend {
    pub addr: SocketAddr,
    child: Child,
}

impl MockBackend {
    /// Spawns it and waits until it accepts connections.
    pub fn start() -> MockBackend {
        let addr = loopback(free_port());
        let child = Command::new(BIN)
            .args(["mock-backend", "--listen", &addr.to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mock = MockBackend { addr, child };
        wait_listening(addr);
        mock
    }
}

impl Drop for MockBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running gateway process. Killed on drop.
pub struct Gateway {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// The config it was started with; reload tests change a copy and write it back.
    pub config: FileConfig,
    pub child: Child,
    /// Holds the log (and the config file, unless the test gave its own path) until drop.
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    /// What it printed on stdout (logs go to stderr, `log_path`).
    pub stdout_path: PathBuf,
}

/// How a test gateway is run: the config, the process's arguments and environment, and where
/// its config file is. [`GatewayBuilder::start`] is the one place a gateway is spawned.
pub struct GatewayBuilder {
    config: FileConfig,
    /// `run`, or `demo` (the gateway and the mock backend on `upstream.addresses[0]`).
    command: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    config_path: Option<PathBuf>,
}

impl Gateway {
    /// A gateway on `config`; its listeners are read from `config.listen`.
    pub fn builder(config: FileConfig) -> GatewayBuilder {
        GatewayBuilder {
            config,
            command: "run",
            args: Vec::new(),
            env: Vec::new(),
            config_path: None,
        }
    }

    /// The common case: a gateway on [`test_config`]`(upstreams)` as it is.
    pub fn start(upstreams: &[SocketAddr]) -> Gateway {
        Self::builder(test_config(upstreams)).start()
    }
}

impl GatewayBuilder {
    /// Runs `agent-gateway demo` instead of `run`: the mock v2 backend in the same process, on
    /// the config's first upstream address.
    pub fn demo(mut self) -> Self {
        self.command = "demo";
        self
    }

    /// An extra argument after `run --config <path>`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.into());
        self
    }

    /// An environment variable for the process; wins over the harness's `RUST_LOG=debug`.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs on a config file the test has already written (a layout the harness does not make,
    /// or the file of another running gateway) instead of writing the config to a fresh one.
    /// The file must hold the builder's config: the listeners waited for are taken from it.
    pub fn config_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_path = Some(path.into());
        self
    }

    /// Spawns the gateway and waits until both its listeners accept connections.
    pub fn start(self) -> Gateway {
        let proxy = listener(&self.config.listen.proxy, "listen.proxy");
        let admin = self
            .config
            .listen
            .admin
            .as_deref()
            .map(|a| listener(a, "listen.admin"))
            .expect("the harness needs an admin listener (test_config sets one)");
        let (dir, config_path, child, log_path) = self.spawn();
        let stdout_path = dir.path().join(STDOUT_FILE);
        let mut gw = Gateway {
            proxy,
            admin,
            config: self.config,
            child,
            dir,
            config_path,
            log_path,
            stdout_path,
        };
        gw.wait_listening();
        gw
    }

    /// Runs the gateway on a config it must refuse and returns how it exited; panics if it is
    /// still running after 10 s.
    pub fn exit_status(self) -> ExitStatus {
        let (_dir, _, mut child, log_path) = self.spawn();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("the gateway kept running on a config it should refuse; log:\n{log}");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `agent-gateway run --config <path> <args>`, stderr to a log file and stdout to another
    /// in a fresh directory.
    fn spawn(&self) -> (tempfile::TempDir, PathBuf, Child, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let config_path = match &self.config_path {
            Some(path) => path.clone(),
            None => {
                let path = dir.path().join("gateway.toml");
                std::fs::write(&path, self.config.to_toml()).unwrap();
                path
            }
        };
        let log_path = dir.path().join("gateway.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let stdout = std::fs::File::create(dir.path().join(STDOUT_FILE)).unwrap();
        let child = Command::new(BIN)
            .arg(self.command)
            .arg("--config")
            .arg(&config_path)
            .args(&self.args)
            .env("RUST_LOG", "debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .unwrap();
        (dir, config_path, child, log_path)
    }
}

/// The file in a gateway's directory that takes its stdout.
const STDOUT_FILE: &str = "stdout.txt";

/// A listener address of the config, as the harness connects to it.
fn listener(addr: &str, key: &str) -> SocketAddr {
    addr.parse()
        .unwrap_or_else(|e| panic!("{key} = {addr:?} is not an address to connect to: {e}"))
}

impl Gateway {
    /// Polls until both listeners accept connections (up to 20 s each). A process that exits
    /// first fails the test at once, with its log.
    fn wait_listening(&mut self) {
        for addr in [self.proxy, self.admin] {
            let deadline = Instant::now() + Duration::from_secs(20);
            while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                if let Some(status) = self.child.try_wait().unwrap() {
                    panic!(
                        "the gateway exited ({status}) before listening on {addr}; log:\n{}",
                        self.log()
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "{addr} never started listening; log:\n{}",
                    self.log()
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// What it has printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// Sends SIGTERM (through `kill`, so the test needs no libc binding).
    pub fn terminate(&self) {
        signal(self.child.id(), "TERM");
    }

    /// Scrapes `/metrics` and returns the value of one exact series (`name{labels}`), or 0.
    /// The gateway counts a request just after answering it, so a scrape right after a
    /// response could miss it: this waits (up to 5 s) for a scrape with nothing in flight.
    pub fn metric(&self, series: &str) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let body = get(self.admin, "/metrics").text();
            let idle = metric_value(&body, "agent_gateway_in_flight_requests") == Some(0.0);
            if idle || Instant::now() > deadline {
                return metric_value(&body, series).unwrap_or(0.0);
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The access-log lines written so far (target `agent_gateway::access`), parsed.
    pub fn access_log(&self) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "agent_gateway::access")
            .collect()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn signal(pid: u32, sig: &str) {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
}

/// The value of the sample `series` (exactly as printed, labels in exposition order).
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

/// Polls until `addr` accepts connections (up to 20 s).
pub fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "{addr} never started listening");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` until it holds (up to `secs`); panics with `what` otherwise.
pub fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(25));
    }
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP client
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Reads one response from `reader`; `None` if the connection closed before a status line.
pub fn read_response(reader: &mut impl BufRead) -> Option<Response> {
    let head = read_head(reader)?;
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut hs);
    parsed.parse(&head).ok()?;
    let status = parsed.code?;
    if status == 100 {
        return read_response(reader);
    }
    let headers = owned_headers(parsed.headers);
    // 204 and 304 have no body whatever their headers say; any other response without a
    // length runs to the end of the connection.
    let (body, _) = if status == 204 || status == 304 {
        (Vec::new(), false)
    } else {
        read_body(reader, &headers, true)?
    };
    Some(Response {
        status,
        headers,
        body,
    })
}

/// The header section of a message, up to and including its empty line.
fn read_head(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" || line == b"\n" {
            return Some(head);
        }
    }
}

fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}

/// A message body framed by `headers`: chunked, Content-Length, or (when `to_close`) the
/// rest of the connection. Also says whether it was chunked.
fn read_body(
    reader: &mut impl BufRead,
    headers: &[(String, String)],
    to_close: bool,
) -> Option<(Vec<u8>, bool)> {
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v)
    };
    if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return Some((read_chunked(reader)?, true));
    }
    let mut body = Vec::new();
    if let Some(len) = find("content-length") {
        body.resize(len.trim().parse().ok()?, 0);
        reader.read_exact(&mut body).ok()?;
    } else if to_close {
        let _ = reader.read_to_end(&mut body);
    }
    Some((body, false))
}

fn read_chunked(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
        if size == 0 {
            let mut end = String::new();
            reader.read_line(&mut end).ok()?;
            return Some(body);
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).ok()?;
        body.extend_from_slice(&chunk[..size]);
    }
}

/// Sends `raw` bytes on a new connection and reads one response.
pub fn raw(addr: SocketAddr, raw: &[u8]) -> Option<Response> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(raw).ok()?;
    read_response(&mut BufReader::new(s))
}

/// A request with `Connection: close` and the given extra header lines and body.
pub fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" || !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes).unwrap_or_else(|| panic!("no response to {method} {target}"))
}

/// A body valid for every POST operation: it has the required fields of all four schemas.
pub const BODY: &str = r#"{"business_code":"B","organization_name":"O","credential_def_id":"D"}"#;

/// The headers of an authenticated JSON request by [`AGENT_ID`].
pub const AUTH: [(&str, &str); 3] = [
    ("X-Service-Agent-Id", AGENT_ID),
    ("X-Auth-Token", TOKEN),
    ("Content-Type", "application/json"),
];

/// An authenticated JSON POST.
pub fn post(addr: SocketAddr, target: &str, body: &str) -> Response {
    request(addr, "POST", target, &AUTH, body.as_bytes())
}

/// An authenticated GET.
pub fn get(addr: SocketAddr, target: &str) -> Response {
    request(addr, "GET", target, &AUTH[..2], b"")
}

// ---------------------------------------------------------------------------------------------
// Recording backend
// ---------------------------------------------------------------------------------------------

/// One request as the backend received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub chunked: bool,
    /// 0 for the first request on its connection, 1 for the next (kept alive), ...
    pub on_connection: usize,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the backend does with a request it has read.
pub enum Action {
    /// 200 with this JSON body (Content-Length).
    Json(String),
    /// 200 with this body sent chunked in pieces of the given size.
    Chunked(Vec<u8>, usize),
    /// Wait, then answer like `Json`.
    Delay(Duration, String),
    /// Answer like `Json` (the connection looks kept alive), then close it.
    JsonThenClose(String),
    /// 200 with no length: the body ends when the connection closes.
    CloseDelimited(String),
    /// These bytes as the whole answer, written as they are; the connection stays open.
    Raw(Vec<u8>),
    /// These bytes as the answer, then, after the pause, more bytes nobody asked for on the
    /// same connection (which stays open).
    RawThenLate(Vec<u8>, Duration, Vec<u8>),
    /// Close the connection without answering.
    Close,
    /// Send the header and half the declared body, then close.
    CloseMidBody,
    /// Send the header and half the declared body, then stall for this long before closing.
    StallMidBody(Duration),
}

type Handler = Arc<dyn Fn(&Recorded) -> Action + Send + Sync>;

/// A real HTTP/1.1 listener that records every request and answers per its handler.
pub struct Backend {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
}

impl Backend {
    /// A backend that answers 200 with a ServiceAgentResponse echoing the path it saw.
    pub fn start() -> Backend {
        Self::with(|r| {
            Action::Json(format!(
                r#"{{"status_code":200,"message_code":0,"message":"OK","seen":"{}"}}"#,
                r.target
            ))
        })
    }

    pub fn with(handler: impl Fn(&Recorded) -> Action + Send + Sync + 'static) -> Backend {
        Self::on(TcpListener::bind("127.0.0.1:0").unwrap(), handler)
    }

    /// A default backend on a given address (e.g. one a dropped backend had).
    pub fn start_at(addr: SocketAddr) -> Backend {
        let listener = TcpListener::bind(addr).unwrap();
        Self::on(listener, |r| {
            Action::Json(format!(
                r#"{{"status_code":200,"message_code":0,"message":"OK","seen":"{}"}}"#,
                r.target
            ))
        })
    }

    fn on(
        listener: TcpListener,
        handler: impl Fn(&Recorded) -> Action + Send + Sync + 'static,
    ) -> Backend {
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Handler = Arc::new(handler);
        let (reqs, stop2) = (requests.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (reqs, handler) = (reqs.clone(), handler.clone());
                thread::spawn(move || serve_conn(conn, reqs, handler));
            }
        });
        Backend {
            addr,
            requests,
            stop,
        }
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    pub fn last(&self) -> Recorded {
        self.requests
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("backend received nothing")
    }

    pub fn all(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_conn(conn: TcpStream, reqs: Arc<Mutex<Vec<Recorded>>>, handler: Handler) {
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    let mut on_connection = 0;
    while let Some(mut rec) = read_request(&mut reader) {
        rec.on_connection = on_connection;
        on_connection += 1;
        reqs.lock().unwrap().push(rec.clone());
        let reply = |body: &str| {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Upstream-Path: {}\r\n\r\n{body}",
                body.len(),
                rec.target
            )
        };
        let ok = match handler(&rec) {
            Action::Json(body) => writer.write_all(reply(&body).as_bytes()).is_ok(),
            Action::Delay(d, body) => {
                thread::sleep(d);
                writer.write_all(reply(&body).as_bytes()).is_ok()
            }
            Action::Raw(bytes) => writer.write_all(&bytes).is_ok(),
            Action::RawThenLate(bytes, pause, late) => {
                let answered = writer.write_all(&bytes).is_ok();
                thread::sleep(pause);
                answered && writer.write_all(&late).is_ok()
            }
            Action::JsonThenClose(body) => {
                let _ = writer.write_all(reply(&body).as_bytes());
                return;
            }
            Action::CloseDelimited(body) => {
                let _ = writer.write_all(
                    format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{body}")
                        .as_bytes(),
                );
                return;
            }
            Action::Chunked(body, piece) => {
                let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
                for c in body.chunks(piece) {
                    out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                    out.extend_from_slice(c);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
                writer.write_all(&out).is_ok()
            }
            Action::Close => return,
            Action::CloseMidBody => {
                let _ = writer
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\":");
                return;
            }
            Action::StallMidBody(d) => {
                let _ = writer
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\":");
                thread::sleep(d);
                return;
            }
        };
        if !ok {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Recorded> {
    let head = read_head(reader)?;
    let mut hs = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut hs);
    req.parse(&head).ok()?;
    let headers = owned_headers(req.headers);
    let (body, chunked) = read_body(reader, &headers, false)?;
    Some(Recorded {
        method: req.method?.to_string(),
        target: req.path?.to_string(),
        headers,
        body,
        chunked,
        on_connection: 0,
    })
}

// ---------------------------------------------------------------------------------------------
// Observability: the shipped dashboard's queries, a mix of traffic for them
// ---------------------------------------------------------------------------------------------

/// The shipped Grafana dashboard.
pub const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/config/grafana/agent-gateway.json"
);

/// One PromQL query of a dashboard panel.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

/// The shipped dashboard, parsed.
pub fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(DASHBOARD).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel of a dashboard, those inside collapsed rows included.
pub fn dashboard_panels(dash: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels is a list") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// Every `expr` of every panel target.
pub fn dashboard_queries(dash: &serde_json::Value) -> Vec<PanelQuery> {
    let mut out = Vec::new();
    for p in dashboard_panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(PanelQuery {
                    panel: p["title"].as_str().unwrap_or("").to_string(),
                    ref_id: t["refId"].as_str().unwrap_or("").to_string(),
                    expr: expr.to_string(),
                });
            }
        }
    }
    out
}

/// The query text of each templating variable backed by the data source.
pub fn dashboard_variable_queries(dash: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().or(v["query"].as_str());
        out.push(q.expect("a query variable has a query").to_string());
    }
    out
}

/// The `agent_gateway_*` metric names a PromQL expression reads, in order of appearance
/// (string literals such as label values are skipped).
pub fn gateway_metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            // `$__rate_interval` and the like are Grafana variables, not identifiers.
            let is_variable = start > 0 && b[start - 1] == b'$';
            if !is_variable && word.starts_with("agent_gateway_") && !out.iter().any(|w| w == word)
            {
                out.push(word.to_string());
            }
        } else if c.is_ascii_digit() {
            // A number or duration (`5m`, `1e3`) is not the start of a name.
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Request bodies that satisfy the spec's schema for each POST operation.
pub const VERIFY_BODY: &str = r#"{"business_code":"KYC"}"#;
pub const INVITATION_BODY: &str = r#"{"organization_name":"Org"}"#;
pub const OFFER_BODY: &str = r#"{"organization_name":"Org","credential_def_id":"cred-def-1"}"#;
pub const VERIFY_RESPONSE_BODY: &str = r#"{"presentation_id":"p-1"}"#;

/// Two agents with token [`TOKEN`]: `retired`, whose v1 calls the retirement policy refuses
/// with 410 (and whose own deprecation and sunset dates have passed), and `throttled`, allowed
/// one request and then (for the next 1000 s) refused with 429.
pub fn mix_agents() -> [AgentFile; 2] {
    let retired = AgentFile {
        v1_policy: V1Policy::Block,
        deprecated_at: Some("2026-01-01T00:00:00Z".into()),
        sunset_at: Some("2026-06-01T00:00:00Z".into()),
        ..AgentFile::new("retired", TOKEN)
    };
    let throttled = AgentFile {
        rate_limit_per_second: Some(0.001),
        burst: Some(1),
        ..AgentFile::new("throttled", TOKEN)
    };
    [retired, throttled]
}

/// Headers of an authenticated JSON request by `agent` (token [`TOKEN`]).
pub fn agent_headers(agent: &str) -> [(&str, &str); 3] {
    [
        ("X-Service-Agent-Id", agent),
        ("X-Auth-Token", TOKEN),
        ("Content-Type", "application/json"),
    ]
}

/// Sends one request of every kind the dashboard charts, through `proxy` (which must reach a
/// backend that answers 200, and know `agent-1` and [`mix_agents`]): v1 and v2 by a
/// configured agent, a v1 call refused by the retirement policy, a body that breaks the
/// schema, a rate-limited call, a 401, a 404. Returns how many requests it sent.
pub fn send_traffic_mix(proxy: SocketAddr) -> usize {
    let throttled = agent_headers("throttled");
    let sent = [
        post(proxy, "/api/v1/verify/request", VERIFY_BODY).status,
        get(proxy, "/api/v1/transaction/tx-1/status").status,
        post(proxy, "/api/v2/connection/SVC/invitation", INVITATION_BODY).status,
        get(proxy, "/api/v2/transaction/tx-2/status").status,
        request(
            proxy,
            "POST",
            "/api/v1/verify/request",
            &agent_headers("retired"),
            VERIFY_BODY.as_bytes(),
        )
        .status,
        post(proxy, "/api/v2/verify/SVC/request", "{}").status,
        request(
            proxy,
            "GET",
            "/api/v2/transaction/tx-3/status",
            &throttled[..2],
            b"",
        )
        .status,
        request(
            proxy,
            "GET",
            "/api/v2/transaction/tx-4/status",
            &throttled[..2],
            b"",
        )
        .status,
        request(proxy, "POST", "/api/v1/credential/offer", &[], b"{}").status,
        post(proxy, "/not-an-operation", "{}").status,
    ];
    // The throttled agent's first call of the test passes; every later one is refused.
    let first_throttled = if sent[6] == 200 { 200 } else { 429 };
    assert_eq!(
        sent,
        [200, 200, 200, 200, 410, 400, first_throttled, 429, 401, 404],
        "traffic mix answers"
    );
    sent.len()
}

/// Agent `agent-2` (token [`testing::TOKEN`]), allowed only the service `ONLY`.
pub fn agent_2() -> AgentFile {
    AgentFile {
        services: Some(vec!["ONLY".into()]),
        ..AgentFile::new("agent-2", TOKEN)
    }
}

/// A backend that answers 200, except that it drops the connection on anything for `RESET`.
pub fn backend_with_reset() -> Backend {
    Backend::with(|r| {
        if r.target.contains("/RESET/") {
            Action::Close
        } else {
            Action::Json(r#"{"status_code":200,"message_code":0,"message":"OK"}"#.into())
        }
    })
}
