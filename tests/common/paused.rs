//! The gateway on a test's own paused clock: [`PausedGateway`] runs
//! [`agent_gateway::app::serve::serve`] on the current-thread runtime of a
//! `#[tokio::test(start_paused = true)]`, with a [`PausedBackend`] and the clients on that same
//! runtime. Time passes only when every task waits, and then jumps to the next timer, so a test
//! of a timeout takes no wall time and never sleeps. Whatever such a test talks to must run on
//! this runtime: a thread or a process outside it would see the clock jump under its feet.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use agent_gateway::app::listeners::{ListenAddrs, Listeners};
use agent_gateway::app::reload::ConfigStore;
use agent_gateway::app::serve::serve;
use agent_gateway::app::server::{self, BuildOptions};
use agent_gateway::config::{FileConfig, Snapshot};
use agent_gateway::http1::client::{ClientError, ResponseReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// The most of an answer a test reads.
const MAX_ANSWER: usize = 1024 * 1024;

/// A gateway served by a task of the current runtime; stopped on drop.
pub struct PausedGateway {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
    _stop: oneshot::Sender<()>,
}

impl PausedGateway {
    /// `config` (its listeners on port 0 for [`super::ANY_PORT`]) served on this runtime.
    pub async fn start(config: &FileConfig) -> PausedGateway {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config.to_toml()).unwrap();
        let snapshot = Snapshot::load(&path).unwrap_or_else(|e| panic!("test config: {e}"));
        let listeners = Listeners::bind(&ListenAddrs::configured(&snapshot.startup, None)).unwrap();
        let at = listeners.local_addrs().unwrap();
        let registry = prometheus::Registry::new();
        let store = ConfigStore::new(snapshot, Some(path), &registry).unwrap();
        let gateway = server::build(store, &registry, BuildOptions::default()).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(serve(listeners, gateway, async {
            let _ = stopped.await;
        }));
        PausedGateway {
            proxy: at.proxy,
            admin: at.admin.expect("the harness needs an admin listener"),
            _dir: dir,
            _stop: stop,
        }
    }
}

/// One request as a [`PausedBackend`] saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The connection it came on, counted from 0 in the order they were accepted.
    pub connection: usize,
    /// How many requests that connection had carried before it.
    pub on_connection: usize,
}

/// A backend on this runtime that answers every request `200 {}` on a kept-alive
/// connection, and records which connection each came on.
pub struct PausedBackend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl PausedBackend {
    pub async fn start() -> PausedBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        tokio::spawn(async move {
            for connection in 0.. {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(answer_each(stream, connection, recorded.clone()));
            }
        });
        PausedBackend { addr, seen }
    }

    /// Requests answered so far.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The latest request.
    pub fn last(&self) -> Seen {
        *self.seen.lock().unwrap().last().expect("a request")
    }
}

/// Answers each request on `stream` (a head, and a body of its `content-length`) until the
/// gateway closes it.
async fn answer_each(mut stream: TcpStream, connection: usize, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    for on_connection in 0.. {
        let request_end = loop {
            if let Some(end) = request_end(&buf) {
                break end;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        };
        buf.drain(..request_end);
        seen.lock().unwrap().push(Seen {
            connection,
            on_connection,
        });
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// Where the first whole request in `buf` ends, if it is all there.
fn request_end(buf: &[u8]) -> Option<usize> {
    let head = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&buf[..head]).ok()?;
    let length: usize = text
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    (buf.len() >= head + length).then_some(head + length)
}

/// A client connection on this runtime.
pub struct PausedClient {
    stream: TcpStream,
    answers: ResponseReader,
}

impl PausedClient {
    pub async fn open(addr: SocketAddr) -> PausedClient {
        PausedClient {
            stream: TcpStream::connect(addr).await.unwrap(),
            answers: ResponseReader::default(),
        }
    }

    pub async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.stream.write_all(bytes.as_ref()).await.unwrap();
    }

    /// Sends `bytes` if the connection is still open; whether it was.
    pub async fn try_send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    /// The next answer's status, or why there is none.
    pub async fn status(&mut self) -> Result<u16, ClientError> {
        self.answers.read(&mut self.stream, MAX_ANSWER).await?;
        Ok(self.answers.status())
    }

    /// Whether the gateway has closed the connection (reads and drops what comes first).
    pub async fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest).await.is_ok()
    }
}

/// A client that sends `start` and then `dribble` every `every`, reading whatever comes back,
/// until the gateway closes the connection (a slowloris, of a head, a body or a handshake).
/// Connected and started when this returns; the task ends with what it read.
pub async fn slow_client(
    addr: SocketAddr,
    start: &[u8],
    dribble: &'static [u8],
    every: std::time::Duration,
) -> tokio::task::JoinHandle<Vec<u8>> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(start).await.unwrap();
    tokio::spawn(async move {
        let mut answer = Vec::new();
        loop {
            if s.write_all(dribble).await.is_err() {
                return answer;
            }
            let mut buf = [0u8; 512];
            tokio::select! {
                read = s.read(&mut buf) => match read {
                    Ok(n) if n > 0 => answer.extend_from_slice(&buf[..n]),
                    _ => return answer,
                },
                _ = tokio::time::sleep(every) => {}
            }
        }
    })
}

/// `POST target` with `body` as the harness's agent, on a connection of its own; the status.
pub async fn post(addr: SocketAddr, target: &str, body: &str) -> u16 {
    let mut client = PausedClient::open(addr).await;
    let head = super::client::auth_head("POST", target);
    client
        .send(format!(
            "{head}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ))
        .await;
    client.status().await.unwrap()
}
