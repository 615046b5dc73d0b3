//! The command line's option values: clap's `--cache` and `--order` values, and the
//! `--algorithm` and `--preallocation` parsers, shared by `ferry copy`, `ferry checksum`,
//! `ferry backup` and `ferry job start`. Each maps to the engine's or endpoints' type here;
//! to the wire, through ferry-api's one mapping.

use clap::ValueEnum;
use ferry_api::proto;
use ferry_core::size::parse_size;
use ferry_core::Error;
use ferry_endpoints::{CacheMode, Preallocation};
use ferry_engine::{CommitOrder, HashAlgorithm};

/// Default extension step of `--preallocation grow` on the command line (as QEMU's
/// preallocate filter).
pub const DEFAULT_GROW_STEP: u64 = 128 << 20;

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

/// `--algorithm`: `blkhash` or `sha256`.
pub fn algorithm(text: &str) -> std::result::Result<HashAlgorithm, String> {
    text.parse().map_err(|e: Error| e.message().to_string())
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

    /// Every command-line value reaches the wire as the engine value it names.
    #[test]
    fn values_map_to_the_wire() {
        for o in [Order::Auto, Order::InOrder, Order::OutOfOrder] {
            let order = CommitOrder::from(o);
            assert_eq!(
                ferry_api::options::commit_order(proto::CommitOrder::from(order) as i32).unwrap(),
                order
            );
        }
        for c in [Cache::Writeback, Cache::None] {
            assert_eq!(
                ferry_api::options::cache_mode(proto::CacheMode::from(c) as i32).unwrap(),
                CacheMode::from(c)
            );
        }
        for a in [HashAlgorithm::Blkhash, HashAlgorithm::Sha256] {
            assert_eq!(algorithm(a.as_str()), Ok(a));
        }
    }
}
