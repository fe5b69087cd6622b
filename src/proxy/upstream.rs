//! The backend side of a request: pick an address, take a pooled connection or make one
//! within the address's connection budget (waiting in its queue when the budget is spent),
//! send the request and read the answer's head.
//!
//! A POST that may have reached a backend is never sent twice. A connect failure (nothing was
//! sent) moves on to the next address, within `upstream.pending_timeout_ms` of the first
//! attempt, and a read (GET), which a backend may see twice, goes once more when its
//! kept-alive connection was reset (the backend had closed it, or closed it under the
//! request): to the next address in rotation, or the same one when no other is left, on a
//! new connection. The queue is before anything is sent: a request refused there
//! (503) went nowhere, nor does one whose client goes while it waits there. A request whose
//! address has no connection for it goes to the next address it has yet to try that has one
//! at once, as nginx's round robin passes a server at `max_conns` and HAProxy's one at
//! `maxconn`; it waits, or is refused when the queue is full, only when none has. While it
//! waits, a connection that comes back (or a place that frees) at an address nobody waits
//! for is offered to it, as HAProxy's backend queue hands its head to the first server with
//! a connection free. A wait ends within `upstream.pending_timeout_ms` of the first attempt,
//! as the walk does.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;
use pingora::{Error, ErrorType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::backends::{Address, AddressSet, Admit, Backends, Slot, Waiter};
use super::connect::Connect;
use super::forwarding::UpstreamRequest;
use super::health::UpstreamHealth;
use super::pool::{UpstreamConn, UpstreamPool};
use crate::api::failure::{
    Chain, Failure, OverflowReason, UpstreamError, UpstreamErrorKind, UpstreamOverflow,
};
use crate::config::{BudgetConfig, Snapshot};
use crate::http1::{reserve_for_read, HeadError, FIRST_BUFFER};
use crate::observe::backend::AddressView;
use crate::observe::exchange::UpstreamRecord;
use crate::policy::admit::RequestView;
use crate::policy::backend::order;

/// Longest response head accepted from a backend.
const MAX_UPSTREAM_HEAD: usize = 64 * 1024;

/// The backends of the current snapshot, as the proxy reaches them.
pub struct Upstream {
    connector: Arc<dyn Connect>,
    pool: Arc<UpstreamPool>,
    health: Arc<UpstreamHealth>,
    backends: Arc<Backends>,
    next_peer: AtomicUsize,
}

/// The backend's answer to an [`UpstreamRequest`]: its head read into the connection's
/// buffer, its body still to come, for [`super::relay`] to pass on.
pub struct UpstreamResponse {
    pub conn: UpstreamConn,
    /// When the request was sent.
    pub started: Instant,
}

/// A connection for a request: one from the pool, or the place to open one.
enum Acquired {
    Reused(UpstreamConn),
    Connect(Slot),
}

/// How a request's wait in an address's queue ended, other than refused or given up.
enum Turn {
    /// It was woken: its turn at the address it waited at.
    Here,
    /// Another address had a connection for it at once, taken.
    Elsewhere((usize, Acquired)),
}

/// What a request asks of an address for a connection.
#[derive(Clone, Copy)]
struct Ask {
    /// The connection budget it read (a reload may change it while the request waits).
    budget: BudgetConfig,
    idle_timeout: Duration,
    /// It may take an idle connection: a resend may not.
    reuse: bool,
    /// When its wait for a connection runs out: `upstream.pending_timeout_ms` after its first
    /// attempt began, at whichever address it waits.
    deadline: tokio::time::Instant,
}

/// How an exchange ended without an answer to relay.
#[derive(Debug)]
pub enum Unanswered {
    /// It failed: the gateway answers for it.
    Failed(Failure),
    /// The client went while the request waited for a connection: it was sent nowhere.
    ClientGone,
}

impl From<OverflowReason> for Unanswered {
    fn from(reason: OverflowReason) -> Self {
        Unanswered::Failed(UpstreamOverflow { reason }.into())
    }
}

impl From<UpstreamError> for Unanswered {
    fn from(failure: UpstreamError) -> Self {
        Unanswered::Failed(failure.into())
    }
}

impl Upstream {
    pub fn new(
        connector: Arc<dyn Connect>,
        pool: Arc<UpstreamPool>,
        health: Arc<UpstreamHealth>,
        backends: Arc<Backends>,
    ) -> Self {
        Upstream {
            connector,
            pool,
            health,
            backends,
            next_peer: AtomicUsize::new(0),
        }
    }

    pub fn pool(&self) -> &Arc<UpstreamPool> {
        &self.pool
    }

    /// The backend now: its addresses and the base they serve under, for one request to be
    /// shaped for and sent to ([`Self::exchange`]). Held by the request (not a guard: it
    /// lives across the send's awaits).
    pub fn backend(&self) -> Arc<AddressSet> {
        self.backends.current_full()
    }

    fn in_rotation(&self, address: &Address) -> bool {
        in_rotation(&self.health, address)
    }

    /// The answer that `address` began broke off (`kind`), before or after some of its data
    /// reached the client: it counts against the address as an answer that is not HTTP does.
    pub fn answer_broke(&self, snap: &Snapshot, address: &Address, kind: UpstreamErrorKind) {
        if counts_against(kind, false) {
            self.backends
                .failed(address, |a| self.health.is_up(&a.addr), &snap.upstream);
        }
    }

    /// A connection for a request to `set[picked]` as `ask` says: an idle one when it may
    /// reuse one and no request waits before it, else the place to open one. Without one
    /// there, the first of `others` (the addresses the request has yet to try, in rotation
    /// order) that has a connection for it at once, else a wait in the address's queue, where
    /// the first connection that comes back, or place that frees, at any of those addresses
    /// that nobody waits for is offered to it too. Refused when the queue is full and no
    /// address has one, or when the wait runs out; given up when `client_gone` (if any) is
    /// ready while it waits. `started` is when the attempt started. With the connection, the
    /// address it is to.
    async fn acquire<I: Iterator<Item = usize>>(
        &self,
        set: &[Arc<Address>],
        picked: usize,
        others: impl Fn() -> I,
        mut ask: Ask,
        started: Instant,
        mut client_gone: Pin<&mut Option<impl Future<Output = ()>>>,
    ) -> Result<(usize, Acquired), Unanswered> {
        let address = &set[picked];
        let mut woken = false;
        let mut now = tokio::time::Instant::from_std(started);
        loop {
            // Its turn: woken, or nobody waits before it.
            let its_turn = woken || address.nobody_waiting();
            if ask.reuse && its_turn {
                if let Some(conn) = self.pool.take(address.key, ask.idle_timeout, now) {
                    return Ok((picked, Acquired::Reused(conn)));
                }
            }
            let admitted = address.admit(&ask.budget, woken);
            // A resend may not reuse an idle connection, but on its turn it takes the place of
            // one (closing it) rather than wait: woken by each connection that comes back, it
            // would wait for one to close while the idle ones piled up and the queue behind it
            // stalled.
            if !ask.reuse && its_turn && !matches!(admitted, Ok(Admit::Connect(_))) {
                if let Some(slot) = self.pool.take_place(address.key, ask.idle_timeout, now) {
                    return Ok((picked, Acquired::Connect(slot)));
                }
            }
            let mut waiter = match admitted {
                Ok(Admit::Connect(slot)) => return Ok((picked, Acquired::Connect(slot))),
                Ok(Admit::Wait(waiter)) => waiter,
                // The queue is full; an address further on may take the request at once.
                Err(refused) => {
                    return self
                        .room_among(set, others(), &ask, now)
                        .ok_or_else(|| refused.into())
                }
            };
            // A reload may have changed the budget since this request read it: it then asks
            // again under the one of now. A reload after this look finds it waiting, and wakes
            // it if the new budget has room (the set is stored before the waiting are woken).
            if let Some(latest) = self.backends.current().budget {
                if latest != ask.budget {
                    ask.budget = latest;
                    drop(waiter);
                    continue;
                }
            }
            // Another address may have a connection for it at once: it goes there rather than
            // wait here. Looked at once in the queue, so that one freed after the look tells it.
            if let Some(found) = self.room_among(set, others(), &ask, now) {
                return Ok(found);
            }
            match self
                .wait_turn(
                    address,
                    &mut waiter,
                    set,
                    &others,
                    &ask,
                    client_gone.as_mut(),
                )
                .await?
            {
                Turn::Here => {}
                Turn::Elsewhere(found) => return Ok(found),
            }
            woken = true;
            now = tokio::time::Instant::now();
        }
    }

    /// Waits in `waiter`'s queue at `address` until it is woken (its turn at its address), or until
    /// another of `others` has a connection for `ask` at once, which it takes (told by
    /// [`Address::room_elsewhere`], it looks, keeping its place here while it finds none).
    /// Refused when `ask`'s deadline passes; given up when `client_gone` is ready. The client
    /// is watched only here: a request that does not wait costs no watch.
    async fn wait_turn<I: Iterator<Item = usize>>(
        &self,
        address: &Address,
        waiter: &mut Waiter,
        set: &[Arc<Address>],
        others: impl Fn() -> I,
        ask: &Ask,
        mut client_gone: Pin<&mut Option<impl Future<Output = ()>>>,
    ) -> Result<Turn, Unanswered> {
        let elsewhere = others().next().is_some();
        loop {
            tokio::select! {
                biased;
                () = until_gone(client_gone.as_mut()) => return Err(Unanswered::ClientGone),
                in_time = tokio::time::timeout_at(ask.deadline, waiter.woken()) => {
                    return match in_time {
                        Ok(()) => Ok(Turn::Here),
                        Err(_) => Err(OverflowReason::Timeout.into()),
                    };
                }
                () = address.room_elsewhere(), if elsewhere => {
                    let now = tokio::time::Instant::now();
                    if let Some(found) = self.room_among(set, others(), ask, now) {
                        return Ok(Turn::Elsewhere(found));
                    }
                }
            }
        }
    }

    /// The first of `addresses` (indices into `set`) that has a connection for `ask` at once
    /// ([`Self::room_at`]), and that connection.
    fn room_among(
        &self,
        set: &[Arc<Address>],
        mut addresses: impl Iterator<Item = usize>,
        ask: &Ask,
        now: tokio::time::Instant,
    ) -> Option<(usize, Acquired)> {
        addresses.find_map(|i| Some((i, self.room_at(&set[i], ask, now)?)))
    }

    /// A connection to `address` for `ask` with no wait, if it has one: an idle one when
    /// nobody waits for it, else a place under its budget, else (for a resend, which may not
    /// reuse one) the place of an idle one.
    fn room_at(
        &self,
        address: &Arc<Address>,
        ask: &Ask,
        now: tokio::time::Instant,
    ) -> Option<Acquired> {
        let its_turn = address.nobody_waiting();
        if ask.reuse && its_turn {
            if let Some(conn) = self.pool.take(address.key, ask.idle_timeout, now) {
                return Some(Acquired::Reused(conn));
            }
        }
        if let Some(slot) = address.admit_at_once(&ask.budget) {
            return Some(Acquired::Connect(slot));
        }
        if ask.reuse || !its_turn {
            return None;
        }
        (self.pool)
            .take_place(address.key, ask.idle_timeout, now)
            .map(Acquired::Connect)
    }

    /// The addresses of `set` a request's walk from `first` has yet to try, in rotation
    /// order, but `tried`. Addresses that failed their health check or are ejected leave the
    /// rotation, unless all have.
    fn untried<'a>(
        &'a self,
        set: &'a [Arc<Address>],
        first: usize,
        tried: &'a [usize],
    ) -> impl Iterator<Item = usize> + 'a {
        order(first, set.len(), |i| self.in_rotation(&set[i])).filter(move |i| !tried.contains(i))
    }

    /// Sends `request`, shaped for `backend` ([`Self::backend`]), to one of its addresses and
    /// reads the head of its answer; the failures on the way are noted in `record` and
    /// logged. `Err` is the failure that ended the exchange, or `client_gone` ready while the
    /// request waited for a connection. Once the request is being sent, its client is no
    /// longer watched (`client_gone` is dropped, and with it the watch's descriptor): a request
    /// sent, or resent, is answered whatever its client does meanwhile.
    pub async fn exchange<R: RequestView>(
        &self,
        snap: &Snapshot,
        backend: &AddressSet,
        request: &UpstreamRequest<'_, R>,
        idempotent: bool,
        record: &mut UpstreamRecord,
        mut client_gone: Pin<&mut Option<impl Future<Output = ()>>>,
    ) -> Result<UpstreamResponse, Unanswered> {
        let request_id = request.request_id;
        let upstream = &snap.upstream;
        let set = &backend.addresses;
        let first = self.next_peer.fetch_add(1, Ordering::Relaxed);
        let mut last_failure = UpstreamError::new(
            UpstreamErrorKind::Connect,
            "no backend address to connect to",
        );
        let mut resent = false;
        // The addresses whose connect failed, or whose kept-alive connection was reset: the
        // walk goes on past them (no allocation until one is).
        let mut tried = Vec::new();
        // The address a resend goes to when the rotation has no other.
        let mut again = None;
        let budget = backend.budget.unwrap_or(upstream.budget);
        // The first connect has its whole timeout. After one fails, the request moves on only
        // while it has looked for a connection less than `upstream.pending_timeout_ms`, each
        // connect limited to what is left: N addresses whose connects time out (all out of
        // rotation, all tried) cost that, not N connect timeouts. The first attempt's start is
        // when it began looking (no clock read of its own: most requests never fail a connect).
        let mut first_started = None;
        let mut connect_limit = upstream.connect_timeout;
        while let Some(picked) = again
            .take()
            .or_else(|| self.untried(set, first, &tried).next())
        {
            let started = Instant::now();
            let looking_since = *first_started.get_or_insert(started);
            let ask = Ask {
                budget,
                idle_timeout: upstream.idle_timeout,
                // A resent request goes on a new connection, never on another pooled one.
                reuse: !resent,
                // A wait at a further address is part of the walk: it ends when the walk does.
                deadline: tokio::time::Instant::from_std(looking_since) + budget.pending_timeout,
            };
            let others = || {
                self.untried(set, first, &tried)
                    .filter(move |&i| i != picked)
            };
            let (index, acquired) = self
                .acquire(set, picked, others, ask, started, client_gone.as_mut())
                .await?;
            let address = &set[index];
            let peer = &address.peer;
            let reused = matches!(acquired, Acquired::Reused(_));
            record.attempt(address.addr, started, reused);
            let mut conn = match acquired {
                Acquired::Reused(conn) => conn,
                Acquired::Connect(slot) => {
                    match self.connector.connect(peer, connect_limit).await {
                        Ok(stream) => {
                            record.connect_time = Some(started.elapsed());
                            UpstreamConn::new(stream, slot)
                        }
                        Err(e) => {
                            let failure =
                                UpstreamError::caused(classify(&e), "connecting to the backend", e);
                            record.errors.push(failure.kind);
                            tracing::warn!(request_id = %request_id, peer = %peer, error = %Chain(&failure), "upstream connect failed");
                            self.backends
                                .failed(address, |a| self.health.is_up(&a.addr), upstream);
                            last_failure = failure;
                            tried.push(index);
                            // The runtime's clock, as the queue's wait reads it (tests pause it).
                            let looked = tokio::time::Instant::from_std(looking_since).elapsed();
                            let left = budget.pending_timeout.saturating_sub(looked);
                            connect_limit = upstream.connect_timeout.min(left);
                            if connect_limit.is_zero() {
                                break;
                            }
                            continue;
                        }
                    }
                }
            };
            client_gone.set(None);
            match send_and_read_head(&mut conn, request, upstream.read_timeout).await {
                Ok(()) => {
                    // The address's streak of failures ends with the whole answer
                    // (`relay`), not its head: a body that breaks off counts too.
                    record.header_time = Some(started.elapsed());
                    return Ok(UpstreamResponse { conn, started });
                }
                Err(failure) => {
                    record.errors.push(failure.kind);
                    tracing::warn!(request_id = %request_id, peer = %peer, reused, error = %Chain(&failure), "upstream exchange failed");
                    if counts_against(failure.kind, reused) {
                        self.backends
                            .failed(address, |a| self.health.is_up(&a.addr), upstream);
                    }
                    // A kept-alive connection the backend had already closed: a read goes
                    // once more, to the next address in rotation (this one just failed), or
                    // to this one when no other is left, on a new connection. A POST never
                    // does.
                    if reused && idempotent && !resent && failure.kind == UpstreamErrorKind::Reset {
                        resent = true;
                        // It looks for a connection afresh: the time its first exchange took
                        // (up to `read_timeout`) was not spent looking, and would leave its
                        // wait at a busy address no time at all.
                        first_started = None;
                        tried.push(index);
                        if self.untried(set, first, &tried).next().is_none() {
                            again = Some(index);
                        }
                        last_failure = failure;
                        continue;
                    }
                    record.header_time = Some(started.elapsed());
                    return Err(failure.into());
                }
            }
        }
        Err(last_failure.into())
    }
}

/// Ready when `client_gone` is; never when the client is not watched.
async fn until_gone(client_gone: Pin<&mut Option<impl Future<Output = ()>>>) {
    match client_gone.as_pin_mut() {
        Some(gone) => gone.await,
        None => std::future::pending().await,
    }
}

/// Whether a failure of kind `kind` counts against its address toward ejection: a new
/// connection that broke, or an answer that is not HTTP, does; a slow answer does not, nor a
/// reset on a kept-alive connection before its answer began (`reused_before_head`: the
/// backend had closed it while it was idle).
fn counts_against(kind: UpstreamErrorKind, reused_before_head: bool) -> bool {
    kind != UpstreamErrorKind::Timeout && !(reused_before_head && kind == UpstreamErrorKind::Reset)
}

/// Whether `address` takes requests: it passed its last check and is not ejected.
fn in_rotation(health: &UpstreamHealth, address: &Address) -> bool {
    health.is_up(&address.addr) && !address.is_ejected()
}

/// The addresses as the per-address gauges show them.
pub fn address_views(
    backends: &Backends,
    pool: &UpstreamPool,
    health: &UpstreamHealth,
) -> Vec<AddressView> {
    backends
        .current()
        .addresses
        .iter()
        .map(|a| {
            let idle = pool.idle_count_of(a.key);
            AddressView {
                address: a.addr.to_string(),
                up: in_rotation(health, a),
                active: a.open().saturating_sub(idle),
                idle,
                waiting: a.waiting(),
            }
        })
        .collect()
}

/// Writes the request (its head, with a small body inside the same buffer, and any larger
/// body from where it lies), then reads until the final (non-1xx) answer head is parsed.
async fn send_and_read_head<R: RequestView>(
    up: &mut UpstreamConn,
    request: &UpstreamRequest<'_, R>,
    read_timeout: Duration,
) -> Result<(), UpstreamError> {
    // Room for a usual head and small body, then the answer's head, in one allocation (a
    // larger body grows it once, as it is appended).
    up.buf.reserve(FIRST_BUFFER);
    request.write_head(&mut up.buf);
    let (stream, head) = (&mut up.stream, &up.buf);
    let write = async {
        stream.write_all(head).await?;
        if let Some(body) = request.separate_body() {
            stream.write_all(body).await?;
        }
        stream.flush().await
    };
    match up.timer.limit(read_timeout, write).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(UpstreamError::io("writing the request upstream", e)),
        Err(_) => {
            return Err(UpstreamError::new(
                UpstreamErrorKind::Timeout,
                "writing the request upstream",
            ))
        }
    }
    up.buf.clear();
    loop {
        match up.head.parse(&up.buf) {
            // The gateway never asks for an upgrade: a 101 is no interim answer to skip.
            Ok(true) if up.head.status == 101 => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend switched protocols unasked (101)",
                ))
            }
            Ok(true) if (100..200).contains(&up.head.status) => {
                up.buf.advance(up.head.len);
                continue;
            }
            Ok(true) => return Ok(()),
            Ok(false) if up.buf.len() <= MAX_UPSTREAM_HEAD => {}
            Err(HeadError::UnsupportedTransferCoding) => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend's answer has a transfer coding other than chunked",
                ))
            }
            _ => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Other,
                    "the backend's response head is not HTTP/1.x",
                ))
            }
        }
        reserve_for_read(&mut up.buf, FIRST_BUFFER);
        match up
            .timer
            .limit(read_timeout, up.stream.read_buf(&mut up.buf))
            .await
        {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Reset,
                    "the backend closed the connection before answering",
                ))
            }
            Ok(Err(e)) => return Err(UpstreamError::io("reading the response head", e)),
            Err(_) => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Timeout,
                    "no response head in time",
                ))
            }
        }
    }
}

/// Sorts a pingora error into the kinds that metrics and answers distinguish.
fn classify(e: &Error) -> UpstreamErrorKind {
    match e.etype() {
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            UpstreamErrorKind::Timeout
        }
        ErrorType::ConnectRefused
        | ErrorType::ConnectNoRoute
        | ErrorType::ConnectError
        | ErrorType::SocketError => UpstreamErrorKind::Connect,
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError => {
            UpstreamErrorKind::Reset
        }
        _ => UpstreamErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;
    use crate::observe::telemetry::Telemetry;
    use crate::proxy::connect::ConnectFuture;
    use pingora::upstreams::peer::HttpPeer;

    /// A connector never asked: [`Upstream::acquire`] only finds a connection or a place.
    struct NoConnect;

    impl Connect for NoConnect {
        fn connect<'a>(&'a self, _peer: &'a HttpPeer, _limit: Duration) -> ConnectFuture<'a> {
            unreachable!("acquire opens no connection")
        }
    }

    /// An address allowed one connection, with what [`Upstream::acquire`] needs.
    struct OneConnection {
        upstream: Upstream,
        pool: Arc<UpstreamPool>,
        set: Arc<AddressSet>,
        snapshot: Snapshot,
    }

    fn one_connection() -> OneConnection {
        let backend: std::net::SocketAddr = "10.0.0.1:80".parse().unwrap();
        let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend]);
        cfg.upstream.max_connections_per_address = Some(1);
        let snapshot = cfg.snapshot();
        let (upstream, backends) = upstream_over(&snapshot, Arc::new(NoConnect));
        let pool = upstream.pool().clone();
        let set = backends.current_full();
        OneConnection {
            upstream,
            pool,
            set,
            snapshot,
        }
    }

    impl OneConnection {
        /// Its one connection, open (busy until it is put in the pool), and the backend's end.
        fn open(&self) -> (UpstreamConn, tokio::io::DuplexStream) {
            let Ok(Admit::Connect(slot)) =
                self.set.addresses[0].admit(&self.snapshot.upstream.budget, false)
            else {
                panic!("the first connection is within the budget");
            };
            let (gateway_end, backend_end) = tokio::io::duplex(64);
            (UpstreamConn::new(Box::new(gateway_end), slot), backend_end)
        }

        /// A request to the address that read `budget`, may reuse an idle connection when
        /// `reuse`, and whose client goes when `client_gone` is ready.
        async fn acquire(
            &self,
            budget: BudgetConfig,
            reuse: bool,
            client_gone: Pin<&mut Option<impl Future<Output = ()>>>,
        ) -> Result<Acquired, Unanswered> {
            let started = Instant::now();
            let ask = Ask {
                budget,
                idle_timeout: self.snapshot.upstream.idle_timeout,
                reuse,
                deadline: tokio::time::Instant::from_std(started) + budget.pending_timeout,
            };
            let (_, acquired) = (self.upstream)
                .acquire(
                    &self.set.addresses,
                    0,
                    std::iter::empty,
                    ask,
                    started,
                    client_gone,
                )
                .await?;
            Ok(acquired)
        }

        /// A resend (no reuse) to the address.
        async fn resend(&self) -> Result<Acquired, Unanswered> {
            let gone = std::pin::pin!(None::<std::future::Pending<()>>);
            self.acquire(self.snapshot.upstream.budget, false, gone)
                .await
        }
    }

    /// A resend waiting for the address's one connection is woken when it comes back: it
    /// may not reuse it, and takes its place (closing it) rather than wait for a connection
    /// to close, which the queue behind it would have waited for too.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_woken_resend_takes_the_place_of_the_idle_connection_that_woke_it() {
        let one = one_connection();
        let (busy, _backend) = one.open();
        let give_back = async {
            tokio::task::yield_now().await;
            one.pool.put(busy, tokio::time::Instant::now());
        };
        let (acquired, ()) = tokio::join!(one.resend(), give_back);
        assert!(matches!(acquired, Ok(Acquired::Connect(_))));
        assert_eq!(one.pool.idle_count(), 0, "the idle connection was closed");
        assert_eq!(one.set.addresses[0].open(), 1, "its place is the resend's");
    }

    /// A request that read the budget before a reload raised it, and asks for its place after
    /// the reload woke those waiting (none then), is admitted under the budget of now rather
    /// than queued under the old one.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_that_read_the_budget_before_a_reload_is_admitted_under_the_new_one() {
        let one = one_connection();
        let (_busy, _backend) = one.open();
        let read_before = one.snapshot.upstream.budget;
        let mut raised = one.snapshot.upstream.clone();
        raised.budget.max_connections_per_address = Some(2);
        one.upstream
            .backends
            .follow(&raised, &one.snapshot.bases.upstream);
        let gone = std::pin::pin!(None::<std::future::Pending<()>>);
        let acquired = one.acquire(read_before, true, gone).await;
        assert!(matches!(acquired, Ok(Acquired::Connect(_))));
        assert_eq!(one.set.addresses[0].open(), 2);
    }

    /// An `Upstream` over `connector` to the backend of `snap`, and the addresses it follows.
    fn upstream_over(snap: &Snapshot, connector: Arc<dyn Connect>) -> (Upstream, Arc<Backends>) {
        let telemetry = Telemetry::register(&prometheus::Registry::new()).unwrap();
        let backends = Arc::new(Backends::new(telemetry.backends.clone()));
        backends.follow(&snap.upstream, &snap.bases.upstream);
        let upstream = Upstream::new(
            connector,
            Arc::new(UpstreamPool::new(8)),
            Arc::new(UpstreamHealth::default()),
            backends.clone(),
        );
        (upstream, backends)
    }

    /// A client's GET of a transaction's status: its head, parsed.
    const STATUS_GET: &[u8] = b"GET /api/v2/transaction/t/status HTTP/1.1\r\nHost: gw\r\n\r\n";

    fn status_head() -> crate::http1::RequestHead {
        let mut head = crate::http1::RequestHead::default();
        assert_eq!(head.parse(STATUS_GET), Ok(true));
        head
    }

    /// That GET as it goes upstream.
    fn status_request<'a>(
        view: &'a crate::http1::Request<'a>,
    ) -> UpstreamRequest<'a, crate::http1::Request<'a>> {
        UpstreamRequest {
            view,
            body: b"",
            path: "/api/v2/transaction/t/status",
            request_id: "test",
            client_ip: None,
            proto: "http",
            trace: None,
        }
    }

    /// A connector whose connects never complete: each runs to its limit, and is counted.
    #[derive(Default)]
    struct NeverConnects(AtomicUsize);

    impl Connect for NeverConnects {
        fn connect<'a>(&'a self, _peer: &'a HttpPeer, limit: Duration) -> ConnectFuture<'a> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(limit).await;
                Err(Error::new(ErrorType::ConnectTimedout))
            })
        }
    }

    /// After a failed connect the request moves on only within `upstream.pending_timeout_ms`
    /// of its first attempt, each connect limited to what is left: 8 addresses whose connects
    /// time out (200 ms each, 700 ms in all) are tried 4 times, not 8, and the answer is the
    /// last timeout.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_walk_over_addresses_that_do_not_connect_ends_within_the_pending_timeout() {
        let addresses: Vec<std::net::SocketAddr> = (1..=8)
            .map(|i| format!("10.0.0.{i}:80").parse().unwrap())
            .collect();
        let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &addresses);
        cfg.upstream.connect_timeout_ms = 200;
        cfg.upstream.pending_timeout_ms = 700;
        let snap = cfg.snapshot();
        let connector = Arc::new(NeverConnects::default());
        let (upstream, backends) = upstream_over(&snap, connector.clone());
        let head = status_head();
        let view = head.view(STATUS_GET);
        let request = status_request(&view);
        let answer = upstream
            .exchange(
                &snap,
                &backends.current_full(),
                &request,
                true,
                &mut UpstreamRecord::default(),
                std::pin::pin!(None::<std::future::Pending<()>>),
            )
            .await;
        let Err(Unanswered::Failed(Failure::Upstream(failure))) = answer else {
            panic!("the exchange did not fail at the backend");
        };
        assert_eq!(failure.kind, UpstreamErrorKind::Timeout);
        // 200 + 200 + 200 + the 100 ms left. (The first attempt's start is read from the
        // system's clock, a few real milliseconds off the paused one: not 100.)
        assert_eq!(connector.0.load(Ordering::SeqCst), 4);
    }

    /// A request that moves on after a failed connect, and waits at the next address, waits
    /// only what is left of `upstream.pending_timeout_ms` since its first attempt: 1.2 s in
    /// all, not a connect timeout (1 s) and then 1.2 s more. On the real clock: a wait's start
    /// is read from the system's clock, which a paused one does not move.
    #[tokio::test(flavor = "current_thread")]
    async fn a_wait_after_a_failed_connect_ends_at_the_pending_timeout_of_the_first_attempt() {
        let addresses: Vec<std::net::SocketAddr> = vec![
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        ];
        let mut cfg = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &addresses);
        cfg.upstream.connect_timeout_ms = 1_000;
        cfg.upstream.pending_timeout_ms = 1_200;
        cfg.upstream.max_connections_per_address = Some(1);
        let snap = cfg.snapshot();
        let connector = Arc::new(NeverConnects::default());
        let (upstream, backends) = upstream_over(&snap, connector.clone());
        let set = backends.current_full();
        let Ok(Admit::Connect(_busy)) = set.addresses[1].admit(&snap.upstream.budget, false) else {
            panic!("the second address's one connection is free");
        };
        let head = status_head();
        let view = head.view(STATUS_GET);
        let request = status_request(&view);
        let began = Instant::now();
        let answer = upstream
            .exchange(
                &snap,
                &set,
                &request,
                true,
                &mut UpstreamRecord::default(),
                std::pin::pin!(None::<std::future::Pending<()>>),
            )
            .await;
        assert!(matches!(
            answer,
            Err(Unanswered::Failed(Failure::Overflow(UpstreamOverflow {
                reason: OverflowReason::Timeout
            })))
        ));
        assert_eq!(
            connector.0.load(Ordering::SeqCst),
            1,
            "one connect, to the first"
        );
        let waited = began.elapsed();
        assert!(waited < Duration::from_millis(1_700), "{waited:?}");
    }

    /// A connector that hands out one end of an in-memory connection, whose other end a test
    /// plays the backend on.
    struct OneDuplex(std::sync::Mutex<Option<tokio::io::DuplexStream>>);

    impl Connect for OneDuplex {
        fn connect<'a>(&'a self, _peer: &'a HttpPeer, _limit: Duration) -> ConnectFuture<'a> {
            let end = self.0.lock().unwrap().take().expect("one connect");
            Box::pin(async move { Ok(Box::new(end) as pingora::protocols::Stream) })
        }
    }

    /// Sets its flag when dropped.
    struct DropFlag(Arc<std::sync::atomic::AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// The watch on the client is dropped as the request is sent (and its descriptor with
    /// it): a request sent, or resent after a reset, is answered whatever its client does.
    #[tokio::test(flavor = "current_thread")]
    async fn the_client_is_watched_no_longer_once_its_request_is_sent() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let backend_addr: std::net::SocketAddr = "10.0.0.1:80".parse().unwrap();
        let snap = FileConfig::for_test("127.0.0.1:0".parse().unwrap(), &[backend_addr]).snapshot();
        let (gateway_end, mut backend_end) = tokio::io::duplex(4096);
        let connector = OneDuplex(std::sync::Mutex::new(Some(gateway_end)));
        let (upstream, backends) = upstream_over(&snap, Arc::new(connector));
        let head = status_head();
        let view = head.view(STATUS_GET);
        let request = status_request(&view);
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let watch = async move {
            let _flag = flag;
            std::future::pending::<()>().await
        };
        let backend = async {
            let mut buf = [0u8; 4096];
            assert!(backend_end.read(&mut buf).await.unwrap() > 0);
            let dropped_when_sent = dropped.load(Ordering::SeqCst);
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
            backend_end.write_all(answer).await.unwrap();
            dropped_when_sent
        };
        let (set, mut record) = (backends.current_full(), UpstreamRecord::default());
        let watch = std::pin::pin!(Some(watch));
        let exchange = upstream.exchange(&snap, &set, &request, true, &mut record, watch);
        let (answer, dropped_when_sent) = tokio::join!(exchange, backend);
        assert!(answer.is_ok(), "the backend's 200 is the answer");
        assert!(
            dropped_when_sent,
            "the watch was held still when the request reached the backend"
        );
    }

    /// A request whose client goes while it waits gives up its place in the queue.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_waiting_request_whose_client_goes_leaves_the_queue() {
        let one = one_connection();
        let (_busy, _backend) = one.open();
        let address = &one.set.addresses[0];
        let up = &one.snapshot.upstream;
        let (leave, left) = tokio::sync::oneshot::channel::<()>();
        let client_gone = std::pin::pin!(Some(async {
            let _ = left.await;
        }));
        let waiting = one.acquire(up.budget, true, client_gone);
        let goes = async {
            tokio::task::yield_now().await;
            assert!(!address.nobody_waiting(), "it waits for the one connection");
            leave.send(()).unwrap();
        };
        let (acquired, ()) = tokio::join!(waiting, goes);
        assert!(matches!(acquired, Err(Unanswered::ClientGone)));
        assert!(address.nobody_waiting());
    }

    /// A resend behind a request already waiting does not take the idle connection's place
    /// before that request's turn.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_resend_does_not_take_a_place_before_those_waiting() {
        let one = one_connection();
        let (idle, _backend) = one.open();
        one.pool.put(idle, tokio::time::Instant::now());
        let Ok(Admit::Wait(_waiting)) =
            one.set.addresses[0].admit(&one.snapshot.upstream.budget, false)
        else {
            panic!("another request waits: the one place is taken");
        };
        assert!(matches!(
            one.resend().await,
            Err(Unanswered::Failed(Failure::Overflow(UpstreamOverflow {
                reason: OverflowReason::Timeout
            })))
        ));
        assert_eq!(one.pool.idle_count(), 1);
    }
}
