//! The copy and checksum requests the operator sends a mover: ferry-api's
//! `StartTransferRequest` and `StartChecksumRequest`, built from the resource and its
//! resolved claims by pure functions (endpoints by [`super::endpoint`], option values by
//! [`super::wire`]).
//!
//! A Transfer becomes one request for all its targets (one pass over the source; a retry
//! asks for the targets not done yet), with an idempotency key of the resource's uid and
//! the targets' indexes, so a reconciler that repeats itself starts nothing twice. Labels
//! name the owning resource ([`OWNER_UID_LABEL`]) and a transfer's targets
//! ([`TARGET_LABEL`]), which is how a job's per-target outcomes find their way back to
//! `spec.targets`.

use std::collections::BTreeMap;

use ferry_api::proto;
use kube::Resource;

use super::endpoint::{claim_image, endpoint};
use super::{find_pvc, layout, wire, MoverError, ResolvedPvc};
use crate::crd::{
    Checkpoint, Checksum, ChecksumOptions, Transfer, TransferOptions, ValidationError,
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

/// The uid of a stored resource.
pub(crate) fn uid_of<K: Resource>(r: &K, kind: &'static str) -> Result<String, MoverError> {
    r.meta().uid.clone().ok_or(MoverError::NotStored(kind))
}

/// The labels of every job of the resource of uid `uid`.
pub(crate) fn owner_labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(OWNER_UID_LABEL.to_string(), uid.to_string())])
}

/// The one request of a Transfer for the targets at `indexes` of `spec.targets` (every
/// target on the first attempt; those not done yet on a retry), in that order, resuming
/// from the ranges an earlier mover committed when `resume_from` is given.
pub fn transfer_request(
    transfer: &Transfer,
    pvcs: &[ResolvedPvc],
    indexes: &[usize],
    resume_from: Option<&Checkpoint>,
) -> Result<proto::StartTransferRequest, MoverError> {
    transfer.spec.validate()?;
    let uid = uid_of(transfer, "Transfer")?;
    let source = endpoint(&transfer.spec.source, pvcs)?;
    let mut targets = Vec::with_capacity(indexes.len());
    for &i in indexes {
        let Some(target) = transfer.spec.targets.get(i) else {
            continue;
        };
        targets.push(match &target.pvc_template {
            Some(template) => claim_image(find_pvc(pvcs, &template.name)?),
            None => endpoint(&target.endpoint, pvcs)?,
        });
    }
    if transfer.spec.relay.as_ref().is_some_and(|r| r.serve) {
        let claim = |i: &usize| {
            transfer
                .spec
                .targets
                .get(*i)
                .is_some_and(|t| t.pvc_template.is_some() || t.endpoint.pvc.is_some())
        };
        if let Some(at) = indexes
            .iter()
            .filter(|&&i| i < transfer.spec.targets.len())
            .position(claim)
        {
            targets[at].relay = Some(relay_serving());
        }
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
    let mut labels = owner_labels(&uid);
    labels.insert(TARGET_LABEL.to_string(), names.clone());
    Ok(proto::StartTransferRequest {
        source: Some(source),
        target: Some(target),
        more_targets: targets.collect(),
        options: Some(transfer_options(transfer.spec.options.as_ref())),
        idempotency_key: format!("{uid}/{names}"),
        labels,
        priority: 0,
        // Always: two Transfers writing one target must not interleave.
        refuse_if_target_busy: true,
        resume_from: resume_from.map(wire::checkpoint),
    })
}

/// After its copy, how long a fan-out's relay keeps serving with no group connected, for
/// groups whose movers start late.
pub const RELAY_IDLE_SECONDS: u32 = 120;
/// How long the relay serves the finished image at most while groups still read it.
pub const RELAY_LINGER_SECONDS: u32 = 6 * 3600;
/// How long a group's read of a range the relay's copy has not written yet waits.
pub const RELAY_WAIT_SECONDS: u32 = 600;

/// The relay of a fan-out's serving group: on every address at [`layout::RELAY_PORT`],
/// mutual TLS with the mover's own certificate, accepting only movers of the operator's CA.
pub fn relay_serving() -> proto::RelayOptions {
    proto::RelayOptions {
        listen: format!("0.0.0.0:{}", layout::RELAY_PORT),
        name: String::new(),
        tls_cert: layout::relay_tls_file("client-cert.pem"),
        tls_key: layout::relay_tls_file("client-key.pem"),
        tls_ca: layout::relay_tls_file("ca-cert.pem"),
        linger_seconds: RELAY_LINGER_SECONDS,
        wait_seconds: RELAY_WAIT_SECONDS,
        idle_seconds: RELAY_IDLE_SECONDS,
    }
}

/// The request of a Checksum.
pub fn checksum_request(
    checksum: &Checksum,
    pvcs: &[ResolvedPvc],
) -> Result<proto::StartChecksumRequest, MoverError> {
    checksum.spec.validate()?;
    let uid = uid_of(checksum, "Checksum")?;
    Ok(proto::StartChecksumRequest {
        source: Some(endpoint(&checksum.spec.source, pvcs)?),
        options: Some(checksum_options(checksum.spec.options.as_ref())),
        idempotency_key: uid.clone(),
        labels: owner_labels(&uid),
        priority: 0,
    })
}

/// A Transfer's options on the wire: left out means zero (the default), as in the API.
pub fn transfer_options(options: Option<&TransferOptions>) -> proto::TransferOptions {
    let o = options.cloned().unwrap_or_default();
    proto::TransferOptions {
        workers: o.workers.unwrap_or(0),
        request_size: o.request_size.unwrap_or(0),
        order: wire::commit_order(o.order.unwrap_or_default()) as i32,
        sparse_size: o.sparse_size,
        target_is_zero: o.target_is_zero.unwrap_or(false),
        preallocation: wire::preallocation(o.preallocation.unwrap_or_default()) as i32,
        preallocation_step: o.preallocation_step.unwrap_or(0),
        cache: wire::cache_mode(o.cache.unwrap_or_default()) as i32,
        rate_limit: o.rate_limit.unwrap_or(0),
        verify: o.verify.unwrap_or(false),
        verify_algorithm: wire::hash_algorithm(o.verify_algorithm.unwrap_or_default()) as i32,
    }
}

/// A Checksum's options on the wire: left out means zero (the default), as in the API.
pub fn checksum_options(options: Option<&ChecksumOptions>) -> proto::ChecksumOptions {
    let o = options.cloned().unwrap_or_default();
    proto::ChecksumOptions {
        algorithm: wire::hash_algorithm(o.algorithm.unwrap_or_default()) as i32,
        workers: o.workers.unwrap_or(0),
        request_size: o.request_size.unwrap_or(0),
        threads: o.threads.unwrap_or(0),
        cache: wire::cache_mode(o.cache.unwrap_or_default()) as i32,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::crd::{
        CacheMode, ChecksumSpec, CommitOrder, Endpoint, HashAlgorithm, IscsiOptions, PvcRef,
        PvcTemplate, SecretKeyRef, TransferSpec, TransferTarget, VolumeMode,
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

    fn file(url: &str) -> proto::Endpoint {
        proto::Endpoint {
            url: url.into(),
            ..proto::Endpoint::default()
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
                TransferTarget {
                    endpoint: Endpoint {
                        pvc: Some(PvcRef {
                            name: "fs".into(),
                            path: Some("images/vm.img".into()),
                            namespace: None,
                        }),
                        ..Endpoint::default()
                    },
                    pvc_template: None,
                },
                TransferTarget {
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
            claim_retention: None,
            clone_strategy: None,
            pvc_templates: None,
            fan_out: None,
            relay: None,
        };
        let t = stored(Transfer::new("x", spec));
        let pvcs = [
            ResolvedPvc::new("fs", VolumeMode::Filesystem),
            ResolvedPvc::new("blk", VolumeMode::Block),
        ];
        let request = transfer_request(&t, &pvcs, &[0, 1], None).unwrap();
        let source = proto::Endpoint {
            url: "iscsi://san:3260/iqn.2024-01.dev.ferry:disk/1".into(),
            options: Some(proto::endpoint::Options::Iscsi(proto::IscsiOptions {
                user: "chap".into(),
                password: Some(proto::SecretRef {
                    source: Some(proto::secret_ref::Source::File("chap/password".into())),
                }),
            })),
            ..proto::Endpoint::default()
        };
        let options = proto::TransferOptions {
            workers: 4,
            verify: true,
            ..proto::TransferOptions::default()
        };
        let expected = proto::StartTransferRequest {
            source: Some(source),
            target: Some(file("/var/run/ferry/volumes/fs/images/vm.img")),
            more_targets: vec![file("/dev/ferry/blk")],
            options: Some(options),
            idempotency_key: "uid-1/0,1".into(),
            labels: BTreeMap::from([
                (OWNER_UID_LABEL.to_string(), "uid-1".to_string()),
                (TARGET_LABEL.to_string(), "0,1".to_string()),
            ]),
            priority: 0,
            refuse_if_target_busy: true,
            resume_from: None,
        };
        assert_eq!(request, expected);
        assert_eq!(target_indexes("0,1"), Some(vec![0, 1]));
        // A retry of the second target alone.
        let retry = transfer_request(&t, &pvcs, &[1], None).unwrap();
        assert_eq!(retry.target, Some(file("/dev/ferry/blk")));
        assert!(retry.more_targets.is_empty());
        // A fan-out's serving group relays its first claim target of the request.
        let mut seed = t.clone();
        seed.spec.relay = Some(crate::crd::GroupRelay {
            serve: true,
            from: None,
        });
        let request = transfer_request(&seed, &pvcs, &[1], None).unwrap();
        assert_eq!(
            request.target.unwrap().relay,
            Some(proto::RelayOptions {
                listen: "0.0.0.0:10810".into(),
                name: String::new(),
                tls_cert: "/var/run/ferry/relay-tls/client-cert.pem".into(),
                tls_key: "/var/run/ferry/relay-tls/client-key.pem".into(),
                tls_ca: "/var/run/ferry/relay-tls/ca-cert.pem".into(),
                linger_seconds: 6 * 3600,
                wait_seconds: 600,
                idle_seconds: 120,
            })
        );
        let request = transfer_request(&seed, &pvcs, &[0, 1], None).unwrap();
        assert!(request.target.unwrap().relay.is_some());
        assert!(request.more_targets[0].relay.is_none());
        assert_eq!(retry.idempotency_key, "uid-1/1");
        assert_eq!(retry.labels[TARGET_LABEL], "1");
        assert_eq!(target_indexes("1"), Some(vec![1]));
        assert_eq!(target_indexes("1,x"), None);
        assert!(matches!(
            transfer_request(&t, &pvcs, &[], None),
            Err(MoverError::Invalid(_))
        ));
    }

    #[test]
    fn checksum_request_carries_the_options() {
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
            proto::StartChecksumRequest {
                source: Some(file("/var/run/ferry/volumes/golden/disk.img")),
                options: Some(proto::ChecksumOptions {
                    algorithm: proto::HashAlgorithm::Sha256 as i32,
                    workers: 0,
                    request_size: 0,
                    threads: 2,
                    cache: proto::CacheMode::PageCache as i32,
                }),
                idempotency_key: "uid-1".into(),
                labels: BTreeMap::from([(OWNER_UID_LABEL.to_string(), "uid-1".to_string())]),
                priority: 0,
            }
        );
    }

    #[test]
    fn unset_options_are_wire_zeroes() {
        assert_eq!(transfer_options(None), proto::TransferOptions::default());
        assert_eq!(checksum_options(None), proto::ChecksumOptions::default());
        let o = transfer_options(Some(&TransferOptions {
            sparse_size: Some(0),
            order: Some(CommitOrder::InOrder),
            ..TransferOptions::default()
        }));
        assert_eq!(o.sparse_size, Some(0));
        assert_eq!(o.order, proto::CommitOrder::InOrder as i32);
    }

    /// Every field of a request reaches the wire: secret references as files, each
    /// option, every target, the checkpoint to resume from.
    #[test]
    fn requests_map_field_by_field() {
        let mut source = Endpoint::url("s3://b/k");
        source.s3 = Some(crate::crd::S3Options {
            region: Some("eu".into()),
            access_key_id: Some(secret("s3", "id")),
            secret_access_key: Some(secret("s3", "key")),
            ..crate::crd::S3Options::default()
        });
        let to = |name: &str| TransferTarget {
            endpoint: Endpoint::pvc(name),
            pvc_template: None,
        };
        let spec = TransferSpec {
            source,
            targets: vec![to("copy"), to("copy2")],
            options: Some(TransferOptions {
                workers: Some(4),
                order: Some(CommitOrder::InOrder),
                cache: Some(CacheMode::Direct),
                verify: Some(true),
                verify_algorithm: Some(HashAlgorithm::Sha256),
                ..TransferOptions::default()
            }),
            expected_digest: None,
            mover: None,
            claim_retention: None,
            clone_strategy: None,
            pvc_templates: None,
            fan_out: None,
            relay: None,
        };
        let t = stored(Transfer::new("x", spec));
        let pvcs = [
            ResolvedPvc::new("copy", VolumeMode::Block),
            ResolvedPvc::new("copy2", VolumeMode::Block),
        ];
        let checkpoint = Checkpoint::new(100, [(0, 10), (20, 30)]);
        let p = transfer_request(&t, &pvcs, &[0, 1], Some(&checkpoint)).unwrap();
        let Some(proto::endpoint::Options::S3(s3)) = p.source.as_ref().unwrap().options.clone()
        else {
            panic!("{p:?}")
        };
        assert_eq!(
            s3.secret_access_key.unwrap().source,
            Some(proto::secret_ref::Source::File("s3/key".into()))
        );
        let o = p.options.unwrap();
        assert_eq!(o.workers, 4);
        assert_eq!(o.order, proto::CommitOrder::InOrder as i32);
        assert_eq!(o.cache, proto::CacheMode::None as i32);
        assert!(o.verify);
        assert_eq!(o.verify_algorithm, proto::HashAlgorithm::Sha256 as i32);
        assert!(p.refuse_if_target_busy);
        assert_eq!(p.target.unwrap().url, "/dev/ferry/copy");
        assert_eq!(p.more_targets.len(), 1);
        assert_eq!(p.more_targets[0].url, "/dev/ferry/copy2");
        let resume = p.resume_from.unwrap();
        assert_eq!(resume.size, 100);
        assert_eq!(
            resume.committed,
            vec![
                proto::Range { start: 0, end: 10 },
                proto::Range { start: 20, end: 30 }
            ]
        );
        let c = checksum_options(Some(&ChecksumOptions {
            algorithm: Some(HashAlgorithm::Sha256),
            ..ChecksumOptions::default()
        }));
        assert_eq!(c.algorithm, proto::HashAlgorithm::Sha256 as i32);
    }
}
