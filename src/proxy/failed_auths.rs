//! The failed authentications of each client address in its current minute, kept for
//! [`crate::policy::throttle`], which decides; this only stores its windows.
//!
//! Bounded: past [`MAX_ADDRESSES`] windows, the ones that are over are dropped; if every one
//! is still current (a guesser spread over that many addresses), a new address is not
//! tracked until some are over, so memory stays bounded and no legitimate client is refused
//! for it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Instant;

use crate::policy::throttle::{self, FailureWindow, Verdict};

/// The most addresses whose failures are kept at once.
pub const MAX_ADDRESSES: usize = 100_000;

/// Each address's window, behind one lock: it is taken for a map lookup, on the requests of
/// configs with `auth.max_failures_per_minute` only.
#[derive(Default)]
pub struct FailedAuths {
    windows: Mutex<HashMap<IpAddr, FailureWindow>>,
}

impl FailedAuths {
    /// What to do with a request from `client` at `now`, under `limit`.
    pub fn verdict(&self, client: IpAddr, limit: NonZeroU32, now: Instant) -> Verdict {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        throttle::verdict(windows.get_mut(&client), limit, now)
    }

    /// Counts a failed authentication of `client` at `now`.
    pub fn failed(&self, client: IpAddr, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if windows.len() >= MAX_ADDRESSES && !windows.contains_key(&client) {
            windows.retain(|_, w| !w.expired(now));
            if windows.len() >= MAX_ADDRESSES {
                return;
            }
        }
        let window = throttle::failed(windows.get(&client).copied(), now);
        windows.insert(client, window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_own_window() {
        let auths = FailedAuths::default();
        let limit = NonZeroU32::new(2).unwrap();
        let (guesser, other): (IpAddr, IpAddr) =
            ("127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap());
        let now = Instant::now();
        auths.failed(guesser, now);
        auths.failed(guesser, now);
        assert!(matches!(
            auths.verdict(guesser, limit, now),
            Verdict::Throttled { first: true, .. }
        ));
        assert_eq!(auths.verdict(other, limit, now), Verdict::Check);
    }
}
