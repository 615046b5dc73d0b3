//! A least-recently-used cache of L2 tables, bounded in bytes.
//!
//! Every lookup of a guest cluster needs its L2 table; over the network a table read per
//! request would double the round trips. Tables are kept decoded, keyed by host offset.
//! VMDK grain tables and the sector bitmaps of VHD/VHDX differencing images use it too
//! (a bitmap is a table of bytes).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// A decoded L2 table: its entries as big-endian words, in order.
pub type Table = Arc<Vec<u64>>;

#[derive(Debug)]
pub struct L2Cache<T = Vec<u64>> {
    inner: Mutex<Inner<T>>,
    table_bytes: usize,
    max_bytes: usize,
}

#[derive(Debug)]
struct Inner<T> {
    tables: HashMap<u64, (Arc<T>, u64)>,
    clock: u64,
}

impl<T> Default for Inner<T> {
    fn default() -> Self {
        Self {
            tables: HashMap::new(),
            clock: 0,
        }
    }
}

impl<T> L2Cache<T> {
    /// A cache of tables of `table_bytes` each, holding at most `max_bytes` of them
    /// (always at least one table).
    pub fn new(table_bytes: usize, max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            table_bytes,
            max_bytes,
        }
    }

    fn capacity(&self) -> usize {
        (self.max_bytes / self.table_bytes.max(1)).max(1)
    }

    pub fn get(&self, offset: u64) -> Option<Arc<T>> {
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let now = inner.clock;
        let (table, used) = inner.tables.get_mut(&offset)?;
        *used = now;
        Some(table.clone())
    }

    pub fn insert(&self, offset: u64, table: Arc<T>) {
        let capacity = self.capacity();
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let now = inner.clock;
        if !inner.tables.contains_key(&offset) && inner.tables.len() >= capacity {
            let oldest = inner
                .tables
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                inner.tables.remove(&oldest);
            }
        }
        inner.tables.insert(offset, (table, now));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().tables.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_within_the_byte_bound() {
        let cache: L2Cache = L2Cache::new(1024, 2048);
        cache.insert(1, Arc::new(vec![1]));
        cache.insert(2, Arc::new(vec![2]));
        assert!(cache.get(1).is_some());
        cache.insert(3, Arc::new(vec![3]));
        assert_eq!(cache.len(), 2);
        assert!(cache.get(2).is_none());
        assert_eq!(cache.get(1).unwrap()[0], 1);
        assert_eq!(cache.get(3).unwrap()[0], 3);
    }

    #[test]
    fn keeps_one_table_even_when_the_bound_is_smaller() {
        let cache: L2Cache = L2Cache::new(4096, 100);
        cache.insert(1, Arc::new(vec![1]));
        cache.insert(2, Arc::new(vec![2]));
        assert_eq!(cache.len(), 1);
        assert!(cache.get(2).is_some());
    }
}
