//! Tests of the parent module.

use super::*;
use proptest::prelude::*;

fn decode_all(bytes: &[u8], n: usize, dim: usize, enc: Encoding) -> Vec<f32> {
    let mut out = vec![0.0; n * dim];
    decode_rows(bytes, dim, enc, &mut out).unwrap();
    out
}

proptest! {
    /// Sum of the applied (decoded, unscaled) pushes plus the final residual equals the sum of the true
    /// gradients, for every lossy encoding and changing loss scales.
    #[test]
    fn pushed_plus_residual_equals_true_sum(
        steps in proptest::collection::vec(
            (proptest::collection::vec(-1.0f32..1.0, 12), 1u32..5, proptest::bool::ANY), 1..30),
        enc_i in 1usize..4,
    ) {
        let enc = Encoding::ALL[enc_i];
        let dim = 4;
        let mut store = ResidualStore::new(dim, FeedbackConfig { max_age_steps: 1000, max_rows: 100 });
        let ids = [3u64, 9, 11];
        let mut truth = [0.0f64; 12];
        let mut applied = [0.0f64; 12];
        for (g, scale_pow, tiny) in &steps {
            // Some steps carry tiny gradients that f16 and int8 round away without feedback.
            let g: Vec<f32> = g.iter().map(|x| if *tiny { x * 1e-4 } else { *x }).collect();
            let scale = (1u32 << (3 * scale_pow)) as f32;
            let scaled: Vec<f32> = g.iter().map(|x| x * scale).collect();
            let mut bytes = Vec::new();
            store.encode_rows(1, &ids, &scaled, scale, enc, &mut bytes);
            let d = decode_all(&bytes, 3, dim, enc);
            for i in 0..12 {
                truth[i] += g[i] as f64;
                applied[i] += (d[i] / scale) as f64;
            }
            store.end_step();
        }
        for (i, &id) in ids.iter().enumerate() {
            let r = store.residual(1, id).map(|r| r.to_vec()).unwrap_or(vec![0.0; dim]);
            for (e, r) in r.iter().enumerate() {
                let k = i * dim + e;
                let err = (applied[k] + *r as f64 - truth[k]).abs();
                prop_assert!(err <= 1e-5 * (1.0 + steps.len() as f64), "{:?} element {}: {}", enc, k, err);
            }
        }
    }
}

#[test]
fn feedback_recovers_what_int8_rounds_away() {
    // A row whose second element is far below the int8 step: without feedback it is never applied.
    let mut store = ResidualStore::new(2, FeedbackConfig::default());
    let mut sum = 0.0;
    for _ in 0..1000 {
        let mut b = Vec::new();
        store.encode_rows(0, &[1], &[1.0, 0.001], 1.0, Encoding::Int8, &mut b);
        sum += decode_all(&b, 1, 2, Encoding::Int8)[1];
    }
    assert!((sum - 1.0).abs() < 0.01, "{sum}");
}

#[test]
fn lossless_rows_and_exact_rows_keep_no_residual() {
    let mut store = ResidualStore::new(2, FeedbackConfig::default());
    let mut b = Vec::new();
    store.encode_rows(
        0,
        &[1, 2],
        &[0.1, 0.2, 0.3, 0.4],
        1.0,
        Encoding::F32,
        &mut b,
    );
    store.encode_rows(0, &[3], &[1.0, 0.5], 1.0, Encoding::F16, &mut b);
    assert_eq!(b.len(), 16 + 4);
    assert_eq!(store.stats().rows, 0);
    store.encode_rows(0, &[4], &[0.1, 0.3], 1.0, Encoding::F16, &mut b);
    assert_eq!(store.stats().rows, 1);
    assert!(store.residual(0, 4).is_some() && store.residual(1, 4).is_none());
}

#[test]
fn old_residuals_are_dropped_and_the_cap_holds() {
    let cfg = FeedbackConfig {
        max_age_steps: 4,
        max_rows: 3,
    };
    let mut store = ResidualStore::new(1, cfg);
    let mut b = Vec::new();
    store.encode_rows(
        0,
        &[1, 2, 3, 4],
        &[0.1, 0.1, 0.1, 0.1],
        1.0,
        Encoding::F16,
        &mut b,
    );
    assert_eq!(store.stats().rows, 3);
    assert_eq!(store.stats().dropped_full, 1);
    for step in 0..6 {
        // Row 1 keeps being pushed; rows 2 and 3 age out after 4 steps.
        store.encode_rows(0, &[1], &[0.1], 1.0, Encoding::F16, &mut b);
        store.end_step();
        let held = store.stats().rows;
        assert!(held == 3 || (step >= 3 && held == 1), "step {step}: {held}");
    }
    assert_eq!(store.stats().rows, 1);
    assert_eq!(store.stats().dropped_age, 2);
    // Freed slots are reused.
    store.encode_rows(0, &[7, 8], &[0.1, 0.1], 1.0, Encoding::F16, &mut b);
    assert_eq!(store.stats().rows, 3);
    assert_eq!(store.keys.len(), 3);
}

#[test]
fn nonfinite_gradients_leave_no_residual_behind() {
    let mut store = ResidualStore::new(2, FeedbackConfig::default());
    let mut b = Vec::new();
    store.encode_rows(0, &[1], &[f32::NAN, 0.3], 1.0, Encoding::Int8, &mut b);
    let r = store.residual(0, 1).unwrap();
    assert!(r.iter().all(|x| x.is_finite()), "{r:?}");
}

/// The simple model: a HashMap of residuals with the same age rules, one row at a time.
struct Model {
    dim: usize,
    cfg: FeedbackConfig,
    rows: std::collections::HashMap<(u32, u64), (Vec<f32>, u64)>,
    step: u64,
    last_sweep: u64,
}

impl Model {
    fn encode(
        &mut self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
        scale: f32,
        enc: Encoding,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        for (&id, g) in ids.iter().zip(grads.chunks_exact(self.dim)) {
            let held = self.rows.get(&(table, id)).map(|r| r.0.clone());
            let v: Vec<f32> = match &held {
                Some(r) => g.iter().zip(r).map(|(g, r)| g + r * scale).collect(),
                None => g.to_vec(),
            };
            let at = out.len();
            encode_rows(&v, self.dim, enc, &mut out);
            let d = decode_all(&out[at..], 1, self.dim, enc);
            if held.is_none() && (v == d || self.rows.len() >= self.cfg.max_rows) {
                continue;
            }
            let inv = 1.0 / scale;
            let r = v.iter().zip(&d).map(|(v, d)| {
                let e = (v - d) * inv;
                if e.is_finite() {
                    e
                } else {
                    0.0
                }
            });
            self.rows.insert((table, id), (r.collect(), self.step));
        }
        out
    }

    fn end_step(&mut self) {
        self.step += 1;
        if self.step - self.last_sweep < (self.cfg.max_age_steps / 2).max(1) {
            return;
        }
        self.last_sweep = self.step;
        let (step, age) = (self.step, self.cfg.max_age_steps);
        self.rows.retain(|_, r| step - r.1 < age);
    }
}

proptest! {
    /// The bulk, prefetching store gives the bytes and residuals of the one-row-at-a-time model, across
    /// sweeps, the row cap, and an export/import in the middle.
    #[test]
    fn store_matches_the_simple_model(
        steps in proptest::collection::vec(
            (0u32..3, proptest::collection::btree_set(0u64..400, 0..300), -3.0f32..3.0), 1..25),
        enc_i in 1usize..4,
        max_age in 1u64..6,
        max_rows in 1usize..500,
        reload_at in 0usize..25,
    ) {
        let enc = Encoding::ALL[enc_i];
        let dim = 3;
        let cfg = FeedbackConfig { max_age_steps: max_age, max_rows };
        let mut store = ResidualStore::new(dim, cfg);
        let mut model = Model { dim, cfg, rows: Default::default(), step: 0, last_sweep: 0 };
        for (n, (table, ids, x)) in steps.iter().enumerate() {
            if n == reload_at {
                let mut other = ResidualStore::new(dim, cfg);
                other.import(&store.export()).unwrap();
                store = other;
            }
            let ids: Vec<u64> = ids.iter().map(|i| mix64(*i)).collect();
            let grads: Vec<f32> = (0..ids.len() * dim).map(|i| (i as f32 * 0.37 + x).sin() * 7.0).collect();
            let mut got = Vec::new();
            store.encode_rows(*table, &ids, &grads, 64.0, enc, &mut got);
            prop_assert_eq!(&got, &model.encode(*table, &ids, &grads, 64.0, enc));
            store.end_step();
            model.end_step();
            prop_assert_eq!(store.stats().rows, model.rows.len());
            for ((t, id), (r, _)) in &model.rows {
                prop_assert_eq!(store.residual(*t, *id), Some(&r[..]));
            }
        }
    }
}

#[test]
fn import_refuses_bad_bytes_naming_the_problem() {
    let mut store = ResidualStore::new(2, FeedbackConfig::default());
    let mut b = Vec::new();
    store.encode_rows(
        4,
        &[1, 2],
        &[0.1, 0.3, 0.7, 0.9],
        1.0,
        Encoding::F16,
        &mut b,
    );
    let saved = store.export();
    let mut other = ResidualStore::new(2, FeedbackConfig::default());
    assert!(matches!(
        other.import(b"junk"),
        Err(ImportError::BadHeader { .. })
    ));
    let e = ResidualStore::new(3, FeedbackConfig::default())
        .import(&saved)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "residuals saved with dim 2, this store has dim 3"
    );
    let e = other.import(&saved[..saved.len() - 1]).unwrap_err();
    assert!(e.to_string().contains("2 rows"), "{e}");
    let mut dup = saved.clone();
    dup[28] = 3;
    let row = saved[HEADER..HEADER + 28].to_vec();
    dup.extend_from_slice(&row);
    assert_eq!(
        other.import(&dup).unwrap_err(),
        ImportError::Duplicate { table: 4, id: 1 }
    );
    let mut nan = saved.clone();
    nan[HEADER + 20..HEADER + 24].copy_from_slice(&f32::NAN.to_le_bytes());
    assert_eq!(
        other.import(&nan).unwrap_err(),
        ImportError::NonFinite { table: 4, id: 1 }
    );
    assert_eq!(other.stats().rows, 0, "a refused import changes nothing");
    other.import(&saved).unwrap();
    assert_eq!(other.residual(4, 2), store.residual(4, 2));
}
