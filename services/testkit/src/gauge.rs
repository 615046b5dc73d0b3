//! [`Gauge`]: how many bytes are in flight now and at most, the check behind every
//! memory-bound test.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Tracks the bytes of concurrent requests and their maximum.
#[derive(Debug, Default)]
pub struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    /// A request of `n` bytes starts.
    pub fn enter(&self, n: usize) {
        let now = self.now.fetch_add(n, Ordering::SeqCst) + n;
        self.max.fetch_max(now, Ordering::SeqCst);
    }

    /// A request of `n` bytes ends.
    pub fn leave(&self, n: usize) {
        self.now.fetch_sub(n, Ordering::SeqCst);
    }

    /// The most bytes ever in flight at once.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_maximum() {
        let g = Gauge::default();
        g.enter(3);
        g.enter(4);
        g.leave(3);
        g.enter(1);
        assert_eq!(g.max(), 7);
    }
}
