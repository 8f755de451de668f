//! The one exponential backoff: retries of failed controllers, target
//! restarts, probes of a starting target, waits for the kernel and for locks.
//!
//! ```text
//!   Backoff::new(base, max) ──next_delay──> base, 2·base, 4·base, ... max, max, ...
//!        │ reset() after a success: back to base
//!        └ sleep_before(deadline): sleeps the next delay cut at the deadline; false once it passed
//! ```

use std::time::{Duration, Instant};

/// Exponential backoff: `base * 2^n` capped at `max`, without a retry limit
/// (callers bound it by a deadline when they need one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub base: Duration,
    /// The cap.
    pub max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `base`, capped at `max`.
    pub const fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            attempt: 0,
        }
    }

    /// The delay [`Self::next_delay`] would give, without counting it.
    pub fn peek(&self) -> Duration {
        self.base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max)
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.peek();
        self.attempt = self.attempt.saturating_add(1);
        d
    }

    /// Attempts so far.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Blocks for the next delay, cut at `deadline`; false (without
    /// sleeping) once `deadline` has passed.
    pub fn sleep_before(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(self.next_delay().min(deadline - now));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let d: Vec<u64> = (0..6).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(d, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.attempts(), 6);
        assert_eq!(b.peek(), Duration::from_secs(1));
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        // no overflow however long it runs
        let mut long = Backoff::new(Duration::from_secs(1), Duration::MAX);
        for _ in 0..100 {
            long.next_delay();
        }
        assert_eq!(long.peek(), Duration::from_secs(1 << 20));
    }

    #[test]
    fn stops_at_the_deadline() {
        let mut b = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        assert!(!b.sleep_before(Instant::now()));
        assert_eq!(b.attempts(), 0);
        assert!(b.sleep_before(Instant::now() + Duration::from_secs(5)));
        assert_eq!(b.attempts(), 1);
    }
}
