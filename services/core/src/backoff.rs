//! Retry delays: capped exponential backoff with jitter, shared by the job scheduler
//! (retries of whole jobs) and network endpoints (retries of single requests), so both
//! back off the same way.

use std::time::Duration;

/// Delay before retry number `retry` (1 = the first retry): capped exponential backoff
/// with "equal jitter" (half fixed, half random), `random` in [0, 1).
pub fn backoff(retry: u32, base: Duration, cap: Duration, random: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << retry.saturating_sub(1).min(20));
    let ceiling = exp.min(cap);
    let random = random.clamp(0.0, 1.0);
    ceiling.mul_f64(0.5 + random / 2.0)
}

/// A cheap random number in [0, 1) for jitter (not for anything secret).
pub fn jitter_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// [`backoff`] with a fresh [`jitter_random`].
pub fn backoff_jittered(retry: u32, base: Duration, cap: Duration) -> Duration {
    backoff(retry, base, cap, jitter_random())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_exponential_with_jitter() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(2);
        assert_eq!(backoff(1, base, cap, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(1, base, cap, 0.0), Duration::from_millis(50));
        assert_eq!(backoff(3, base, cap, 1.0), Duration::from_millis(400));
        assert_eq!(backoff(30, base, cap, 1.0), cap);
        assert_eq!(backoff(30, base, cap, 0.0), cap / 2);
        for _ in 0..100 {
            let r = jitter_random();
            assert!((0.0..1.0).contains(&r));
            let d = backoff_jittered(2, base, cap);
            assert!(d >= base && d <= base * 2, "{d:?}");
        }
    }
}
