//! [`Aligned`]: a growable buffer that starts on a 64-byte boundary.
//!
//! AMX tile rows are 64 bytes. A tile load or store whose rows are not cache-line aligned touches two lines
//! per row: packed operands in a 16-byte aligned `Vec` made the bf16 products 2.6x slower, and unaligned
//! output rows cost another 1.3x at the model's shapes (measured here, `bf16::perf`).

use std::ops::{Deref, DerefMut};

/// 64 bytes on a 64-byte boundary: the storage unit.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Element types an [`Aligned`] can hold: plain numbers, for which every bit pattern is a value.
pub(crate) trait Plain: Copy + Default + 'static {}
impl Plain for u16 {}
impl Plain for f32 {}

/// A buffer of `T` whose first element is 64-byte aligned. Like the model's `Vec` buffers it only grows
/// ([`grow`](Self::grow)), so steady-state steps do not allocate; new elements are zero.
#[derive(Clone, Default)]
pub(crate) struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Plain> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Aligned({} x {})", self.len, std::any::type_name::<T>())
    }
}

impl<T: Plain> Aligned<T> {
    /// Grows to at least `len` elements (never shrinks).
    pub(crate) fn grow(&mut self, len: usize) {
        if len > self.len {
            let lines = (len * size_of::<T>()).div_ceil(64);
            if self.lines.len() < lines {
                self.lines.resize(lines, Line([0; 64]));
            }
            self.len = len;
        }
    }

    /// Grows to at least `len` elements and returns the first `len`.
    pub(crate) fn get(&mut self, len: usize) -> &mut [T] {
        self.grow(len);
        &mut self[..len]
    }
}

impl<T: Plain> Deref for Aligned<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` elements of `T` (a `Plain` type: every bit pattern,
        // including the zeroed lines, is a value; alignment 64 covers it).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
}

impl<T: Plain> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
}

/// Room for one tensor of `len` f32 elements in the chunks' flat gradients (`chunk`, `cross`): whole cache
/// lines.
pub(crate) fn slot(len: usize) -> usize {
    len.next_multiple_of(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_zeroed_aligned_and_keeps_contents() {
        let mut a = Aligned::<f32>::default();
        assert!(a.is_empty());
        a.grow(5);
        assert_eq!(&a[..], &[0.0; 5]);
        assert!((a.as_ptr() as usize).is_multiple_of(64));
        a[4] = 2.5;
        a.grow(3);
        assert_eq!(a.len(), 5, "never shrinks");
        a.grow(1000);
        assert_eq!(a[4], 2.5);
        assert_eq!(a.len(), 1000);
        assert!(a[5..].iter().all(|&x| x == 0.0));
        assert!((a.as_ptr() as usize).is_multiple_of(64));
        let mut b = Aligned::<u16>::default();
        assert_eq!(b.get(33).len(), 33);
        assert!((b.as_ptr() as usize).is_multiple_of(64));
    }
}
