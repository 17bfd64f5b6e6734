//! [`Interaction`]: DLRM's pairwise dot interaction, forward and backward.
//!
//! Per sample, stack `T = [z; e_1; …; e_S]` (`n = S + 1` vectors of dimension `d`) and output
//! `[z, (T_i · T_j) for i in 1..n, j in 0..i]`: the bottom-MLP output followed by the strict lower triangle of
//! the Gram matrix `T Tᵀ`, in the DLRM reference's order (`interaction_op="dot"`,
//! `arch_interaction_itself=False`).
//!
//! The kernels work one sample at a time, samples split across the rayon pool. The forward transposes `T`
//! into a small stack buffer so that row `i` of the Gram matrix is `Σ_k T_ik · Tᵀ[k, ..]`, 16 columns at a
//! time with no horizontal sums; the backward computes `dT_i = Σ_{j≠i} g_ij T_j` straight from the pair
//! gradients, 16 coordinates at a time. Both handle two rows at once (two independent sums sharing their
//! loads), are specialized for common `d` by inlining with a constant, and are compiled for AVX-512 and
//! AVX2 besides the baseline (see `simd`). The forward also splits each sum over even and odd coordinates
//! (four FMA chains in flight: about 9% faster; the same split in the backward measured no gain). About
//! a third of the forward's time is the scalar transpose. With the default sizes each direction takes
//! about 0.5 µs per sample on one core. Per-sample `gemm` calls (27 x 16 x 27) took about twice as long even before
//! extracting the triangle: at this size call and packing overhead dominate.

use rayon::prelude::*;

use super::linear::rows_per_task;
use base::multiversion;

/// Lane count of the forward's column blocks (one AVX-512 register of f32).
const LANES: usize = 16;

/// Capacity, in blocks of [`LANES`], of the per-task pair of transpose buffers (32 KiB on the stack);
/// bigger interactions fall back to plain dot products.
const SCRATCH_BLOCKS: usize = 512;

/// Samples per batch below which the interaction runs on the calling thread.
const PARALLEL_MIN_SAMPLES: usize = 64;

/// The dot interaction for `num_sparse` embedding vectors plus the bottom-MLP output, all of dimension `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interaction {
    num_sparse: usize,
    dim: usize,
}

impl Interaction {
    /// The interaction of `num_sparse` embeddings of dimension `dim` with the bottom-MLP output.
    ///
    /// # Panics
    /// If `dim` is 0.
    pub fn new(num_sparse: usize, dim: usize) -> Self {
        assert!(dim > 0, "interaction: dimension 0");
        Self { num_sparse, dim }
    }

    /// Number of stacked vectors, `num_sparse + 1`.
    pub fn num_vectors(&self) -> usize {
        self.num_sparse + 1
    }

    /// Output width per sample: `d + n (n - 1) / 2`.
    pub fn out_dim(&self) -> usize {
        let n = self.num_vectors();
        self.dim + n * (n - 1) / 2
    }

    /// `out[batch x out_dim]` from `z[batch x d]` and `emb[batch x num_sparse x d]`.
    ///
    /// # Panics
    /// If a slice length does not match `batch` and the sizes.
    pub fn forward(&self, batch: usize, z: &[f32], emb: &[f32], out: &mut [f32]) {
        self.forward_on(true, batch, z, emb, out);
    }

    /// [`forward`](Self::forward), split over the current rayon pool only when `parallel`.
    pub(crate) fn forward_on(
        &self,
        parallel: bool,
        batch: usize,
        z: &[f32],
        emb: &[f32],
        out: &mut [f32],
    ) {
        let (d, s, w) = (self.dim, self.num_sparse, self.out_dim());
        assert_eq!(z.len(), batch * d, "interaction forward: z");
        assert_eq!(emb.len(), batch * s * d, "interaction forward: emb");
        assert_eq!(out.len(), batch * w, "interaction forward: out");
        if s == 0 {
            // No pairs: the output is z.
            out.copy_from_slice(z);
        } else if !parallel || batch < PARALLEL_MIN_SAMPLES {
            forward_rows(d, s, z, emb, out);
        } else {
            let rows = rows_per_task(batch);
            z.par_chunks(rows * d)
                .zip(emb.par_chunks(rows * s * d))
                .zip(out.par_chunks_mut(rows * w))
                .for_each(|((z, e), o)| forward_rows(d, s, z, e, o));
        }
    }

    /// Backward pass: from `dout[batch x out_dim]` and the forward inputs, writes `dz[batch x d]` and
    /// `demb[batch x num_sparse x d]` (overwriting both).
    ///
    /// # Panics
    /// If a slice length does not match `batch` and the sizes.
    pub fn backward(
        &self,
        batch: usize,
        z: &[f32],
        emb: &[f32],
        dout: &[f32],
        dz: &mut [f32],
        demb: &mut [f32],
    ) {
        self.backward_on(true, batch, z, emb, dout, dz, demb);
    }

    /// [`backward`](Self::backward), split over the current rayon pool only when `parallel`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_on(
        &self,
        parallel: bool,
        batch: usize,
        z: &[f32],
        emb: &[f32],
        dout: &[f32],
        dz: &mut [f32],
        demb: &mut [f32],
    ) {
        let (d, s, w) = (self.dim, self.num_sparse, self.out_dim());
        assert_eq!(z.len(), batch * d, "interaction backward: z");
        assert_eq!(emb.len(), batch * s * d, "interaction backward: emb");
        assert_eq!(dout.len(), batch * w, "interaction backward: dout");
        assert_eq!(dz.len(), batch * d, "interaction backward: dz");
        assert_eq!(demb.len(), batch * s * d, "interaction backward: demb");
        if s == 0 {
            dz.copy_from_slice(dout);
        } else if !parallel || batch < PARALLEL_MIN_SAMPLES {
            backward_rows(d, s, z, emb, dout, dz, demb);
        } else {
            let rows = rows_per_task(batch);
            z.par_chunks(rows * d)
                .zip(emb.par_chunks(rows * s * d))
                .zip(dout.par_chunks(rows * w))
                .zip(
                    dz.par_chunks_mut(rows * d)
                        .zip(demb.par_chunks_mut(rows * s * d)),
                )
                .for_each(|(((z, e), g), (dz, de))| backward_rows(d, s, z, e, g, dz, de));
        }
    }
}

multiversion! {
    /// Forward over a run of samples (`s >= 1`).
    fn forward_rows(d: usize, s: usize, z: &[f32], emb: &[f32], out: &mut [f32]) {
        // Inlined with a constant `d`, the inner loops become fixed-width vector code.
        match d {
            16 => forward_run(16, s, z, emb, out),
            32 => forward_run(32, s, z, emb, out),
            8 => forward_run(8, s, z, emb, out),
            64 => forward_run(64, s, z, emb, out),
            _ => forward_run(d, s, z, emb, out),
        }
    }
}

multiversion! {
    /// Backward over a run of samples (`s >= 1`).
    fn backward_rows(d: usize, s: usize, z: &[f32], emb: &[f32], dout: &[f32], dz: &mut [f32], demb: &mut [f32]) {
        let w = d + (s + 1) * s / 2;
        let rows = z.chunks_exact(d).zip(emb.chunks_exact(s * d)).zip(dout.chunks_exact(w));
        for (((z, e), g), (dz, de)) in rows.zip(dz.chunks_exact_mut(d).zip(demb.chunks_exact_mut(s * d))) {
            match d {
                16 => backward_sample(16, s, z, e, g, dz, de),
                32 => backward_sample(32, s, z, e, g, dz, de),
                8 => backward_sample(8, s, z, e, g, dz, de),
                64 => backward_sample(64, s, z, e, g, dz, de),
                _ => backward_sample(d, s, z, e, g, dz, de),
            }
        }
    }
}

/// Vector `k` of the stack `[z; e_1; …]`.
#[inline(always)]
fn vector<'a>(d: usize, k: usize, z: &'a [f32], e: &'a [f32]) -> &'a [f32] {
    if k == 0 {
        &z[..d]
    } else {
        &e[(k - 1) * d..k * d]
    }
}

/// Forward over a run of samples. Per sample, `Tᵀ` goes into a stack buffer block-major: block `b` is
/// `d` rows (one per coordinate) of the [`LANES`] vectors `b * LANES ..`; padding lanes past `n` are
/// never kept in the output, so stale values there are harmless. The transpose of sample `k + 1` is
/// written before the Gram rows of sample `k` are computed, so that its scalar stores have retired
/// before vector loads read them (a wide load right after overlapping narrow stores stalls; this
/// measured a few percent).
#[inline(always)]
fn forward_run(d: usize, s: usize, z: &[f32], emb: &[f32], out: &mut [f32]) {
    let n = s + 1;
    let (nb, w) = (n.div_ceil(LANES), d + n * s / 2);
    if 2 * nb * d > SCRATCH_BLOCKS {
        for ((z, e), o) in z
            .chunks_exact(d)
            .zip(emb.chunks_exact(s * d))
            .zip(out.chunks_exact_mut(w))
        {
            o[..d].copy_from_slice(z);
            let mut p = d;
            for i in 1..n {
                let ti = vector(d, i, z, e);
                for j in 0..i {
                    o[p] = vector(d, j, z, e).iter().zip(ti).map(|(a, b)| a * b).sum();
                    p += 1;
                }
            }
        }
        return;
    }
    let mut scratch = [[0.0f32; LANES]; SCRATCH_BLOCKS];
    let (even, odd) = scratch.split_at_mut(nb * d);
    let odd = &mut odd[..nb * d];
    let count = z.len() / d;
    let fast = fast_transpose(d);
    let transpose = |d, n, z: &[f32], e: &[f32], tt: &mut [[f32; LANES]]| {
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: `fast_transpose` checked that the CPU has AVX-512 F.
            return unsafe { transpose_avx512(d, n, z, e, tt) };
        }
        transpose(d, n, z, e, tt)
    };
    if count > 0 {
        transpose(d, n, &z[..d], &emb[..s * d], even);
    }
    for (k, o) in out.chunks_exact_mut(w).enumerate() {
        let (cur, next) = if k % 2 == 0 {
            (&*even, &mut *odd)
        } else {
            (&*odd, &mut *even)
        };
        if k + 1 < count {
            transpose(
                d,
                n,
                &z[(k + 1) * d..][..d],
                &emb[(k + 1) * s * d..][..s * d],
                next,
            );
        }
        gram_rows(d, n, &z[k * d..][..d], &emb[k * s * d..][..s * d], cur, o);
    }
}

/// Whether [`transpose_avx512`] can replace [`transpose`] (they write the same values): for `d = 16`
/// (the default model) on CPUs with AVX-512.
#[inline(always)]
fn fast_transpose(d: usize) -> bool {
    cfg!(target_arch = "x86_64") && d == LANES && base::simd::isa() == base::simd::Isa::Avx512
}

/// [`transpose`] for `d == LANES`: 16 vectors at a time as one 16 x 16 transpose in registers (the
/// scalar version's strided stores took about a third of the forward pass).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose_avx512(d: usize, n: usize, z: &[f32], e: &[f32], tt: &mut [[f32; LANES]]) {
    use std::arch::x86_64::*;
    debug_assert_eq!(d, LANES);
    for b in 0..n.div_ceil(LANES) {
        let mut rows = [_mm512_setzero_si512(); LANES];
        for (r, row) in rows.iter_mut().enumerate() {
            let k = b * LANES + r;
            if k < n {
                let v = vector(d, k, z, e);
                // SAFETY: `v` has `d == 16` elements.
                *row = unsafe { _mm512_loadu_si512(v.as_ptr().cast()) };
            }
        }
        base::simd::transpose16(&mut rows);
        for (c, &row) in rows.iter().enumerate() {
            let out = &mut tt[b * d + c];
            // SAFETY: `out` is 16 f32.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), row) };
        }
    }
}

/// Writes `Tᵀ` of one sample, block-major (see [`forward_run`]).
#[inline(always)]
fn transpose(d: usize, n: usize, z: &[f32], e: &[f32], tt: &mut [[f32; LANES]]) {
    for k in 0..n {
        let block = &mut tt[(k / LANES) * d..][..d];
        for (row, &v) in block.iter_mut().zip(vector(d, k, z, e)) {
            row[k % LANES] = v;
        }
    }
}

/// One sample's output from its `Tᵀ`.
#[inline(always)]
fn gram_rows(d: usize, n: usize, z: &[f32], e: &[f32], tt: &[[f32; LANES]], out: &mut [f32]) {
    out[..d].copy_from_slice(z);
    // Rows i and i + 1 together: two independent sums per column block, sharing the loads of `Tᵀ`.
    let mut i = 1;
    while i < n {
        let pair = i + 1 < n;
        let ti = vector(d, i, z, e);
        let tn = if pair { vector(d, i + 1, z, e) } else { ti };
        let blocks = (i + pair as usize).div_ceil(LANES);
        // Last block first: see `store_block`.
        for block in (0..blocks).rev() {
            let cols = &tt[block * d..][..d];
            // Coordinates in two interleaved halves: four independent FMA chains instead of two.
            let (mut a, mut b) = ([0.0f32; LANES], [0.0f32; LANES]);
            let (mut a1, mut b1) = ([0.0f32; LANES], [0.0f32; LANES]);
            let (c2, x2, y2) = (cols.chunks_exact(2), ti.chunks_exact(2), tn.chunks_exact(2));
            let (cr, xr, yr) = (c2.remainder(), x2.remainder(), y2.remainder());
            for ((col, x), y) in c2.zip(x2).zip(y2) {
                for l in 0..LANES {
                    a[l] = x[0].mul_add(col[0][l], a[l]);
                    b[l] = y[0].mul_add(col[0][l], b[l]);
                    a1[l] = x[1].mul_add(col[1][l], a1[l]);
                    b1[l] = y[1].mul_add(col[1][l], b1[l]);
                }
            }
            for ((col, &x), &y) in cr.iter().zip(xr).zip(yr) {
                for l in 0..LANES {
                    a[l] = x.mul_add(col[l], a[l]);
                    b[l] = y.mul_add(col[l], b[l]);
                }
            }
            for l in 0..LANES {
                a[l] += a1[l];
                b[l] += b1[l];
            }
            store_block(out, d + i * (i - 1) / 2, i, block, a);
            if pair {
                store_block(out, d + (i + 1) * i / 2, i + 1, block, b);
            }
        }
        i += 2;
    }
}

/// Writes column block `block` of Gram row `i` (which starts at `row_start` and has `i` entries), with a
/// full-width store when it fits in `out`. Lanes past the row's end then land in the first block of the
/// next row, which is always written later: blocks go last to first, and row `i` before row `i + 1`.
#[inline(always)]
fn store_block(out: &mut [f32], row_start: usize, i: usize, block: usize, acc: [f32; LANES]) {
    let p = row_start + block * LANES;
    let take = (i - block * LANES).min(LANES);
    if take == 0 {
        // Row i + 1 may need one more block than row i.
        return;
    }
    if p + LANES <= out.len() {
        out[p..p + LANES].copy_from_slice(&acc);
    } else {
        out[p..p + take].copy_from_slice(&acc[..take]);
    }
}

/// One sample's backward: `dT_i = Σ_{j<i} g_ij T_j + Σ_{j>i} g_ji T_j`, and `dz = dout[..d] + dT_0`.
/// Rows `i` and `i + 1` together (two independent sums sharing the loads of `T_j`), [`LANES`] coordinates
/// at a time.
#[inline(always)]
fn backward_sample(
    d: usize,
    s: usize,
    z: &[f32],
    e: &[f32],
    g: &[f32],
    dz: &mut [f32],
    de: &mut [f32],
) {
    let n = s + 1;
    // Pair (i, j < i) sits at i (i - 1) / 2 + j.
    let pairs = &g[d..];
    let mut i = 0;
    while i < n {
        let pair = i + 1 < n;
        let (ri, rn) = (i * i.saturating_sub(1) / 2, (i + 1) * i / 2);
        for lo in (0..d).step_by(LANES) {
            let width = LANES.min(d - lo);
            let t = |k: usize| &vector(d, k, z, e)[lo..lo + width];
            let (mut a, mut b) = ([0.0f32; LANES], [0.0f32; LANES]);
            if i == 0 {
                a[..width].copy_from_slice(&g[lo..lo + width]);
            }
            if pair {
                for j in 0..i {
                    axpy2(&mut a, pairs[ri + j], &mut b, pairs[rn + j], t(j));
                }
                // The pair (i + 1, i) itself.
                axpy(&mut b, pairs[rn + i], t(i));
                axpy(&mut a, pairs[rn + i], t(i + 1));
                for j in i + 2..n {
                    let r = j * (j - 1) / 2 + i;
                    axpy2(&mut a, pairs[r], &mut b, pairs[r + 1], t(j));
                }
            } else {
                for j in 0..i {
                    axpy(&mut a, pairs[ri + j], t(j));
                }
                for j in i + 1..n {
                    axpy(&mut a, pairs[j * (j - 1) / 2 + i], t(j));
                }
            }
            // Embedding row k >= 1 of the output.
            let row = |k: usize| (k - 1) * d + lo..(k - 1) * d + lo + width;
            if i == 0 {
                dz[lo..lo + width].copy_from_slice(&a[..width]);
            } else {
                de[row(i)].copy_from_slice(&a[..width]);
            }
            if pair {
                de[row(i + 1)].copy_from_slice(&b[..width]);
            }
        }
        i += 2;
    }
}

/// `acc += g t` over the first `t.len()` lanes.
#[inline(always)]
fn axpy(acc: &mut [f32; LANES], g: f32, t: &[f32]) {
    for (a, &t) in acc.iter_mut().zip(t) {
        *a = g.mul_add(t, *a);
    }
}

/// `a += ga t; b += gb t`.
#[inline(always)]
fn axpy2(a: &mut [f32; LANES], ga: f32, b: &mut [f32; LANES], gb: f32, t: &[f32]) {
    for ((a, b), &t) in a.iter_mut().zip(b.iter_mut()).zip(t) {
        *a = ga.mul_add(t, *a);
        *b = gb.mul_add(t, *b);
    }
}

#[cfg(test)]
mod tests {
    use super::super::rng::Rng;
    use super::super::testutil::{check_grad, dot64, rand_vec};
    use super::*;

    /// Naive reference: build T, all dots i > j in the reference order.
    fn naive(batch: usize, s: usize, d: usize, z: &[f32], emb: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        for b in 0..batch {
            let t = |k: usize| -> Vec<f32> {
                if k == 0 {
                    z[b * d..(b + 1) * d].to_vec()
                } else {
                    emb[(b * s + k - 1) * d..(b * s + k) * d].to_vec()
                }
            };
            out.extend_from_slice(&t(0));
            for i in 1..=s {
                for j in 0..i {
                    out.push(t(i).iter().zip(t(j)).map(|(a, b)| a * b).sum());
                }
            }
        }
        out
    }

    #[test]
    fn hand_computed_forward() {
        // z = [1, 2], e1 = [3, 4], e2 = [-1, 0.5]: dots (1,0) = 11, (2,0) = 0, (2,1) = -1.
        let it = Interaction::new(2, 2);
        assert_eq!(it.out_dim(), 5);
        let mut out = vec![0.0; 5];
        it.forward(1, &[1.0, 2.0], &[3.0, 4.0, -1.0, 0.5], &mut out);
        assert_eq!(out, [1.0, 2.0, 11.0, 0.0, -1.0]);
    }

    #[test]
    fn forward_matches_naive_for_many_shapes() {
        let mut rng = Rng::new(5);
        // Covers the specialized d, a generic d, n across lane blocks, the large-d fallback, and the
        // parallel path (batch >= 64).
        for &(batch, s, d) in &[
            (3, 26, 16),
            (2, 40, 8),
            (4, 5, 3),
            (2, 3, 300),
            (70, 26, 16),
            (1, 1, 1),
        ] {
            let z = rand_vec(&mut rng, batch * d, 1.0);
            let emb = rand_vec(&mut rng, batch * s * d, 1.0);
            let it = Interaction::new(s, d);
            let mut out = vec![0.0; batch * it.out_dim()];
            it.forward(batch, &z, &emb, &mut out);
            let want = naive(batch, s, d, &z, &emb);
            for (k, (a, b)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "({batch},{s},{d}) out[{k}] {a} vs {b}"
                );
            }
        }
    }

    fn grad_check(batch: usize, s: usize, d: usize) {
        let mut rng = Rng::new(9);
        let it = Interaction::new(s, d);
        let mut z = rand_vec(&mut rng, batch * d, 1.0);
        let mut emb = rand_vec(&mut rng, batch * s * d, 1.0);
        let r = rand_vec(&mut rng, batch * it.out_dim(), 1.0);
        let mut dz = vec![0.0; z.len()];
        let mut demb = vec![0.0; emb.len()];
        it.backward(batch, &z, &emb, &r, &mut dz, &mut demb);
        let loss = |z: &[f32], emb: &[f32]| {
            let mut out = vec![0.0; batch * it.out_dim()];
            it.forward(batch, z, emb, &mut out);
            dot64(&out, &r)
        };
        check_grad("z", &dz, 1e-2, 1e-2, 1e-3, |i, delta| {
            z[i] += delta;
            let l = loss(&z, &emb);
            z[i] -= delta;
            l
        });
        check_grad("emb", &demb, 1e-2, 1e-2, 1e-3, |i, delta| {
            emb[i] += delta;
            let l = loss(&z, &emb);
            emb[i] -= delta;
            l
        });
    }

    #[test]
    fn gradients_match_finite_differences() {
        grad_check(2, 4, 16);
        grad_check(3, 3, 5);
        grad_check(70, 2, 8);
    }

    #[test]
    fn no_sparse_features_passes_z_through() {
        let it = Interaction::new(0, 3);
        let mut out = vec![0.0; 6];
        it.forward(2, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[], &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (mut dz, mut demb) = (vec![0.0; 6], vec![]);
        it.backward(2, &[0.0; 6], &[], &out, &mut dz, &mut demb);
        assert_eq!(dz, out);
    }
}
