//! Active health checks of the upstream addresses, and readiness derived from them.
//!
//! [`HealthChecker`] probes every address of the current snapshot each
//! `upstream.health_check_interval_ms`: a connect (TCP, and TLS when `upstream.tls`), then,
//! when `upstream.health_check_path` is set, a `GET` of it answered 2xx or 3xx, over the
//! same connector and HTTP/1.1 client the proxy uses. An address that fails leaves the
//! rotation until it passes again; an address ejected by failures since the check began
//! comes back when it passes. The addresses checked are the set of the moment
//! ([`Backends`]), as DNS moves it. Requests and `/readyz` only read the last result: a
//! probe of `/readyz` never causes a check.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::{HttpPeer, Peer};

use super::backends::{Address, Backends};
use super::connect::Connect;
use crate::config::Snapshot;
use crate::http1::client;

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

    /// `Ok` when an address passed its last check, else the reason.
    pub fn reachable(&self) -> Result<(), &'static str> {
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

/// The most of a health-check answer that is read.
const MAX_CHECK_ANSWER: usize = 64 * 1024;

/// Whether `peer` answers: a connect, or a GET of `path` with a 2xx/3xx status.
async fn check(
    connector: &dyn Connect,
    peer: &HttpPeer,
    path: Option<&str>,
    connect_limit: Duration,
    limit: Duration,
) -> bool {
    let attempt = async {
        let mut stream = connector.connect(peer, connect_limit).await.ok()?;
        let Some(path) = path else { return Some(true) };
        let host = peer.sni().to_owned();
        let host = if host.is_empty() {
            peer.address().to_string()
        } else {
            host
        };
        let answer = client::get(&mut stream, &host, path, MAX_CHECK_ANSWER)
            .await
            .ok()?;
        Some((200..400).contains(&answer.status()))
    };
    matches!(tokio::time::timeout(limit, attempt).await, Ok(Some(true)))
}

/// Background task that keeps [`UpstreamHealth`] current.
pub struct HealthChecker {
    pub config: Arc<ArcSwap<Snapshot>>,
    pub health: Arc<UpstreamHealth>,
    pub connector: Arc<dyn Connect>,
    pub backends: Arc<Backends>,
}

impl HealthChecker {
    async fn check_all(&self) -> Duration {
        let snap = self.config.load_full();
        let up = &snap.upstream;
        let timeout = up.connect_timeout + up.read_timeout.min(Duration::from_secs(2));
        let mut down = Vec::new();
        // The round holds the addresses weakly, and each strongly only while it is checked:
        // one that leaves the set meanwhile does not count as connected for the rest of the
        // round (`backends::Retired`), and is not checked.
        let round: Vec<Weak<Address>> = self
            .backends
            .current()
            .addresses
            .iter()
            .map(Arc::downgrade)
            .collect();
        let mut checked = 0;
        for address in &round {
            let Some(address) = address.upgrade().filter(|a| !a.is_retired()) else {
                continue;
            };
            checked += 1;
            let addr = &address.addr;
            let started = tokio::time::Instant::now();
            let ok = check(
                &*self.connector,
                &address.peer,
                up.health_check_path.as_deref(),
                up.connect_timeout,
                timeout,
            )
            .await;
            // Only a check of an answer (`health_check_path`) ends an ejection: an address
            // that accepts connections and resets every request passes one that connects.
            if ok && up.health_check_path.is_some() && address.check_passed(started) {
                tracing::info!(%addr, "upstream address passed its check; its ejection ends early");
            }
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
        // A round whose every address left the set meanwhile tells nothing: the verdict
        // stands until the next one checks the new set.
        if checked > 0 || round.is_empty() {
            self.health.store(down, checked);
        }
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
