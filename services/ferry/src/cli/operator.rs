//! `ferry operator`: the Kubernetes side of ferry. `ferry operator crds` prints the
//! CustomResourceDefinitions generated from ferry-operator's types (deploy/crds.yaml is
//! exactly this output); `ferry operator run` runs the operator: it waits to lead
//! through a Lease, then runs the controllers until a termination signal (releasing the
//! Lease) or until it loses the Lease (exiting non-zero, so the pod restarts as a
//! follower). Logs and traces are set up as for `ferry serve`; the operator's metrics
//! are served on their own port. `ferry operator render FILE` is its dry run: what the
//! operator would create for the resources in FILE ([`ferry_operator::render`]).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use ferry_operator::controller::{self, GrpcMoverLink, OperatorSettings};
use ferry_operator::leader::{self, Elector, LeaseConfig};
use ferry_operator::metrics::OperatorMetrics;
use ferry_operator::mover::{resources, MoverDefaults, MoverResources};
use ferry_operator::populator;
use tokio_util::sync::CancellationToken;

use ferry_server::config::parse_duration;
use ferry_server::metrics;
use ferry_server::telemetry::{self, LogFormat};

/// Where a pod finds its own namespace.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Arguments of `ferry operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    #[command(subcommand)]
    command: OperatorCommand,
}

#[derive(Debug, clap::Subcommand)]
enum OperatorCommand {
    /// Print the CustomResourceDefinitions as one multi-document YAML stream
    /// (kubectl apply -f - installs them).
    Crds,
    /// Run the operator (in a pod, or against the cluster of the kubeconfig).
    Run(Box<RunArgs>),
    /// Print, as multi-document YAML, every object the operator would create or patch
    /// for the ferry resources in FILE, given the cluster objects FILE also holds; each
    /// resource's outcome (and why one waits) goes to stderr. Talks to no cluster.
    Render(Box<RenderArgs>),
}

/// Flags of `ferry operator run`; each has an environment fallback.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Image of the mover pods (the ferry image).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_IMAGE")]
    pub mover_image: String,
    /// What mover pods get, and the mover limits.
    #[command(flatten)]
    pub movers: MoverFlags,
    /// A mover pod not ready this long after its creation fails its attempt, with the
    /// pod's last warning events (like 10m, 1h).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_START_TIMEOUT", default_value = "10m", value_parser = start_timeout)]
    pub mover_start_timeout: Duration,
    /// Mover pods one resource may start before it fails (at least 1).
    #[arg(long, env = "FERRY_OPERATOR_MAX_ATTEMPTS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// Address of the operator's metrics (/metrics), or "off".
    #[arg(
        long,
        env = "FERRY_OPERATOR_METRICS_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub metrics_listen: String,
    /// Address of the admission webhook that records who creates a Transfer from a claim
    /// in another namespace (HTTPS, certificate from the movers' CA), or "off".
    #[arg(long, env = "FERRY_OPERATOR_WEBHOOK_LISTEN", default_value = "off")]
    pub webhook_listen: String,
    /// The Service the API server reaches the webhook through (in the operator's
    /// namespace): the webhook's certificate names it.
    #[arg(
        long,
        env = "FERRY_OPERATOR_WEBHOOK_SERVICE",
        default_value = "ferry-operator-webhook"
    )]
    pub webhook_service: String,
    /// The MutatingWebhookConfiguration whose caBundle the operator sets at start.
    #[arg(
        long,
        env = "FERRY_OPERATOR_WEBHOOK_CONFIGURATION",
        default_value = ferry_operator::admission::install::WEBHOOK_CONFIGURATION
    )]
    pub webhook_configuration: String,
    /// Namespace of the leader Lease [default: the pod's namespace, else "default"].
    #[arg(long, env = "FERRY_OPERATOR_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "FERRY_OPERATOR_LEASE_NAME",
        default_value = "ferry-operator"
    )]
    pub lease_name: String,
    /// Watch only this namespace [default: all namespaces].
    #[arg(long, env = "FERRY_OPERATOR_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Log format.
    #[arg(long, env = "FERRY_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "FERRY_LOG", default_value = "info")]
    pub log_filter: String,
}

/// Flags of what mover pods get and how many run, shared by `run` and `render`; each has
/// an environment fallback.
#[derive(Debug, Clone, clap::Args)]
pub struct MoverFlags {
    /// Pull policy of the mover image [default: Kubernetes' own].
    #[arg(long, env = "FERRY_OPERATOR_MOVER_PULL_POLICY", value_parser = ["Always", "IfNotPresent", "Never"])]
    pub mover_pull_policy: Option<String>,
    /// A Secret to pull the mover image with (repeat for several; each must exist in
    /// every namespace movers run in).
    #[arg(long = "mover-image-pull-secret", value_name = "SECRET")]
    pub mover_image_pull_secret: Vec<String>,
    /// Service account of mover pods when a resource names none.
    #[arg(long, env = "FERRY_OPERATOR_MOVER_SERVICE_ACCOUNT")]
    pub mover_service_account: Option<String>,
    /// CPU request of a mover container whose resource gives no resources ("none": no request).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_CPU_REQUEST", default_value = resources::CPU_REQUEST, value_parser = quantity)]
    pub mover_cpu_request: String,
    /// Memory request of a mover container whose resource gives no resources ("none": no request).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_MEMORY_REQUEST", default_value = resources::MEMORY_REQUEST, value_parser = quantity)]
    pub mover_memory_request: String,
    /// CPU limit of a mover container whose resource gives no resources ("none": no limit).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_CPU_LIMIT", default_value = resources::CPU_LIMIT, value_parser = quantity)]
    pub mover_cpu_limit: String,
    /// Memory limit of a mover container whose resource gives no resources ("none": no limit).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_MEMORY_LIMIT", default_value = resources::MEMORY_LIMIT, value_parser = quantity)]
    pub mover_memory_limit: String,
    /// Most mover pods at once in the cluster (0: no limit).
    #[arg(long, env = "FERRY_OPERATOR_MAX_MOVERS", default_value_t = 0)]
    pub max_movers: usize,
    /// Most mover pods at once on one node (0: no limit).
    #[arg(long, env = "FERRY_OPERATOR_MAX_MOVERS_PER_NODE", default_value_t = 0)]
    pub max_movers_per_node: usize,
    /// The operator's own namespace, whose operator pods the movers' NetworkPolicies
    /// admit [default: the pod's namespace, else "ferry-system"].
    #[arg(long, env = "FERRY_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,
    /// Give each mover a NetworkPolicy admitting only the operator to its gRPC port
    /// (needed where a default-deny policy covers the movers' namespaces).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_NETWORK_POLICY", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub mover_network_policy: bool,
}

/// Arguments of `ferry operator render`.
#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    /// YAML files of ferry resources and the cluster objects they refer to, read as one
    /// ("-": stdin).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Image of the mover pods (the ferry image).
    #[arg(long, env = "FERRY_OPERATOR_MOVER_IMAGE", default_value = DEFAULT_MOVER_IMAGE)]
    pub mover_image: String,
    /// What mover pods get, and the mover limits (none unless given).
    #[command(flatten)]
    pub movers: MoverFlags,
}

/// The image deploy/ runs: render's mover image unless one is given.
const DEFAULT_MOVER_IMAGE: &str =
    concat!("ghcr.io/ferry-project/ferry:", env!("CARGO_PKG_VERSION"));

/// A `--mover-start-timeout` value: a duration of at least a second.
fn start_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text) {
        Ok(d) if d >= Duration::from_secs(1) => Ok(d),
        Ok(_) => Err(format!("'{text}' is too short: give at least 1s")),
        Err(e) => Err(e.to_string()),
    }
}

/// A `--mover-*-request`/`--mover-*-limit` value: a Kubernetes quantity, or "none".
fn quantity(text: &str) -> Result<String, String> {
    if text == "none" {
        return Ok(text.to_string());
    }
    resources::check_quantity(text)
        .map(str::to_string)
        .map_err(|e| e.to_string())
}

impl MoverFlags {
    /// The mover containers' default requests and limits.
    fn mover_resources(&self) -> MoverResources {
        let given = |v: &String| (v != "none").then(|| v.clone());
        MoverResources {
            cpu_request: given(&self.mover_cpu_request),
            memory_request: given(&self.mover_memory_request),
            cpu_limit: given(&self.mover_cpu_limit),
            memory_limit: given(&self.mover_memory_limit),
        }
    }

    /// The reconcilers' settings for movers of `image`.
    pub fn settings(&self, image: &str) -> OperatorSettings {
        let mut settings = OperatorSettings::new(MoverDefaults {
            image: image.to_string(),
            image_pull_policy: self.mover_pull_policy.clone(),
            resources: self.mover_resources().requirements(),
            node_selector: Default::default(),
            tolerations: vec![],
            priority_class_name: None,
            service_account_name: self.mover_service_account.clone(),
            image_pull_secrets: self.mover_image_pull_secret.clone(),
        });
        settings.max_movers = self.max_movers;
        settings.max_movers_per_node = self.max_movers_per_node;
        settings.operator_namespace = self
            .operator_namespace
            .clone()
            .or_else(pod_namespace)
            .unwrap_or_else(|| "ferry-system".to_string());
        settings.mover_network_policy = self.mover_network_policy;
        settings
    }
}

impl RunArgs {
    /// The reconcilers' settings.
    pub fn settings(&self) -> OperatorSettings {
        let mut settings = self.movers.settings(&self.mover_image);
        settings.max_attempts = self.max_attempts;
        settings.mover_start_timeout = self.mover_start_timeout;
        settings.watch_namespace = self.watch_namespace.clone();
        settings
    }

    /// The metrics address, None for "off".
    pub fn metrics_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        if self.metrics_listen == "off" {
            return Ok(None);
        }
        let addr = self.metrics_listen.parse().with_context(|| {
            format!(
                "--metrics-listen '{}' is neither an address (host:port) nor 'off'",
                self.metrics_listen
            )
        })?;
        Ok(Some(addr))
    }

    /// The webhook's address, None for "off".
    pub fn webhook_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        if self.webhook_listen == "off" {
            return Ok(None);
        }
        let addr = self.webhook_listen.parse().with_context(|| {
            format!(
                "--webhook-listen '{}' is neither an address (host:port) nor 'off'",
                self.webhook_listen
            )
        })?;
        Ok(Some(addr))
    }

    /// The Lease namespace: the flag, else the pod's namespace, else `default`.
    pub fn lease_namespace(&self) -> String {
        self.lease_namespace
            .clone()
            .or_else(pod_namespace)
            .unwrap_or_else(|| "default".to_string())
    }
}

/// The namespace of the pod this process runs in, from its service account.
fn pod_namespace() -> Option<String> {
    std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Runs `ferry operator ...`.
pub async fn run(args: OperatorArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        OperatorCommand::Crds => {
            let yaml = ferry_operator::crd::crds_yaml()?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("cannot write the CRDs to stdout")?;
            Ok(ExitCode::SUCCESS)
        }
        OperatorCommand::Run(args) => run_operator(*args).await,
        OperatorCommand::Render(args) => render(&args),
    }
}

/// `ferry operator render FILE...`.
fn render(args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let mut cluster = ferry_operator::render::Cluster::default();
    for file in &args.files {
        let (name, text) = if file.as_os_str() == "-" {
            let text = std::io::read_to_string(std::io::stdin()).context("cannot read stdin")?;
            ("stdin".to_string(), text)
        } else {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            (file.display().to_string(), text)
        };
        cluster.read(&text).with_context(|| name)?;
    }
    let options = ferry_operator::render::Options {
        settings: args.movers.settings(&args.mover_image),
        tls: true,
    };
    let rendered = ferry_operator::render::render(&cluster, &options)?;
    let yaml = rendered.yaml();
    std::io::stdout()
        .lock()
        .write_all(yaml.as_bytes())
        .context("cannot write the objects to stdout")?;
    let mut err = std::io::stderr().lock();
    for line in &rendered.summary {
        writeln!(err, "{line}").context("cannot write to stderr")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry operator run`: checks the flags, connects, serves metrics, then leads.
async fn run_operator(args: RunArgs) -> anyhow::Result<ExitCode> {
    let metrics_addr = args.metrics_addr()?;
    let webhook_addr = args.webhook_addr()?;
    let mut telemetry = telemetry::init(args.log_format, &args.log_filter)?;
    let client = kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!(
            "no Kubernetes cluster to talk to: {e} (run in a pod, or set KUBECONFIG to a valid kubeconfig)"
        )
    })?;
    let metrics = Arc::new(OperatorMetrics::new());
    let stop_metrics = CancellationToken::new();
    if let Some(addr) = metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
        tracing::info!(%addr, "serving operator metrics");
        tokio::spawn(serve_metrics(
            listener,
            metrics.clone(),
            stop_metrics.clone(),
        ));
    }
    let settings = args.settings();
    let webhook = match webhook_addr {
        Some(addr) => Some(
            start_webhook(
                &client,
                addr,
                &settings.operator_namespace,
                &args.webhook_service,
                &args.webhook_configuration,
            )
            .await?,
        ),
        None => None,
    };
    let config = LeaseConfig::new(
        &args.lease_namespace(),
        &args.lease_name,
        &leader::identity(),
    );
    let elector = Elector::new(client.clone(), config);
    let result = lead(client, settings, &elector, &metrics).await;
    if let Some(webhook) = webhook {
        webhook.abort();
    }
    stop_metrics.cancel();
    telemetry.shutdown();
    result
}

/// Serves the admission webhook on every replica (the API server calls whichever the
/// Service picks): the movers' CA (made if missing) issues its certificate for the
/// Service's names and is put into the MutatingWebhookConfiguration's caBundle.
async fn start_webhook(
    client: &kube::Client,
    addr: SocketAddr,
    namespace: &str,
    service: &str,
    configuration: &str,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use ferry_operator::admission::{install, server, stamp::StampKey};
    let ca = controller::mover_ca::load_or_create(client, namespace)
        .await
        .with_context(|| {
            format!(
                "the movers' CA (secret {} in namespace {namespace}), which the webhook's certificate comes from",
                controller::mover_ca::CA_SECRET
            )
        })?;
    let ca = Arc::new(ca);
    let tls = server::tls_config(ca.clone(), server::service_names(service, namespace))?;
    // A missing or unwritable configuration stops only cross-namespace clones (which the
    // API server then cannot stamp, so the operator refuses them): the operator runs on,
    // and `keep_ca_bundle` sets it once it can.
    if let Err(e) = install::set_ca_bundle(client, configuration, ca.cert_pem()).await {
        tracing::warn!(
            error = %e,
            configuration,
            "cannot set the admission webhook's caBundle: Transfers from another namespace are refused until it is set"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for the admission webhook on {addr}"))?;
    tracing::info!(%addr, service, "serving the admission webhook");
    let key = Arc::new(StampKey::from_ca_key(&ca.key_pem()));
    let keep = install::keep_ca_bundle(
        client.clone(),
        configuration.to_string(),
        ca.cert_pem().to_string(),
        std::time::Duration::from_secs(300),
    );
    Ok(tokio::spawn(async move {
        tokio::join!(server::serve(listener, tls, key), keep);
    }))
}

/// Waits to lead (or for a termination signal), runs the controllers while leading, and
/// hands the Lease over when they stop.
async fn lead(
    client: kube::Client,
    settings: OperatorSettings,
    elector: &Elector,
    metrics: &Arc<OperatorMetrics>,
) -> anyhow::Result<ExitCode> {
    tokio::select! {
        () = elector.acquire() => {}
        signal = termination() => {
            signal?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    metrics.leader.set(1);
    let ca = controller::mover_ca::load_or_create(&client, &settings.operator_namespace)
        .await
        .with_context(|| {
            format!(
                "the movers' CA (secret {} in namespace {})",
                controller::mover_ca::CA_SECRET,
                settings.operator_namespace
            )
        })?;
    let ca = Arc::new(ca);
    let link = Arc::new(GrpcMoverLink::default().with_ca(ca.clone()));
    let watch_namespace = settings.watch_namespace.clone();
    let controllers = async {
        let (ran, populated) = tokio::join!(
            controller::run(client.clone(), settings, link, Some(ca), metrics.clone()),
            populator::run(client, watch_namespace),
        );
        ran.context("the controllers stopped")?;
        populated.context("the volume populator stopped")
    };
    let outcome = tokio::select! {
        ran = controllers => Ok(ran),
        lost = elector.hold() => Err(lost),
    };
    metrics.leader.set(0);
    match outcome {
        Ok(ran) => {
            release(elector).await;
            ran?;
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(lost) => bail!("{lost}: stopping so that this pod restarts as a follower"),
    }
}

async fn release(elector: &Elector) {
    match elector.release().await {
        Ok(true) => tracing::info!("released the leader lease"),
        Ok(false) => tracing::info!("the leader lease was no longer ours"),
        Err(e) => tracing::warn!(error = %e, "cannot release the leader lease"),
    }
}

/// SIGTERM or Ctrl-C.
async fn termination() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot install a SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r.context("cannot wait for Ctrl-C")?,
    }
    tracing::info!("termination signal while following");
    Ok(())
}

/// Serves the operator's metrics on `listener` (`GET /metrics`) until `stop` fires.
async fn serve_metrics(
    listener: tokio::net::TcpListener,
    operator: Arc<OperatorMetrics>,
    stop: CancellationToken,
) {
    metrics::serve(
        listener,
        metrics::EncodedBy(move || operator.encode()),
        stop,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn flags_become_settings() {
        let cli = Cli::try_parse_from([
            "x",
            "--mover-image",
            "ferry:1",
            "--max-movers",
            "8",
            "--max-movers-per-node",
            "2",
            "--max-attempts",
            "3",
            "--watch-namespace",
            "imports",
            "--lease-namespace",
            "ops",
            "--metrics-listen",
            "off",
            "--mover-image-pull-secret",
            "registry-a",
            "--mover-image-pull-secret",
            "registry-b",
            "--operator-namespace",
            "ferry-ops",
            "--mover-network-policy",
            "false",
        ])
        .unwrap();
        let s = cli.run.settings();
        assert_eq!(s.mover.image, "ferry:1");
        assert_eq!(s.mover.image_pull_secrets, ["registry-a", "registry-b"]);
        assert_eq!(s.operator_namespace, "ferry-ops");
        assert!(!s.mover_network_policy);
        assert_eq!((s.max_movers, s.max_movers_per_node), (8, 2));
        assert_eq!(s.max_attempts, 3);
        assert_eq!(s.mover_start_timeout, Duration::from_secs(600));
        assert_eq!(s.watch_namespace.as_deref(), Some("imports"));
        assert_eq!(cli.run.lease_namespace(), "ops");
        assert_eq!(cli.run.lease_name, "ferry-operator");
        assert_eq!(cli.run.metrics_addr().unwrap(), None);
        let resources = serde_json::to_value(s.mover.resources).unwrap();
        assert_eq!(
            resources,
            serde_json::json!({
                "requests": {"cpu": "250m", "memory": "256Mi"},
                "limits": {"cpu": "2", "memory": "1Gi"}
            })
        );
    }

    #[test]
    fn mover_resources_can_be_changed_or_left_out() {
        let cli = Cli::try_parse_from([
            "x",
            "--mover-image",
            "i",
            "--mover-cpu-limit",
            "none",
            "--mover-memory-limit",
            "4Gi",
        ])
        .unwrap();
        let resources = serde_json::to_value(cli.run.settings().mover.resources).unwrap();
        assert_eq!(
            resources,
            serde_json::json!({
                "requests": {"cpu": "250m", "memory": "256Mi"},
                "limits": {"memory": "4Gi"}
            })
        );
        let e = Cli::try_parse_from(["x", "--mover-image", "i", "--mover-memory-limit", "4GB"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'4GB' is not a Kubernetes quantity"), "{e}");
    }

    #[test]
    fn a_bad_metrics_address_is_refused() {
        let cli =
            Cli::try_parse_from(["x", "--mover-image", "i", "--metrics-listen", "nope"]).unwrap();
        let e = cli.run.metrics_addr().unwrap_err().to_string();
        assert!(e.contains("--metrics-listen 'nope'"), "{e}");
        assert!(Cli::try_parse_from(["x", "--mover-image", "i", "--max-attempts", "0"]).is_err());
        let cli = Cli::try_parse_from(["x", "--mover-image", "i", "--mover-start-timeout", "90s"])
            .unwrap();
        assert_eq!(
            cli.run.settings().mover_start_timeout,
            Duration::from_secs(90)
        );
        for bad in ["0s", "soon"] {
            assert!(
                Cli::try_parse_from(["x", "--mover-image", "i", "--mover-start-timeout", bad])
                    .is_err(),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn the_operator_metrics_are_served_on_their_port() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let operator = Arc::new(OperatorMetrics::new());
        operator.leader.set(1);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_metrics(listener, operator, stop.clone()));
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        stop.cancel();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            response.contains("\nferry_operator_leader 1\n"),
            "{response}"
        );
        assert!(response.contains("ferry_operator_reconciles_total{kind=\"Transfer\"} 0"));
    }
}
