//! [`Linear`]: one fully connected layer, `y = act(x Wᵀ + b)`, forward and backward via `gemm`.

use rayon::prelude::*;

use super::bf16;
use super::matmul::{matmul_on, Op};
use super::rng::Rng;
use base::multiversion;

/// Element-wise passes over fewer elements than this run on the calling thread.
const PARALLEL_MIN_ELEMS: usize = 1 << 16;

/// Rows per partial sum of the parallel bias-gradient reduction.
const REDUCE_ROWS: usize = 128;

/// A fully connected layer `y = x Wᵀ + b`, optionally followed by a ReLU; or `y = x Wᵀ` for a layer without
/// bias ([`without_bias`](Self::without_bias): its bias is empty and is not a parameter).
///
/// The weight is `[out x in]` row-major (PyTorch's `nn.Linear` layout). The layer owns its parameters and
/// their gradients; activations live with the caller ([`Mlp`](super::Mlp)). Call order: [`forward`](Self::forward),
/// then [`backward`](Self::backward) with the same `x` and the `y` forward wrote; backward overwrites the
/// gradients (it does not accumulate).
#[derive(Debug, Clone)]
pub struct Linear {
    in_dim: usize,
    out_dim: usize,
    relu: bool,
    weight: Vec<f32>,
    bias: Vec<f32>,
    weight_grad: Vec<f32>,
    bias_grad: Vec<f32>,
    /// Per-chunk partial bias sums of the parallel backward pass, `[chunks x out]`.
    partial: Vec<f32>,
    /// The weight rounded to bf16 and packed for the bf16 products, when the model runs in bf16 (see
    /// [`pack_bf16`](Self::pack_bf16)); `None` runs the f32 products.
    packed: Option<PackedWeight>,
}

/// A layer's weight packed for the bf16 products (`bf16`): refreshed after every change of the weight.
#[derive(Debug, Clone, Default)]
struct PackedWeight {
    /// `Wᵀ` (`[in x out]`) in the VNNI layout: the `b` operand of the forward product `x Wᵀ`.
    forward: bf16::Buf,
    /// `W` (`[out x in]`) in the VNNI layout: the `b` operand of the input gradient `dy W`.
    backward: bf16::Buf,
}

impl Linear {
    /// A layer initialized like the DLRM reference: weights from normal(0, sqrt(2 / (in + out))), biases from
    /// normal(0, sqrt(1 / out)).
    pub(crate) fn init(in_dim: usize, out_dim: usize, relu: bool, rng: &mut Rng) -> Self {
        let mut weight = vec![0.0; out_dim * in_dim];
        let mut bias = vec![0.0; out_dim];
        rng.fill_normal(&mut weight, (2.0 / (in_dim + out_dim) as f64).sqrt());
        rng.fill_normal(&mut bias, (1.0 / out_dim as f64).sqrt());
        Self::with_params(in_dim, out_dim, relu, weight, bias)
    }

    /// A layer without bias (and without ReLU), its weight drawn like [`init`](Self::init)'s.
    pub(crate) fn init_without_bias(in_dim: usize, out_dim: usize, rng: &mut Rng) -> Self {
        let mut weight = vec![0.0; out_dim * in_dim];
        rng.fill_normal(&mut weight, (2.0 / (in_dim + out_dim) as f64).sqrt());
        Self::without_bias(in_dim, out_dim, weight)
    }

    /// A layer `y = x Wᵀ` with the given weight `[out x in]`, no bias and no ReLU: [`bias`](Self::bias) is
    /// empty, and [`params`](Self::params) yields the weight alone.
    ///
    /// # Panics
    /// If the weight's length does not match the sizes.
    pub fn without_bias(in_dim: usize, out_dim: usize, weight: Vec<f32>) -> Self {
        let mut layer = Self::with_params(in_dim, out_dim, false, weight, vec![0.0; out_dim]);
        layer.bias = Vec::new();
        layer.bias_grad = Vec::new();
        layer
    }

    /// A layer with the given weight `[out x in]` and bias `[out]`.
    ///
    /// # Panics
    /// If the lengths do not match the sizes.
    pub fn with_params(
        in_dim: usize,
        out_dim: usize,
        relu: bool,
        weight: Vec<f32>,
        bias: Vec<f32>,
    ) -> Self {
        assert_eq!(weight.len(), in_dim * out_dim, "weight length");
        assert_eq!(bias.len(), out_dim, "bias length");
        Self {
            in_dim,
            out_dim,
            relu,
            weight_grad: vec![0.0; weight.len()],
            bias_grad: vec![0.0; out_dim],
            weight,
            bias,
            partial: Vec::new(),
            packed: None,
        }
    }

    /// Whether bf16 products suit this layer: all but the narrowest outputs (the logit layer, `out < 16`,
    /// would waste most of a 32-column block and costs little in f32).
    pub(crate) fn suits_bf16(&self) -> bool {
        self.out_dim >= 16
    }

    /// Packs the current weight for the bf16 products; until [`unpack`](Self::unpack), the chunk passes
    /// ([`forward_chunk`](Self::forward_chunk), [`backward_into`](Self::backward_into)) run in bf16.
    /// Call again after every change of the weight.
    ///
    /// # Panics
    /// If no bf16 kernel is [`available`](bf16::available) (the model checks before choosing bf16).
    pub(crate) fn pack_bf16(&mut self) {
        let (n_in, n_out) = (self.in_dim, self.out_dim);
        let packed = self.packed.get_or_insert_with(PackedWeight::default);
        let len = bf16::pad(n_in) * bf16::pad(n_out);
        bf16::pack_b_transposed(&self.weight, n_out, n_in, packed.forward.get(len));
        bf16::pack_b(&self.weight, n_out, n_in, packed.backward.get(len));
    }

    /// Back to f32 products.
    pub(crate) fn unpack(&mut self) {
        self.packed = None;
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Whether a ReLU follows the affine map.
    pub fn relu(&self) -> bool {
        self.relu
    }

    /// The weight, `[out x in]` row-major.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    /// The bias, `[out]` (empty for a layer [`without_bias`](Self::without_bias)).
    pub fn bias(&self) -> &[f32] {
        &self.bias
    }

    /// Whether the layer has a bias.
    pub fn has_bias(&self) -> bool {
        !self.bias.is_empty()
    }

    /// Number of parameter tensors: 2 (weight, bias), or 1 without bias.
    fn num_tensors(&self) -> usize {
        1 + self.has_bias() as usize
    }

    /// The parameter tensors: the weight, then the bias if the layer has one.
    pub fn params(&self) -> impl Iterator<Item = &[f32]> {
        [&self.weight[..], &self.bias[..]]
            .into_iter()
            .take(self.num_tensors())
    }

    /// The gradients of the last backward pass, in the order of [`params`](Self::params).
    pub fn grads(&self) -> impl Iterator<Item = &[f32]> {
        [&self.weight_grad[..], &self.bias_grad[..]]
            .into_iter()
            .take(self.num_tensors())
    }

    /// Gradient of the weight from the last [`backward`](Self::backward).
    pub fn weight_grad(&self) -> &[f32] {
        &self.weight_grad
    }

    /// Gradient of the bias from the last [`backward`](Self::backward).
    pub fn bias_grad(&self) -> &[f32] {
        &self.bias_grad
    }

    /// Parameters with their gradients, weight first (then the bias, if any): what an optimizer updates.
    pub(crate) fn params_and_grads(&mut self) -> impl Iterator<Item = (&mut [f32], &[f32])> {
        let n = self.num_tensors();
        [
            (&mut self.weight[..], &self.weight_grad[..]),
            (&mut self.bias[..], &self.bias_grad[..]),
        ]
        .into_iter()
        .take(n)
    }

    /// `y[batch x out] = act(x[batch x in] Wᵀ + b)`.
    ///
    /// # Panics
    /// If a slice length does not match `batch` and the layer sizes.
    pub fn forward(&self, batch: usize, x: &[f32], y: &mut [f32]) {
        self.forward_on(true, batch, x, y);
    }

    /// [`forward`](Self::forward), split over the current rayon pool only when `parallel`.
    pub(crate) fn forward_on(&self, parallel: bool, batch: usize, x: &[f32], y: &mut [f32]) {
        let (n_in, n_out) = (self.in_dim, self.out_dim);
        matmul_on(
            parallel,
            batch,
            n_out,
            n_in,
            y,
            false,
            x,
            Op::N,
            &self.weight,
            Op::T,
        );
        // One fused pass for bias and activation, rows split across threads.
        let (bias, relu) = (&self.bias[..], self.relu);
        if parallel && y.len() >= PARALLEL_MIN_ELEMS {
            y.par_chunks_mut(rows_per_task(batch) * n_out)
                .for_each(|y| bias_act_rows(y, bias, relu));
        } else {
            bias_act_rows(y, bias, relu);
        }
    }

    /// [`forward_on`](Self::forward_on) for one chunk of rows: in bf16 (AMX tiles or AVX512-BF16) when the weight is packed
    /// (then on the calling thread, with `scratch` for the packed input), else in f32.
    pub(crate) fn forward_chunk(
        &self,
        parallel: bool,
        batch: usize,
        x: &[f32],
        y: &mut [f32],
        scratch: &mut bf16::Scratch,
    ) {
        let Some(packed) = &self.packed else {
            return self.forward_on(parallel, batch, x, y);
        };
        let (n_in, n_out) = (self.in_dim, self.out_dim);
        assert_eq!(y.len(), batch * n_out, "linear forward: y");
        let a = scratch.a.get(bf16::pad(batch) * bf16::pad(n_in));
        bf16::pack_rows(x, batch, n_in, a);
        bf16::gemm(batch, n_out, n_in, a, &packed.forward, y, n_out);
        bias_act_rows(y, &self.bias, self.relu);
    }

    /// Backward pass. `x` and `y` are the forward input and output; `dy` is `d loss / d y` and is
    /// overwritten with the gradient before the activation. Sets the weight and bias gradients, and writes
    /// `d loss / d x` into `dx` when given.
    ///
    /// # Panics
    /// If a slice length does not match `batch` and the layer sizes.
    pub fn backward(
        &mut self,
        batch: usize,
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
    ) {
        let (n_in, n_out) = (self.in_dim, self.out_dim);
        assert_eq!(y.len(), batch * n_out, "linear backward: y");
        assert_eq!(dy.len(), batch * n_out, "linear backward: dy");
        self.mask_and_bias_grad(batch, y, dy);
        let dims = (batch, n_in, n_out);
        products_backward(true, dims, &self.weight, x, dy, dx, &mut self.weight_grad);
    }

    /// Backward pass over one chunk of rows into caller-owned gradients, for the data-parallel step:
    /// like [`backward`](Self::backward), but writes the weight and bias gradients of these rows into
    /// `weight_grad` (`[out x in]`) and `bias_grad` (`[out]`), reads the layer only, and splits the matrix
    /// products over the current rayon pool only when `parallel` (the bias sum always runs on the calling
    /// thread, rows in order, so the result does not depend on the pool). When the weight is packed
    /// ([`pack_bf16`](Self::pack_bf16)) the products run in bf16 (AMX tiles or AVX512-BF16), on the calling thread, with
    /// `scratch` for the packed operands.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_into(
        &self,
        parallel: bool,
        batch: usize,
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        weight_grad: &mut [f32],
        bias_grad: &mut [f32],
        scratch: &mut bf16::Scratch,
    ) {
        let (n_in, n_out) = (self.in_dim, self.out_dim);
        assert_eq!(y.len(), batch * n_out, "linear backward: y");
        assert_eq!(dy.len(), batch * n_out, "linear backward: dy");
        mask_sum_rows(y, dy, bias_grad, self.relu);
        let Some(packed) = &self.packed else {
            let dims = (batch, n_in, n_out);
            return products_backward(parallel, dims, &self.weight, x, dy, dx, weight_grad);
        };
        assert_eq!(x.len(), batch * n_in, "linear backward: x");
        assert_eq!(
            weight_grad.len(),
            n_out * n_in,
            "linear backward: weight_grad"
        );
        let (bp, ip, op) = (bf16::pad(batch), bf16::pad(n_in), bf16::pad(n_out));
        // weight_grad = dyᵀ x: a = dyᵀ [out x batch], b = x [batch x in].
        let a = scratch.a.get(op * bp);
        let b = scratch.b.get(bp * ip);
        bf16::pack_cols(dy, batch, n_out, a);
        bf16::pack_b(x, batch, n_in, b);
        bf16::gemm(n_out, n_in, batch, a, b, weight_grad, n_in);
        if let Some(dx) = dx {
            // dx = dy W: a = dy [batch x out], b = W [out x in] (packed once per step).
            assert_eq!(dx.len(), batch * n_in, "linear backward: dx");
            let a = scratch.a.get(bp * op);
            bf16::pack_rows(dy, batch, n_out, a);
            bf16::gemm(batch, n_in, n_out, a, &packed.backward, dx, n_in);
        }
    }

    /// Parameters with their gradients, both writable (for an update that computes the gradient on the fly),
    /// in the order of [`params`](Self::params).
    pub(crate) fn params_and_grads_mut(
        &mut self,
    ) -> impl Iterator<Item = (&mut [f32], &mut [f32])> {
        let n = self.num_tensors();
        [
            (&mut self.weight[..], &mut self.weight_grad[..]),
            (&mut self.bias[..], &mut self.bias_grad[..]),
        ]
        .into_iter()
        .take(n)
    }

    /// Zeroes `dy` where the ReLU was inactive (`y <= 0`) and sums `dy` over the batch into the bias
    /// gradient, in one pass.
    fn mask_and_bias_grad(&mut self, batch: usize, y: &[f32], dy: &mut [f32]) {
        let (n_out, relu) = (self.out_dim, self.relu);
        if dy.len() < PARALLEL_MIN_ELEMS || !self.has_bias() {
            mask_sum_rows(y, dy, &mut self.bias_grad, relu);
            return;
        }
        // A fixed split, not one per thread: the summation order, hence the result, does not depend on
        // the pool size.
        let chunk_rows = REDUCE_ROWS;
        let chunks = batch.div_ceil(chunk_rows);
        super::ensure_len(&mut self.partial, chunks * n_out);
        let partial = &mut self.partial[..chunks * n_out];
        y.par_chunks(chunk_rows * n_out)
            .zip(dy.par_chunks_mut(chunk_rows * n_out))
            .zip(partial.par_chunks_mut(n_out))
            .for_each(|((y, dy), sum)| mask_sum_rows(y, dy, sum, relu));
        self.bias_grad.fill(0.0);
        for sum in partial.chunks_exact(n_out) {
            for (g, &s) in self.bias_grad.iter_mut().zip(sum) {
                *g += s;
            }
        }
    }
}

/// The backward products of a layer of `weight` (`[out x in]`), `dims = (batch, in, out)`: `weight_grad =
/// dyᵀ x` and, when given, `dx = dy W`; split over the current rayon pool only when `parallel`.
fn products_backward(
    parallel: bool,
    (batch, n_in, n_out): (usize, usize, usize),
    weight: &[f32],
    x: &[f32],
    dy: &[f32],
    dx: Option<&mut [f32]>,
    weight_grad: &mut [f32],
) {
    matmul_on(
        parallel,
        n_out,
        n_in,
        batch,
        weight_grad,
        false,
        dy,
        Op::T,
        x,
        Op::N,
    );
    if let Some(dx) = dx {
        matmul_on(
            parallel,
            batch,
            n_in,
            n_out,
            dx,
            false,
            dy,
            Op::N,
            weight,
            Op::N,
        );
    }
}

multiversion! {
    /// `y = act(y + bias)` for every row of `y` (rows of `bias.len()`); with an empty `bias` (a layer
    /// without bias), `y = act(y)`.
    fn bias_act_rows(y: &mut [f32], bias: &[f32], relu: bool) {
        if bias.is_empty() {
            if relu {
                y.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            return;
        }
        for row in y.chunks_exact_mut(bias.len()) {
            if relu {
                for (v, &b) in row.iter_mut().zip(bias) {
                    *v = (*v + b).max(0.0);
                }
            } else {
                for (v, &b) in row.iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }
    }
}

multiversion! {
    /// With `relu`, zeroes `dy` where `y <= 0`; then `sum = Σ_rows dy` (rows of `sum.len()`; nothing to sum
    /// when `sum` is empty, a layer without bias).
    fn mask_sum_rows(y: &[f32], dy: &mut [f32], sum: &mut [f32], relu: bool) {
        if sum.is_empty() {
            if relu {
                for (d, &v) in dy.iter_mut().zip(y) {
                    *d = if v > 0.0 { *d } else { 0.0 };
                }
            }
            return;
        }
        let n = sum.len();
        sum.fill(0.0);
        for (yr, dr) in y.chunks_exact(n).zip(dy.chunks_exact_mut(n)) {
            if relu {
                for ((d, &v), s) in dr.iter_mut().zip(yr).zip(sum.iter_mut()) {
                    *d = if v > 0.0 { *d } else { 0.0 };
                    *s += *d;
                }
            } else {
                for (&d, s) in dr.iter().zip(sum.iter_mut()) {
                    *s += d;
                }
            }
        }
    }
}

/// Rows per parallel task: about four tasks per thread, so an uneven split costs little.
pub(crate) fn rows_per_task(batch: usize) -> usize {
    batch.div_ceil(4 * rayon::current_num_threads()).max(1)
}

#[cfg(test)]
mod tests;
