//! Row encodings on the wire: f32, f16, bf16 as raw little-endian bytes, or int8 with a per-row scale.
//!
//! Pulled rows and pushed gradients are encoded per request. f16 halves the bytes with a relative error of at
//! most 2^-11 for normal values (|x| in 6.1e-5..65504); bf16 keeps f32's range with a relative error of 2^-8.
//! Values beyond f16's range become infinite, which the server rejects for gradients; trainers that push large
//! gradients pick bf16 or f32.
//!
//! # Int8
//! [`Encoding::Int8`] is symmetric linear quantization with one scale per row: a row is its scale
//! `s = max|x| / 127` as a little-endian f32, then one `i8` per element, `q = round(x / s)`, decoded as `q * s`.
//! The error is at most `max|x| / 254` per element. At dim 16 a row is 20 bytes (f16: 32). The scale is an f32
//! rather than an f16: an f16 scale would save 2 bytes a row (18 instead of 20 at dim 16) but cannot represent
//! the scale of rows of small gradients (below 6e-5 f16 is subnormal, below 6e-8 it is zero) nor of rows
//! beyond 65504, and rounding the scale would add its own error to every element. A row with a non-finite
//! element gets a NaN scale, so it decodes as NaN and the server still rejects it as a non-finite gradient.
//! Decoding accepts `q = -128` (it is `-128 * s`). Rows whose largest element is below f32's smallest normal
//! (1.2e-38) encode as zeros.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;

/// Element encoding of rows in a payload.
///
/// Named in lowercase in text formats (TOML configs, JSON reports), as on the command line; bincode numbers the
/// variants by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// IEEE binary32, 4 bytes.
    F32,
    /// IEEE binary16, 2 bytes.
    F16,
    /// bfloat16 (the top half of an f32), 2 bytes.
    Bf16,
    // bincode numbers variants by position: new variants go last.
    /// One byte per element plus a 4-byte f32 scale per row (module docs).
    Int8,
}

/// Bytes of the per-row scale of [`Encoding::Int8`].
pub const INT8_SCALE_BYTES: usize = 4;

impl Encoding {
    /// Every encoding, in wire order.
    pub const ALL: [Encoding; 4] = [Encoding::F32, Encoding::F16, Encoding::Bf16, Encoding::Int8];

    /// Bytes per encoded element (without [`Encoding::Int8`]'s per-row scale: see [`Encoding::row_bytes`]).
    pub fn bytes_per_element(self) -> usize {
        match self {
            Encoding::F32 => 4,
            Encoding::F16 | Encoding::Bf16 => 2,
            Encoding::Int8 => 1,
        }
    }

    /// Bytes of per-row overhead (the int8 scale).
    pub fn row_overhead(self) -> usize {
        match self {
            Encoding::Int8 => INT8_SCALE_BYTES,
            _ => 0,
        }
    }

    /// Bytes of one encoded row of `dim` elements.
    pub fn row_bytes(self, dim: usize) -> usize {
        dim * self.bytes_per_element() + self.row_overhead()
    }

    /// Bytes of `rows` rows holding `elements` elements in all (None on overflow).
    pub fn rows_bytes(self, rows: usize, elements: usize) -> Option<usize> {
        elements
            .checked_mul(self.bytes_per_element())?
            .checked_add(rows.checked_mul(self.row_overhead())?)
    }

    /// Whether decoding loses information (everything but f32).
    pub fn is_lossy(self) -> bool {
        self != Encoding::F32
    }
}

impl std::str::FromStr for Encoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Encoding::F32),
            "f16" => Ok(Encoding::F16),
            "bf16" => Ok(Encoding::Bf16),
            "int8" => Ok(Encoding::Int8),
            other => Err(format!(
                "unknown encoding {other:?}, expected f32, f16, bf16 or int8"
            )),
        }
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encoding::F32 => "f32",
            Encoding::F16 => "f16",
            Encoding::Bf16 => "bf16",
            Encoding::Int8 => "int8",
        })
    }
}

/// Elements per step of the f16 conversions (a stack buffer of 1 KiB).
const F16_CHUNK: usize = 512;

/// Appends `src` encoded as `enc` to `out`. For [`Encoding::Int8`] the whole slice is one row (one scale); use
/// [`encode_rows`] for several.
pub fn encode(src: &[f32], enc: Encoding, out: &mut Vec<u8>) {
    encode_rows(src, src.len(), enc, out)
}

/// Decodes `bytes` into `out` (exactly `out.len()` elements; for [`Encoding::Int8`] one row).
pub fn decode(bytes: &[u8], enc: Encoding, out: &mut [f32]) -> Result<(), ProtocolError> {
    decode_rows(bytes, out.len(), enc, out)
}

/// Appends the rows of `src` (`src.len() / dim` rows of `dim` elements) encoded as `enc` to `out`.
pub fn encode_rows(src: &[f32], dim: usize, enc: Encoding, out: &mut Vec<u8>) {
    let rows = src.len().checked_div(dim).unwrap_or(0);
    debug_assert_eq!(rows * dim, src.len(), "{} elements, dim {dim}", src.len());
    let start = out.len();
    out.resize(start + rows * enc.row_bytes(dim), 0);
    let dst = &mut out[start..];
    match enc {
        Encoding::F32 => {
            for (d, x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        Encoding::F16 => {
            // Through an aligned buffer, F16C 8 lanes at a time (`half`'s slice conversion; the same
            // round-to-nearest-even as one at a time, bit for bit).
            let mut buf = [0u16; F16_CHUNK];
            for (d, x) in dst.chunks_mut(2 * F16_CHUNK).zip(src.chunks(F16_CHUNK)) {
                let h: &mut [f16] = buf[..x.len()].reinterpret_cast_mut();
                h.convert_from_f32_slice(x);
                for (d, v) in d.chunks_exact_mut(2).zip(&buf) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        Encoding::Bf16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
            }
        }
        Encoding::Int8 => {
            if rows == 0 {
                return;
            }
            for (d, row) in dst
                .chunks_exact_mut(enc.row_bytes(dim))
                .zip(src.chunks_exact(dim))
            {
                quantize_row(row, d);
            }
        }
    }
}

/// One int8 row: scale, then the quantized elements.
#[inline]
fn quantize_row(row: &[f32], dst: &mut [u8]) {
    // Written so that both loops vectorize: a compare-select max (NaN never wins; it is caught below) and a
    // NaN-propagating sum of x * 0, which is NaN exactly when some x is NaN or infinite.
    let mut max = 0.0f32;
    let mut nan = 0.0f32;
    for x in row {
        let a = x.abs();
        max = if a > max { a } else { max };
        nan += x * 0.0;
    }
    let (scale, inv) = if nan.is_nan() {
        (f32::NAN, 0.0)
    } else if max >= f32::MIN_POSITIVE {
        (max / 127.0, 127.0 / max)
    } else {
        // Zero, or so small (subnormal, < 1.2e-38) that 127 / max overflows: the row decodes as zeros.
        (0.0, 0.0)
    };
    let (head, q) = dst.split_at_mut(INT8_SCALE_BYTES);
    head.copy_from_slice(&scale.to_le_bytes());
    for (d, x) in q.iter_mut().zip(row) {
        // |x * inv| <= 127 (up to rounding). Adding 1.5 * 2^23 rounds to the nearest integer (ties to even,
        // the FPU's mode) and leaves it in the low mantissa bits, two's complement in the low byte.
        *d = ((x * inv) + ROUNDER).to_bits() as u8;
    }
}

/// 1.5 * 2^23: adding it to |v| < 2^22 rounds v to an integer held in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;

/// Decodes `bytes` (rows of `dim` elements in `enc`, exactly `out.len()` elements in all) into `out`.
pub fn decode_rows(
    bytes: &[u8],
    dim: usize,
    enc: Encoding,
    out: &mut [f32],
) -> Result<(), ProtocolError> {
    let rows = out.len().checked_div(dim).unwrap_or(0);
    if rows * dim != out.len() {
        return Err(ProtocolError::BadPayload(format!(
            "{} elements are not whole rows of dim {dim}",
            out.len()
        )));
    }
    let expected = rows * enc.row_bytes(dim);
    if bytes.len() != expected {
        return Err(ProtocolError::BadPayload(format!(
            "{enc} rows section of {} bytes, expected {expected} ({rows} rows of dim {dim})",
            bytes.len(),
        )));
    }
    decode_run(bytes, dim, enc, out);
    Ok(())
}

/// Decodes whole rows of `dim` elements in `enc` (lengths already checked by the caller) into `out`.
#[inline]
fn decode_run(bytes: &[u8], dim: usize, enc: Encoding, out: &mut [f32]) {
    match enc {
        Encoding::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Encoding::F16 => {
            let mut buf = [0u16; F16_CHUNK];
            for (o, c) in out.chunks_mut(F16_CHUNK).zip(bytes.chunks(2 * F16_CHUNK)) {
                let h = &mut buf[..o.len()];
                for (v, c) in h.iter_mut().zip(c.chunks_exact(2)) {
                    *v = u16::from_le_bytes([c[0], c[1]]);
                }
                let h: &[f16] = h.reinterpret_cast();
                h.convert_to_f32_slice(o);
            }
        }
        Encoding::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        Encoding::Int8 => {
            if dim == 0 {
                return;
            }
            for (o, c) in out
                .chunks_exact_mut(dim)
                .zip(bytes.chunks_exact(enc.row_bytes(dim)))
            {
                let scale = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                for (x, &q) in o.iter_mut().zip(&c[INT8_SCALE_BYTES..]) {
                    *x = q as i8 as f32 * scale;
                }
            }
        }
    }
}

/// Decodes `positions.len()` rows of `dim` elements in `enc` from `bytes` into `out` (`[rows x dim]`), row `k`
/// at row `positions[k]`: a pulled answer placed straight into a batch's unique rows. The lengths are checked
/// and the instruction set picked once per call, not per row (per-row calls of [`decode_rows`] cost 59 ns a
/// row of 16 f16 on AMD Zen 4, most of it call and check overhead; this loop costs a few).
pub fn decode_rows_at(
    bytes: &[u8],
    dim: usize,
    enc: Encoding,
    positions: &[u32],
    out: &mut [f32],
) -> Result<(), ProtocolError> {
    let row_bytes = enc.row_bytes(dim);
    let expected = positions.len() * row_bytes;
    if bytes.len() != expected {
        return Err(ProtocolError::BadPayload(format!(
            "{enc} rows section of {} bytes, expected {expected} ({} rows of dim {dim})",
            bytes.len(),
            positions.len(),
        )));
    }
    let slots = out.len().checked_div(dim).unwrap_or(0);
    if let Some(&p) = positions.iter().find(|&&p| p as usize >= slots) {
        return Err(ProtocolError::BadPayload(format!(
            "row position {p} beyond the {slots} rows of dim {dim} to decode into"
        )));
    }
    if dim == 0 {
        return Ok(());
    }
    if enc == Encoding::F16 {
        f16_rows_at(bytes, dim, positions, out);
    } else {
        for (&p, b) in positions.iter().zip(bytes.chunks_exact(row_bytes)) {
            decode_run(b, dim, enc, &mut out[p as usize * dim..][..dim]);
        }
    }
    Ok(())
}

/// The f16 case of [`decode_rows_at`] (lengths and positions checked by it): AVX-512 converts 16 halves an
/// instruction, F16C 8; elsewhere, and for the elements past the last whole group, one at a time. Every f16 is
/// exactly an f32, so all paths give the same bits (NaNs keep their payload, quieted).
fn f16_rows_at(bytes: &[u8], dim: usize, positions: &[u32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F (checked above); lengths and positions are checked by the caller.
            return unsafe { x86::f16_rows_avx512(bytes, dim, positions, out) };
        }
        if is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has F16C and AVX (checked above); lengths and positions as above.
            return unsafe { x86::f16_rows_f16c(bytes, dim, positions, out) };
        }
    }
    f16_rows_scalar(bytes, dim, positions, out)
}

/// [`f16_rows_at`] one element at a time.
fn f16_rows_scalar(bytes: &[u8], dim: usize, positions: &[u32], out: &mut [f32]) {
    for (&p, b) in positions.iter().zip(bytes.chunks_exact(2 * dim)) {
        f16_tail(b, &mut out[p as usize * dim..][..dim]);
    }
}

/// `out[j] = f16(bytes[2j..2j + 2])`, one element at a time.
#[inline]
fn f16_tail(bytes: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_cvtph_ps, _mm256_loadu_si256, _mm256_storeu_ps, _mm512_cvtph_ps,
        _mm512_storeu_ps, _mm_loadu_si128,
    };

    /// [`super::f16_rows_at`] 16 lanes at a time.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F; `bytes` holds `positions.len()` rows of `2 * dim` bytes and every
    /// position is below `out.len() / dim`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f16_rows_avx512(
        bytes: &[u8],
        dim: usize,
        positions: &[u32],
        out: &mut [f32],
    ) {
        let whole = dim / 16 * 16;
        for (&p, b) in positions.iter().zip(bytes.chunks_exact(2 * dim)) {
            let o = &mut out[p as usize * dim..][..dim];
            for j in (0..whole).step_by(16) {
                // SAFETY: `j + 16 <= dim`: 32 bytes of `b` from `2j` and 16 floats of `o` from `j` are in bounds.
                unsafe {
                    let h = _mm256_loadu_si256(b.as_ptr().add(2 * j).cast::<__m256i>());
                    _mm512_storeu_ps(o.as_mut_ptr().add(j), _mm512_cvtph_ps(h));
                }
            }
            super::f16_tail(&b[2 * whole..], &mut o[whole..]);
        }
    }

    /// [`super::f16_rows_at`] 8 lanes at a time.
    ///
    /// # Safety
    /// The CPU supports F16C and AVX; `bytes` and `positions` as for [`f16_rows_avx512`].
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn f16_rows_f16c(
        bytes: &[u8],
        dim: usize,
        positions: &[u32],
        out: &mut [f32],
    ) {
        let whole = dim / 8 * 8;
        for (&p, b) in positions.iter().zip(bytes.chunks_exact(2 * dim)) {
            let o = &mut out[p as usize * dim..][..dim];
            for j in (0..whole).step_by(8) {
                // SAFETY: `j + 8 <= dim`: 16 bytes of `b` from `2j` and 8 floats of `o` from `j` are in bounds.
                unsafe {
                    let h = _mm_loadu_si128(b.as_ptr().add(2 * j).cast::<__m128i>());
                    _mm256_storeu_ps(o.as_mut_ptr().add(j), _mm256_cvtph_ps(h));
                }
            }
            super::f16_tail(&b[2 * whole..], &mut o[whole..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(v: &[f32], enc: Encoding) -> Vec<f32> {
        let mut bytes = Vec::new();
        encode(v, enc, &mut bytes);
        assert_eq!(bytes.len(), enc.row_bytes(v.len()));
        let mut out = vec![0.0; v.len()];
        decode(&bytes, enc, &mut out).unwrap();
        out
    }

    proptest! {
        #[test]
        fn f32_is_exact(v in proptest::collection::vec(proptest::num::f32::ANY, 0..64)) {
            let back = round_trip(&v, Encoding::F32);
            for (a, b) in v.iter().zip(&back) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }

        #[test]
        fn f16_relative_error_bounded(v in proptest::collection::vec(-60000.0f32..60000.0, 0..64)) {
            let back = round_trip(&v, Encoding::F16);
            for (a, b) in v.iter().zip(&back) {
                // Normal range: relative error 2^-11; subnormals: absolute error 2^-25.
                let tol = (a.abs() * (1.0 / 2048.0)).max(3.0e-8);
                prop_assert!((a - b).abs() <= tol, "{} -> {}", a, b);
            }
        }

        #[test]
        fn bf16_relative_error_bounded(v in proptest::collection::vec(-1.0e30f32..1.0e30, 0..64)) {
            let back = round_trip(&v, Encoding::Bf16);
            for (a, b) in v.iter().zip(&back) {
                prop_assert!((a - b).abs() <= a.abs() / 256.0, "{} -> {}", a, b);
            }
        }

        #[test]
        fn int8_error_at_most_max_over_254(
            dim in 1usize..40,
            rows in proptest::collection::vec(proptest::collection::vec(-1.0e30f32..1.0e30, 40), 1..6),
            exp in -30i32..30,
        ) {
            // Rows of one magnitude (10^exp) each, so tiny and huge scales are both covered.
            let m = 10f32.powi(exp);
            let src: Vec<f32> = rows.iter().flat_map(|r| r[..dim].iter().map(|x| x / 1.0e30 * m)).collect();
            let mut bytes = Vec::new();
            encode_rows(&src, dim, Encoding::Int8, &mut bytes);
            prop_assert_eq!(bytes.len(), rows.len() * (dim + 4));
            let mut back = vec![0.0; src.len()];
            decode_rows(&bytes, dim, Encoding::Int8, &mut back).unwrap();
            for (row, brow) in src.chunks(dim).zip(back.chunks(dim)) {
                let max = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                for (a, b) in row.iter().zip(brow) {
                    // max/254 plus f32 rounding of the scale, the product and the quotient.
                    let tol = max / 254.0 * (1.0 + 1e-5) + max * 1e-6;
                    prop_assert!((a - b).abs() <= tol, "{} -> {} (max {})", a, b, max);
                }
            }
        }

        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80), dim in 0usize..9, n in 0usize..20) {
            for enc in Encoding::ALL {
                let mut out = vec![0.0; n];
                let _ = decode_rows(&bytes, dim, enc, &mut out);
            }
        }
    }

    proptest! {
        /// Rows placed by `decode_rows_at` are the rows `decode_rows` gives one by one, bit for bit, in every
        /// encoding and at every dimension (the vector paths' tails included), the untouched rows left as they
        /// were; f16 with specials (infinities, NaN, subnormals) in the rows.
        #[test]
        fn rows_at_positions_equal_rows_one_by_one(
            dim in 1usize..40,
            rows in 0usize..12,
            seed in any::<u64>(),
            special in any::<bool>(),
        ) {
            let slots = rows + 3;
            // A permutation of the slots, the first `rows` of it used.
            let mut positions: Vec<u32> = (0..slots as u32).collect();
            let mut x = seed | 1;
            for i in (1..positions.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                positions.swap(i, (x % (i as u64 + 1)) as usize);
            }
            positions.truncate(rows);
            let mut src: Vec<f32> = (0..rows * dim)
                .map(|i| ((i as f32 + seed as f32) * 0.37).sin() * 10f32.powi(i as i32 % 9 - 4))
                .collect();
            if special && !src.is_empty() {
                let n = src.len();
                for (k, v) in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3e-7, -0.0].into_iter().enumerate() {
                    src[(k * 7) % n] = v;
                }
            }
            for enc in Encoding::ALL {
                let mut bytes = Vec::new();
                encode_rows(&src, dim, enc, &mut bytes);
                let mut want = vec![-1.0f32; slots * dim];
                for (k, &p) in positions.iter().enumerate() {
                    let b = &bytes[k * enc.row_bytes(dim)..(k + 1) * enc.row_bytes(dim)];
                    let p = p as usize * dim;
                    decode_rows(b, dim, enc, &mut want[p..p + dim]).unwrap();
                }
                let mut got = vec![-1.0f32; slots * dim];
                decode_rows_at(&bytes, dim, enc, &positions, &mut got).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&want), "{} at dim {}", enc, dim);
                if enc == Encoding::F16 {
                    // Every f16 path, whichever this CPU dispatches to.
                    let mut scalar = vec![-1.0f32; slots * dim];
                    f16_rows_scalar(&bytes, dim, &positions, &mut scalar);
                    prop_assert_eq!(bits(&scalar), bits(&want), "scalar f16 at dim {}", dim);
                    #[cfg(target_arch = "x86_64")]
                    if is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx") {
                        let mut f16c = vec![-1.0f32; slots * dim];
                        // SAFETY: F16C and AVX are present; lengths and positions are those checked above.
                        unsafe { x86::f16_rows_f16c(&bytes, dim, &positions, &mut f16c) };
                        prop_assert_eq!(bits(&f16c), bits(&want), "F16C at dim {}", dim);
                    }
                }
            }
        }
    }

    /// A section of the wrong length, or a position beyond the rows to fill, is refused naming it, with
    /// nothing written.
    #[test]
    fn rows_at_positions_refuse_bad_lengths_and_positions() {
        let mut bytes = Vec::new();
        encode_rows(&[1.0, 2.0, 3.0, 4.0], 2, Encoding::F16, &mut bytes);
        let mut out = vec![0.0; 6];
        let e = decode_rows_at(&bytes[..7], 2, Encoding::F16, &[0, 1], &mut out).unwrap_err();
        assert!(e.to_string().contains("7 bytes, expected 8"), "{e}");
        let e = decode_rows_at(&bytes, 2, Encoding::F16, &[0, 3], &mut out).unwrap_err();
        assert!(
            e.to_string().contains("row position 3 beyond the 3 rows"),
            "{e}"
        );
        assert_eq!(out, [0.0; 6]);
        decode_rows_at(&bytes, 2, Encoding::F16, &[2, 0], &mut out).unwrap();
        assert_eq!(out, [3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
    }

    /// The chunked f16 conversions give the bits converting one element at a time gives, specials and
    /// rounding ties included, across chunk boundaries.
    #[test]
    fn f16_chunks_match_one_at_a_time() {
        let mut v: Vec<f32> = (0..1500)
            .map(|i| ((i as f32) * 0.731).sin() * 10f32.powi(i % 12 - 6))
            .collect();
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            65504.0,
            65520.0,
            1e-8,
            6.1e-5,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            f32::MIN_POSITIVE,
        ]);
        let mut bytes = Vec::new();
        encode_rows(&v, 1, Encoding::F16, &mut bytes);
        let one: Vec<u8> = v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect();
        assert_eq!(bytes, one);
        let mut out = vec![0.0; v.len()];
        decode_rows(&bytes, 1, Encoding::F16, &mut out).unwrap();
        let want: Vec<u32> = bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32().to_bits())
            .collect();
        assert_eq!(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
    }

    /// The f16 conversions against one element at a time (the code before issue 44), same process,
    /// alternating, best of 9; by hand: `cargo test --release -p protocol --lib f16_speed -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "timing; run by hand in release"]
    fn f16_speed() {
        let v: Vec<f32> = (0..1 << 20).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut bytes = Vec::new();
        let mut out = vec![0.0; v.len()];
        let best = |f: &mut dyn FnMut()| {
            (0..9)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let mut old_bytes = vec![0u8; v.len() * 2];
        let enc_old = best(&mut || {
            for (d, x) in old_bytes.chunks_exact_mut(2).zip(&v) {
                d.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        });
        let enc_new = best(&mut || {
            bytes.clear();
            encode_rows(&v, 16, Encoding::F16, &mut bytes);
        });
        let dec_old = best(&mut || {
            for (o, c) in out.iter_mut().zip(old_bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        });
        let dec_new = best(&mut || decode_rows(&bytes, 16, Encoding::F16, &mut out).unwrap());
        let ns = |t: f64| t / v.len() as f64 * 1e9;
        println!(
            "f16 per element: encode {:.2} ns (one at a time {:.2}), decode {:.2} ns (one at a time {:.2})",
            ns(enc_new),
            ns(enc_old),
            ns(dec_new),
            ns(dec_old)
        );
    }

    #[test]
    fn int8_special_rows() {
        assert_eq!(round_trip(&[0.0; 5], Encoding::Int8), [0.0; 5]);
        let back = round_trip(&[1.0, -0.5, 0.25, -1.0], Encoding::Int8);
        assert_eq!(back[0], 1.0);
        assert_eq!(back[3], -1.0);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let back = round_trip(&[1.0, bad, 0.5], Encoding::Int8);
            assert!(back.iter().all(|x| x.is_nan()), "{back:?}");
        }
        assert_eq!(Encoding::Int8.row_bytes(16), 20);
        assert_eq!(Encoding::F16.row_bytes(16), 32);
        assert_eq!(Encoding::Int8.rows_bytes(3, 48), Some(60));
        assert_eq!(Encoding::F32.rows_bytes(usize::MAX, usize::MAX), None);
    }

    #[test]
    fn wrong_length_is_an_error() {
        let mut out = vec![0.0; 3];
        let err = decode(&[0u8; 5], Encoding::F16, &mut out).unwrap_err();
        assert!(err.to_string().contains("5 bytes, expected 6"), "{err}");
        let mut out = vec![0.0; 8];
        let err = decode_rows(&[0u8; 11], 4, Encoding::Int8, &mut out).unwrap_err();
        assert!(err.to_string().contains("11 bytes, expected 16"), "{err}");
        let err = decode_rows(&[], 3, Encoding::Int8, &mut out).unwrap_err();
        assert!(err.to_string().contains("dim 3"), "{err}");
    }

    #[test]
    fn parse_names() {
        assert_eq!("F16".parse::<Encoding>().unwrap(), Encoding::F16);
        assert_eq!("int8".parse::<Encoding>().unwrap(), Encoding::Int8);
        assert!("int4".parse::<Encoding>().unwrap_err().contains("int4"));
        for e in Encoding::ALL {
            assert_eq!(e.to_string().parse::<Encoding>().unwrap(), e);
        }
    }
}
