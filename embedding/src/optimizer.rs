//! Sans-IO optimizers: update one row's weights and state in place from its gradient.
//!
//! The formulas follow the reference implementations so trained models are comparable:
//! - SGD: `w -= lr * g`.
//! - Row-wise Adagrad, as FBGEMM's `EXACT_ROWWISE_ADAGRAD` used by TorchRec: one accumulator per row,
//!   `acc += mean(g^2); w -= (lr / (sqrt(acc) + eps)) * g`.
//! - Element-wise Adagrad, as `torch.optim.Adagrad`: `acc_i += g_i^2; w_i -= lr * (g_i / (sqrt(acc_i) + eps))`.
//! - Adam, as `torch.optim.Adam` but with the step count `t` kept per row (state `m[dim], v[dim], t`):
//!   `m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; t += 1;
//!   w -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`. `t` is an f32 that stops counting at
//!   2^24 (where f32 integers end); by then `b^t` is 0 for any useful beta.
//! - FTRL-Proximal, McMahan et al. 2013, Algorithm 1, per coordinate (state `z[dim], n[dim]`):
//!   `sigma = (sqrt(n + g^2) - sqrt(n)) / alpha; z += g - sigma w; n += g^2;
//!   w = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)`.
//!
//! Before any of them, a [`Regularizer`] (per table) clips the gradient row to an L2 norm of at most
//! `clip_norm`, then adds weight decay: `g = clip(g) + weight_decay * w`, with `w` the weights before the step
//! (as `torch.nn.utils.clip_grad_norm_` followed by the optimizers' `weight_decay`).
//!
//! Callers check that the gradient is finite first ([`crate::Table::apply`] rejects such rows); these functions
//! only do arithmetic.

use crate::config::{OptimizerConfig, TableConfig};

/// Largest Adam step count stored in a row (f32 counts integers exactly up to 2^24).
pub const ADAM_MAX_STEP: f32 = 16_777_216.0;

/// Per-table gradient preprocessing applied before every optimizer: clipping, then L2 weight decay.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Regularizer {
    /// `g += weight_decay * w`; 0 is off.
    pub weight_decay: f32,
    /// Scale `g` down to this L2 norm if it is longer; 0 is off.
    pub clip_norm: f32,
}

impl Regularizer {
    /// No clipping, no weight decay.
    pub const NONE: Regularizer = Regularizer {
        weight_decay: 0.0,
        clip_norm: 0.0,
    };

    /// The regularizer of a table.
    pub fn of(cfg: &TableConfig) -> Self {
        Regularizer {
            weight_decay: cfg.weight_decay,
            clip_norm: cfg.clip_norm,
        }
    }

    /// The factor clipping multiplies `grad` by: `clip_norm / |grad|` if that is below 1, else 1.
    pub fn clip_scale(&self, grad: &[f32]) -> f32 {
        if self.clip_norm <= 0.0 {
            return 1.0;
        }
        let norm = grad
            .iter()
            .map(|&g| f64::from(g) * f64::from(g))
            .sum::<f64>()
            .sqrt();
        if norm > f64::from(self.clip_norm) {
            (f64::from(self.clip_norm) / norm) as f32
        } else {
            1.0
        }
    }
}

/// Writes the optimizer state of a new row (`state.len()` is [`OptimizerConfig::state_len`]).
pub fn init_state(cfg: &OptimizerConfig, state: &mut [f32]) {
    match *cfg {
        OptimizerConfig::Sgd { .. } => {}
        OptimizerConfig::RowAdagrad {
            initial_accumulator,
            ..
        }
        | OptimizerConfig::Adagrad {
            initial_accumulator,
            ..
        } => state.fill(initial_accumulator),
        OptimizerConfig::Adam { .. } | OptimizerConfig::Ftrl { .. } => state.fill(0.0),
    }
}

/// Lanes of [`sum_squares`].
const LANES: usize = 8;

/// `sum(eff(w_i, g_i)^2)` in [`LANES`] interleaved partial sums added at the end: the same result on every
/// machine (no reliance on the compiler), and 8 independent additions per step instead of one chain, which
/// the compiler turns into SIMD (row-wise Adagrad's apply was bound by the latency of the serial sum).
#[inline]
fn sum_squares(weights: &[f32], grad: &[f32], eff: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let (w8, g8) = (weights.chunks_exact(LANES), grad.chunks_exact(LANES));
    let (w_rest, g_rest) = (w8.remainder(), g8.remainder());
    for (w, g) in w8.zip(g8) {
        for k in 0..LANES {
            let e = eff(w[k], g[k]);
            acc[k] += e * e;
        }
    }
    for (k, (&w, &g)) in w_rest.iter().zip(g_rest).enumerate() {
        let e = eff(w, g);
        acc[k] += e * e;
    }
    acc.iter().sum()
}

/// Applies one gradient row without regularization: `weights.len() == grad.len()` (the dim) and
/// `state.len()` is the optimizer's state length.
pub fn apply(cfg: &OptimizerConfig, weights: &mut [f32], state: &mut [f32], grad: &[f32]) {
    update(cfg, Regularizer::NONE, weights, state, grad);
}

/// Applies one gradient row after clipping and weight decay (`reg`): `weights.len() == grad.len()` (the dim)
/// and `state.len()` is the optimizer's state length.
#[inline]
pub fn update(
    cfg: &OptimizerConfig,
    reg: Regularizer,
    weights: &mut [f32],
    state: &mut [f32],
    grad: &[f32],
) {
    let dim = grad.len();
    debug_assert_eq!(weights.len(), dim);
    debug_assert_eq!(state.len(), cfg.state_len(dim));
    let scale = reg.clip_scale(grad);
    let wd = reg.weight_decay;
    // The effective gradient of one coordinate, from its weight before the step. Without clipping and decay
    // it is `g` exactly (`1 * g + 0 * w`), so unregularized tables keep their results bit for bit.
    let eff = |w: f32, g: f32| scale * g + wd * w;
    match *cfg {
        OptimizerConfig::Sgd { lr } => {
            for (w, &g) in weights.iter_mut().zip(grad) {
                *w -= lr * eff(*w, g);
            }
        }
        OptimizerConfig::RowAdagrad { lr, eps, .. } => {
            let sum_sq = sum_squares(weights, grad, eff);
            let acc = &mut state[0];
            *acc += sum_sq / dim as f32;
            let multiplier = lr / (acc.sqrt() + eps);
            for (w, &g) in weights.iter_mut().zip(grad) {
                *w -= multiplier * eff(*w, g);
            }
        }
        OptimizerConfig::Adagrad { lr, eps, .. } => {
            for ((w, acc), &g) in weights.iter_mut().zip(state.iter_mut()).zip(grad) {
                let e = eff(*w, g);
                *acc += e * e;
                *w -= lr * (e / (acc.sqrt() + eps));
            }
        }
        OptimizerConfig::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            let (m, rest) = state.split_at_mut(dim);
            let (v, t) = rest.split_at_mut(dim);
            if t[0] < ADAM_MAX_STEP {
                t[0] += 1.0;
            }
            let step = f64::from(t[0]);
            let bc1 = 1.0 - f64::from(beta1).powf(step);
            let bc2 = 1.0 - f64::from(beta2).powf(step);
            let step_size = (f64::from(lr) / bc1) as f32;
            let bc2_sqrt = bc2.sqrt() as f32;
            for (((w, m), v), &g) in weights.iter_mut().zip(m).zip(v).zip(grad) {
                let e = eff(*w, g);
                *m = beta1 * *m + (1.0 - beta1) * e;
                *v = beta2 * *v + (1.0 - beta2) * e * e;
                *w -= step_size * (*m / (v.sqrt() / bc2_sqrt + eps));
            }
        }
        OptimizerConfig::Ftrl {
            alpha,
            beta,
            l1,
            l2,
        } => {
            let (z, n) = state.split_at_mut(dim);
            for (((w, z), n), &g) in weights.iter_mut().zip(z).zip(n).zip(grad) {
                let e = eff(*w, g);
                let n_new = *n + e * e;
                let sigma = (n_new.sqrt() - n.sqrt()) / alpha;
                *z += e - sigma * *w;
                *n = n_new;
                *w = if z.abs() <= l1 {
                    0.0
                } else {
                    -(*z - z.signum() * l1) / ((beta + n.sqrt()) / alpha + l2)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((f64::from(*x) - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn sgd_reference() {
        let cfg = OptimizerConfig::Sgd { lr: 0.1 };
        let mut w = [1.0f32, 2.0];
        apply(&cfg, &mut w, &mut [], &[0.5, -1.0]);
        close(&w, &[0.95, 2.1]);
        // Exact in f32.
        let cfg = OptimizerConfig::Sgd { lr: 1.0 };
        let mut w = [0.0f32];
        apply(&cfg, &mut w, &mut [], &[1.0]);
        apply(&cfg, &mut w, &mut [], &[1.0]);
        assert_eq!(w, [-2.0]);
    }

    #[test]
    fn row_adagrad_reference() {
        let cfg = OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        let mut w = [1.0f32, -1.0];
        let mut s = [0.0f32];
        init_state(&cfg, &mut s);
        apply(&cfg, &mut w, &mut s, &[3.0, 4.0]);
        // mean(g^2) = (9 + 16) / 2 = 12.5; multiplier = 0.1 / sqrt(12.5).
        let m1 = 0.1 / (12.5f64.sqrt() + 1e-8);
        assert_eq!(s, [12.5]);
        close(&w, &[1.0 - 3.0 * m1, -1.0 - 4.0 * m1]);
        // Second step: acc = 12.5 + (1 + 1) / 2 = 13.5.
        apply(&cfg, &mut w, &mut s, &[1.0, -1.0]);
        let m2 = 0.1 / (13.5f64.sqrt() + 1e-8);
        assert_eq!(s, [13.5]);
        close(&w, &[1.0 - 3.0 * m1 - m2, -1.0 - 4.0 * m1 + m2]);
    }

    #[test]
    fn row_adagrad_initial_accumulator() {
        let cfg = OptimizerConfig::RowAdagrad {
            lr: 1.0,
            eps: 1e-8,
            initial_accumulator: 0.5,
        };
        let mut s = [0.0f32];
        init_state(&cfg, &mut s);
        assert_eq!(s, [0.5]);
        let mut w = [0.0f32, 0.0];
        // acc = 0.5 + mean(2^2, 2^2) = 4.5.
        apply(&cfg, &mut w, &mut s, &[2.0, 2.0]);
        assert_eq!(s, [4.5]);
        let m = 1.0 / (4.5f64.sqrt() + 1e-8);
        close(&w, &[-2.0 * m, -2.0 * m]);
    }

    #[test]
    fn adagrad_reference() {
        let cfg = OptimizerConfig::Adagrad {
            lr: 0.1,
            eps: 1e-10,
            initial_accumulator: 0.0,
        };
        let mut w = [1.0f32, 1.0];
        let mut s = [0.0f32; 2];
        apply(&cfg, &mut w, &mut s, &[3.0, -4.0]);
        assert_eq!(s, [9.0, 16.0]);
        close(&w, &[0.9, 1.1]);
        apply(&cfg, &mut w, &mut s, &[4.0, 3.0]);
        assert_eq!(s, [25.0, 25.0]);
        close(&w, &[0.9 - 0.1 * 0.8, 1.1 - 0.1 * 0.6]);
    }

    fn adam(lr: f32, beta1: f32, beta2: f32, eps: f32) -> OptimizerConfig {
        OptimizerConfig::Adam {
            lr,
            beta1,
            beta2,
            eps,
        }
    }

    #[test]
    fn adam_constant_gradient_moves_lr_per_step() {
        // With a constant gradient, bias correction makes m_hat = g and v_hat = g^2 at every step, so each
        // step moves w by lr * g / (|g| + eps) = lr * sign(g).
        let cfg = adam(0.1, 0.9, 0.999, 1e-8);
        let mut w = [1.0f32, 1.0];
        let mut s = [7.0f32; 5];
        init_state(&cfg, &mut s);
        assert_eq!(s, [0.0; 5]);
        apply(&cfg, &mut w, &mut s, &[0.5, -2.0]);
        close(&w, &[0.9, 1.1]);
        // m = 0.1 g, v = 0.001 g^2, t = 1.
        close(&s, &[0.05, -0.2, 0.00025, 0.004, 1.0]);
        apply(&cfg, &mut w, &mut s, &[0.5, -2.0]);
        close(&w, &[0.8, 1.2]);
        assert_eq!(s[4], 2.0);
    }

    /// Adam in f64 with a global step, written straight from the paper, for one row.
    fn reference_adam(
        lr: f64,
        b1: f64,
        b2: f64,
        eps: f64,
        wd: f64,
        w: &mut [f64],
        grads: &[Vec<f64>],
    ) {
        let mut m = vec![0.0; w.len()];
        let mut v = vec![0.0; w.len()];
        for (t, g) in grads.iter().enumerate() {
            let t = (t + 1) as i32;
            for i in 0..w.len() {
                let g = g[i] + wd * w[i];
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                let m_hat = m[i] / (1.0 - b1.powi(t));
                let v_hat = v[i] / (1.0 - b2.powi(t));
                w[i] -= lr * m_hat / (v_hat.sqrt() + eps);
            }
        }
    }

    #[test]
    fn adam_matches_reference_over_steps() {
        let cfg = adam(0.01, 0.8, 0.95, 1e-6);
        let reg = Regularizer {
            weight_decay: 0.1,
            clip_norm: 0.0,
        };
        let grads: Vec<Vec<f64>> = (0..10)
            .map(|k| {
                (0..3)
                    .map(|i| ((k * 7 + i * 3) % 11) as f64 / 5.0 - 1.0)
                    .collect()
            })
            .collect();
        let mut w = [0.3f32, -0.2, 0.1];
        let mut s = [0.0f32; 7];
        for g in &grads {
            let g: Vec<f32> = g.iter().map(|&x| x as f32).collect();
            update(&cfg, reg, &mut w, &mut s, &g);
        }
        let mut want = [0.3f64, -0.2, 0.1];
        reference_adam(0.01, 0.8, 0.95, 1e-6, 0.1, &mut want, &grads);
        for (a, b) in w.iter().zip(&want) {
            assert!((f64::from(*a) - b).abs() < 1e-5, "{w:?} vs {want:?}");
        }
        assert_eq!(s[6], 10.0, "the row counts its own steps");
    }

    #[test]
    fn adam_step_count_is_per_row() {
        // A row updated for the first time after others were updated many times still gets the first-step
        // bias correction: it moves by lr * sign(g), not by a tiny uncorrected step.
        let cfg = adam(0.1, 0.9, 0.999, 1e-8);
        let mut busy = [0.0f32];
        let mut busy_s = [0.0f32; 3];
        for _ in 0..100 {
            apply(&cfg, &mut busy, &mut busy_s, &[1.0]);
        }
        assert_eq!(busy_s[2], 100.0);
        let mut rare = [0.0f32];
        let mut rare_s = [0.0f32; 3];
        apply(&cfg, &mut rare, &mut rare_s, &[3.0]);
        close(&rare, &[-0.1]);
        assert_eq!(rare_s[2], 1.0);
    }

    #[test]
    fn adam_step_count_saturates() {
        let cfg = adam(0.1, 0.9, 0.999, 1e-8);
        let mut w = [0.0f32];
        let mut s = [0.0, 0.0, ADAM_MAX_STEP];
        apply(&cfg, &mut w, &mut s, &[1.0]);
        assert_eq!(s[2], ADAM_MAX_STEP);
        assert!(w[0].is_finite());
    }

    #[test]
    fn ftrl_reference() {
        // alpha 0.1, beta 1, l1 0.5, l2 1; values from McMahan et al. 2013, Algorithm 1, by hand:
        // step 1, g = (1, 0.2), w = 0: n = (1, 0.04), sigma = (10, 2), z = (1, 0.2);
        //   w0 = -(1 - 0.5) / ((1 + 1) / 0.1 + 1) = -0.5 / 21; |z1| = 0.2 <= l1, so w1 = 0.
        // step 2, same g: n0 = 2, sigma0 = (sqrt(2) - 1) / 0.1, z0 = 2 - sigma0 * w0 = 2.0986223;
        //   w0 = -(z0 - 0.5) / ((1 + sqrt(2)) / 0.1 + 1) = -0.0635834; z1 = 0.4 <= l1, w1 = 0.
        let cfg = OptimizerConfig::Ftrl {
            alpha: 0.1,
            beta: 1.0,
            l1: 0.5,
            l2: 1.0,
        };
        let mut w = [0.0f32, 0.0];
        let mut s = [1.0f32; 4];
        init_state(&cfg, &mut s);
        assert_eq!(s, [0.0; 4]);
        apply(&cfg, &mut w, &mut s, &[1.0, 0.2]);
        close(&w, &[-0.5 / 21.0, 0.0]);
        close(&s, &[1.0, 0.2, 1.0, 0.04]);
        apply(&cfg, &mut w, &mut s, &[1.0, 0.2]);
        close(&w, &[-0.063_583_392_464_346, 0.0]);
        close(&s, &[2.098_622_276_755_499, 0.4, 2.0, 0.08]);
    }

    #[test]
    fn ftrl_weights_come_from_z_and_n_not_from_the_initializer() {
        // Without L1 the weights are -z / ((beta + sqrt(n)) / alpha + l2) after every update.
        let cfg = OptimizerConfig::Ftrl {
            alpha: 0.5,
            beta: 1.0,
            l1: 0.0,
            l2: 0.0,
        };
        let mut w = [0.25f32];
        let mut s = [0.0f32; 2];
        apply(&cfg, &mut w, &mut s, &[2.0]);
        // n = 4, sigma = 2 / 0.5 = 4, z = 2 - 4 * 0.25 = 1, w = -1 / ((1 + 2) / 0.5) = -1/6.
        close(&s, &[1.0, 4.0]);
        close(&w, &[-1.0 / 6.0]);
    }

    #[test]
    fn weight_decay_is_added_to_the_gradient() {
        let cfg = OptimizerConfig::Sgd { lr: 0.1 };
        let reg = Regularizer {
            weight_decay: 0.5,
            clip_norm: 0.0,
        };
        // g = 1 + 0.5 * 2 = 2; w = 2 - 0.1 * 2.
        let mut w = [2.0f32, -4.0];
        update(&cfg, reg, &mut w, &mut [], &[1.0, 0.0]);
        close(&w, &[1.8, -3.8]);
        // Row-wise Adagrad sees the decayed gradient in its accumulator: g = (0 + 0.5 * 2, 0 + 0.5 * 2).
        let cfg = OptimizerConfig::RowAdagrad {
            lr: 1.0,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        let mut w = [2.0f32, 2.0];
        let mut s = [0.0f32];
        update(&cfg, reg, &mut w, &mut s, &[0.0, 0.0]);
        assert_eq!(s, [1.0]);
        close(&w, &[1.0, 1.0]);
    }

    #[test]
    fn clipping_scales_long_gradients_only() {
        let cfg = OptimizerConfig::Sgd { lr: 1.0 };
        let reg = Regularizer {
            weight_decay: 0.0,
            clip_norm: 1.0,
        };
        // |(3, 4)| = 5 > 1: scaled to (0.6, 0.8).
        let mut w = [0.0f32, 0.0];
        update(&cfg, reg, &mut w, &mut [], &[3.0, 4.0]);
        close(&w, &[-0.6, -0.8]);
        // |(0.3, 0.4)| = 0.5 <= 1: unchanged.
        let mut w = [0.0f32, 0.0];
        update(&cfg, reg, &mut w, &mut [], &[0.3, 0.4]);
        close(&w, &[-0.3, -0.4]);
        // Clipping comes first, then decay: g = (0.6 + 1 * 1, 0.8 + 0).
        let reg = Regularizer {
            weight_decay: 1.0,
            clip_norm: 1.0,
        };
        let mut w = [1.0f32, 0.0];
        update(&cfg, reg, &mut w, &mut [], &[3.0, 4.0]);
        close(&w, &[-0.6, -0.8]);
        assert_eq!(Regularizer::NONE.clip_scale(&[1e30, 1e30]), 1.0);
    }

    #[test]
    fn no_regularization_is_bit_exact() {
        let cfg = OptimizerConfig::Adagrad {
            lr: 0.1,
            eps: 1e-10,
            initial_accumulator: 0.0,
        };
        let (mut a, mut b) = ([0.3f32, -0.7], [0.3f32, -0.7]);
        let (mut sa, mut sb) = ([0.0f32; 2], [0.0f32; 2]);
        apply(&cfg, &mut a, &mut sa, &[0.1, -0.0]);
        update(&cfg, Regularizer::default(), &mut b, &mut sb, &[0.1, -0.0]);
        assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
    }
}
