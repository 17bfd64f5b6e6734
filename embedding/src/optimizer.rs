//! Sans-IO optimizers: update one row's weights and state in place from its gradient.
//!
//! The formulas follow the reference implementations so trained models are comparable:
//! - SGD: `w -= lr * g`.
//! - Row-wise Adagrad, as FBGEMM's `EXACT_ROWWISE_ADAGRAD` used by TorchRec: one accumulator per row,
//!   `acc += mean(g^2); w -= (lr / (sqrt(acc) + eps)) * g`.
//! - Element-wise Adagrad, as `torch.optim.Adagrad`: `acc_i += g_i^2; w_i -= lr * (g_i / (sqrt(acc_i) + eps))`.
//!
//! Callers check that the gradient is finite first ([`crate::Table::apply`] rejects such rows); these functions
//! only do arithmetic.

use crate::config::OptimizerConfig;

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
    }
}

/// Applies one gradient row: `weights.len() == grad.len()` (the dim) and `state.len()` is the optimizer's
/// state length.
pub fn apply(cfg: &OptimizerConfig, weights: &mut [f32], state: &mut [f32], grad: &[f32]) {
    debug_assert_eq!(weights.len(), grad.len());
    debug_assert_eq!(state.len(), cfg.state_len(grad.len()));
    match *cfg {
        OptimizerConfig::Sgd { lr } => {
            for (w, &g) in weights.iter_mut().zip(grad) {
                *w -= lr * g;
            }
        }
        OptimizerConfig::RowAdagrad { lr, eps, .. } => {
            let sum_sq: f32 = grad.iter().map(|&g| g * g).sum();
            let acc = &mut state[0];
            *acc += sum_sq / grad.len() as f32;
            let multiplier = lr / (acc.sqrt() + eps);
            for (w, &g) in weights.iter_mut().zip(grad) {
                *w -= multiplier * g;
            }
        }
        OptimizerConfig::Adagrad { lr, eps, .. } => {
            for ((w, acc), &g) in weights.iter_mut().zip(state.iter_mut()).zip(grad) {
                *acc += g * g;
                *w -= lr * (g / (acc.sqrt() + eps));
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
}
