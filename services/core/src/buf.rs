//! Owned, aligned I/O buffers.
//!
//! Requests hand their buffer to the endpoint and get it back when the I/O is done, so a
//! buffer can cross into a blocking thread or a socket reader task without copying, and
//! return to its pool afterwards. Buffers are aligned for O_DIRECT.

use std::fmt;
use std::ops::{Deref, DerefMut, Range};

/// Alignment of every [`IoBuf`]: enough for O_DIRECT on any common device.
pub const IO_ALIGN: usize = 4096;

/// A heap buffer aligned to [`IO_ALIGN`] with a movable view.
///
/// The view (`start..end` within the capacity) is what `Deref` exposes and what endpoints
/// read into or write from. It lets one buffer serve requests of any size up to its
/// capacity, and lets a caller write a sub-range of what it read.
pub struct IoBuf {
    storage: Vec<u8>,
    base: usize,
    capacity: usize,
    view: Range<usize>,
}

impl IoBuf {
    /// A zero-filled buffer of `capacity` bytes, viewing all of it.
    pub fn new(capacity: usize) -> Self {
        let storage = vec![0u8; capacity + IO_ALIGN];
        let base = storage.as_ptr().align_offset(IO_ALIGN);
        debug_assert!(base < IO_ALIGN);
        Self {
            storage,
            base,
            capacity,
            view: 0..capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The current view, relative to the start of the buffer.
    pub fn view(&self) -> Range<usize> {
        self.view.clone()
    }

    /// Views `start..start + len` of the buffer.
    ///
    /// # Panics
    /// When the view reaches past the capacity: that is a bug in the caller.
    pub fn set_view(&mut self, start: usize, len: usize) {
        let end = start.checked_add(len).expect("view overflows");
        assert!(
            end <= self.capacity,
            "view {start}..{end} beyond capacity {}",
            self.capacity
        );
        self.view = start..end;
    }

    /// Views the first `len` bytes.
    pub fn set_len(&mut self, len: usize) {
        self.set_view(0, len);
    }

    /// The whole buffer regardless of the view.
    pub fn full(&self) -> &[u8] {
        &self.storage[self.base..self.base + self.capacity]
    }
}

impl Deref for IoBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.storage[self.base + self.view.start..self.base + self.view.end]
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.base + self.view.start..self.base + self.view.end]
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("capacity", &self.capacity)
            .field("view", &self.view)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_viewable() {
        let mut b = IoBuf::new(3 * IO_ALIGN);
        assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
        assert_eq!(b.len(), 3 * IO_ALIGN);
        b.set_view(IO_ALIGN, 10);
        b.copy_from_slice(&[7u8; 10]);
        assert_eq!(b.len(), 10);
        assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
        assert_eq!(&b.full()[IO_ALIGN..IO_ALIGN + 10], &[7u8; 10]);
        assert_eq!(b.full()[0], 0);
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn view_beyond_capacity_panics() {
        IoBuf::new(16).set_view(8, 9);
    }
}
