//! The shell: resolve the target, connect, dispatch on schedule, collect, print.

use std::collections::VecDeque;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::api::operation::Operation;
use crate::config::BusinessCode;
use crate::http1::client::{ClientError, ResponseReader};

use super::args::{parse_credentials, splitmix64, Api, Credentials, Rate, Target};
use super::report::{format_report, make_report, progress_line, ConnErrorKind, Report, Stats};
use super::request::{transaction_id, Script};
use super::schedule::{due_by, intended_offset, total_requests};
use super::{LoadArgs, LoadError, MAX_RESPONSE_BYTES, TX_POOL};

/// A validated run, ready to execute.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target_url: String,
    pub addr: SocketAddr,
    pub rate: Rate,
    pub duration: Duration,
    pub connections: usize,
    pub timeout: Duration,
    pub script: Script,
    /// Write the one-second progress line to stderr.
    pub progress: bool,
}

pub(super) fn run_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    splitmix64(nanos ^ u64::from(std::process::id())) & 0xffff_ffff
}

impl Plan {
    /// Checks the arguments, reads the credentials and resolves the target.
    pub fn from_args(args: &LoadArgs) -> Result<Self, LoadError> {
        if args.connections == 0 {
            return Err(LoadError::Invalid("--connections must be at least 1"));
        }
        if let Rate::PerSecond(r) = args.rate {
            if total_requests(r, args.duration) == 0 {
                return Err(LoadError::Invalid(
                    "--rate × --duration is less than one request",
                ));
            }
        }
        let service = match (args.api, &args.service) {
            (Api::V2, None) => return Err(LoadError::MissingService),
            (_, Some(code)) => BusinessCode::parse(code)
                .map_err(LoadError::Service)?
                .as_str()
                .to_owned(),
            (Api::V1, None) => String::new(),
        };
        let creds = match (&args.agent_id, &args.token, &args.credentials) {
            (Some(agent_id), Some(token), None) => Credentials {
                agent_id: agent_id.clone(),
                token: token.clone(),
            },
            (None, None, Some(path)) => read_credentials(path)?,
            _ => return Err(LoadError::MissingCredentials),
        };
        for v in [&creds.agent_id, &creds.token] {
            if v.bytes().any(|b| b.is_ascii_control()) {
                return Err(LoadError::Invalid(
                    "agent id and token must not hold control characters",
                ));
            }
        }
        let target: Target = args.target.parse()?;
        let host_port = &target.host_port;
        let addr = host_port
            .to_socket_addrs()
            .map_err(|e| LoadError::Resolve(host_port.clone(), e))?
            .next()
            .ok_or_else(|| {
                LoadError::Resolve(
                    host_port.clone(),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
                )
            })?;
        Ok(Plan {
            target_url: target.url.clone(),
            addr,
            rate: args.rate,
            duration: args.duration,
            connections: args.connections,
            timeout: args.timeout,
            script: Script {
                authority: target.authority,
                prefix: target.prefix,
                api: args.api.version(),
                service,
                agent_id: creds.agent_id,
                token: creds.token,
                mix: args.mix.clone(),
                run: run_id(),
            },
            progress: true,
        })
    }
}

pub(super) fn read_credentials(path: &Path) -> Result<Credentials, LoadError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::CredentialsRead {
        path: shown.clone(),
        source,
    })?;
    parse_credentials(&text, &shown)
}

/// Runs a load test and prints its report.
pub fn run(args: LoadArgs) -> Result<(), LoadError> {
    let plan = Plan::from_args(&args)?;
    let threads = args
        .threads
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1);
    let runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .map_err(LoadError::Runtime)?;
    let report = runtime.block_on(execute(plan))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("a report always serializes")
        );
    } else {
        print!("{}", format_report(&report));
    }
    Ok(())
}

/// What every connection task shares.
pub(super) struct Shared {
    plan: Plan,
    /// Open model: one permit per request that is due.
    gate: Semaphore,
    /// The next request index to take.
    next: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
}

/// Connects every connection, runs the schedule and returns the report.
pub async fn execute(plan: Plan) -> Result<Report, LoadError> {
    let mut conns = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        conns.push(Conn::open(plan.addr).await?);
    }
    let progress = plan.progress;
    let shared = Arc::new(Shared {
        plan,
        gate: Semaphore::new(0),
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    });
    // A short lead so every task is parked on the gate when the first request is due.
    let start = Instant::now() + Duration::from_millis(5);
    let stop = Arc::new(AtomicBool::new(false));

    let dispatcher = match shared.plan.rate {
        Rate::PerSecond(rate) => {
            let shared = shared.clone();
            let stop = stop.clone();
            Some(std::thread::spawn(move || {
                dispatch(&shared, rate, start, &stop);
            }))
        }
        Rate::Max => None,
    };
    let reporter = progress.then(|| tokio::spawn(report_progress(shared.clone(), start)));

    let mut tasks = tokio::task::JoinSet::new();
    for conn in conns {
        let shared = shared.clone();
        tasks.spawn(async move { worker(shared, conn, start).await });
    }
    let mut stats = Stats::default();
    while let Some(result) = tasks.join_next().await {
        if let Ok(s) = result {
            stats.merge(&s);
        }
    }
    let elapsed = Instant::now().saturating_duration_since(start);
    stop.store(true, Ordering::Relaxed);
    if let Some(d) = dispatcher {
        let _ = d.join();
    }
    if let Some(r) = reporter {
        r.abort();
    }
    Ok(make_report(&shared.plan, &stats, elapsed))
}

/// Releases requests when they are due. A thread of its own, because `nanosleep` keeps the
/// schedule to tens of µs where tokio's timer rounds to whole milliseconds.
pub(super) fn dispatch(shared: &Shared, rate: f64, start: Instant, stop: &AtomicBool) {
    let total = total_requests(rate, shared.plan.duration);
    let mut released = 0;
    while released < total && !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < start {
            std::thread::sleep(start - now);
            continue;
        }
        let due = due_by(now - start, rate, total);
        if due > released {
            shared.gate.add_permits((due - released) as usize);
            released = due;
        }
        if released < total {
            let next = start + intended_offset(released, rate);
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }
    // One more permit per connection: each takes an index past the end and stops.
    shared.gate.add_permits(shared.plan.connections);
}

pub(super) async fn report_progress(shared: Arc<Shared>, start: Instant) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(start + Duration::from_secs(1)),
        Duration::from_secs(1),
    );
    let mut last = 0;
    let mut second = 0;
    loop {
        tick.tick().await;
        second += 1;
        let done = shared.done.load(Ordering::Relaxed);
        let failed = shared.failed.load(Ordering::Relaxed);
        eprintln!("{}", progress_line(second, done - last, done, failed));
        last = done;
    }
}

/// One connection's loop over the schedule (open) or back to back until the end (closed).
pub(super) async fn worker(shared: Arc<Shared>, mut conn: Conn, start: Instant) -> Stats {
    let plan = &shared.plan;
    let mut stats = Stats::default();
    let mut tx_ids = VecDeque::with_capacity(TX_POOL);
    let mut req = BytesMut::with_capacity(1024);
    let end = start + plan.duration;
    let hard_deadline = end + plan.timeout;
    tokio::time::sleep_until(start.into()).await;
    loop {
        let (i, due) = match plan.rate {
            Rate::PerSecond(rate) => {
                match shared.gate.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => break,
                }
                let i = shared.next.fetch_add(1, Ordering::Relaxed);
                if i >= total_requests(rate, plan.duration) {
                    break;
                }
                (i, Some(start + intended_offset(i, rate)))
            }
            Rate::Max => {
                if Instant::now() >= end {
                    break;
                }
                (shared.next.fetch_add(1, Ordering::Relaxed), None)
            }
        };
        let sent = Instant::now();
        if sent >= hard_deadline {
            stats.unsent += 1;
            shared.failed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if due.is_some_and(|d| sent > d + Duration::from_millis(1)) {
            stats.late_starts += 1;
        }
        let op = plan.script.write_request(i, &tx_ids, &mut req);
        stats.operations[op as usize] += 1;
        let outcome = tokio::time::timeout(plan.timeout, conn.exchange(&req)).await;
        let finished = Instant::now();
        match outcome {
            Ok(Ok(status)) => {
                stats.record_response(status, finished - due.unwrap_or(sent));
                shared.done.fetch_add(1, Ordering::Relaxed);
                if !(200..300).contains(&status) {
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                } else if op != Operation::TransactionStatus {
                    if let Some(id) = transaction_id(conn.body()) {
                        if tx_ids.len() == TX_POOL {
                            tx_ids.pop_front();
                        }
                        tx_ids.push_back(id);
                    }
                }
            }
            Ok(Err(kind)) => {
                stats.record_error(kind);
                shared.failed.fetch_add(1, Ordering::Relaxed);
                if kind == ConnErrorKind::Connect && plan.rate == Rate::Max {
                    // Do not spin on a refused port.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Err(_) => {
                conn.reset();
                stats.record_error(ConnErrorKind::Timeout);
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    stats
}

/// One kept-alive client connection, reconnected after it breaks.
pub(super) struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    responses: ResponseReader,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Result<Self, LoadError> {
        let stream = connect(addr)
            .await
            .map_err(|e| LoadError::Connect(addr, e))?;
        Ok(Conn {
            addr,
            stream: Some(stream),
            responses: ResponseReader::default(),
        })
    }

    fn reset(&mut self) {
        self.stream = None;
        self.responses.clear();
    }

    /// Sends one request and reads its response: its status, its body in
    /// [`Self::body`].
    async fn exchange(&mut self, req: &[u8]) -> Result<u16, ConnErrorKind> {
        if self.stream.is_none() {
            self.stream = Some(
                connect(self.addr)
                    .await
                    .map_err(|_| ConnErrorKind::Connect)?,
            );
        }
        let stream = self.stream.as_mut().expect("connected above");
        let result = match stream.write_all(req).await {
            Ok(()) => self
                .responses
                .read(stream, MAX_RESPONSE_BYTES)
                .await
                .map_err(|e| match e {
                    ClientError::Io(_) => ConnErrorKind::Io,
                    ClientError::Closed => ConnErrorKind::Closed,
                    ClientError::Malformed | ClientError::TooLarge(_) => ConnErrorKind::Protocol,
                }),
            Err(_) => Err(ConnErrorKind::Io),
        };
        match result {
            Ok(()) if self.responses.keep_alive() => Ok(self.responses.status()),
            Ok(()) => {
                let status = self.responses.status();
                self.reset();
                Ok(status)
            }
            Err(kind) => {
                self.reset();
                Err(kind)
            }
        }
    }

    /// The body of the last response.
    fn body(&self) -> &[u8] {
        self.responses.body()
    }
}

pub(super) async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}
