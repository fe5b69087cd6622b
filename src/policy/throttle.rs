//! Slowing down credential guessers (`auth.max_failures_per_minute`): per client address, the
//! failed authentications of a one-minute window; once the limit is reached, every request
//! from that address is refused with 429 until the window is over, without its credential
//! being checked. Pure: a window and the time in, a verdict out; the proxy keeps the windows.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// How long one window lasts.
pub const WINDOW: Duration = Duration::from_secs(60);

/// One address's failures in the window that began with its first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureWindow {
    pub started: Instant,
    pub failures: u32,
    /// Whether this window's throttling has been logged (once per address per window).
    pub logged: bool,
}

/// What to do with a request from an address, before its credential is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Check the credential as usual.
    Check,
    /// Refuse with 429: the address is past its limit for `retry_after_secs` more seconds.
    /// `first` is the first refusal of the window (the one that is logged).
    Throttled { retry_after_secs: u64, first: bool },
}

impl FailureWindow {
    /// Whether the window is over at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.started) >= WINDOW
    }
}

/// The verdict for a request at `now` from an address whose window is `window`, under
/// `limit`; the window is updated (marked logged on its first refusal).
pub fn verdict(window: Option<&mut FailureWindow>, limit: NonZeroU32, now: Instant) -> Verdict {
    let Some(w) = window else {
        return Verdict::Check;
    };
    if w.expired(now) || w.failures < limit.get() {
        return Verdict::Check;
    }
    let left = WINDOW.saturating_sub(now.saturating_duration_since(w.started));
    // Rounded up: a client that waits as told is never refused again by this window.
    let retry_after_secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let first = !w.logged;
    w.logged = true;
    Verdict::Throttled {
        retry_after_secs,
        first,
    }
}

/// The window after a failed authentication at `now`: the same one counting one more, or a
/// new one when there was none or it is over.
pub fn failed(window: Option<FailureWindow>, now: Instant) -> FailureWindow {
    match window {
        Some(w) if !w.expired(now) => FailureWindow {
            failures: w.failures.saturating_add(1),
            ..w
        },
        _ => FailureWindow {
            started: now,
            failures: 1,
            logged: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_reached_then_refused_until_the_minute_is_over() {
        let limit = NonZeroU32::new(3).unwrap();
        let t0 = Instant::now();
        let mut w = None;
        for i in 0..3 {
            let at = t0 + Duration::from_secs(i);
            assert_eq!(verdict(w.as_mut(), limit, at), Verdict::Check);
            w = Some(failed(w, at));
        }
        let at = t0 + Duration::from_millis(10_500);
        assert_eq!(
            verdict(w.as_mut(), limit, at),
            Verdict::Throttled {
                retry_after_secs: 50,
                first: true
            }
        );
        assert_eq!(
            verdict(w.as_mut(), limit, t0 + Duration::from_secs(59)),
            Verdict::Throttled {
                retry_after_secs: 1,
                first: false
            }
        );
        // The minute is over: checked again, and a new failure starts a new window.
        let later = t0 + WINDOW;
        assert_eq!(verdict(w.as_mut(), limit, later), Verdict::Check);
        let fresh = failed(w, later);
        assert_eq!(
            (fresh.started, fresh.failures, fresh.logged),
            (later, 1, false)
        );
    }

    #[test]
    fn an_address_without_failures_is_checked() {
        let limit = NonZeroU32::new(1).unwrap();
        assert_eq!(verdict(None, limit, Instant::now()), Verdict::Check);
    }
}
