//! Where things are inside a mover pod: one place for the paths the pod builder mounts and
//! the job requests name, so the two always agree.

use crate::crd::{PvcRef, SecretKeyRef, VolumeMode};

/// The mover's command: the ferry binary where the image installs it. An absolute path:
/// the image is distroless, and `/` is on no PATH a container runtime uses.
pub const COMMAND: &str = "/ferry";
/// The port `ferry serve` listens on for gRPC.
pub const GRPC_PORT: i32 = 50051;
/// Filesystem claims are mounted at `<VOLUMES_DIR>/<claim>`.
pub const VOLUMES_DIR: &str = "/var/run/ferry/volumes";
/// Block claims appear as devices at `<DEVICES_DIR>/<claim>`.
pub const DEVICES_DIR: &str = "/dev/ferry";
/// Secret keys are projected at `<SECRETS_DIR>/<secret>/<key>` (`--secrets-dir`).
pub const SECRETS_DIR: &str = "/var/run/ferry/secrets";
/// The per-mover bearer token's Secret is mounted here.
pub const TOKEN_DIR: &str = "/var/run/ferry/auth";
/// The key of the token in the per-mover token Secret.
pub const TOKEN_KEY: &str = "token";
/// The key of the mover's serving certificate in its token Secret (mutual TLS).
pub const TLS_CERT_KEY: &str = "tls.crt";
/// The key of that certificate's private key.
pub const TLS_KEY_KEY: &str = "tls.key";
/// The key of the CA whose client certificates the mover accepts (the operator's).
pub const CLIENT_CA_KEY: &str = "ca.crt";
/// The file, under [`SECRETS_DIR`], of the token a Backup's mover asks the CSI
/// SnapshotMetadata service with: its ServiceAccount's, projected for the service's
/// audience (no Secret name can start with `_`, so no Secret key lands there).
pub const SNAPSHOT_METADATA_TOKEN_FILE: &str = "_snapshot-metadata/token";
/// NBD TLS Secrets are mounted at `<NBD_TLS_DIR>/<secret>`.
pub const NBD_TLS_DIR: &str = "/var/run/ferry/nbd-tls";
/// The port a fan-out group's relay serves NBD on (see `crate::fanout::relay`).
pub const RELAY_PORT: i32 = 10810;
/// The mover's own certificate, its key and the movers' CA, again, in the layout of an NBD
/// TLS directory (`ca-cert.pem`, `client-cert.pem`, `client-key.pem`): what a relay
/// serves with and what a group reading one authenticates with.
pub const RELAY_TLS_DIR: &str = "/var/run/ferry/relay-tls";
/// The files of [`RELAY_TLS_DIR`] and the token Secret's keys they are projected from.
pub const RELAY_TLS_FILES: [(&str, &str); 3] = [
    (CLIENT_CA_KEY, "ca-cert.pem"),
    (TLS_CERT_KEY, "client-cert.pem"),
    (TLS_KEY_KEY, "client-key.pem"),
];
/// A registry source's credentials (`auth.json`, from its Secret's `.dockerconfigjson`)
/// and CA certificates (`ca.crt`, from its ConfigMap).
pub const REGISTRY_DIR: &str = "/var/run/ferry/registry";
/// The registry's docker config.json in [`REGISTRY_DIR`].
pub const REGISTRY_AUTH_FILE: &str = "auth.json";
/// The registry's CA certificates in [`REGISTRY_DIR`].
pub const REGISTRY_CA_FILE: &str = "ca.crt";
/// The job store of the mover (an emptyDir: the checkpoint that must survive the pod is
/// in the resource's status, not here).
pub const DATA_DIR: &str = "/var/lib/ferry";
/// Scratch for the process (the root filesystem is read-only).
pub const TMP_DIR: &str = "/tmp";

/// Where a claim is attached in the mover.
pub fn pvc_mount(name: &str, mode: VolumeMode) -> String {
    match mode {
        VolumeMode::Filesystem => format!("{VOLUMES_DIR}/{name}"),
        VolumeMode::Block => format!("{DEVICES_DIR}/{name}"),
    }
}

/// The image inside a claim: a file in a Filesystem volume, the device of a Block one.
pub fn pvc_image(pvc: &PvcRef, mode: VolumeMode) -> String {
    match mode {
        VolumeMode::Filesystem => format!("{VOLUMES_DIR}/{}/{}", pvc.name, pvc.image_path()),
        VolumeMode::Block => format!("{DEVICES_DIR}/{}", pvc.name),
    }
}

/// A Secret key's file, relative to `--secrets-dir` (what a `SecretRef{file}` names).
pub fn secret_file(r: &SecretKeyRef) -> String {
    format!("{}/{}", r.name, r.key)
}

/// The directory of an NBD TLS Secret.
pub fn nbd_tls_dir(secret: &str) -> String {
    format!("{NBD_TLS_DIR}/{secret}")
}

/// The token file (`--auth-token-file`).
pub fn token_file() -> String {
    auth_file(TOKEN_KEY)
}

/// A key of the token Secret as a file in the mover.
pub fn auth_file(key: &str) -> String {
    format!("{TOKEN_DIR}/{key}")
}

/// A file of [`RELAY_TLS_DIR`].
pub fn relay_tls_file(name: &str) -> String {
    format!("{RELAY_TLS_DIR}/{name}")
}
