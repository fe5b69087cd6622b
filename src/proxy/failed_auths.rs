//! The failed authentications of each client in its current minute, kept for
//! [`crate::policy::throttle`], which decides; this only stores its windows.
//!
//! A client is its IPv4 address, or its IPv6 /64: the block one subscriber or host is given,
//! so that a guesser cannot take a fresh budget from each of its 2^64 addresses.
//!
//! Bounded: past [`MAX_ADDRESSES`] windows, the ones that are over are dropped, in one pass at
//! most every [`SWEEP_EVERY`] (a pass looks at every window under the lock every request
//! takes); if every one is still current (a guesser spread over that many clients), a new
//! client is not tracked until some are over, so memory stays bounded and no legitimate
//! client is refused for it. Its failures are counted then, as untracked.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::policy::throttle::{self, FailureWindow, Verdict};

/// The most clients whose failures are kept at once.
pub const MAX_ADDRESSES: usize = 100_000;

/// The shortest time between two passes over the windows to drop the ones that are over.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Each client's window, behind one lock: it is taken for a map lookup, on the requests of
/// configs with `auth.max_failures_per_minute` only.
#[derive(Default)]
pub struct FailedAuths {
    windows: Mutex<Windows>,
}

#[derive(Default)]
struct Windows {
    by_client: HashMap<IpAddr, FailureWindow>,
    /// When the windows that were over were last dropped.
    swept: Option<Instant>,
}

/// What a client's failures are counted by: its IPv4 address, or its IPv6 address's /64.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & (u128::MAX << 64))),
        v4 => v4,
    }
}

impl FailedAuths {
    /// What to do with a request from `client` at `now`, under `limit`.
    pub fn verdict(&self, client: IpAddr, limit: NonZeroU32, now: Instant) -> Verdict {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        throttle::verdict(windows.by_client.get_mut(&client_key(client)), limit, now)
    }

    /// Counts a failed authentication of `client` at `now`: `false` when it could not be,
    /// for [`MAX_ADDRESSES`] other clients are in their minute.
    #[must_use = "an untracked failure is counted (agent_gateway_auth_failures_untracked_total)"]
    pub fn count_failure(&self, client: IpAddr, now: Instant) -> bool {
        let key = client_key(client);
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let Windows { by_client, swept } = &mut *windows;
        if by_client.len() >= MAX_ADDRESSES && !by_client.contains_key(&key) {
            if swept.is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY) {
                by_client.retain(|_, w| !w.expired(now));
                *swept = Some(now);
            }
            if by_client.len() >= MAX_ADDRESSES {
                return false;
            }
        }
        let window = throttle::failed(by_client.get(&key).copied(), now);
        by_client.insert(key, window);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// The `n`th IPv4 address of the /8 `first`.
    fn nth(first: u8, n: u32) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from_bits((u32::from(first) << 24) + n))
    }

    fn throttled(auths: &FailedAuths, client: IpAddr, limit: u32, now: Instant) -> bool {
        let limit = NonZeroU32::new(limit).unwrap();
        matches!(auths.verdict(client, limit, now), Verdict::Throttled { .. })
    }

    #[test]
    fn each_address_has_its_own_window() {
        let auths = FailedAuths::default();
        let limit = NonZeroU32::new(2).unwrap();
        let (guesser, other) = (ip("127.0.0.2"), ip("127.0.0.1"));
        let now = Instant::now();
        assert!(auths.count_failure(guesser, now));
        assert!(auths.count_failure(guesser, now));
        assert!(matches!(
            auths.verdict(guesser, limit, now),
            Verdict::Throttled { first: true, .. }
        ));
        assert_eq!(auths.verdict(other, limit, now), Verdict::Check);
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64() {
        let auths = FailedAuths::default();
        let now = Instant::now();
        assert!(auths.count_failure(ip("2001:db8:1:2::1"), now));
        assert!(auths.count_failure(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), now));
        assert!(throttled(&auths, ip("2001:db8:1:2:abcd::9"), 2, now));
        assert!(!throttled(&auths, ip("2001:db8:1:3::1"), 2, now));
        // An IPv4 client, however its socket showed it.
        assert!(auths.count_failure(ip("192.0.2.7"), now));
        assert!(auths.count_failure(ip("::ffff:192.0.2.7"), now));
        assert!(throttled(&auths, ip("192.0.2.7"), 2, now));
        assert!(!throttled(&auths, ip("192.0.2.8"), 2, now));
    }

    #[test]
    fn when_full_a_new_client_waits_for_windows_to_end() {
        let auths = FailedAuths::default();
        let start = Instant::now();
        for n in 0..MAX_ADDRESSES as u32 {
            assert!(auths.count_failure(nth(10, n), start));
        }
        let newcomer = ip("192.0.2.1");
        assert!(
            !auths.count_failure(newcomer, start),
            "untracked, and says so"
        );
        assert!(
            auths.count_failure(nth(10, 7), start),
            "a tracked client still counts"
        );
        assert!(
            !throttled(&auths, newcomer, 1, start),
            "not tracked while full"
        );
        // Once the others' minute is over, the next failure makes room.
        let later = start + Duration::from_secs(61);
        assert!(auths.count_failure(newcomer, later));
        assert!(throttled(&auths, newcomer, 1, later));
        let windows = auths.windows.lock().unwrap();
        assert_eq!(windows.by_client.len(), 1);
    }

    #[test]
    fn a_full_map_is_swept_at_most_once_a_second() {
        let auths = FailedAuths::default();
        let start = Instant::now();
        // Half the windows end a minute after `start`, half a second later.
        for n in 0..MAX_ADDRESSES as u32 {
            let at = if n % 2 == 0 {
                start
            } else {
                start + Duration::from_secs(1)
            };
            assert!(auths.count_failure(nth(10, n), at));
        }
        let sweep_at = start + Duration::from_millis(60_500);
        assert!(auths.count_failure(ip("192.0.2.1"), sweep_at));
        assert_eq!(
            auths.windows.lock().unwrap().by_client.len(),
            MAX_ADDRESSES / 2 + 1
        );
        // Fill it again: within a second of that pass, no other pass runs...
        for n in 0..(MAX_ADDRESSES / 2 - 1) as u32 {
            assert!(auths.count_failure(nth(11, n), sweep_at));
        }
        let soon = sweep_at + Duration::from_millis(600);
        assert!(!auths.count_failure(ip("192.0.2.2"), soon));
        assert!(!throttled(&auths, ip("192.0.2.2"), 1, soon));
        // ...a second after it, one does (the other half's minute is over by then).
        let next = sweep_at + SWEEP_EVERY;
        assert!(auths.count_failure(ip("192.0.2.3"), next));
        assert!(throttled(&auths, ip("192.0.2.3"), 1, next));
    }
}
