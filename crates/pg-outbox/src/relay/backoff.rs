use std::time::Duration;

use rand::Rng;

/// Exponential backoff with full jitter: after the `n`-th failure (n = 1, 2, …) the
/// delay is uniform in `[0, min(max, base · 2^(n-1))]`. Jitter spreads the retries of
/// a batch that failed together (a broker outage) instead of retrying it in lockstep.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The capped, un-jittered delay after `failures` failures (at least 1).
    pub fn cap(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(32);
        self.base
            .checked_mul(1_u32 << exponent.min(31))
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The delay before the next attempt after `failures` failures.
    pub fn delay(&self, failures: u32) -> Duration {
        let cap = u64::try_from(self.cap(failures).as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(0..=cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
        };
        assert_eq!(backoff.cap(1), Duration::from_secs(1));
        assert_eq!(backoff.cap(2), Duration::from_secs(2));
        assert_eq!(backoff.cap(9), Duration::from_secs(256));
        assert_eq!(backoff.cap(10), Duration::from_secs(300));
        assert_eq!(backoff.cap(u32::MAX), Duration::from_secs(300));
        for failures in 1..50 {
            assert!(backoff.delay(failures) <= backoff.cap(failures));
        }
    }
}
