//! Dense optimizers: [`DenseOptimizer`] (the choice and its hyper-parameters) and [`OptimizerState`]
//! (per-tensor state and the step counter).
//!
//! The update rules are PyTorch's (`torch.optim.SGD`, `Adagrad`, `Adam`, no weight decay), so that a
//! model trained here and one trained by the DLRM reference follow the same trajectory.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::ModelError;
use base::multiversion;

/// Tensors with fewer elements than this are updated on the calling thread.
const PARALLEL_MIN_ELEMS: usize = 1 << 16;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// Elements per block of [`OptimizerState::update_with`]: the gradient parts, the parameter, the gradient
/// and the state of one block stay in L1 between the sum and the update.
const FUSED_BLOCK: usize = 2048;

/// Which dense optimizer to use, with its hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DenseOptimizer {
    /// `p -= lr g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `s += g²; p -= lr g / (√s + eps)`, with `s` starting at `initial_accumulator`.
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Added to the denominator (PyTorch's default is 1e-10).
        eps: f32,
        /// Initial value of the squared-gradient sum (PyTorch's default is 0).
        initial_accumulator: f32,
    },
    /// Adam with bias correction: `m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;
    /// p -= lr m̂ / (√v̂ + eps)` with `m̂ = m / (1-β1ᵗ)`, `v̂ = v / (1-β2ᵗ)`.
    Adam {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment (typically 0.9).
        beta1: f32,
        /// Decay of the second moment (typically 0.999).
        beta2: f32,
        /// Added to the denominator (typically 1e-8).
        eps: f32,
    },
}

impl DenseOptimizer {
    /// Adam with PyTorch's defaults besides the learning rate: `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-8`.
    pub fn adam(lr: f32) -> DenseOptimizer {
        DenseOptimizer::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// Checks the hyper-parameters: finite, non-negative learning rate, betas in `[0, 1)`, positive `eps`
    /// for Adam, and for Adagrad a positive `eps` or `initial_accumulator` (so the denominator is never 0).
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |field, reason: String| Err(ModelError::Config { field, reason });
        let lr = match *self {
            Self::Sgd { lr } => lr,
            Self::Adagrad {
                lr,
                eps,
                initial_accumulator,
            } => {
                if !(eps >= 0.0 && eps.is_finite()) {
                    return bad("eps", format!("{eps} must be finite and >= 0"));
                }
                if !(initial_accumulator >= 0.0 && initial_accumulator.is_finite()) {
                    return bad(
                        "initial_accumulator",
                        format!("{initial_accumulator} must be finite and >= 0"),
                    );
                }
                if eps == 0.0 && initial_accumulator == 0.0 {
                    // A zero gradient would then divide 0 by 0.
                    return bad("eps", "must be > 0 when initial_accumulator is 0".into());
                }
                lr
            }
            Self::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                for (field, beta) in [("beta1", beta1), ("beta2", beta2)] {
                    if !(0.0..1.0).contains(&beta) {
                        return bad(field, format!("{beta} must be in [0, 1)"));
                    }
                }
                if !(eps > 0.0 && eps.is_finite()) {
                    return bad("eps", format!("{eps} must be finite and > 0"));
                }
                lr
            }
        };
        if !(lr >= 0.0 && lr.is_finite()) {
            return bad("lr", format!("{lr} must be finite and >= 0"));
        }
        Ok(())
    }

    /// Number of state values the optimizer keeps per parameter.
    pub fn state_per_param(&self) -> usize {
        match self {
            Self::Sgd { .. } => 0,
            Self::Adagrad { .. } => 1,
            Self::Adam { .. } => 2,
        }
    }
}

/// Optimizer state for a fixed list of tensors ("slots"): per slot, the accumulators the rule needs.
///
/// Call order per step: [`begin_step`](Self::begin_step) once, then [`update`](Self::update) for every slot.
#[derive(Debug, Clone)]
pub struct OptimizerState {
    kind: DenseOptimizer,
    step: u64,
    /// Per slot: Adagrad's sum, or Adam's first moment; empty for SGD.
    first: Vec<Vec<f32>>,
    /// Per slot: Adam's second moment; empty otherwise.
    second: Vec<Vec<f32>>,
    /// The learning-rate schedule.
    decay: LrDecay,
    /// The current step's factor on the learning rate ([`LrDecay::factor`]).
    lr_scale: f32,
}

/// A learning-rate decay at the end of training (`--lr-decay-start`, `--lr-decay-steps`, as MLPerf's DLRM
/// reference): the rate is constant until step `start`, then falls as `(1 - done/steps)²` to 0 over `steps`
/// steps. Annealing the last steps makes the final model an average over many batches instead of a model
/// tuned to the last few: with a constant rate the dense model moves its mean prediction by about 0.9 of each
/// batch's mean residual, so the final model's calibration was the last batch's label noise (BENCHMARKS.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LrDecay {
    /// Optimizer steps before the decay begins.
    pub start: u64,
    /// Steps over which the rate falls to 0 (0: no decay).
    pub steps: u64,
}

impl LrDecay {
    /// The factor on the learning rate of optimizer step `step` (counted from 1).
    pub fn factor(&self, step: u64) -> f32 {
        if self.steps == 0 || step <= self.start {
            return 1.0;
        }
        let done = (step - self.start).min(self.steps) as f64 / self.steps as f64;
        ((1.0 - done) * (1.0 - done)) as f32
    }
}

impl OptimizerState {
    /// Fresh state for tensors of the given sizes.
    pub fn new(kind: DenseOptimizer, sizes: &[usize]) -> Self {
        let (first, second) = match kind {
            DenseOptimizer::Sgd { .. } => (vec![], vec![]),
            DenseOptimizer::Adagrad {
                initial_accumulator,
                ..
            } => (
                sizes
                    .iter()
                    .map(|&n| vec![initial_accumulator; n])
                    .collect(),
                vec![],
            ),
            DenseOptimizer::Adam { .. } => (
                sizes.iter().map(|&n| vec![0.0; n]).collect(),
                sizes.iter().map(|&n| vec![0.0; n]).collect(),
            ),
        };
        Self {
            kind,
            step: 0,
            first,
            second,
            decay: LrDecay::default(),
            lr_scale: 1.0,
        }
    }

    /// Sets the learning-rate schedule.
    pub fn set_decay(&mut self, decay: LrDecay) {
        self.decay = decay;
        self.lr_scale = decay.factor(self.step.max(1));
    }

    /// The factor on the learning rate of the current step.
    pub fn lr_scale(&self) -> f32 {
        self.lr_scale
    }

    /// The optimizer and its hyper-parameters.
    pub fn kind(&self) -> DenseOptimizer {
        self.kind
    }

    /// Steps begun so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Every state tensor (Adagrad's sums, or Adam's first moments then second moments), for checkpoints.
    pub fn tensors(&self) -> Vec<&[f32]> {
        self.first
            .iter()
            .chain(&self.second)
            .map(Vec::as_slice)
            .collect()
    }

    /// Restores the step counter and the tensors of [`tensors`](Self::tensors) (same order and lengths).
    pub fn restore(&mut self, step: u64, tensors: &[&[f32]]) -> Result<(), ModelError> {
        super::check_len(
            "optimizer tensors",
            tensors.len(),
            self.first.len() + self.second.len(),
        )?;
        let slots = self.first.iter_mut().chain(self.second.iter_mut());
        for (tensor, (dst, src)) in slots.zip(tensors).enumerate() {
            if dst.len() != src.len() {
                let (len, expected) = (src.len(), dst.len());
                return Err(ModelError::ParamLength {
                    tensor,
                    len,
                    expected,
                });
            }
        }
        let slots = self.first.iter_mut().chain(self.second.iter_mut());
        for (dst, src) in slots.zip(tensors) {
            dst.copy_from_slice(src);
        }
        self.step = step;
        self.lr_scale = self.decay.factor(step.max(1));
        Ok(())
    }

    /// Starts a step (advances Adam's bias-correction counter).
    pub fn begin_step(&mut self) {
        self.step += 1;
        self.lr_scale = self.decay.factor(self.step);
    }

    /// Applies the update to slot `slot`: `param` moves against `grad`.
    ///
    /// # Panics
    /// If `slot` is out of range or the lengths differ from the slot's size.
    pub fn update(&mut self, slot: usize, param: &mut [f32], grad: &[f32]) {
        assert_eq!(param.len(), grad.len(), "optimizer: grad length");
        match self.kind {
            DenseOptimizer::Sgd { lr } => {
                let lr = lr * self.lr_scale;
                if param.len() < PARALLEL_MIN_ELEMS {
                    sgd(param, grad, lr);
                } else {
                    param
                        .par_chunks_mut(CHUNK)
                        .zip(grad.par_chunks(CHUNK))
                        .for_each(|(p, g)| sgd(p, g, lr));
                }
            }
            DenseOptimizer::Adagrad { lr, eps, .. } => {
                let lr = lr * self.lr_scale;
                let sum = &mut self.first[slot][..];
                assert_eq!(sum.len(), param.len(), "optimizer: slot size");
                if param.len() < PARALLEL_MIN_ELEMS {
                    adagrad(param, grad, sum, lr, eps);
                } else {
                    param
                        .par_chunks_mut(CHUNK)
                        .zip(grad.par_chunks(CHUNK))
                        .zip(sum.par_chunks_mut(CHUNK))
                        .for_each(|((p, g), s)| adagrad(p, g, s, lr, eps));
                }
            }
            DenseOptimizer::Adam { .. } => {
                let k = self.adam_step();
                let (m, v) = (&mut self.first[slot][..], &mut self.second[slot][..]);
                assert_eq!(m.len(), param.len(), "optimizer: slot size");
                if param.len() < PARALLEL_MIN_ELEMS {
                    adam(param, grad, m, v, &k);
                } else {
                    param
                        .par_chunks_mut(CHUNK)
                        .zip(grad.par_chunks(CHUNK))
                        .zip(m.par_chunks_mut(CHUNK))
                        .zip(v.par_chunks_mut(CHUNK))
                        .for_each(|(((p, g), m), v)| adam(p, g, m, v, &k));
                }
            }
        }
    }
}

impl OptimizerState {
    /// Adam's constants for the current step (meaningless for the other optimizers).
    fn adam_step(&self) -> AdamStep {
        let (lr, beta1, beta2, eps) = match self.kind {
            DenseOptimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => (lr, beta1, beta2, eps),
            _ => (0.0, 0.0, 0.0, 1.0),
        };
        let t = self.step.max(1) as i32;
        let bc1 = 1.0 - (beta1 as f64).powi(t);
        let bc2 = 1.0 - (beta2 as f64).powi(t);
        // PyTorch: p -= (lr / bc1) m / (√v / √bc2 + eps).
        AdamStep {
            beta1,
            beta2,
            eps,
            step_size: (lr as f64 * self.lr_scale as f64 / bc1) as f32,
            inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
        }
    }

    /// [`update`](Self::update) with the gradient computed on the fly: for each block of elements
    /// `offset..offset + block.len()`, first `fill(offset, block)` writes the gradient into `grad`'s block,
    /// then the block is updated while it is in cache. Used to sum the chunks' gradient parts and step in
    /// one pass. The result equals `fill` over all of `grad` followed by [`update`](Self::update).
    ///
    /// # Panics
    /// If `slot` is out of range or the lengths differ from the slot's size.
    pub(crate) fn update_with(
        &mut self,
        slot: usize,
        param: &mut [f32],
        grad: &mut [f32],
        fill: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        assert_eq!(param.len(), grad.len(), "optimizer: grad length");
        let kind = self.kind;
        let scale = self.lr_scale;
        let k = self.adam_step();
        let (s1, s2): (&mut [f32], &mut [f32]) = match kind {
            DenseOptimizer::Sgd { .. } => (&mut [], &mut []),
            DenseOptimizer::Adagrad { .. } => (&mut self.first[slot], &mut []),
            DenseOptimizer::Adam { .. } => (&mut self.first[slot], &mut self.second[slot]),
        };
        let blocks = param.len().div_ceil(FUSED_BLOCK);
        for s in [&*s1, &*s2] {
            assert!(
                s.is_empty() || s.len() == param.len(),
                "optimizer: slot size"
            );
        }
        let step = |i: usize, p: &mut [f32], g: &mut [f32], s1: &mut [f32], s2: &mut [f32]| {
            fill(i * FUSED_BLOCK, g);
            match kind {
                DenseOptimizer::Sgd { lr } => sgd(p, g, lr * scale),
                DenseOptimizer::Adagrad { lr, eps, .. } => adagrad(p, g, s1, lr * scale, eps),
                DenseOptimizer::Adam { .. } => adam(p, g, s1, s2, &k),
            }
        };
        if param.len() < PARALLEL_MIN_ELEMS {
            // Split off one block at a time; a missing state tensor yields empty blocks.
            let mut rest = (param, grad, s1, s2);
            for i in 0..blocks {
                let (p, g, a, b) = rest;
                let n = FUSED_BLOCK.min(p.len());
                let (p0, p1) = p.split_at_mut(n);
                let (g0, g1) = g.split_at_mut(n);
                let (a0, a1) = a.split_at_mut(n.min(a.len()));
                let (b0, b1) = b.split_at_mut(n.min(b.len()));
                step(i, p0, g0, a0, b0);
                rest = (p1, g1, a1, b1);
            }
        } else {
            param
                .par_chunks_mut(FUSED_BLOCK)
                .zip(grad.par_chunks_mut(FUSED_BLOCK))
                .zip(state_blocks(s1, blocks).zip(state_blocks(s2, blocks)))
                .enumerate()
                .for_each(|(i, ((p, g), (a, b)))| step(i, p, g, a, b));
        }
    }
}

/// `s` in blocks of [`FUSED_BLOCK`], or `blocks` empty blocks when `s` is empty (no such state).
fn state_blocks(s: &mut [f32], blocks: usize) -> impl IndexedParallelIterator<Item = &mut [f32]> {
    s.par_chunks_mut(FUSED_BLOCK)
        .map(Some)
        .chain(rayon::iter::repeat_n((), blocks).map(|()| None))
        .map(Option::unwrap_or_default)
}

/// Adam's constants for one step.
struct AdamStep {
    beta1: f32,
    beta2: f32,
    eps: f32,
    /// `lr / (1 - β1ᵗ)`.
    step_size: f32,
    /// `1 / √(1 - β2ᵗ)`.
    inv_sqrt_bc2: f32,
}

multiversion! {
    fn sgd(param: &mut [f32], grad: &[f32], lr: f32) {
        for (p, &g) in param.iter_mut().zip(grad) {
            *p -= lr * g;
        }
    }
}

multiversion! {
    fn adagrad(param: &mut [f32], grad: &[f32], sum: &mut [f32], lr: f32, eps: f32) {
        for ((p, &g), s) in param.iter_mut().zip(grad).zip(sum.iter_mut()) {
            *s += g * g;
            *p -= lr * g / (s.sqrt() + eps);
        }
    }
}

multiversion! {
    fn adam(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamStep) {
        for (((p, &g), m), v) in param.iter_mut().zip(grad).zip(m.iter_mut()).zip(v.iter_mut()) {
            *m = k.beta1 * *m + (1.0 - k.beta1) * g;
            *v = k.beta2 * *v + (1.0 - k.beta2) * g * g;
            *p -= k.step_size * *m / (v.sqrt() * k.inv_sqrt_bc2 + k.eps);
        }
    }
}

#[cfg(test)]
mod tests;
