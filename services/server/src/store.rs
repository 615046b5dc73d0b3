//! The persistent job store: jobs, checkpoints and schedules in an embedded redb database
//! under the data directory.
//!
//! redb commits are atomic and durable (copy-on-write B-trees with a checksummed commit
//! slot), so a kill -9 at any moment leaves the last committed state. All writes go
//! through one writer thread that commits whatever has queued up in a single transaction
//! (group commit): fifty concurrent StartTransfer calls cost about one fsync, not fifty.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{mpsc, Arc};

use ferry_core::{Error, ErrorKind, Result};
use ferry_engine::Checkpoint;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use crate::model::job::JobRecord;
use crate::model::schedule::ScheduleRecord;

const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
const SCHEDULES: TableDefinition<&str, &[u8]> = TableDefinition::new("schedules");

/// Most operations one transaction takes from the queue.
const MAX_BATCH: usize = 512;

/// One change.
#[derive(Debug)]
pub enum Op {
    PutJob(Box<JobRecord>),
    PutCheckpoint(String, Checkpoint),
    DeleteCheckpoint(String),
    /// Deletes a job and its checkpoint.
    DeleteJob(String),
    PutSchedule(Box<ScheduleRecord>),
    DeleteSchedule(String),
}

type Reply = oneshot::Sender<Result<()>>;

enum Msg {
    Commit(Vec<Op>, Reply),
    Load(oneshot::Sender<Result<Loaded>>),
    Close,
}

/// What the store held when it was opened.
#[derive(Debug, Default)]
pub struct Loaded {
    /// In acceptance order.
    pub jobs: Vec<JobRecord>,
    pub checkpoints: HashMap<String, Checkpoint>,
    /// In no particular order.
    pub schedules: Vec<ScheduleRecord>,
}

/// A handle to the store; cheap to clone. Only the writer thread owns the database, so
/// [`Store::close`] really closes it (a restart in the same process can reopen it).
#[derive(Debug, Clone)]
pub struct Store {
    tx: mpsc::Sender<Msg>,
    writer: Arc<parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Commit(..) => "Commit",
            Self::Load(_) => "Load",
            Self::Close => "Close",
        })
    }
}

fn db_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("job store: {what}: {e}"))
}

impl Store {
    /// Opens (or creates) `dir/jobs.redb` and loads everything in it.
    pub fn open(dir: &Path) -> Result<(Self, Loaded)> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create data directory {}", dir.display()), e))?;
        let path = dir.join("jobs.redb");
        let db = Database::create(&path).map_err(|e| {
            db_error(
                &format!(
                    "cannot open {} (is another ferry serve using this --data-dir?)",
                    path.display()
                ),
                e,
            )
        })?;
        let mut txn = db.begin_write().map_err(|e| db_error("begin", e))?;
        // Creating the tables needs no sync of its own: a crash before the first durable
        // commit loses only empty tables, which the next open creates again. A mover
        // pod's service starts on a fresh data directory, so this is one sync less on the
        // way to its first byte.
        txn.set_durability(Durability::None)
            .map_err(|e| db_error("begin", e))?;
        txn.open_table(JOBS).map_err(|e| db_error("open jobs", e))?;
        txn.open_table(CHECKPOINTS)
            .map_err(|e| db_error("open checkpoints", e))?;
        txn.open_table(SCHEDULES)
            .map_err(|e| db_error("open schedules", e))?;
        txn.commit().map_err(|e| db_error("commit", e))?;
        let loaded = load(&db)?;
        let (tx, rx) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("ferry-store".into())
            .spawn(move || writer(db, rx))
            .map_err(|e| Error::io("cannot start the store writer thread", e))?;
        let writer = Arc::new(parking_lot::Mutex::new(Some(handle)));
        Ok((Self { tx, writer }, loaded))
    }

    /// Applies the operations atomically, durable when this returns.
    pub async fn commit(&self, ops: Vec<Op>) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let (reply, done) = oneshot::channel();
        self.tx
            .send(Msg::Commit(ops, reply))
            .map_err(|_| Error::internal("job store is closed"))?;
        done.await
            .map_err(|_| Error::internal("job store writer has stopped"))?
    }

    /// Queues the operations now (so they commit in call order) and returns a future for
    /// the outcome that the caller may drop when it does not need to wait.
    pub fn submit(&self, ops: Vec<Op>) -> impl std::future::Future<Output = Result<()>> {
        let (reply, done) = oneshot::channel();
        let sent = self.tx.send(Msg::Commit(ops, reply)).is_ok();
        async move {
            if !sent {
                return Err(Error::internal("job store is closed"));
            }
            done.await
                .map_err(|_| Error::internal("job store is closed"))?
        }
    }

    pub async fn put_job(&self, job: &JobRecord) -> Result<()> {
        self.commit(vec![Op::PutJob(Box::new(job.clone()))]).await
    }

    pub async fn put_schedule(&self, schedule: &ScheduleRecord) -> Result<()> {
        self.commit(vec![Op::PutSchedule(Box::new(schedule.clone()))])
            .await
    }

    /// Reads everything again (what a restart would see).
    pub async fn load(&self) -> Result<Loaded> {
        let (reply, done) = oneshot::channel();
        self.tx
            .send(Msg::Load(reply))
            .map_err(|_| Error::internal("job store is closed"))?;
        done.await
            .map_err(|_| Error::internal("job store is closed"))?
    }

    /// Finishes pending commits and closes the database. Later commits fail.
    pub fn close(&self) {
        let _ = self.tx.send(Msg::Close);
        let handle = self.writer.lock().take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

fn load(db: &Database) -> Result<Loaded> {
    let txn = db.begin_read().map_err(|e| db_error("begin read", e))?;
    let mut loaded = Loaded::default();
    let jobs = txn.open_table(JOBS).map_err(|e| db_error("open jobs", e))?;
    for row in jobs.iter().map_err(|e| db_error("read jobs", e))? {
        let (key, value) = row.map_err(|e| db_error("read job", e))?;
        match serde_json::from_slice::<JobRecord>(value.value()) {
            Ok(job) => loaded.jobs.push(job),
            Err(e) => {
                tracing::warn!(id = key.value(), error = %e, "skipping unreadable job record")
            }
        }
    }
    loaded.jobs.sort_by_key(|j| j.seq);
    let cps = txn
        .open_table(CHECKPOINTS)
        .map_err(|e| db_error("open checkpoints", e))?;
    for row in cps.iter().map_err(|e| db_error("read checkpoints", e))? {
        let (key, value) = row.map_err(|e| db_error("read checkpoint", e))?;
        match serde_json::from_slice::<Checkpoint>(value.value()) {
            Ok(cp) => {
                loaded.checkpoints.insert(key.value().to_string(), cp);
            }
            Err(e) => {
                tracing::warn!(id = key.value(), error = %e, "skipping unreadable checkpoint")
            }
        }
    }
    let schedules = txn
        .open_table(SCHEDULES)
        .map_err(|e| db_error("open schedules", e))?;
    for row in schedules
        .iter()
        .map_err(|e| db_error("read schedules", e))?
    {
        let (key, value) = row.map_err(|e| db_error("read schedule", e))?;
        match serde_json::from_slice::<ScheduleRecord>(value.value()) {
            Ok(s) => loaded.schedules.push(s),
            Err(e) => {
                tracing::warn!(id = key.value(), error = %e, "skipping unreadable schedule")
            }
        }
    }
    Ok(loaded)
}

fn writer(db: Database, rx: mpsc::Receiver<Msg>) {
    let mut pending: Option<Msg> = None;
    loop {
        let first = match pending.take() {
            Some(m) => m,
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        let (ops, reply) = match first {
            Msg::Commit(ops, reply) => (ops, reply),
            Msg::Load(reply) => {
                let _ = reply.send(load(&db));
                continue;
            }
            Msg::Close => return,
        };
        let mut count = ops.len();
        let mut batch = vec![(ops, reply)];
        while count < MAX_BATCH {
            match rx.try_recv() {
                Ok(Msg::Commit(ops, reply)) => {
                    count += ops.len();
                    batch.push((ops, reply));
                }
                Ok(other) => {
                    pending = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let result = apply(&db, batch.iter().flat_map(|(ops, _)| ops.iter()));
        for (_, reply) in batch {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(Error::new(e.kind(), e.message().to_string())),
            };
            let _ = reply.send(r);
        }
    }
}

fn apply<'a>(db: &Database, ops: impl Iterator<Item = &'a Op>) -> Result<()> {
    let txn = db.begin_write().map_err(|e| db_error("begin", e))?;
    {
        let mut jobs = txn.open_table(JOBS).map_err(|e| db_error("open jobs", e))?;
        let mut cps = txn
            .open_table(CHECKPOINTS)
            .map_err(|e| db_error("open checkpoints", e))?;
        let mut schedules = txn
            .open_table(SCHEDULES)
            .map_err(|e| db_error("open schedules", e))?;
        for op in ops {
            match op {
                Op::PutJob(job) => {
                    let bytes = serde_json::to_vec(job)
                        .map_err(|e| Error::internal(format!("encode job: {e}")))?;
                    jobs.insert(job.id.as_str(), bytes.as_slice())
                        .map_err(|e| db_error("write job", e))?;
                }
                Op::PutCheckpoint(id, cp) => {
                    let bytes = serde_json::to_vec(cp)
                        .map_err(|e| Error::internal(format!("encode checkpoint: {e}")))?;
                    cps.insert(id.as_str(), bytes.as_slice())
                        .map_err(|e| db_error("write checkpoint", e))?;
                }
                Op::DeleteCheckpoint(id) => {
                    cps.remove(id.as_str())
                        .map_err(|e| db_error("delete checkpoint", e))?;
                }
                Op::DeleteJob(id) => {
                    jobs.remove(id.as_str())
                        .map_err(|e| db_error("delete job", e))?;
                    cps.remove(id.as_str())
                        .map_err(|e| db_error("delete checkpoint", e))?;
                }
                Op::PutSchedule(s) => {
                    let bytes = serde_json::to_vec(s)
                        .map_err(|e| Error::internal(format!("encode schedule: {e}")))?;
                    schedules
                        .insert(s.id.as_str(), bytes.as_slice())
                        .map_err(|e| db_error("write schedule", e))?;
                }
                Op::DeleteSchedule(id) => {
                    schedules
                        .remove(id.as_str())
                        .map_err(|e| db_error("delete schedule", e))?;
                }
            }
        }
    }
    txn.commit().map_err(|e| db_error("commit", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::*;

    pub(crate) fn record(id: &str, seq: u64) -> JobRecord {
        JobRecord {
            id: id.to_string(),
            seq,
            kind: JobKind::Transfer,
            state: JobState::Queued,
            idempotency_key: String::new(),
            fingerprint: "f".into(),
            labels: Default::default(),
            priority: 0,
            created_ms: 1,
            started_ms: None,
            ended_ms: None,
            request: vec![1, 2, 3],
            plan: JobPlan {
                source: ResolvedEndpoint::File("/a".into()),
                target: Some(ResolvedEndpoint::Url("nbd://h/e".into())),
                target_key: Some("nbd://h/e".into()),
                hosts: vec!["h".into()],
                source_kind: "file".into(),
                target_kind: Some("nbd".into()),
                more_targets: Vec::new(),
                repository: None,
            },
            attempt: 0,
            progress: Default::default(),
            result: None,
            error: None,
            message: String::new(),
            checkpoint: None,
            targets: Vec::new(),
            source_version: None,
        }
    }

    #[tokio::test]
    async fn persists_across_reopen_in_order() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, loaded) = Store::open(dir.path()).unwrap();
            assert!(loaded.jobs.is_empty());
            let mut tasks = Vec::new();
            for i in 0..50u64 {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    store
                        .put_job(&record(&format!("job-{i:03}"), 100 - i))
                        .await
                }));
            }
            for t in tasks {
                t.await.unwrap().unwrap();
            }
            assert_eq!(store.load().await.unwrap().jobs.len(), 50);
            let cp = Checkpoint {
                size: 100,
                committed: vec![(0, 10), (20, 30)],
            };
            store
                .commit(vec![
                    Op::PutCheckpoint("job-001".into(), cp.clone()),
                    Op::PutCheckpoint("job-002".into(), cp),
                    Op::DeleteJob("job-002".into()),
                ])
                .await
                .unwrap();
            store.close();
            assert!(store.put_job(&record("late", 1)).await.is_err());
        }
        let (_store, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.jobs.len(), 49);
        assert!(loaded.jobs.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(loaded.jobs[0].id, "job-049");
        assert_eq!(loaded.checkpoints.len(), 1);
        assert_eq!(
            loaded.checkpoints["job-001"].committed,
            vec![(0, 10), (20, 30)]
        );
        assert_eq!(loaded.jobs.last().unwrap().request, vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn schedules_persist_across_reopen() {
        use crate::model::schedule::*;
        let dir = tempfile::tempdir().unwrap();
        let schedule = |id: &str| ScheduleRecord {
            id: id.into(),
            name: format!("name-{id}"),
            cron: "@daily".into(),
            time_zone: "Europe/Oslo".into(),
            paused: false,
            missed: MissedPolicy::Skip,
            template: TemplateRecord::Checksum {
                request: vec![7, 8],
            },
            labels: Default::default(),
            created_ms: 1,
            updated_ms: 2,
            next_run_ms: Some(3),
            pending: Some(PendingFire {
                fire_ms: 3,
                manual: false,
            }),
            last_run: None,
            last_success_ms: None,
            runs_started: 4,
            runs_skipped: 5,
            runs_missed: 6,
            consecutive_failures: 7,
        };
        {
            let (store, _) = Store::open(dir.path()).unwrap();
            store.put_schedule(&schedule("a")).await.unwrap();
            store.put_schedule(&schedule("b")).await.unwrap();
            store
                .commit(vec![Op::DeleteSchedule("a".into())])
                .await
                .unwrap();
            store.close();
        }
        let (_store, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.schedules, vec![schedule("b")]);
    }

    #[tokio::test]
    async fn second_open_of_a_data_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, _) = Store::open(dir.path()).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("another ferry serve"), "{err}");
    }
}
