//! What every client of one stand-in shares: the state under one lock, the log of
//! requests and refusals, and the background task that runs the simulated controllers
//! after each write (and every so often, for retries), ending when the cluster goes.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::sim;
use super::state::State;

/// One request a client sent, as answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The user (`system:admin`, or the ServiceAccount's user name).
    pub user: String,
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Query.
    pub query: String,
    /// Status code of the answer.
    pub code: u16,
}

/// The shared part of a stand-in.
#[derive(Debug)]
pub struct Shared {
    /// Objects, kinds, simulated controllers.
    pub state: Mutex<State>,
    wake: Notify,
    log: Mutex<Vec<Recorded>>,
    denied: Mutex<Vec<String>>,
    /// Watches that deliver late: (group, resource, label selector, lag).
    lags: Mutex<Vec<(String, String, String, Duration)>>,
}

/// How often the simulated controllers run when nothing wakes them.
const RESYNC: Duration = Duration::from_millis(200);

impl Shared {
    /// Shares `state`; starts the controllers' task when a tokio runtime is there.
    pub fn start(state: State) -> Arc<Self> {
        let shared = Arc::new(Self {
            state: Mutex::new(state),
            wake: Notify::new(),
            log: Mutex::default(),
            denied: Mutex::default(),
            lags: Mutex::default(),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(run_controllers(Arc::downgrade(&shared)));
        }
        shared
    }

    /// Wakes the simulated controllers (after a write).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Runs the simulated controllers now, until they settle.
    pub fn settle(&self) -> bool {
        sim::settle(&mut self.state.lock())
    }

    /// Makes watches of a resource with exactly this label selector deliver each change
    /// `lag` after it happened (watches opened from now on).
    pub fn set_lag(&self, group: &str, resource: &str, labels: &str, lag: Duration) {
        self.lags
            .lock()
            .push((group.into(), resource.into(), labels.into(), lag));
    }

    /// The lag of a new watch.
    pub fn lag(&self, group: &str, resource: &str, labels: &str) -> Option<Duration> {
        self.lags
            .lock()
            .iter()
            .find(|(g, r, l, _)| g == group && r == resource && l == labels)
            .map(|(_, _, _, d)| *d)
    }

    /// Logs a request.
    pub fn record(&self, r: Recorded) {
        self.log.lock().push(r);
    }

    /// Logs a refusal by RBAC.
    pub fn deny(&self, message: String) {
        self.denied.lock().push(message);
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().clone()
    }

    /// The RBAC refusals so far.
    pub fn denied(&self) -> Vec<String> {
        self.denied.lock().clone()
    }
}

async fn run_controllers(shared: Weak<Shared>) {
    // A strong reference is held for one wait at most, so a dropped cluster ends this task
    // within one resync.
    while let Some(s) = shared.upgrade() {
        let _ = tokio::time::timeout(RESYNC, s.wake.notified()).await;
        let any = s.state.lock().sims.any();
        if any {
            s.settle();
        }
    }
}
