//! Calibration check of the planted teacher, not run by default (it trains for a while):
//! `cargo test --release -p bench --test learnability -- --ignored --nocapture`.
//!
//! A factorization machine (first-order weights plus 8-dim embeddings whose dot products model every pair of
//! fields: the structure of DLRM's interaction layer without the MLPs) is trained for one epoch on 1M rows
//! and evaluated on 100k rows of another seed. It should recover a good part of the gap between chance and the
//! oracle AUC, and clearly more than the same model without embeddings.

use std::collections::HashMap;

use bench::auc::auc;
use bench::gen::schema::{NUM_CAT, NUM_INT};
use bench::gen::{Generator, Row, CHUNK_ROWS};

const DIM: usize = 8;

/// Categorical fields, then integer fields bucketized on `ln(1 + x)` (the nonlinearity a DLRM finds with
/// its bottom MLP), each as a 64-bit key.
fn keys(row: &Row) -> [u64; NUM_CAT + NUM_INT] {
    let mut keys = [0; NUM_CAT + NUM_INT];
    for (j, v) in row.cats.iter().enumerate() {
        keys[j] = (j as u64) << 40 | v.unwrap_or(0);
    }
    for (j, x) in row.ints.iter().enumerate() {
        let bucket = match *x {
            None => 0,
            Some(x) if x < 0 => 1,
            Some(x) => 2 + ((x as f64).ln_1p() * 3.0).round() as u64,
        };
        keys[NUM_CAT + j] = ((NUM_CAT + j) as u64) << 40 | bucket;
    }
    keys
}

/// Factorization machine with row-wise Adagrad; `dim = 0` is logistic regression.
struct Fm {
    dim: usize,
    index: HashMap<u64, usize>,
    /// Per feature: weight, then `dim` embedding values.
    params: Vec<f32>,
    accum: Vec<f32>,
    bias: f32,
    bias_accum: f32,
}

impl Fm {
    fn new(dim: usize) -> Self {
        Fm { dim, index: HashMap::new(), params: Vec::new(), accum: Vec::new(), bias: 0.0, bias_accum: 1e-6 }
    }

    fn slot(&mut self, key: u64, seed: &mut u64) -> usize {
        let stride = 1 + self.dim;
        let next = self.params.len() / stride;
        let dim = self.dim;
        let slot = *self.index.entry(key).or_insert(next);
        if slot == next {
            self.params.push(0.0);
            for _ in 0..dim {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                self.params.push(((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * std::env::var("FM_INIT").ok().and_then(|v| v.parse::<f32>().ok()).unwrap_or(0.02));
            }
            self.accum.extend(std::iter::repeat_n(1e-6f32, stride));
        }
        slot
    }

    fn predict(&self, slots: &[Option<usize>]) -> f32 {
        let stride = 1 + self.dim;
        let mut z = self.bias;
        let mut sum = [0.0f32; DIM];
        let mut sq = 0.0;
        for s in slots.iter().flatten() {
            let p = &self.params[s * stride..(s + 1) * stride];
            z += p[0];
            for (f, &v) in p[1..].iter().enumerate() {
                sum[f] += v;
                sq += v * v;
            }
        }
        z + 0.5 * (sum.iter().map(|s| s * s).sum::<f32>() - sq)
    }

    fn train(&mut self, row: &Row, label: bool, seed: &mut u64) {
        let lr: f32 = std::env::var("FM_LR").ok().and_then(|v| v.parse().ok()).unwrap_or(0.05);
        let slots: Vec<Option<usize>> = keys(row).iter().map(|&k| Some(self.slot(k, seed))).collect();
        let z = self.predict(&slots);
        let g = 1.0 / (1.0 + (-z).exp()) - f32::from(u8::from(label));
        let stride = 1 + self.dim;
        let mut sum = [0.0f32; DIM];
        for s in slots.iter().flatten() {
            for (f, &v) in self.params[s * stride + 1..(s + 1) * stride].iter().enumerate() {
                sum[f] += v;
            }
        }
        self.bias_accum += g * g;
        self.bias -= lr * g / self.bias_accum.sqrt();
        for s in slots.iter().flatten() {
            let base = s * stride;
            for f in 0..stride {
                let grad = if f == 0 { g } else { g * (sum[f - 1] - self.params[base + f]) + 1e-5 * self.params[base + f] };
                self.accum[base + f] += grad * grad;
                self.params[base + f] -= lr * grad / self.accum[base + f].sqrt();
            }
        }
    }

    fn score(&self, row: &Row) -> f32 {
        let slots: Vec<Option<usize>> = keys(row).iter().map(|k| self.index.get(k).copied()).collect();
        self.predict(&slots)
    }
}

fn rows(generator: &Generator, n: u64, mut f: impl FnMut(&Row, f64, bool)) {
    for c in 0..n.div_ceil(CHUNK_ROWS) {
        generator.for_each_row(c, n, &mut f);
    }
}

#[test]
#[ignore = "slow calibration check; run in release with --ignored --nocapture"]
fn embeddings_recover_much_of_the_oracle_auc() {
    let teacher_seed = 7;
    let train = Generator::new(1, teacher_seed);
    let test = Generator::new(2, teacher_seed);
    let mut models = [Fm::new(0), Fm::new(DIM)];
    let mut seed = 1u64;
    rows(&train, 1_000_000, |row, _, label| models.iter_mut().for_each(|m| m.train(row, label, &mut seed)));

    let (mut labels, mut oracle, mut lr, mut fm) = (vec![], vec![], vec![], vec![]);
    let mut sums = [(0.0f64, 0.0f64); 3];
    rows(&test, 100_000, |row, p, label| {
        labels.push(label);
        oracle.push(p);
        lr.push(f64::from(models[0].score(row)));
        fm.push(f64::from(models[1].score(row)));
        let parts = test.teacher().parts(row);
        for (s, x) in sums.iter_mut().zip([parts.categorical, parts.pairwise, parts.integer]) {
            *s = (s.0 + x, s.1 + x * x);
        }
    });
    let oracle_auc = auc(&oracle, &labels).unwrap();
    let lr_auc = auc(&lr, &labels).unwrap();
    let fm_auc = auc(&fm, &labels).unwrap();
    let n = labels.len() as f64;
    let var = sums.map(|(s, s2)| s2 / n - (s / n) * (s / n));
    let rate = labels.iter().filter(|&&l| l).count() as f64 / labels.len() as f64;
    eprintln!(
        "positive rate {rate:.4}; variance of logit parts: categorical {:.3}, pairwise {:.3}, integer {:.3}",
        var[0], var[1], var[2]
    );
    eprintln!("test auc: oracle {oracle_auc:.4}, logistic regression {lr_auc:.4}, fm dim {DIM} {fm_auc:.4}");
    let recovered = (fm_auc - 0.5) / (oracle_auc - 0.5);
    eprintln!("fm recovers {:.0}% of the oracle's lift over chance", 100.0 * recovered);
    assert!((0.78..0.86).contains(&oracle_auc));
    assert!(recovered > 0.6, "fm recovers {recovered}");
    assert!(fm_auc > lr_auc + 0.01, "embeddings add little: fm {fm_auc}, lr {lr_auc}");
}
