//! The x86_64 instructions of the bf16 products: the AVX512-BF16 packers, the AMX tile kernel and the
//! AVX512-BF16 (`vdpbf16ps`) kernel, behind the checked entry points of the parent module.

use std::arch::asm;
use std::arch::x86_64::*;

use super::{a_at, b_at, pad, BLOCK, TILE_ELEMS};
use base::simd::transpose16;

/// 16 bf16 pairs from rows `r0` and `r1` (16 f32 each): `[r0[0], r1[0], r0[1], r1[1], ...]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn interleave(r0: __m512, r1: __m512) -> __m512i {
    // cvtne2ps_pbh(a, b): the low 16 bf16 come from b, the high 16 from a.
    let both: __m512i =
        unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(r1, r0)) };
    let idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    _mm512_permutexvar_epi16(idx, both)
}

/// A mask of the first `len.min(16)` lanes.
#[inline]
fn lanes(len: usize) -> u16 {
    if len >= 16 {
        u16::MAX
    } else {
        (1u16 << len) - 1
    }
}

/// 16 f32 of `src` from `at`, lanes past `len` (and everything when `len == 0`) zero.
#[inline]
#[target_feature(enable = "avx512f")]
fn load(src: &[f32], at: usize, len: usize) -> __m512 {
    if len == 0 {
        return _mm512_setzero_ps();
    }
    debug_assert!(at + len.min(16) <= src.len());
    // SAFETY: the mask covers `src[at..at + len.min(16)]` only, which the callers keep in bounds.
    unsafe { _mm512_maskz_loadu_ps(lanes(len), src.as_ptr().add(at)) }
}

/// Stores 64 bytes at `dst[at..at + 32]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn store(dst: &mut [u16], at: usize, v: __m512i) {
    let out = &mut dst[at..at + 32];
    // SAFETY: `out` is 32 u16 = 64 bytes.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) fn pack_rows(src: &[f32], m: usize, k: usize, dst: &mut [u16]) {
    let kp = pad(k);
    for i in 0..pad(m) {
        for p in (0..kp).step_by(32) {
            let (len, at) = if i < m {
                (k.saturating_sub(p), i * k + p)
            } else {
                (0, 0)
            };
            let lo = load(src, at, len);
            let hi = load(src, at + 16, len.saturating_sub(16));
            // SAFETY: a plain bit cast of 32 bf16.
            let v: __m512i =
                unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) };
            store(dst, a_at(i, p, kp), v);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) fn pack_b(src: &[f32], k: usize, n: usize, dst: &mut [u16]) {
    let (kp, np) = (pad(k), pad(n));
    for p in (0..kp).step_by(2) {
        for j in (0..np).step_by(16) {
            let len = n.saturating_sub(j);
            let r0 = load(src, p * n + j, if p < k { len } else { 0 });
            let r1 = load(src, (p + 1) * n + j, if p + 1 < k { len } else { 0 });
            store(dst, b_at(p, j, kp), interleave(r0, r1));
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) fn pack_cols(src: &[f32], k: usize, m: usize, dst: &mut [u16]) {
    let (kp, mp) = (pad(k), pad(m));
    // a[i][p] = src[p][i], one 16 x 32 tile at a time: the pairs (src[p][i], src[p + 1][i]) for 16
    // columns i form a 16 x 16 matrix of u32 (row q = pair of rows p0 + 2q, p0 + 2q + 1), whose
    // transpose is the tile: row i holds the 16 pairs along k.
    let mut rows = [_mm512_setzero_si512(); 16];
    for i0 in (0..mp).step_by(16) {
        let len = m.saturating_sub(i0);
        for p0 in (0..kp).step_by(32) {
            for (q, row) in rows.iter_mut().enumerate() {
                let (p, p1) = (p0 + 2 * q, p0 + 2 * q + 1);
                let r0 = load(src, p * m + i0, if p < k { len } else { 0 });
                let r1 = load(src, p1 * m + i0, if p1 < k { len } else { 0 });
                *row = interleave(r0, r1);
            }
            transpose16(&mut rows);
            for (r, &row) in rows.iter().enumerate() {
                store(dst, a_at(i0 + r, p0, kp), row);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) fn pack_b_transposed(src: &[f32], n: usize, k: usize, dst: &mut [u16]) {
    let (kp, np) = (pad(k), pad(n));
    // b[p][j] = src[j][p]: 32 consecutive p of a row j are 16 VNNI pairs; 16 rows j side by side
    // form a 16 x 16 matrix of u32 (row j, lane q), whose transpose is the tile (row q, lane j).
    let mut rows = [_mm512_setzero_si512(); 16];
    for j0 in (0..np).step_by(16) {
        for p0 in (0..kp).step_by(32) {
            let len = k.saturating_sub(p0);
            for (r, row) in rows.iter_mut().enumerate() {
                let j = j0 + r;
                let len = if j < n { len } else { 0 };
                let lo = load(src, j * k + p0, len);
                let hi = load(src, j * k + p0 + 16, len.saturating_sub(16));
                // SAFETY: a plain bit cast of 32 bf16.
                *row = unsafe {
                    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
                };
            }
            transpose16(&mut rows);
            for (q, &row) in rows.iter().enumerate() {
                store(dst, b_at(p0 + 2 * q, j0, kp), row);
            }
        }
    }
}

/// The tile configuration: palette 1, tiles 0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new() -> Self {
        let mut cfg = [0u8; 64];
        cfg[0] = 1; // palette
        for t in 0..8 {
            cfg[16 + 2 * t] = 64; // bytes per row (u16, little endian)
            cfg[48 + t] = 16; // rows
        }
        Self(cfg)
    }
}

/// Computes one 32 x 32 block of `c` (row stride `ldc_bytes`) from two row tiles of `a` (`a` and
/// `a2`) and two column tiles of `b` (`b` and `b2`), over `steps` tiles along k, each 1 KiB after
/// the previous one.
///
/// # Safety
/// Tiles configured by [`TileConfig`]; every address in range.
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    a: *const u16,
    a2: *const u16,
    b: *const u16,
    b2: *const u16,
    steps: usize,
    c: *mut f32,
    ldc_bytes: usize,
) {
    let c2 = c.wrapping_byte_add(16 * ldc_bytes);
    // SAFETY: the caller's contract; tmm registers are not used by compiled Rust code.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a} + {s}*1]",
            "tileloadd tmm6, [{b} + {s}*1]",
            "tileloadd tmm5, [{a2} + {s}*1]",
            "tileloadd tmm7, [{b2} + {s}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 1024",
            "add {a2}, 1024",
            "add {b}, 1024",
            "add {b2}, 1024",
            "dec {steps}",
            "jnz 2b",
            "tilestored [{c} + {ldc}*1], tmm0",
            "tilestored [{c} + {ldc}*1 + 64], tmm1",
            "tilestored [{c2} + {ldc}*1], tmm2",
            "tilestored [{c2} + {ldc}*1 + 64], tmm3",
            a = inout(reg) a => _,
            a2 = inout(reg) a2 => _,
            b = inout(reg) b => _,
            b2 = inout(reg) b2 => _,
            steps = inout(reg) steps => _,
            s = in(reg) 64usize,
            c = in(reg) c,
            c2 = in(reg) c2,
            ldc = in(reg) ldc_bytes,
            options(nostack),
        );
    }
}

/// A 32 x 32 f32 block on a 64-byte boundary.
#[repr(C, align(64))]
struct Block([f32; BLOCK * BLOCK]);

/// Copies the first `rows` rows and `cols` columns of `blk` to `c` at `at`, rows `ldc` apart.
#[inline]
#[target_feature(enable = "avx512f")]
fn copy_block(blk: &Block, rows: usize, cols: usize, c: &mut [f32], at: usize, ldc: usize) {
    let (m0, m1) = (lanes(cols), lanes(cols.saturating_sub(16)));
    for r in 0..rows {
        let dst = &mut c[at + r * ldc..][..cols];
        let src = &blk.0[r * BLOCK..];
        // SAFETY: the masks cover `dst[..cols]` only; `src` has 32 elements.
        unsafe {
            let v0 = _mm512_loadu_ps(src.as_ptr());
            let v1 = _mm512_loadu_ps(src.as_ptr().add(16));
            _mm512_mask_storeu_ps(dst.as_mut_ptr(), m0, v0);
            if m1 != 0 {
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(16), m1, v1);
            }
        }
    }
}

pub(super) unsafe fn gemm(
    m: usize,
    n: usize,
    kp: usize,
    a: &[u16],
    b: &[u16],
    c: &mut [f32],
    ldc: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { gemm_in_panels(m, n, kp, a, b, c, ldc, PANEL_BYTES) }
}

/// [`gemm`] with panels of `b` of at most `panel_bytes` (at least one 32-column block): the results do not
/// depend on it (every block of `c` sums all of k in one pass), only the order blocks are computed in.
///
/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_in_panels(
    m: usize,
    n: usize,
    kp: usize,
    a: &[u16],
    b: &[u16],
    c: &mut [f32],
    ldc: usize,
    panel_bytes: usize,
) {
    let (mp, np) = (pad(m), pad(n));
    let cfg = TileConfig::new();
    let mut edge = Block([0.0; BLOCK * BLOCK]);
    // Elements from one row (or column) tile to the next: a whole strip along k.
    let strip = kp / BLOCK * TILE_ELEMS;
    let steps = kp / BLOCK;
    // Tile stores straight into `c` when its rows are whole cache lines. A misaligned row splits every
    // 64-byte tile row over two lines: for short k (k = 32: 190 against 250 GFLOP/s) the block then goes
    // through an aligned buffer and a copy, but from k = 256 on the split stores cost less than the copy
    // (`perf::shapes`: 1,445 against 1,347 GFLOP/s at 512 x 512 x 384, 1,559 against 1,439 at
    // 512 x 256 x 512), as for the top MLP's first layer, whose 367 inputs make every row misaligned.
    let aligned = (c.as_ptr() as usize).is_multiple_of(64) && ldc.is_multiple_of(16);
    let direct = aligned || steps >= 8;
    // Columns of `b` per panel: a panel (`kp x panel` bf16) stays in L2 while every row block of `a` passes
    // over it, so `b` is read from memory (L3) once per product, and `a` once per panel. Row block by row
    // block over the whole of `b` (one panel) re-read all of `b` for every 32 rows of `a`: at DLRM-v2's
    // shapes (k = 3456, n = 1024: a 7 MB `b`) that ran at 700-840 GFLOP/s against 2,100-2,300 when `b` fits
    // in L2. Products whose `b` fits (the Kaggle model's) keep one panel, the order they always had.
    let panel = (panel_bytes / (2 * kp.max(1)) / BLOCK * BLOCK).max(BLOCK);
    // SAFETY: see `super::gemm`.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        for j0 in (0..np).step_by(panel) {
            for i in (0..mp).step_by(BLOCK) {
                let a1 = a.as_ptr().add(i / 16 * strip);
                let a2 = a1.add(strip);
                for j in (j0..np.min(j0 + panel)).step_by(BLOCK) {
                    let b1 = b.as_ptr().add(j / 16 * strip);
                    let b2 = b1.add(strip);
                    if direct && i + BLOCK <= m && j + BLOCK <= n {
                        let c_blk = c.as_mut_ptr().add(i * ldc + j);
                        block(a1, a2, b1, b2, steps, c_blk, ldc * 4);
                    } else {
                        block(a1, a2, b1, b2, steps, edge.0.as_mut_ptr(), BLOCK * 4);
                        let (rows, cols) = (BLOCK.min(m - i), BLOCK.min(n - j));
                        copy_block(&edge, rows, cols, c, i * ldc + j, ldc);
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Bytes of `b` one panel of [`gemm`] holds: half of a 2 MiB L2 (Sapphire Rapids' per core), the rest
/// for the row strip of `a` and `c`'s blocks.
const PANEL_BYTES: usize = 1 << 20;

/// 32 bf16 in a register, as the `vdpbf16ps` intrinsic takes them.
#[inline]
#[target_feature(enable = "avx512f")]
fn as_bh(v: __m512i) -> __m512bh {
    // SAFETY: a plain bit cast between two 64-byte vector types.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// Rows of `c` one [`gemm_avx512`] micro-kernel computes (half a 16-row `a` tile).
const ROWS: usize = 8;

/// `c` (`m x n`, rows `ldc` apart) `= a · b` with `vdpbf16ps`: for each block of [`ROWS`] rows x 32
/// columns (two `b` column tiles), 16 f32 accumulators stay in registers while k runs through the tiles;
/// each step loads one VNNI row of each `b` tile (16 columns' pairs) and broadcasts each row's `a` pair
/// against them. Row blocks past `m` are skipped, partial column blocks stored under a mask. The `b`
/// strip of a column block (`kp x 32` bf16) is reused by every row block while in L2.
///
/// # Safety
/// AVX512-F/BW/BF16 on the CPU; `a`, `b` and `c` as [`super::gemm_on`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn gemm_avx512(
    m: usize,
    n: usize,
    kp: usize,
    a: &[u16],
    b: &[u16],
    c: &mut [f32],
    ldc: usize,
) {
    let np = pad(n);
    let ktiles = kp / BLOCK;
    let strip = ktiles * TILE_ELEMS;
    for j in (0..np).step_by(BLOCK) {
        let (m0, m1) = (lanes(n - j), lanes(n.saturating_sub(j + 16)));
        // SAFETY (all pointer arithmetic below): column tiles j/16 and j/16 + 1 of `b` and row
        // blocks of `a` lie inside the packed operands (np and mp are whole blocks).
        let b1 = unsafe { b.as_ptr().add(j / 16 * strip) };
        let b2 = unsafe { b1.add(strip) };
        for i in (0..m).step_by(ROWS) {
            let a0 = unsafe { a.as_ptr().add(i / 16 * strip + i % 16 * BLOCK) };
            let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
            for t in 0..ktiles {
                let (at, bt1, bt2) = unsafe {
                    (
                        a0.add(t * TILE_ELEMS),
                        b1.add(t * TILE_ELEMS),
                        b2.add(t * TILE_ELEMS),
                    )
                };
                for q in 0..BLOCK / 2 {
                    // SAFETY: row q of a 1 KiB tile (64 bytes); the pair (a[r][2q], a[r][2q + 1]).
                    let (v1, v2) = unsafe {
                        (
                            _mm512_loadu_si512(bt1.add(q * BLOCK).cast()),
                            _mm512_loadu_si512(bt2.add(q * BLOCK).cast()),
                        )
                    };
                    let (v1, v2) = (as_bh(v1), as_bh(v2));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let pair = unsafe { at.add(r * BLOCK + 2 * q).cast::<i32>().read() };
                        let x = as_bh(_mm512_set1_epi32(pair));
                        acc[0] = _mm512_dpbf16_ps(acc[0], x, v1);
                        acc[1] = _mm512_dpbf16_ps(acc[1], x, v2);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(m - i) {
                let row = &mut c[(i + r) * ldc + j..];
                // SAFETY: the masks cover columns j..n of row i + r only, inside `c`.
                unsafe {
                    _mm512_mask_storeu_ps(row.as_mut_ptr(), m0, acc[0]);
                    if m1 != 0 {
                        _mm512_mask_storeu_ps(row.as_mut_ptr().add(16), m1, acc[1]);
                    }
                }
            }
        }
    }
}
