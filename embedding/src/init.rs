//! Deterministic row initializer: weight `i` of row `id` is a pure function of (table seed, id, i).
//!
//! DESIGN.md: "Initializers: deterministic from (table seed, id), so a pull of a new id needs no write." A pull of
//! an unseen id therefore returns these values without inserting a row, and a later push creates the row with the
//! very same values. The generator is counter-based: the row key is `splitmix64(seed ^ splitmix64(id))` and
//! element `i` is output `i` of a splitmix64 stream started at that key, mapped to the distribution with f64
//! arithmetic (no libm for the uniform case, so the values are the same on every IEEE platform).

use base::hash::{splitmix64, GOLDEN};

use crate::config::{InitKind, TableConfig};
use crate::optimizer;

/// The key from which the row's element stream is drawn.
#[inline]
fn row_key(seed: u64, id: u64) -> u64 {
    splitmix64(seed ^ splitmix64(id))
}

/// 64 random bits for element `i` of the row with key `key`.
#[inline]
fn element_bits(key: u64, i: usize) -> u64 {
    splitmix64(key.wrapping_add((i as u64).wrapping_mul(GOLDEN)))
}

/// Writes the initial weights of row `id` into `weights` (normally `dim` long; any length works, element `i`
/// does not depend on the length), rounded to nearest in the table's [`crate::RowPrecision`]: what a bf16 or
/// f16 table stores for a new row, so a pull of a new id equals the row a push creates.
pub fn fill_weights(cfg: &TableConfig, id: u64, weights: &mut [f32]) {
    fill_weights_f32(cfg, id, weights);
    if !cfg.precision.is_f32() {
        for w in weights.iter_mut() {
            *w = cfg.precision.round_nearest(*w);
        }
    }
}

/// The initial weights in f32, before rounding to the table's precision.
fn fill_weights_f32(cfg: &TableConfig, id: u64, weights: &mut [f32]) {
    let key = row_key(cfg.seed, id);
    match cfg.init.kind {
        InitKind::Uniform { scale } => {
            let scale = f64::from(scale);
            for (i, w) in weights.iter_mut().enumerate() {
                // Top 53 bits -> [0, 1) exactly, then [-scale, scale).
                let u = (element_bits(key, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
                *w = (scale * (2.0 * u - 1.0)) as f32;
            }
        }
        InitKind::Normal { std } => {
            let std = f64::from(std);
            for (i, w) in weights.iter_mut().enumerate() {
                // Box-Muller from two 24-bit halves of one draw; u1 in (0, 1] so ln is finite.
                let bits = element_bits(key, i);
                let u1 = ((bits >> 40) + 1) as f64 * (1.0 / (1u64 << 24) as f64);
                let u2 = (bits & 0xFF_FFFF) as f64 * (1.0 / (1u64 << 24) as f64);
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                *w = (std * z) as f32;
            }
        }
    }
}

/// Writes a whole new row: initial weights followed by the optimizer's initial state.
/// `row.len()` must be `cfg.row_len()`.
pub fn fill_row(cfg: &TableConfig, id: u64, row: &mut [f32]) {
    let (weights, state) = row.split_at_mut(cfg.dim);
    fill_weights(cfg, id, weights);
    optimizer::init_state(&cfg.optimizer, state);
    // The state's bf16 part starts at its initial value rounded to nearest (Adagrad's initial accumulator).
    if cfg.state_precision.is_f32() {
        return;
    }
    let half = cfg.row_codec().half_state();
    let half = half.min(state.len());
    for s in &mut state[..half] {
        *s = crate::RowPrecision::Bf16.round_nearest(*s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::InitConfig;

    #[test]
    fn deterministic_and_seed_dependent() {
        let cfg = TableConfig::new(1, "t", 8);
        let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
        fill_weights(&cfg, 42, &mut a);
        fill_weights(&cfg, 42, &mut b);
        assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
        fill_weights(&cfg, 43, &mut b);
        assert_ne!(a, b);
        let mut other = cfg.clone();
        other.seed = 1;
        fill_weights(&other, 42, &mut b);
        assert_ne!(a, b);
        // A prefix does not depend on the length asked for.
        let mut short = [0f32; 3];
        fill_weights(&cfg, 42, &mut short);
        assert_eq!(short, a[..3]);
    }

    #[test]
    fn uniform_range_and_mean() {
        let mut cfg = TableConfig::new(1, "t", 64);
        cfg.init = InitConfig::uniform(0.5);
        let mut row = vec![0f32; 64];
        let (mut sum, mut n) = (0f64, 0usize);
        for id in 0..2000u64 {
            fill_weights(&cfg, id, &mut row);
            for &w in &row {
                assert!((-0.5..0.5).contains(&w), "{w}");
                sum += f64::from(w);
                n += 1;
            }
        }
        assert!((sum / n as f64).abs() < 0.01);
    }

    #[test]
    fn normal_moments() {
        let mut cfg = TableConfig::new(1, "t", 64);
        cfg.init = InitConfig::normal(2.0);
        let mut row = vec![0f32; 64];
        let (mut s1, mut s2, mut n) = (0f64, 0f64, 0f64);
        for id in 0..2000u64 {
            fill_weights(&cfg, id, &mut row);
            for &w in &row {
                assert!(w.is_finite());
                s1 += f64::from(w);
                s2 += f64::from(w) * f64::from(w);
                n += 1.0;
            }
        }
        let mean = s1 / n;
        let std = (s2 / n - mean * mean).sqrt();
        assert!(mean.abs() < 0.05, "{mean}");
        assert!((std - 2.0).abs() < 0.05, "{std}");
    }

    #[test]
    fn zero_scale_gives_zeros_and_state_is_initialized() {
        let mut cfg = TableConfig::new(1, "t", 4);
        cfg.init = InitConfig::uniform(0.0);
        cfg.optimizer = crate::OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.25,
        };
        let mut row = [9f32; 5];
        fill_row(&cfg, 7, &mut row);
        assert_eq!(row, [0.0, 0.0, 0.0, 0.0, 0.25]);
    }

    #[test]
    fn dlrm_scale() {
        assert_eq!(InitConfig::dlrm(10_000), InitConfig::uniform(0.01));
    }
}
