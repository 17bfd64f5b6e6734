//! Calibration check of the planted teacher, not run by default (it trains for a while):
//! `cargo test --release -p bench --test learnability -- --ignored --nocapture`.
//!
//! A field-weighted factorization machine (per-value weights, 16-dim embeddings, and a learned weight per
//! pair of fields on the embeddings' dot products: DLRM's dot interaction with a linear top layer) is trained
//! for one epoch on 1M rows and evaluated on 100k rows of another seed. It should recover a good part of the
//! oracle's lift over chance, and clearly more than logistic regression on the same features.

use std::collections::HashMap;

mod support;
use bench::gen::schema::{NUM_CAT, NUM_INT};
use bench::gen::{Generator, Row, CHUNK_ROWS};
use support::auc;

const FIELDS: usize = NUM_CAT + NUM_INT;
const DIM: usize = 16;
const LR: f32 = 0.02;
const INIT: f32 = 0.05;

/// Categorical fields, then integer fields bucketized on `ln(1 + x)` (the nonlinearity a DLRM finds with
/// its bottom MLP), each as a 64-bit key.
fn keys(row: &Row) -> [u64; FIELDS] {
    let mut keys = [0; FIELDS];
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

/// Adagrad step on one parameter.
fn step(param: &mut f32, accum: &mut f32, grad: f32) {
    *accum += grad * grad;
    *param -= LR * grad / accum.sqrt();
}

/// Field-weighted factorization machine with Adagrad; `dim = 0` is logistic regression.
struct FwFm {
    dim: usize,
    index: HashMap<u64, usize>,
    /// Per feature: weight, then `dim` embedding values; and their Adagrad sums.
    params: Vec<f32>,
    accum: Vec<f32>,
    /// Per field pair `(j, k)`, `j < k`, at `j * FIELDS + k`: weight and Adagrad sum.
    pair: Vec<(f32, f32)>,
    bias: (f32, f32),
    rng: u64,
}

impl FwFm {
    fn new(dim: usize) -> Self {
        FwFm {
            dim,
            index: HashMap::new(),
            params: Vec::new(),
            accum: Vec::new(),
            pair: vec![(1.0, 1e-6); FIELDS * FIELDS],
            bias: (0.0, 1e-6),
            rng: 1,
        }
    }

    fn slot(&mut self, key: u64) -> usize {
        let stride = 1 + self.dim;
        let next = self.params.len() / stride;
        let slot = *self.index.entry(key).or_insert(next);
        if slot == next {
            self.params.push(0.0);
            for _ in 0..self.dim {
                self.rng = self
                    .rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                self.params
                    .push(((self.rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * INIT);
            }
            self.accum.extend(std::iter::repeat_n(1e-6f32, stride));
        }
        slot
    }

    /// Logit and, per field, the embedding slice start (None for an unseen value).
    fn predict(&self, slots: &[Option<usize>; FIELDS]) -> f32 {
        let stride = 1 + self.dim;
        let mut z = self.bias.0;
        for (j, sj) in slots.iter().enumerate() {
            let Some(sj) = sj else { continue };
            let ej = &self.params[sj * stride..(sj + 1) * stride];
            z += ej[0];
            for (k, sk) in slots.iter().enumerate().skip(j + 1) {
                let Some(sk) = sk else { continue };
                let ek = &self.params[sk * stride + 1..(sk + 1) * stride];
                let dot: f32 = ej[1..].iter().zip(ek).map(|(a, b)| a * b).sum();
                z += self.pair[j * FIELDS + k].0 * dot;
            }
        }
        z
    }

    fn train(&mut self, row: &Row, label: bool) {
        let keys = keys(row);
        let slots: [Option<usize>; FIELDS] = std::array::from_fn(|j| Some(self.slot(keys[j])));
        let g = 1.0 / (1.0 + (-self.predict(&slots)).exp()) - f32::from(u8::from(label));
        let (b, a) = &mut self.bias;
        step(b, a, g);
        let stride = 1 + self.dim;
        let emb = |p: &Vec<f32>, j: usize| -> Vec<f32> {
            let s = slots[j].unwrap();
            p[s * stride + 1..(s + 1) * stride].to_vec()
        };
        let embs: Vec<Vec<f32>> = (0..FIELDS).map(|j| emb(&self.params, j)).collect();
        for j in 0..FIELDS {
            let base = slots[j].unwrap() * stride;
            step(&mut self.params[base], &mut self.accum[base], g);
            let mut grad = vec![0.0f32; self.dim];
            for k in 0..FIELDS {
                if k == j {
                    continue;
                }
                let (lo, hi) = (j.min(k), j.max(k));
                let r = self.pair[lo * FIELDS + hi].0;
                grad.iter_mut()
                    .zip(&embs[k])
                    .for_each(|(gr, e)| *gr += g * r * e);
                if j < k {
                    let dot: f32 = embs[j].iter().zip(&embs[k]).map(|(a, b)| a * b).sum();
                    let (w, acc) = &mut self.pair[lo * FIELDS + hi];
                    step(w, acc, g * dot);
                }
            }
            for (f, gr) in grad.into_iter().enumerate() {
                step(
                    &mut self.params[base + 1 + f],
                    &mut self.accum[base + 1 + f],
                    gr,
                );
            }
        }
    }

    fn score(&self, row: &Row) -> f32 {
        let keys = keys(row);
        self.predict(&std::array::from_fn(|j| self.index.get(&keys[j]).copied()))
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
    let mut models = [FwFm::new(0), FwFm::new(DIM)];
    rows(&train, 1_000_000, |row, _, label| {
        models.iter_mut().for_each(|m| m.train(row, label))
    });

    let (mut labels, mut oracle, mut lr, mut fm) = (vec![], vec![], vec![], vec![]);
    let mut sums = [(0.0f64, 0.0f64); 3];
    rows(&test, 100_000, |row, p, label| {
        labels.push(label);
        oracle.push(p);
        lr.push(f64::from(models[0].score(row)));
        fm.push(f64::from(models[1].score(row)));
        let parts = test.teacher().parts(row);
        for (s, x) in sums
            .iter_mut()
            .zip([parts.categorical, parts.pairwise, parts.integer])
        {
            *s = (s.0 + x, s.1 + x * x);
        }
    });
    let n = labels.len() as f64;
    let var = sums.map(|(s, s2)| s2 / n - (s / n) * (s / n));
    let oracle_auc = auc(&oracle, &labels).unwrap();
    let lr_auc = auc(&lr, &labels).unwrap();
    let fm_auc = auc(&fm, &labels).unwrap();
    let rate = labels.iter().filter(|&&l| l).count() as f64 / n;
    eprintln!(
        "positive rate {rate:.4}; variance of logit parts: categorical {:.3}, pairwise {:.3}, integer {:.3}",
        var[0], var[1], var[2]
    );
    eprintln!("test auc: oracle {oracle_auc:.4}, logistic regression {lr_auc:.4}, fwfm dim {DIM} {fm_auc:.4}");
    let recovered = (fm_auc - 0.5) / (oracle_auc - 0.5);
    eprintln!(
        "fwfm recovers {:.0}% of the oracle's lift over chance",
        100.0 * recovered
    );
    assert!((0.78..0.86).contains(&oracle_auc));
    assert!(recovered > 0.6, "fwfm recovers {recovered}");
    assert!(
        fm_auc > lr_auc + 0.01,
        "embeddings add little: fwfm {fm_auc}, lr {lr_auc}"
    );
}
