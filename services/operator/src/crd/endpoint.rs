//! Endpoints as a custom resource names them: a URL with typed options (as the gRPC API's
//! `Endpoint`), or a PersistentVolumeClaim in the resource's namespace. Secrets only ever
//! appear as references to a key of a Secret in the same namespace; the mover gets the key
//! mounted as a file and the job request names the file, never the value.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::options::ImageFormat;

use super::validate::{
    check_pvc_name, check_relative_path, check_secret_ref, check_url, invalid, UrlKind,
    ValidationError,
};

/// The image file inside a Filesystem volume when `pvc.path` is not given (as CDI does).
pub const DEFAULT_IMAGE_FILE: &str = "disk.img";

/// A key of a Secret in the resource's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// Options of `s3://bucket/key` endpoints; what is left out comes from the mover's standard
/// AWS configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Options {
    /// Endpoint URL of an S3-compatible service, `http://` or `https://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"))]
    pub endpoint_url: Option<String>,
    /// Region (default: us-east-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Access key id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<SecretKeyRef>,
    /// Secret access key; required with `accessKeyId`, and only with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<SecretKeyRef>,
    /// Session token of temporary credentials (needs the key pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<SecretKeyRef>,
    /// Path-style addressing (`http://host/bucket/key`), as most S3-compatible servers need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_path_style: Option<bool>,
}

/// A request header of an `http(s)://` source whose value comes from a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name, for example `X-Api-Key`.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
    )]
    pub name: String,
    /// The Secret key holding its value.
    pub value_from: SecretKeyRef,
}

/// Options of `http://` and `https://` sources (read-only). Credentials and headers are
/// sent only to the URL's own origin, never to another host a redirect points to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpOptions {
    /// Basic authentication user (with `password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub user: Option<String>,
    /// Basic authentication password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretKeyRef>,
    /// A bearer token (`Authorization: Bearer`), instead of user and password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<SecretKeyRef>,
    /// Extra request headers with values from Secrets (at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub headers: Vec<HttpHeader>,
    /// Extra trusted CA certificates (PEM), beside the mover's system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<SecretKeyRef>,
    /// A client certificate chain (PEM), with `clientKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<SecretKeyRef>,
    /// The client certificate's private key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<SecretKeyRef>,
}

/// Options of `nbds://` endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NbdOptions {
    /// A Secret holding `ca-cert.pem` (and `client-cert.pem`, `client-key.pem` for client
    /// authentication); the mover mounts it read-only and uses it as the TLS directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub tls_secret_name: Option<String>,
    /// Authenticate with the mover's own certificate and trust only the movers' CA: for
    /// reading another ferry mover's relay (the operator sets it on fan-out groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover_certificate: Option<bool>,
}

/// Options of a `docker://` (or `oci://`) source: a containerDisk image in a registry, whose
/// one layer holds the disk under `/disk/` (CDI's `registry` source).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryOptions {
    /// A Secret in this namespace whose `.dockerconfigjson` is a docker config.json with
    /// the registry's credentials (a `kubernetes.io/dockerconfigjson` Secret, as
    /// imagePullSecrets use). Without it the registry is asked anonymously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_ref: Option<String>,
    /// A ConfigMap in this namespace whose `ca.crt` holds extra CA certificates (PEM) to
    /// trust for the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub cert_config_map: Option<String>,
    /// `os/arch[/variant]` of a multi-platform image (default linux/amd64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub platform: Option<String>,
    /// Plain HTTP to the registry (never the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
}

/// The key of a registry's credentials in its `secretRef` Secret.
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";
/// The key of a registry's CA certificates in its `certConfigMap`.
pub const REGISTRY_CA_KEY: &str = "ca.crt";

/// Options of `iscsi://` endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IscsiOptions {
    /// CHAP user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// CHAP password (a password inside the URL is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretKeyRef>,
}

/// Options of `nfs://` endpoints (the URL's query options, typed; give them in one place).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NfsOptions {
    /// NFS version, 3 or 4 (default: 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 3, max = 4))]
    pub version: Option<u8>,
    /// User id sent in AUTH_SYS credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group id sent in AUTH_SYS credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// NFS port (default: from the portmapper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub nfs_port: Option<u16>,
    /// MOUNT port for NFSv3 (default: from the portmapper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub mount_port: Option<u16>,
}

/// A `GoldenImage` in the resource's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GoldenImageRef {
    /// Its name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// An existing PersistentVolumeClaim in the resource's namespace (a Transfer's source may
/// name another namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcRef {
    /// Name of the claim.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// A Transfer's source only: the claim's namespace, when it is not the Transfer's own.
    /// Allowed only when the Transfer's creator may `create` `transfers/source` of that
    /// claim there (a SubjectAccessReview, as CDI checks `datavolumes/source`); the
    /// targets must then be new claims
    /// (`pvcTemplate`s), which the storage fills in that namespace and hands over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// The image file inside a Filesystem volume, relative to its root (default `disk.img`).
    /// Ignored for Block volumes, which are the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,
}

impl PvcRef {
    /// The image file inside a Filesystem volume.
    pub fn image_path(&self) -> &str {
        self.path.as_deref().unwrap_or(DEFAULT_IMAGE_FILE)
    }

    /// A claim named by name alone (default image path).
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    pub(crate) fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if self.namespace.is_some() {
            return Err(invalid(
                &format!("{field}.namespace"),
                "only a Transfer's source claim can be in another namespace: a target (or any other claim) is in the resource's own",
            ));
        }
        check_pvc_name(&format!("{field}.name"), &self.name)?;
        if let Some(path) = &self.path {
            check_relative_path(&format!("{field}.path"), path)?;
        }
        Ok(())
    }
}

/// Where an image lives: exactly one of `url` (with at most one typed option block that
/// matches its scheme) or `pvc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// `nbd://host[:port]/export`, `nbds://...`, `nfs://host/export/path`,
    /// `iscsi://host[:port]/IQN/LUN`, `s3://bucket/key`, or (sources only)
    /// `http(s)://host/path` and `docker://host[:port]/repo:tag` (or `@sha256:...`).
    /// Credentials inside the URL are refused: give them by Secret reference in the
    /// options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub url: Option<String>,
    /// Options of an `s3://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Options>,
    /// Options of an `nbd://` or `nbds://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd: Option<NbdOptions>,
    /// Options of an `iscsi://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiOptions>,
    /// Options of an `nfs://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfs: Option<NfsOptions>,
    /// Options of an `http://` or `https://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpOptions>,
    /// Options of a `docker://` (or `oci://`) URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryOptions>,
    /// A claim in this namespace: a Filesystem volume holds the image as a file, a Block
    /// volume is the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcRef>,
    /// Sources only: the newest image a `GoldenImage` in this namespace imported (its
    /// `status.currentClaim`, looked up once when the resource starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden_image: Option<GoldenImageRef>,
    /// Sources only: the format of the image: auto (detected by magic, the default), raw,
    /// qcow2, or a raw image compressed with gz, xz or zst. Targets are written raw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ImageFormat>,
    /// Sources only: follow a qcow2 image's backing file, next to the image in the same
    /// volume. Off by default: the backing file name comes from the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_backing: Option<bool>,
}

impl S3Options {
    /// The Secret keys of the credentials, in a fixed order.
    pub fn secret_refs(&self) -> impl Iterator<Item = &SecretKeyRef> {
        self.access_key_id
            .iter()
            .chain(&self.secret_access_key)
            .chain(&self.session_token)
    }
}

impl Endpoint {
    /// Whether this is an `http://` or `https://` URL.
    pub fn is_http(&self) -> bool {
        self.url
            .as_deref()
            .and_then(|u| u.split_once("://"))
            .is_some_and(|(scheme, _)| {
                scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
            })
    }

    /// Whether this is a `docker://` or `oci://` URL (a registry image).
    pub fn is_registry(&self) -> bool {
        self.url
            .as_deref()
            .and_then(|u| u.split_once("://"))
            .is_some_and(|(scheme, _)| {
                scheme.eq_ignore_ascii_case("docker") || scheme.eq_ignore_ascii_case("oci")
            })
    }

    /// An endpoint reading or writing `url`.
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::default()
        }
    }

    /// An endpoint on the claim `name` (default image path).
    pub fn pvc(name: impl Into<String>) -> Self {
        Self {
            pvc: Some(PvcRef {
                name: name.into(),
                path: None,
                namespace: None,
            }),
            ..Self::default()
        }
    }

    fn has_options(&self) -> bool {
        self.s3.is_some()
            || self.nbd.is_some()
            || self.iscsi.is_some()
            || self.nfs.is_some()
            || self.http.is_some()
            || self.registry.is_some()
    }

    /// Every Secret key the endpoint refers to, in a fixed order.
    pub fn secret_refs(&self) -> Vec<&SecretKeyRef> {
        let mut refs = Vec::new();
        if let Some(s3) = &self.s3 {
            refs.extend(s3.secret_refs());
        }
        if let Some(iscsi) = &self.iscsi {
            refs.extend(iscsi.password.iter());
        }
        if let Some(http) = &self.http {
            refs.extend(http.password.iter());
            refs.extend(http.bearer_token.iter());
            refs.extend(http.headers.iter().map(|h| &h.value_from));
            refs.extend(http.ca_certificates.iter());
            refs.extend(http.client_certificate.iter());
            refs.extend(http.client_key.iter());
        }
        refs
    }

    /// Checks the endpoint at `field` (for example `spec.source`).
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if let Some(golden) = &self.golden_image {
            if self.url.is_some() || self.pvc.is_some() || self.has_options() {
                return Err(invalid(
                    field,
                    "give exactly one of url, pvc or goldenImage (and no url options with goldenImage)",
                ));
            }
            return check_pvc_name(&format!("{field}.goldenImage.name"), &golden.name);
        }
        match (&self.url, &self.pvc) {
            (Some(_), Some(_)) | (None, None) => Err(invalid(
                field,
                "give exactly one of url, pvc or goldenImage",
            )),
            (None, Some(pvc)) => {
                if self.has_options() {
                    return Err(invalid(
                        field,
                        "s3, nbd, iscsi, nfs, http and registry options go with a url, not with a pvc",
                    ));
                }
                pvc.validate(&format!("{field}.pvc"))
            }
            (Some(url), None) => self.validate_url(field, url),
        }
    }

    fn validate_url(&self, field: &str, url: &str) -> Result<(), ValidationError> {
        let kind = check_url(&format!("{field}.url"), url)?;
        let given = [
            (self.s3.is_some(), UrlKind::S3, "s3"),
            (self.nbd.is_some(), UrlKind::Nbd, "nbd"),
            (self.iscsi.is_some(), UrlKind::Iscsi, "iscsi"),
            (self.nfs.is_some(), UrlKind::Nfs, "nfs"),
            (self.http.is_some(), UrlKind::Http, "http"),
            (self.registry.is_some(), UrlKind::Registry, "registry"),
        ];
        for (set, wanted, name) in given {
            if set && kind != wanted {
                return Err(invalid(
                    &format!("{field}.{name}"),
                    &format!("{name} options do not apply to a {} URL", kind.name()),
                ));
            }
        }
        if let Some(s3) = &self.s3 {
            validate_s3(&format!("{field}.s3"), s3)?;
        }
        if let Some(registry) = &self.registry {
            let field = format!("{field}.registry");
            if let Some(name) = &registry.secret_ref {
                check_pvc_name(&format!("{field}.secretRef"), name)?;
            }
            if let Some(name) = &registry.cert_config_map {
                check_pvc_name(&format!("{field}.certConfigMap"), name)?;
            }
            if let Some(platform) = &registry.platform {
                let parts: Vec<&str> = platform.split('/').collect();
                let ok = (2..=3).contains(&parts.len())
                    && parts.iter().all(|p| {
                        !p.is_empty()
                            && p.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    });
                if !ok {
                    return Err(invalid(
                        &format!("{field}.platform"),
                        &format!(
                            "'{platform}' is not os/arch[/variant] (linux/amd64, linux/arm64/v8)"
                        ),
                    ));
                }
            }
        }
        if let Some(nfs) = &self.nfs {
            if url.contains('?') {
                return Err(invalid(
                    &format!("{field}.nfs"),
                    "NFS options are given both in the URL query and in nfs: use one place",
                ));
            }
            if nfs.version.is_some_and(|v| v != 3 && v != 4) {
                return Err(invalid(
                    &format!("{field}.nfs.version"),
                    "NFS version must be 3 or 4",
                ));
            }
        }
        if let Some(name) = self.nbd.as_ref().and_then(|n| n.tls_secret_name.as_ref()) {
            check_pvc_name(&format!("{field}.nbd.tlsSecretName"), name)?;
            if !url.to_ascii_lowercase().starts_with("nbds") {
                return Err(invalid(
                    &format!("{field}.nbd.tlsSecretName"),
                    "TLS certificates need an nbds:// URL",
                ));
            }
        }
        if self.nbd.as_ref().and_then(|n| n.mover_certificate) == Some(true) {
            let field = format!("{field}.nbd.moverCertificate");
            if !url.to_ascii_lowercase().starts_with("nbds") {
                return Err(invalid(&field, "the movers' TLS needs an nbds:// URL"));
            }
            if self
                .nbd
                .as_ref()
                .is_some_and(|n| n.tls_secret_name.is_some())
            {
                return Err(invalid(
                    &field,
                    "give tlsSecretName or moverCertificate, not both",
                ));
            }
        }
        if let Some(password) = self.iscsi.as_ref().and_then(|i| i.password.as_ref()) {
            check_secret_ref(&format!("{field}.iscsi.password"), password)?;
        }
        if let Some(http) = &self.http {
            validate_http(&format!("{field}.http"), http)?;
        }
        Ok(())
    }
}

fn validate_http(field: &str, http: &HttpOptions) -> Result<(), ValidationError> {
    if http.password.is_some() && http.user.is_none() {
        return Err(invalid(
            &format!("{field}.password"),
            "a password needs a user",
        ));
    }
    if http.user.as_deref().is_some_and(|u| u.contains(':')) {
        return Err(invalid(
            &format!("{field}.user"),
            "a user name cannot contain ':'",
        ));
    }
    if http.bearer_token.is_some() && (http.user.is_some() || http.password.is_some()) {
        return Err(invalid(
            field,
            "give either user and password or bearerToken, not both",
        ));
    }
    if http.client_certificate.is_some() != http.client_key.is_some() {
        return Err(invalid(
            field,
            "clientCertificate and clientKey go together: give both or neither",
        ));
    }
    if http.headers.len() > 64 {
        return Err(invalid(&format!("{field}.headers"), "at most 64 headers"));
    }
    for (name, r) in [
        ("password", &http.password),
        ("bearerToken", &http.bearer_token),
        ("caCertificates", &http.ca_certificates),
        ("clientCertificate", &http.client_certificate),
        ("clientKey", &http.client_key),
    ] {
        if let Some(r) = r {
            check_secret_ref(&format!("{field}.{name}"), r)?;
        }
    }
    for (i, h) in http.headers.iter().enumerate() {
        let ok = !h.name.is_empty()
            && h.name.len() <= 256
            && h.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+.^_`|~-".contains(&b));
        if !ok {
            return Err(invalid(
                &format!("{field}.headers[{i}].name"),
                "not a valid HTTP header name",
            ));
        }
        if ferry_core::http_headers::is_reserved_header(&h.name) {
            return Err(invalid(
                &format!("{field}.headers[{i}].name"),
                &format!("'{}' is set by ferry itself and cannot be given", h.name),
            ));
        }
        check_secret_ref(&format!("{field}.headers[{i}].valueFrom"), &h.value_from)?;
    }
    Ok(())
}

fn validate_s3(field: &str, s3: &S3Options) -> Result<(), ValidationError> {
    if let Some(endpoint) = &s3.endpoint_url {
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(invalid(
                &format!("{field}.endpointUrl"),
                "the S3 endpoint URL must start with http:// or https://",
            ));
        }
        if endpoint.contains('@') {
            return Err(invalid(
                &format!("{field}.endpointUrl"),
                "credentials inside the endpoint URL are refused: use accessKeyId and secretAccessKey Secret references",
            ));
        }
    }
    match (&s3.access_key_id, &s3.secret_access_key) {
        (Some(_), None) | (None, Some(_)) => {
            return Err(invalid(
                field,
                "accessKeyId and secretAccessKey go together: give both or neither",
            ))
        }
        _ => {}
    }
    if s3.session_token.is_some() && s3.access_key_id.is_none() {
        return Err(invalid(
            &format!("{field}.sessionToken"),
            "a session token needs accessKeyId and secretAccessKey",
        ));
    }
    for (name, r) in [
        ("accessKeyId", &s3.access_key_id),
        ("secretAccessKey", &s3.secret_access_key),
        ("sessionToken", &s3.session_token),
    ] {
        if let Some(r) = r {
            check_secret_ref(&format!("{field}.{name}"), r)?;
        }
    }
    Ok(())
}

/// How a volume is consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum VolumeMode {
    /// A filesystem; the image is a file in it.
    Filesystem,
    /// A raw block device; the device is the image.
    Block,
}

impl VolumeMode {
    /// The Kubernetes spelling (`Filesystem`, `Block`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filesystem => "Filesystem",
            Self::Block => "Block",
        }
    }
}

/// Access modes a created claim may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AccessMode {
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
    ReadWriteOncePod,
}

/// A claim the operator creates in the resource's namespace before the copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcTemplate {
    /// Name of the claim to create (an existing claim of this name is an error unless it
    /// was created by this resource).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Storage class (default: the cluster's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Requested size; at least the image size.
    pub size: Quantity,
    /// Filesystem (the image is `disk.img` in it) or Block (default Filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<VolumeMode>,
    /// Access modes (default ReadWriteOnce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4))]
    pub access_modes: Option<Vec<AccessMode>>,
}

impl PvcTemplate {
    /// The claim's volume mode.
    pub fn mode(&self) -> VolumeMode {
        self.volume_mode.unwrap_or(VolumeMode::Filesystem)
    }

    fn validate(&self, field: &str) -> Result<(), ValidationError> {
        check_pvc_name(&format!("{field}.name"), &self.name)?;
        super::validate::check_quantity(&format!("{field}.size"), &self.size)
    }
}

/// A copy target: an endpoint, or a claim to create (`pvcTemplate`); exactly one of `url`,
/// `pvc` and `pvcTemplate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferTarget {
    /// An existing endpoint (URL or claim).
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// A claim to create and fill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_template: Option<PvcTemplate>,
}

/// What a target writes, once a template is seen as the claim it creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetKey {
    /// A URL as written in the resource.
    Url(String),
    /// A claim name (existing or created).
    Pvc(String),
}

impl TransferTarget {
    /// The claim or URL this target writes, for duplicate detection and per-target status.
    pub fn key(&self) -> Option<TargetKey> {
        if let Some(t) = &self.pvc_template {
            return Some(TargetKey::Pvc(t.name.clone()));
        }
        if let Some(p) = &self.endpoint.pvc {
            return Some(TargetKey::Pvc(p.name.clone()));
        }
        self.endpoint.url.clone().map(TargetKey::Url)
    }

    /// Checks the target at `field` (for example `spec.targets[0]`).
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        let raw = matches!(
            self.endpoint.format,
            None | Some(ImageFormat::Auto | ImageFormat::Raw)
        );
        if !raw || self.endpoint.allow_backing == Some(true) {
            return Err(invalid(
                field,
                "format and allowBacking apply to the source only: targets are written raw",
            ));
        }
        if self.endpoint.golden_image.is_some() {
            return Err(invalid(
                &format!("{field}.goldenImage"),
                "a GoldenImage is a source only: write into a pvc or pvcTemplate",
            ));
        }
        if self.endpoint.http.is_some()
            || self.endpoint.url.as_deref().is_some_and(|u| {
                let scheme = u.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                matches!(scheme.as_deref(), Some("http" | "https"))
            })
        {
            return Err(invalid(
                &format!("{field}.url"),
                "HTTP(S) endpoints are read-only: they can only be sources",
            ));
        }
        if self.endpoint.registry.is_some()
            || self.endpoint.url.as_deref().is_some_and(|u| {
                let scheme = u.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                matches!(scheme.as_deref(), Some("docker" | "oci"))
            })
        {
            return Err(invalid(
                &format!("{field}.url"),
                "registry images are read-only: they can only be sources",
            ));
        }
        match &self.pvc_template {
            None => self.endpoint.validate(field),
            Some(template) => {
                if self.endpoint != Endpoint::default() {
                    return Err(invalid(
                        field,
                        "give exactly one of url, pvc or pvcTemplate",
                    ));
                }
                template.validate(&format!("{field}.pvcTemplate"))
            }
        }
    }
}

impl std::fmt::Display for TargetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(url) => write!(f, "{url}"),
            Self::Pvc(name) => write!(f, "pvc/{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(e: &Endpoint) -> String {
        e.validate("spec.source").unwrap_err().to_string()
    }

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn urls_of_each_scheme_pass() {
        for url in [
            "nbd://host:10809/export",
            "nbds://host/export",
            "nfs://server/export/disk.img",
            "iscsi://host:3260/iqn.2024-01.dev.ferry:t/0",
            "s3://bucket/images/disk.qcow2",
            "https://images.example/disk.qcow2?X-Amz-Signature=abc",
            "http://10.0.0.1:8080/disk.img",
        ] {
            Endpoint::url(url).validate("spec.source").unwrap();
        }
        Endpoint::pvc("golden").validate("spec.source").unwrap();
    }

    #[test]
    fn http_options() {
        let mut e = Endpoint::url("https://images.example/disk.img");
        e.http = Some(HttpOptions {
            user: Some("ops".into()),
            password: Some(secret("images-http", "password")),
            headers: vec![HttpHeader {
                name: "X-Api-Key".into(),
                value_from: secret("images-http", "api-key"),
            }],
            ca_certificates: Some(secret("images-ca", "ca.pem")),
            ..HttpOptions::default()
        });
        e.validate("spec.source").unwrap();
        assert_eq!(e.secret_refs().len(), 3);
        let mut token_and_password = e.clone();
        if let Some(h) = token_and_password.http.as_mut() {
            h.bearer_token = Some(secret("images-http", "token"));
        }
        assert!(err(&token_and_password).contains("bearerToken"));
        let mut bad_header = e.clone();
        if let Some(h) = bad_header.http.as_mut() {
            h.headers[0].name = "X Api".into();
        }
        assert!(err(&bad_header).starts_with("spec.source.http.headers[0].name"));
        let mut wrong_scheme = e.clone();
        wrong_scheme.url = Some("s3://b/k".into());
        assert!(err(&wrong_scheme).starts_with("spec.source.http"));
        assert!(err(&Endpoint::url("https://u:pw@h/x")).contains("password inside the URL"));
        let target = TransferTarget {
            endpoint: Endpoint::url("https://images.example/out.img"),
            pvc_template: None,
        };
        assert!(target
            .validate("t")
            .unwrap_err()
            .to_string()
            .contains("read-only"));
    }

    #[test]
    fn exactly_one_of_url_and_pvc() {
        let mut both = Endpoint::url("s3://b/k");
        both.pvc = Endpoint::pvc("x").pvc;
        assert_eq!(
            err(&both),
            "spec.source: give exactly one of url, pvc or goldenImage"
        );
        assert_eq!(
            err(&Endpoint::default()),
            "spec.source: give exactly one of url, pvc or goldenImage"
        );
        let mut golden = Endpoint {
            golden_image: Some(GoldenImageRef {
                name: "fedora".into(),
            }),
            ..Endpoint::default()
        };
        assert_eq!(golden.validate("spec.source"), Ok(()));
        golden.url = Some("https://x/y".into());
        assert!(err(&golden).contains("exactly one of url, pvc or goldenImage"));
        let target = TransferTarget {
            endpoint: Endpoint {
                golden_image: Some(GoldenImageRef { name: "f".into() }),
                ..Endpoint::default()
            },
            pvc_template: None,
        };
        assert_eq!(
            target.validate("spec.targets[0]").unwrap_err().to_string(),
            "spec.targets[0].goldenImage: a GoldenImage is a source only: write into a pvc or pvcTemplate"
        );
    }

    #[test]
    fn inline_passwords_are_refused_and_not_repeated() {
        for url in [
            "iscsi://user%hunter2@host/iqn.x/0",
            "nbd://user:hunter2@host/export",
            "s3://key:hunter2@bucket/k",
        ] {
            let e = err(&Endpoint::url(url));
            assert!(e.contains("password inside the URL"), "{e}");
            assert!(e.contains("secretKeyRef"), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        // A user name alone is not a secret.
        Endpoint::url("iscsi://user@host/iqn.x/0")
            .validate("f")
            .unwrap();
    }

    #[test]
    fn unknown_schemes_and_files_are_refused() {
        assert!(err(&Endpoint::url("ftp://host/x")).contains("unknown scheme 'ftp'"));
        assert_eq!(
            err(&Endpoint::url("/var/lib/disk.img")),
            "spec.source.url: '/var/lib/disk.img' is a path: name a claim with pvc instead of a file"
        );
        assert!(err(&Endpoint::url("file:///var/lib/disk.img")).contains("is a file URL"));
        assert!(err(&Endpoint::url("nbd+unix:///e?socket=/s")).contains("Unix socket"));
    }

    #[test]
    fn a_registry_image_is_a_source_with_registry_options_only() {
        let mut e = Endpoint::url("docker://registry.example.com:5000/vms/fedora:41");
        e.registry = Some(RegistryOptions {
            secret_ref: Some("pull-secret".into()),
            cert_config_map: Some("registry-ca".into()),
            platform: Some("linux/arm64/v8".into()),
            insecure: None,
        });
        e.validate("spec.source").unwrap();
        let mut bad = e.clone();
        bad.registry.as_mut().unwrap().platform = Some("arm64".into());
        assert!(
            err(&bad).contains("'arm64' is not os/arch[/variant]"),
            "{}",
            err(&bad)
        );
        let mut bad = e.clone();
        bad.registry.as_mut().unwrap().secret_ref = Some("Not_A_Name".into());
        assert!(err(&bad).contains("spec.source.registry.secretRef"));
        let mut s3 = Endpoint::url("s3://bucket/disk.img");
        s3.registry = Some(RegistryOptions::default());
        assert_eq!(
            err(&s3),
            "spec.source.registry: registry options do not apply to a s3 URL"
        );
        let target = TransferTarget {
            endpoint: e,
            pvc_template: None,
        };
        let message = target.validate("spec.targets[0]").unwrap_err().to_string();
        assert!(
            message.contains("registry images are read-only"),
            "{message}"
        );
    }

    #[test]
    fn options_must_match_the_scheme() {
        let mut e = Endpoint::url("nbd://host/export");
        e.s3 = Some(S3Options::default());
        assert_eq!(
            err(&e),
            "spec.source.s3: s3 options do not apply to a nbd URL"
        );
        let mut e = Endpoint::pvc("x");
        e.iscsi = Some(IscsiOptions::default());
        assert!(err(&e).contains("go with a url"));
        let mut e = Endpoint::url("nbd://host/export");
        e.nbd = Some(NbdOptions {
            tls_secret_name: Some("certs".into()),
            ..NbdOptions::default()
        });
        assert!(err(&e).contains("nbds://"));
        e.nbd = Some(NbdOptions {
            mover_certificate: Some(true),
            ..NbdOptions::default()
        });
        assert!(err(&e).contains("the movers' TLS needs an nbds:// URL"));
        let mut e = Endpoint::url("nbds://host/export");
        e.nbd = Some(NbdOptions {
            tls_secret_name: Some("certs".into()),
            mover_certificate: Some(true),
        });
        assert!(err(&e).contains("not both"));
        let mut e = Endpoint::url("nfs://h/e/f?version=4");
        e.nfs = Some(NfsOptions::default());
        assert!(err(&e).contains("one place"));
    }

    #[test]
    fn s3_credentials_go_together() {
        let mut e = Endpoint::url("s3://b/k");
        e.s3 = Some(S3Options {
            access_key_id: Some(secret("s3", "id")),
            ..S3Options::default()
        });
        assert!(err(&e).contains("give both or neither"));
        e.s3 = Some(S3Options {
            session_token: Some(secret("s3", "token")),
            ..S3Options::default()
        });
        assert!(err(&e).contains("needs accessKeyId"));
        e.s3 = Some(S3Options {
            access_key_id: Some(secret("s3", "id")),
            secret_access_key: Some(secret("s3", "..")),
            ..S3Options::default()
        });
        assert_eq!(
            err(&e),
            "spec.source.s3.secretAccessKey.key: '..' is not a valid Secret key (letters, digits, '-', '_', '.')"
        );
        e.s3 = Some(S3Options {
            endpoint_url: Some("ftp://minio".into()),
            ..S3Options::default()
        });
        assert!(err(&e).contains("http:// or https://"));
    }

    #[test]
    fn pvc_paths_stay_inside_the_volume() {
        for path in ["/etc/passwd", "../x", "a/../../b", "", "a//b", "./disk.img"] {
            let e = Endpoint {
                pvc: Some(PvcRef {
                    name: "data".into(),
                    path: Some(path.into()),
                    namespace: None,
                }),
                ..Endpoint::default()
            };
            assert!(err(&e).starts_with("spec.source.pvc.path:"), "{path}");
        }
        let e = Endpoint::pvc("Not_A_Name");
        assert!(err(&e).starts_with("spec.source.pvc.name:"));
        assert_eq!(Endpoint::pvc("x").pvc.unwrap().image_path(), "disk.img");
    }

    #[test]
    fn target_is_exactly_one_of_three() {
        let template = PvcTemplate {
            name: "copy-1".into(),
            storage_class_name: None,
            size: Quantity("10Gi".into()),
            volume_mode: None,
            access_modes: None,
        };
        let t = TransferTarget {
            endpoint: Endpoint::default(),
            pvc_template: Some(template.clone()),
        };
        t.validate("t").unwrap();
        assert_eq!(t.key(), Some(TargetKey::Pvc("copy-1".into())));
        let t = TransferTarget {
            endpoint: Endpoint::pvc("other"),
            pvc_template: Some(template.clone()),
        };
        assert!(t
            .validate("t")
            .unwrap_err()
            .message
            .contains("exactly one of url, pvc or pvcTemplate"));
        let t = TransferTarget {
            endpoint: Endpoint::default(),
            pvc_template: Some(PvcTemplate {
                size: Quantity("-1Gi".into()),
                ..template
            }),
        };
        assert_eq!(t.validate("t").unwrap_err().field, "t.pvcTemplate.size");
    }

    #[test]
    fn format_and_allow_backing_belong_to_sources() {
        let mut source = Endpoint::pvc("golden");
        source.format = Some(ImageFormat::Xz);
        source.allow_backing = Some(true);
        source.validate("spec.source").unwrap();
        let target = |format, allow_backing| TransferTarget {
            endpoint: Endpoint {
                format,
                allow_backing,
                ..Endpoint::pvc("copy")
            },
            pvc_template: None,
        };
        target(Some(ImageFormat::Raw), None).validate("t").unwrap();
        target(None, Some(false)).validate("t").unwrap();
        for t in [
            target(Some(ImageFormat::Qcow2), None),
            target(None, Some(true)),
        ] {
            assert!(t.validate("t").unwrap_err().message.contains("source only"));
        }
    }
}
