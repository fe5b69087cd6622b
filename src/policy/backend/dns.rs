//! When a name is looked up again: as its answer's TTL says, clamped between
//! `upstream.dns_min_ttl_ms` and `upstream.dns_max_ttl_ms`; after a failed lookup, from the
//! minimum, doubling with each failure in a row up to the maximum. A failure keeps the last
//! good addresses: a name is never left with none because its DNS server is away.

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::DnsConfig;

/// What is known of one name: its last good addresses and when to ask again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameRecord {
    /// Sorted, each once: an answer in another order is the same answer.
    pub addresses: Vec<IpAddr>,
    /// When the name is due to be looked up again.
    pub next: Instant,
    /// Lookups failed in a row since the last answer.
    pub failures: u32,
}

impl NameRecord {
    /// A name not looked up yet: due now, with no address.
    pub fn unknown(now: Instant) -> Self {
        NameRecord {
            addresses: Vec::new(),
            next: now,
            failures: 0,
        }
    }

    /// Notes an answer of `addresses` valid for `ttl`; whether the addresses changed.
    pub fn answered(
        &mut self,
        mut addresses: Vec<IpAddr>,
        ttl: Duration,
        now: Instant,
        dns: &DnsConfig,
    ) -> bool {
        addresses.sort_unstable();
        addresses.dedup();
        self.next = now + ttl.clamp(dns.min_ttl, dns.max_ttl);
        self.failures = 0;
        let changed = addresses != self.addresses;
        self.addresses = addresses;
        changed
    }

    /// Notes a failed lookup (or an answer with no address): the addresses are kept, and the
    /// name is asked again after a wait that doubles with each failure in a row.
    pub fn failed(&mut self, now: Instant, dns: &DnsConfig) {
        self.failures = self.failures.saturating_add(1);
        self.next = now + retry_after(self.failures, dns);
    }
}

/// The wait after `failures` failed lookups in a row: the minimum TTL, doubled for each
/// failure after the first, at most the maximum TTL.
pub fn retry_after(failures: u32, dns: &DnsConfig) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    dns.min_ttl.saturating_mul(1 << doublings).min(dns.max_ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns() -> DnsConfig {
        DnsConfig {
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(300),
            resolvers: Vec::new(),
            allow_unresolved_at_start: false,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_ttl_is_clamped_between_the_bounds() {
        let now = Instant::now();
        let mut name = NameRecord::unknown(now);
        for (ttl, after) in [(0, 1), (30, 30), (86_400, 300)] {
            name.answered(vec![ip("10.0.0.1")], Duration::from_secs(ttl), now, &dns());
            assert_eq!(name.next - now, Duration::from_secs(after), "ttl {ttl}");
        }
    }

    #[test]
    fn an_answer_in_another_order_is_no_change() {
        let now = Instant::now();
        let mut name = NameRecord::unknown(now);
        let ttl = Duration::from_secs(5);
        assert!(name.answered(vec![ip("10.0.0.2"), ip("10.0.0.1")], ttl, now, &dns()));
        assert!(!name.answered(vec![ip("10.0.0.1"), ip("10.0.0.2")], ttl, now, &dns()));
        assert!(name.answered(vec![ip("10.0.0.3")], ttl, now, &dns()));
        assert_eq!(name.addresses, [ip("10.0.0.3")]);
    }

    #[test]
    fn failures_keep_the_last_good_addresses_and_back_off_to_the_maximum() {
        let now = Instant::now();
        let mut name = NameRecord::unknown(now);
        name.answered(vec![ip("10.0.0.1")], Duration::from_secs(5), now, &dns());
        let waits: Vec<u64> = (0..11)
            .map(|_| {
                name.failed(now, &dns());
                (name.next - now).as_secs()
            })
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(name.addresses, [ip("10.0.0.1")]);
        name.answered(vec![ip("10.0.0.1")], Duration::from_secs(5), now, &dns());
        assert_eq!(name.failures, 0);
    }
}
