//! The one retry policy of both NFS versions: a call is sent again after a lost
//! connection while the reconnect window lasts, and after a busy server (NFSv3 JUKEBOX,
//! NFSv4 DELAY or GRACE) while the request timeout lasts, with a doubling pause between
//! attempts, capped at [`MAX_DELAY`]. Both windows are measured from the first attempt.

use std::time::{Duration, Instant};

use crate::rpc::RpcError;

/// First pause of an NFSv4 request's retries (a SEQUENCE retry is cheap).
pub const FIRST_DELAY_V4_REQUEST: Duration = Duration::from_millis(20);
/// First pause of every other retry (NFSv3 calls, connects, session setup).
pub const FIRST_DELAY: Duration = Duration::from_millis(50);
/// Longest pause between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// A capped doubling pause, counted from the first attempt.
#[derive(Debug)]
pub struct Backoff {
    start: Instant,
    delay: Duration,
}

impl Backoff {
    /// Starts now; the first pause is `first`.
    pub fn new(first: Duration) -> Self {
        Self {
            start: Instant::now(),
            delay: first,
        }
    }

    /// Pauses before the next attempt when `window` has not passed since the first one:
    /// false (at once) when it has.
    pub async fn wait_within(&mut self, window: Duration) -> bool {
        if self.start.elapsed() >= window {
            return false;
        }
        tokio::time::sleep(self.next_delay()).await;
        true
    }

    /// The pause before the next attempt; the one after it is twice as long, up to the cap.
    fn next_delay(&mut self) -> Duration {
        let delay = self.delay;
        self.delay = (delay * 2).min(MAX_DELAY);
        delay
    }
}

/// The retries of one call: [`Backoff`] with the two windows of the module docs.
#[derive(Debug)]
pub struct Retry {
    backoff: Backoff,
    reconnect: Duration,
    busy: Duration,
}

impl Retry {
    /// `reconnect`: how long lost connections are retried; `busy`: how long a busy
    /// server is waited for.
    pub fn new(first: Duration, reconnect: Duration, busy: Duration) -> Self {
        Self {
            backoff: Backoff::new(first),
            reconnect,
            busy,
        }
    }

    /// After `e`: pauses and says to try again when the connection was lost within the
    /// reconnect window; false when `e` is final.
    pub async fn after_rpc_error(&mut self, e: &RpcError) -> bool {
        e.is_connection_loss() && self.backoff.wait_within(self.reconnect).await
    }

    /// After the server said it is busy: pauses and says to try again within the
    /// request timeout.
    pub async fn after_busy(&mut self) -> bool {
        self.backoff.wait_within(self.busy).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut b = Backoff::new(FIRST_DELAY);
        let ms: Vec<u128> = (0..7).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(ms, [50, 100, 200, 400, 800, 1000, 1000]);
    }

    #[tokio::test]
    async fn nothing_is_retried_after_the_window() {
        let mut b = Backoff::new(FIRST_DELAY);
        assert!(!b.wait_within(Duration::ZERO).await);
        let mut r = Retry::new(FIRST_DELAY, Duration::ZERO, Duration::ZERO);
        let lost = RpcError::Disconnected {
            addr: "127.0.0.1:1".parse().unwrap(),
            reason: "test".into(),
        };
        assert!(!r.after_rpc_error(&lost).await);
        assert!(!r.after_busy().await);
        let mut r = Retry::new(
            Duration::from_millis(1),
            Duration::from_secs(60),
            Duration::ZERO,
        );
        assert!(r.after_rpc_error(&lost).await);
        let refused = RpcError::GarbageArgs {
            addr: "127.0.0.1:1".parse().unwrap(),
        };
        assert!(!r.after_rpc_error(&refused).await, "not a lost connection");
    }
}
