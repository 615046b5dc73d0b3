//! Job manager tests with in-memory endpoints: lifecycle, limits, retries, cancellation,
//! idempotency, restart recovery and pruning.
