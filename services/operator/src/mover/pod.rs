//! The mover pod of a Transfer, a Checksum, a Backup or a restore, built as a pure function of the resource,
//! the resolved claims and the operator's defaults.
//!
//! The pod runs `/ferry serve` (gRPC on port 50051, no metrics port, the job store on an
//! emptyDir) with: Filesystem claims mounted at `/var/run/ferry/volumes/<claim>` and
//! allowed as file roots; Block claims as devices at `/dev/ferry/<claim>`; every
//! referenced Secret key projected read-only at `/var/run/ferry/secrets/<secret>/<key>`
//! (the job request names that file, never the value); the per-mover token Secret mounted
//! for `--auth-token-file`. It never restarts in place (`restartPolicy: Never`): a lost
//! mover is replaced by the operator, which resumes from the checkpoint in the status. Its
//! termination message falls back to the end of its log, so the status of a mover that
//! crashed says why.
//!
//! Security: every pod passes the Pod Security Standard `restricted`: no service account
//! token, no privilege escalation, every capability dropped, a read-only root filesystem,
//! seccomp `RuntimeDefault`, and a non-root user (65532, the distroless "nonroot") with
//! that user's group as `fsGroup`, so Filesystem volumes are writable, and the disk
//! images' group 107 as a supplemental group, so a KubeVirt or CDI `disk.img` (0660,
//! 107:107) on a read-only mount, which kubelet leaves out of `fsGroup`, is readable.
//! Kubernetes does not
//! apply `fsGroup` to raw block devices; as CDI's importers do, a pod with a Block claim
//! relies on the container runtime giving the device to the pod's `runAsUser` and
//! `runAsGroup` (containerd's and CRI-O's `device_ownership_from_security_context = true`,
//! k3s's `--nonroot-devices`). Without that node setting the device keeps its node owner
//! (root, mode 0660) and the mover fails to open it with a permission error; a resource
//! may then give its own pod security context (running as root needs a namespace that
//! allows it). In a namespace that assigns IDs itself (OpenShift: the
//! `openshift.io/sa.scc.uid-range` annotation), the pod names no user, group or `fsGroup`:
//! `restricted-v2` refuses any outside the namespace's range and assigns them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, Container, ContainerPort, EmptyDirVolumeSource, GRPCAction,
    KeyToPath, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretProjection,
    SecretVolumeSource, SecurityContext, ServiceAccountTokenProjection, Toleration, Volume,
    VolumeDevice, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::layout::{self, GRPC_PORT};
use super::placement;
use super::{find_pvc, MoverError, ResolvedPvc};
use crate::crd::endpoint::{DOCKER_CONFIG_KEY, REGISTRY_CA_KEY};
use crate::crd::{
    Backup, BackupRepositorySpec, Checksum, Endpoint, MetadataLookup, MoverSettings, SecretKeyRef,
    Transfer, VolumeMode,
};
use crate::fanout::children::PARENT_UID;

/// The non-root user (and group) movers run as: the conventional "nonroot" of distroless
/// images.
pub const MOVER_UID: i64 = 65532;
/// The group of KubeVirt's and CDI's disk images (`qemu`, 107): CDI writes `disk.img`
/// as 0660 owned by 107:107, and kubelet does not apply `fsGroup` to a read-only mount,
/// so a mover reading such a claim needs the group to open the file.
pub const DISK_IMAGE_GID: i64 = 107;
/// Read-only for the owner and the group (the `fsGroup`).
const SECRET_MODE: i32 = 0o440;

/// Label keys of mover pods.
pub mod labels {
    /// `ferry`.
    pub const NAME: &str = "app.kubernetes.io/name";
    /// `mover`.
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    /// `ferry-operator`.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// The owner's kind (`Transfer`, `Checksum`).
    pub const OWNER_KIND: &str = "ferry.dev/owner-kind";
    /// The owner's uid (names may be longer than a label value allows; uids fit).
    pub const OWNER_UID: &str = "ferry.dev/owner-uid";
    /// `true`: Velero leaves the object out of its backups (a mover or a prime claim is
    /// ferry's working state, restored by nothing), as CDI marks its importers.
    pub const VELERO_EXCLUDE: &str = "velero.io/exclude-from-backup";
}

/// What the operator applies when a resource does not say.
#[derive(Debug, Clone, PartialEq)]
pub struct MoverDefaults {
    /// The mover image (the ferry image: the binary at `/ferry`).
    pub image: String,
    /// Pull policy of the image (default: Kubernetes' own).
    pub image_pull_policy: Option<String>,
    /// Container resources when the resource gives none.
    pub resources: Option<ResourceRequirements>,
    /// Node selector; the resource's entries win on the same key.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations; the resource's are added.
    pub tolerations: Vec<Toleration>,
    /// Priority class when the resource gives none.
    pub priority_class_name: Option<String>,
    /// Service account when the resource gives none.
    pub service_account_name: Option<String>,
    /// Secrets to pull the mover image with (each must exist in the mover's namespace).
    pub image_pull_secrets: Vec<String>,
}

/// What the reconciler decided for this mover.
#[derive(Debug, Clone, Copy)]
pub struct MoverPodInput<'a> {
    /// The pod's name.
    pub pod_name: &'a str,
    /// The per-mover Secret holding the bearer token under `token`.
    pub token_secret: &'a str,
    /// Every claim the resource names (source, targets, templates), resolved.
    pub pvcs: &'a [ResolvedPvc],
    /// The operator's defaults.
    pub defaults: &'a MoverDefaults,
    /// The namespace assigns user and group IDs itself (OpenShift's restricted SCCs): the
    /// pod names none.
    pub assigned_ids: bool,
    /// The token Secret also holds the mover's certificate, its key and the client CA
    /// ([`super::tls`]): the mover serves mutual TLS.
    pub tls: bool,
}

/// The mover pod of a Transfer.
pub fn transfer_pod(transfer: &Transfer, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
    transfer.spec.validate()?;
    let mut endpoints = vec![Attach::Source(&transfer.spec.source)];
    for target in &transfer.spec.targets {
        match &target.pvc_template {
            Some(template) => endpoints.push(Attach::Created(&template.name)),
            None => endpoints.push(Attach::Target(&target.endpoint)),
        }
    }
    let serves_relay = transfer.spec.relay.as_ref().is_some_and(|r| r.serve);
    let mut pod = build(
        Owner::of(transfer, "Transfer")?,
        &endpoints,
        transfer.spec.mover.as_ref(),
        input,
        serves_relay,
    )?;
    if let Some(uid) = transfer
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(PARENT_UID))
    {
        pod.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(PARENT_UID.to_string(), uid.clone());
    }
    Ok(pod)
}

/// The mover pod of a Checksum.
pub fn checksum_pod(checksum: &Checksum, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
    checksum.spec.validate()?;
    build(
        Owner::of(checksum, "Checksum")?,
        &[Attach::Source(&checksum.spec.source)],
        checksum.spec.mover.as_ref(),
        input,
        false,
    )
}

/// The mover pod of a Backup: the source claim read-only, the repository's claim (when
/// it is kept in one) read-write, its S3 credentials and encryption key projected; the
/// same for the secondary repository, when the Backup names one.
pub fn backup_pod(backup: &Backup, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
    backup.spec.validate()?;
    let source = Endpoint {
        pvc: Some(crate::crd::PvcRef {
            name: backup.spec.source_pvc.clone(),
            path: backup.spec.path.clone(),
            namespace: None,
        }),
        ..Endpoint::default()
    };
    let repo = backup
        .spec
        .resolved_repository
        .as_ref()
        .map(BackupRepositorySpec::endpoint)
        .unwrap_or_default();
    let secondary = backup
        .spec
        .resolved_secondary
        .as_ref()
        .filter(|_| backup.spec.secondary.is_some());
    let secondary_endpoint = secondary.map(BackupRepositorySpec::endpoint);
    let mut endpoints = vec![Attach::Source(&source), Attach::Target(&repo)];
    endpoints.extend(secondary_endpoint.as_ref().map(Attach::Target));
    let keys = [backup.spec.resolved_repository.as_ref(), secondary];
    endpoints.extend(
        keys.into_iter()
            .flatten()
            .filter_map(|r| r.key())
            .map(Attach::Key),
    );
    if let Some(MetadataLookup::Service(service)) = &backup.spec.resolved_snapshot_metadata {
        endpoints.push(Attach::AudienceToken(&service.audience));
    }
    build(
        Owner::of(backup, "Backup")?,
        &endpoints,
        backup.spec.mover.as_ref(),
        input,
        false,
    )
}

/// The token a Backup's mover asks the CSI SnapshotMetadata service with: a file under
/// `--secrets-dir`, projected by the kubelet from the pod's own ServiceAccount for the
/// service's audience (bound to the pod, rotated, never in a Secret); none when the
/// Backup does not ask the service.
pub fn metadata_token(backup: &Backup) -> Option<String> {
    matches!(
        backup.spec.resolved_snapshot_metadata,
        Some(MetadataLookup::Service(_))
    )
    .then(|| layout::SNAPSHOT_METADATA_TOKEN_FILE.to_string())
}

/// The mover pod of a restore into the claim `target` (owned by `owner`, of kind `kind`):
/// the target read-write, the repository's claim read-only, its credentials and key.
pub fn restore_pod<K: Resource<DynamicType = ()>>(
    owner: &K,
    kind: &'static str,
    repo: &BackupRepositorySpec,
    target: &str,
    settings: Option<&MoverSettings>,
    input: &MoverPodInput<'_>,
) -> Result<Pod, MoverError> {
    repo.validate()?;
    let repo_endpoint = repo.endpoint();
    let mut endpoints = vec![Attach::Source(&repo_endpoint), Attach::Created(target)];
    endpoints.extend(repo.key().map(Attach::Key));
    build(Owner::of(owner, kind)?, &endpoints, settings, input, false)
}

/// The component label of a GoldenImage's version probe pod: not a mover (it takes no
/// mover slot and runs no job), so the movers' watch leaves it out.
pub const PROBE_COMPONENT: &str = "version-probe";
/// A version probe pod is stopped by the kubelet after this long (it asks one server).
pub const PROBE_DEADLINE_SECONDS: i64 = 300;

/// A pod that runs the ferry binary once with `args` (a GoldenImage's version probe,
/// `ferry source version`) and reports through its termination message: `source`'s
/// Secret keys and registry files projected exactly as for the mover that imports it, the
/// movers' image, security context and placement settings; no claim, no token, no port,
/// stopped after [`PROBE_DEADLINE_SECONDS`].
#[allow(clippy::too_many_arguments)]
pub fn probe_pod<K: Resource<DynamicType = ()>>(
    owner: &K,
    kind: &'static str,
    source: &Endpoint,
    settings: Option<&MoverSettings>,
    pod_name: &str,
    args: Vec<String>,
    defaults: &MoverDefaults,
    assigned_ids: bool,
) -> Result<Pod, MoverError> {
    let input = MoverPodInput {
        pod_name,
        token_secret: "",
        pvcs: &[],
        defaults,
        assigned_ids,
        tls: false,
    };
    let mut pod = build(
        Owner::of(owner, kind)?,
        &[Attach::Source(source)],
        settings,
        &input,
        false,
    )?;
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.insert(labels::COMPONENT.to_string(), PROBE_COMPONENT.to_string());
    }
    let unused = |name: &str| ["auth-token", "data"].contains(&name);
    if let Some(spec) = pod.spec.as_mut() {
        spec.active_deadline_seconds = Some(PROBE_DEADLINE_SECONDS);
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|v| !unused(&v.name));
        }
        for c in &mut spec.containers {
            c.name = "probe".into();
            c.args = Some(args.clone());
            c.ports = None;
            c.readiness_probe = None;
            if let Some(mounts) = c.volume_mounts.as_mut() {
                mounts.retain(|m| !unused(&m.name));
            }
        }
    }
    Ok(pod)
}

/// How an endpoint is attached: read-only for the source, read-write otherwise; a lone
/// Secret key is projected like an endpoint's.
enum Attach<'a> {
    Source(&'a Endpoint),
    Target(&'a Endpoint),
    Created(&'a str),
    Key(&'a SecretKeyRef),
    /// A token of the pod's ServiceAccount for this audience, projected by the kubelet.
    AudienceToken(&'a str),
}

struct Owner {
    kind: &'static str,
    namespace: String,
    name: String,
    uid: String,
    reference: OwnerReference,
}

impl Owner {
    fn of<K: Resource<DynamicType = ()>>(r: &K, kind: &'static str) -> Result<Self, MoverError> {
        let meta = r.meta();
        let (Some(namespace), Some(name), Some(uid), Some(reference)) = (
            meta.namespace.clone(),
            meta.name.clone(),
            meta.uid.clone(),
            r.controller_owner_ref(&()),
        ) else {
            return Err(MoverError::NotStored(kind));
        };
        Ok(Self {
            kind,
            namespace,
            name,
            uid,
            reference,
        })
    }
}

/// What the pod attaches, gathered from the endpoints.
#[derive(Default)]
struct Attachments {
    /// (claim, mode, read-only) in the endpoints' order.
    pvcs: Vec<(String, VolumeMode, bool)>,
    /// Secret name -> keys.
    secrets: BTreeMap<String, BTreeSet<String>>,
    /// NBD TLS Secrets.
    nbd_tls: BTreeSet<String>,
    /// The mover's own certificate is used for NBD: a relay it serves or reads.
    relay_tls: bool,
    /// It serves a relay.
    relay_port: bool,
    /// A registry source's Secret (credentials) and ConfigMap (CA certificates).
    registry: Option<(Option<String>, Option<String>)>,
    /// The audience of a projected ServiceAccount token (a CSI SnapshotMetadata service's).
    audience_token: Option<String>,
}

impl Attachments {
    fn gather(endpoints: &[Attach<'_>], pvcs: &[ResolvedPvc]) -> Result<Self, MoverError> {
        let mut a = Self::default();
        for attach in endpoints {
            let (endpoint, read_only) = match attach {
                Attach::Created(name) => {
                    let pvc = find_pvc(pvcs, name)?;
                    a.pvcs.push((pvc.name.clone(), pvc.mode, false));
                    continue;
                }
                Attach::AudienceToken(audience) => {
                    a.audience_token = Some(audience.to_string());
                    continue;
                }
                Attach::Key(r) => {
                    a.secrets
                        .entry(r.name.clone())
                        .or_default()
                        .insert(r.key.clone());
                    continue;
                }
                Attach::Source(e) => (*e, true),
                Attach::Target(e) => (*e, false),
            };
            if let Some(r) = &endpoint.pvc {
                let pvc = find_pvc(pvcs, &r.name)?;
                a.pvcs.push((pvc.name.clone(), pvc.mode, read_only));
            }
            for r in endpoint.secret_refs() {
                a.secrets
                    .entry(r.name.clone())
                    .or_default()
                    .insert(r.key.clone());
            }
            if let Some(name) = endpoint
                .nbd
                .as_ref()
                .and_then(|n| n.tls_secret_name.clone())
            {
                a.nbd_tls.insert(name);
            }
            if endpoint.nbd.as_ref().and_then(|n| n.mover_certificate) == Some(true) {
                a.relay_tls = true;
            }
            if let Some(r) = &endpoint.registry {
                a.registry = Some((r.secret_ref.clone(), r.cert_config_map.clone()));
            }
        }
        Ok(a)
    }

    fn has_block(&self) -> bool {
        self.pvcs
            .iter()
            .any(|(_, mode, _)| *mode == VolumeMode::Block)
    }

    fn has_filesystem(&self) -> bool {
        self.pvcs
            .iter()
            .any(|(_, mode, _)| *mode == VolumeMode::Filesystem)
    }
}

/// The pod; `serves_relay`: its mover serves a fan-out's relay ([`layout::RELAY_PORT`],
/// with its own certificate).
fn build(
    owner: Owner,
    endpoints: &[Attach<'_>],
    settings: Option<&MoverSettings>,
    input: &MoverPodInput<'_>,
    serves_relay: bool,
) -> Result<Pod, MoverError> {
    let mut attached = Attachments::gather(endpoints, input.pvcs)?;
    attached.relay_port = serves_relay;
    attached.relay_tls = (attached.relay_tls || serves_relay) && input.tls;
    let defaults = input.defaults;
    let settings = settings.cloned().unwrap_or_default();
    let mut node_selector = defaults.node_selector.clone();
    node_selector.extend(settings.node_selector.clone().unwrap_or_default());
    let mut tolerations = defaults.tolerations.clone();
    tolerations.extend(settings.tolerations.clone().unwrap_or_default());
    let security_context = settings
        .security_context
        .clone()
        .unwrap_or_else(|| pod_security_context(&attached, input.assigned_ids));
    let pinned_by = placement::pinning_use(input.pvcs).map_err(MoverError::Apart)?;
    if let (Some(node), Some(used)) = (&settings.node_name, pinned_by) {
        if &used.node != node {
            return Err(MoverError::Apart(format!(
                "the mover is placed on node {node} but pod {} uses one of its claims on node {}: stop that pod",
                used.pod, used.node
            )));
        }
    }
    let mut spec = PodSpec {
        containers: vec![container(&attached, &settings, defaults, input.tls)],
        volumes: Some(volumes(&attached, input.token_secret, input.tls)),
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        service_account_name: settings
            .service_account_name
            .clone()
            .or_else(|| defaults.service_account_name.clone()),
        priority_class_name: settings
            .priority_class_name
            .clone()
            .or_else(|| defaults.priority_class_name.clone()),
        node_selector: (!node_selector.is_empty()).then_some(node_selector),
        tolerations: (!tolerations.is_empty()).then_some(tolerations),
        image_pull_secrets: (!defaults.image_pull_secrets.is_empty()).then(|| {
            defaults
                .image_pull_secrets
                .iter()
                .map(|name| k8s_openapi::api::core::v1::LocalObjectReference { name: name.clone() })
                .collect()
        }),
        security_context: Some(security_context),
        ..PodSpec::default()
    };
    if let Some(used) = pinned_by {
        placement::pin(&mut spec, used);
    } else if let Some(node) = &settings.node_name {
        placement::pin_to(&mut spec, node);
    }
    Ok(Pod {
        metadata: metadata(&owner, input.pod_name),
        spec: Some(spec),
        status: None,
    })
}

fn metadata(owner: &Owner, pod_name: &str) -> ObjectMeta {
    let labels = BTreeMap::from([
        (labels::NAME.to_string(), "ferry".to_string()),
        (labels::COMPONENT.to_string(), "mover".to_string()),
        (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
        (labels::OWNER_KIND.to_string(), owner.kind.to_string()),
        (labels::OWNER_UID.to_string(), owner.uid.clone()),
        (labels::VELERO_EXCLUDE.to_string(), "true".to_string()),
    ]);
    ObjectMeta {
        name: Some(pod_name.to_string()),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels),
        annotations: Some(BTreeMap::from([(
            "ferry.dev/owner-name".to_string(),
            owner.name.clone(),
        )])),
        owner_references: Some(vec![owner.reference.clone()]),
        ..ObjectMeta::default()
    }
}

/// `ferry serve`'s arguments: every Filesystem mount, the device directory (when a Block
/// claim is attached) and each NBD TLS directory are the allowed file roots.
fn args(attached: &Attachments, tls: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--grpc-listen",
        "0.0.0.0:50051",
        "--metrics-listen",
        "off",
    ]
    .map(String::from)
    .to_vec();
    for (name, mode, _) in &attached.pvcs {
        if *mode == VolumeMode::Filesystem {
            args.extend(["--allow-root".into(), layout::pvc_mount(name, *mode)]);
        }
    }
    if attached.has_block() {
        args.extend(["--allow-root".into(), layout::DEVICES_DIR.into()]);
    }
    for secret in &attached.nbd_tls {
        args.extend(["--allow-root".into(), layout::nbd_tls_dir(secret)]);
    }
    if attached.relay_tls {
        args.extend(["--allow-root".into(), layout::RELAY_TLS_DIR.into()]);
    }
    if attached.registry.is_some() {
        args.extend(["--allow-root".into(), layout::REGISTRY_DIR.into()]);
    }
    args.extend(
        [
            "--data-dir",
            layout::DATA_DIR,
            "--secrets-dir",
            layout::SECRETS_DIR,
            "--auth-token-file",
        ]
        .map(String::from),
    );
    args.push(layout::token_file());
    if tls {
        for (flag, key) in [
            ("--tls-cert", layout::TLS_CERT_KEY),
            ("--tls-key", layout::TLS_KEY_KEY),
            ("--tls-client-ca", layout::CLIENT_CA_KEY),
        ] {
            args.extend([flag.to_string(), layout::auth_file(key)]);
        }
    }
    args.extend(["--log-format".into(), "json".into()]);
    args
}

fn container(
    attached: &Attachments,
    settings: &MoverSettings,
    defaults: &MoverDefaults,
    tls: bool,
) -> Container {
    let mut mounts = vec![
        mount("data", layout::DATA_DIR, false),
        mount("tmp", layout::TMP_DIR, false),
        mount("secrets", layout::SECRETS_DIR, true),
        mount("auth-token", layout::TOKEN_DIR, true),
    ];
    let mut devices = Vec::new();
    for (i, (name, mode, read_only)) in attached.pvcs.iter().enumerate() {
        let path = layout::pvc_mount(name, *mode);
        match mode {
            VolumeMode::Filesystem => mounts.push(mount(&pvc_volume(i), &path, *read_only)),
            VolumeMode::Block => devices.push(VolumeDevice {
                name: pvc_volume(i),
                device_path: path,
            }),
        }
    }
    for (i, secret) in attached.nbd_tls.iter().enumerate() {
        mounts.push(mount(
            &nbd_tls_volume(i),
            &layout::nbd_tls_dir(secret),
            true,
        ));
    }
    if attached.relay_tls {
        mounts.push(mount(RELAY_TLS_VOLUME, layout::RELAY_TLS_DIR, true));
    }
    if attached.registry.is_some() {
        mounts.push(mount(REGISTRY_VOLUME, layout::REGISTRY_DIR, true));
    }
    let mut ports = vec![ContainerPort {
        name: Some("grpc".into()),
        container_port: GRPC_PORT,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }];
    if attached.relay_port {
        ports.push(ContainerPort {
            name: Some(RELAY_PORT_NAME.into()),
            container_port: layout::RELAY_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
    }
    Container {
        name: "mover".into(),
        image: Some(defaults.image.clone()),
        image_pull_policy: defaults.image_pull_policy.clone(),
        command: Some(vec![layout::COMMAND.into()]),
        args: Some(args(attached, tls)),
        ports: Some(ports),
        readiness_probe: Some(Probe {
            grpc: Some(GRPCAction {
                port: GRPC_PORT,
                service: None,
            }),
            period_seconds: Some(2),
            ..Probe::default()
        }),
        resources: settings
            .resources
            .clone()
            .or_else(|| defaults.resources.clone()),
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        volume_devices: (!devices.is_empty()).then_some(devices),
        ..Container::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn pvc_volume(i: usize) -> String {
    format!("pvc-{i}")
}

/// The volume of [`layout::REGISTRY_DIR`].
const REGISTRY_VOLUME: &str = "registry";
/// The volume of [`layout::RELAY_TLS_DIR`].
const RELAY_TLS_VOLUME: &str = "relay-tls";
/// The name of the relay's container port (the NetworkPolicy opens it to the fan-out).
pub const RELAY_PORT_NAME: &str = "nbd-relay";

fn nbd_tls_volume(i: usize) -> String {
    format!("nbd-tls-{i}")
}

fn volumes(attached: &Attachments, token_secret: &str, tls: bool) -> Vec<Volume> {
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    };
    let secret_volume = |name: String, secret: &str, items: Option<Vec<KeyToPath>>| Volume {
        name,
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items,
            default_mode: Some(SECRET_MODE),
            optional: Some(false),
        }),
        ..Volume::default()
    };
    let mut volumes = vec![empty("data"), empty("tmp"), secrets_volume(attached)];
    let mut keys = vec![layout::TOKEN_KEY];
    if tls {
        keys.extend([
            layout::TLS_CERT_KEY,
            layout::TLS_KEY_KEY,
            layout::CLIENT_CA_KEY,
        ]);
    }
    let items = keys
        .into_iter()
        .map(|key| KeyToPath {
            key: key.into(),
            path: key.into(),
            mode: None,
        })
        .collect();
    volumes.push(secret_volume(
        "auth-token".into(),
        token_secret,
        Some(items),
    ));
    for (i, (name, _, read_only)) in attached.pvcs.iter().enumerate() {
        volumes.push(Volume {
            name: pvc_volume(i),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: name.clone(),
                read_only: read_only.then_some(true),
            }),
            ..Volume::default()
        });
    }
    for (i, secret) in attached.nbd_tls.iter().enumerate() {
        volumes.push(secret_volume(nbd_tls_volume(i), secret, None));
    }
    if attached.relay_tls {
        let items = layout::RELAY_TLS_FILES
            .iter()
            .map(|(key, path)| KeyToPath {
                key: (*key).into(),
                path: (*path).into(),
                mode: None,
            })
            .collect();
        volumes.push(secret_volume(
            RELAY_TLS_VOLUME.into(),
            token_secret,
            Some(items),
        ));
    }
    if let Some((secret, config_map)) = &attached.registry {
        volumes.push(registry_volume(secret.as_deref(), config_map.as_deref()));
    }
    volumes
}

/// A registry source's credentials and CA certificates, projected at the names the
/// mover's request gives ([`layout::REGISTRY_DIR`]); a volume with nothing in it when the
/// source has neither (the registry is asked anonymously).
fn registry_volume(secret: Option<&str>, config_map: Option<&str>) -> Volume {
    let item = |key: &str, path: &str| {
        Some(vec![KeyToPath {
            key: key.into(),
            path: path.into(),
            mode: None,
        }])
    };
    let mut sources = Vec::new();
    if let Some(name) = secret {
        sources.push(VolumeProjection {
            secret: Some(SecretProjection {
                name: name.into(),
                items: item(DOCKER_CONFIG_KEY, layout::REGISTRY_AUTH_FILE),
                optional: Some(false),
            }),
            ..VolumeProjection::default()
        });
    }
    if let Some(name) = config_map {
        sources.push(VolumeProjection {
            config_map: Some(ConfigMapProjection {
                name: name.into(),
                items: item(REGISTRY_CA_KEY, layout::REGISTRY_CA_FILE),
                optional: Some(false),
            }),
            ..VolumeProjection::default()
        });
    }
    Volume {
        name: REGISTRY_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            default_mode: Some(SECRET_MODE),
        }),
        ..Volume::default()
    }
}

/// One projected volume with each referenced key at `<secret>/<key>`; always present
/// (empty when nothing is referenced) so `--secrets-dir` exists.
/// How long a projected audience token lives (the least the API allows; the kubelet
/// renews it before it ends).
const AUDIENCE_TOKEN_SECONDS: i64 = 600;

fn secrets_volume(attached: &Attachments) -> Volume {
    let mut sources: Vec<VolumeProjection> = attached
        .secrets
        .iter()
        .map(|(name, keys)| VolumeProjection {
            secret: Some(SecretProjection {
                name: name.clone(),
                items: Some(
                    keys.iter()
                        .map(|key| KeyToPath {
                            key: key.clone(),
                            path: format!("{name}/{key}"),
                            mode: None,
                        })
                        .collect(),
                ),
                optional: Some(false),
            }),
            ..VolumeProjection::default()
        })
        .collect();
    if let Some(audience) = &attached.audience_token {
        sources.push(VolumeProjection {
            service_account_token: Some(ServiceAccountTokenProjection {
                audience: Some(audience.clone()),
                expiration_seconds: Some(AUDIENCE_TOKEN_SECONDS),
                path: layout::SNAPSHOT_METADATA_TOKEN_FILE.into(),
            }),
            ..VolumeProjection::default()
        });
    }
    Volume {
        name: "secrets".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            default_mode: Some(SECRET_MODE),
        }),
        ..Volume::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

/// Non-root, with `fsGroup` (kubelet gives the projected token and keys, mode 0440, to
/// that group: without it they stay root's and the mover cannot read them, whatever
/// claims it has) and, when a Filesystem claim is attached, the disk images' group (see
/// [`DISK_IMAGE_GID`]) to read images `fsGroup` does not reach (see the module comment
/// for Block claims); no user, group or `fsGroup` where the namespace assigns them.
fn pod_security_context(attached: &Attachments, assigned_ids: bool) -> PodSecurityContext {
    let id = (!assigned_ids).then_some(MOVER_UID);
    PodSecurityContext {
        run_as_user: id,
        run_as_group: id,
        run_as_non_root: Some(true),
        fs_group: id,
        supplemental_groups: attached.has_filesystem().then(|| vec![DISK_IMAGE_GID]),
        fs_group_change_policy: attached
            .has_filesystem()
            .then(|| "OnRootMismatch".to_string()),
        seccomp_profile: Some(runtime_default()),
        ..PodSecurityContext::default()
    }
}

/// The same for every mover, whatever the pod's security context says.
fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        seccomp_profile: Some(runtime_default()),
        ..SecurityContext::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    use super::*;
    use crate::crd::{
        ChecksumSpec, PvcTemplate, S3Options, SecretKeyRef, TransferSpec, TransferTarget,
    };

    fn meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("import".into()),
            namespace: Some("vms".into()),
            uid: Some("0b0e5e1c-uid".into()),
            ..ObjectMeta::default()
        }
    }

    fn defaults() -> MoverDefaults {
        MoverDefaults {
            image: "ghcr.io/ferry-project/ferry:0.1.0".into(),
            image_pull_policy: Some("IfNotPresent".into()),
            resources: None,
            node_selector: BTreeMap::from([
                ("kubernetes.io/os".to_string(), "linux".to_string()),
                ("pool".to_string(), "default".to_string()),
            ]),
            tolerations: vec![],
            priority_class_name: None,
            service_account_name: Some("ferry-mover".into()),
            image_pull_secrets: vec![],
        }
    }

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    /// Source: a Block claim. Targets: a Filesystem claim, S3 with credentials, a created
    /// Filesystem claim. Mover settings: a node selector entry, a toleration, resources.
    fn transfer() -> Transfer {
        let mut s3 = Endpoint::url("s3://backups/golden.raw");
        s3.s3 = Some(S3Options {
            endpoint_url: Some("http://minio.storage:9000".into()),
            access_key_id: Some(secret("s3-creds", "id")),
            secret_access_key: Some(secret("s3-creds", "secret")),
            ..S3Options::default()
        });
        let spec = TransferSpec {
            source: Endpoint::pvc("golden"),
            targets: vec![
                TransferTarget {
                    endpoint: Endpoint::pvc("copy-a"),
                    pvc_template: None,
                },
                TransferTarget {
                    endpoint: s3,
                    pvc_template: None,
                },
                TransferTarget {
                    endpoint: Endpoint::default(),
                    pvc_template: Some(PvcTemplate {
                        name: "copy-b".into(),
                        storage_class_name: None,
                        size: Quantity("10Gi".into()),
                        volume_mode: None,
                        access_modes: None,
                    }),
                },
            ],
            options: None,
            expected_digest: None,
            mover: Some(MoverSettings {
                node_selector: Some(BTreeMap::from([(
                    "pool".to_string(),
                    "storage".to_string(),
                )])),
                tolerations: Some(vec![Toleration {
                    key: Some("dedicated".into()),
                    operator: Some("Equal".into()),
                    value: Some("storage".into()),
                    effect: Some("NoSchedule".into()),
                    toleration_seconds: None,
                }]),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        "memory".to_string(),
                        Quantity("1Gi".into()),
                    )])),
                    ..ResourceRequirements::default()
                }),
                priority_class_name: Some("bulk".into()),
                ..MoverSettings::default()
            }),
            claim_retention: None,
            clone_strategy: None,
            pvc_templates: None,
            fan_out: None,
            relay: None,
        };
        let mut t = Transfer::new("import", spec);
        t.metadata = meta();
        t
    }

    fn pvcs() -> Vec<ResolvedPvc> {
        vec![
            ResolvedPvc::new("golden", VolumeMode::Block),
            ResolvedPvc::new("copy-a", VolumeMode::Filesystem),
            ResolvedPvc::new("copy-b", VolumeMode::Filesystem),
        ]
    }

    fn input<'a>(pvcs: &'a [ResolvedPvc], defaults: &'a MoverDefaults) -> MoverPodInput<'a> {
        MoverPodInput {
            pod_name: "import-mover-1",
            token_secret: "import-mover-token",
            pvcs,
            defaults,
            assigned_ids: false,
            tls: true,
        }
    }

    /// The mover pod of a Checksum of the claim `golden` in `mode`, as JSON.
    fn checksum_of_golden(mode: VolumeMode) -> serde_json::Value {
        let pvcs = vec![ResolvedPvc::new("golden", mode)];
        let defaults = defaults();
        let mut checksum = Checksum::new(
            "sum",
            ChecksumSpec {
                source: Endpoint::pvc("golden"),
                options: None,
                mover: None,
            },
        );
        checksum.metadata = meta();
        let pod = checksum_pod(&checksum, &input(&pvcs, &defaults)).unwrap();
        serde_json::to_value(&pod).unwrap()
    }

    fn dropped_all() -> serde_json::Value {
        json!({
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "seccompProfile": {"type": "RuntimeDefault"}
        })
    }

    #[test]
    fn transfer_pod_is_exact() {
        let (pvcs, defaults) = (pvcs(), defaults());
        let pod = transfer_pod(&transfer(), &input(&pvcs, &defaults)).unwrap();
        let expected = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "import-mover-1",
                "namespace": "vms",
                "labels": {
                    "app.kubernetes.io/component": "mover",
                    "app.kubernetes.io/managed-by": "ferry-operator",
                    "app.kubernetes.io/name": "ferry",
                    "ferry.dev/owner-kind": "Transfer",
                    "ferry.dev/owner-uid": "0b0e5e1c-uid",
                    "velero.io/exclude-from-backup": "true"
                },
                "annotations": {"ferry.dev/owner-name": "import"},
                "ownerReferences": [{
                    "apiVersion": "ferry.dev/v1alpha1",
                    "kind": "Transfer",
                    "name": "import",
                    "uid": "0b0e5e1c-uid",
                    "controller": true
                }]
            },
            "spec": {
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "restartPolicy": "Never",
                "serviceAccountName": "ferry-mover",
                "priorityClassName": "bulk",
                "nodeSelector": {"kubernetes.io/os": "linux", "pool": "storage"},
                "tolerations": [{
                    "key": "dedicated", "operator": "Equal", "value": "storage",
                    "effect": "NoSchedule"
                }],
                "securityContext": {
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "runAsNonRoot": true,
                    "fsGroup": 65532,
                    "fsGroupChangePolicy": "OnRootMismatch",
                    "supplementalGroups": [107],
                    "seccompProfile": {"type": "RuntimeDefault"}
                },
                "containers": [{
                    "name": "mover",
                    "image": "ghcr.io/ferry-project/ferry:0.1.0",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/ferry"],
                    "args": [
                        "serve", "--grpc-listen", "0.0.0.0:50051", "--metrics-listen", "off",
                        "--allow-root", "/var/run/ferry/volumes/copy-a",
                        "--allow-root", "/var/run/ferry/volumes/copy-b",
                        "--allow-root", "/dev/ferry",
                        "--data-dir", "/var/lib/ferry",
                        "--secrets-dir", "/var/run/ferry/secrets",
                        "--auth-token-file", "/var/run/ferry/auth/token",
                        "--tls-cert", "/var/run/ferry/auth/tls.crt",
                        "--tls-key", "/var/run/ferry/auth/tls.key",
                        "--tls-client-ca", "/var/run/ferry/auth/ca.crt",
                        "--log-format", "json"
                    ],
                    "ports": [{"name": "grpc", "containerPort": 50051, "protocol": "TCP"}],
                    "readinessProbe": {"grpc": {"port": 50051}, "periodSeconds": 2},
                    "resources": {"limits": {"memory": "1Gi"}},
                    "securityContext": dropped_all(),
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/var/lib/ferry"},
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "secrets", "mountPath": "/var/run/ferry/secrets", "readOnly": true},
                        {"name": "auth-token", "mountPath": "/var/run/ferry/auth", "readOnly": true},
                        {"name": "pvc-1", "mountPath": "/var/run/ferry/volumes/copy-a"},
                        {"name": "pvc-2", "mountPath": "/var/run/ferry/volumes/copy-b"}
                    ],
                    "volumeDevices": [{"name": "pvc-0", "devicePath": "/dev/ferry/golden"}]
                }],
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "secrets", "projected": {
                        "defaultMode": 0o440,
                        "sources": [{"secret": {
                            "name": "s3-creds",
                            "items": [
                                {"key": "id", "path": "s3-creds/id"},
                                {"key": "secret", "path": "s3-creds/secret"}
                            ],
                            "optional": false
                        }}]
                    }},
                    {"name": "auth-token", "secret": {
                        "secretName": "import-mover-token",
                        "items": [
                            {"key": "token", "path": "token"},
                            {"key": "tls.crt", "path": "tls.crt"},
                            {"key": "tls.key", "path": "tls.key"},
                            {"key": "ca.crt", "path": "ca.crt"}
                        ],
                        "defaultMode": 0o440,
                        "optional": false
                    }},
                    {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "golden", "readOnly": true}},
                    {"name": "pvc-1", "persistentVolumeClaim": {"claimName": "copy-a"}},
                    {"name": "pvc-2", "persistentVolumeClaim": {"claimName": "copy-b"}}
                ]
            }
        });
        assert_eq!(serde_json::to_value(&pod).unwrap(), expected);
    }

    #[test]
    fn filesystem_only_runs_as_non_root() {
        let v = checksum_of_golden(VolumeMode::Filesystem);
        assert_eq!(
            v["spec"]["securityContext"],
            json!({
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "runAsNonRoot": true,
                "fsGroup": 65532,
                "fsGroupChangePolicy": "OnRootMismatch",
                "supplementalGroups": [107],
                "seccompProfile": {"type": "RuntimeDefault"}
            })
        );
        let c = &v["spec"]["containers"][0];
        assert_eq!(c["securityContext"], dropped_all());
        assert_eq!(
            c["volumeMounts"][4],
            json!({"name": "pvc-0", "mountPath": "/var/run/ferry/volumes/golden", "readOnly": true})
        );
        assert!(c.get("volumeDevices").is_none());
        assert_eq!(v["metadata"]["labels"]["ferry.dev/owner-kind"], "Checksum");
        assert_eq!(v["spec"]["nodeSelector"]["pool"], "default");
        assert!(v["spec"].get("tolerations").is_none());
        assert!(v["spec"].get("priorityClassName").is_none());
        // Nothing referenced: the secrets directory still exists, empty.
        assert_eq!(
            v["spec"]["volumes"][2],
            json!({"name": "secrets", "projected": {"defaultMode": 0o440, "sources": []}})
        );
        let args = c["args"].to_string();
        assert!(
            args.contains(r#""--allow-root","/var/run/ferry/volumes/golden""#),
            "{args}"
        );
        assert!(!args.contains("/dev/ferry"), "{args}");
    }

    #[test]
    fn block_claims_run_as_non_root_with_the_fs_group_of_their_keys() {
        let v = checksum_of_golden(VolumeMode::Block);
        // fsGroup reaches the projected token and keys (0440), not the block device.
        assert_eq!(
            v["spec"]["securityContext"],
            json!({
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "runAsNonRoot": true,
                "fsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}
            })
        );
        assert_eq!(
            v["spec"]["containers"][0]["volumeDevices"],
            json!([{"name": "pvc-0", "devicePath": "/dev/ferry/golden"}])
        );
    }

    #[test]
    fn a_namespace_that_assigns_ids_gets_a_pod_without_them() {
        let (pvcs, defaults) = (pvcs(), defaults());
        let input = MoverPodInput {
            assigned_ids: true,
            ..input(&pvcs, &defaults)
        };
        let v = serde_json::to_value(transfer_pod(&transfer(), &input).unwrap()).unwrap();
        assert_eq!(
            v["spec"]["securityContext"],
            json!({
                "runAsNonRoot": true,
                "fsGroupChangePolicy": "OnRootMismatch",
                "supplementalGroups": [107],
                "seccompProfile": {"type": "RuntimeDefault"}
            })
        );
        assert_eq!(
            ferry_testkit::pod_security::restricted_violations(&v),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_default_pod_passes_the_restricted_standard() {
        let defaults = defaults();
        let block = |name: &str| ResolvedPvc::new(name, VolumeMode::Block);
        let filesystem = |name: &str| ResolvedPvc::new(name, VolumeMode::Filesystem);
        for pvcs in [
            pvcs(),
            vec![block("golden"), block("copy-a"), block("copy-b")],
            vec![
                filesystem("golden"),
                filesystem("copy-a"),
                filesystem("copy-b"),
            ],
        ] {
            let pod = transfer_pod(&transfer(), &input(&pvcs, &defaults)).unwrap();
            let v = serde_json::to_value(&pod).unwrap();
            assert_eq!(
                ferry_testkit::pod_security::restricted_violations(&v),
                Vec::<String>::new(),
                "{v}"
            );
        }
    }

    #[test]
    fn nbd_tls_secrets_are_mounted_and_allowed() {
        let (pvcs, defaults) = (
            vec![ResolvedPvc::new("out", VolumeMode::Filesystem)],
            defaults(),
        );
        let mut source = Endpoint::url("nbds://nbd.storage/export");
        source.nbd = Some(crate::crd::NbdOptions {
            tls_secret_name: Some("nbd-certs".into()),
            ..Default::default()
        });
        let mut t = Transfer::new(
            "import",
            TransferSpec {
                source,
                targets: vec![TransferTarget {
                    endpoint: Endpoint::pvc("out"),
                    pvc_template: None,
                }],
                options: None,
                expected_digest: None,
                mover: None,
                claim_retention: None,
                clone_strategy: None,
                pvc_templates: None,
                fan_out: None,
                relay: None,
            },
        );
        t.metadata = meta();
        let v = serde_json::to_value(transfer_pod(&t, &input(&pvcs, &defaults)).unwrap()).unwrap();
        let c = &v["spec"]["containers"][0];
        assert!(c["args"]
            .to_string()
            .contains(r#""--allow-root","/var/run/ferry/nbd-tls/nbd-certs""#));
        assert_eq!(
            c["volumeMounts"][5],
            json!({"name": "nbd-tls-0", "mountPath": "/var/run/ferry/nbd-tls/nbd-certs", "readOnly": true})
        );
        assert_eq!(
            v["spec"]["volumes"][5],
            json!({"name": "nbd-tls-0", "secret": {"secretName": "nbd-certs", "defaultMode": 0o440, "optional": false}})
        );
    }

    #[test]
    fn a_pod_security_context_from_the_resource_replaces_the_default() {
        let (pvcs, defaults) = (pvcs(), defaults());
        let mut t = transfer();
        t.spec.mover.as_mut().unwrap().security_context = Some(PodSecurityContext {
            run_as_user: Some(107),
            fs_group: Some(107),
            ..PodSecurityContext::default()
        });
        let v = serde_json::to_value(transfer_pod(&t, &input(&pvcs, &defaults)).unwrap()).unwrap();
        assert_eq!(
            v["spec"]["securityContext"],
            json!({"runAsUser": 107, "fsGroup": 107})
        );
        // The container's restrictions stay.
        assert_eq!(v["spec"]["containers"][0]["securityContext"], dropped_all());
    }

    #[test]
    fn image_pull_secrets_of_the_defaults_are_the_pods() {
        let pvcs = pvcs();
        let mut defaults = defaults();
        assert!(
            serde_json::to_value(transfer_pod(&transfer(), &input(&pvcs, &defaults)).unwrap())
                .unwrap()["spec"]
                .get("imagePullSecrets")
                .is_none()
        );
        defaults.image_pull_secrets = vec!["registry".into()];
        let v = serde_json::to_value(transfer_pod(&transfer(), &input(&pvcs, &defaults)).unwrap())
            .unwrap();
        assert_eq!(v["spec"]["imagePullSecrets"], json!([{"name": "registry"}]));
    }

    #[test]
    fn missing_pieces_are_errors() {
        let defaults = defaults();
        let partial = vec![ResolvedPvc::new("golden", VolumeMode::Block)];
        assert_eq!(
            transfer_pod(&transfer(), &input(&partial, &defaults)).unwrap_err(),
            MoverError::UnresolvedPvc("copy-a".into())
        );
        let pvcs = pvcs();
        let mut t = transfer();
        t.metadata.uid = None;
        assert_eq!(
            transfer_pod(&t, &input(&pvcs, &defaults)).unwrap_err(),
            MoverError::NotStored("Transfer")
        );
        let mut t = transfer();
        t.spec.targets.clear();
        assert!(matches!(
            transfer_pod(&t, &input(&pvcs, &defaults)).unwrap_err(),
            MoverError::Invalid(_)
        ));
    }

    /// A fan-out group from an HTTP source into the created claim `copy-b`, labelled with
    /// its fan-out, with `relay` as its part.
    fn group(relay: crate::crd::GroupRelay, source: Endpoint) -> Transfer {
        let mut t: Transfer = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "fleet-g1", "namespace": "vms", "uid": "g-1",
                         "labels": {"ferry.dev/fan-out-of": "p-1"}},
            "spec": {
                "source": {"url": "https://images.example.com/golden.qcow2"},
                "targets": [{"pvcTemplate": {"name": "copy-b", "size": "10Gi"}}],
            },
        }))
        .unwrap();
        t.spec.source = source;
        t.spec.relay = Some(relay);
        t
    }

    #[test]
    fn a_relaying_group_serves_on_its_port_with_its_own_certificate() {
        let (pvcs, defaults) = (pvcs(), defaults());
        let seed = group(
            crate::crd::GroupRelay {
                serve: true,
                from: None,
            },
            Endpoint::url("https://images.example.com/golden.qcow2"),
        );
        let v =
            serde_json::to_value(transfer_pod(&seed, &input(&pvcs, &defaults)).unwrap()).unwrap();
        assert_eq!(v["metadata"]["labels"]["ferry.dev/fan-out-of"], "p-1");
        let container = &v["spec"]["containers"][0];
        assert_eq!(
            container["ports"],
            json!([
                {"name": "grpc", "containerPort": 50051, "protocol": "TCP"},
                {"name": "nbd-relay", "containerPort": 10810, "protocol": "TCP"},
            ])
        );
        let volumes = v["spec"]["volumes"].as_array().unwrap();
        let relay_tls = volumes.iter().find(|v| v["name"] == "relay-tls").unwrap();
        assert_eq!(
            relay_tls,
            &json!({"name": "relay-tls", "secret": {
                "secretName": "import-mover-token", "defaultMode": 0o440, "optional": false,
                "items": [
                    {"key": "ca.crt", "path": "ca-cert.pem"},
                    {"key": "tls.crt", "path": "client-cert.pem"},
                    {"key": "tls.key", "path": "client-key.pem"},
                ],
            }})
        );
        let mounts = container["volumeMounts"].as_array().unwrap();
        assert!(mounts.contains(&json!({
            "name": "relay-tls", "mountPath": "/var/run/ferry/relay-tls", "readOnly": true
        })));
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.windows(2)
                .any(|w| w == ["--allow-root", "/var/run/ferry/relay-tls"]),
            "{args:?}"
        );
        // A group that reads the relay mounts the same directory, and opens no port.
        let mut source = Endpoint::url("nbds://10.1.2.3:10810/");
        source.nbd = Some(crate::crd::NbdOptions {
            mover_certificate: Some(true),
            ..Default::default()
        });
        let reader = group(
            crate::crd::GroupRelay {
                serve: false,
                from: Some("fleet-g0".into()),
            },
            source,
        );
        let v =
            serde_json::to_value(transfer_pod(&reader, &input(&pvcs, &defaults)).unwrap()).unwrap();
        let container = &v["spec"]["containers"][0];
        assert_eq!(container["ports"].as_array().unwrap().len(), 1);
        assert!(container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/var/run/ferry/relay-tls"));
        // Without the movers' TLS there is no certificate to mount.
        let plain = MoverPodInput {
            tls: false,
            ..input(&pvcs, &defaults)
        };
        let v = serde_json::to_value(transfer_pod(&seed, &plain).unwrap()).unwrap();
        assert!(!v["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "relay-tls"));
    }

    #[test]
    fn a_registry_source_gets_its_credentials_and_ca_where_the_request_names_them() {
        let (pvcs, defaults) = (pvcs(), defaults());
        let mut source = Endpoint::url("docker://registry.example.com/vms/fedora:41");
        source.registry = Some(crate::crd::RegistryOptions {
            secret_ref: Some("pull-secret".into()),
            cert_config_map: Some("registry-ca".into()),
            ..Default::default()
        });
        let mut t = group(
            crate::crd::GroupRelay {
                serve: true,
                from: None,
            },
            source,
        );
        t.spec.relay = None;
        let v = serde_json::to_value(transfer_pod(&t, &input(&pvcs, &defaults)).unwrap()).unwrap();
        let volumes = v["spec"]["volumes"].as_array().unwrap();
        let registry = volumes.iter().find(|v| v["name"] == "registry").unwrap();
        assert_eq!(
            registry,
            &json!({"name": "registry", "projected": {"defaultMode": 0o440, "sources": [
                {"secret": {"name": "pull-secret", "optional": false,
                            "items": [{"key": ".dockerconfigjson", "path": "auth.json"}]}},
                {"configMap": {"name": "registry-ca", "optional": false,
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            ]}})
        );
        let container = &v["spec"]["containers"][0];
        assert!(container["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&json!({
                "name": "registry", "mountPath": "/var/run/ferry/registry", "readOnly": true
            })));
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.windows(2)
                .any(|w| w == ["--allow-root", "/var/run/ferry/registry"]),
            "{args:?}"
        );
        // The credentials are not also in the shared secrets volume.
        let secrets = volumes.iter().find(|v| v["name"] == "secrets").unwrap();
        assert!(!secrets.to_string().contains("pull-secret"), "{secrets}");
    }
}
