//! Active health checks of the upstream addresses, and readiness derived from them.
//!
//! [`HealthChecker`] probes every address of the current snapshot each
//! `upstream.health_check_interval_ms` (a TCP connect, or `GET upstream.health_check_path`
//! answered 2xx/3xx). An address that fails leaves the rotation until it passes again.
//! Requests and `/readyz` only read the last result: a scrape never causes a probe.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::Snapshot;

/// The last result of the health checks.
#[derive(Default)]
pub struct UpstreamHealth {
    probed: AtomicBool,
    /// Addresses that failed their last check (usually empty).
    down: ArcSwap<Vec<SocketAddr>>,
    any_up: AtomicBool,
}

impl UpstreamHealth {
    /// Whether `addr` passed its last check (or has not been checked yet).
    pub fn is_up(&self, addr: &SocketAddr) -> bool {
        !self.down.load().contains(addr)
    }

    /// `Ok` when ready to serve, else the reason.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if !self.probed.load(Ordering::Acquire) {
            return Err("upstream addresses not checked yet");
        }
        if !self.any_up.load(Ordering::Acquire) {
            return Err("no upstream address is reachable");
        }
        Ok(())
    }

    fn store(&self, down: Vec<SocketAddr>, total: usize) {
        self.any_up.store(down.len() < total, Ordering::Release);
        self.down.store(Arc::new(down));
        self.probed.store(true, Ordering::Release);
    }
}

/// Whether `addr` answers: a TCP connect, or a GET of `path` with a 2xx/3xx status.
async fn check(addr: SocketAddr, path: Option<&str>, timeout: Duration) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let Some(path) = path else { return Some(true) };
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: agent-gateway-health\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        // "HTTP/1.1 200"
        Some(head.starts_with(b"HTTP/1.") && matches!(head[9], b'2' | b'3'))
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(true)))
}

/// Background task that keeps [`UpstreamHealth`] current.
pub struct HealthChecker {
    pub config: Arc<ArcSwap<Snapshot>>,
    pub health: Arc<UpstreamHealth>,
}

impl HealthChecker {
    async fn check_all(&self) -> Duration {
        let snap = self.config.load_full();
        let up = &snap.upstream;
        let timeout = up.connect_timeout + up.read_timeout.min(Duration::from_secs(2));
        let mut down = Vec::new();
        for addr in &up.addresses {
            let ok = check(*addr, up.health_check_path.as_deref(), timeout).await;
            if ok != self.health.is_up(addr) {
                if ok {
                    tracing::info!(%addr, "upstream address is back in rotation");
                } else {
                    tracing::warn!(%addr, "upstream address failed its health check; out of rotation");
                }
            }
            if !ok {
                down.push(*addr);
            }
        }
        self.health.store(down, up.addresses.len());
        up.health_check_interval
    }
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let interval = self.check_all().await;
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}
