//! Running blocking file calls off the async threads.
//!
//! pread, pwrite, fallocate and fdatasync block; an async worker must not. Each handle owns
//! a small pool of I/O threads, started on demand up to [`MAX_THREADS`] (one per request the
//! handle has in flight at once) and stopped when the handle is dropped; a request is a
//! boxed closure whose result comes back through a oneshot channel.
//!
//! Measured against `tokio::task::spawn_blocking` and a single thread per handle, 8 tasks
//! reading a cached file on the shared 2-core machine (CPU seconds, user+sys):
//! 4 KiB requests, 64 Ki of them: spawn_blocking 0.6-2.0 s, pool 0.25-0.55 s;
//! 64 KiB requests, 4 GiB: spawn_blocking 2.1-3.5 s, pool 1.2-1.9 s; 1 MiB requests: equal
//! (about 1.0 s), and equal within the noise for a 4 GiB 50%-data copy through the engine.
//! A single thread per handle was as cheap, but serialised a handle's concurrent requests:
//! 2-3x slower when one handle has 8 requests in flight, as the checksum engine does.
//!
//! Page-cache I/O is a memory copy of tens of microseconds, and handing each request to
//! another thread and back cost more than the copy itself: for a 4 GiB half-data copy,
//! 2.3-3.2 s and 115-135 thousand context switches through the pool, against 1.6-1.7 s
//! and 8-10 thousand running on the calling thread, which also beat nbdcopy's 1.8-2.0 s
//! (docs/BENCHMARKS.md). So an executor made with [`Executor::inline`] runs requests on
//! the calling thread through `tokio::task::block_in_place`, which first moves the
//! runtime's other tasks to another thread so nothing waits behind the call. That needs
//! a multi-threaded runtime; on a current-thread runtime it uses its pool. Direct I/O
//! keeps the pool, because there each request waits for the device and several in
//! flight per worker keep a real disk's queue full.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;

use ferry_core::{Error, Result};
use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// Most threads one handle runs at once.
const MAX_THREADS: usize = 8;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A handle's I/O threads.
#[derive(Debug)]
pub(crate) struct Executor {
    shared: Arc<Shared>,
    /// Run requests on the calling thread when the runtime allows it.
    inline: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
    /// Idle threads already woken for a job they have not taken yet.
    notified: usize,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// A thread's life: take jobs until the executor is dropped and the queue is empty.
    fn work(&self) {
        let mut st = self.lock();
        loop {
            if let Some(job) = st.queue.pop_front() {
                drop(st);
                // A panicking job drops its result sender, which its caller sees as an
                // error; the thread lives on.
                let _ = panic::catch_unwind(AssertUnwindSafe(job));
                st = self.lock();
                continue;
            }
            if st.closed {
                st.threads -= 1;
                return;
            }
            st.idle += 1;
            self.wake.wait(&mut st);
            st.idle -= 1;
            st.notified = st.notified.saturating_sub(1);
        }
    }
}

impl Executor {
    /// An executor that runs every request on its I/O threads (none started yet).
    pub(crate) fn pooled() -> Self {
        Self {
            shared: Arc::new(Shared::default()),
            inline: false,
        }
    }

    /// An executor that runs requests on the calling thread on a multi-threaded runtime,
    /// and on its I/O threads elsewhere.
    pub(crate) fn inline() -> Self {
        Self {
            shared: Arc::new(Shared::default()),
            inline: true,
        }
    }

    /// An executor for a handle: inline for page-cache I/O, pooled for direct I/O.
    pub(crate) fn for_handle(direct: bool) -> Self {
        if direct {
            Self::pooled()
        } else {
            Self::inline()
        }
    }

    /// Runs `f` on the calling thread or one of the handle's I/O threads and returns its
    /// result.
    pub(crate) async fn run<R, F>(&self, f: F) -> Result<R>
    where
        F: FnOnce() -> Result<R> + Send + 'static,
        R: Send + 'static,
    {
        if self.inline && may_block_in_place() {
            return tokio::task::block_in_place(f);
        }
        let (tx, rx) = oneshot::channel();
        self.submit(Box::new(move || {
            let _ = tx.send(f());
        }))?;
        rx.await
            .map_err(|_| Error::internal("a file I/O request was dropped (a bug: it panicked)"))?
    }

    fn submit(&self, job: Job) -> Result<()> {
        let mut st = self.shared.lock();
        st.queue.push_back(job);
        if st.idle > st.notified {
            st.notified += 1;
            drop(st);
            self.shared.wake.notify_one();
            return Ok(());
        }
        if st.threads >= MAX_THREADS {
            // Every thread is busy; the first one done takes the job.
            return Ok(());
        }
        st.threads += 1;
        drop(st);
        let shared = Arc::clone(&self.shared);
        let spawned = thread::Builder::new()
            .name("ferry-file-io".into())
            .spawn(move || shared.work());
        if let Err(e) = spawned {
            let mut st = self.shared.lock();
            st.threads -= 1;
            if st.threads == 0 {
                // Nobody would ever run them: fail them (their callers see an error).
                st.queue.clear();
            }
            return Err(Error::io("cannot start a file I/O thread", e));
        }
        Ok(())
    }
}

/// Whether `block_in_place` may be called here: only on a multi-threaded runtime.
fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn runs_concurrent_requests_on_several_threads() {
        let exec = Executor::pooled();
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let requests = (0..4).map(|i| {
            let (running, peak) = (Arc::clone(&running), Arc::clone(&peak));
            exec.run(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(i)
            })
        });
        let results: Vec<_> = futures::future::join_all(requests)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(results, vec![0, 1, 2, 3]);
        assert!(
            peak.load(Ordering::SeqCst) > 1,
            "requests ran one at a time"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inline_requests_run_on_the_calling_thread_of_a_multi_threaded_runtime() {
        let exec = Executor::inline();
        let caller = std::thread::current().id();
        let ran_on = exec.run(|| Ok(std::thread::current().id())).await.unwrap();
        assert_eq!(ran_on, caller);
    }

    #[tokio::test]
    async fn inline_requests_use_the_pool_on_a_current_thread_runtime() {
        let exec = Executor::inline();
        let caller = std::thread::current().id();
        let ran_on = exec.run(|| Ok(std::thread::current().id())).await.unwrap();
        assert_ne!(ran_on, caller);
    }

    #[tokio::test]
    async fn a_panicking_request_is_an_error_and_the_pool_lives_on() {
        let exec = Executor::pooled();
        let err = exec
            .run(|| -> Result<()> { panic!("boom") })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Internal);
        assert_eq!(exec.run(|| Ok(7)).await.unwrap(), 7);
    }
}
