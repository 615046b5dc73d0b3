//! Bandwidth limits of a sync: a byte rate that may change with time (Proxmox Backup
//! Server's traffic control: a limit only during office hours). The repository knows
//! nothing of clocks and time zones: a [`RatePolicy`] says which limit applies now, and
//! [`RateLimit`] holds the bytes sent to it, counting again from zero whenever the limit
//! changes (so bytes sent unlimited never buy a burst inside a limited window).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Which limit applies now.
pub trait RatePolicy: Send + Sync + std::fmt::Debug {
    /// Bytes per second allowed now (`None`: unlimited now).
    fn rate_now(&self) -> Option<u64>;
}

/// The same limit at all times.
#[derive(Debug, Clone, Copy)]
pub struct FixedRate(pub u64);

impl RatePolicy for FixedRate {
    fn rate_now(&self) -> Option<u64> {
        Some(self.0.max(1))
    }
}

/// The bytes sent under the limit in force since it last changed.
#[derive(Debug)]
struct Window {
    rate: Option<u64>,
    start: Instant,
    sent: u64,
}

/// A bandwidth limit: callers wait until the bytes sent fit the rate since the limit
/// came into force.
#[derive(Debug)]
pub(crate) struct RateLimit {
    policy: Arc<dyn RatePolicy>,
    window: Mutex<Window>,
}

impl RateLimit {
    pub(crate) fn new(policy: Arc<dyn RatePolicy>) -> Self {
        Self {
            window: Mutex::new(Window {
                rate: policy.rate_now(),
                start: Instant::now(),
                sent: 0,
            }),
            policy,
        }
    }

    /// How long to wait after sending `bytes` more, counted under the limit in force.
    fn due(&self, bytes: u64) -> Option<Duration> {
        let rate = self.policy.rate_now();
        let mut w = self.window.lock();
        if w.rate != rate {
            *w = Window {
                rate,
                start: Instant::now(),
                sent: 0,
            };
        }
        let rate = rate?.max(1);
        w.sent += bytes;
        let due = Duration::from_secs_f64(w.sent as f64 / rate as f64);
        due.checked_sub(w.start.elapsed())
    }

    /// Counts `bytes` sent and waits until they fit the rate.
    pub(crate) async fn take(&self, bytes: u64) {
        if let Some(wait) = self.due(bytes) {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Debug, Default)]
    struct Switch(AtomicBool);

    impl RatePolicy for Switch {
        fn rate_now(&self) -> Option<u64> {
            self.0.load(Ordering::Relaxed).then_some(1000)
        }
    }

    #[test]
    fn a_fixed_rate_makes_senders_wait_for_their_bytes() {
        let limit = RateLimit::new(Arc::new(FixedRate(1000)));
        let wait = limit.due(500).unwrap();
        assert!(wait > Duration::from_millis(400) && wait <= Duration::from_millis(500));
        let wait = limit.due(500).unwrap();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_millis(1000));
    }

    #[test]
    fn outside_a_window_nothing_waits_and_bytes_sent_then_buy_no_burst_inside() {
        let switch = Arc::new(Switch::default());
        let limit = RateLimit::new(switch.clone());
        assert_eq!(limit.due(1_000_000), None);
        switch.0.store(true, Ordering::Relaxed);
        let wait = limit.due(1000).unwrap();
        assert!(wait > Duration::from_millis(900), "{wait:?}");
        switch.0.store(false, Ordering::Relaxed);
        assert_eq!(limit.due(1_000_000), None);
    }
}
