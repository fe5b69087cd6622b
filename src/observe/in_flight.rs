//! Requests being served now: one counter, which a draining process waits on and the metric
//! `agent_gateway_in_flight_requests` reads when it is scraped. The same counter type counts,
//! unexported, the connections accepted whose first request has not ended ([`Held`]), which
//! a drain waits on too.
//!
//! The data plane touches it twice per request (one atomic add and one subtract); the gauge is
//! set from it only at collection, so exporting it costs requests nothing.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Registry};

/// The count of requests being served.
#[derive(Debug, Default)]
pub struct InFlight(AtomicUsize);

impl InFlight {
    /// A counter at zero, its gauge registered in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Arc<Self>> {
        let requests = Arc::new(InFlight::default());
        registry.register(Box::new(InFlightGauge::new(requests.clone())?))?;
        Ok(requests)
    }

    /// Acquire, paired with the release when a request ends: whoever sees the count fall to
    /// zero also sees what the requests wrote before they ended (their queued log lines).
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Counts a request until the guard drops, however it ends.
    pub fn enter(&self) -> InFlightGuard<'_> {
        Counted::new(self)
    }

    /// [`Self::enter`] for a count held past a borrow, by a task of its own.
    pub fn hold(self: &Arc<Self>) -> Held {
        Counted::new(self.clone())
    }
}

/// One count in the [`InFlight`] that `C` leads to, released when dropped, however the
/// counted work ends.
pub struct Counted<C: Deref<Target = InFlight>>(C);

impl<C: Deref<Target = InFlight>> Counted<C> {
    fn new(counter: C) -> Self {
        counter.0.fetch_add(1, Ordering::AcqRel);
        Counted(counter)
    }
}

impl<C: Deref<Target = InFlight>> Drop for Counted<C> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One request counted in [`InFlight`].
pub type InFlightGuard<'a> = Counted<&'a InFlight>;

/// One count in an [`InFlight`], owned (an accepted connection's, held by its task).
pub type Held = Counted<Arc<InFlight>>;

/// `agent_gateway_in_flight_requests`, set from the counter as it is collected.
struct InFlightGauge {
    requests: Arc<InFlight>,
    gauge: IntGauge,
}

impl InFlightGauge {
    fn new(requests: Arc<InFlight>) -> prometheus::Result<Self> {
        let gauge = IntGauge::new(
            "agent_gateway_in_flight_requests",
            "Requests being served now.",
        )?;
        Ok(Self { requests, gauge })
    }
}

impl Collector for InFlightGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.gauge.set(self.requests.count() as i64);
        self.gauge.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    /// The gauge's sample line, as a scrape shows it.
    fn scraped(registry: &Registry) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("agent_gateway_in_flight_requests "))
            .collect()
    }

    #[test]
    fn the_metric_shows_the_count_the_drain_reads() {
        let registry = Registry::new();
        let requests = InFlight::register(&registry).unwrap();
        assert_eq!(scraped(&registry), "agent_gateway_in_flight_requests 0");
        let first = requests.enter();
        let second = requests.enter();
        assert_eq!(requests.count(), 2);
        assert_eq!(scraped(&registry), "agent_gateway_in_flight_requests 2");
        drop(first);
        assert_eq!(requests.count(), 1);
        assert_eq!(scraped(&registry), "agent_gateway_in_flight_requests 1");
        drop(second);
        assert_eq!(requests.count(), 0);
        assert_eq!(scraped(&registry), "agent_gateway_in_flight_requests 0");
    }
}
