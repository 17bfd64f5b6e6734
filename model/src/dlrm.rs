//! [`Dlrm`]: the whole dense model — bottom MLP, interaction (dot or DCNv2 cross layers), top MLP, sigmoid +
//! BCE — and its optimizer.

use rayon::prelude::*;

use super::aligned::slot;
use super::chunk::{self, ChunkBuffers, Net};
use super::config::DlrmConfig;
use super::cross::CrossNet;
use super::interaction_layer::InteractionLayer;
use super::linear::Linear;
use super::loss::sigmoid;
use super::mlp::Mlp;
use super::optim::{DenseOptimizer, OptimizerState};
use super::rng::Rng;
use super::{check_len, ensure_len, ModelError, Precision};

/// The DLRM dense model with its optimizer state and all step buffers.
///
/// Inputs per batch: `dense` `[batch x num_dense]` (already `ln(1 + x)`), `emb` `[batch x emb_width]` (the
/// pooled embeddings: feature `f` of sample `i` at `i * emb_width + emb_offset(f)`, see
/// [`DlrmConfig::emb_offset`]; with uniform dimensions `[batch x num_sparse x emb_dim]`), and for training
/// `labels` `[batch]` in `[0, 1]`. Every buffer
/// grows to the largest batch seen and is reused, so steady-state steps do not allocate. The batch is cut
/// into chunks of rows that run in parallel on the current rayon pool, each through the whole network
/// (see `chunk`); results do not depend on the pool size.
#[derive(Debug, Clone)]
pub struct Dlrm {
    cfg: DlrmConfig,
    bottom: Mlp,
    top: Mlp,
    /// Dot products or cross layers (whose parameters sit between the bottom and the top MLP's).
    interaction: InteractionLayer,
    opt: OptimizerState,
    /// Per chunk of rows: activations and gradients (see `chunk`).
    chunks: Vec<ChunkBuffers>,
    /// Target rows per chunk ([`chunk::CHUNK_ROWS`]; other values only in measurements).
    chunk_rows: usize,
    /// `σ(logit)`: `[batch]`.
    probs: Vec<f32>,
    /// The nominal batch size ([`Dlrm::set_batch_divisor`]).
    batch_divisor: usize,
    /// Arithmetic of the matrix products.
    precision: Precision,
    /// Where the last training step's time went.
    timing: StepTiming,
}

/// Wall seconds of the last training step's parts ([`Dlrm::last_timing`]): the chunks run forward and
/// backward on several threads at once, so the parallel region's wall time is split between the two in
/// proportion to the threads' own times for each (three clock reads per chunk).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTiming {
    /// The forward pass, with the bf16 packing of the weights.
    pub forward: f64,
    /// The backward pass.
    pub backward: f64,
    /// The optimizer step with the sum of the chunks' gradients (in
    /// [`forward_backward`](Dlrm::forward_backward), the sum alone).
    pub optimizer: f64,
}

impl Dlrm {
    /// A tiny model for unit tests (here and in the trainer's): 2 sparse features of dim 4, bottom MLP
    /// 13-8-4, top MLP 6-1.
    pub fn tiny(opt: DenseOptimizer, seed: u64) -> Dlrm {
        let cfg = DlrmConfig {
            num_sparse: 2,
            emb_dim: 4,
            bottom: vec![8, 4],
            top: vec![6, 1],
            ..DlrmConfig::default()
        };
        Dlrm::new(cfg, opt, seed).expect("a valid tiny config")
    }

    /// A model with deterministic initial weights drawn from `seed` (see [`Linear`]): bottom
    /// layers first, then the cross layers if any (see [`CrossNet`]), then top layers, weight before bias.
    pub fn new(cfg: DlrmConfig, opt: DenseOptimizer, seed: u64) -> Result<Self, ModelError> {
        cfg.validate()?;
        opt.validate()?;
        let mut rng = Rng::new(seed);
        let bottom = Mlp::init(cfg.num_dense, &cfg.bottom, true, &mut rng);
        let interaction = InteractionLayer::new(&cfg, &mut rng);
        let top = Mlp::init(cfg.interaction_dim(), &cfg.top, false, &mut rng);
        let sizes: Vec<usize> = all_layers(&bottom, &interaction, &top)
            .flat_map(Linear::params)
            .map(<[f32]>::len)
            .collect();
        Ok(Self {
            interaction,
            opt: OptimizerState::new(opt, &sizes),
            cfg,
            bottom,
            top,
            chunks: Vec::new(),
            chunk_rows: chunk::CHUNK_ROWS,
            probs: Vec::new(),
            batch_divisor: 0,
            precision: Precision::F32,
            timing: StepTiming::default(),
        })
    }

    /// Sets the arithmetic of the matrix products ([`Precision::F32`] by default).
    ///
    /// # Errors
    /// [`ModelError::Bf16Unavailable`] for bf16 on a machine without AMX-BF16.
    pub fn set_precision(&mut self, precision: Precision) -> Result<(), ModelError> {
        if precision == Precision::Bf16 && !super::bf16_available() {
            return Err(ModelError::Bf16Unavailable);
        }
        self.precision = precision;
        if precision == Precision::F32 {
            for layer in layers_mut(&mut self.bottom, &mut self.interaction, &mut self.top) {
                layer.unpack();
            }
        }
        Ok(())
    }

    /// The arithmetic of the matrix products.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// In bf16, packs the current weights for the AMX products (before every pass: the optimizer, a
    /// checkpoint or the parameter servers may have changed them).
    fn prepare(&mut self) {
        if self.precision == Precision::Bf16 {
            let cross = self.interaction.layers_mut().par_iter_mut();
            let top = self.top.layers_mut().par_iter_mut();
            let layers = self
                .bottom
                .layers_mut()
                .par_iter_mut()
                .chain(cross)
                .chain(top);
            layers
                .filter(|l| l.suits_bf16())
                .for_each(|l| l.pack_bf16());
        }
    }

    /// Sets the target rows per chunk (for measurements; results depend on it in the last bits).
    #[cfg(test)]
    pub(crate) fn set_chunk_rows(&mut self, rows: usize) {
        self.chunk_rows = rows;
    }

    /// The sizes.
    pub fn config(&self) -> &DlrmConfig {
        &self.cfg
    }

    /// The bottom MLP (its layers expose weights and the last step's gradients).
    pub fn bottom(&self) -> &Mlp {
        &self.bottom
    }

    /// The top MLP.
    pub fn top(&self) -> &Mlp {
        &self.top
    }

    /// The cross layers, with the dcn interaction.
    pub fn cross(&self) -> Option<&CrossNet> {
        match &self.interaction {
            InteractionLayer::Cross(cross) => Some(cross),
            InteractionLayer::Dot(_) => None,
        }
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.opt.step()
    }

    /// Number of dense parameters.
    pub fn num_params(&self) -> usize {
        self.layers()
            .flat_map(Linear::params)
            .map(<[f32]>::len)
            .sum()
    }

    /// Every parameter tensor: per layer, bottom, then the cross layers (per cross layer `V_l`'s weight, then
    /// `U_l`'s weight and bias), then top, the weight (`[out x in]`) then the bias.
    pub fn params(&self) -> Vec<&[f32]> {
        self.layers().flat_map(Linear::params).collect()
    }

    /// Every parameter tensor's name and shape, in the order of [`params`](Self::params): `bottom.<i>.weight`
    /// (`[out, in]`) and `bottom.<i>.bias` (`[out]`), per cross layer `cross.<l>.v.weight`, `cross.<l>.u.weight`
    /// and `cross.<l>.u.bias`, then `top.<i>.weight` and `top.<i>.bias` (the names of an export's
    /// `dense.safetensors`).
    pub fn param_names(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        let mut add = |prefix: String, l: &Linear| {
            out.push((format!("{prefix}.weight"), vec![l.out_dim(), l.in_dim()]));
            if l.has_bias() {
                out.push((format!("{prefix}.bias"), vec![l.out_dim()]));
            }
        };
        for (i, l) in self.bottom.layers().iter().enumerate() {
            add(format!("bottom.{i}"), l);
        }
        for (i, l) in self.interaction.layers().iter().enumerate() {
            let part = if i % 2 == 0 { "v" } else { "u" };
            add(format!("cross.{}.{part}", i / 2), l);
        }
        for (i, l) in self.top.layers().iter().enumerate() {
            add(format!("top.{i}"), l);
        }
        out
    }

    /// Every layer holding parameters: bottom, cross, top.
    fn layers(&self) -> impl Iterator<Item = &Linear> {
        all_layers(&self.bottom, &self.interaction, &self.top)
    }

    /// Replaces every parameter tensor, in the order of [`params`](Self::params) (restoring a checkpoint).
    /// The optimizer state is kept as is.
    pub fn set_params(&mut self, params: &[&[f32]]) -> Result<(), ModelError> {
        check_len("params", params.len(), self.params().len())?;
        for (tensor, (src, have)) in params.iter().zip(self.params()).enumerate() {
            if src.len() != have.len() {
                let (len, expected) = (src.len(), have.len());
                return Err(ModelError::ParamLength {
                    tensor,
                    len,
                    expected,
                });
            }
        }
        let layers = layers_mut(&mut self.bottom, &mut self.interaction, &mut self.top);
        let dsts = layers.flat_map(|l| l.params_and_grads().map(|(p, _)| p));
        for (dst, src) in dsts.zip(params) {
            dst.copy_from_slice(src);
        }
        Ok(())
    }

    /// Sets the nominal batch size: the gradients of a batch of `b` samples are those of the loss summed over
    /// the batch divided by `max(b, n)`, so a short batch (the last of a pass) counts for its samples instead
    /// of taking a full step on its noisier mean (0 or 1: the mean over each batch).
    pub fn set_batch_divisor(&mut self, n: usize) {
        self.batch_divisor = n;
    }

    /// What the summed loss of a batch of `batch` samples is divided by ([`set_batch_divisor`](Self::set_batch_divisor)).
    pub fn grad_divisor(&self, batch: usize) -> usize {
        batch.max(self.batch_divisor).max(1)
    }

    /// Sets the dense learning-rate schedule.
    pub fn set_lr_decay(&mut self, decay: super::optim::LrDecay) {
        self.opt.set_decay(decay);
    }

    /// The click probabilities of the last forward pass (of [`predict`](Self::predict), or of a training
    /// pass before its optimizer step).
    pub fn last_probs(&self) -> &[f32] {
        &self.probs
    }

    /// Forward pass only; returns the click probabilities `[batch]`.
    pub fn predict(
        &mut self,
        batch: usize,
        dense: &[f32],
        emb: &[f32],
    ) -> Result<&[f32], ModelError> {
        self.check_inputs(batch, dense, emb)?;
        ensure_len(&mut self.probs, batch);
        if batch == 0 {
            return Ok(&[]);
        }
        self.prepare();
        let (n, rows) = chunk::split(batch, self.chunk_rows);
        self.grow_chunks(n);
        let parallel = n < rayon::current_num_threads();
        let (nd, ne) = (self.cfg.num_dense, self.cfg.emb_width());
        let net = Net {
            bottom: self.bottom.layers(),
            top: self.top.layers(),
            interaction: &self.interaction,
        };
        self.chunks[..n]
            .par_iter_mut()
            .zip(self.probs[..batch].par_chunks_mut(rows))
            .enumerate()
            .for_each(|(c, (buf, probs))| {
                let r = probs.len();
                let logits = buf.forward(
                    &net,
                    parallel,
                    r,
                    &dense[c * rows * nd..][..r * nd],
                    &emb[c * rows * ne..][..r * ne],
                );
                for (p, &x) in probs.iter_mut().zip(logits) {
                    *p = sigmoid(x);
                }
            });
        Ok(&self.probs[..batch])
    }

    /// Forward, backward and one optimizer step on the dense parameters. Writes `d (mean BCE) / d emb` into
    /// `emb_grad` (`[batch x emb_width]` like `emb`, overwritten) and returns the mean loss before the step.
    pub fn train_step(
        &mut self,
        batch: usize,
        dense: &[f32],
        emb: &[f32],
        labels: &[f32],
        emb_grad: &mut [f32],
    ) -> Result<f32, ModelError> {
        let (loss, n) = self.chunks_forward_backward(batch, dense, emb, labels, emb_grad)?;
        let started = std::time::Instant::now();
        // Sum the chunks' gradient parts and step, block by block in one pass.
        self.opt.begin_step();
        let chunks = &self.chunks[..n];
        let params = flat_params(&mut self.bottom, &mut self.interaction, &mut self.top);
        for (slot, (base, param, grad)) in params.enumerate() {
            self.opt.update_with(slot, param, grad, |at, g| {
                chunk::sum_into(g, chunks, base + at)
            });
        }
        self.timing.optimizer = started.elapsed().as_secs_f64();
        Ok(loss)
    }

    /// Where the last [`train_step`](Self::train_step) or [`forward_backward`](Self::forward_backward)
    /// spent its time.
    pub fn last_timing(&self) -> StepTiming {
        self.timing
    }

    /// [`train_step`](Self::train_step) without the optimizer step: leaves the dense gradients in the layers
    /// ([`grads`](Self::grads)) for a caller that applies them elsewhere (the parameter servers).
    pub fn forward_backward(
        &mut self,
        batch: usize,
        dense: &[f32],
        emb: &[f32],
        labels: &[f32],
        emb_grad: &mut [f32],
    ) -> Result<f32, ModelError> {
        let (loss, n) = self.chunks_forward_backward(batch, dense, emb, labels, emb_grad)?;
        let started = std::time::Instant::now();
        self.reduce_grads(n);
        self.timing.optimizer = started.elapsed().as_secs_f64();
        Ok(loss)
    }

    /// Forward and backward over the chunks of the batch, leaving each chunk's gradient parts in its
    /// buffers; returns the mean loss and the number of chunks.
    fn chunks_forward_backward(
        &mut self,
        batch: usize,
        dense: &[f32],
        emb: &[f32],
        labels: &[f32],
        emb_grad: &mut [f32],
    ) -> Result<(f32, usize), ModelError> {
        self.check_inputs(batch, dense, emb)?;
        check_len("labels", labels.len(), batch)?;
        check_len("emb_grad", emb_grad.len(), emb.len())?;
        if batch == 0 {
            return Err(ModelError::EmptyBatch);
        }
        let started = std::time::Instant::now();
        self.prepare();
        let prepared = started.elapsed().as_secs_f64();
        let (n, rows) = chunk::split(batch, self.chunk_rows);
        self.grow_chunks(n);
        ensure_len(&mut self.probs, batch);
        let parallel = n < rayon::current_num_threads();
        let (nd, ne) = (self.cfg.num_dense, self.cfg.emb_width());
        // Gradients of the loss summed over the batch and divided by the nominal batch size, so that a short
        // last batch takes a proportionally shorter step (`set_batch_divisor`).
        let scale = 1.0 / self.grad_divisor(batch) as f32;
        let net = Net {
            bottom: self.bottom.layers(),
            top: self.top.layers(),
            interaction: &self.interaction,
        };
        // With no sparse features `emb_grad` is empty and has no chunks: give every chunk an empty slice.
        let emb_grads = emb_grad
            .par_chunks_mut((rows * ne).max(1))
            .map(Some)
            .chain(rayon::iter::repeat_n((), n).map(|()| None));
        self.chunks[..n]
            .par_iter_mut()
            .zip(self.probs[..batch].par_chunks_mut(rows))
            .zip(emb_grads)
            .enumerate()
            .for_each(|(c, ((buf, probs), emb_grad))| {
                let r = probs.len();
                buf.forward_backward(
                    &net,
                    parallel,
                    r,
                    &dense[c * rows * nd..][..r * nd],
                    &emb[c * rows * ne..][..r * ne],
                    &labels[c * rows..][..r],
                    scale,
                    probs,
                    emb_grad.unwrap_or_default(),
                );
            });
        let region = started.elapsed().as_secs_f64() - prepared;
        let loss: f64 = self.chunks[..n].iter().map(|c| c.loss).sum();
        let fwd: f64 = self.chunks[..n].iter().map(|c| c.forward_secs).sum();
        let bwd: f64 = self.chunks[..n].iter().map(|c| c.backward_secs).sum();
        let fwd_share = if fwd + bwd > 0.0 {
            fwd / (fwd + bwd)
        } else {
            0.5
        };
        self.timing = StepTiming {
            forward: prepared + region * fwd_share,
            backward: region * (1.0 - fwd_share),
            optimizer: 0.0,
        };
        Ok(((loss / batch as f64) as f32, n))
    }

    /// One optimizer step with the gradients of the last [`forward_backward`](Self::forward_backward).
    pub fn apply_gradients(&mut self) {
        self.opt.begin_step();
        let layers = layers_mut(&mut self.bottom, &mut self.interaction, &mut self.top);
        for (slot, (param, grad)) in layers.flat_map(|l| l.params_and_grads()).enumerate() {
            self.opt.update(slot, param, grad);
        }
    }

    /// The gradients of the last backward pass, in the order of [`params`](Self::params).
    pub fn grads(&self) -> Vec<&[f32]> {
        self.layers().flat_map(Linear::grads).collect()
    }

    /// Adds `delta` to the output logit of every sample (the bias of the top MLP's last layer).
    pub fn shift_output_bias(&mut self, delta: f32) {
        if let Some(last) = self.top.layers_mut().last_mut() {
            if let Some((bias, _)) = last.params_and_grads_mut().nth(1) {
                bias.iter_mut().for_each(|b| *b += delta);
            }
        }
    }

    /// Replaces the gradients of the last backward pass by `flat`, the concatenation of every tensor's
    /// gradient in [`grads`](Self::grads) order (gradients combined over several trainers), for
    /// [`apply_gradients`](Self::apply_gradients).
    pub fn set_grads(&mut self, flat: &[f32]) -> Result<(), ModelError> {
        check_len("dense gradients", flat.len(), self.num_params())?;
        let mut at = 0;
        for layer in layers_mut(&mut self.bottom, &mut self.interaction, &mut self.top) {
            for (_, grad) in layer.params_and_grads_mut() {
                grad.copy_from_slice(&flat[at..at + grad.len()]);
                at += grad.len();
            }
        }
        Ok(())
    }

    /// One optimizer step with gradients `flat x scale` (in the order of [`params`](Self::params)), scaled
    /// into the layers' gradient buffers block by block while they are in cache (the hybrid mode's reduced
    /// gradients).
    pub fn apply_flat_gradients(&mut self, flat: &[f32], scale: f32) -> Result<(), ModelError> {
        check_len("dense gradients", flat.len(), self.num_params())?;
        self.opt.begin_step();
        let mut at = 0;
        let layers = layers_mut(&mut self.bottom, &mut self.interaction, &mut self.top);
        for (slot, (param, grad)) in layers.flat_map(|l| l.params_and_grads_mut()).enumerate() {
            let src = &flat[at..at + param.len()];
            at += param.len();
            self.opt.update_with(slot, param, grad, |offset, block| {
                for (g, s) in block.iter_mut().zip(&src[offset..]) {
                    *g = s * scale;
                }
            });
        }
        Ok(())
    }

    /// The dense optimizer's state (for checkpoints).
    pub fn optimizer_state(&self) -> &OptimizerState {
        &self.opt
    }

    /// The dense optimizer's state, to restore a checkpoint into.
    pub fn optimizer_state_mut(&mut self) -> &mut OptimizerState {
        &mut self.opt
    }

    fn check_inputs(&self, batch: usize, dense: &[f32], emb: &[f32]) -> Result<(), ModelError> {
        check_len("dense", dense.len(), batch * self.cfg.num_dense)?;
        check_len("emb", emb.len(), batch * self.cfg.emb_width())
    }

    /// At least `n` chunk buffers.
    fn grow_chunks(&mut self, n: usize) {
        if self.chunks.len() < n {
            self.chunks.resize_with(n, ChunkBuffers::default);
        }
    }

    /// Sets every layer's gradients to the sum of the first `n` chunks' parts, in chunk order.
    fn reduce_grads(&mut self, n: usize) {
        let chunks = &self.chunks[..n];
        for (base, _, grad) in flat_params(&mut self.bottom, &mut self.interaction, &mut self.top) {
            chunk::sum_parts(grad, chunks, base);
        }
    }
}

/// Every layer holding parameters: bottom, cross (if any), top.
fn all_layers<'a>(
    bottom: &'a Mlp,
    interaction: &'a InteractionLayer,
    top: &'a Mlp,
) -> impl Iterator<Item = &'a Linear> {
    bottom
        .layers()
        .iter()
        .chain(interaction.layers())
        .chain(top.layers())
}

/// Every layer holding parameters, writable: bottom, cross (if any), top.
fn layers_mut<'a>(
    bottom: &'a mut Mlp,
    interaction: &'a mut InteractionLayer,
    top: &'a mut Mlp,
) -> impl Iterator<Item = &'a mut Linear> {
    bottom
        .layers_mut()
        .iter_mut()
        .chain(interaction.layers_mut().iter_mut())
        .chain(top.layers_mut().iter_mut())
}

/// Every dense parameter tensor with its gradient, in [`Dlrm::params`] order, each with its offset in the
/// chunks' flat gradient parts.
fn flat_params<'a>(
    bottom: &'a mut Mlp,
    interaction: &'a mut InteractionLayer,
    top: &'a mut Mlp,
) -> impl Iterator<Item = (usize, &'a mut [f32], &'a mut [f32])> {
    layers_mut(bottom, interaction, top)
        .flat_map(|l| l.params_and_grads_mut())
        .scan(0, |offset, (param, grad)| {
            let base = *offset;
            *offset += slot(param.len());
            Some((base, param, grad))
        })
}
