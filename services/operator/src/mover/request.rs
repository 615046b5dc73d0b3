//! The job requests the operator sends a mover, as plain Rust data mirroring the gRPC
//! API's `StartTransferRequest` and `StartChecksumRequest` field by field (this crate does
//! not depend on ferry-mover, which owns the generated types; the reconciler converts).
//!
//! Claims become paths inside the mover (see [`super::layout`]); Secret key references
//! become `SecretRef{file}` names under the mover's `--secrets-dir`; NFS options become
//! the URL's query options, as ferry parses them. A Transfer becomes one request for all
//! its targets (one pass over the source; a retry asks for the targets not done yet),
//! with an idempotency key of the resource's uid and the targets' indexes, so a
//! reconciler that repeats itself starts nothing twice.

use std::collections::BTreeMap;

use kube::Resource;

use super::layout;
use super::{find_pvc, MoverError, ResolvedPvc};
use crate::crd::{
    CacheMode, Checksum, CommitOrder, Endpoint, HashAlgorithm, ImageFormat, NfsOptions,
    Preallocation, SecretKeyRef, Transfer, TransferOptions, ValidationError,
};

/// Label of every job with the owning resource's uid.
pub const OWNER_UID_LABEL: &str = "ferry.dev/owner-uid";
/// Label of a transfer job with the indexes of its targets in `spec.targets`, in request
/// order, separated by commas (`0,1,2`).
pub const TARGET_LABEL: &str = "ferry.dev/target";

/// The indexes a [`TARGET_LABEL`] value names (None when it is not one).
pub fn target_indexes(label: &str) -> Option<Vec<usize>> {
    label.split(',').map(|i| i.parse().ok()).collect()
}

/// `SecretRef`: where the mover reads a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// A file relative to the mover's `--secrets-dir`.
    File(String),
}

/// `S3Options`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    pub endpoint_url: String,
    pub region: String,
    pub access_key_id: Option<SecretRef>,
    pub secret_access_key: Option<SecretRef>,
    pub session_token: Option<SecretRef>,
    pub force_path_style: bool,
}

/// The `options` oneof of `Endpoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointOptions {
    /// `IscsiOptions`.
    Iscsi {
        user: String,
        password: Option<SecretRef>,
    },
    /// `S3Options`.
    S3(S3Options),
    /// `NbdOptions`.
    Nbd { tls_certificates_dir: String },
    /// `HttpOptions` (boxed: it is the largest by far).
    Http(Box<HttpOptions>),
}

/// `HttpOptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpOptions {
    pub user: String,
    pub password: Option<SecretRef>,
    pub bearer_token: Option<SecretRef>,
    /// (name, value)
    pub headers: Vec<(String, SecretRef)>,
    pub ca_certificates: Option<SecretRef>,
    pub client_certificate: Option<SecretRef>,
    pub client_key: Option<SecretRef>,
}

/// `Endpoint`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireEndpoint {
    pub url: String,
    pub options: Option<EndpointOptions>,
    /// `format` (sources only).
    pub format: ImageFormat,
    /// `allow_backing` (sources only).
    pub allow_backing: bool,
}

/// `TransferOptions`; zero values mean the engine's defaults, as on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireTransferOptions {
    pub workers: u32,
    pub request_size: u64,
    pub order: CommitOrder,
    pub sparse_size: Option<u64>,
    pub target_is_zero: bool,
    pub preallocation: Preallocation,
    pub preallocation_step: u64,
    pub cache: CacheMode,
    pub rate_limit: u64,
    pub verify: bool,
    pub verify_algorithm: HashAlgorithm,
}

/// `ChecksumOptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireChecksumOptions {
    pub algorithm: HashAlgorithm,
    pub workers: u32,
    pub request_size: u64,
    pub threads: u32,
    pub cache: CacheMode,
}

/// `StartTransferRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartTransfer {
    pub source: WireEndpoint,
    pub target: WireEndpoint,
    /// The targets after the first, written in the same pass.
    pub more_targets: Vec<WireEndpoint>,
    pub options: WireTransferOptions,
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    /// Always set: two Transfers writing one target must not interleave.
    pub refuse_if_target_busy: bool,
}

/// `StartChecksumRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartChecksum {
    pub source: WireEndpoint,
    pub options: WireChecksumOptions,
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
}

fn uid_of<K: Resource>(r: &K, kind: &'static str) -> Result<String, MoverError> {
    r.meta().uid.clone().ok_or(MoverError::NotStored(kind))
}

/// The one request of a Transfer for the targets at `indexes` of `spec.targets` (every
/// target on the first attempt; those not done yet on a retry), in that order.
pub fn transfer_request(
    transfer: &Transfer,
    pvcs: &[ResolvedPvc],
    indexes: &[usize],
) -> Result<StartTransfer, MoverError> {
    transfer.spec.validate()?;
    let uid = uid_of(transfer, "Transfer")?;
    let source = wire_endpoint(&transfer.spec.source, pvcs)?;
    let options = transfer_options(transfer.spec.options.as_ref());
    let mut targets = Vec::with_capacity(indexes.len());
    for &i in indexes {
        let Some(target) = transfer.spec.targets.get(i) else {
            continue;
        };
        targets.push(match &target.pvc_template {
            Some(template) => {
                let pvc = find_pvc(pvcs, &template.name)?;
                let r = crate::crd::PvcRef {
                    name: pvc.name.clone(),
                    path: None,
                };
                WireEndpoint {
                    url: layout::pvc_image(&r, pvc.mode),
                    options: None,
                    ..WireEndpoint::default()
                }
            }
            None => wire_endpoint(&target.endpoint, pvcs)?,
        });
    }
    let mut targets = targets.into_iter();
    let target = targets.next().ok_or_else(|| {
        MoverError::Invalid(ValidationError {
            field: "spec.targets".into(),
            message: "no target left to write".into(),
        })
    })?;
    let names: Vec<String> = indexes
        .iter()
        .filter(|&&i| i < transfer.spec.targets.len())
        .map(ToString::to_string)
        .collect();
    let names = names.join(",");
    Ok(StartTransfer {
        source,
        target,
        more_targets: targets.collect(),
        options,
        idempotency_key: format!("{uid}/{names}"),
        labels: BTreeMap::from([
            (OWNER_UID_LABEL.to_string(), uid),
            (TARGET_LABEL.to_string(), names),
        ]),
        priority: 0,
        refuse_if_target_busy: true,
    })
}

/// The request of a Checksum.
pub fn checksum_request(
    checksum: &Checksum,
    pvcs: &[ResolvedPvc],
) -> Result<StartChecksum, MoverError> {
    checksum.spec.validate()?;
    let uid = uid_of(checksum, "Checksum")?;
    let o = checksum.spec.options.clone().unwrap_or_default();
    Ok(StartChecksum {
        source: wire_endpoint(&checksum.spec.source, pvcs)?,
        options: WireChecksumOptions {
            algorithm: o.algorithm.unwrap_or_default(),
            workers: o.workers.unwrap_or(0),
            request_size: o.request_size.unwrap_or(0),
            threads: o.threads.unwrap_or(0),
            cache: o.cache.unwrap_or_default(),
        },
        idempotency_key: uid.clone(),
        labels: BTreeMap::from([(OWNER_UID_LABEL.to_string(), uid)]),
        priority: 0,
    })
}

/// The options on the wire: left out means zero (the default), as in the API.
pub fn transfer_options(options: Option<&TransferOptions>) -> WireTransferOptions {
    let o = options.cloned().unwrap_or_default();
    WireTransferOptions {
        workers: o.workers.unwrap_or(0),
        request_size: o.request_size.unwrap_or(0),
        order: o.order.unwrap_or_default(),
        sparse_size: o.sparse_size,
        target_is_zero: o.target_is_zero.unwrap_or(false),
        preallocation: o.preallocation.unwrap_or_default(),
        preallocation_step: o.preallocation_step.unwrap_or(0),
        cache: o.cache.unwrap_or_default(),
        rate_limit: o.rate_limit.unwrap_or(0),
        verify: o.verify.unwrap_or(false),
        verify_algorithm: o.verify_algorithm.unwrap_or_default(),
    }
}

fn file(r: &SecretKeyRef) -> SecretRef {
    SecretRef::File(layout::secret_file(r))
}

/// An endpoint as the mover sees it: a claim becomes its path, Secret keys their files.
pub fn wire_endpoint(e: &Endpoint, pvcs: &[ResolvedPvc]) -> Result<WireEndpoint, MoverError> {
    if let Some(r) = &e.pvc {
        let pvc = find_pvc(pvcs, &r.name)?;
        return Ok(WireEndpoint {
            url: layout::pvc_image(r, pvc.mode),
            options: None,
            format: e.format.unwrap_or_default(),
            allow_backing: e.allow_backing.unwrap_or(false),
        });
    }
    let mut url = e.url.clone().unwrap_or_default();
    if let Some(nfs) = &e.nfs {
        url.push_str(&nfs_query(nfs));
    }
    let options = if let Some(s3) = &e.s3 {
        Some(EndpointOptions::S3(S3Options {
            endpoint_url: s3.endpoint_url.clone().unwrap_or_default(),
            region: s3.region.clone().unwrap_or_default(),
            access_key_id: s3.access_key_id.as_ref().map(file),
            secret_access_key: s3.secret_access_key.as_ref().map(file),
            session_token: s3.session_token.as_ref().map(file),
            force_path_style: s3.force_path_style.unwrap_or(false),
        }))
    } else if let Some(http) = &e.http {
        Some(EndpointOptions::Http(Box::new(HttpOptions {
            user: http.user.clone().unwrap_or_default(),
            password: http.password.as_ref().map(file),
            bearer_token: http.bearer_token.as_ref().map(file),
            headers: http
                .headers
                .iter()
                .map(|h| (h.name.clone(), file(&h.value_from)))
                .collect(),
            ca_certificates: http.ca_certificates.as_ref().map(file),
            client_certificate: http.client_certificate.as_ref().map(file),
            client_key: http.client_key.as_ref().map(file),
        })))
    } else if let Some(iscsi) = &e.iscsi {
        Some(EndpointOptions::Iscsi {
            user: iscsi.user.clone().unwrap_or_default(),
            password: iscsi.password.as_ref().map(file),
        })
    } else {
        e.nbd
            .as_ref()
            .and_then(|n| n.tls_secret_name.as_ref())
            .map(|secret| EndpointOptions::Nbd {
                tls_certificates_dir: layout::nbd_tls_dir(secret),
            })
    };
    Ok(WireEndpoint {
        url,
        options,
        format: e.format.unwrap_or_default(),
        allow_backing: e.allow_backing.unwrap_or(false),
    })
}

/// `?version=..&uid=..` in the order ferry documents them; empty when nothing is set.
fn nfs_query(nfs: &NfsOptions) -> String {
    let pairs: Vec<String> = [
        ("version", nfs.version.map(u64::from)),
        ("nfsport", nfs.nfs_port.map(u64::from)),
        ("mountport", nfs.mount_port.map(u64::from)),
        ("uid", nfs.uid.map(u64::from)),
        ("gid", nfs.gid.map(u64::from)),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
    .collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::crd::{
        ChecksumOptions, ChecksumSpec, IscsiOptions, PvcRef, PvcTemplate, Target, TransferSpec,
        VolumeMode,
    };

    fn stored<K: Resource>(mut r: K) -> K {
        *r.meta_mut() = ObjectMeta {
            name: Some("x".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-1".into()),
            ..ObjectMeta::default()
        };
        r
    }

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn transfer_becomes_one_request_for_its_targets() {
        let mut iscsi = Endpoint::url("iscsi://san:3260/iqn.2024-01.dev.ferry:disk/1");
        iscsi.iscsi = Some(IscsiOptions {
            user: Some("chap".into()),
            password: Some(secret("chap", "password")),
        });
        let spec = TransferSpec {
            source: iscsi,
            targets: vec![
                Target {
                    endpoint: Endpoint {
                        pvc: Some(PvcRef {
                            name: "fs".into(),
                            path: Some("images/vm.img".into()),
                        }),
                        ..Endpoint::default()
                    },
                    pvc_template: None,
                },
                Target {
                    endpoint: Endpoint::default(),
                    pvc_template: Some(PvcTemplate {
                        name: "blk".into(),
                        storage_class_name: None,
                        size: Quantity("1Gi".into()),
                        volume_mode: Some(VolumeMode::Block),
                        access_modes: None,
                    }),
                },
            ],
            options: Some(TransferOptions {
                workers: Some(4),
                verify: Some(true),
                ..TransferOptions::default()
            }),
            expected_digest: None,
            mover: None,
        };
        let t = stored(Transfer::new("x", spec));
        let pvcs = [
            ResolvedPvc::new("fs", VolumeMode::Filesystem),
            ResolvedPvc::new("blk", VolumeMode::Block),
        ];
        let request = transfer_request(&t, &pvcs, &[0, 1]).unwrap();
        let source = WireEndpoint {
            url: "iscsi://san:3260/iqn.2024-01.dev.ferry:disk/1".into(),
            options: Some(EndpointOptions::Iscsi {
                user: "chap".into(),
                password: Some(SecretRef::File("chap/password".into())),
            }),
            ..WireEndpoint::default()
        };
        let options = WireTransferOptions {
            workers: 4,
            verify: true,
            ..WireTransferOptions::default()
        };
        let file = |url: &str| WireEndpoint {
            url: url.into(),
            options: None,
            ..WireEndpoint::default()
        };
        let expected = StartTransfer {
            source: source.clone(),
            target: file("/var/run/ferry/volumes/fs/images/vm.img"),
            more_targets: vec![file("/dev/ferry/blk")],
            options: options.clone(),
            idempotency_key: "uid-1/0,1".into(),
            labels: BTreeMap::from([
                (OWNER_UID_LABEL.to_string(), "uid-1".to_string()),
                (TARGET_LABEL.to_string(), "0,1".to_string()),
            ]),
            priority: 0,
            refuse_if_target_busy: true,
        };
        assert_eq!(request, expected);
        assert_eq!(target_indexes("0,1"), Some(vec![0, 1]));
        // A retry of the second target alone.
        let retry = transfer_request(&t, &pvcs, &[1]).unwrap();
        assert_eq!(retry.target, file("/dev/ferry/blk"));
        assert!(retry.more_targets.is_empty());
        assert_eq!(retry.idempotency_key, "uid-1/1");
        assert_eq!(retry.labels[TARGET_LABEL], "1");
        assert_eq!(target_indexes("1"), Some(vec![1]));
        assert_eq!(target_indexes("1,x"), None);
        assert!(matches!(
            transfer_request(&t, &pvcs, &[]),
            Err(MoverError::Invalid(_))
        ));
    }

    #[test]
    fn s3_credentials_become_secret_files_and_nfs_options_the_query() {
        let mut s3 = Endpoint::url("s3://bucket/key");
        s3.s3 = Some(crate::crd::S3Options {
            region: Some("eu-west-1".into()),
            access_key_id: Some(secret("s3", "id")),
            secret_access_key: Some(secret("s3", "key")),
            force_path_style: Some(true),
            ..crate::crd::S3Options::default()
        });
        assert_eq!(
            wire_endpoint(&s3, &[]).unwrap(),
            WireEndpoint {
                url: "s3://bucket/key".into(),
                options: Some(EndpointOptions::S3(S3Options {
                    endpoint_url: String::new(),
                    region: "eu-west-1".into(),
                    access_key_id: Some(SecretRef::File("s3/id".into())),
                    secret_access_key: Some(SecretRef::File("s3/key".into())),
                    session_token: None,
                    force_path_style: true,
                })),
                ..WireEndpoint::default()
            }
        );
        let mut nfs = Endpoint::url("nfs://server/export/disk.img");
        nfs.nfs = Some(NfsOptions {
            version: Some(4),
            uid: Some(107),
            gid: Some(107),
            ..NfsOptions::default()
        });
        assert_eq!(
            wire_endpoint(&nfs, &[]).unwrap().url,
            "nfs://server/export/disk.img?version=4&uid=107&gid=107"
        );
        let mut nbd = Endpoint::url("nbds://h/e");
        nbd.nbd = Some(crate::crd::NbdOptions {
            tls_secret_name: Some("certs".into()),
        });
        assert_eq!(
            wire_endpoint(&nbd, &[]).unwrap().options,
            Some(EndpointOptions::Nbd {
                tls_certificates_dir: "/var/run/ferry/nbd-tls/certs".into()
            })
        );
        assert_eq!(
            wire_endpoint(&Endpoint::pvc("gone"), &[]).unwrap_err(),
            MoverError::UnresolvedPvc("gone".into())
        );
        let mut zst = Endpoint::url("s3://bucket/disk.raw.zst");
        zst.format = Some(ImageFormat::Zst);
        zst.allow_backing = Some(true);
        let wire = wire_endpoint(&zst, &[]).unwrap();
        assert_eq!((wire.format, wire.allow_backing), (ImageFormat::Zst, true));
        assert_eq!(wire_endpoint(&s3, &[]).unwrap().format, ImageFormat::Auto);
    }

    #[test]
    fn checksum_request_mirrors_the_options() {
        let c = stored(Checksum::new(
            "x",
            ChecksumSpec {
                source: Endpoint::pvc("golden"),
                options: Some(ChecksumOptions {
                    algorithm: Some(HashAlgorithm::Sha256),
                    threads: Some(2),
                    ..ChecksumOptions::default()
                }),
                mover: None,
            },
        ));
        let r =
            checksum_request(&c, &[ResolvedPvc::new("golden", VolumeMode::Filesystem)]).unwrap();
        assert_eq!(
            r,
            StartChecksum {
                source: WireEndpoint {
                    url: "/var/run/ferry/volumes/golden/disk.img".into(),
                    options: None,
                    ..WireEndpoint::default()
                },
                options: WireChecksumOptions {
                    algorithm: HashAlgorithm::Sha256,
                    workers: 0,
                    request_size: 0,
                    threads: 2,
                    cache: CacheMode::PageCache,
                },
                idempotency_key: "uid-1".into(),
                labels: BTreeMap::from([(OWNER_UID_LABEL.to_string(), "uid-1".to_string())]),
                priority: 0,
            }
        );
    }

    #[test]
    fn unset_options_are_wire_zeroes() {
        assert_eq!(transfer_options(None), WireTransferOptions::default());
        let o = transfer_options(Some(&TransferOptions {
            sparse_size: Some(0),
            order: Some(CommitOrder::InOrder),
            ..TransferOptions::default()
        }));
        assert_eq!(o.sparse_size, Some(0));
        assert_eq!(o.order, CommitOrder::InOrder);
    }
}
