//! Reused request slots and buffers: no allocation per request.
//!
//! A copy worker owns a fixed number of slots; a request holds one from planning until
//! its writes complete, so the slot count is the worker's request cap and the buffers in
//! the slots are its share of the memory bound. Buffers are allocated the first time a
//! slot reads (an all-zero image never allocates one) and reused afterwards.

use ferry_core::IoBuf;
use parking_lot::Mutex;

use crate::zero::Run;

/// What one in-flight request owns.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    buf: Option<IoBuf>,
    /// Zero/data runs of the last read, kept to reuse the allocation.
    pub runs: Vec<Run>,
}

impl Slot {
    /// The slot's buffer, viewing its first `len` bytes, allocated with `capacity` bytes
    /// on first use.
    pub fn take_buf(&mut self, capacity: usize, len: usize) -> IoBuf {
        let mut buf = self.buf.take().unwrap_or_else(|| IoBuf::new(capacity));
        buf.set_len(len);
        buf
    }

    pub fn put_buf(&mut self, buf: IoBuf) {
        self.buf = Some(buf);
    }
}

/// A worker's slots. Not shared: each worker owns its own, so taking one never locks.
#[derive(Debug)]
pub(crate) struct SlotPool {
    free: Vec<Slot>,
}

impl SlotPool {
    pub fn new(slots: usize) -> Self {
        Self {
            free: (0..slots).map(|_| Slot::default()).collect(),
        }
    }

    pub fn take(&mut self) -> Option<Slot> {
        self.free.pop()
    }

    pub fn put(&mut self, slot: Slot) {
        self.free.push(slot);
    }

    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }
}

/// Buffers shared by the concurrent reads of one checksum.
#[derive(Debug)]
pub(crate) struct BufPool {
    free: Mutex<Vec<IoBuf>>,
    capacity: usize,
}

impl BufPool {
    pub fn new(capacity: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            capacity,
        }
    }

    /// A buffer viewing its first `len` bytes (`len` at most the pool's capacity).
    pub fn get(&self, len: usize) -> IoBuf {
        let mut buf = self
            .free
            .lock()
            .pop()
            .unwrap_or_else(|| IoBuf::new(self.capacity));
        buf.set_len(len);
        buf
    }

    pub fn put(&self, buf: IoBuf) {
        self.free.lock().push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_bound_requests_and_reuse_buffers() {
        let mut pool = SlotPool::new(2);
        let mut a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert!(pool.take().is_none() && !pool.has_free());
        let buf = a.take_buf(4096, 100);
        let ptr = buf.full().as_ptr();
        assert_eq!(buf.len(), 100);
        a.put_buf(buf);
        pool.put(a);
        pool.put(b);
        let mut slots = [pool.take().unwrap(), pool.take().unwrap()];
        let reused = slots
            .iter_mut()
            .any(|s| s.buf.as_ref().is_some_and(|b| b.full().as_ptr() == ptr));
        assert!(reused);
    }

    #[test]
    fn buf_pool_reuses() {
        let pool = BufPool::new(8192);
        let buf = pool.get(10);
        let ptr = buf.full().as_ptr();
        pool.put(buf);
        let again = pool.get(8192);
        assert_eq!(again.full().as_ptr(), ptr);
        assert_eq!(again.len(), 8192);
    }
}
