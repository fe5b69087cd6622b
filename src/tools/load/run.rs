//! The shell: resolve the target, connect, dispatch on schedule, collect, print; Ctrl-C ends
//! a run early and still reports it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch, Semaphore};

use crate::api::operation::Operation;
use crate::http1::client::{ClientError, ResponseReader};

use super::args::LoadArgs;
use super::html;
use super::judge::judge_all;
use super::knee::KneeSearch;
use super::plan::{Load, Mode, Plan};
use super::report::{
    format_knee, format_report, make_report, progress_line, KneeReport, KneeStep, Measured,
    ProgressTarget, Report,
};
use super::request::transaction_id;
use super::schedule::Schedule;
use super::stats::{latency_us, ConnErrorKind, Ended, Stats};
use super::threshold::Threshold;
use super::timeline::{Second, SecondRecorder, Timeline};
use super::LoadError;

/// Transaction ids remembered per connection for status reads.
const TX_POOL: usize = 256;

/// The largest answer read; anything larger is a protocol error for a load test.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How the command ended, as its exit status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The run finished and every threshold passed (or a find-max found a rate).
    Passed,
    /// A threshold failed: exit 1, as a CI gate expects.
    ThresholdsFailed,
    /// `--find-max` found no rate that held the SLO: exit 1.
    NoRateHeld,
    /// Ended early by Ctrl-C (thresholds, if any, passed on what was measured): exit 130, the
    /// shell's status for SIGINT.
    Interrupted,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Passed => 0,
            Outcome::ThresholdsFailed | Outcome::NoRateHeld => 1,
            Outcome::Interrupted => 130,
        }
    }
}

/// Runs a load test (or a knee search), prints its report and says how it ended.
pub fn run(args: LoadArgs) -> Result<Outcome, LoadError> {
    let plan = Plan::from_args(&args)?;
    let mode = Mode::from_args(&args)?;
    let threads = args
        .threads
        .unwrap_or_else(crate::config::cpus_available)
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
    runtime.block_on(async {
        let (stop_tx, stop) = watch::channel(false);
        tokio::spawn(interrupt_on_ctrl_c(stop_tx));
        match mode {
            Mode::Run { thresholds } => {
                let mut report = execute(plan, stop).await?;
                report.thresholds = judge_all(&thresholds, &report);
                print_run(&report, args.json, args.report.as_deref())
            }
            Mode::FindMax {
                slo,
                start,
                max_steps,
            } => {
                let knee = find_max(plan, &slo, start, max_steps, stop).await?;
                print_knee(&knee, args.json, args.report.as_deref())
            }
        }
    })
}

/// The first Ctrl-C stops the run, which then reports what it measured; a second one quits
/// at once.
async fn interrupt_on_ctrl_c(stop: watch::Sender<bool>) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    eprintln!("interrupted: stopping and reporting what was measured (Ctrl-C again quits now)");
    let _ = stop.send(true);
    if tokio::signal::ctrl_c().await.is_ok() {
        std::process::exit(i32::from(Outcome::Interrupted.exit_code()));
    }
}

fn write_html(path: &Path, html: &str) -> Result<(), LoadError> {
    std::fs::write(path, html).map_err(|source| LoadError::Report {
        path: path.display().to_string(),
        source,
    })
}

fn print_run(report: &Report, json: bool, html_path: Option<&Path>) -> Result<Outcome, LoadError> {
    if json {
        println!(
            "{}",
            serde_json::to_string(report).expect("a report always serializes")
        );
    } else {
        print!("{}", format_report(report));
    }
    if let Some(path) = html_path {
        write_html(path, &html::run_page(report))?;
    }
    let failed: Vec<String> = report
        .thresholds
        .iter()
        .filter(|v| !v.passed)
        .map(|v| v.describe())
        .collect();
    if !failed.is_empty() {
        eprintln!(
            "{} of {} thresholds failed: {}",
            failed.len(),
            report.thresholds.len(),
            failed.join("; ")
        );
        return Ok(Outcome::ThresholdsFailed);
    }
    Ok(if report.interrupted {
        Outcome::Interrupted
    } else {
        Outcome::Passed
    })
}

fn print_knee(
    knee: &KneeReport,
    json: bool,
    html_path: Option<&Path>,
) -> Result<Outcome, LoadError> {
    if json {
        println!(
            "{}",
            serde_json::to_string(knee).expect("a report always serializes")
        );
    } else {
        print!("{}", format_knee(knee));
    }
    if let Some(path) = html_path {
        write_html(path, &html::knee_page(knee))?;
    }
    Ok(match knee.max_rate_held {
        None => {
            eprintln!("find-max: no rate held the SLO");
            Outcome::NoRateHeld
        }
        Some(_) if knee.interrupted => Outcome::Interrupted,
        Some(_) => Outcome::Passed,
    })
}

/// `--find-max`: runs flat steps of `plan`'s duration as [`KneeSearch`] directs, each judged
/// against `slo`, until the search is done or the run is interrupted.
pub async fn find_max(
    plan: Plan,
    slo: &[Threshold],
    start: f64,
    max_steps: usize,
    stop: watch::Receiver<bool>,
) -> Result<KneeReport, LoadError> {
    let step_duration = plan.load.duration();
    let started_at = SystemTime::now();
    let mut search = KneeSearch::new(start, max_steps);
    let mut steps = Vec::new();
    let mut interrupted = false;
    while let Some(rate) = search.next_rate() {
        if *stop.borrow() {
            interrupted = true;
            break;
        }
        let mut step = plan.clone();
        step.load = Load::Open(Schedule::flat(rate, step_duration));
        if plan.progress {
            eprintln!("find-max step {}: {rate} req/s", steps.len() + 1);
        }
        let mut report = execute(step, stop.clone()).await?;
        report.thresholds = judge_all(slo, &report);
        let held = (!report.interrupted).then(|| report.thresholds_passed());
        if let Some(held) = held {
            search.record(rate, held);
        }
        interrupted = report.interrupted;
        steps.push(KneeStep { rate, held, report });
        if interrupted {
            break;
        }
    }
    Ok(KneeReport {
        mode: "find_max",
        target: plan.target_url.clone(),
        api: plan.script.api.as_str(),
        connections: plan.connections,
        mix: plan.script.mix.to_string(),
        slo: slo.iter().map(|t| t.text.clone()).collect(),
        step_duration_s: step_duration.as_secs_f64(),
        started_at: humantime::format_rfc3339_seconds(started_at).to_string(),
        steps,
        max_rate_held: search.best(),
        lowest_rate_broken: search.lowest_broken(),
        interrupted,
    })
}

/// What every connection task shares.
pub(super) struct Shared {
    plan: Plan,
    /// Open model: one permit per request that is due; closed when the run is stopped.
    gate: Semaphore,
    /// The next request index to take.
    next: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    /// The run is over (schedule sent, or stopped): the dispatcher releases no more.
    over: AtomicBool,
    timeline: Mutex<Timeline>,
}

/// Resolves when `stop` turns true; never if its sender is gone without doing so.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Connects every connection, runs the schedule and returns the report (without verdicts).
/// `stop` turning true ends the run early: nothing more is sent, requests in flight are
/// abandoned, and the report says it was interrupted.
pub async fn execute(plan: Plan, mut stop: watch::Receiver<bool>) -> Result<Report, LoadError> {
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
        over: AtomicBool::new(false),
        timeline: Mutex::new(Timeline::default()),
    });
    let mut measured = Measured::new(SystemTime::now());
    // A short lead so every task is parked on the gate when the first request is due.
    let start = Instant::now() + Duration::from_millis(5);

    let dispatcher = match &shared.plan.load {
        Load::Open(schedule) => {
            let shared = shared.clone();
            let schedule = schedule.clone();
            Some(std::thread::spawn(move || {
                dispatch(&shared, &schedule, start);
            }))
        }
        Load::Closed(_) => None,
    };
    let reporter = progress.then(|| tokio::spawn(report_progress(shared.clone(), start)));

    let mut tasks = tokio::task::JoinSet::new();
    // One cancel channel per connection rather than the shared `stop` watch: waiting on
    // it costs nothing shared per request. The senders live until every task is joined.
    let mut cancels = Vec::with_capacity(shared.plan.connections);
    for conn in conns {
        let shared = shared.clone();
        let (cancel, cancelled) = oneshot::channel();
        cancels.push(cancel);
        tasks.spawn(async move { worker(shared, conn, start, cancelled).await });
    }
    let stop_signal = stopped(&mut stop);
    tokio::pin!(stop_signal);
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(Ok(s)) => measured.stats.merge(&s),
                Some(Err(_)) => {}
                None => break,
            },
            () = &mut stop_signal, if !measured.interrupted => {
                measured.interrupted = true;
                shared.over.store(true, Ordering::Relaxed);
                shared.gate.close();
                for cancel in cancels.drain(..) {
                    let _ = cancel.send(());
                }
                if let Some(d) = &dispatcher {
                    d.thread().unpark();
                }
            }
        }
    }
    measured.elapsed = Instant::now().saturating_duration_since(start);
    shared.over.store(true, Ordering::Relaxed);
    if let Some(d) = dispatcher {
        d.thread().unpark();
        let _ = d.join();
    }
    if let Some(r) = reporter {
        r.abort();
    }
    let mut timeline =
        std::mem::take(&mut *shared.timeline.lock().unwrap_or_else(|e| e.into_inner()));
    timeline.extend_to(measured.elapsed.as_secs_f64().ceil() as usize);
    measured.timeline = timeline;
    Ok(make_report(&shared.plan, &measured))
}

/// Releases requests when they are due. A thread of its own, because `nanosleep` keeps the
/// schedule to tens of µs where tokio's timer rounds to whole milliseconds; it parks rather
/// than sleeps so that a stop wakes it.
pub(super) fn dispatch(shared: &Shared, schedule: &Schedule, start: Instant) {
    let total = schedule.total();
    let mut released = 0;
    while released < total && !shared.over.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < start {
            std::thread::park_timeout(start - now);
            continue;
        }
        let due = schedule.due_by(now - start);
        if due > released {
            shared.gate.add_permits((due - released) as usize);
            released = due;
        }
        if released < total {
            let next = start + schedule.due_at(released);
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::park_timeout(wait);
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
        // The second that just ended, as the timeline has it: what the schedule called for
        // in it, and the stage running at its start.
        let target = match &shared.plan.load {
            Load::Open(schedule) => Some(ProgressTarget {
                rate: schedule.target_in_second(second - 1),
                stage: schedule.flat_rate().is_none().then(|| {
                    let at = Duration::from_secs(second - 1);
                    (schedule.stage_at(at) + 1, schedule.stages().len())
                }),
            }),
            Load::Closed(_) => None,
        };
        eprintln!(
            "{}",
            progress_line(second, target, done - last, done, failed)
        );
        last = done;
    }
}

impl Shared {
    /// The next request for a connection to send, and when it is due (open model); `None`
    /// when the run has no more.
    async fn next_request(&self, start: Instant, end: Instant) -> Option<(u64, Option<Instant>)> {
        match &self.plan.load {
            Load::Open(schedule) => {
                self.gate.acquire().await.ok()?.forget();
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                (i < schedule.total()).then(|| (i, Some(start + schedule.due_at(i))))
            }
            Load::Closed(_) => {
                let over = Instant::now() >= end || self.over.load(Ordering::Relaxed);
                (!over).then(|| (self.next.fetch_add(1, Ordering::Relaxed), None))
            }
        }
    }

    /// Counts how a request ended: in the connection's tally, in its second of the timeline,
    /// and in the run's progress.
    fn record(&self, ended: Ended, stats: &mut Stats, second: &mut Second) {
        stats.ended.record(ended);
        second.record(ended);
        if matches!(ended, Ended::Answered { .. }) {
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        if !matches!(ended, Ended::Answered { status, .. } if (200..300).contains(&status)) {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One connection's loop over the schedule (open) or back to back until the end (closed).
/// `cancelled` firing abandons the request in flight and ends the loop.
pub(super) async fn worker(
    shared: Arc<Shared>,
    mut conn: Conn,
    start: Instant,
    mut cancelled: oneshot::Receiver<()>,
) -> Stats {
    let plan = &shared.plan;
    let mut stats = Stats::default();
    let mut second = SecondRecorder::default();
    let mut tx_ids = VecDeque::with_capacity(TX_POOL);
    let mut req = BytesMut::with_capacity(1024);
    let end = start + plan.load.duration();
    let hard_deadline = end + plan.timeout;
    let second_of = |t: Instant| t.saturating_duration_since(start).as_secs() as usize;
    tokio::time::sleep_until(start.into()).await;
    while let Some((i, due)) = shared.next_request(start, end).await {
        let sent = Instant::now();
        if sent >= hard_deadline {
            let this_second = second.at(second_of(sent), &shared.timeline);
            shared.record(Ended::Unsent, &mut stats, this_second);
            continue;
        }
        if due.is_some_and(|d| sent > d + Duration::from_millis(1)) {
            stats.late_starts += 1;
        }
        let op = plan.script.write_request(i, &tx_ids, &mut req);
        stats.operations[op as usize] += 1;
        let outcome = tokio::select! {
            biased;
            _ = &mut cancelled => {
                stats.cancelled += 1;
                break;
            }
            outcome = tokio::time::timeout(plan.timeout, conn.exchange(&req)) => outcome,
        };
        let finished = Instant::now();
        let ended = match outcome {
            Ok(Ok(status)) => Ended::Answered {
                status,
                latency_us: latency_us(finished.saturating_duration_since(due.unwrap_or(sent))),
            },
            Ok(Err(kind)) => Ended::Failed(kind),
            Err(_) => {
                conn.reset();
                Ended::Failed(ConnErrorKind::Timeout)
            }
        };
        let this_second = second.at(second_of(finished), &shared.timeline);
        shared.record(ended, &mut stats, this_second);
        match ended {
            Ended::Answered { status, .. }
                if (200..300).contains(&status) && op != Operation::TransactionStatus =>
            {
                if let Some(id) = transaction_id(conn.body()) {
                    if tx_ids.len() == TX_POOL {
                        tx_ids.pop_front();
                    }
                    tx_ids.push_back(id);
                }
            }
            // Do not spin on a refused port.
            Ended::Failed(ConnErrorKind::Connect) if matches!(plan.load, Load::Closed(_)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            _ => {}
        }
    }
    second.flush(&shared.timeline);
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
