//! The data plane: client connections, the request pipeline, backends and their pool.
//!
//! [`crate::app::serve`] accepts each connection (a [`tcp::TcpConn`], or TLS
//! over one) and hands it to [`ProxyApp`] with the client's address,
//! which serves it with the client's protocol ([`h1`] or [`h2`], each a [`downstream::Downstream`],
//! HTTP/2 chosen by ALPN on TLS or by its preface on plaintext); every request then
//! goes through the same [`pipeline`]: admission ([`crate::policy::admit`]), the body, the
//! backend ([`upstream`] over [`connect`] and [`pool`], its addresses followed by
//! [`backends`] and [`names`], steered by [`health`]; a request waiting there is dropped if
//! its client goes, [`hangup`]) and the answer
//! ([`relay`]), with the headers that cross each hop decided in [`forwarding`]. Decisions
//! are made by pure functions elsewhere; this module carries them out.

pub mod backends;
pub mod connect;
mod downstream;
mod failed_auths;
mod forwarding;
mod h1;
mod h2;
mod hangup;
pub mod health;
pub mod names;
mod pipeline;
pub mod pool;
mod relay;
pub mod tcp;
#[cfg(test)]
mod tests;
pub mod timer;
pub mod upstream;

/// The most client addresses whose failed authentications are kept at once.
pub use failed_auths::MAX_ADDRESSES as MAX_FAILED_AUTH_ADDRESSES;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use arc_swap::ArcSwap;
use pingora::protocols::{Stream, ALPN};
use pingora::server::ShutdownWatch;

use crate::config::Snapshot;
use crate::observe::in_flight::Held;
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::Tracer;
use crate::policy::rate_limit::RateLimits;
use crate::policy::request_id::RequestIds;
use upstream::Upstream;

/// The proxy service: shared by every connection of the listener.
pub struct ProxyApp {
    config: Arc<ArcSwap<Snapshot>>,
    upstream: Upstream,
    ids: RequestIds,
    telemetry: Arc<Telemetry>,
    tracer: Arc<Tracer>,
    rate_limits: Arc<RateLimits>,
    /// Each client address's failed authentications (`auth.max_failures_per_minute`).
    failed_auths: failed_auths::FailedAuths,
    /// `listen.http2`: serve HTTP/2 to the clients that ask for it.
    http2: bool,
    /// `server.grace_period_seconds`: how long an HTTP/2 connection may drain after its GOAWAY.
    grace: Duration,
    drain: Drain,
}

impl ProxyApp {
    pub fn new(
        config: Arc<ArcSwap<Snapshot>>,
        telemetry: Arc<Telemetry>,
        tracer: Arc<Tracer>,
        upstream: Upstream,
        rate_limits: Arc<RateLimits>,
        drain: Drain,
    ) -> Self {
        let (http2, grace) = {
            let startup = &config.load().startup;
            (
                startup.http2,
                Duration::from_secs(startup.grace_period_seconds),
            )
        };
        Self {
            http2,
            grace,
            config,
            upstream,
            ids: RequestIds::default(),
            telemetry,
            tracer,
            rate_limits,
            failed_auths: failed_auths::FailedAuths::default(),
            drain,
        }
    }
}

/// Tells client connections to wind down at once: HTTP/2 ones get a GOAWAY, HTTP/1.1 ones a
/// `Connection: close` on their next answer. Started on SIGQUIT, before pingora's own
/// shutdown (which comes only after the listeners are handed over and a wait), so clients of
/// the old process move to the new one while their open requests finish.
#[derive(Debug, Clone)]
pub struct Drain {
    started: Arc<watch::Sender<bool>>,
    /// Started by a handover: the listeners are another process's now, and the address stays
    /// in service.
    handing_over: Arc<AtomicBool>,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            started: Arc::new(watch::channel(false).0),
            handing_over: Arc::default(),
        }
    }
}

impl Drain {
    /// The gateway goes out of service (SIGTERM).
    pub fn start(&self) {
        self.started.send_replace(true);
    }

    /// The gateway hands its listeners to a new process (SIGQUIT).
    pub fn hand_over(&self) {
        self.handing_over.store(true, Ordering::Relaxed);
        self.start();
    }

    /// Whether the gateway is draining (SIGTERM, or SIGQUIT's handover).
    pub fn started(&self) -> bool {
        *self.started.borrow()
    }

    /// Whether the drain is a handover's, after which the process that took the listeners
    /// answers on them.
    pub fn is_handover(&self) -> bool {
        self.handing_over.load(Ordering::Relaxed)
    }

    fn watch(&self) -> watch::Receiver<bool> {
        self.started.subscribe()
    }
}

impl ProxyApp {
    /// Serves one client connection, HTTP/1.1 or HTTP/2, until either side ends it. `client`
    /// is its peer's address (the PROXY header's source, when there is one). `first_request`
    /// counts the connection until its first HTTP/1.1 request is over, for a drain to wait on;
    /// an HTTP/2 connection stops counting once it is known to be one (its GOAWAY, once its
    /// handshake is done, tells its client which streams were not served).
    pub async fn serve_connection(
        self: &Arc<Self>,
        stream: Stream,
        client: Option<IpAddr>,
        first_request: Option<Held>,
        shutdown: &ShutdownWatch,
    ) {
        // HTTP/2's loop is boxed: inline, its state would size every connection's task,
        // HTTP/1.1 ones included.
        if self.http2 && stream.selected_alpn_proto() == Some(ALPN::H2) {
            drop(first_request);
            Box::pin(self.serve_h2(stream, client, shutdown)).await;
        } else if let Some(h2c) = self.serve_h1(stream, client, first_request, shutdown).await {
            Box::pin(self.serve_h2(h2c, client, shutdown)).await;
        }
    }
}
