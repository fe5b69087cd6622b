//! Kept-alive backend connections, idle between requests.
//!
//! pingora's own pool spawns a watcher task, a semaphore and a notifier per released
//! connection; this one is a locked stack per backend. A connection is checked when it is
//! taken (closed by the backend? expired?) rather than watched while idle, and
//! [`UpstreamPool::evict`] sweeps the expired ones out periodically. Newest first: the
//! connection most likely still open, with warm buffers, is reused. A connection to an
//! address that left the set is never kept: it closes when its request is done, or at the
//! next sweep when it sat idle.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Mutex;
use std::task::{Context, Waker};
use std::time::Duration;

// The runtime's clock: idle connections age with it, a paused test clock included.
use tokio::time::Instant;

use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::BytesMut;
use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::io::AsyncReadExt;

use super::backends::Slot;
use crate::config::Snapshot;
use crate::http1::ResponseHead;

/// A connection to a backend with its read buffer and parsed-head scratch space.
pub struct UpstreamConn {
    pub stream: Stream,
    pub buf: BytesMut,
    pub head: ResponseHead,
    /// Its place in its address's count of connections, freed when it closes.
    pub slot: Slot,
}

impl UpstreamConn {
    pub fn new(stream: Stream, slot: Slot) -> Self {
        UpstreamConn {
            stream,
            buf: BytesMut::with_capacity(4096),
            head: ResponseHead::default(),
            slot,
        }
    }

    /// Whether the backend has neither closed the connection nor sent anything unasked:
    /// anything but "nothing to read" means the connection is done.
    ///
    /// The runtime's view alone is not enough: bytes or a FIN that arrived while the
    /// connection sat idle are only known to it once its driver has polled the socket, so
    /// the kernel is asked too (`MSG_PEEK`, which leaves the bytes where they are).
    fn is_quiet(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let read = pin!(tokio::task::unconstrained(self.stream.read(&mut probe)));
        let runtime_quiet = read
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending();
        runtime_quiet && self.socket_quiet()
    }

    /// Whether the kernel holds nothing to read on the connection's socket (true for a
    /// stream without one, in memory).
    fn socket_quiet(&self) -> bool {
        if self.stream.get_socket_digest().is_none() {
            return true;
        }
        let mut probe = [0u8; 1];
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        matches!(
            recv(self.stream.id(), &mut probe, flags),
            Err(Errno::EAGAIN)
        )
    }
}

struct Idle {
    conn: UpstreamConn,
    since: Instant,
}

/// Idle connections per backend key (the peer's reuse hash), at most `max_per_key` each.
pub struct UpstreamPool {
    idle: Mutex<HashMap<u64, Vec<Idle>>>,
    max_per_key: usize,
}

impl UpstreamPool {
    pub fn new(max_per_key: usize) -> Self {
        UpstreamPool {
            idle: Mutex::new(HashMap::new()),
            max_per_key,
        }
    }

    /// The newest idle connection to `key` that is still open and younger than `idle_timeout`.
    pub fn take(&self, key: u64, idle_timeout: Duration) -> Option<UpstreamConn> {
        loop {
            let Idle { mut conn, since } = {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                idle.get_mut(&key)?.pop()?
            };
            if since.elapsed() >= idle_timeout {
                // The newest is expired, so all older ones are too.
                self.evict_key(key, idle_timeout);
                return None;
            }
            if conn.is_quiet() {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for reuse, unless its address left the set or already has `max_per_key`
    /// idle connections; the oldest request waiting for the address may then take it.
    pub fn put(&self, mut conn: UpstreamConn) {
        let address = conn.slot.address().clone();
        if address.is_retired() {
            return;
        }
        conn.buf.clear();
        {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let stack = idle.entry(address.key).or_default();
            if stack.len() < self.max_per_key {
                stack.push(Idle {
                    conn,
                    since: Instant::now(),
                });
            }
        }
        address.returned();
    }

    fn evict_key(&self, key: u64, idle_timeout: Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stack) = idle.get_mut(&key) {
            stack.retain(|i| i.since.elapsed() < idle_timeout);
        }
    }

    /// Closes every connection idle for `idle_timeout`, closed by its backend, or to an
    /// address that left the set.
    pub fn evict(&self, idle_timeout: Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        for stack in idle.values_mut() {
            stack.retain_mut(|i| {
                i.since.elapsed() < idle_timeout
                    && !i.conn.slot.address().is_retired()
                    && i.conn.is_quiet()
            });
        }
        idle.retain(|_, stack| !stack.is_empty());
    }

    /// Idle connections kept for `key` right now.
    pub fn idle_count_of(&self, key: u64) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get(&key).map_or(0, Vec::len)
    }

    /// Idle connections kept right now.
    pub fn idle_count(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.values().map(Vec::len).sum()
    }
}

/// Sweeps expired and closed connections out of the pool once a second, so an idle gateway
/// does not hold connections past `upstream.idle_timeout_ms`.
pub struct PoolSweeper {
    pub pool: Arc<UpstreamPool>,
    pub config: Arc<ArcSwap<Snapshot>>,
}

#[async_trait]
impl BackgroundService for PoolSweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            self.pool.evict(self.config.load().upstream.idle_timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BudgetConfig;
    use crate::proxy::backends::{Address, Admit};
    use pingora::protocols::GetSocketDigest;

    fn unlimited() -> BudgetConfig {
        BudgetConfig {
            max_connections_per_address: None,
            max_pending: 0,
            pending_timeout: Duration::from_secs(1),
        }
    }
    use std::io::Write;

    /// A pooled connection over a real loopback socket, and the backend's end of it.
    async fn pooled_socket() -> (UpstreamConn, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = Address::detached(listener.local_addr().unwrap());
        pooled_socket_to(&listener, &address).await
    }

    /// Another connection to `address`, which `listener` serves.
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

    #[tokio::test(flavor = "current_thread")]
    async fn bytes_the_runtime_has_not_polled_yet_still_keep_a_connection_out_of_use() {
        let (mut conn, mut backend) = pooled_socket().await;
        assert!(conn.is_quiet());
        // No await from here on: the runtime's driver cannot have seen these bytes arrive.
        backend.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert!(!conn.is_quiet(), "unsolicited bytes in the socket");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_close_the_runtime_has_not_polled_yet_keeps_a_connection_out_of_use() {
        let (mut conn, backend) = pooled_socket().await;
        assert!(conn.is_quiet());
        drop(backend);
        assert!(!conn.is_quiet(), "the backend closed it");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_pool_hands_out_only_quiet_connections() {
        let pool = UpstreamPool::new(4);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = Address::detached(listener.local_addr().unwrap());
        let (quiet, _kept) = pooled_socket_to(&listener, &address).await;
        let (noisy, mut noisy_backend) = pooled_socket_to(&listener, &address).await;
        pool.put(quiet);
        pool.put(noisy);
        assert_eq!(address.open(), 2);
        noisy_backend.write_all(b"late").unwrap();
        // Newest first: the noisy one is dropped, the quiet one handed out.
        let key = address.key;
        assert!(pool.take(key, Duration::from_secs(60)).is_some());
        assert_eq!(pool.idle_count(), 0);
        assert!(pool.take(key, Duration::from_secs(60)).is_none());
        assert_eq!(address.open(), 0, "both closed, their places freed");
    }
}
