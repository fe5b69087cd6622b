//! The data plane: client connections, the request pipeline, backends and their pool.
//!
//! pingora accepts each connection (TCP or TLS) and hands it to [`ProxyApp`], which serves
//! it with the client's protocol ([`h1`], a [`downstream::Downstream`]); every request then
//! goes through the same [`pipeline`]: admission ([`crate::policy::admit`]), the body, the
//! backend ([`upstream`] over [`connect`] and [`pool`], steered by [`health`]) and the answer
//! ([`relay`]), with the headers that cross each hop decided in [`forwarding`]. Decisions
//! are made by pure functions elsewhere; this module carries them out.

pub mod connect;
mod downstream;
mod forwarding;
mod h1;
pub mod health;
mod pipeline;
pub mod pool;
mod relay;
#[cfg(test)]
mod tests;
pub mod upstream;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;

use crate::config::Snapshot;
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::Tracer;
use crate::policy::rate_limit::RateLimiter;
use crate::policy::request_id::RequestIds;
use upstream::Upstream;

/// The proxy service: shared by every connection of the listener.
pub struct ProxyApp {
    config: Arc<ArcSwap<Snapshot>>,
    upstream: Upstream,
    ids: RequestIds,
    telemetry: Arc<Telemetry>,
    tracer: Arc<Tracer>,
    rate_limits: RateLimiter,
    in_flight: Arc<InFlight>,
}

impl ProxyApp {
    pub fn new(
        config: Arc<ArcSwap<Snapshot>>,
        telemetry: Arc<Telemetry>,
        tracer: Arc<Tracer>,
        upstream: Upstream,
        in_flight: Arc<InFlight>,
    ) -> Self {
        Self {
            config,
            upstream,
            ids: RequestIds::default(),
            telemetry,
            tracer,
            rate_limits: RateLimiter::default(),
            in_flight,
        }
    }
}

/// Requests being served now: what a draining process waits for. (The metric
/// `agent_gateway_in_flight_requests` shows the same count; this one decides.)
#[derive(Debug, Default)]
pub struct InFlight(AtomicUsize);

impl InFlight {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Counts a request until the guard drops, however it ends.
    fn enter(&self) -> InFlightGuard<'_> {
        self.0.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self)
    }
}

struct InFlightGuard<'a>(&'a InFlight);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[async_trait]
impl ServerApp for ProxyApp {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.serve_h1(stream, shutdown).await;
        None
    }
}
