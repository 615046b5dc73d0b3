//! Where the engine's CPU work (hashing what was just read) runs.
//!
//! Hashing blocks an async worker for the time SHA-256 takes over a request (about 0.1 ms
//! per 256 KiB), so it cannot run on the worker as is. Handing it to another thread
//! (`spawn_blocking`) costs a thread wake-up and a wait for the result per request, and
//! the bytes, just copied into the reading core's cache, are hashed on another core that
//! fetches them again. So on a multi-threaded runtime the work runs on the calling thread
//! through `tokio::task::block_in_place`, which first moves the runtime's other tasks to
//! another thread so nothing waits behind it (the file endpoints read the same way). On a
//! current-thread runtime, where that is not allowed, it goes to the blocking pool.

use ferry_core::{Error, Result};

/// Runs `f`, which does CPU work that takes more than a few microseconds, without
/// stalling the runtime, and returns its result.
pub(crate) async fn run<R, F>(f: F) -> Result<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if in_place_allowed() {
        return Ok(tokio::task::block_in_place(f));
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| Error::internal("a hashing thread panicked"))
}

/// Whether `block_in_place` may be called here: only on a multi-threaded runtime.
fn in_place_allowed() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_on_the_calling_thread_of_a_multi_threaded_runtime() {
        let caller = std::thread::current().id();
        let ran_on = run(|| std::thread::current().id()).await.unwrap();
        assert_eq!(ran_on, caller);
    }

    #[tokio::test]
    async fn uses_the_blocking_pool_on_a_current_thread_runtime() {
        let caller = std::thread::current().id();
        let ran_on = run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(ran_on, caller);
    }

    #[tokio::test]
    async fn a_panic_is_an_error() {
        let err = run(|| -> u8 { panic!("boom") }).await.unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Internal);
    }
}
