//! Request geometry: the alignment, request size, zero granularity, work unit and
//! per-worker window a copy uses, derived once from the options and both endpoints'
//! block-size limits so every later step can simply trust them.

use ferry_core::{Caps, Error, Result};

use crate::options::{
    CopyOptions, DEFAULT_BYTES_PER_WORKER, DEFAULT_REQUESTS_PER_WORKER, DEFAULT_REQUEST_SIZE,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Image size.
    pub size: u64,
    /// Every request starts on and is a multiple of this (except at the image end).
    pub align: u64,
    /// Largest read or write request, and the capacity of every buffer.
    pub request: usize,
    /// Zero-detection block (a multiple of `align`), 0 when zero detection is off.
    pub sparse: usize,
    /// Work unit (a multiple of `align` and `sparse`).
    pub unit: u64,
    /// Workers actually started.
    pub workers: usize,
    /// Requests each worker keeps in flight.
    pub window: usize,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> Result<u64> {
    (a / gcd(a, b))
        .checked_mul(b)
        .ok_or_else(|| Error::invalid_input("block sizes have no common multiple"))
}

pub(crate) fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to).saturating_mul(to)
}

pub(crate) fn round_down(x: u64, to: u64) -> u64 {
    x / to * to
}

/// The largest read request of at most `wanted` bytes that a source with these caps takes:
/// a multiple of its minimum block, no larger than its maximum, at least one minimum
/// block. For readers outside the copy (a backup reading chunks) that must size requests
/// as the copy does.
pub fn read_request_size(caps: &Caps, wanted: u64) -> u64 {
    let align = u64::from(caps.block.minimum.max(1));
    let max_request = round_down(u64::from(caps.block.maximum), align).max(align);
    round_down(wanted.min(max_request), align).max(align)
}

/// The request size when the caller chose none: the larger endpoint preference wins,
/// because the side that pays a round trip per request gains far more from large
/// requests than a local side loses.
fn preferred_request_size(source: &Caps, target: &Caps) -> usize {
    [source.request_size, target.request_size]
        .into_iter()
        .flatten()
        .map(|size| size as usize)
        .fold(DEFAULT_REQUEST_SIZE, usize::max)
}

impl Geometry {
    pub fn new(size: u64, source: Caps, target: Caps, options: &CopyOptions) -> Result<Self> {
        let align = lcm(
            u64::from(source.block.minimum.max(1)),
            u64::from(target.block.minimum.max(1)),
        )?;
        let max_request = round_down(
            u64::from(source.block.maximum.min(target.block.maximum)),
            align,
        );
        if max_request < align {
            return Err(Error::invalid_input(format!(
                "incompatible block sizes: requests must be multiples of {align} bytes \
                 but at most {} (source) and {} (target) bytes",
                source.block.maximum, target.block.maximum
            )));
        }
        let sparse = if options.sparse_size == 0 {
            0
        } else {
            round_up(options.sparse_size as u64, align)
        };
        let wanted = options
            .request_size
            .unwrap_or_else(|| preferred_request_size(&source, &target));
        let mut request = round_down((wanted as u64).min(max_request), align).max(align);
        if sparse > 0 && request >= sparse {
            request = round_down(request, lcm(align, sparse)?).max(align);
        }
        let mut workers = options.workers;
        let window = match options.max_in_flight_bytes {
            None => {
                (DEFAULT_BYTES_PER_WORKER / request as usize).clamp(1, DEFAULT_REQUESTS_PER_WORKER)
            }
            Some(budget) => {
                let budget = budget as u64;
                if budget < align {
                    return Err(Error::invalid_input(format!(
                        "max in-flight bytes {budget} is smaller than the {align}-byte \
                         minimum request of these endpoints"
                    )));
                }
                let per_worker = budget / workers as u64;
                if per_worker < request {
                    request = round_down(per_worker, align);
                    if request < align {
                        request = align;
                        workers = (budget / align) as usize;
                    }
                }
                (budget / workers as u64 / request) as usize
            }
        };
        let unit_grain = if sparse > 0 {
            lcm(align, sparse)?
        } else {
            align
        };
        let wanted_unit = match source.work_unit {
            Some(most) => options.work_unit.min(most),
            None => options.work_unit,
        };
        let unit = round_up(wanted_unit.max(1), unit_grain);
        let (workers, window) = if source.sequential_read {
            (1, 1)
        } else {
            (workers, window)
        };
        Ok(Self {
            size,
            align,
            request: usize::try_from(request)
                .map_err(|_| Error::invalid_input("request size does not fit in memory"))?,
            sparse: sparse as usize,
            unit,
            workers: workers.max(1),
            window: window.max(1),
        })
    }

    /// Upper bound of the bytes held in buffers at once.
    #[cfg(test)]
    pub fn buffer_bytes(&self) -> u64 {
        (self.workers * self.window * self.request) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_requests_fit_the_source_blocks() {
        let mut caps = Caps::default();
        caps.block.minimum = 4096;
        caps.block.maximum = 1_000_000;
        assert_eq!(read_request_size(&caps, 4 << 20), 999_424);
        assert_eq!(read_request_size(&caps, 10_000), 8192);
        assert_eq!(read_request_size(&caps, 1), 4096);
        caps.block.maximum = 100;
        assert_eq!(read_request_size(&caps, 4 << 20), 4096);
        assert_eq!(read_request_size(&Caps::default(), 4 << 20), 4 << 20);
    }
    use ferry_core::BlockSizes;

    fn caps(minimum: u32, maximum: u32) -> Caps {
        Caps {
            block: BlockSizes {
                minimum,
                preferred: minimum,
                maximum,
            },
            ..Caps::default()
        }
    }

    #[test]
    fn a_source_may_ask_for_smaller_work_units() {
        let defaults = CopyOptions::default();
        let hinted = Caps {
            work_unit: Some(8 << 20),
            ..Caps::default()
        };
        let g = Geometry::new(1 << 30, hinted, Caps::default(), &defaults).unwrap();
        assert_eq!(g.unit, 8 << 20);
        let g = Geometry::new(1 << 30, Caps::default(), hinted, &defaults).unwrap();
        assert_eq!(g.unit, crate::options::DEFAULT_WORK_UNIT, "a target's hint");
        let small = CopyOptions {
            work_unit: 1 << 20,
            ..CopyOptions::default()
        };
        let g = Geometry::new(1 << 30, hinted, Caps::default(), &small).unwrap();
        assert_eq!(g.unit, 1 << 20, "the smaller of the two");
    }

    #[test]
    fn defaults() {
        let g = Geometry::new(
            1 << 30,
            Caps::default(),
            Caps::default(),
            &CopyOptions::default(),
        )
        .unwrap();
        assert_eq!(g.align, 1);
        assert_eq!(g.request, 256 << 10);
        assert_eq!(g.sparse, 4096);
        assert_eq!(g.workers, 8);
        assert_eq!(g.window, DEFAULT_REQUESTS_PER_WORKER);
    }

    #[test]
    fn respects_both_endpoints_limits() {
        let opts = CopyOptions {
            sparse_size: 1000,
            ..CopyOptions::default()
        };
        let g = Geometry::new(1 << 30, caps(512, 24 * 1024), caps(4096, 1 << 20), &opts).unwrap();
        assert_eq!(g.align, 4096);
        assert_eq!(g.request, 24 * 1024);
        assert_eq!(g.sparse, 4096);
        assert_eq!(g.unit % 4096, 0);
        let err = Geometry::new(1, caps(4096, 2048), Caps::default(), &opts).unwrap_err();
        assert!(
            err.to_string().contains("incompatible block sizes"),
            "{err}"
        );
    }

    #[test]
    fn a_sequential_source_is_read_by_one_worker_one_request_at_a_time() {
        let stream = Caps {
            sequential_read: true,
            ..Caps::default()
        };
        let g = Geometry::new(1 << 30, stream, Caps::default(), &CopyOptions::default()).unwrap();
        assert_eq!((g.workers, g.window), (1, 1));
    }

    #[test]
    fn endpoint_request_size_preference() {
        let network = |size| Caps {
            request_size: Some(size),
            ..Caps::default()
        };
        let defaults = CopyOptions::default();
        let g = Geometry::new(1 << 30, Caps::default(), network(1 << 20), &defaults).unwrap();
        assert_eq!(g.request, 1 << 20, "the larger preference wins");
        let g = Geometry::new(1 << 30, network(2 << 20), network(1 << 20), &defaults).unwrap();
        assert_eq!(g.request, 2 << 20);
        assert_eq!(g.window, DEFAULT_REQUESTS_PER_WORKER);
        let g = Geometry::new(1 << 30, network(8 << 20), Caps::default(), &defaults).unwrap();
        assert_eq!(g.request, 8 << 20);
        assert_eq!(g.window, 2, "large requests: fewer in flight per worker");
        assert!(g.buffer_bytes() <= (g.workers * DEFAULT_BYTES_PER_WORKER) as u64);
        let g = Geometry::new(1 << 30, network(4096), Caps::default(), &defaults).unwrap();
        assert_eq!(g.request, DEFAULT_REQUEST_SIZE, "never below the default");
        let mut small_max = caps(512, 64 * 1024);
        small_max.request_size = Some(1 << 20);
        let g = Geometry::new(1 << 30, small_max, Caps::default(), &defaults).unwrap();
        assert_eq!(g.request, 64 * 1024, "clamped to the block-size maximum");
        let chosen = CopyOptions {
            request_size: Some(64 * 1024),
            ..CopyOptions::default()
        };
        let g = Geometry::new(1 << 30, network(1 << 20), network(1 << 20), &chosen).unwrap();
        assert_eq!(g.request, 64 * 1024, "the caller's choice overrides");
    }

    #[test]
    fn memory_budget_bounds_buffers() {
        for budget in [1usize, 4096, 100_000, 3 << 20, 64 << 20] {
            let opts = CopyOptions {
                max_in_flight_bytes: Some(budget),
                ..CopyOptions::default()
            };
            let g = Geometry::new(1 << 30, Caps::default(), Caps::default(), &opts).unwrap();
            assert!(g.buffer_bytes() <= budget as u64, "{budget}: {g:?}");
        }
        let opts = CopyOptions {
            max_in_flight_bytes: Some(100),
            ..CopyOptions::default()
        };
        assert!(Geometry::new(1, caps(512, 1 << 20), Caps::default(), &opts).is_err());
    }
}
