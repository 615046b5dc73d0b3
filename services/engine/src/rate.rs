//! A token bucket on bytes read, shared by all workers of a copy.
//!
//! A request takes its tokens up front and may drive the bucket into debt; the debt is
//! paid by sleeping, so concurrent workers queue behind each other fairly and requests
//! larger than the burst still pass. It runs on tokio's clock so tests can pause time.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
struct State {
    /// May be negative: debt owed by requests already admitted.
    tokens: f64,
    last: Instant,
    /// Every token ever taken (for tests and metrics).
    taken: u64,
}

#[derive(Debug)]
pub(crate) struct RateLimiter {
    rate: f64,
    burst: f64,
    state: Mutex<State>,
}

impl RateLimiter {
    /// `rate` bytes per second with a burst of `burst` bytes (the bucket starts full).
    pub fn new(rate: u64, burst: u64) -> Self {
        let burst = burst.max(1) as f64;
        Self {
            rate: rate.max(1) as f64,
            burst,
            state: Mutex::new(State {
                tokens: burst,
                last: Instant::now(),
                taken: 0,
            }),
        }
    }

    /// Takes `bytes` tokens, sleeping while the bucket is in debt.
    pub async fn acquire(&self, bytes: u64) {
        let wait = {
            let mut s = self.state.lock();
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
            s.last = now;
            s.tokens = (s.tokens + elapsed * self.rate).min(self.burst);
            s.tokens -= bytes as f64;
            s.taken += bytes;
            if s.tokens < 0.0 {
                Duration::from_secs_f64(-s.tokens / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    #[cfg(test)]
    pub fn taken(&self) -> u64 {
        self.state.lock().taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn admits_burst_then_paces_at_the_rate() {
        let limiter = RateLimiter::new(1000, 500);
        let start = Instant::now();
        limiter.acquire(500).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        for _ in 0..10 {
            limiter.acquire(100).await;
        }
        // 1000 more tokens at 1000/s: one second, on the paused clock.
        let elapsed = start.elapsed().as_secs_f64();
        assert!((0.99..1.01).contains(&elapsed), "{elapsed}");
        assert_eq!(limiter.taken(), 1500);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_larger_than_the_burst_pass() {
        let limiter = RateLimiter::new(100, 10);
        let start = Instant::now();
        limiter.acquire(210).await;
        let elapsed = start.elapsed().as_secs_f64();
        assert!((1.99..2.01).contains(&elapsed), "{elapsed}");
    }
}
