//! Backends for the gateway to forward to: a recording HTTP/1.1 listener that stores every
//! request it reads and answers as the test's handler says (scripted bytes, stalls, closes,
//! answers held until the test opens a [`Gate`]), and `agent-gateway mock-backend`, the v2
//! backend the demo runs.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use agent_gateway::config::FileConfig;

use super::client::{
    header, owned_headers, raw, read_body, read_head, verify_post_with_id, Response,
};
use super::gateway::{Gateway, BIN};
use super::ports::{free_port, loopback, ClosedPort};
use super::process::{kill, poll_until};
use super::test_config;

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
        header(&self.headers, name)
    }
}

/// What the backend does with a request it has read.
pub enum Action {
    /// 200 with this JSON body (Content-Length).
    Json(String),
    /// 200 with this body sent chunked in pieces of the given size.
    Chunked(Vec<u8>, usize),
    /// Holds the answer until the gate opens, then answers like `Json`.
    AfterGate(Gate, String),
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
    /// Never answer: hold the connection until the gateway closes it.
    Hang,
    /// Send the header and half the declared body, then close.
    CloseMidBody,
    /// Send the header and half the declared body, then hold the connection until the
    /// gateway closes it.
    StallMidBody,
}

/// The head and the first half of a body of 100 bytes, for the mid-body failures.
const HALF_AN_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\":";

/// A latch that [`Action::AfterGate`] answers wait on until the test opens it: the test
/// decides when the backend answers, never a timer.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Lets every held answer, and every later one, go.
    pub fn open(&self) {
        let (open, changed) = &*self.0;
        *open.lock().unwrap() = true;
        changed.notify_all();
    }

    pub fn wait(&self) {
        let (open, changed) = &*self.0;
        let mut is_open = open.lock().unwrap();
        while !*is_open {
            is_open = changed.wait(is_open).unwrap();
        }
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Action + Send + Sync>;

/// A real HTTP/1.1 listener that records every request and answers per its handler. Dropping
/// it closes its listener (connections already open stay served).
pub struct Backend {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    completed: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

/// The 200 the default backend answers: a ServiceAgentResponse echoing the path it saw.
fn echo(r: &Recorded) -> Action {
    Action::Json(echoed(r))
}

/// The body of [`echo`]'s answer.
fn echoed(r: &Recorded) -> String {
    format!(
        r#"{{"status_code":200,"message_code":0,"message":"OK","seen":"{}"}}"#,
        r.target
    )
}

impl Backend {
    /// A backend that answers 200 with a ServiceAgentResponse echoing the path it saw.
    pub fn start() -> Backend {
        Self::with(echo)
    }

    /// A default backend whose answers wait for `gate`.
    pub fn gated(gate: &Gate) -> Backend {
        let gate = gate.clone();
        Self::with(move |r| Action::AfterGate(gate.clone(), echoed(r)))
    }

    pub fn with(handler: impl Fn(&Recorded) -> Action + Send + Sync + 'static) -> Backend {
        Self::on(TcpListener::bind("127.0.0.1:0").unwrap(), handler)
    }

    /// A default backend on the port `closed` holds, until it is dropped.
    pub fn start_on(closed: &ClosedPort) -> Backend {
        Self::on(closed.listen(), echo)
    }

    /// A default backend on `listener` (another loopback address than 127.0.0.1, say).
    pub fn listening(listener: TcpListener) -> Backend {
        Self::on(listener, echo)
    }

    fn on(
        listener: TcpListener,
        handler: impl Fn(&Recorded) -> Action + Send + Sync + 'static,
    ) -> Backend {
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let completed = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Handler = Arc::new(handler);
        let (reqs, done, stopped) = (requests.clone(), completed.clone(), stop.clone());
        let accepting = thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (reqs, done, handler) = (reqs.clone(), done.clone(), handler.clone());
                thread::spawn(move || serve_conn(conn, reqs, done, handler));
            }
        });
        Backend {
            addr,
            requests,
            completed,
            stop,
            accepting: Some(accepting),
        }
    }

    /// How many requests it has read.
    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// How many answers it has carried out to the end: every byte written, late bytes too,
    /// and the connection closed where its action closes it.
    pub fn completed(&self) -> usize {
        self.completed.load(Ordering::SeqCst)
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

    /// The `X-Request-Id` of each request it has read, in order.
    pub fn request_ids(&self) -> Vec<String> {
        let requests = self.requests.lock().unwrap();
        let id = |r: &Recorded| r.header("x-request-id").unwrap_or_default().to_owned();
        requests.iter().map(id).collect()
    }
}

/// What a test of a request whose client left while it waited behind `first` checks: the
/// request `gone` is logged 499 with `client_aborted`, the backend never sees it, and its place
/// went on: `first` (its status once `gate` opens) and `third`, sent after it, reach the
/// backend, in that order.
pub fn assert_sent_nowhere(
    gw: &Gateway,
    backend: &Backend,
    gate: &Gate,
    first: impl FnOnce() -> u16,
    third: impl FnOnce() -> u16,
) {
    let line = gw.access_line("gone");
    assert_eq!(line["status"], 499, "{line}");
    assert_eq!(line["client_aborted"], true, "{line}");
    gate.open();
    assert_eq!(first(), 200);
    assert_eq!(third(), 200);
    assert_eq!(backend.request_ids(), ["first", "third"]);
}

/// The v1 verify POST with the request id `id`, sent to `gw` on a thread of its own; its
/// answer.
pub fn post_on_a_thread(gw: &Gateway, id: &str) -> JoinHandle<Option<Response>> {
    let (proxy, request) = (gw.proxy, verify_post_with_id(id));
    thread::spawn(move || raw(proxy, &request))
}

/// [`assert_sent_nowhere`] on a plaintext listener: `first` from [`post_on_a_thread`], and
/// the third request sent as it was.
pub fn assert_sent_nowhere_in_plaintext(
    gw: &Gateway,
    backend: &Backend,
    gate: &Gate,
    first: JoinHandle<Option<Response>>,
) {
    assert_sent_nowhere(
        gw,
        backend,
        gate,
        || first.join().unwrap().unwrap().status,
        || raw(gw.proxy, &verify_post_with_id("third")).unwrap().status,
    );
}

/// A backend whose answers wait for `gate`, and the config of a gateway allowed one
/// connection to it: a request sent while another is at the backend waits for that
/// connection, for as long as a test takes.
pub fn held_behind_one_connection(gate: &Gate) -> (Backend, FileConfig) {
    let backend = Backend::gated(gate);
    let mut cfg = test_config(&[backend.addr]);
    cfg.upstream.max_connections_per_address = Some(1);
    cfg.upstream.pending_timeout_ms = 60_000;
    cfg.upstream.read_timeout_ms = 60_000;
    (backend, cfg)
}

impl Drop for Backend {
    /// Returns once the listener is closed: a connection after the drop is refused.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

fn serve_conn(
    conn: TcpStream,
    reqs: Arc<Mutex<Vec<Recorded>>>,
    completed: Arc<AtomicUsize>,
    handler: Handler,
) {
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    let mut on_connection = 0;
    while let Some(mut rec) = read_request(&mut reader) {
        rec.on_connection = on_connection;
        on_connection += 1;
        reqs.lock().unwrap().push(rec.clone());
        let keep_open = carry_out(handler(&rec), &rec, &mut writer);
        if !keep_open {
            let _ = writer.shutdown(Shutdown::Both);
        }
        completed.fetch_add(1, Ordering::SeqCst);
        if !keep_open {
            return;
        }
    }
}

/// Answers `rec` as `action` says; whether the connection stays open for another request.
fn carry_out(action: Action, rec: &Recorded, writer: &mut TcpStream) -> bool {
    let reply = |body: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Upstream-Path: {}\r\n\r\n{body}",
            body.len(),
            rec.target
        )
    };
    match action {
        Action::Json(body) => writer.write_all(reply(&body).as_bytes()).is_ok(),
        Action::AfterGate(gate, body) => {
            gate.wait();
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
            false
        }
        Action::CloseDelimited(body) => {
            let _ = writer.write_all(
                format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{body}")
                    .as_bytes(),
            );
            false
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
        Action::Close => false,
        Action::Hang => {
            until_closed(writer);
            false
        }
        Action::CloseMidBody => {
            let _ = writer.write_all(HALF_AN_ANSWER);
            false
        }
        Action::StallMidBody => {
            let _ = writer.write_all(HALF_AN_ANSWER);
            until_closed(writer);
            false
        }
    }
}

/// Reads and drops what comes until the peer closes the connection.
fn until_closed(conn: &mut TcpStream) {
    let _ = std::io::copy(conn, &mut std::io::sink());
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

/// `agent-gateway mock-backend`, the v2 backend the demo runs, on a port of its own.
/// Killed on drop.
pub struct MockBackend {
    pub addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl MockBackend {
    /// Spawns it on port 0 and waits until its log says where it listens.
    pub fn start() -> MockBackend {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("mock-backend.log");
        let mut child = Command::new(BIN)
            .args(["mock-backend", "--listen", "127.0.0.1:0"])
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let addr = poll_until(
            "the mock backend to listen",
            || {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("the mock backend exited ({status}); log:\n{}", log());
                }
                log().lines().find_map(|line| {
                    let v: serde_json::Value = serde_json::from_str(line).ok()?;
                    (v["message"] == "listening").then(|| v["address"].as_str()?.parse().ok())?
                })
            },
            Option::is_some,
            |_| log(),
        );
        MockBackend {
            addr: addr.unwrap(),
            child,
            _dir: dir,
        }
    }
}

impl Drop for MockBackend {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}
