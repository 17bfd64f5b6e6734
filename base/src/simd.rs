//! Run-time instruction-set dispatch for the workspace's own loops: the dense model's, the batch plan's, the
//! trainer's replay (the `gemm` crate dispatches its kernels itself).
//!
//! The workspace compiles for baseline x86-64 (SSE2) so the binary runs anywhere; the element-wise
//! passes and the interaction kernels are written as plain loops over fixed 16-lane blocks, and
//! [`multiversion!`] compiles each once more with AVX-512 and once with AVX2 (both with FMA) enabled,
//! picking one per call from a cached CPU check. The versions compute the same operations in the same
//! order, so results are bit-identical across machines: Rust never contracts `a * b + c` into a fused
//! multiply-add, and where a kernel asks for one (`f32::mul_add`) the baseline build gets the correctly
//! rounded software `fmaf`, slower but equal.

use std::sync::OnceLock;

/// The best instruction set the CPU supports, among those the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 F + VL, and FMA.
    Avx512,
    /// AVX2 and FMA.
    Avx2,
    /// What the binary was compiled for.
    Baseline,
}

/// The detected instruction set (checked once).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if !is_x86_feature_detected!("fma") {
                return Isa::Baseline;
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Baseline
    })
}

/// Asks the CPU to bring every cache line of `data` into L1 ahead of use: a hint that reads nothing and
/// cannot fault, for loops whose next rows are at addresses the hardware prefetchers cannot guess (rows
/// scattered over a large buffer). A no-op off x86-64.
#[inline(always)]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (p, bytes) = (data.as_ptr().cast::<i8>(), std::mem::size_of_val(data));
        for off in (0..bytes).step_by(64) {
            // SAFETY: `p + off` lies inside `data`; a prefetch dereferences nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Defines `fn name(args) body` compiled three times (AVX-512, AVX2, baseline) and dispatched on
/// [`isa`]. Arguments must be plain values or references (no `impl Trait`).
#[macro_export]
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn generic($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) {
                    generic($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) {
                    generic($($arg),*)
                }
                match $crate::simd::isa() {
                    // SAFETY: `isa()` reported that this CPU supports the enabled features.
                    $crate::simd::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::simd::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::simd::Isa::Baseline => {}
                }
            }
            generic($($arg),*)
        }
    };
}

/// Transposes a 16 x 16 matrix of 32-bit lanes held in 16 registers (row `r` in `m[r]`).
///
/// # Safety
/// The CPU must support AVX-512 F (check [`isa`] first).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub fn transpose16(m: &mut [std::arch::x86_64::__m512i; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]);
    }
    // u[4g + c] holds, per 128-bit lane l, column 4l + c of rows 4g..4g + 4.
    let mut u = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    for c in 0..4 {
        let v = _mm512_shuffle_i32x4::<0x88>(u[c], u[4 + c]);
        let w = _mm512_shuffle_i32x4::<0xdd>(u[c], u[4 + c]);
        let x = _mm512_shuffle_i32x4::<0x88>(u[8 + c], u[12 + c]);
        let y = _mm512_shuffle_i32x4::<0xdd>(u[8 + c], u[12 + c]);
        m[c] = _mm512_shuffle_i32x4::<0x88>(v, x);
        m[8 + c] = _mm512_shuffle_i32x4::<0xdd>(v, x);
        m[4 + c] = _mm512_shuffle_i32x4::<0x88>(w, y);
        m[12 + c] = _mm512_shuffle_i32x4::<0xdd>(w, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    multiversion! {
        /// Sum of squares in 16 lanes.
        fn sum_squares(x: &[f32], out: &mut f32) {
            let mut acc = [0.0f32; 16];
            for c in x.chunks_exact(16) {
                for (a, &v) in acc.iter_mut().zip(c) {
                    *a += v * v;
                }
            }
            *out = acc.iter().sum();
        }
    }

    #[test]
    fn dispatch_runs_and_matches() {
        let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
        let mut got = 0.0;
        sum_squares(&x, &mut got);
        let want: f32 = (0..64).map(|i| (i * i) as f32).sum();
        assert_eq!(got, want);
        println!("isa {:?}", isa());
    }
}
