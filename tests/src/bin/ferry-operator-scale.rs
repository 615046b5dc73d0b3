//! The operator at scale, for the benchmark harness (tests/bench/cases/operator.py): its
//! real controllers (`controller::run`, unchanged, as its ServiceAccount under
//! deploy/operator's RBAC) against the test kit's stateful API stand-in with simulated
//! binding, scheduling and kubelet, and a fake mover link. Prints one JSON line.
//!
//! Two processes, so that the operator's memory is measured apart from the stand-in's
//! (which keeps every object and 50,000 changes of history): this one runs the stand-in,
//! serves it over HTTP on loopback and measures; a second copy of this binary,
//! started with `--operator URL`, runs the controllers with a kube Client of that URL and
//! the fake movers. Its peak RSS (VmHWM) is read before it is stopped.
//!
//! Phase 1: `--transfers` Transfers applied at once with `--max-movers`, each job done
//! after `--job-ms` with no progress in between: the most movers that existed at once,
//! how many Transfers Succeeded, API writes per Transfer lifecycle, the time from a mover's
//! deletion to the next mover's creation while Transfers are queued, the wall time.
//! Phase 2: `--max-movers` Transfers whose jobs report progress every 200 ms for
//! `--progress-seconds`: status writes per minute per running Transfer, and reads that
//! are not watches (polling) per minute per running Transfer.
//!
//! With `--rollout COUNT` instead: one Transfer generating COUNT claims over `--nodes`
//! nodes whose CSI driver attaches `--attach-limit` volumes each (a WaitForFirstConsumer
//! class), with `--max-movers`: how it fanned out (groups, nodes), whether every group and
//! the Transfer succeeded, whether any mover ever waited on the attach limit, the wall
//! time, the operator's API writes per target, peak RSS and CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_operator::controller::{self, mover_ca, mover_selector, OperatorSettings};
use ferry_operator::metrics::OperatorMetrics;
use ferry_testkit::kube::rbac::Rules;
use ferry_testkit::kube::{ChangeType, Cluster, Identity, Sim};
use ferry_tests::fake_mover::FakeMover;
use serde_json::{json, Value};

const NS: &str = "vms";
const SERVICE_ACCOUNT: (&str, &str) = ("ferry-system", "ferry-operator");

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

fn cluster(nodes: u64) -> Cluster {
    let c = Cluster::new();
    c.simulate(&Sim::ALL);
    c.add_namespace("ferry-system", &[], &[]);
    c.add_namespace(NS, &[], &[]);
    for n in 0..nodes {
        c.add_node(&format!("node-{n:03}"), &[]);
    }
    c.add_storage_class("ceph-rbd", "rbd.csi.ceph.com", false, true);
    c
}

fn settings(max_movers: usize) -> OperatorSettings {
    let mut s = OperatorSettings::new(ferry_tests::mover_pods::defaults(
        "ghcr.io/ferry-project/ferry:0.1.0",
    ));
    s.max_movers = max_movers;
    s
}

/// The operator's process: the controllers against the stand-in at `url`.
async fn operator_process(url: &str) {
    let config = kube::Config::new(url.parse().expect("--operator takes a URL"));
    let client = kube::Client::try_from(config).expect("a client of the stand-in");
    let every = arg("--every-ms", 0);
    let link = FakeMover {
        run: Duration::from_millis(arg("--job-ms", 1000)),
        every: (every > 0).then(|| Duration::from_millis(every)),
    };
    let ca = mover_ca::load_or_create(&client, "ferry-system")
        .await
        .expect("the movers' CA");
    let metrics = Arc::new(OperatorMetrics::new());
    controller::run(
        client,
        settings(arg("--max-movers", 50) as usize),
        Arc::new(link),
        Some(Arc::new(ca)),
        metrics,
    )
    .await
    .expect("the controllers run");
}

/// The operator in its own process, talking to `cluster` over loopback HTTP as its
/// ServiceAccount.
struct Operator {
    child: std::process::Child,
    server: tokio::task::JoinHandle<()>,
}

impl Operator {
    async fn start(
        cluster: &Cluster,
        max_movers: usize,
        job: Duration,
        every: Option<Duration>,
    ) -> Self {
        let rbac = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/operator/10-rbac.yaml");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("its address");
        let server = cluster.serve(
            listener,
            Identity::Account(Rules::load(&rbac, SERVICE_ACCOUNT)),
        );
        let every_ms = every.map_or(0, |e| e.as_millis());
        let child = std::process::Command::new(std::env::current_exe().expect("this binary"))
            .args(["--operator", &format!("http://{address}")])
            .args(["--max-movers", &max_movers.to_string()])
            .args(["--job-ms", &job.as_millis().to_string()])
            .args(["--every-ms", &every_ms.to_string()])
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("the operator's process starts");
        Self { child, server }
    }

    /// Stops the operator; returns its peak RSS in KiB and the CPU seconds it used.
    fn stop(mut self) -> (u64, f64) {
        let proc = format!("/proc/{}", self.child.id());
        let status = std::fs::read_to_string(format!("{proc}/status")).unwrap_or_default();
        // utime and stime, the 14th and 15th fields, after the command in parentheses.
        let stat = std::fs::read_to_string(format!("{proc}/stat")).unwrap_or_default();
        let ticks: Vec<f64> = stat
            .rsplit_once(") ")
            .map(|(_, rest)| {
                rest.split(' ')
                    .skip(11)
                    .take(2)
                    .filter_map(|t| t.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        // SAFETY: sysconf reads a constant of the system.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let cpu = ticks.iter().sum::<f64>() / per_second;
        let peak = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        if let Ok(Some(exit)) = self.child.try_wait() {
            panic!("the operator's process ended early: {exit}");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.server.abort();
        (peak, cpu)
    }
}

/// The rollout phase: one Transfer into `count` generated claims.
async fn rollout(count: u64) -> Value {
    let nodes = arg("--nodes", 500);
    let limit = arg("--attach-limit", 25);
    let max_movers = arg("--max-movers", 50) as usize;
    let job = Duration::from_millis(arg("--job-ms", 1000));
    let c = Cluster::new();
    c.simulate(&Sim::ALL);
    c.add_namespace("ferry-system", &[], &[]);
    c.add_namespace(NS, &[], &[]);
    for n in 0..nodes {
        let name = format!("node-{n:03}");
        c.add_node(&name, &[]);
        c.put(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name},
            "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": name,
                                  "allocatable": {"count": limit}}]}}));
    }
    c.add_storage_class("ebs", "ebs.csi.aws.com", true, true);
    let mut movers = c.changes("", "pods", &mover_selector());
    let operator = Operator::start(&c, max_movers, job, None).await;
    let began = Instant::now();
    c.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": "fleet", "namespace": NS},
        "spec": {"source": {"url": "https://images.example.com/golden.qcow2"},
                 "pvcTemplates": {"namePrefix": "vm-disk-", "count": count, "size": "20Gi",
                                  "volumeMode": "Block"}},
    }));
    let deadline = Instant::now() + Duration::from_secs(60 + count / 10);
    while phase(&c, "fleet").as_deref() != Some("Succeeded") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = began.elapsed().as_secs_f64();
    let (peak_rss_kib, cpu_seconds) = operator.stop();
    let operator_user = format!(
        "system:serviceaccount:{}:{}",
        SERVICE_ACCOUNT.0, SERVICE_ACCOUNT.1
    );
    let writes = c
        .requests()
        .iter()
        .filter(|r| r.user == operator_user && is_write(&r.method))
        .count();
    let fleet = c
        .get("ferry.dev", "transfers", NS, "fleet")
        .unwrap_or_default();
    let groups = fleet["status"]["fanOut"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let nodes_used: std::collections::BTreeSet<String> = groups
        .iter()
        .filter_map(|g| g["node"].as_str().map(String::from))
        .collect();
    let (mut live, mut most, mut waited) = (std::collections::BTreeSet::new(), 0, 0);
    while let Ok((kind, pod, _)) = movers.try_recv() {
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match kind {
            ChangeType::Added => {
                live.insert(name.clone());
            }
            ChangeType::Deleted => {
                live.remove(&name);
            }
            ChangeType::Modified => {}
        }
        most = most.max(live.len());
        let unschedulable = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["reason"] == "Unschedulable");
        waited += usize::from(unschedulable);
    }
    json!({
        "rollout_targets": count,
        "nodes": nodes,
        "attach_limit": limit,
        "max_movers": max_movers,
        "phase": fleet["status"]["phase"],
        "groups": groups.len(),
        "nodes_used": nodes_used.len(),
        "targets_succeeded": fleet["status"]["fanOut"]["targetsSucceeded"],
        "most_movers_at_once": most,
        "mover_updates_unschedulable": waited,
        "seconds": seconds,
        "writes_per_target": writes as f64 / count as f64,
        "operator_peak_rss_mib": peak_rss_kib as f64 / 1024.0,
        "operator_cpu_seconds": cpu_seconds,
    })
}

fn apply(cluster: &Cluster, name: &str) {
    cluster.create(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"source": {"url": "s3://images/fedora.raw"},
                 "targets": [{"pvcTemplate": {"name": format!("disk-{name}"), "size": "1Gi"}}]},
    }));
}

fn phase(cluster: &Cluster, name: &str) -> Option<String> {
    let t = cluster.get("ferry.dev", "transfers", NS, name)?;
    t["status"]["phase"].as_str().map(String::from)
}

/// Waits until every Transfer named is Succeeded or `limit` passed.
async fn settle(cluster: &Cluster, names: &[String], limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let done = names
            .iter()
            .filter(|n| phase(cluster, n).as_deref() == Some("Succeeded"))
            .count();
        if done == names.len() || Instant::now() > deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_write(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH" | "DELETE")
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--operator") {
        return operator_process(args.get(i + 1).expect("--operator takes a URL")).await;
    }
    let count = arg("--rollout", 0);
    if count > 0 {
        println!("{}", rollout(count).await);
        return;
    }
    let transfers = arg("--transfers", 1000);
    let max_movers = arg("--max-movers", 50) as usize;
    let job = Duration::from_millis(arg("--job-ms", 1000));
    let progress_for = Duration::from_secs(arg("--progress-seconds", 40));
    let operator_user = format!(
        "system:serviceaccount:{}:{}",
        SERVICE_ACCOUNT.0, SERVICE_ACCOUNT.1
    );

    // Phase 1: many Transfers through few movers.
    let c = cluster(25);
    let mut movers = c.changes("", "pods", &mover_selector());
    let operator = Operator::start(&c, max_movers, job, None).await;
    let names: Vec<String> = (0..transfers).map(|i| format!("t-{i:04}")).collect();
    let began = Instant::now();
    for name in &names {
        apply(&c, name);
    }
    let stamped = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let record = stamped.clone();
    let watcher = tokio::spawn(async move {
        while let Some((kind, pod, _)) = movers.recv().await {
            let name = pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            record.lock().push((kind, name, Instant::now()));
        }
    });
    let succeeded = settle(&c, &names, Duration::from_secs(30 + transfers / 2)).await;
    let seconds = began.elapsed().as_secs_f64();
    let (mut peak_rss_kib, cpu_seconds) = operator.stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let requests = c.requests();
    let writes = requests
        .iter()
        .filter(|r| r.user == operator_user && is_write(&r.method))
        .count();
    let events = requests
        .iter()
        .filter(|r| r.user == operator_user && is_write(&r.method) && r.path.ends_with("/events"))
        .count();
    watcher.abort();
    drop(c);
    let stamped = std::mem::take(&mut *stamped.lock());
    let (mut live, mut most, mut created) = (std::collections::BTreeSet::new(), 0, 0);
    let mut last_gone: Option<Instant> = None;
    let mut slot_reuse_ms = Vec::new();
    for (kind, name, at) in &stamped {
        match kind {
            ChangeType::Added => {
                created += 1;
                live.insert(name.clone());
                if let Some(gone) = last_gone.take() {
                    slot_reuse_ms.push(at.duration_since(gone).as_secs_f64() * 1000.0);
                }
            }
            ChangeType::Deleted => {
                live.remove(name);
                if live.len() < max_movers && created < transfers as usize {
                    last_gone.get_or_insert(*at);
                }
            }
            ChangeType::Modified => {}
        }
        most = most.max(live.len());
    }

    // Phase 2: progress writes of running Transfers.
    let c = cluster(25);
    let operator = Operator::start(
        &c,
        max_movers,
        progress_for + Duration::from_secs(5),
        Some(Duration::from_millis(200)),
    )
    .await;
    let running: Vec<String> = (0..max_movers).map(|i| format!("p-{i:03}")).collect();
    for name in &running {
        apply(&c, name);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while running
        .iter()
        .any(|n| phase(&c, n).as_deref() != Some("Running"))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let from = c.requests().len();
    tokio::time::sleep(progress_for).await;
    let window = c.requests();
    let status_writes = window[from..]
        .iter()
        .filter(|r| r.user == operator_user && r.method == "PATCH" && r.path.ends_with("/status"))
        .count();
    // Polling: reads that are not watches, while every mover runs.
    let reads = window[from..]
        .iter()
        .filter(|r| r.user == operator_user && r.method == "GET" && !r.query.contains("watch=true"))
        .count();
    peak_rss_kib = peak_rss_kib.max(operator.stop().0);
    let per_minute =
        status_writes as f64 / running.len() as f64 / progress_for.as_secs_f64() * 60.0;

    let out: Value = json!({
        "transfers": transfers,
        "max_movers": max_movers,
        "succeeded": succeeded,
        "most_movers_at_once": most,
        "movers_created": created,
        "seconds": seconds,
        "writes_per_transfer": writes as f64 / transfers as f64,
        "events_per_transfer": events as f64 / transfers as f64,
        "slot_reuse_ms_median": median(slot_reuse_ms.clone()),
        "slot_reuse_ms_max": slot_reuse_ms.iter().cloned().fold(0.0, f64::max),
        "progress_writes_per_minute_per_transfer": per_minute,
        "reads_per_minute_per_running_transfer":
            reads as f64 / running.len() as f64 / progress_for.as_secs_f64() * 60.0,
        "operator_peak_rss_mib": peak_rss_kib as f64 / 1024.0,
        "operator_cpu_ms_per_transfer": cpu_seconds * 1000.0 / transfers as f64,
    });
    println!("{out}");
}
