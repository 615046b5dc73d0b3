//! One mapping of the option enums between the command line (clap values), the wire
//! (`ferry.v1` enums) and the engine, endpoints and formats (`CommitOrder`, `CacheMode`,
//! `Preallocation`, `HashAlgorithm`, `SourceFormat`).
//!
//! `ferry copy`, `ferry checksum` and `ferry job start` parse with the same values and
//! parsers; the job service turns wire values into engine and endpoint options here, and
//! `ferry job` turns its flags into wire values here, so a new mode is added in one place.

use clap::ValueEnum;
use ferry_core::size::parse_size;
use ferry_core::{Error, Result, ZeroMode};
use ferry_endpoints::{CacheMode, Preallocation};
use ferry_engine::{CommitOrder, HashAlgorithm};
use ferry_formats::SourceFormat;

use crate::service::proto;

/// Default extension step of `--preallocation grow` on the command line (as QEMU's
/// preallocate filter).
pub const DEFAULT_GROW_STEP: u64 = 128 << 20;
/// Extension step of `PREALLOCATION_GROW` when a request leaves `preallocation_step` 0
/// (documented in jobs.proto).
pub const API_DEFAULT_GROW_STEP: u64 = 64 << 20;

fn invalid(message: String) -> Error {
    Error::invalid_input(message)
}

/// `--cache`: how file I/O goes through the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Cache {
    /// Through the page cache.
    #[default]
    Writeback,
    /// Direct I/O (O_DIRECT), bypassing the page cache.
    None,
}

impl From<Cache> for CacheMode {
    fn from(cache: Cache) -> Self {
        match cache {
            Cache::Writeback => CacheMode::PageCache,
            Cache::None => CacheMode::Direct,
        }
    }
}

impl From<Cache> for proto::CacheMode {
    fn from(cache: Cache) -> Self {
        CacheMode::from(cache).into()
    }
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

/// `--order`: the commit order of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Order {
    Auto,
    InOrder,
    OutOfOrder,
}

impl From<Order> for CommitOrder {
    fn from(order: Order) -> Self {
        match order {
            Order::Auto => CommitOrder::Auto,
            Order::InOrder => CommitOrder::InOrder,
            Order::OutOfOrder => CommitOrder::OutOfOrder,
        }
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

/// `--algorithm`: `blkhash` or `sha256`.
pub fn algorithm(text: &str) -> std::result::Result<HashAlgorithm, String> {
    text.parse().map_err(|e: Error| e.message().to_string())
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
        }
    }
}

/// `--preallocation`: `off`, `falloc`, `full`, `grow` or `grow=STEP`.
pub fn preallocation(text: &str) -> std::result::Result<Preallocation, String> {
    match text.split_once('=') {
        None => match text {
            "off" => Ok(Preallocation::Off),
            "falloc" => Ok(Preallocation::Falloc),
            "full" => Ok(Preallocation::Full),
            "grow" => Ok(Preallocation::Grow {
                step: DEFAULT_GROW_STEP,
            }),
            _ => Err(format!(
                "unknown preallocation '{text}': expected off, falloc, full, grow or grow=STEP"
            )),
        },
        Some(("grow", step)) => match parse_size(step).map_err(|e| e.message().to_string())? {
            0 => Err("grow step must be at least 1M".to_string()),
            step => Ok(Preallocation::Grow { step }),
        },
        Some(_) => Err(format!(
            "unknown preallocation '{text}': only grow takes a step (grow=STEP)"
        )),
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

/// How a copy writes zeroes into a target preallocated this way: a preallocated target
/// must stay allocated, so zeroes may not punch holes into it.
pub fn zero_mode(p: Preallocation) -> ZeroMode {
    match p {
        Preallocation::Falloc | Preallocation::Full => ZeroMode::Allocate,
        _ => ZeroMode::MayDeallocate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preallocation_modes() {
        assert_eq!(preallocation("off"), Ok(Preallocation::Off));
        assert_eq!(preallocation("falloc"), Ok(Preallocation::Falloc));
        assert_eq!(preallocation("full"), Ok(Preallocation::Full));
        assert_eq!(
            preallocation("grow"),
            Ok(Preallocation::Grow {
                step: DEFAULT_GROW_STEP
            })
        );
        assert_eq!(
            preallocation("grow=64M"),
            Ok(Preallocation::Grow { step: 64 << 20 })
        );
        assert!(preallocation("grow=0").is_err());
        assert!(preallocation("full=1M").is_err());
        assert!(preallocation("sometimes").is_err());
    }

    /// Every engine or endpoint value survives the trip to the wire and back.
    #[test]
    fn wire_round_trips() {
        for c in [CacheMode::PageCache, CacheMode::Direct] {
            assert_eq!(cache_mode(proto::CacheMode::from(c) as i32).unwrap(), c);
        }
        for o in [Order::Auto, Order::InOrder, Order::OutOfOrder] {
            let order = CommitOrder::from(o);
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
            assert_eq!(algorithm(a.as_str()), Ok(a));
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
        assert!(preallocation_from_proto(9, 0).is_err());
        assert_eq!(zero_mode(Preallocation::Full), ZeroMode::Allocate);
        assert_eq!(zero_mode(Preallocation::Off), ZeroMode::MayDeallocate);
    }
}
