//! [`CrossNet`]: DCNv2's low-rank cross layers (TorchRec's `LowRankCrossNet`, used by MLPerf DLRM-v2),
//! forward and exact backward.
//!
//! Per sample, `x0 = [z, e_1, ..., e_F]` (the bottom-MLP output then the pooled embeddings, width
//! `D = emb_dim + emb_width`), and per layer `l`
//!
//! ```text
//! v_l     = V_l x_l            V_l [rank x D], no bias
//! u_l     = U_l v_l + b_l      U_l [D x rank], b_l [D]
//! x_{l+1} = x0 * u_l + x_l     element-wise
//! ```
//!
//! The top MLP reads `x_L`. Backward, with `g = d loss / d x_{l+1}`: `h = g * x0` is `d loss / d u_l`, so
//! `dU_l = hᵀ v_l`, `db_l = Σ_rows h`, `dv = h U_l`, `dV_l = dvᵀ x_l`, `d loss / d x_l = g + dv V_l`, and
//! every layer adds `g * u_l` to `d loss / d x0`. The gradient of `x0` splits into `d loss / d z` (to the
//! bottom MLP) and the embeddings' gradients.
//!
//! # Design decisions
//! - `V_l` and `U_l` are [`Linear`] layers (`V_l` [`without_bias`](Linear::without_bias)), so their products
//!   go through the `gemm` wrapper in f32 and through the packed bf16 kernels when the model runs in bf16,
//!   like the MLPs' ([`Dlrm::set_precision`](super::Dlrm::set_precision)); the element-wise passes and
//!   `x0` stay f32.
//! - Parameter order (for `Dlrm::params`, checkpoints, optimizer slots and flat gradients): per layer `V_l`'s
//!   weight, then `U_l`'s weight, then `b_l`.
//! - Initialization, drawn from the model's generator after the bottom MLP and before the top MLP, layer by
//!   layer: `V_l`'s weight from normal(0, sqrt(2 / (D + rank))), then `U_l`'s weight from
//!   normal(0, sqrt(2 / (rank + D))) and `b_l` from normal(0, sqrt(1 / D)) — the same rule as every
//!   [`Linear`] layer (TorchRec itself uses Xavier-normal weights and zero biases; a PyTorch reference that
//!   wants our numbers copies the weights).
//! - Per chunk of rows (`CrossBuffers`) the forward keeps `x_0 .. x_{L-1}`, `v_l` and `u_l` for the
//!   backward, `(2 D + rank) L` floats per row, and the backward needs `3 D + rank` more (at DLRM-v2's sizes
//!   and 512 rows per chunk: about 68 MB per chunk). Recomputing `u_l` instead would cost a product per layer.
//! - The element-wise passes run on the chunk's thread (chunks already run in parallel; with fewer chunks
//!   than threads only the products are split over the pool), in a fixed order, so results do not depend
//!   on the pool.

use super::aligned::{slot, Aligned};
use super::bf16;
use super::linear::Linear;
use super::rng::Rng;
use base::multiversion;

/// The low-rank cross network: `layers` cross layers of rank `rank` over `x0 = [z, e]` of width
/// `dense_dim + emb_width`.
#[derive(Debug, Clone)]
pub struct CrossNet {
    /// Width of `z`, the bottom-MLP output.
    dense_dim: usize,
    /// `D`: the width of `x0` and of every `x_l`.
    dim: usize,
    rank: usize,
    /// Per cross layer, `V_l` then `U_l`.
    layers: Vec<Linear>,
}

/// One chunk's cross-layer activations and backward scratch, grown to the largest chunk seen.
#[derive(Debug, Clone, Default)]
pub(crate) struct CrossBuffers {
    /// `x_0 .. x_{L-1}`, each `[rows x D]` (`x_L` goes to the caller's output).
    xs: Vec<Aligned<f32>>,
    /// `v_l`, each `[rows x rank]`.
    vs: Vec<Aligned<f32>>,
    /// `u_l`, each `[rows x D]`.
    us: Vec<Aligned<f32>>,
    /// `d loss / d u_l`, `[rows x D]`.
    h: Aligned<f32>,
    /// `d loss / d v_l`, `[rows x rank]`.
    dv: Aligned<f32>,
    /// `dv V_l`, `[rows x D]`.
    dx: Aligned<f32>,
    /// `d loss / d x0`, `[rows x D]`.
    dx0: Aligned<f32>,
}

impl CrossNet {
    /// `layers` cross layers of rank `rank` over `x0 = [z, e]` with `z` of width `dense_dim` and `e` of
    /// width `emb_width`, initialized from `rng` as the module docs say.
    ///
    /// # Panics
    /// If `layers`, `rank` or `dense_dim + emb_width` is 0 (the config validation refuses these).
    pub(crate) fn init(
        dense_dim: usize,
        emb_width: usize,
        rank: usize,
        layers: usize,
        rng: &mut Rng,
    ) -> Self {
        let dim = dense_dim + emb_width;
        assert!(dim > 0 && rank > 0 && layers > 0, "cross net: a size is 0");
        let layers = (0..layers)
            .flat_map(|_| {
                let v = Linear::init_without_bias(dim, rank, rng);
                let u = Linear::init(rank, dim, false, rng);
                [v, u]
            })
            .collect();
        Self {
            dense_dim,
            dim,
            rank,
            layers,
        }
    }

    /// `D`, the width of `x0` and of the output.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Width of `z`, the bottom-MLP output at the start of `x0`.
    pub fn dense_dim(&self) -> usize {
        self.dense_dim
    }

    /// Rank of every layer's `U V` factorization.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of cross layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len() / 2
    }

    /// Every layer's `V_l` (`[rank x D]`, no bias) then `U_l` (`[D x rank]` with bias `b_l`).
    pub fn layers(&self) -> &[Linear] {
        &self.layers
    }

    /// The layers, for the optimizer and the bf16 packing.
    pub(crate) fn layers_mut(&mut self) -> &mut [Linear] {
        &mut self.layers
    }

    /// Number of parameters: per layer `2 D rank + D`.
    pub fn num_params(&self) -> usize {
        self.layers
            .iter()
            .flat_map(Linear::params)
            .map(<[f32]>::len)
            .sum()
    }

    /// Room one layer's gradients take in a chunk's flat gradients (each tensor in its own [`slot`]).
    fn grads_per_layer(&self) -> usize {
        let (d, r) = (self.dim, self.rank);
        slot(r * d) + slot(d * r) + slot(d)
    }

    /// Room all layers' gradients take in a chunk's flat gradients.
    pub(crate) fn grads_len(&self) -> usize {
        self.num_layers() * self.grads_per_layer()
    }

    /// Forward over one chunk of `rows` samples: `out[rows x D] = x_L` from `z[rows x dense_dim]` and
    /// `emb[rows x emb_width]`, keeping the activations in `bufs` for [`backward_chunk`](Self::backward_chunk).
    /// The products run in bf16 when the layers are packed, else in f32 split over the pool when `parallel`.
    ///
    /// # Panics
    /// If a slice length does not match `rows` and the sizes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_chunk(
        &self,
        parallel: bool,
        rows: usize,
        z: &[f32],
        emb: &[f32],
        out: &mut [f32],
        bufs: &mut CrossBuffers,
        scratch: &mut bf16::Scratch,
    ) {
        let (d, r, n) = (self.dim, self.rank, self.num_layers());
        assert_eq!(z.len(), rows * self.dense_dim, "cross forward: z");
        assert_eq!(emb.len(), rows * (d - self.dense_dim), "cross forward: emb");
        assert_eq!(out.len(), rows * d, "cross forward: out");
        bufs.grow(n, rows, d, r);
        let x0 = &mut bufs.xs[0][..rows * d];
        gather_x0(self.dense_dim, d - self.dense_dim, z, emb, x0);
        for l in 0..n {
            let (v_layer, u_layer) = (&self.layers[2 * l], &self.layers[2 * l + 1]);
            let v = &mut bufs.vs[l][..rows * r];
            let u = &mut bufs.us[l][..rows * d];
            v_layer.forward_chunk(parallel, rows, &bufs.xs[l][..rows * d], v, scratch);
            u_layer.forward_chunk(parallel, rows, v, u, scratch);
            let (before, after) = bufs.xs.split_at_mut(l + 1);
            let next = match after.first_mut() {
                Some(next) => &mut next[..rows * d],
                None => &mut *out,
            };
            cross_combine(next, &before[0][..rows * d], u, &before[l][..rows * d]);
        }
    }

    /// Backward over the chunk of the last [`forward_chunk`](Self::forward_chunk) on `bufs`: from
    /// `dout = d loss / d x_L` (`[rows x D]`, used as scratch: overwritten), writes `dz` (`[rows x
    /// dense_dim]`), `demb` (`[rows x emb_width]`) and the layers' gradients into `grads`
    /// ([`grads_len`](Self::grads_len) long: per layer `V_l`, `U_l`, `b_l`, each in its own [`slot`]).
    ///
    /// # Panics
    /// If a slice length does not match `rows` and the sizes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_chunk(
        &self,
        parallel: bool,
        rows: usize,
        dout: &mut [f32],
        dz: &mut [f32],
        demb: &mut [f32],
        grads: &mut [f32],
        bufs: &mut CrossBuffers,
        scratch: &mut bf16::Scratch,
    ) {
        let (d, r, n) = (self.dim, self.rank, self.num_layers());
        assert_eq!(dout.len(), rows * d, "cross backward: dout");
        assert_eq!(dz.len(), rows * self.dense_dim, "cross backward: dz");
        assert_eq!(
            demb.len(),
            rows * (d - self.dense_dim),
            "cross backward: demb"
        );
        assert_eq!(grads.len(), self.grads_len(), "cross backward: grads");
        let CrossBuffers {
            xs,
            vs,
            us,
            h,
            dv,
            dx,
            dx0,
        } = bufs;
        let x0 = &xs[0][..rows * d];
        let (h, dv, dx, dx0) = (
            &mut h[..rows * d],
            &mut dv[..rows * r],
            &mut dx[..rows * d],
            &mut dx0[..rows * d],
        );
        // `g` (in `dout`) is d loss / d x_{l+1} on entry to iteration l, d loss / d x_l after it.
        let g = dout;
        let per = self.grads_per_layer();
        for l in (0..n).rev() {
            let (v_layer, u_layer) = (&self.layers[2 * l], &self.layers[2 * l + 1]);
            let (vw, rest) = grads[l * per..(l + 1) * per].split_at_mut(slot(r * d));
            let (uw, ub) = rest.split_at_mut(slot(d * r));
            let (vw, uw, ub) = (&mut vw[..r * d], &mut uw[..d * r], &mut ub[..d]);
            let (v, u) = (&vs[l][..rows * r], &us[l][..rows * d]);
            cross_grads(g, x0, u, h, dx0, l + 1 == n);
            u_layer.backward_into(parallel, rows, v, u, h, Some(&mut *dv), uw, ub, scratch);
            let x = &xs[l][..rows * d];
            v_layer.backward_into(
                parallel,
                rows,
                x,
                v,
                dv,
                Some(&mut *dx),
                vw,
                &mut [],
                scratch,
            );
            add(g, dx);
        }
        // x_0 is x0 itself: its gradient through the layer chain joins the direct terms.
        add(dx0, g);
        scatter_x0(self.dense_dim, d - self.dense_dim, dx0, dz, demb);
    }
}

impl CrossBuffers {
    /// Buffers for `layers` layers of chunks of `rows` rows, width `d` and rank `r`.
    fn grow(&mut self, layers: usize, rows: usize, d: usize, r: usize) {
        for (bufs, width) in [(&mut self.xs, d), (&mut self.vs, r), (&mut self.us, d)] {
            bufs.resize_with(layers, Aligned::default);
            bufs.iter_mut().for_each(|b| b.grow(rows * width));
        }
        for (buf, width) in [
            (&mut self.h, d),
            (&mut self.dv, r),
            (&mut self.dx, d),
            (&mut self.dx0, d),
        ] {
            buf.grow(rows * width);
        }
    }
}

/// `x0` row by row: `[z_i, emb_i]` (rows of `dense_dim` and `w`).
fn gather_x0(dense_dim: usize, w: usize, z: &[f32], emb: &[f32], x0: &mut [f32]) {
    for (i, row) in x0.chunks_exact_mut(dense_dim + w).enumerate() {
        let (zr, er) = row.split_at_mut(dense_dim);
        zr.copy_from_slice(&z[i * dense_dim..][..dense_dim]);
        er.copy_from_slice(&emb[i * w..][..w]);
    }
}

/// Splits `d loss / d x0` row by row into `dz` (the first `dense_dim` of each row) and `demb` (the other
/// `w`).
fn scatter_x0(dense_dim: usize, w: usize, dx0: &[f32], dz: &mut [f32], demb: &mut [f32]) {
    for (i, row) in dx0.chunks_exact(dense_dim + w).enumerate() {
        let (zr, er) = row.split_at(dense_dim);
        dz[i * dense_dim..][..dense_dim].copy_from_slice(zr);
        demb[i * w..][..w].copy_from_slice(er);
    }
}

multiversion! {
    /// `next = x0 * u + x`, element-wise.
    fn cross_combine(next: &mut [f32], x0: &[f32], u: &[f32], x: &[f32]) {
        for (((n, &a), &b), &c) in next.iter_mut().zip(x0).zip(u).zip(x) {
            *n = a * b + c;
        }
    }
}

multiversion! {
    /// `h = g * x0` and `dx0 = g * u` (`first`) or `dx0 += g * u`, element-wise, in one pass.
    fn cross_grads(g: &[f32], x0: &[f32], u: &[f32], h: &mut [f32], dx0: &mut [f32], first: bool) {
        let it = g.iter().zip(x0).zip(u).zip(h.iter_mut().zip(dx0.iter_mut()));
        if first {
            for (((&g, &a), &u), (h, dx0)) in it {
                *h = g * a;
                *dx0 = g * u;
            }
        } else {
            for (((&g, &a), &u), (h, dx0)) in it {
                *h = g * a;
                *dx0 += g * u;
            }
        }
    }
}

multiversion! {
    /// `dst += src`.
    fn add(dst: &mut [f32], src: &[f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d += s;
        }
    }
}

#[cfg(test)]
mod tests;
