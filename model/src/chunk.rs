//! The data-parallel step: the batch is cut into chunks of rows, and each chunk runs the whole forward and
//! backward pass — bottom MLP, interaction, top MLP, loss, and back — on one thread, into its own buffers
//! and its own parameter gradients; [`Dlrm`](super::Dlrm) then sums the chunks' gradients in chunk order.
//!
//! Why: splitting every matrix product and element-wise pass over the pool (the first design) joins the
//! threads some forty times per step, leaves the small layers (k = 13, n = 1) on one thread, and streams
//! each full-batch activation through memory. In a chunk of [`CHUNK_ROWS`] rows a layer's input and output
//! (1 MiB each at 512 x 512) stay in L2 between the product and the element-wise pass, and the threads
//! meet once per step (plus the optimizer pass). The chunks depend on the batch size alone, never on the pool, so results are
//! bit-identical for any thread count; with fewer chunks than threads, the products inside a chunk are
//! split over the pool as before (`gemm` divides rows and columns, never the inner dimension, so that
//! split does not change the result either).

use rayon::prelude::*;

use super::aligned::{slot, Aligned};
use super::bf16;
use super::cross::CrossBuffers;
use super::interaction_layer::InteractionLayer;
use super::linear::Linear;
use super::loss::bce_sum;
use base::multiversion;

/// Gradient tensors with fewer elements than this are summed on the calling thread.
const PARALLEL_MIN_ELEMS: usize = 1 << 15;

/// Elements per parallel task of the gradient sum.
const SUM_CHUNK: usize = 1 << 13;

/// Target rows per chunk: big enough for efficient products, small enough that a layer's activations stay
/// in L2, and several chunks per thread at batch 2048 so that a thread slowed by other work (the parameter
/// servers share the cores) is balanced by work stealing. 1024 measured the same within the noise; `gemm`
/// packs the weights once per call, so smaller chunks pay more packing.
pub(crate) const CHUNK_ROWS: usize = 512;

/// `(chunks, rows per chunk)` for a batch of `batch >= 1` rows and a target of `target` rows per chunk
/// (the last chunk may be shorter). Depends on its arguments alone, never on the pool.
pub(crate) fn split(batch: usize, target: usize) -> (usize, usize) {
    let chunks = batch.div_ceil(target.max(1)).max(1);
    let rows = batch.div_ceil(chunks).max(1);
    (batch.div_ceil(rows).max(1), rows)
}

/// What a chunk reads: the layers and the interaction.
pub(crate) struct Net<'a> {
    /// Bottom-MLP layers.
    pub(crate) bottom: &'a [Linear],
    /// Top-MLP layers.
    pub(crate) top: &'a [Linear],
    /// The interaction (dot or cross layers).
    pub(crate) interaction: &'a InteractionLayer,
}

/// One chunk's activations, activation gradients and parameter gradients. Buffers grow to the largest
/// chunk seen and are reused.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChunkBuffers {
    /// Per bottom layer: its output `[rows x out]`.
    bottom: Vec<Aligned<f32>>,
    /// Per bottom layer: `d loss / d output`.
    bottom_grad: Vec<Aligned<f32>>,
    /// Per top layer: its output.
    top: Vec<Aligned<f32>>,
    /// Per top layer: `d loss / d output`.
    top_grad: Vec<Aligned<f32>>,
    /// Interaction output `[rows x interaction_dim]`, the top MLP's input.
    inter_out: Aligned<f32>,
    /// `d loss / d inter_out`.
    inter_grad: Aligned<f32>,
    /// The cross layers' activations and scratch (unused with the dot interaction).
    cross: CrossBuffers,
    /// This chunk's part of every parameter gradient, flat, in [`Dlrm::params`](super::Dlrm::params) order,
    /// each tensor starting on a cache line ([`slot`]: the bf16 products store weight-gradient tiles
    /// straight into it).
    pub(crate) grads: Aligned<f32>,
    /// Sum (not mean) of this chunk's losses.
    pub(crate) loss: f64,
    /// Packed operands of the bf16 products.
    scratch: bf16::Scratch,
    /// Seconds this chunk's last forward pass took on its thread (in [`forward_backward`](Self::forward_backward)).
    pub(crate) forward_secs: f64,
    /// Seconds its last backward pass took.
    pub(crate) backward_secs: f64,
}

impl ChunkBuffers {
    /// Forward pass over `rows` samples; returns the logits `[rows]`.
    pub(crate) fn forward(
        &mut self,
        net: &Net<'_>,
        parallel: bool,
        rows: usize,
        dense: &[f32],
        emb: &[f32],
    ) -> &[f32] {
        let scratch = &mut self.scratch;
        mlp_forward(net.bottom, parallel, rows, dense, &mut self.bottom, scratch);
        let z = last_rows(&self.bottom, net.bottom, rows);
        let w = net.interaction.out_dim();
        self.inter_out.grow(rows * w);
        let inter_out = &mut self.inter_out[..rows * w];
        let cross = &mut self.cross;
        net.interaction
            .forward_chunk(parallel, rows, z, emb, inter_out, cross, scratch);
        mlp_forward(net.top, parallel, rows, inter_out, &mut self.top, scratch);
        last_rows(&self.top, net.top, rows)
    }

    /// Forward and backward pass over `rows` samples: writes `σ(logit)` into `probs`, `d loss / d emb`
    /// into `emb_grad`, this chunk's parameter gradients into [`grads`](Self::grads) and its summed loss
    /// into [`loss`](Self::loss). The loss gradient is scaled by `scale` (`1 / batch` for the batch mean).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_backward(
        &mut self,
        net: &Net<'_>,
        parallel: bool,
        rows: usize,
        dense: &[f32],
        emb: &[f32],
        labels: &[f32],
        scale: f32,
        probs: &mut [f32],
        emb_grad: &mut [f32],
    ) {
        let started = std::time::Instant::now();
        self.forward(net, parallel, rows, dense, emb);
        let forwarded = std::time::Instant::now();
        self.forward_secs = (forwarded - started).as_secs_f64();
        // This chunk's parameter gradients: bottom, interaction, top, in `Dlrm::params` order.
        let bottom_params: usize = net.bottom.iter().map(num_params).sum();
        let inter_params = net.interaction.grads_len();
        let top_params: usize = net.top.iter().map(num_params).sum();
        let total = bottom_params + inter_params + top_params;
        self.grads.grow(total);
        let (bottom_grads, rest) = self.grads[..total].split_at_mut(bottom_params);
        let (inter_grads, top_grads) = rest.split_at_mut(inter_params);

        grow_layers(&mut self.top_grad, net.top, rows);
        let last = net.top.len() - 1;
        self.loss = bce_sum(
            last_rows(&self.top, net.top, rows),
            labels,
            probs,
            &mut self.top_grad[last][..rows],
            scale,
        );
        let w = net.interaction.out_dim();
        self.inter_grad.grow(rows * w);
        let inter_grad = &mut self.inter_grad[..rows * w];
        mlp_backward(
            net.top,
            parallel,
            rows,
            &self.inter_out[..rows * w],
            &self.top,
            &mut self.top_grad,
            Some(&mut *inter_grad),
            top_grads,
            &mut self.scratch,
        );

        grow_layers(&mut self.bottom_grad, net.bottom, rows);
        let last = net.bottom.len() - 1;
        let d = net.bottom[last].out_dim();
        net.interaction.backward_chunk(
            parallel,
            rows,
            last_rows(&self.bottom, net.bottom, rows),
            emb,
            inter_grad,
            &mut self.bottom_grad[last][..rows * d],
            emb_grad,
            inter_grads,
            &mut self.cross,
            &mut self.scratch,
        );
        mlp_backward(
            net.bottom,
            parallel,
            rows,
            dense,
            &self.bottom,
            &mut self.bottom_grad,
            None,
            bottom_grads,
            &mut self.scratch,
        );
        self.backward_secs = forwarded.elapsed().as_secs_f64();
    }
}

/// Room for a layer's gradients in the chunks' flat gradients (a layer without bias takes none for it).
fn num_params(layer: &Linear) -> usize {
    layer.params().map(|p| slot(p.len())).sum()
}

/// The last layer's output for `rows` rows: `[rows x layers[last].out_dim()]`.
fn last_rows<'a>(out: &'a [Aligned<f32>], layers: &[Linear], rows: usize) -> &'a [f32] {
    let n = layers.len();
    &out[n - 1][..rows * layers[n - 1].out_dim()]
}

/// One buffer per layer, each at least `rows * out_dim` long.
fn grow_layers(bufs: &mut Vec<Aligned<f32>>, layers: &[Linear], rows: usize) {
    bufs.resize_with(layers.len(), Aligned::default);
    for (buf, layer) in bufs.iter_mut().zip(layers) {
        buf.grow(rows * layer.out_dim());
    }
}

/// Forward through `layers` from `x[rows x in]`; layer `i`'s output goes to `out[i]`.
fn mlp_forward(
    layers: &[Linear],
    parallel: bool,
    rows: usize,
    x: &[f32],
    out: &mut Vec<Aligned<f32>>,
    scratch: &mut bf16::Scratch,
) {
    grow_layers(out, layers, rows);
    for (i, layer) in layers.iter().enumerate() {
        let (before, rest) = out.split_at_mut(i);
        let input = if i == 0 {
            x
        } else {
            &before[i - 1][..rows * layer.in_dim()]
        };
        let y = &mut rest[0][..rows * layer.out_dim()];
        layer.forward_chunk(parallel, rows, input, y, scratch);
    }
}

/// Backward through `layers`: `dout[last]` holds `d loss / d output`; writes every layer's gradients into
/// `grads` (per layer, weight then bias, input side first) and `d loss / d x` into `dx` when given.
#[allow(clippy::too_many_arguments)]
fn mlp_backward(
    layers: &[Linear],
    parallel: bool,
    rows: usize,
    x: &[f32],
    out: &[Aligned<f32>],
    dout: &mut [Aligned<f32>],
    mut dx: Option<&mut [f32]>,
    grads: &mut [f32],
    scratch: &mut bf16::Scratch,
) {
    let mut end = grads.len();
    for i in (0..layers.len()).rev() {
        let layer = &layers[i];
        let (n_in, n_out) = (layer.in_dim(), layer.out_dim());
        let start = end - slot(n_in * n_out) - slot(n_out);
        let (wg, bg) = grads[start..end].split_at_mut(slot(n_in * n_out));
        let (wg, bg) = (&mut wg[..n_in * n_out], &mut bg[..n_out]);
        end = start;
        let (dbefore, drest) = dout.split_at_mut(i);
        let dy = &mut drest[0][..rows * n_out];
        let y = &out[i][..rows * n_out];
        if i == 0 {
            let dx = dx.as_deref_mut();
            layer.backward_into(parallel, rows, x, y, dy, dx, wg, bg, scratch);
        } else {
            let input = &out[i - 1][..rows * n_in];
            let dprev = &mut dbefore[i - 1][..rows * n_in];
            layer.backward_into(parallel, rows, input, y, dy, Some(dprev), wg, bg, scratch);
        }
    }
}

/// `dst = Σ_c chunks[c].grads[offset..offset + dst.len()]`, chunks in order (so the result does not depend
/// on the pool size), split over the pool for big tensors.
pub(crate) fn sum_parts(dst: &mut [f32], chunks: &[ChunkBuffers], offset: usize) {
    if dst.len() < PARALLEL_MIN_ELEMS {
        sum_into(dst, chunks, offset);
    } else {
        dst.par_chunks_mut(SUM_CHUNK)
            .enumerate()
            .for_each(|(i, d)| sum_into(d, chunks, offset + i * SUM_CHUNK));
    }
}

/// `dst = Σ_c chunks[c].grads[offset..offset + dst.len()]`, chunks in order, on the calling thread.
pub(crate) fn sum_into(dst: &mut [f32], chunks: &[ChunkBuffers], offset: usize) {
    let len = dst.len();
    let mut parts = chunks.iter().map(|c| &c.grads[offset..offset + len]);
    if let Some(first) = parts.next() {
        dst.copy_from_slice(first);
    }
    for part in parts {
        add(dst, part);
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
