//! Cache prefetch hints, defined once for the workspace: [`read`] asks the CPU to start loading the cache line
//! holding an address before the code needs it, so that the misses of several independent lookups overlap
//! instead of being waited on one after another (the table's lookup loop, `Stripe::lookup_each`; the trainer's
//! residual store).
//!
//! A prefetch is only a hint: it never faults and changes no result, whatever the address, so callers may
//! compute addresses with `wrapping_add` and need no bounds check for it. Methods that know where a row or an
//! index entry lives (`Arena::prefetch`, `Index::prefetch`) compute the address and call [`read`].

/// Hints the CPU to load the cache line holding `p` into every cache level (`prefetcht0` on x86-64; a no-op
/// on other targets). Never faults and never reads into the program, whatever `p` is (dangling, null or out of
/// bounds included); it has no effect on results, only on timing.
#[inline(always)]
pub fn read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` only needs SSE, which every x86-64 CPU has; it is a hint that never faults or reads
    // into the program, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_address_is_a_harmless_hint() {
        let v = [1u64, 2, 3];
        super::read(v.as_ptr());
        super::read(v.as_ptr().wrapping_add(1 << 40));
        super::read(std::ptr::null::<u8>());
        assert_eq!(v, [1, 2, 3]);
    }
}
