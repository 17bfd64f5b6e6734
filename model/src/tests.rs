//! Whole-model tests of [`Dlrm`]: exact gradients, learning, argument errors.

use super::rng::Rng;
use super::testutil::{check_grad, rand_vec};
use super::*;

mod dcn;

fn small_cfg() -> DlrmConfig {
    DlrmConfig {
        num_dense: 3,
        num_sparse: 4,
        emb_dim: 4,
        bottom: vec![6, 4],
        top: vec![7, 5, 1],
        ..DlrmConfig::default()
    }
}

struct Batch {
    n: usize,
    dense: Vec<f32>,
    emb: Vec<f32>,
    labels: Vec<f32>,
}

fn random_batch(cfg: &DlrmConfig, n: usize, rng: &mut Rng) -> Batch {
    Batch {
        n,
        dense: rand_vec(rng, n * cfg.num_dense, 1.0),
        emb: rand_vec(rng, n * cfg.emb_width(), 0.5),
        labels: (0..n).map(|_| (rng.next_u64() & 1) as f32).collect(),
    }
}

/// Mean loss without changing the model: a train step with learning rate 0.
fn loss_of(model: &mut Dlrm, b: &Batch) -> f64 {
    let mut g = vec![0.0; b.emb.len()];
    model
        .train_step(b.n, &b.dense, &b.emb, &b.labels, &mut g)
        .unwrap() as f64
}

#[test]
fn gradients_match_finite_differences() {
    check_model_gradients(small_cfg(), 1e-2);
}

/// Checks `d loss / d emb` and every parameter gradient of a model of `cfg` against central differences
/// with step `eps` (small enough for the model's curvature, big enough for f32 round-off).
fn check_model_gradients(cfg: DlrmConfig, eps: f32) {
    let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.0 }, 3).unwrap();
    let mut rng = Rng::new(4);
    let mut b = random_batch(&cfg, 5, &mut rng);
    let mut emb_grad = vec![0.0; b.emb.len()];
    model
        .train_step(b.n, &b.dense, &b.emb, &b.labels, &mut emb_grad)
        .unwrap();
    let (rel, abs) = (1e-2, 1e-4);

    check_grad("emb", &emb_grad, eps, rel, abs, |i, d| {
        b.emb[i] += d;
        let l = loss_of(&mut model, &b);
        b.emb[i] -= d;
        l
    });

    // Every parameter tensor of every layer, weights and biases.
    let grads: Vec<Vec<f32>> = model.grads().iter().map(|g| g.to_vec()).collect();
    assert_eq!(grads.len(), model.params().len());
    for (t, grad) in grads.iter().enumerate() {
        check_grad(&format!("param tensor {t}"), grad, eps, rel, abs, |i, d| {
            let mut params: Vec<Vec<f32>> = model.params().iter().map(|p| p.to_vec()).collect();
            params[t][i] += d;
            let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
            model.set_params(&refs).unwrap();
            let l = loss_of(&mut model, &b);
            params[t][i] -= d;
            let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
            model.set_params(&refs).unwrap();
            l
        });
    }
}

#[test]
fn training_reduces_loss_on_a_learnable_problem() {
    learns(small_cfg(), Precision::F32);
}

#[test]
fn bf16_training_reduces_loss_on_a_learnable_problem() {
    if !bf16_available() {
        eprintln!("skipped: no bf16 kernel (AMX-BF16 or AVX512-BF16) on this machine");
        return;
    }
    // Layers of 16 and more outputs, so that the products run on the bf16 kernel.
    learns(bf16_cfg(), Precision::Bf16);
}

/// A config whose layers (all but the logit) are wide enough for the bf16 products.
fn bf16_cfg() -> DlrmConfig {
    DlrmConfig {
        num_dense: 3,
        num_sparse: 4,
        emb_dim: 16,
        bottom: vec![48, 16],
        top: vec![40, 24, 1],
        ..DlrmConfig::default()
    }
}

/// Trains on a learnable problem in `precision`: held-out loss must halve and the AUC pass 0.9.
fn learns(cfg: DlrmConfig, precision: Precision) {
    // The label is 1 when dense[0] + <e_1, e_2> > 0: learning it needs the bottom MLP and the interaction.
    let opt = DenseOptimizer::adam(0.01);
    let mut model = Dlrm::new(cfg.clone(), opt, 1).unwrap();
    model.set_precision(precision).unwrap();
    let mut rng = Rng::new(2);
    let make = |rng: &mut Rng| {
        let mut b = random_batch(&cfg, 256, rng);
        // Features 0 and 1 must have the same dimension.
        let (d, w, second) = (cfg.feature_dim(0), cfg.emb_width(), cfg.emb_offset(1));
        for s in 0..b.n {
            let e = &b.emb[s * w..];
            let dot: f32 = (0..d).map(|k| e[k] * e[second + k]).sum();
            b.labels[s] = (b.dense[s * cfg.num_dense] + 4.0 * dot > 0.0) as u8 as f32;
        }
        b
    };
    let held_out = make(&mut rng);
    let before = loss_of(&mut model, &held_out);
    let mut grad = vec![0.0; held_out.emb.len()];
    for _ in 0..300 {
        let b = make(&mut rng);
        model
            .train_step(b.n, &b.dense, &b.emb, &b.labels, &mut grad)
            .unwrap();
    }
    let after = loss_of(&mut model, &held_out);
    assert!(after < 0.5 * before, "loss {before} -> {after}");
    let probs = model
        .predict(held_out.n, &held_out.dense, &held_out.emb)
        .unwrap()
        .to_vec();
    let auc = crate::eval::auc(&probs, &held_out.labels).unwrap();
    assert!(auc > 0.9, "auc {auc}");
}

#[test]
fn wrong_lengths_are_errors() {
    let cfg = small_cfg();
    let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.1 }, 0).unwrap();
    let mut rng = Rng::new(0);
    let b = random_batch(&cfg, 2, &mut rng);
    let mut g = vec![0.0; b.emb.len()];
    let err = model.predict(3, &b.dense, &b.emb).unwrap_err();
    assert_eq!(
        err,
        ModelError::Length {
            arg: "dense",
            len: 6,
            expected: 9
        }
    );
    assert_eq!(err.to_string(), "dense: length 6, expected 9");
    let err = model.predict(2, &b.dense, &b.emb[1..]).unwrap_err();
    assert_eq!(
        err,
        ModelError::Length {
            arg: "emb",
            len: 31,
            expected: 32
        }
    );
    let err = model
        .train_step(2, &b.dense, &b.emb, &b.labels[..1], &mut g)
        .unwrap_err();
    assert_eq!(
        err,
        ModelError::Length {
            arg: "labels",
            len: 1,
            expected: 2
        }
    );
    let err = model
        .train_step(2, &b.dense, &b.emb, &b.labels, &mut g[..3])
        .unwrap_err();
    assert_eq!(
        err,
        ModelError::Length {
            arg: "emb_grad",
            len: 3,
            expected: 32
        }
    );
    assert_eq!(
        model.train_step(0, &[], &[], &[], &mut []).unwrap_err(),
        ModelError::EmptyBatch
    );
    assert_eq!(model.predict(0, &[], &[]).unwrap(), &[] as &[f32]);
    assert_eq!(model.steps(), 0);
    let mut params: Vec<Vec<f32>> = model.params().iter().map(|p| p.to_vec()).collect();
    let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let err = model.set_params(&refs[..3]).unwrap_err();
    assert_eq!(
        err,
        ModelError::Length {
            arg: "params",
            len: 3,
            expected: 10
        }
    );
    params[2].pop();
    let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let err = model.set_params(&refs).unwrap_err();
    assert_eq!(err.to_string(), "params[2]: length 23, expected 24");
    let bad = DlrmConfig {
        bottom: vec![6, 5],
        ..cfg
    };
    assert!(matches!(
        Dlrm::new(bad, DenseOptimizer::Sgd { lr: 0.1 }, 0),
        Err(ModelError::Config {
            field: "bottom",
            ..
        })
    ));
}

#[test]
fn deterministic_and_batch_size_independent() {
    let cfg = small_cfg();
    let opt = DenseOptimizer::Adagrad {
        lr: 0.05,
        eps: 1e-10,
        initial_accumulator: 0.0,
    };
    let mut a = Dlrm::new(cfg.clone(), opt, 9).unwrap();
    let mut b = Dlrm::new(cfg.clone(), opt, 9).unwrap();
    assert_eq!(a.params(), b.params());
    assert_ne!(
        Dlrm::new(cfg.clone(), opt, 10).unwrap().params(),
        a.params()
    );
    let mut rng = Rng::new(1);
    // Batches that grow and shrink: buffers are reused, results do not depend on past batch sizes.
    for n in [3, 100, 1, 70] {
        let batch = random_batch(&cfg, n, &mut rng);
        let (mut ga, mut gb) = (vec![0.0; batch.emb.len()], vec![0.0; batch.emb.len()]);
        let la = a
            .train_step(n, &batch.dense, &batch.emb, &batch.labels, &mut ga)
            .unwrap();
        let lb = b
            .train_step(n, &batch.dense, &batch.emb, &batch.labels, &mut gb)
            .unwrap();
        assert_eq!((la, &ga), (lb, &gb));
    }
    assert_eq!(a.params(), b.params());
    // A prediction on one sample equals the same sample's prediction inside a batch.
    let batch = random_batch(&cfg, 4, &mut rng);
    let all = a.predict(4, &batch.dense, &batch.emb).unwrap().to_vec();
    let w = cfg.emb_width();
    let one = a
        .predict(1, &batch.dense[3..6], &batch.emb[w..2 * w])
        .unwrap()[0];
    assert!((one - all[1]).abs() < 1e-6);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    thread_count_independent(Precision::F32);
}

#[test]
fn bf16_results_do_not_depend_on_the_thread_count() {
    if bf16_available() {
        thread_count_independent(Precision::Bf16);
    }
}

#[test]
fn bf16_gradients_are_close_to_f32() {
    if !bf16_available() {
        eprintln!("skipped: no bf16 kernel (AMX-BF16 or AVX512-BF16) on this machine");
        return;
    }
    let cfg = DlrmConfig {
        bottom: vec![64, 16],
        top: vec![128, 32, 1],
        ..DlrmConfig::default()
    };
    let mut rng = Rng::new(9);
    let b = random_batch(&cfg, 700, &mut rng);
    let run = |precision| {
        let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.0 }, 4).unwrap();
        model.set_precision(precision).unwrap();
        let mut emb_grad = vec![0.0; b.emb.len()];
        let loss = model
            .forward_backward(b.n, &b.dense, &b.emb, &b.labels, &mut emb_grad)
            .unwrap();
        let grads: Vec<Vec<f32>> = model.grads().iter().map(|g| g.to_vec()).collect();
        (loss, emb_grad, grads)
    };
    let (l32, e32, g32) = run(Precision::F32);
    let (l16, e16, g16) = run(Precision::Bf16);
    assert!((l32 - l16).abs() < 1e-3 * l32.abs(), "loss {l32} vs {l16}");
    // Relative L2 error of each tensor: bf16 keeps 8 bits of mantissa (0.4%), sums stay f32.
    let rel = |a: &[f32], b: &[f32]| {
        let num: f64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| ((x - y) as f64).powi(2))
            .sum();
        let den: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum();
        (num / den.max(1e-30)).sqrt()
    };
    // The error grows going back through the layers (here 0.1% at the logit layer, 2% two layers down,
    // 6-8% at the bottom MLP: these random-label gradients are sums with heavy cancellation); the exact
    // check of the bf16 products is `linear::tests::bf16_products_are_exact_on_bf16_inputs`. This catches a
    // wrong layout or a missing tile, which give errors near 100%.
    let mut differs = e32 != e16;
    assert!(rel(&e32, &e16) < 0.15, "emb_grad: {}", rel(&e32, &e16));
    for (t, (a, b)) in g32.iter().zip(&g16).enumerate() {
        assert!(rel(a, b) < 0.15, "grad tensor {t}: {}", rel(a, b));
        differs |= a != b;
    }
    assert!(
        differs,
        "bf16 gave exactly the f32 gradients: the bf16 kernel did not run"
    );
}

fn thread_count_independent(precision: Precision) {
    // Big enough for every parallel path (gemm threading, row splits, the bias reduction).
    let cfg = DlrmConfig {
        bottom: vec![64, 16],
        top: vec![128, 1],
        ..DlrmConfig::default()
    };
    thread_count_independent_on(cfg, precision);
}

/// Three Adam steps of a model of `cfg` on 1 and on 3 threads give bit-identical results.
fn thread_count_independent_on(cfg: DlrmConfig, precision: Precision) {
    let mut rng = Rng::new(5);
    let b = random_batch(&cfg, 600, &mut rng);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let opt = DenseOptimizer::adam(0.01);
            let mut model = Dlrm::new(cfg.clone(), opt, 3).unwrap();
            model.set_precision(precision).unwrap();
            let mut grad = vec![0.0; b.emb.len()];
            let losses: Vec<f32> = (0..3)
                .map(|_| {
                    model
                        .train_step(b.n, &b.dense, &b.emb, &b.labels, &mut grad)
                        .unwrap()
                })
                .collect();
            let params: Vec<Vec<f32>> = model.params().iter().map(|p| p.to_vec()).collect();
            (losses, grad, params)
        })
    };
    assert!(run(1) == run(3), "1 and 3 threads differ");
}

#[test]
fn default_model_size() {
    let model = Dlrm::new(DlrmConfig::default(), DenseOptimizer::Sgd { lr: 0.1 }, 0).unwrap();
    let bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 16 + 16;
    let top = 367 * 512 + 512 + 512 * 256 + 256 + 256 + 1;
    assert_eq!(model.num_params(), bottom + top);
    assert_eq!(model.params().len(), 14);
    assert_eq!(
        model.params().iter().map(|p| p.len()).sum::<usize>(),
        model.num_params()
    );
}

#[test]
fn chunked_batch_equals_weighted_sum_of_sub_batches() {
    chunked_equals_sub_batches(small_cfg());
}

/// 1100 rows run as several chunks; the mean-loss gradient must be the size-weighted mean of the
/// gradients of sub-batches that each fit in one chunk.
fn chunked_equals_sub_batches(cfg: DlrmConfig) {
    let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.0 }, 7).unwrap();
    let mut rng = Rng::new(8);
    let b = random_batch(&cfg, 1100, &mut rng);
    let mut emb_grad = vec![0.0; b.emb.len()];
    let loss = model
        .forward_backward(b.n, &b.dense, &b.emb, &b.labels, &mut emb_grad)
        .unwrap();
    let whole: Vec<Vec<f32>> = model.grads().iter().map(|g| g.to_vec()).collect();
    let (w, nd) = (cfg.emb_width(), cfg.num_dense);
    let mut want = vec![vec![0.0f64; 0]; whole.len()];
    let mut want_loss = 0.0f64;
    let mut want_emb = Vec::new();
    for (lo, hi) in [(0, 300), (300, 700), (700, 1100)] {
        let n = hi - lo;
        let mut g = vec![0.0; n * w];
        let l = model
            .forward_backward(
                n,
                &b.dense[lo * nd..hi * nd],
                &b.emb[lo * w..hi * w],
                &b.labels[lo..hi],
                &mut g,
            )
            .unwrap();
        let weight = n as f64 / b.n as f64;
        want_loss += l as f64 * weight;
        want_emb.extend(g.iter().map(|&x| x as f64 * weight));
        for (acc, part) in want.iter_mut().zip(model.grads()) {
            acc.resize(part.len(), 0.0);
            for (a, &p) in acc.iter_mut().zip(part) {
                *a += p as f64 * weight;
            }
        }
    }
    let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs());
    assert!(close(loss, want_loss), "loss {loss} vs {want_loss}");
    for (i, (&a, &b)) in emb_grad.iter().zip(&want_emb).enumerate() {
        assert!(close(a, b), "emb_grad[{i}] {a} vs {b}");
    }
    for (t, (got, want)) in whole.iter().zip(&want).enumerate() {
        for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
            assert!(close(a, b), "grad tensor {t}[{i}] {a} vs {b}");
        }
    }
}

#[test]
fn train_step_equals_forward_backward_then_apply() {
    // train_step sums the chunks' gradients inside the optimizer pass; it must equal the two-step path.
    let cfg = small_cfg();
    let opt = DenseOptimizer::adam(0.01);
    let mut a = Dlrm::new(cfg.clone(), opt, 2).unwrap();
    let mut b = Dlrm::new(cfg.clone(), opt, 2).unwrap();
    let mut rng = Rng::new(3);
    for n in [1100, 7] {
        let batch = random_batch(&cfg, n, &mut rng);
        let (mut ga, mut gb) = (vec![0.0; batch.emb.len()], vec![0.0; batch.emb.len()]);
        let la = a
            .train_step(n, &batch.dense, &batch.emb, &batch.labels, &mut ga)
            .unwrap();
        let lb = b
            .forward_backward(n, &batch.dense, &batch.emb, &batch.labels, &mut gb)
            .unwrap();
        b.apply_gradients();
        assert_eq!((la, &ga), (lb, &gb));
        assert_eq!(a.grads(), b.grads());
        assert_eq!(a.params(), b.params());
    }
}

#[test]
fn predict_equals_the_training_forward_pass() {
    for cfg in [small_cfg(), DlrmConfig::default(), dcn::small_dcn_cfg()] {
        let mut rng = Rng::new(11);
        let b = random_batch(&cfg, 300, &mut rng);
        let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.1 }, 5).unwrap();
        let mut emb_grad = vec![0.0; b.emb.len()];
        model
            .forward_backward(b.n, &b.dense, &b.emb, &b.labels, &mut emb_grad)
            .unwrap();
        let trained: Vec<f32> = model.last_probs()[..b.n].to_vec();
        let predicted = model.predict(b.n, &b.dense, &b.emb).unwrap().to_vec();
        for (i, (t, p)) in trained.iter().zip(&predicted).enumerate() {
            assert!(
                (t - p).abs() < 1e-6,
                "sample {i}: training {t} vs predict {p}"
            );
        }
    }
}

#[test]
fn a_short_batch_counts_for_its_samples() {
    let cfg = small_cfg();
    let mut rng = Rng::new(21);
    let b = random_batch(&cfg, 10, &mut rng);
    let grads = |divisor: usize| {
        let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.1 }, 5).unwrap();
        model.set_batch_divisor(divisor);
        let mut emb_grad = vec![0.0; b.emb.len()];
        let loss = model
            .forward_backward(b.n, &b.dense, &b.emb, &b.labels, &mut emb_grad)
            .unwrap();
        let dense: Vec<f32> = model.grads().concat();
        (loss, dense, emb_grad)
    };
    let (loss_mean, dense_mean, emb_mean) = grads(0);
    // A batch of 10 where 40 are nominal: a quarter of the mean gradient; the loss stays the mean.
    let (loss_short, dense_short, emb_short) = grads(40);
    assert_eq!(loss_mean, loss_short);
    for (m, s) in dense_mean
        .iter()
        .chain(&emb_mean)
        .zip(dense_short.iter().chain(&emb_short))
    {
        assert!((m * 0.25 - s).abs() <= 1e-6 * (1.0 + m.abs()), "{m} vs {s}");
    }
    // A full (or larger) batch is unaffected.
    let (_, dense_full, _) = grads(10);
    assert_eq!(dense_full, dense_mean);
}

#[test]
fn apply_flat_gradients_equals_set_grads_then_apply() {
    let cfg = small_cfg();
    let adam = DenseOptimizer::adam(0.01);
    let mut a = Dlrm::new(cfg.clone(), adam, 9).unwrap();
    let mut b = Dlrm::new(cfg.clone(), adam, 9).unwrap();
    let mut rng = Rng::new(4);
    for _ in 0..3 {
        let flat = rand_vec(&mut rng, a.num_params(), 1.0);
        let scaled: Vec<f32> = flat.iter().map(|v| v * 0.25).collect();
        a.set_grads(&scaled).unwrap();
        a.apply_gradients();
        b.apply_flat_gradients(&flat, 0.25).unwrap();
    }
    assert_eq!(a.params(), b.params());
    assert_eq!(a.grads(), b.grads());
    assert!(b.apply_flat_gradients(&[1.0], 1.0).is_err());
}
