//! Passive ejection, as Envoy's outlier detection does it: `upstream.eject_after_failures`
//! consecutive failures on one address (a connect that fails, a connection reset, an answer that is
//! not HTTP or breaks off) take it out of the rotation for `upstream.eject_ms`, twice as long on
//! each repeat up to a cap. The last address in rotation is never ejected: the failures go on
//! counting, and it goes once another is back. An active check that passes after an ejection began
//! may bring the address back early. Counting the failures in a row is the data plane's (one atomic
//! per request); what they lead to is decided here.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::EjectionConfig;

/// One address's ejections.
#[derive(Debug, Clone, Default)]
pub struct Outlier {
    /// Ejections since the address last stayed in rotation for a whole cap: the next lasts
    /// the base doubled that many times.
    repeats: u32,
    /// The current or last ejection: (from, until).
    ejection: Option<(Instant, Instant)>,
}

impl Outlier {
    /// Decides on `failures` failures in a row at `now`, when `others_in_rotation` says
    /// whether any other address would still take requests: the ejection's length, when the
    /// address is ejected now.
    pub fn failed(
        &mut self,
        failures: u32,
        now: Instant,
        config: &EjectionConfig,
        others_in_rotation: bool,
    ) -> Option<Duration> {
        if config.after_failures == 0
            || failures < config.after_failures
            || self.ejected(now)
            || !others_in_rotation
        {
            return None;
        }
        // A spell in rotation as long as the cap forgives the earlier ejections.
        if self
            .ejection
            .is_some_and(|(_, until)| now.saturating_duration_since(until) >= config.cap())
        {
            self.repeats = 0;
        }
        let length = config
            .base
            .saturating_mul(1 << self.repeats.min(16))
            .min(config.cap());
        self.repeats = self.repeats.saturating_add(1);
        self.ejection = Some((now, now + length));
        Some(length)
    }

    /// Whether the address is out of the rotation at `now`.
    pub fn ejected(&self, now: Instant) -> bool {
        self.ejection.is_some_and(|(_, until)| now < until)
    }

    /// When the current ejection ends, if the address is ejected at `now`.
    pub fn ejected_until(&self, now: Instant) -> Option<Instant> {
        self.ejection
            .filter(|_| self.ejected(now))
            .map(|(_, until)| until)
    }

    /// Brings the address back when an active check that started at `check_started`, after
    /// its ejection began, passed; whether it did.
    pub fn check_passed(&mut self, check_started: Instant) -> bool {
        match &mut self.ejection {
            Some((from, until)) if *from <= check_started && check_started < *until => {
                *until = check_started;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EjectionConfig {
        EjectionConfig {
            after_failures: 3,
            base: Duration::from_secs(10),
        }
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn the_threshold_ejects_and_each_repeat_doubles_up_to_the_cap() {
        let mut o = Outlier::default();
        let mut now = Instant::now();
        assert_eq!(o.failed(2, now, &config(), true), None);
        let mut lengths = Vec::new();
        for _ in 0..7 {
            let length = o.failed(3, now, &config(), true).unwrap();
            assert!(o.ejected(now) && o.ejected_until(now) == Some(now + length));
            assert_eq!(o.failed(3, now, &config(), true), None, "already out");
            now += length;
            assert!(!o.ejected(now));
            lengths.push(length.as_secs());
        }
        assert_eq!(lengths, [10, 20, 40, 80, 160, 300, 300]);
        // A spell in rotation as long as the cap starts again from the base.
        now += 300 * SEC;
        assert_eq!(o.failed(3, now, &config(), true), Some(10 * SEC));
    }

    #[test]
    fn the_last_address_in_rotation_is_never_ejected() {
        let mut o = Outlier::default();
        let now = Instant::now();
        assert_eq!(o.failed(50, now, &config(), false), None);
        assert!(!o.ejected(now));
        assert_eq!(o.failed(51, now, &config(), true), Some(10 * SEC));
    }

    #[test]
    fn zero_failures_turns_ejection_off() {
        let mut o = Outlier::default();
        let off = EjectionConfig {
            after_failures: 0,
            ..config()
        };
        assert_eq!(o.failed(1000, Instant::now(), &off, true), None);
    }

    #[test]
    fn only_a_check_that_started_after_the_ejection_brings_it_back() {
        let mut o = Outlier::default();
        let now = Instant::now();
        o.failed(3, now + SEC, &config(), true).unwrap();
        assert!(!o.check_passed(now), "that check began before the failures");
        assert!(o.ejected(now + 2 * SEC));
        assert!(o.check_passed(now + 2 * SEC));
        assert!(!o.ejected(now + 2 * SEC));
        // The next ejection is a repeat: twice as long.
        assert_eq!(o.failed(3, now + 3 * SEC, &config(), true), Some(20 * SEC));
    }
}
