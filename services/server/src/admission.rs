//! The scheduler: which queued job runs next.
//!
//! Pure bookkeeping with no I/O, so every rule is unit-tested directly: a global limit on
//! running jobs, a limit per endpoint host, highest priority first and FIFO within a
//! priority, and at most one running writer per target (a later job on a busy target
//! waits while jobs behind it on other targets may start; a fan-out waits until every one
//! of its targets is free). Retry timing (shared with endpoints) lives in `ferry_core::backoff`.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

/// Concurrency limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Jobs running at once, in total.
    pub max_running: usize,
    /// Jobs running at once that touch one endpoint host.
    pub max_per_host: usize,
}

/// What a job needs while it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// Endpoint hosts (deduplicated by the scheduler).
    pub hosts: Vec<String>,
    /// The targets it writes (none for a checksum, several for a fan-out).
    pub targets: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey {
    priority: Reverse<i32>,
    seq: u64,
    id: String,
}

/// The scheduler state.
#[derive(Debug)]
pub struct Scheduler {
    limits: Limits,
    queue: BTreeSet<QueueKey>,
    queued: HashMap<String, (QueueKey, Claim)>,
    running: HashMap<String, Claim>,
    host_load: HashMap<String, usize>,
    /// Target -> the job writing it now.
    writers: HashMap<String, String>,
    /// Target -> unfinished (queued or running) jobs writing it.
    target_jobs: HashMap<String, usize>,
}

impl Scheduler {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits: Limits {
                max_running: limits.max_running.max(1),
                max_per_host: limits.max_per_host.max(1),
            },
            queue: BTreeSet::new(),
            queued: HashMap::new(),
            running: HashMap::new(),
            host_load: HashMap::new(),
            writers: HashMap::new(),
            target_jobs: HashMap::new(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Adds a job to the queue.
    pub fn enqueue(&mut self, id: &str, priority: i32, seq: u64, mut claim: Claim) {
        if self.queued.contains_key(id) || self.running.contains_key(id) {
            return;
        }
        claim.hosts.sort();
        claim.hosts.dedup();
        claim.targets.sort();
        claim.targets.dedup();
        for t in &claim.targets {
            *self.target_jobs.entry(t.clone()).or_default() += 1;
        }
        let key = QueueKey {
            priority: Reverse(priority),
            seq,
            id: id.to_string(),
        };
        self.queue.insert(key.clone());
        self.queued.insert(id.to_string(), (key, claim));
    }

    /// Takes a queued job out (it was cancelled). False when it was not queued.
    pub fn remove_queued(&mut self, id: &str) -> bool {
        let Some((key, claim)) = self.queued.remove(id) else {
            return false;
        };
        self.queue.remove(&key);
        self.forget_target(&claim);
        true
    }

    /// Starts every queued job that fits now, in priority and FIFO order, and returns them.
    pub fn next_batch(&mut self) -> Vec<String> {
        let mut started = Vec::new();
        if self.running.len() >= self.limits.max_running {
            return started;
        }
        let mut picked = Vec::new();
        let mut hosts_now = self.host_load.clone();
        let mut writers_now: Vec<String> = Vec::new();
        for key in &self.queue {
            if self.running.len() + picked.len() >= self.limits.max_running {
                break;
            }
            let (_, claim) = &self.queued[&key.id];
            let host_full = claim
                .hosts
                .iter()
                .any(|h| hosts_now.get(h).copied().unwrap_or(0) >= self.limits.max_per_host);
            let target_busy = claim
                .targets
                .iter()
                .any(|t| self.writers.contains_key(t) || writers_now.contains(t));
            if host_full || target_busy {
                continue;
            }
            for h in &claim.hosts {
                *hosts_now.entry(h.clone()).or_default() += 1;
            }
            writers_now.extend(claim.targets.iter().cloned());
            picked.push(key.clone());
        }
        for key in picked {
            self.queue.remove(&key);
            let (_, claim) = self.queued.remove(&key.id).expect("queued job has a claim");
            for h in &claim.hosts {
                *self.host_load.entry(h.clone()).or_default() += 1;
            }
            for t in &claim.targets {
                self.writers.insert(t.clone(), key.id.clone());
            }
            self.running.insert(key.id.clone(), claim);
            started.push(key.id);
        }
        started
    }

    /// Marks a job started outside the queue (resumed after a restart) as running, even
    /// when that exceeds a limit for a while: it held its slot before the restart.
    pub fn resume_running(&mut self, id: &str, mut claim: Claim) {
        if self.running.contains_key(id) {
            return;
        }
        claim.hosts.sort();
        claim.hosts.dedup();
        claim.targets.sort();
        claim.targets.dedup();
        for h in &claim.hosts {
            *self.host_load.entry(h.clone()).or_default() += 1;
        }
        for t in &claim.targets {
            *self.target_jobs.entry(t.clone()).or_default() += 1;
            self.writers.insert(t.clone(), id.to_string());
        }
        self.running.insert(id.to_string(), claim);
    }

    /// Frees a running job's slot.
    pub fn release(&mut self, id: &str) {
        let Some(claim) = self.running.remove(id) else {
            return;
        };
        for h in &claim.hosts {
            if let Some(n) = self.host_load.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    self.host_load.remove(h);
                }
            }
        }
        for t in &claim.targets {
            if self.writers.get(t).is_some_and(|w| w == id) {
                self.writers.remove(t);
            }
        }
        self.forget_target(&claim);
    }

    fn forget_target(&mut self, claim: &Claim) {
        for t in &claim.targets {
            if let Some(n) = self.target_jobs.get_mut(t) {
                *n -= 1;
                if *n == 0 {
                    self.target_jobs.remove(t);
                }
            }
        }
    }

    /// Whether an unfinished job (queued or running) writes this target.
    pub fn target_in_use(&self, target: &str) -> bool {
        self.target_jobs.contains_key(target)
    }

    pub fn queued_len(&self) -> usize {
        self.queued.len()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn is_running(&self, id: &str) -> bool {
        self.running.contains_key(id)
    }
}

pub use ferry_core::backoff::{backoff, jitter_random};

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(hosts: &[&str], target: Option<&str>) -> Claim {
        Claim {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            targets: target.map(str::to_string).into_iter().collect(),
        }
    }

    fn fan_out(targets: &[&str]) -> Claim {
        Claim {
            hosts: Vec::new(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
        }
    }

    fn sched(max_running: usize, max_per_host: usize) -> Scheduler {
        Scheduler::new(Limits {
            max_running,
            max_per_host,
        })
    }

    #[test]
    fn global_limit_and_fifo() {
        let mut s = sched(2, 10);
        for i in 0..5 {
            s.enqueue(&format!("j{i}"), 0, i, claim(&[], None));
        }
        assert_eq!(s.next_batch(), ["j0", "j1"]);
        assert!(s.next_batch().is_empty());
        s.release("j1");
        assert_eq!(s.next_batch(), ["j2"]);
        s.release("j0");
        s.release("j2");
        assert_eq!(s.next_batch(), ["j3", "j4"]);
        assert_eq!((s.queued_len(), s.running_len()), (0, 2));
    }

    #[test]
    fn priority_first_then_fifo() {
        let mut s = sched(1, 10);
        s.enqueue("low", 0, 1, claim(&[], None));
        s.enqueue("high-late", 5, 3, claim(&[], None));
        s.enqueue("high-early", 5, 2, claim(&[], None));
        let mut order = Vec::new();
        loop {
            let batch = s.next_batch();
            if batch.is_empty() {
                break;
            }
            for id in batch {
                s.release(&id);
                order.push(id);
            }
        }
        assert_eq!(order, ["high-early", "high-late", "low"]);
    }

    #[test]
    fn per_host_limit_lets_other_hosts_through() {
        let mut s = sched(10, 1);
        s.enqueue("a1", 0, 1, claim(&["a"], None));
        s.enqueue("a2", 0, 2, claim(&["a"], None));
        s.enqueue("b1", 0, 3, claim(&["b"], None));
        s.enqueue("ab", 0, 4, claim(&["a", "b", "a"], None));
        assert_eq!(s.next_batch(), ["a1", "b1"]);
        s.release("a1");
        assert_eq!(s.next_batch(), ["a2"]);
        s.release("b1");
        s.release("a2");
        assert_eq!(s.next_batch(), ["ab"]);
    }

    #[test]
    fn one_writer_per_target() {
        let mut s = sched(10, 10);
        s.enqueue("w1", 0, 1, claim(&[], Some("/t")));
        s.enqueue("w2", 0, 2, claim(&[], Some("/t")));
        s.enqueue("other", 0, 3, claim(&[], Some("/u")));
        assert!(s.target_in_use("/t"));
        assert_eq!(s.next_batch(), ["w1", "other"]);
        assert!(s.next_batch().is_empty());
        s.release("w1");
        assert!(s.target_in_use("/t"));
        assert_eq!(s.next_batch(), ["w2"]);
        s.release("w2");
        s.release("other");
        assert!(!s.target_in_use("/t"));
        assert!(!s.target_in_use("/u"));
    }

    /// A fan-out holds every one of its targets: it waits while any is written, and
    /// while it runs no other job writes any of them.
    #[test]
    fn a_fan_out_writes_all_its_targets_alone() {
        let mut s = sched(10, 10);
        s.enqueue("single", 0, 1, claim(&[], Some("/b")));
        s.enqueue("fan", 0, 2, fan_out(&["/a", "/b", "/c"]));
        s.enqueue("after", 0, 3, claim(&[], Some("/c")));
        s.enqueue("free", 0, 4, claim(&[], Some("/d")));
        assert_eq!(s.next_batch(), ["single", "after", "free"]);
        assert!(s.target_in_use("/a"));
        s.release("single");
        assert!(s.next_batch().is_empty(), "/c is still written");
        s.release("after");
        assert_eq!(s.next_batch(), ["fan"]);
        s.enqueue("late", 0, 5, claim(&[], Some("/a")));
        assert!(s.next_batch().is_empty());
        s.release("fan");
        assert_eq!(s.next_batch(), ["late"]);
        s.release("late");
        s.release("free");
        for t in ["/a", "/b", "/c", "/d"] {
            assert!(!s.target_in_use(t), "{t}");
        }
    }

    #[test]
    fn cancelled_queued_job_frees_its_target() {
        let mut s = sched(1, 1);
        s.enqueue("a", 0, 1, claim(&["h"], Some("/t")));
        assert!(s.remove_queued("a"));
        assert!(!s.remove_queued("a"));
        assert!(!s.target_in_use("/t"));
        assert!(s.next_batch().is_empty());
    }

    #[test]
    fn resumed_jobs_hold_their_slots() {
        let mut s = sched(1, 1);
        s.resume_running("r", claim(&["h"], Some("/t")));
        s.enqueue("q", 0, 1, claim(&["h"], None));
        assert!(s.next_batch().is_empty());
        s.release("r");
        assert_eq!(s.next_batch(), ["q"]);
    }
}
