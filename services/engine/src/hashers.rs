//! Hashing threads fed from a queue, so they never wait for the async side.
//!
//! The checksum reads chunks on the async task that drives its pipeline; a blocking pool
//! gated by a semaphore only started the next hash when that task got round to polling
//! the chunk that won the freed permit, and while it was busy reading the next chunk a
//! core sat idle. Here the read chunk is queued at once and the next free thread takes
//! it; the result comes back through a oneshot channel.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;

use ferry_core::{Error, Result};
use parking_lot::Mutex;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed number of threads running queued jobs; they stop when this is dropped and the
/// queue is empty.
pub(crate) struct Hashers {
    queue: mpsc::Sender<Job>,
}

impl Hashers {
    /// Starts `threads` threads.
    pub(crate) fn new(threads: usize) -> Result<Self> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        for _ in 0..threads.max(1) {
            let jobs = Arc::clone(&jobs);
            std::thread::Builder::new()
                .name("ferry-hash".into())
                .spawn(move || loop {
                    let job = jobs.lock().recv();
                    match job {
                        // A panic drops the job's result sender: its caller sees the error.
                        Ok(job) => drop(panic::catch_unwind(AssertUnwindSafe(job))),
                        Err(_) => break,
                    }
                })
                .map_err(|e| Error::internal(format!("cannot start a hashing thread: {e}")))?;
        }
        Ok(Self { queue })
    }

    /// Runs `f` on the next free thread.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| Error::internal("the hashing threads stopped"))?;
        rx.await
            .map_err(|_| Error::internal("a hashing thread panicked"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_and_survives_a_panic() {
        let hashers = Hashers::new(2).unwrap();
        assert_eq!(hashers.run(|| 6 * 7).await.unwrap(), 42);
        let err = hashers.run(|| -> i32 { panic!("boom") }).await.unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        let results = futures::future::join_all((0..10).map(|i| hashers.run(move || i * 2))).await;
        let results: Vec<i32> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(results, (0..10).map(|i| i * 2).collect::<Vec<_>>());
    }
}
