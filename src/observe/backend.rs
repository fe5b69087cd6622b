//! Metrics of the backend's addresses and names.
//!
//! Series stay bounded by the addresses the gateway uses now, however often DNS moves them:
//! the per-address gauges (`agent_gateway_upstream_address_up`,
//! `agent_gateway_upstream_connections`, `agent_gateway_upstream_pending`) are made at each scrape from the current set only
//! ([`AddressGauges`]), so an address that left has no series at the next scrape; the
//! ejection counter's series exists from when an address joins (at zero) and is removed when
//! it leaves, and a name's DNS-error series likewise follows the names of the config. The overflow counter's reasons are a
//! fixed set. The upstream duration histogram has no `address` label: 20 buckets per
//! operation per address, on addresses that come and go, would multiply its series for what
//! the gauges and ejections already show per address.

use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::api::failure::OverflowReason;

/// One address as the gauges show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressView {
    /// `ip:port`.
    pub address: String,
    /// In rotation: neither down at its last check nor ejected.
    pub up: bool,
    /// Connections carrying a request now.
    pub active: usize,
    /// Connections kept in the pool.
    pub idle: usize,
    /// Requests waiting for a connection to it (its budget spent).
    pub waiting: usize,
}

/// DNS errors by name, refusals at the connection budget by reason, ejections by address.
pub struct BackendMetrics {
    dns_errors: IntCounterVec,
    overflow: [IntCounter; OverflowReason::COUNT],
    ejections: IntCounterVec,
}

impl BackendMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let dns_errors = IntCounterVec::new(
            Opts::new(
                "agent_gateway_upstream_dns_errors_total",
                "Failed lookups of an upstream name (its last good addresses are kept), by name.",
            ),
            &["name"],
        )?;
        let overflow = IntCounterVec::new(
            Opts::new(
                "agent_gateway_upstream_overflow_total",
                "Requests answered 503 at the connection budget, by reason (queue_full, timeout).",
            ),
            &["reason"],
        )?;
        let ejections = IntCounterVec::new(
            Opts::new(
                "agent_gateway_upstream_ejections_total",
                "Upstream addresses taken out of the rotation after consecutive failures, by address.",
            ),
            &["address"],
        )?;
        registry.register(Box::new(dns_errors.clone()))?;
        registry.register(Box::new(overflow.clone()))?;
        registry.register(Box::new(ejections.clone()))?;
        Ok(Self {
            dns_errors,
            overflow: OverflowReason::ALL.map(|r| overflow.with_label_values(&[r.as_str()])),
            ejections,
        })
    }

    pub fn dns_error(&self, name: &str) {
        self.dns_errors.with_label_values(&[name]).inc();
    }

    /// Makes `name`'s error counter exist, at zero until a lookup fails.
    pub fn name_configured(&self, name: &str) {
        self.dns_errors.with_label_values(&[name]);
    }

    /// Drops the series of a name the config no longer has.
    pub fn name_dropped(&self, name: &str) {
        let _ = self.dns_errors.remove_label_values(&[name]);
    }

    pub fn overflowed(&self, reason: OverflowReason) {
        self.overflow[reason as usize].inc();
    }

    pub fn ejected(&self, address: &str) {
        self.ejections.with_label_values(&[address]).inc();
    }

    /// Makes the ejection counter of an address that joined the set exist, at zero until it
    /// is ejected, so that `increase()` sees its first ejection.
    pub fn address_joined(&self, address: &str) {
        self.ejections.with_label_values(&[address]);
    }

    /// Drops the series of an address that left the set.
    pub fn address_left(&self, address: &str) {
        let _ = self.ejections.remove_label_values(&[address]);
    }
}

/// The addresses now, for the gauges.
pub type Addresses = Box<dyn Fn() -> Vec<AddressView> + Send + Sync>;

/// `agent_gateway_upstream_address_up`, `agent_gateway_upstream_connections` and
/// `agent_gateway_upstream_pending`, made at each scrape from the addresses as they are then.
pub struct AddressGauges {
    addresses: Addresses,
    up: IntGaugeVec,
    connections: IntGaugeVec,
    pending: IntGaugeVec,
    /// One scrape at a time: each empties the gauges and fills them again.
    collecting: Mutex<()>,
}

impl AddressGauges {
    pub fn register(registry: &Registry, addresses: Addresses) -> prometheus::Result<()> {
        let up = IntGaugeVec::new(
            Opts::new(
                "agent_gateway_upstream_address_up",
                "1 while an upstream address is in rotation, 0 while it is down at its health \
                 check or ejected; one series per address of the current set.",
            ),
            &["address"],
        )?;
        let connections = IntGaugeVec::new(
            Opts::new(
                "agent_gateway_upstream_connections",
                "Connections open to each upstream address: active (carrying a request) or idle \
                 (in the pool).",
            ),
            &["address", "state"],
        )?;
        let pending = IntGaugeVec::new(
            Opts::new(
                "agent_gateway_upstream_pending",
                "Requests waiting for a connection to each upstream address, its connection \
                 budget spent (upstream.max_connections_per_address); refused 503 past \
                 upstream.max_pending or upstream.pending_timeout_ms.",
            ),
            &["address"],
        )?;
        registry.register(Box::new(AddressGauges {
            addresses,
            up,
            connections,
            pending,
            collecting: Mutex::new(()),
        }))
    }
}

impl Collector for AddressGauges {
    fn desc(&self) -> Vec<&Desc> {
        [&self.up, &self.connections, &self.pending]
            .into_iter()
            .flat_map(|gauge| gauge.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _one = self.collecting.lock().unwrap_or_else(|e| e.into_inner());
        let gauges = [&self.up, &self.connections, &self.pending];
        gauges.iter().for_each(|gauge| gauge.reset());
        for a in (self.addresses)() {
            self.up
                .with_label_values(&[&a.address])
                .set(i64::from(a.up));
            for (state, n) in [("active", a.active), ("idle", a.idle)] {
                self.connections
                    .with_label_values(&[&a.address, state])
                    .set(n as i64);
            }
            self.pending
                .with_label_values(&[&a.address])
                .set(a.waiting as i64);
        }
        gauges.iter().flat_map(|gauge| gauge.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_gauges_show_the_addresses_of_the_moment_and_none_that_left() {
        let registry = Registry::new();
        let now = Arc::new(Mutex::new(vec![AddressView {
            address: "10.0.0.1:80".into(),
            up: true,
            active: 2,
            idle: 1,
            waiting: 3,
        }]));
        let read = now.clone();
        AddressGauges::register(&registry, Box::new(move || read.lock().unwrap().clone())).unwrap();
        let series = |registry: &Registry| -> Vec<String> {
            registry
                .gather()
                .iter()
                .flat_map(|f| {
                    f.get_metric().iter().map(move |m| {
                        let labels: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
                        format!("{} {labels:?} {}", f.name(), m.get_gauge().value())
                    })
                })
                .collect()
        };
        assert_eq!(
            series(&registry),
            [
                r#"agent_gateway_upstream_address_up ["10.0.0.1:80"] 1"#,
                r#"agent_gateway_upstream_connections ["10.0.0.1:80", "active"] 2"#,
                r#"agent_gateway_upstream_connections ["10.0.0.1:80", "idle"] 1"#,
                r#"agent_gateway_upstream_pending ["10.0.0.1:80"] 3"#,
            ]
        );
        *now.lock().unwrap() = vec![AddressView {
            address: "10.0.0.2:80".into(),
            up: false,
            active: 0,
            idle: 0,
            waiting: 0,
        }];
        let after = series(&registry);
        assert!(after.iter().all(|s| !s.contains("10.0.0.1")), "{after:?}");
        assert_eq!(
            after[0],
            r#"agent_gateway_upstream_address_up ["10.0.0.2:80"] 0"#
        );
    }
}
