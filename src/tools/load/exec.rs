//! One run, the shell around the pure parts: connect, release requests on the schedule, let
//! each connection (HTTP/1.1) or each free stream of a connection (HTTP/2) take the next one,
//! count how each ended (and save it with `--save`), and make the report. `stop` ends a run
//! early and it still reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::{oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;

use crate::api::operation::Operation;
use crate::http1::client::{ClientError, ResponseReader};

use super::args::HttpVersion;
use super::plan::{Load, Plan};
use super::report::{make_report, progress_line, Measured, ProgressTarget, Report};
use super::request::{transaction_id, H2Heads, Prepared, TxIds};
use super::save::{LineWriter, Saver};
use super::schedule::Schedule;
use super::stats::{micros, ConnErrorKind, End, Record, Stats};
use super::timeline::{Second, SecondRecorder, Timeline};
use super::transport::{ConnectError, Connector, Stream};
use super::LoadError;

/// The largest answer read; anything larger is a protocol error for a load test.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A request that starts more than this after it was due is a late start.
const LATE: Duration = Duration::from_millis(1);

/// What every connection task shares.
struct Shared {
    plan: Plan,
    /// Open model: one permit per request that is due; closed when the run is over.
    gate: Semaphore,
    /// `--requests N`: one permit per answer still wanted. A request takes one when it is
    /// sent and gives it back if it gets no answer, so the run ends with exactly N answers and
    /// nothing in flight.
    wanted: Option<Semaphore>,
    /// Told when `--requests` ends the run.
    ended: Notify,
    /// The next request index to take.
    next: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    /// The run is over (schedule sent, enough answers, or stopped): the dispatcher releases
    /// no more.
    over: AtomicBool,
    timeline: Mutex<Timeline>,
    /// What every HTTP/2 request shares.
    h2_heads: H2Heads,
}

/// Resolves when `stop` turns true; never if its sender is gone without doing so.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A connection made before the run starts.
enum Opened {
    H1(Box<Conn>),
    H2(h2::client::SendRequest<Bytes>),
}

/// Connects every connection, runs the schedule and returns the report (without verdicts),
/// writing each request to `save` as it ends. `stop` turning true ends the run early:
/// nothing more is sent, requests in flight are abandoned, and the report says it was
/// interrupted.
pub async fn execute(
    plan: Plan,
    mut stop: watch::Receiver<bool>,
    save: Option<&Saver>,
) -> Result<Report, LoadError> {
    let connect_error = |e| LoadError::Connect(plan.connector.addr, e);
    let mut opened = Vec::with_capacity(plan.setup.connections);
    for _ in 0..plan.setup.connections {
        opened.push(match plan.setup.http {
            HttpVersion::Http1 => Opened::H1(Box::new(
                Conn::open(&plan.connector).await.map_err(connect_error)?,
            )),
            HttpVersion::Http2 => Opened::H2(plan.connector.h2().await.map_err(connect_error)?),
        });
    }
    let progress = plan.progress;
    let shared = Arc::new(Shared {
        h2_heads: plan.script.h2_heads(if plan.connector.is_tls() {
            http::uri::Scheme::HTTPS
        } else {
            http::uri::Scheme::HTTP
        }),
        wanted: plan.setup.requests.map(|n| {
            Semaphore::new(
                usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            )
        }),
        plan,
        gate: Semaphore::new(0),
        ended: Notify::new(),
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        over: AtomicBool::new(false),
        timeline: Mutex::new(Timeline::default()),
    });
    let mut measured = Measured::new(SystemTime::now());
    if let Some(saver) = save {
        saver.start(&shared.plan.setup, measured.started_at);
    }
    // A short lead so every task is parked on the gate when the first request is due.
    let start = Instant::now() + Duration::from_millis(5);

    let dispatcher = match &shared.plan.setup.load {
        Load::Open(schedule) => {
            let shared = shared.clone();
            let schedule = schedule.clone();
            Some(std::thread::spawn(move || {
                let _end = EndOnPanic(&shared);
                dispatch(&shared, &schedule, start);
            }))
        }
        Load::Closed(_) => None,
    };
    let reporter = progress.then(|| tokio::spawn(report_progress(shared.clone(), start)));

    let mut tasks = JoinSet::new();
    // One cancel channel per connection rather than the shared `stop` watch: waiting on
    // it costs nothing shared per request. The senders live until every task is joined.
    let mut cancels = Vec::with_capacity(opened.len());
    for connection in opened {
        let shared = shared.clone();
        let (cancel, cancelled) = oneshot::channel();
        cancels.push(cancel);
        let counter = Counter::new(save.map(|s| s.lines(&shared.plan.setup)));
        match connection {
            Opened::H1(conn) => tasks
                .spawn(async move { h1_worker(shared, *conn, counter, start, cancelled).await }),
            Opened::H2(send) => {
                tasks.spawn(async move { h2_worker(shared, send, counter, start, cancelled).await })
            }
        };
    }
    let stop_signal = stopped(&mut stop);
    tokio::pin!(stop_signal);
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(Ok(s)) => measured.stats.merge(&s),
                // A worker that panicked lost what it counted, and what it was given stays
                // unsent: a report without them would be wrong. The run ends with its panic.
                Some(Err(e)) => {
                    if let Ok(panic) = e.try_into_panic() {
                        shared.end_run();
                        if let Some(d) = &dispatcher {
                            d.thread().unpark();
                        }
                        std::panic::resume_unwind(panic);
                    }
                }
                None => break,
            },
            () = &mut stop_signal, if !measured.interrupted => {
                measured.interrupted = true;
                shared.end_run();
                for cancel in cancels.drain(..) {
                    let _ = cancel.send(());
                }
                if let Some(d) = &dispatcher {
                    d.thread().unpark();
                }
            }
            () = shared.ended.notified() => {
                if let Some(d) = &dispatcher {
                    d.thread().unpark();
                }
            }
        }
    }
    measured.elapsed = Instant::now().saturating_duration_since(start);
    shared.over.store(true, Ordering::Relaxed);
    let dispatched = dispatcher.map(|d| {
        d.thread().unpark();
        d.join()
    });
    if let Some(r) = reporter {
        r.abort();
    }
    if let Some(Err(panic)) = dispatched {
        return Err(LoadError::Dispatcher(panic_message(&*panic)));
    }
    if let Some(saver) = save {
        saver.end(measured.elapsed, measured.interrupted);
    }
    let mut timeline =
        std::mem::take(&mut *shared.timeline.lock().unwrap_or_else(|e| e.into_inner()));
    timeline.extend_to(measured.elapsed.as_secs_f64().ceil() as usize);
    measured.timeline = timeline;
    Ok(make_report(&shared.plan.setup, &measured))
}

/// Releases requests when they are due. A thread of its own, because `nanosleep` keeps the
/// schedule to tens of µs where tokio's timer rounds to whole milliseconds; it parks rather
/// than sleeps so that a stop wakes it.
fn dispatch(shared: &Shared, schedule: &Schedule, start: Instant) {
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
    // One more permit per connection (each asks for one request at a time, whatever its
    // streams): each takes an index past the end and stops.
    shared.gate.add_permits(shared.plan.setup.connections);
}

/// Ends the run if the dispatcher panics: the workers would wait on the gate for ever, or
/// send what was released before and report it as the run.
struct EndOnPanic<'a>(&'a Shared);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.end_run();
        }
    }
}

/// What a panic said, when it said it with text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "no message".to_owned(),
    }
}

async fn report_progress(shared: Arc<Shared>, start: Instant) {
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
        let target = match &shared.plan.setup.load {
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
    /// The next request to send, and when it is due (open model); `None` when the run has
    /// no more.
    async fn next_request(&self, start: Instant, end: Instant) -> Option<(u64, Option<Instant>)> {
        // Held until a request is taken: a wait cancelled meanwhile gives it back.
        let wanted = match &self.wanted {
            Some(w) => Some(w.acquire().await.ok()?),
            None => None,
        };
        let taken = match &self.plan.setup.load {
            Load::Open(schedule) => {
                self.gate.acquire().await.ok()?.forget();
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                (i < schedule.total()).then(|| (i, Some(start + schedule.due_at(i))))
            }
            Load::Closed(_) => {
                let over = Instant::now() >= end || self.over.load(Ordering::Relaxed);
                (!over).then(|| (self.next.fetch_add(1, Ordering::Relaxed), None))
            }
        };
        if let (Some(_), Some(permit)) = (taken, wanted) {
            permit.forget();
        }
        taken
    }

    /// Ends the run: nothing more is released or taken.
    fn end_run(&self) {
        self.over.store(true, Ordering::Relaxed);
        self.gate.close();
        if let Some(w) = &self.wanted {
            w.close();
        }
        self.ended.notify_one();
    }
}

/// A worker's own counts: the connection's stats, its current second of the timeline, its
/// lines of `--save`.
struct Counter {
    stats: Stats,
    second: SecondRecorder,
    lines: Option<LineWriter>,
}

impl Counter {
    fn new(lines: Option<LineWriter>) -> Counter {
        Counter {
            stats: Stats::default(),
            second: SecondRecorder::default(),
            lines,
        }
    }

    /// The second `at` of the timeline, to count in.
    fn second(&mut self, shared: &Shared, at: usize) -> &mut Second {
        if at != self.second.index() {
            // Lines reach the file at least as often as the timeline's seconds change.
            if let Some(lines) = &mut self.lines {
                lines.flush();
            }
        }
        self.second.at(at, &shared.timeline)
    }

    /// Counts how a request ended: in the connection's stats, its second of the timeline,
    /// the saved file, the run's progress, and what `--requests` still wants.
    fn finish(&mut self, shared: &Shared, r: Record) {
        self.stats.record(&r);
        if r.end != End::Cancelled {
            self.second(shared, r.second()).record(&r);
        }
        if let Some(lines) = &mut self.lines {
            lines.push(&r);
        }
        match r.end {
            End::Answered(status) => {
                let done = shared.done.fetch_add(1, Ordering::Relaxed) + 1;
                if !(200..300).contains(&status) {
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                }
                if shared.plan.setup.requests == Some(done) {
                    shared.end_run();
                }
            }
            End::Failed(_) | End::Unsent => {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                if let Some(w) = &shared.wanted {
                    w.add_permits(1);
                }
            }
            End::Cancelled => {}
        }
    }

    /// Counts `n` requests never sent, as `r` (unsent) is, at once: one step and one saved
    /// line, where one at a time they would hold the run past its end.
    fn finish_unsent(&mut self, shared: &Shared, r: Record, n: u64) {
        self.stats.record_unsent(r.agent, n);
        self.second(shared, r.second()).unsent += n;
        if let Some(lines) = &mut self.lines {
            lines.push_count(&r, n);
        }
        shared.failed.fetch_add(n, Ordering::Relaxed);
    }

    /// The worker is done: what it counted goes to the timeline and the file.
    fn close(mut self, shared: &Shared) -> Stats {
        self.second.flush(&shared.timeline);
        if let Some(lines) = &mut self.lines {
            lines.flush();
        }
        self.stats
    }
}

/// When a worker's run starts, stops taking requests (closed model) and gives up on sending.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    /// The end of the schedule (or of the closed model's duration).
    end: Instant,
    /// Past this a taken request is not sent but counted as unsent.
    hard_deadline: Instant,
}

impl Window {
    fn new(start: Instant, plan: &Plan) -> Window {
        let end = start + plan.setup.load.duration();
        Window {
            start,
            end,
            hard_deadline: end + plan.setup.timeout,
        }
    }
}

impl Shared {
    /// Request `i`, taken now: made, or counted as unsent when the run's hard deadline has
    /// passed, and with it the rest of the schedule.
    fn take(
        &self,
        counter: &mut Counter,
        window: &Window,
        (i, due): (u64, Option<Instant>),
        tx_ids: &TxIds,
    ) -> Option<(Taken, Prepared)> {
        let now = Instant::now();
        let taken = Taken::new(window.start, due, now);
        if now >= window.hard_deadline {
            let (agent, op) = self.plan.script.draw(i, tx_ids);
            let unsent = taken.ended(End::Unsent, op, agent, now);
            counter.finish(self, unsent);
            self.count_rest_unsent(counter, unsent);
            return None;
        }
        Some((taken, self.plan.script.prepare(i, tx_ids)))
    }

    /// Open model, past the hard deadline: every request not yet taken is unsent, counted at
    /// once and shared among the agents by weight, like `unsent`. Taking them one at a time
    /// through the gate kept a rate far above what the connections could send running long
    /// past its end. The workers then find the schedule over.
    fn count_rest_unsent(&self, counter: &mut Counter, unsent: Record) {
        let Load::Open(schedule) = &self.plan.setup.load else {
            return;
        };
        let total = schedule.total();
        let rest = total.saturating_sub(self.next.swap(total, Ordering::Relaxed));
        if rest == 0 {
            return;
        }
        for (agent, n) in self
            .plan
            .script
            .agent_weights
            .share(rest)
            .into_iter()
            .enumerate()
        {
            if n > 0 {
                counter.finish_unsent(self, Record { agent, ..unsent }, n);
            }
        }
    }
}

/// A request taken from the run, before it is sent.
#[derive(Debug, Clone, Copy)]
struct Taken {
    /// When it was due (open) or is sent (closed).
    intended: Instant,
    start_us: u64,
    late: bool,
}

impl Taken {
    fn new(start: Instant, due: Option<Instant>, now: Instant) -> Taken {
        let intended = due.unwrap_or(now);
        Taken {
            intended,
            start_us: micros(intended.saturating_duration_since(start)),
            late: due.is_some_and(|d| now > d + LATE),
        }
    }

    /// How it ended at `at`.
    fn ended(&self, end: End, op: Operation, agent: usize, at: Instant) -> Record {
        Record {
            start_us: self.start_us,
            latency_us: micros(at.saturating_duration_since(self.intended)),
            end,
            op,
            agent,
            // Late is sent late: an unsent request is not.
            late: self.late && end != End::Unsent,
        }
    }
}

/// One HTTP/1.1 connection's loop over the schedule (open) or back to back until the end
/// (closed), one request in flight. `cancelled` firing abandons the request in flight and
/// ends the loop.
async fn h1_worker(
    shared: Arc<Shared>,
    mut conn: Conn,
    mut counter: Counter,
    start: Instant,
    mut cancelled: oneshot::Receiver<()>,
) -> Stats {
    let plan = &shared.plan;
    let mut tx_ids = TxIds::default();
    let mut req = BytesMut::with_capacity(1024);
    let window = Window::new(start, plan);
    tokio::time::sleep_until(start.into()).await;
    while let Some(next) = shared.next_request(start, window.end).await {
        let Some((taken, prepared)) = shared.take(&mut counter, &window, next, &tx_ids) else {
            continue;
        };
        plan.script.write_h1(&prepared, &mut req);
        let (op, agent) = (prepared.op, prepared.agent);
        let outcome = tokio::select! {
            biased;
            _ = &mut cancelled => {
                counter.finish(&shared, taken.ended(End::Cancelled, op, agent, Instant::now()));
                break;
            }
            outcome = tokio::time::timeout(plan.setup.timeout, conn.exchange(&req)) => outcome,
        };
        let end = match outcome {
            Ok(Ok(status)) => End::Answered(status),
            Ok(Err(kind)) => End::Failed(kind),
            Err(_) => {
                conn.reset();
                End::Failed(ConnErrorKind::Timeout)
            }
        };
        counter.finish(&shared, taken.ended(end, op, agent, Instant::now()));
        match end {
            End::Answered(status)
                if (200..300).contains(&status) && op != Operation::TransactionStatus =>
            {
                if let Some(id) = transaction_id(conn.body()) {
                    tx_ids.remember(agent, id);
                }
            }
            // Do not spin on a refused port.
            End::Failed(ConnErrorKind::Connect) if matches!(plan.setup.load, Load::Closed(_)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            _ => {}
        }
    }
    counter.close(&shared)
}

/// A request on its HTTP/2 stream, until it ends.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    taken: Taken,
    op: Operation,
    agent: usize,
    /// Which of the worker's connections it went on (they are numbered as they are made).
    connection: u64,
}

/// Whether an HTTP/2 request that failed this way leaves its connection unfit for the next:
/// gone (io, closed, protocol), or silent past `--timeout`, which is all a connection that
/// died without a word (a peer gone, a NAT entry dropped) ever shows. As HTTP/1.1 does, the
/// next request makes a new one. A stream reset leaves the connection fine.
pub(super) fn h2_connection_broken(kind: ConnErrorKind) -> bool {
    match kind {
        ConnErrorKind::Io
        | ConnErrorKind::Closed
        | ConnErrorKind::Protocol
        | ConnErrorKind::Timeout => true,
        ConnErrorKind::Connect | ConnErrorKind::Reset => false,
    }
}

/// How a stream ended, and when: its status and the transaction id it returned.
type StreamEnd = (Result<(u16, Option<String>), ConnErrorKind>, Instant);

/// One HTTP/2 connection's loop: up to `streams` requests in flight, each on a stream of its
/// own; a free stream takes the next request as soon as it is due (open) or at once
/// (closed), so latency is still measured from each request's intended start. The
/// connection is made again, before the next request, once a request on it has failed in a
/// way that breaks it ([`h2_connection_broken`]).
async fn h2_worker(
    shared: Arc<Shared>,
    send: h2::client::SendRequest<Bytes>,
    mut counter: Counter,
    start: Instant,
    mut cancelled: oneshot::Receiver<()>,
) -> Stats {
    let plan = &shared.plan;
    let streams = plan.setup.streams;
    let timeout = plan.setup.timeout;
    let mut connection = Some(send);
    // The number of the connection in `connection`: a request that fails on an older one
    // does not drop a newer.
    let mut generation = 0;
    let mut tx_ids = TxIds::default();
    let mut in_flight: JoinSet<StreamEnd> = JoinSet::new();
    let mut meta: HashMap<tokio::task::Id, InFlight> = HashMap::with_capacity(streams);
    let mut exhausted = false;
    let window = Window::new(start, plan);
    tokio::time::sleep_until(start.into()).await;
    loop {
        if exhausted && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            _ = &mut cancelled => {
                in_flight.abort_all();
                let now = Instant::now();
                for (_, f) in meta.drain() {
                    counter.finish(&shared, f.taken.ended(End::Cancelled, f.op, f.agent, now));
                }
                break;
            }
            Some(joined) = in_flight.join_next_with_id(), if !in_flight.is_empty() => {
                let (id, (outcome, at)) = match joined {
                    Ok(ended) => ended,
                    // Its worker panics too, and so does the run.
                    Err(e) => match e.try_into_panic() {
                        Ok(panic) => std::panic::resume_unwind(panic),
                        Err(_) => continue,
                    },
                };
                let Some(f) = meta.remove(&id) else { continue };
                let end = match &outcome {
                    Ok((status, _)) => End::Answered(*status),
                    Err(kind) => End::Failed(*kind),
                };
                counter.finish(&shared, f.taken.ended(end, f.op, f.agent, at));
                match outcome {
                    Ok((_, Some(id))) => tx_ids.remember(f.agent, id),
                    // The connection is gone or dead: the next request makes another.
                    Err(kind) if h2_connection_broken(kind) && f.connection == generation => {
                        connection = None;
                    }
                    _ => {}
                }
            }
            next = shared.next_request(start, window.end), if !exhausted && in_flight.len() < streams => {
                let Some(next) = next else {
                    exhausted = true;
                    continue;
                };
                let Some((taken, prepared)) = shared.take(&mut counter, &window, next, &tx_ids) else {
                    continue;
                };
                let (op, agent) = (prepared.op, prepared.agent);
                let send = match &connection {
                    Some(send) => send.clone(),
                    None => match tokio::time::timeout(timeout, plan.connector.h2()).await {
                        Ok(Ok(send)) => {
                            generation += 1;
                            connection.insert(send).clone()
                        }
                        _ => {
                            counter.finish(
                                &shared,
                                taken.ended(End::Failed(ConnErrorKind::Connect), op, agent, Instant::now()),
                            );
                            if matches!(plan.setup.load, Load::Closed(_)) {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            continue;
                        }
                    },
                };
                let (request, body) = plan.script.h2_request(prepared, &shared.h2_heads);
                let keep_id = op != Operation::TransactionStatus;
                let task = in_flight.spawn(async move {
                    let outcome = tokio::time::timeout(timeout, h2_exchange(send, request, body, keep_id))
                        .await
                        .unwrap_or(Err(ConnErrorKind::Timeout));
                    (outcome, Instant::now())
                });
                meta.insert(
                    task.id(),
                    InFlight {
                        taken,
                        op,
                        agent,
                        connection: generation,
                    },
                );
            }
        }
    }
    counter.close(&shared)
}

/// The kind of failure an HTTP/2 error is.
fn h2_error_kind(e: &h2::Error) -> ConnErrorKind {
    if e.is_io() {
        ConnErrorKind::Io
    } else if e.is_go_away() {
        ConnErrorKind::Closed
    } else if e.is_reset() {
        ConnErrorKind::Reset
    } else {
        ConnErrorKind::Protocol
    }
}

/// Sends one request on a stream of its own and reads the whole answer: its status and, for
/// a 2xx when `keep_id`, the transaction id its body carries.
async fn h2_exchange(
    send: h2::client::SendRequest<Bytes>,
    request: http::Request<()>,
    body: Option<Bytes>,
    keep_id: bool,
) -> Result<(u16, Option<String>), ConnErrorKind> {
    let kind = |e: h2::Error| h2_error_kind(&e);
    let mut send = send.ready().await.map_err(kind)?;
    let (response, mut stream) = send.send_request(request, body.is_none()).map_err(kind)?;
    if let Some(body) = body {
        stream.send_data(body, true).map_err(kind)?;
    }
    let response = response.await.map_err(kind)?;
    let status = response.status().as_u16();
    let keep = keep_id && (200..300).contains(&status);
    let mut body = response.into_body();
    let mut kept = BytesMut::new();
    let mut read = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(kind)?;
        read += chunk.len();
        if read > MAX_RESPONSE_BYTES {
            return Err(ConnErrorKind::Protocol);
        }
        body.flow_control()
            .release_capacity(chunk.len())
            .map_err(kind)?;
        if keep {
            kept.extend_from_slice(&chunk);
        }
    }
    Ok((status, keep.then(|| transaction_id(&kept)).flatten()))
}

/// One kept-alive HTTP/1.1 client connection, made again after it breaks.
struct Conn {
    connector: Connector,
    stream: Option<Stream>,
    responses: ResponseReader,
}

impl Conn {
    async fn open(connector: &Connector) -> Result<Self, ConnectError> {
        Ok(Conn {
            stream: Some(connector.stream().await?),
            connector: connector.clone(),
            responses: ResponseReader::default(),
        })
    }

    fn reset(&mut self) {
        self.stream = None;
        self.responses.clear();
    }

    /// Sends one request and reads its response: its status, its body in [`Self::body`].
    async fn exchange(&mut self, req: &[u8]) -> Result<u16, ConnErrorKind> {
        if self.stream.is_none() {
            self.stream = Some(
                self.connector
                    .stream()
                    .await
                    .map_err(|_| ConnErrorKind::Connect)?,
            );
        }
        let stream = self.stream.as_mut().expect("connected above");
        // TLS may hold the last record until it is flushed.
        let sent = match stream.write_all(req).await {
            Ok(()) => stream.flush().await,
            Err(e) => Err(e),
        };
        let result = match sent {
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
