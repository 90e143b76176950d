//! Buffers whose first element sits on a 64-byte (cache-line) boundary.
//!
//! The micro-kernels load whole vectors from their scratch tiles (Qᵀ, scores, the output accumulator,
//! widened K/V rows, the AMX operands). From a plain `Vec` those tiles start wherever the allocator put
//! them, and a 32- or 64-byte load across a line boundary costs two; a tile whose row stride is a multiple
//! of the vector keeps every vector inside one line once its start is aligned.

use std::ops::{Deref, DerefMut};

/// A zeroed buffer of `len` elements starting on a 64-byte boundary; reads as a slice.
#[derive(Debug)]
pub(crate) struct Aligned<T> {
    v: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    /// `len` default (zero) elements.
    pub(crate) fn new(len: usize) -> Aligned<T> {
        // Enough slack to reach the next boundary from any element-aligned address.
        let slack = 64 / std::mem::size_of::<T>().max(1);
        let v = vec![T::default(); len + slack];
        let start = v.as_ptr().align_offset(64).min(slack);
        Aligned { v, start, len }
    }

    /// [`Aligned::new`], or `None` when the memory cannot be had (sizes a call chose, not a tile's).
    pub(crate) fn try_new(len: usize) -> Option<Aligned<T>> {
        let slack = 64 / std::mem::size_of::<T>().max(1);
        let n = len.checked_add(slack)?;
        let mut v = Vec::new();
        v.try_reserve_exact(n).ok()?;
        v.resize(n, T::default());
        let start = v.as_ptr().align_offset(64).min(slack);
        Some(Aligned { v, start, len })
    }

    /// The first element, for the kernels' pointer arithmetic.
    pub(crate) fn ptr(&mut self) -> *mut T {
        self.v[self.start..].as_mut_ptr()
    }
}

impl<T> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[self.start..self.start + self.len]
    }
}

impl<T> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::Aligned;

    #[test]
    fn starts_on_a_line_and_holds_len_zeros() {
        for len in [0, 1, 15, 16, 1000] {
            let mut a = Aligned::<f32>::new(len);
            assert_eq!(a.ptr() as usize % 64, 0, "len {len}");
            assert_eq!(a.len(), len);
            assert!(a.iter().all(|&x| x == 0.0));
            let mut b = Aligned::<u16>::new(len);
            assert_eq!(b.ptr() as usize % 64, 0, "len {len}");
        }
    }
}
