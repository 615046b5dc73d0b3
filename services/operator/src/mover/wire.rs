//! The custom resources' values on the wire: each CRD enum or option group maps to its
//! ferry-api (`ferry.v1`) value here, in exactly one function, so a new option or enum
//! value is added in one place and the requests of [`super::request`] and
//! [`super::backup_request`] only assemble these.
//!
//! Secret key references become `SecretRef{file}` names under the mover's
//! `--secrets-dir` (see [`super::layout`]): a request never carries a secret value.

use ferry_api::proto;

use super::layout;
use crate::crd::{
    CacheMode, Checkpoint, CommitOrder, HashAlgorithm, ImageFormat, Preallocation, RateLimitWindow,
    Retention, S3Options, SecretKeyRef,
};

/// `ImageFormat`.
pub fn image_format(f: ImageFormat) -> proto::ImageFormat {
    match f {
        ImageFormat::Auto => proto::ImageFormat::Auto,
        ImageFormat::Raw => proto::ImageFormat::Raw,
        ImageFormat::Qcow2 => proto::ImageFormat::Qcow2,
        ImageFormat::Gz => proto::ImageFormat::Gz,
        ImageFormat::Xz => proto::ImageFormat::Xz,
        ImageFormat::Zst => proto::ImageFormat::Zst,
    }
}

/// `CommitOrder`.
pub fn commit_order(o: CommitOrder) -> proto::CommitOrder {
    match o {
        CommitOrder::Auto => proto::CommitOrder::Auto,
        CommitOrder::InOrder => proto::CommitOrder::InOrder,
        CommitOrder::OutOfOrder => proto::CommitOrder::OutOfOrder,
    }
}

/// `Preallocation`.
pub fn preallocation(p: Preallocation) -> proto::Preallocation {
    match p {
        Preallocation::Off => proto::Preallocation::Off,
        Preallocation::Falloc => proto::Preallocation::Falloc,
        Preallocation::Full => proto::Preallocation::Full,
        Preallocation::Grow => proto::Preallocation::Grow,
    }
}

/// `CacheMode` (the CRD's `Direct` is the wire's `NONE`: no page cache).
pub fn cache_mode(c: CacheMode) -> proto::CacheMode {
    match c {
        CacheMode::PageCache => proto::CacheMode::PageCache,
        CacheMode::Direct => proto::CacheMode::None,
    }
}

/// `HashAlgorithm`.
pub fn hash_algorithm(a: HashAlgorithm) -> proto::HashAlgorithm {
    match a {
        HashAlgorithm::Blkhash => proto::HashAlgorithm::Blkhash,
        HashAlgorithm::Sha256 => proto::HashAlgorithm::Sha256,
    }
}

/// A Secret key as the file the mover reads it from.
pub fn secret_ref(r: &SecretKeyRef) -> proto::SecretRef {
    proto::SecretRef {
        source: Some(proto::secret_ref::Source::File(layout::secret_file(r))),
    }
}

/// `S3Options` of an S3 endpoint or repository.
pub fn s3_options(s3: &S3Options) -> proto::S3Options {
    proto::S3Options {
        endpoint_url: s3.endpoint_url.clone().unwrap_or_default(),
        region: s3.region.clone().unwrap_or_default(),
        access_key_id: s3.access_key_id.as_ref().map(secret_ref),
        secret_access_key: s3.secret_access_key.as_ref().map(secret_ref),
        session_token: s3.session_token.as_ref().map(secret_ref),
        force_path_style: s3.force_path_style.unwrap_or(false),
    }
}

/// The keep rules of a prune; a rule left out is 0 (off), as on the wire.
pub fn retention(r: &Retention) -> proto::Retention {
    let count = |n: Option<u32>| i32::try_from(n.unwrap_or(0)).unwrap_or(i32::MAX);
    proto::Retention {
        keep_last: count(r.last),
        keep_hourly: count(r.hourly),
        keep_daily: count(r.daily),
        keep_weekly: count(r.weekly),
        keep_monthly: count(r.monthly),
        keep_yearly: count(r.yearly),
        keep_within: r.within.clone().unwrap_or_default(),
    }
}

/// A bandwidth window of a secondary repository.
pub fn rate_limit_window(w: &RateLimitWindow) -> proto::RateLimitWindow {
    proto::RateLimitWindow {
        days: w.days.clone(),
        start: w.start.clone(),
        end: w.end.clone(),
        time_zone: w.time_zone.clone().unwrap_or_default(),
    }
}

/// The committed ranges a copy resumes from (`StartTransferRequest.resume_from`).
pub fn checkpoint(c: &Checkpoint) -> proto::Checkpoint {
    proto::Checkpoint {
        size: c.size,
        committed: c
            .committed
            .iter()
            .map(|&[start, end]| proto::Range { start, end })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    fn file(name: &str) -> proto::SecretRef {
        proto::SecretRef {
            source: Some(proto::secret_ref::Source::File(name.into())),
        }
    }

    #[test]
    fn enums_map_value_by_value() {
        assert_eq!(image_format(ImageFormat::Auto), proto::ImageFormat::Auto);
        assert_eq!(image_format(ImageFormat::Qcow2), proto::ImageFormat::Qcow2);
        assert_eq!(image_format(ImageFormat::Zst), proto::ImageFormat::Zst);
        assert_eq!(
            commit_order(CommitOrder::InOrder),
            proto::CommitOrder::InOrder
        );
        assert_eq!(
            commit_order(CommitOrder::OutOfOrder),
            proto::CommitOrder::OutOfOrder
        );
        assert_eq!(preallocation(Preallocation::Off), proto::Preallocation::Off);
        assert_eq!(
            preallocation(Preallocation::Grow),
            proto::Preallocation::Grow
        );
        assert_eq!(cache_mode(CacheMode::Direct), proto::CacheMode::None);
        assert_eq!(
            cache_mode(CacheMode::PageCache),
            proto::CacheMode::PageCache
        );
        assert_eq!(
            hash_algorithm(HashAlgorithm::Sha256),
            proto::HashAlgorithm::Sha256
        );
        // The CRD's defaults are the wire's zero values: a field left out means the same.
        assert_eq!(image_format(ImageFormat::default()) as i32, 0);
        assert_eq!(commit_order(CommitOrder::default()) as i32, 0);
        assert_eq!(preallocation(Preallocation::default()) as i32, 0);
        assert_eq!(cache_mode(CacheMode::default()) as i32, 0);
        assert_eq!(hash_algorithm(HashAlgorithm::default()) as i32, 0);
    }

    #[test]
    fn s3_credentials_become_secret_files() {
        let s3 = S3Options {
            region: Some("eu-west-1".into()),
            access_key_id: Some(secret("s3", "id")),
            secret_access_key: Some(secret("s3", "key")),
            force_path_style: Some(true),
            ..S3Options::default()
        };
        assert_eq!(
            s3_options(&s3),
            proto::S3Options {
                endpoint_url: String::new(),
                region: "eu-west-1".into(),
                access_key_id: Some(file("s3/id")),
                secret_access_key: Some(file("s3/key")),
                session_token: None,
                force_path_style: true,
            }
        );
    }

    #[test]
    fn retention_rules_left_out_are_off() {
        let r = Retention {
            daily: Some(7),
            yearly: Some(u32::MAX),
            within: Some("2d".into()),
            ..Retention::default()
        };
        assert_eq!(
            retention(&r),
            proto::Retention {
                keep_daily: 7,
                keep_yearly: i32::MAX,
                keep_within: "2d".into(),
                ..proto::Retention::default()
            }
        );
    }

    #[test]
    fn a_checkpoint_keeps_its_ranges() {
        let c = Checkpoint::new(100, [(0, 10), (20, 30)]);
        assert_eq!(
            checkpoint(&c),
            proto::Checkpoint {
                size: 100,
                committed: vec![
                    proto::Range { start: 0, end: 10 },
                    proto::Range { start: 20, end: 30 }
                ],
            }
        );
    }
}
