//! The one mapping between the wire's option enums (`ferry.v1`) and the engine's, endpoints'
//! and formats' option types (`CommitOrder`, `CacheMode`, `Preallocation`, `HashAlgorithm`,
//! `SourceFormat`, retention): the job service turns wire values into options here, and every client
//! (the `ferry` command line, the operator) turns options into wire values here, so a new
//! mode is added in one place.

use ferry_backup::{CalendarDuration, Keep, KeepPolicy};
use ferry_core::{Error, Result};
use ferry_endpoints::{CacheMode, Preallocation};
use ferry_engine::{CommitOrder, HashAlgorithm};
use ferry_formats::SourceFormat;

use crate::proto;

/// Extension step of `PREALLOCATION_GROW` when a request leaves `preallocation_step` 0
/// (documented in jobs.proto).
pub const API_DEFAULT_GROW_STEP: u64 = 64 << 20;

fn invalid(message: String) -> Error {
    Error::invalid_input(message)
}

impl From<CacheMode> for proto::CacheMode {
    fn from(cache: CacheMode) -> Self {
        match cache {
            CacheMode::PageCache => proto::CacheMode::PageCache,
            CacheMode::Direct => proto::CacheMode::None,
        }
    }
}

/// The cache mode of a wire value.
pub fn cache_mode(v: i32) -> Result<CacheMode> {
    match proto::CacheMode::try_from(v) {
        Ok(proto::CacheMode::PageCache) => Ok(CacheMode::PageCache),
        Ok(proto::CacheMode::None) => Ok(CacheMode::Direct),
        Err(_) => Err(invalid(format!("cache mode {v} is not a CacheMode"))),
    }
}

impl From<CommitOrder> for proto::CommitOrder {
    fn from(order: CommitOrder) -> Self {
        match order {
            CommitOrder::Auto => proto::CommitOrder::Auto,
            CommitOrder::InOrder => proto::CommitOrder::InOrder,
            CommitOrder::OutOfOrder => proto::CommitOrder::OutOfOrder,
        }
    }
}

/// The commit order of a wire value.
pub fn commit_order(v: i32) -> Result<CommitOrder> {
    match proto::CommitOrder::try_from(v) {
        Ok(proto::CommitOrder::Auto) => Ok(CommitOrder::Auto),
        Ok(proto::CommitOrder::InOrder) => Ok(CommitOrder::InOrder),
        Ok(proto::CommitOrder::OutOfOrder) => Ok(CommitOrder::OutOfOrder),
        Err(_) => Err(invalid(format!("order {v} is not a CommitOrder"))),
    }
}

impl From<HashAlgorithm> for proto::HashAlgorithm {
    fn from(algorithm: HashAlgorithm) -> Self {
        match algorithm {
            HashAlgorithm::Blkhash => proto::HashAlgorithm::Blkhash,
            HashAlgorithm::Sha256 => proto::HashAlgorithm::Sha256,
        }
    }
}

/// The digest algorithm of a wire value.
pub fn hash_algorithm(v: i32) -> Result<HashAlgorithm> {
    match proto::HashAlgorithm::try_from(v) {
        Ok(proto::HashAlgorithm::Blkhash) => Ok(HashAlgorithm::Blkhash),
        Ok(proto::HashAlgorithm::Sha256) => Ok(HashAlgorithm::Sha256),
        Err(_) => Err(invalid(format!("algorithm {v} is not a HashAlgorithm"))),
    }
}

/// The source format of a wire value.
pub fn source_format(v: i32) -> Result<SourceFormat> {
    match proto::ImageFormat::try_from(v) {
        Ok(proto::ImageFormat::Auto) => Ok(SourceFormat::Auto),
        Ok(proto::ImageFormat::Raw) => Ok(SourceFormat::Raw),
        Ok(proto::ImageFormat::Qcow2) => Ok(SourceFormat::Qcow2),
        Ok(proto::ImageFormat::Gz) => Ok(SourceFormat::Gzip),
        Ok(proto::ImageFormat::Xz) => Ok(SourceFormat::Xz),
        Ok(proto::ImageFormat::Zst) => Ok(SourceFormat::Zstd),
        Ok(proto::ImageFormat::Vmdk) => Ok(SourceFormat::Vmdk),
        Ok(proto::ImageFormat::Ova) => Ok(SourceFormat::Ova),
        Ok(proto::ImageFormat::Vhd) => Ok(SourceFormat::Vhd),
        Ok(proto::ImageFormat::Vhdx) => Ok(SourceFormat::Vhdx),
        Ok(proto::ImageFormat::Vdi) => Ok(SourceFormat::Vdi),
        Err(_) => Err(invalid(format!("format {v} is not an ImageFormat"))),
    }
}

impl From<SourceFormat> for proto::ImageFormat {
    fn from(format: SourceFormat) -> Self {
        match format {
            SourceFormat::Auto => proto::ImageFormat::Auto,
            SourceFormat::Raw => proto::ImageFormat::Raw,
            SourceFormat::Qcow2 => proto::ImageFormat::Qcow2,
            SourceFormat::Gzip => proto::ImageFormat::Gz,
            SourceFormat::Xz => proto::ImageFormat::Xz,
            SourceFormat::Zstd => proto::ImageFormat::Zst,
            SourceFormat::Vmdk => proto::ImageFormat::Vmdk,
            SourceFormat::Ova => proto::ImageFormat::Ova,
            SourceFormat::Vhd => proto::ImageFormat::Vhd,
            SourceFormat::Vhdx => proto::ImageFormat::Vhdx,
            SourceFormat::Vdi => proto::ImageFormat::Vdi,
        }
    }
}

/// The wire form of a preallocation: the mode and its `preallocation_step`.
pub fn preallocation_to_proto(p: Preallocation) -> (proto::Preallocation, u64) {
    match p {
        Preallocation::Off => (proto::Preallocation::Off, 0),
        Preallocation::Falloc => (proto::Preallocation::Falloc, 0),
        Preallocation::Full => (proto::Preallocation::Full, 0),
        Preallocation::Grow { step } => (proto::Preallocation::Grow, step),
    }
}

/// The preallocation of a wire mode and step (step 0: [`API_DEFAULT_GROW_STEP`]).
pub fn preallocation_from_proto(v: i32, step: u64) -> Result<Preallocation> {
    Ok(match proto::Preallocation::try_from(v) {
        Ok(proto::Preallocation::Off) => Preallocation::Off,
        Ok(proto::Preallocation::Falloc) => Preallocation::Falloc,
        Ok(proto::Preallocation::Full) => Preallocation::Full,
        Ok(proto::Preallocation::Grow) => Preallocation::Grow {
            step: if step == 0 {
                API_DEFAULT_GROW_STEP
            } else {
                step
            },
        },
        Err(_) => return Err(invalid(format!("preallocation {v} is not a Preallocation"))),
    })
}

fn keep(what: &str, n: i32) -> Result<Option<Keep>> {
    match n {
        0 => Ok(None),
        -1 => Ok(Some(Keep::All)),
        n if n > 0 => Ok(Some(Keep::Count(n as u32))),
        n => Err(invalid(format!(
            "{what} {n}: a count, 0 (off) or -1 (keep all)"
        ))),
    }
}

/// The retention policy of a wire `Retention` (`what` names the field in errors); at least
/// one rule must be on, so that a prune never deletes every backup.
pub fn retention_from_proto(what: &str, r: Option<&proto::Retention>) -> Result<KeepPolicy> {
    let r = r.ok_or_else(|| invalid(format!("{what} is missing: give at least one keep rule")))?;
    let mut policy = KeepPolicy::new();
    policy.last = keep(&format!("{what}.keep_last"), r.keep_last)?;
    policy.hourly = keep(&format!("{what}.keep_hourly"), r.keep_hourly)?;
    policy.daily = keep(&format!("{what}.keep_daily"), r.keep_daily)?;
    policy.weekly = keep(&format!("{what}.keep_weekly"), r.keep_weekly)?;
    policy.monthly = keep(&format!("{what}.keep_monthly"), r.keep_monthly)?;
    policy.yearly = keep(&format!("{what}.keep_yearly"), r.keep_yearly)?;
    if !r.keep_within.is_empty() {
        let within: CalendarDuration = r
            .keep_within
            .parse()
            .map_err(|e: Error| invalid(format!("{what}.keep_within: {}", e.message())))?;
        if !within.is_zero() {
            policy.within = Some(within);
        }
    }
    if policy.is_empty() {
        return Err(invalid(format!(
            "{what} keeps nothing: set at least one keep rule (a prune would delete every backup)"
        )));
    }
    Ok(policy)
}

/// The wire form of a retention policy: 0 leaves a rule off, -1 keeps every one.
pub fn retention_to_proto(policy: &KeepPolicy) -> proto::Retention {
    let count = |k: Option<Keep>| match k {
        None => 0,
        Some(Keep::All) => -1,
        Some(Keep::Count(n)) => i32::try_from(n).unwrap_or(i32::MAX),
    };
    proto::Retention {
        keep_last: count(policy.last),
        keep_hourly: count(policy.hourly),
        keep_daily: count(policy.daily),
        keep_weekly: count(policy.weekly),
        keep_monthly: count(policy.monthly),
        keep_yearly: count(policy.yearly),
        keep_within: policy.within.map(|w| w.to_string()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::ZeroMode;

    #[test]
    fn retention_rules_are_checked_by_field() {
        let r = |f: fn(&mut proto::Retention)| {
            let mut r = proto::Retention::default();
            f(&mut r);
            retention_from_proto("retention", Some(&r))
        };
        assert!(r(|_| {}).unwrap_err().to_string().contains("keeps nothing"));
        let e = r(|r| r.keep_weekly = -2).unwrap_err();
        assert!(e.to_string().contains("retention.keep_weekly"), "{e}");
        let e = r(|r| r.keep_within = "3x".into()).unwrap_err();
        assert!(e.to_string().contains("retention.keep_within"), "{e}");
        let p = r(|r| {
            r.keep_last = -1;
            r.keep_within = "1y2m".into();
        })
        .unwrap();
        assert_eq!(p.last, Some(Keep::All));
        assert_eq!(p.within.unwrap().months, 2);
        assert!(retention_from_proto("retention", None).is_err());
    }

    #[test]
    fn retention_round_trips() {
        let policy = KeepPolicy::new()
            .with_last(Keep::All)
            .with_daily(Keep::Count(7))
            .with_within("1y2m".parse().unwrap());
        let wire = retention_to_proto(&policy);
        assert_eq!(wire.keep_last, -1);
        assert_eq!(wire.keep_daily, 7);
        assert_eq!(wire.keep_hourly, 0);
        assert_eq!(
            retention_from_proto("retention", Some(&wire)).unwrap(),
            policy
        );
    }

    /// Every engine or endpoint value survives the trip to the wire and back.
    #[test]
    fn wire_round_trips() {
        for c in [CacheMode::PageCache, CacheMode::Direct] {
            assert_eq!(cache_mode(proto::CacheMode::from(c) as i32).unwrap(), c);
        }
        for order in [
            CommitOrder::Auto,
            CommitOrder::InOrder,
            CommitOrder::OutOfOrder,
        ] {
            assert_eq!(
                commit_order(proto::CommitOrder::from(order) as i32).unwrap(),
                order
            );
        }
        for a in [HashAlgorithm::Blkhash, HashAlgorithm::Sha256] {
            assert_eq!(
                hash_algorithm(proto::HashAlgorithm::from(a) as i32).unwrap(),
                a
            );
        }
        for f in [
            SourceFormat::Auto,
            SourceFormat::Raw,
            SourceFormat::Qcow2,
            SourceFormat::Gzip,
            SourceFormat::Xz,
            SourceFormat::Zstd,
            SourceFormat::Vmdk,
            SourceFormat::Ova,
            SourceFormat::Vhd,
            SourceFormat::Vhdx,
            SourceFormat::Vdi,
        ] {
            assert_eq!(
                source_format(proto::ImageFormat::from(f) as i32).unwrap(),
                f
            );
        }
        for p in [
            Preallocation::Off,
            Preallocation::Falloc,
            Preallocation::Full,
            Preallocation::Grow { step: 3 << 20 },
        ] {
            let (mode, step) = preallocation_to_proto(p);
            assert_eq!(preallocation_from_proto(mode as i32, step).unwrap(), p);
        }
        assert_eq!(
            preallocation_from_proto(proto::Preallocation::Grow as i32, 0).unwrap(),
            Preallocation::Grow {
                step: API_DEFAULT_GROW_STEP
            }
        );
        assert!(cache_mode(9).is_err());
        assert!(commit_order(9).is_err());
        assert!(hash_algorithm(9).is_err());
        assert!(source_format(99).is_err());
        assert!(preallocation_from_proto(9, 0).is_err());
        assert_eq!(Preallocation::Full.zero_mode(), ZeroMode::Allocate);
        assert_eq!(Preallocation::Off.zero_mode(), ZeroMode::MayDeallocate);
    }
}
