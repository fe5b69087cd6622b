//! Kept-alive backend connections, idle between requests.
//!
//! pingora's own pool spawns a watcher task, a semaphore and a notifier per released
//! connection; this one is a locked stack per backend, newest first (the connection most
//! likely still open is reused). An idle connection is watched by the
//! runtime, as nginx's keepalive close handler and HAProxy's idle-connection polling do:
//! when it is put back, its read side is polled once with a waker of its own, so bytes or a
//! FIN that arrive while it is idle wake [`PoolSweeper`] as the runtime sees them, which
//! closes it. Taking a quiet connection costs no system call. A connection to an address
//! that left the set, or past its address's budget (a reload lowered
//! `upstream.max_connections_per_address`), is never kept: it closes when its request is
//! done, or at the next sweep when it sat idle, the oldest first.
//!
//! The window left is the one nginx and HAProxy have too: bytes in flight at the instant of
//! the take, or arrived in the kernel in the same turn of the event loop that takes the
//! connection, before the runtime has read its readiness events. A request on such a
//! connection meets the backend's bytes as its answer's start or a reset; a reset of a
//! reused connection is retried for idempotent requests only (`proxy::upstream`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

// The runtime's clock: idle connections age with it, a paused test clock included.
use tokio::time::Instant;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::BytesMut;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;

use super::backends::{Backends, Slot};
use super::timer::LazyTimer;
use crate::config::Snapshot;
use crate::http1::ResponseHead;

/// A connection to a backend with its buffer (allocated while it carries an exchange),
/// parsed-head scratch space, and the timer of its reads and writes.
pub struct UpstreamConn {
    pub stream: Stream,
    pub buf: BytesMut,
    pub head: ResponseHead,
    pub timer: LazyTimer,
    /// Its place in its address's count of connections, freed when it closes.
    pub slot: Slot,
    /// The waker it is watched with while idle: made when it first comes back to the pool,
    /// kept for its life.
    idle_watch: Option<Arc<IdleWatch>>,
}

impl UpstreamConn {
    pub fn new(stream: Stream, slot: Slot) -> Self {
        UpstreamConn {
            stream,
            buf: BytesMut::new(),
            head: ResponseHead::default(),
            timer: LazyTimer::default(),
            slot,
            idle_watch: None,
        }
    }

    /// Watches an idle connection: polls its read side once with its idle watch's waker.
    /// `false` when the backend has already closed it or sent something unasked (or it has
    /// no watch).
    fn watch(&mut self) -> bool {
        let Some(watch) = &self.idle_watch else {
            return false;
        };
        let waker = Waker::from(watch.clone());
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        // Usually no system call: the read that ended the last answer was short, so the
        // runtime knows the socket has nothing more to read until it says otherwise.
        let read =
            Pin::new(&mut self.stream).poll_read(&mut Context::from_waker(&waker), &mut probe);
        read.is_pending()
    }

    /// Whether its watch woke since it was last polled (and it should be polled again).
    fn woke_while_idle(&self) -> bool {
        self.idle_watch
            .as_ref()
            .is_some_and(|w| w.woken.swap(false, Ordering::Relaxed))
    }
}

/// The waker an idle connection's read side is polled with: readiness while idle (bytes, a
/// FIN, an error) means the connection is likely done; it is polled again to know.
struct IdleWatch {
    woken: AtomicBool,
    /// Wakes the sweeper to look at it now rather than at the next expiry.
    sweep: Arc<Notify>,
}

impl Wake for IdleWatch {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Called by the runtime's I/O driver: only a flag and a notification, no locks.
        if !self.woken.swap(true, Ordering::Relaxed) {
            self.sweep.notify_one();
        }
    }
}

struct Idle {
    conn: UpstreamConn,
    since: Instant,
}

impl Idle {
    /// Whether the connection may carry a request: younger than `idle_timeout`, to an
    /// address still in the set, and quiet. One whose watch woke is polled again: a TLS
    /// record that carries no data (a session ticket) leaves it quiet and watched; bytes or a
    /// FIN do not.
    fn usable(&mut self, idle_timeout: Duration, now: Instant) -> bool {
        if self.expired(idle_timeout, now) || self.conn.slot.address().is_retired() {
            return false;
        }
        !self.conn.woke_while_idle() || self.conn.watch()
    }

    /// Whether it has been idle for `idle_timeout` at `now`.
    fn expired(&self, idle_timeout: Duration, now: Instant) -> bool {
        now.saturating_duration_since(self.since) >= idle_timeout
    }
}

/// Hashes a pool key as itself: the key is already a hash of its peer (`reuse_hash`), and
/// SipHash over it again cost as much as the rest of a take or a put.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// Idle connections by pool key.
type IdleByKey = HashMap<u64, Vec<Idle>, BuildHasherDefault<KeyHasher>>;

/// Idle connections per backend key (the peer's reuse hash), at most `max_per_key` each.
pub struct UpstreamPool {
    idle: Mutex<IdleByKey>,
    max_per_key: usize,
    /// Wakes [`PoolSweeper`]: a watched connection closed, or the first one came in.
    sweep: Arc<Notify>,
}

/// A connection [`UpstreamPool::put`] has checked and watches, before it takes the pool's
/// lock, and the budget of its address it was checked against.
struct Checked {
    conn: UpstreamConn,
    cap: usize,
}

impl UpstreamPool {
    pub fn new(max_per_key: usize) -> Self {
        UpstreamPool {
            idle: Mutex::new(IdleByKey::default()),
            max_per_key,
            sweep: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, IdleByKey> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest idle connection to `key` that the backend has not closed and that is
    /// younger than `idle_timeout` at `now` (the caller's reading of the clock, taken for
    /// its request anyway).
    pub fn take(&self, key: u64, idle_timeout: Duration, now: Instant) -> Option<UpstreamConn> {
        loop {
            let mut idle = self.lock().get_mut(&key)?.pop()?;
            if idle.usable(idle_timeout, now) {
                return Some(idle.conn);
            }
            // Closed (dropped outside the lock), or expired: then all older ones are too,
            // and the sweeper closes them.
            if idle.expired(idle_timeout, now) {
                return None;
            }
        }
    }

    /// The place of the newest idle connection to `key` (as [`UpstreamPool::take`] finds it),
    /// which is closed: for a request that may not reuse one (a resend) while its address has
    /// no place free.
    pub fn take_place(&self, key: u64, idle_timeout: Duration, now: Instant) -> Option<Slot> {
        self.take(key, idle_timeout, now).map(|idle| idle.slot)
    }

    /// Keeps `conn` for reuse and watches it while idle, unless its address left the set,
    /// has more connections open than its budget allows (a reload lowered it) or already has
    /// `max_per_key` idle connections, the backend has closed it, or bytes past its answer
    /// are left unread (they would be read as the next request's answer); the oldest request
    /// waiting for the address may then take it. `now` is when its exchange ended.
    pub fn put(&self, conn: UpstreamConn, now: Instant) {
        if let Some(checked) = self.check(conn) {
            self.keep(checked, now);
        }
    }

    /// The half of [`Self::put`] before the pool's lock: `conn`, watched, if it may be kept,
    /// with the budget it was checked against. [`Self::keep`] looks again at what a reload
    /// may have changed meanwhile.
    fn check(&self, mut conn: UpstreamConn) -> Option<Checked> {
        let (cap, retired) = (conn.slot.address().cap(), conn.slot.address().is_retired());
        if retired || conn.slot.free_past_budget() || !conn.buf.is_empty() {
            return None;
        }
        // An idle connection holds no buffer (as a client's does not): a pool filled by a
        // burst would otherwise keep a buffer per connection until it empties.
        conn.buf = BytesMut::new();
        let watch = conn.idle_watch.get_or_insert_with(|| {
            Arc::new(IdleWatch {
                woken: AtomicBool::new(false),
                sweep: self.sweep.clone(),
            })
        });
        watch.woken.store(false, Ordering::Relaxed);
        conn.watch().then_some(Checked { conn, cap })
    }

    /// The half of [`Self::put`] under the pool's lock.
    fn keep(&self, Checked { mut conn, cap }: Checked, now: Instant) {
        let address = conn.slot.address().clone();
        let mut idle = self.lock();
        // A reload since the check may have had its sweep already, before this connection
        // was in the pool to close: under the lock the sweep takes, the address is looked at
        // again, whether it left the set and, when it changed, its budget (two loads, on the
        // common path).
        if address.is_retired() || (address.cap() != cap && conn.slot.free_past_budget()) {
            drop(idle);
            return;
        }
        let was_empty = idle.is_empty();
        let stack = idle.entry(address.key).or_default();
        if stack.len() < self.max_per_key {
            stack.push(Idle { conn, since: now });
        }
        drop(idle);
        if was_empty {
            // The sweeper sleeps without a deadline while the pool is empty.
            self.sweep.notify_one();
        }
        address.returned();
    }

    /// Closes every connection idle for `idle_timeout`, closed by its backend, or to an
    /// address that left the set, and the oldest of those past their address's budget; says
    /// when the next one expires, if any is left.
    pub fn evict(&self, idle_timeout: Duration) -> Option<Instant> {
        let mut idle = self.lock();
        let now = Instant::now();
        for stack in idle.values_mut() {
            stack.retain_mut(|i| i.usable(idle_timeout, now));
            // A stack's connections are all to one address (its key is how it is reached):
            // once one is within the budget, the newer ones are too.
            let mut past = 0;
            while stack
                .get_mut(past)
                .is_some_and(|i| i.conn.slot.free_past_budget())
            {
                past += 1;
            }
            stack.drain(..past);
        }
        idle.retain(|_, stack| !stack.is_empty());
        // A stack is in the order its connections came back: the first is the oldest.
        let next_expiry = idle
            .values()
            .filter_map(|stack| stack.first())
            .map(|oldest| oldest.since + idle_timeout)
            .min();
        next_expiry
    }

    /// Idle connections kept for `key` right now.
    pub fn idle_count_of(&self, key: u64) -> usize {
        self.lock().get(&key).map_or(0, Vec::len)
    }

    /// Idle connections kept right now.
    pub fn idle_count(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

/// Closes idle connections the backend closed as soon as their watch says so, those of an
/// address that left the set as soon as it left, those past a lowered budget as soon as it
/// is lowered, and expired ones when they expire
/// (`upstream.idle_timeout_ms`). With no idle connection it sleeps until one comes: an idle
/// gateway wakes no timer for its pool.
pub struct PoolSweeper {
    pub pool: Arc<UpstreamPool>,
    pub backends: Arc<Backends>,
    pub config: Arc<ArcSwap<Snapshot>>,
}

#[async_trait]
impl BackgroundService for PoolSweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut next_expiry = None;
        loop {
            let expired = async {
                match next_expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = self.pool.sweep.notified() => {}
                _ = self.backends.sweep_wanted() => {}
                _ = expired => {}
            }
            next_expiry = self.pool.evict(self.config.load().upstream.idle_timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BudgetConfig;
    use crate::proxy::backends::{Address, Admit};
    use pingora::protocols::GetSocketDigest;
    use std::io::Write;

    fn unlimited() -> BudgetConfig {
        BudgetConfig {
            max_connections_per_address: None,
            max_pending: 0,
            pending_timeout: Duration::from_secs(1),
        }
    }

    /// A backend on loopback: its listener and its address in the pool's terms.
    fn backend() -> (std::net::TcpListener, Arc<Address>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = Address::detached(listener.local_addr().unwrap());
        (listener, address)
    }

    /// A connection to `address`, which `listener` serves, and the backend's end of it.
    async fn pooled_socket_to(
        listener: &std::net::TcpListener,
        address: &Arc<Address>,
    ) -> (UpstreamConn, std::net::TcpStream) {
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (backend, _) = listener.accept().unwrap();
        // As pingora's connector makes them: with the socket's digest.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&client);
        let mut stream = pingora::protocols::l4::stream::Stream::from(client);
        stream.set_socket_digest(pingora::protocols::SocketDigest::from_raw_fd(fd));
        let slot = match address.admit(&unlimited(), false) {
            Ok(Admit::Connect(slot)) => slot,
            _ => unreachable!("no budget"),
        };
        (UpstreamConn::new(Box::new(stream), slot), backend)
    }

    const LONG: Duration = Duration::from_secs(60);

    /// Lets the runtime read its readiness events until `done`, for at most 5 s.
    async fn until(mut done: impl FnMut() -> bool) {
        for _ in 0..5000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("not within 5 s");
    }

    /// Whether the gateway's end of `backend`'s connection is closed: it reads the end, or
    /// a reset (bytes left unread on the gateway's end make the close a reset).
    fn closed_by_the_pool(backend: &mut std::net::TcpStream) -> bool {
        use std::io::Read;
        backend
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        match backend.read(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_quiet_idle_connection_is_handed_out_newest_first() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (older, _older_backend) = pooled_socket_to(&listener, &address).await;
        let (newer, _newer_backend) = pooled_socket_to(&listener, &address).await;
        let newer_fd = newer.stream.id();
        pool.put(older, Instant::now());
        pool.put(newer, Instant::now());
        assert_eq!(pool.idle_count(), 2);
        let taken = pool.take(address.key, LONG, Instant::now()).unwrap();
        assert_eq!(taken.stream.id(), newer_fd);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_place_of_an_idle_connection_is_taken_and_the_connection_closed() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (conn, mut backend_end) = pooled_socket_to(&listener, &address).await;
        pool.put(conn, Instant::now());
        let slot = pool.take_place(address.key, LONG, Instant::now()).unwrap();
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(address.open(), 1, "the place is held, now by the new owner");
        assert!(closed_by_the_pool(&mut backend_end));
        drop(slot);
        assert_eq!(address.open(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_idle_connection_holds_no_buffer() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (mut conn, _backend) = pooled_socket_to(&listener, &address).await;
        conn.buf.reserve(4096);
        pool.put(conn, Instant::now());
        let taken = pool.take(address.key, LONG, Instant::now()).unwrap();
        assert_eq!(taken.buf.capacity(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_with_bytes_left_past_its_answer_is_not_kept() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (mut conn, mut backend_end) = pooled_socket_to(&listener, &address).await;
        conn.buf.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        pool.put(conn, Instant::now());
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(address.open(), 0, "its place is freed");
        assert!(closed_by_the_pool(&mut backend_end));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn unsolicited_bytes_on_an_idle_connection_close_it_as_the_runtime_sees_them() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (quiet, _kept) = pooled_socket_to(&listener, &address).await;
        let (noisy, mut noisy_backend) = pooled_socket_to(&listener, &address).await;
        pool.put(quiet, Instant::now());
        pool.put(noisy, Instant::now());
        assert_eq!(address.open(), 2);
        noisy_backend.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        // The sweeper's part: woken by the watch, it evicts without anyone taking.
        until(|| {
            pool.evict(LONG);
            pool.idle_count() == 1
        })
        .await;
        assert!(closed_by_the_pool(&mut noisy_backend));
        assert_eq!(address.open(), 1, "its place is freed");
        // The quiet one is still there to take.
        assert!(pool.take(address.key, LONG, Instant::now()).is_some());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_fin_on_an_idle_connection_keeps_it_out_of_use() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (conn, backend) = pooled_socket_to(&listener, &address).await;
        pool.put(conn, Instant::now());
        let woken = pool.lock()[&address.key][0]
            .conn
            .idle_watch
            .clone()
            .unwrap();
        drop(backend);
        until(|| woken.woken.load(Ordering::Relaxed)).await;
        assert!(
            pool.take(address.key, LONG, Instant::now()).is_none(),
            "the backend closed it"
        );
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_closed_before_it_is_put_back_is_not_kept() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (mut conn, backend) = pooled_socket_to(&listener, &address).await;
        drop(backend);
        conn.idle_watch = Some(Arc::new(IdleWatch {
            woken: AtomicBool::new(false),
            sweep: Arc::new(Notify::new()),
        }));
        // Once the runtime has seen the FIN, a poll of the read side says so.
        until(|| !conn.watch()).await;
        pool.put(conn, Instant::now());
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(address.open(), 0);
    }

    /// Past a budget a reload lowered, a sweep closes the oldest idle connections until the
    /// address is within it (busy ones count), and a busy one that comes back closes.
    #[tokio::test(flavor = "current_thread")]
    async fn connections_past_a_lowered_budget_are_not_kept_oldest_first() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let mut backends = Vec::new();
        let mut newest = 0;
        for _ in 0..3 {
            let (conn, backend_end) = pooled_socket_to(&listener, &address).await;
            newest = conn.stream.id();
            pool.put(conn, Instant::now());
            backends.push(backend_end);
        }
        let (busy, mut busy_backend) = pooled_socket_to(&listener, &address).await;
        address.follow_budget(Some(2));
        pool.evict(LONG);
        assert_eq!(pool.idle_count(), 1);
        assert!(closed_by_the_pool(&mut backends[0]));
        assert!(closed_by_the_pool(&mut backends[1]));
        assert_eq!(address.open(), 2, "one idle, one busy: within the budget");
        address.follow_budget(Some(1));
        pool.put(busy, Instant::now());
        assert!(closed_by_the_pool(&mut busy_backend));
        assert_eq!(address.open(), 1);
        let kept = pool.take(address.key, LONG, Instant::now()).unwrap();
        assert_eq!(kept.stream.id(), newest, "the newest is kept");
        // Within the budget, a connection is kept again.
        pool.put(kept, Instant::now());
        assert_eq!(pool.idle_count(), 1);
    }

    /// A connection put back in the instant of a reload that lowers its address's budget,
    /// the reload's sweep done between `put`'s checks and its taking the pool's lock, is not
    /// kept past the budget: it closes, as it would have had it come back a moment later.
    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_put_back_as_a_reload_lowers_the_budget_is_not_kept_past_it() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (_busy, _a) = pooled_socket_to(&listener, &address).await;
        let (coming_back, _b) = pooled_socket_to(&listener, &address).await;
        let checked = pool.check(coming_back).expect("within the budget");
        // The reload, between the check and the lock: the budget lowered to 1 with 2 open,
        // and its sweep, which finds nothing idle.
        address.follow_budget(Some(1));
        pool.evict(LONG);
        pool.keep(checked, Instant::now());
        assert_eq!(pool.idle_count(), 0, "kept past the budget");
        assert_eq!(address.open(), 1);
    }

    /// A connection put back in the instant its address leaves the set, the reload's sweep
    /// done between `put`'s check and its taking the pool's lock, is not kept: it closes, as
    /// it would have had it come back a moment later.
    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_put_back_as_its_address_leaves_the_set_is_not_kept() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (coming_back, _b) = pooled_socket_to(&listener, &address).await;
        let checked = pool.check(coming_back).expect("in the set");
        address.retire();
        pool.evict(LONG);
        pool.keep(checked, Instant::now());
        assert_eq!(pool.idle_count(), 0, "kept for an address that left");
        assert_eq!(address.open(), 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn expired_connections_are_not_handed_out_and_evict_says_when_the_next_expires() {
        let pool = UpstreamPool::new(4);
        let (listener, address) = backend();
        let (old, _a) = pooled_socket_to(&listener, &address).await;
        pool.put(old, Instant::now());
        tokio::time::advance(Duration::from_secs(30)).await;
        let (young, _b) = pooled_socket_to(&listener, &address).await;
        pool.put(young, Instant::now());
        let now = Instant::now();
        // The oldest expires first: 30 s from now.
        assert_eq!(pool.evict(LONG), Some(now + Duration::from_secs(30)));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(pool.evict(LONG), Some(now + LONG));
        assert_eq!(pool.idle_count(), 1);
        tokio::time::advance(LONG).await;
        assert!(pool.take(address.key, LONG, Instant::now()).is_none());
        assert_eq!(pool.evict(LONG), None);
        assert_eq!(address.open(), 0);
    }
}
