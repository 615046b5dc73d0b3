//! The custom resource kinds of group `ferry.dev`, version `v1alpha1` (one module per
//! kind, shared pieces beside them), and the CRD objects generated from them: the YAML
//! in deploy/crds.yaml is [`crds_yaml`]'s output, never edited by hand.

pub mod backup;
pub mod backup_repository;
pub mod backup_schedule;
pub mod checksum;
pub mod endpoint;
pub mod fan_out;
pub mod golden_image;
pub mod options;
pub mod restore;
pub mod secondary;
pub mod settings;
pub mod status;
pub mod storage_class_profile;
pub mod transfer;
pub mod validate;
pub mod volume_image_source;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use backup::{
    kept_snapshots, pruned_snapshots, Backup, BackupSpec, BackupStatus, MetadataLookup,
    MetadataService, Retention, MAX_KEPT_SNAPSHOTS, MAX_PRUNED_SNAPSHOTS,
};
pub use backup_repository::{
    BackupRepository, BackupRepositorySpec, BackupRepositoryStatus, Encryption,
};
pub use backup_schedule::{
    BackupSchedule, BackupScheduleSpec, BackupScheduleStatus, Consistency, CopyMethod, Freeze,
    Hook, OnError, Trigger, VolumeGroup,
};
pub use checksum::{Checksum, ChecksumSpec, ChecksumStatus};
pub use endpoint::{
    AccessMode, Endpoint, GoldenImageRef, HttpHeader, HttpOptions, IscsiOptions, NbdOptions,
    NfsOptions, PvcRef, PvcTemplate, RegistryOptions, S3Options, SecretKeyRef, TargetKey,
    TransferTarget, VolumeMode,
};
pub use fan_out::{FanOut, FanOutStatus, GroupRelay, GroupStatus, PvcTemplates};
pub use golden_image::{
    GoldenImage, GoldenImageSpec, GoldenImageStatus, ImportRecord, Importing, KeepAs,
};
pub use options::{
    CacheMode, ChecksumOptions, CommitOrder, HashAlgorithm, ImageFormat, Preallocation,
    TransferOptions,
};
pub use restore::{ResolvedSnapshot, Restore, RestoreSpec, RestoreStatus, SnapshotChoice};
pub use secondary::{RateLimitWindow, Secondary, SecondaryStatus};
pub use settings::MoverSettings;
pub use status::{Checkpoint, Phase, Progress};
pub use storage_class_profile::{CloneStrategy, StorageClassProfile, StorageClassProfileSpec};
pub use transfer::{ClaimRetention, Digests, TargetStatus, Transfer, TransferSpec, TransferStatus};
pub use validate::ValidationError;
pub use volume_image_source::{LatestBackupRef, VolumeImageSource, VolumeImageSourceSpec};

/// The API group of every kind.
pub const GROUP: &str = "ferry.dev";
/// The API version of every kind.
pub const VERSION: &str = "v1alpha1";

/// The CRD objects of every kind, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Transfer::crd(),
        Checksum::crd(),
        VolumeImageSource::crd(),
        BackupRepository::crd(),
        Backup::crd(),
        BackupSchedule::crd(),
        Restore::crd(),
        StorageClassProfile::crd(),
        GoldenImage::crd(),
    ]
}

/// The CRDs could not be written as YAML.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the CRDs as YAML: {0}")]
pub struct CrdYamlError(#[from] serde_yaml::Error);

/// Every CRD as one multi-document YAML stream, as `ferry operator crds` prints it and
/// deploy/crds.yaml holds it.
pub fn crds_yaml() -> Result<String, CrdYamlError> {
    let mut out = String::from(
        "# The ferry CustomResourceDefinitions, generated from the Rust types by\n\
         # `ferry operator crds`: do not edit; regenerate with\n\
         # cargo run -p ferry --bin ferry -- operator crds > deploy/crds.yaml\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
