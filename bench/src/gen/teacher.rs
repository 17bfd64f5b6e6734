//! The planted teacher: the true click model behind the labels, so a trainer's AUC can be compared with the
//! best achievable one (the oracle AUC).
//!
//! `logit = bias + sum_j w_j(C_j) + sum_(j,k) c_jk <v_j(C_j), v_k(C_k)> + sum_i f_i(I_i)`:
//!
//! - first-order weights `w_j(value)` and rank-[`RANK`] vectors `v_j(value)` come from a hash of
//!   (teacher seed, column, value), so a ten-million-value vocabulary needs no table;
//! - both are damped by [`head_amplitude`] as the value's Zipf rank grows: frequent values carry most of the
//!   signal, so a model that sees each of them many times can learn it, while rare values add only a little
//!   unlearnable noise;
//! - the pairwise term is exactly a dot product of per-value vectors, what DLRM's interaction layer computes,
//!   so learning embeddings (not just per-value biases) pays off;
//! - integer columns enter through `t = (ln(1 + max(x, 0)) - mu) / sigma`, linearly plus a few bumps and a
//!   threshold, so the dense MLP has a nonlinearity to find;
//! - a missing field is a value of its own with its own weight;
//! - a multi-hot field (a bag of `n` tokens, [`super::multi_hot`]) pools its tokens: its first-order weight
//!   and its interaction vector are the tokens' weights and vectors summed and scaled by `1 / sqrt(n)`, so
//!   the probabilities stay exact and a sum- or mean-pooled embedding bag can represent the teacher.
//!
//! [`Teacher::new`] calibrates on a few thousand sampled rows: it scales each kind of term to its
//! [`TARGET_STD`] (so the oracle AUC varies little between teacher seeds), then finds the bias by bisection so
//! that about [`TARGET_POSITIVE_RATE`] of the labels are 1.

use super::rng::{hash3, hash_normal, unit_uniform16, Rng};
use super::row::{Row, RowSampler};
use super::schema::{INT_SHAPE, NUM_CAT, NUM_INT};

/// Rank of the pairwise interaction vectors.
pub const RANK: usize = 4;
/// Positive rate the bias is calibrated to.
pub const TARGET_POSITIVE_RATE: f64 = 0.25;
/// Zipf ranks up to about this many carry full-strength weights; see [`head_amplitude`].
pub const HEAD_RANKS: f64 = 500.0;

/// Standard deviation of each kind of term after calibration, in logit units. Together they put the oracle
/// AUC near 0.82; the categorical terms (first-order and pairwise) carry most of the signal, so a model has to
/// learn embeddings to do well, and the pairwise share is what dot interactions add over per-value biases.
pub const TARGET_STD: LogitParts = LogitParts {
    categorical: 1.0,
    pairwise: 1.1,
    integer: 0.6,
};

/// Number of interacting categorical pairs.
const NUM_PAIRS: usize = 12;
/// Scale of the nonlinear integer terms relative to the linear ones (before calibration).
const BUMP_WEIGHT: f64 = 3.6;
/// Counts below this take `ln(1 + x)` from a table (most integer fields are small).
const LN1P_TABLE: usize = 1024;
/// Rows sampled to calibrate the bias.
const CALIBRATION_ROWS: usize = 8192;

// Salts keep the hash streams of the different parameter kinds apart.
const SALT_CAT: u64 = 1;
const SALT_VEC: u64 = 2;
const SALT_PARAM: u64 = 3;
const SALT_CALIBRATE: u64 = 4;
/// Hash key of a missing categorical value (ranks start at 1).
const MISSING_RANK: u64 = 0;

/// Amplitude of the weights of the value at Zipf rank `rank`: 1 for the head, decaying like
/// `rank^-1/2` past [`HEAD_RANKS`].
#[inline]
pub fn head_amplitude(rank: u64) -> f64 {
    (1.0 + rank as f64 / HEAD_RANKS).sqrt().recip()
}

/// Logistic function.
#[inline]
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The terms of a logit, without the bias (see [`Teacher::parts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogitParts {
    /// First-order categorical weights.
    pub categorical: f64,
    /// Pairwise categorical interactions.
    pub pairwise: f64,
    /// Integer columns: linear, nonlinear and missing terms.
    pub integer: f64,
}

impl LogitParts {
    /// Sum of the terms.
    #[inline]
    pub fn sum(&self) -> f64 {
        self.categorical + self.pairwise + self.integer
    }
}

/// A nonlinear term in one integer column's standardized `t`.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// `height * exp(-(t - center)^2 / (2 width^2))`.
    Bump { center: f64, width: f64 },
    /// `height * [t > center]`.
    Step { center: f64 },
}

#[derive(Debug, Clone, Copy)]
struct Nonlinear {
    column: usize,
    height: f64,
    shape: Shape,
}

/// The planted click model; deterministic from its seed. Build once with [`Teacher::new`], then call
/// [`Teacher::logit`] or [`Teacher::probability`] per row from any number of threads.
#[derive(Debug, Clone)]
pub struct Teacher {
    seed: u64,
    bias: f64,
    cat_scale: [f64; NUM_CAT],
    int_linear: [f64; NUM_INT],
    int_missing: [f64; NUM_INT],
    /// `(j, k, c_jk)` with `j < k`.
    pairs: Vec<(usize, usize, f64)>,
    /// Columns that appear in some pair (their vectors are computed per row).
    in_pair: Vec<usize>,
    nonlinear: Vec<Nonlinear>,
    /// `ln(1 + x)` for `x < LN1P_TABLE`.
    ln1p: Vec<f64>,
}

impl Teacher {
    /// Draws the teacher's parameters from `seed` and calibrates their scales and the bias on rows of the
    /// schema ([`RowSampler::new`]).
    pub fn new(seed: u64) -> Self {
        Self::calibrated_on(seed, &RowSampler::new())
    }

    /// Draws the teacher's parameters from `seed` and calibrates their scales and the bias on rows drawn by
    /// `sampler` (the rows it will label).
    pub fn calibrated_on(seed: u64, sampler: &RowSampler) -> Self {
        let mut params = Rng::new(hash3(seed, SALT_PARAM, 0));
        let mut cat_scale = [0.0; NUM_CAT];
        for s in &mut cat_scale {
            *s = 0.3 + 0.7 * params.next_f64();
        }
        let mut int_linear = [0.0; NUM_INT];
        let mut int_missing = [0.0; NUM_INT];
        for j in 0..NUM_INT {
            int_linear[j] = params.normal();
            int_missing[j] = params.normal();
        }
        let mut pairs: Vec<(usize, usize, f64)> = Vec::with_capacity(NUM_PAIRS);
        while pairs.len() < NUM_PAIRS {
            let a = (params.next_u64() % NUM_CAT as u64) as usize;
            let b = (params.next_u64() % NUM_CAT as u64) as usize;
            let (j, k) = (a.min(b), a.max(b));
            if j != k && !pairs.iter().any(|p| (p.0, p.1) == (j, k)) {
                let sign = if params.bernoulli(0.5) { 1.0 } else { -1.0 };
                pairs.push((j, k, sign * (0.5 + 0.5 * params.next_f64())));
            }
        }
        let mut in_pair: Vec<usize> = pairs.iter().flat_map(|p| [p.0, p.1]).collect();
        in_pair.sort_unstable();
        in_pair.dedup();
        let mut nonlinear = Vec::new();
        let mut columns: Vec<usize> = (0..NUM_INT).collect();
        // Two bumps and a threshold, on distinct columns.
        for i in 0..3 {
            let pick = i + (params.next_u64() % (NUM_INT - i) as u64) as usize;
            columns.swap(i, pick);
            let center = -0.5 + 1.5 * params.next_f64();
            let sign = if params.bernoulli(0.5) { 1.0 } else { -1.0 };
            nonlinear.push(Nonlinear {
                column: columns[i],
                height: sign * BUMP_WEIGHT * (0.6 + 0.4 * params.next_f64()),
                shape: if i < 2 {
                    Shape::Bump { center, width: 0.5 }
                } else {
                    Shape::Step { center }
                },
            });
        }
        let mut teacher = Teacher {
            seed,
            bias: 0.0,
            cat_scale,
            int_linear,
            int_missing,
            pairs,
            in_pair,
            nonlinear,
            ln1p: (0..LN1P_TABLE).map(|x| (x as f64).ln_1p()).collect(),
        };
        teacher.calibrate(sampler);
        teacher
    }

    /// The seed the teacher was drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The calibrated bias.
    pub fn bias(&self) -> f64 {
        self.bias
    }

    /// Log-odds of a click on `row`.
    #[inline]
    pub fn logit(&self, row: &Row) -> f64 {
        self.bias + self.score(row)
    }

    /// True click probability of `row`, in (0, 1).
    #[inline]
    pub fn probability(&self, row: &Row) -> f64 {
        sigmoid(self.logit(row))
    }

    /// The logit without the bias.
    #[inline]
    fn score(&self, row: &Row) -> f64 {
        self.parts(row).sum()
    }

    /// The logit of `row` split by kind of term (the bias excluded).
    pub fn parts(&self, row: &Row) -> LogitParts {
        let mut parts = LogitParts::default();
        for (j, value) in row.cats.iter().enumerate() {
            parts.categorical += match row.bag(j) {
                // A bag pools its tokens' weights: summed, scaled by 1 / sqrt(n) (fixed n per column).
                Some(bag) => {
                    let sum: f64 = bag.iter().map(|&r| self.cat_weight(j, Some(r))).sum();
                    sum / (bag.len() as f64).sqrt()
                }
                None => self.cat_weight(j, *value),
            };
        }
        let mut vecs = [[0.0; RANK]; NUM_CAT];
        for &j in &self.in_pair {
            match row.bag(j) {
                // A bag's vector is its tokens' vectors summed and scaled by 1 / sqrt(n), what a sum-pooled
                // embedding bag computes up to that constant.
                Some(bag) => {
                    let norm = (bag.len() as f64).sqrt().recip();
                    for &r in bag {
                        let token = self.pair_vector(j, Some(r));
                        vecs[j]
                            .iter_mut()
                            .zip(token)
                            .for_each(|(v, t)| *v += t * norm);
                    }
                }
                None => vecs[j] = self.pair_vector(j, row.cats[j]),
            }
        }
        for &(j, k, c) in &self.pairs {
            let dot: f64 = vecs[j].iter().zip(&vecs[k]).map(|(a, b)| a * b).sum();
            // A dot of RANK unit-variance products has variance RANK; scale it back to 1.
            parts.pairwise += c * dot / (RANK as f64).sqrt();
        }
        let mut t = [0.0; NUM_INT];
        for (j, x) in row.ints.iter().enumerate() {
            match *x {
                Some(x) => {
                    let shape = &INT_SHAPE[j];
                    let x = x.max(0) as u64;
                    let ln1p = match self.ln1p.get(x as usize) {
                        Some(&v) => v,
                        None => (x as f64).ln_1p(),
                    };
                    t[j] = (ln1p - shape.mu) / shape.sigma;
                    parts.integer += self.int_linear[j] * t[j];
                }
                None => parts.integer += self.int_missing[j],
            }
        }
        for n in &self.nonlinear {
            if row.ints[n.column].is_none() {
                continue;
            }
            let t = t[n.column];
            parts.integer += n.height
                * match n.shape {
                    Shape::Bump { center, width } => {
                        let d = (t - center) / width;
                        (-0.5 * d * d).exp()
                    }
                    Shape::Step { center } => f64::from(u8::from(t > center)),
                };
        }
        parts
    }

    /// The first-order weight of one token (`value`, `None` if missing) of column `j`.
    #[inline]
    fn cat_weight(&self, j: usize, value: Option<u64>) -> f64 {
        let rank = value.unwrap_or(MISSING_RANK);
        let h = hash3(self.seed ^ SALT_CAT, j as u64, rank);
        self.cat_scale[j] * amplitude(value) * hash_normal(h)
    }

    /// The interaction vector of one token (`value`, `None` if missing) of column `j`.
    #[inline]
    fn pair_vector(&self, j: usize, value: Option<u64>) -> [f64; RANK] {
        let h = hash3(
            self.seed ^ SALT_VEC,
            j as u64,
            value.unwrap_or(MISSING_RANK),
        );
        let a = amplitude(value);
        std::array::from_fn(|k| a * unit_uniform16(h >> (16 * k)))
    }

    /// Scales each kind of term to its [`TARGET_STD`] on sampled rows, then finds by bisection the bias at
    /// which their mean probability is [`TARGET_POSITIVE_RATE`].
    fn calibrate(&mut self, sampler: &RowSampler) {
        let mut rng = Rng::new(hash3(self.seed, SALT_CALIBRATE, 0));
        let mut row = Row::default();
        let parts: Vec<LogitParts> = (0..CALIBRATION_ROWS)
            .map(|_| {
                sampler.sample(&mut rng, &mut row);
                self.parts(&row)
            })
            .collect();
        let n = parts.len() as f64;
        let std = |f: fn(&LogitParts) -> f64| {
            let mean = parts.iter().map(f).sum::<f64>() / n;
            (parts.iter().map(|p| (f(p) - mean).powi(2)).sum::<f64>() / n).sqrt()
        };
        // Every term is linear in its kind's parameters, so scaling the parameters scales the term.
        let scale = LogitParts {
            categorical: TARGET_STD.categorical / std(|p| p.categorical),
            pairwise: TARGET_STD.pairwise / std(|p| p.pairwise),
            integer: TARGET_STD.integer / std(|p| p.integer),
        };
        self.cat_scale
            .iter_mut()
            .for_each(|w| *w *= scale.categorical);
        self.pairs.iter_mut().for_each(|p| p.2 *= scale.pairwise);
        self.int_linear.iter_mut().for_each(|w| *w *= scale.integer);
        self.int_missing
            .iter_mut()
            .for_each(|w| *w *= scale.integer);
        self.nonlinear
            .iter_mut()
            .for_each(|n| n.height *= scale.integer);
        let scores: Vec<f64> = parts
            .iter()
            .map(|p| {
                p.categorical * scale.categorical
                    + p.pairwise * scale.pairwise
                    + p.integer * scale.integer
            })
            .collect();
        let (mut lo, mut hi) = (-30.0, 30.0);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            let mean = scores.iter().map(|s| sigmoid(mid + s)).sum::<f64>() / n;
            if mean < TARGET_POSITIVE_RATE {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.bias = 0.5 * (lo + hi);
    }
}

/// [`head_amplitude`] of a value, with a missing value treated as a head value.
#[inline]
fn amplitude(value: Option<u64>) -> f64 {
    value.map_or(1.0, head_amplitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_teacher() {
        let a = Teacher::new(11);
        let b = Teacher::new(11);
        let c = Teacher::new(12);
        let sampler = RowSampler::new();
        let mut rng = Rng::new(0);
        let mut row = Row::default();
        let mut differs = false;
        for _ in 0..100 {
            sampler.sample(&mut rng, &mut row);
            assert_eq!(a.logit(&row), b.logit(&row));
            differs |= a.logit(&row) != c.logit(&row);
        }
        assert!(differs);
    }

    #[test]
    fn amplitude_decays_past_the_head() {
        assert!(head_amplitude(1) > 0.99);
        assert!(head_amplitude(1_000_000) < 0.03);
        assert_eq!(amplitude(None), 1.0);
    }

    #[test]
    fn calibrated_terms_have_target_spread_and_categoricals_dominate() {
        let t = Teacher::new(5);
        let sampler = RowSampler::new();
        let mut rng = Rng::new(98);
        let mut row = Row::default();
        let parts: Vec<LogitParts> = (0..20_000)
            .map(|_| {
                sampler.sample(&mut rng, &mut row);
                t.parts(&row)
            })
            .collect();
        let std = |f: fn(&LogitParts) -> f64| {
            let mean = parts.iter().map(f).sum::<f64>() / parts.len() as f64;
            (parts.iter().map(|p| (f(p) - mean).powi(2)).sum::<f64>() / parts.len() as f64).sqrt()
        };
        let (cat, pair, int) = (
            std(|p| p.categorical),
            std(|p| p.pairwise),
            std(|p| p.integer),
        );
        for (got, want) in [
            (cat, TARGET_STD.categorical),
            (pair, TARGET_STD.pairwise),
            (int, TARGET_STD.integer),
        ] {
            assert!((got / want - 1.0).abs() < 0.1, "std {got}, target {want}");
        }
        assert!(cat + pair > 2.0 * int);
    }

    #[test]
    fn calibrated_rate_is_close_to_target() {
        let t = Teacher::new(3);
        let sampler = RowSampler::new();
        let mut rng = Rng::new(99);
        let mut row = Row::default();
        let n = 20_000;
        let mean = (0..n)
            .map(|_| {
                sampler.sample(&mut rng, &mut row);
                t.probability(&row)
            })
            .sum::<f64>()
            / n as f64;
        assert!(
            (mean - TARGET_POSITIVE_RATE).abs() < 0.01,
            "mean probability {mean}"
        );
    }
}
