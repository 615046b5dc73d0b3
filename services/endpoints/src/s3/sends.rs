//! Which part uploads are still running, so `flush` and `finish` can wait for them.
//!
//! A wait takes nothing out of the record: it only watches the set of running uploads
//! shrink. That matters because waits are cancelled and overlap. The copy flushes at every
//! checkpoint and drops that flush when its workers end, then finishes; a wait that had
//! taken the upload tasks' handles away would lose them when dropped, and `finish` would
//! complete the multipart upload while a part was still on its way ("part N was never
//! uploaded"). Here a dropped wait loses nothing, and any number of waits may run at once.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Part uploads by start number: every upload registers before its task starts and
/// leaves when the task ends, however it ends (done, failed, aborted or panicked).
#[derive(Debug, Default)]
pub(crate) struct Sends {
    state: Mutex<State>,
    ended: Notify,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    running: BTreeSet<u64>,
}

/// One registered upload, moved into its task; dropping it records the upload's end.
#[derive(Debug)]
#[must_use = "the upload counts as running until this is dropped"]
pub(crate) struct Running {
    sends: Arc<Sends>,
    number: u64,
}

impl Sends {
    /// Registers an upload that is about to start.
    pub fn start(self: &Arc<Self>) -> Running {
        let mut state = self.state.lock();
        let number = state.next;
        state.next += 1;
        state.running.insert(number);
        Running {
            sends: Arc::clone(self),
            number,
        }
    }

    fn end(&self, number: u64) {
        self.state.lock().running.remove(&number);
        self.ended.notify_waiters();
    }

    /// Waits until every upload registered before this call has ended. Cancel-safe.
    pub async fn wait_for_earlier(&self) {
        let before = self.state.lock().next;
        loop {
            let ended = self.ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let oldest = self.state.lock().running.first().copied();
            if oldest.is_none_or(|n| n >= before) {
                return;
            }
            ended.await;
        }
    }

    /// Uploads still running.
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.state.lock().running.len()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.sends.end(self.number);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_wait_sees_only_uploads_started_before_it() {
        let sends = Arc::new(Sends::default());
        let first = sends.start();
        let waiter = {
            let sends = Arc::clone(&sends);
            tokio::spawn(async move { sends.wait_for_earlier().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let later = sends.start();
        assert!(!waiter.is_finished(), "the first upload still runs");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait ends with the first upload, not the later one")
            .unwrap();
        assert_eq!(sends.running(), 1);
        drop(later);
        assert_eq!(sends.running(), 0);
    }

    #[tokio::test]
    async fn a_dropped_wait_loses_nothing_and_waits_overlap() {
        let sends = Arc::new(Sends::default());
        let upload = sends.start();
        let cancelled =
            tokio::time::timeout(Duration::from_millis(10), sends.wait_for_earlier()).await;
        assert!(cancelled.is_err(), "the upload still runs");
        let waits: Vec<_> = (0..3)
            .map(|_| {
                let sends = Arc::clone(&sends);
                tokio::spawn(async move { sends.wait_for_earlier().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            waits.iter().all(|w| !w.is_finished()),
            "after a cancelled wait, every new wait still sees the running upload"
        );
        drop(upload);
        for wait in waits {
            tokio::time::timeout(Duration::from_secs(5), wait)
                .await
                .expect("every wait ends")
                .unwrap();
        }
    }

    #[tokio::test]
    async fn nothing_running_returns_at_once() {
        let sends = Arc::new(Sends::default());
        sends.wait_for_earlier().await;
        drop(sends.start());
        sends.wait_for_earlier().await;
    }
}
