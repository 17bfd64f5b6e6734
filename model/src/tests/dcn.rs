//! Whole-model tests of [`Dlrm`] with the DCNv2 interaction and per-feature embedding dimensions.

use super::*;

/// A small dcn model with features of dimensions 4, 2 and 5: `D = 4 + 11`.
pub(super) fn small_dcn_cfg() -> DlrmConfig {
    DlrmConfig {
        num_dense: 3,
        num_sparse: 3,
        emb_dim: 4,
        feature_dims: vec![4, 2, 5],
        bottom: vec![6, 4],
        top: vec![7, 5, 1],
        interaction: InteractionConfig::Dcn { layers: 2, rank: 3 },
    }
}

/// A dcn config whose layers (all but the logit) are wide enough for the bf16 products.
fn bf16_dcn_cfg() -> DlrmConfig {
    DlrmConfig {
        num_dense: 3,
        num_sparse: 4,
        emb_dim: 16,
        feature_dims: vec![16, 16, 8, 24],
        bottom: vec![48, 16],
        top: vec![40, 24, 1],
        interaction: InteractionConfig::Dcn {
            layers: 2,
            rank: 16,
        },
    }
}

#[test]
fn dcn_gradients_match_finite_differences() {
    // The cross layers' products of three factors curve more than the dot model: a step of 1e-2 leaves
    // truncation errors of a few percent on some weights; 1e-3 meets f32 round-off.
    check_model_gradients(small_dcn_cfg(), 3e-3);
}

#[test]
fn dcn_training_reduces_loss_on_a_learnable_problem() {
    // Features 0 and 1 (whose dot product sets the label) of dimension 4, the others not.
    let cfg = DlrmConfig {
        num_sparse: 4,
        feature_dims: vec![4, 4, 2, 6],
        interaction: InteractionConfig::Dcn { layers: 2, rank: 4 },
        ..small_dcn_cfg()
    };
    learns(cfg, Precision::F32);
}

#[test]
fn dcn_bf16_training_reduces_loss_on_a_learnable_problem() {
    if !bf16_available() {
        eprintln!("skipped: no bf16 kernel (AMX-BF16 or AVX512-BF16) on this machine");
        return;
    }
    learns(bf16_dcn_cfg(), Precision::Bf16);
}

#[test]
fn dcn_bf16_gradients_are_close_to_f32() {
    if !bf16_available() {
        eprintln!("skipped: no bf16 kernel (AMX-BF16 or AVX512-BF16) on this machine");
        return;
    }
    let cfg = bf16_dcn_cfg();
    let mut rng = Rng::new(9);
    let b = random_batch(&cfg, 700, &mut rng);
    let run = |precision| {
        let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.0 }, 4).unwrap();
        model.set_precision(precision).unwrap();
        let mut emb_grad = vec![0.0; b.emb.len()];
        let loss = model
            .forward_backward(b.n, &b.dense, &b.emb, &b.labels, &mut emb_grad)
            .unwrap();
        let probs = model.last_probs()[..b.n].to_vec();
        let grads: Vec<Vec<f32>> = model.grads().iter().map(|g| g.to_vec()).collect();
        (loss, probs, emb_grad, grads)
    };
    let (l32, p32, e32, g32) = run(Precision::F32);
    let (l16, p16, e16, g16) = run(Precision::Bf16);
    assert!((l32 - l16).abs() < 1e-2 * l32.abs(), "loss {l32} vs {l16}");
    for (a, b) in p32.iter().zip(&p16) {
        assert!((a - b).abs() < 0.02, "probability {a} vs {b}");
    }
    // Relative L2 error per tensor; a wrong layout or a missing product gives errors near 100% (see
    // `tests::bf16_gradients_are_close_to_f32` for why the bound is loose).
    let rel = |a: &[f32], b: &[f32]| {
        let num: f64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| ((x - y) as f64).powi(2))
            .sum();
        let den: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum();
        (num / den.max(1e-30)).sqrt()
    };
    assert!(rel(&e32, &e16) < 0.15, "emb_grad: {}", rel(&e32, &e16));
    let mut differs = false;
    for (t, (a, b)) in g32.iter().zip(&g16).enumerate() {
        assert!(rel(a, b) < 0.15, "grad tensor {t}: {}", rel(a, b));
        differs |= a != b;
    }
    // The cross tensors (after the bottom's 4) must have gone through the bf16 kernel.
    assert!(
        g32[4..10] != g16[4..10],
        "cross gradients identical: no bf16"
    );
    assert!(differs);
}

#[test]
fn dcn_results_do_not_depend_on_the_thread_count() {
    let cfg = DlrmConfig {
        bottom: vec![64, 16],
        top: vec![128, 1],
        feature_dims: (0..26).map(|f| 8 + 4 * (f % 3)).collect(),
        interaction: InteractionConfig::Dcn {
            layers: 2,
            rank: 32,
        },
        ..DlrmConfig::default()
    };
    thread_count_independent_on(cfg.clone(), Precision::F32);
    if bf16_available() {
        thread_count_independent_on(cfg, Precision::Bf16);
    }
}

#[test]
fn dcn_chunked_batch_equals_weighted_sum_of_sub_batches() {
    chunked_equals_sub_batches(small_dcn_cfg());
}

#[test]
fn dcn_parameters_sit_between_bottom_and_top() {
    let cfg = small_dcn_cfg();
    let model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.1 }, 0).unwrap();
    let shapes: Vec<usize> = model.params().iter().map(|p| p.len()).collect();
    // Bottom 3-6-4, per cross layer V [3 x 15], U [15 x 3], b [15], top 15-7-5-1.
    let cross = [45, 45, 15];
    let want: Vec<usize> = [18, 6, 24, 4]
        .into_iter()
        .chain(cross)
        .chain(cross)
        .chain([105, 7, 35, 5, 5, 1])
        .collect();
    assert_eq!(shapes, want);
    assert_eq!(model.num_params(), want.iter().sum::<usize>());
    assert_eq!(model.grads().len(), want.len());
    let cross = model.cross().expect("dcn model has cross layers");
    assert_eq!((cross.dim(), cross.rank(), cross.num_layers()), (15, 3, 2));
    assert!(Dlrm::tiny(DenseOptimizer::Sgd { lr: 0.1 }, 0)
        .cross()
        .is_none());
    // The bottom MLP is drawn first: the same seed gives the same bottom as the dot model's.
    let dot_cfg = DlrmConfig {
        feature_dims: vec![],
        num_sparse: 2,
        interaction: InteractionConfig::Dot,
        ..cfg
    };
    let dot = Dlrm::new(dot_cfg, DenseOptimizer::Sgd { lr: 0.1 }, 0).unwrap();
    assert_eq!(dot.params()[..4], model.params()[..4]);
}

#[test]
fn dcn_set_params_and_flat_gradients_cover_the_cross_layers() {
    let cfg = small_dcn_cfg();
    let adam = DenseOptimizer::adam(0.01);
    let mut a = Dlrm::new(cfg.clone(), adam, 1).unwrap();
    let mut b = Dlrm::new(cfg.clone(), adam, 2).unwrap();
    let params: Vec<Vec<f32>> = a.params().iter().map(|p| p.to_vec()).collect();
    let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    b.set_params(&refs).unwrap();
    assert_eq!(a.params(), b.params());
    let mut rng = Rng::new(4);
    for _ in 0..2 {
        let flat = rand_vec(&mut rng, a.num_params(), 1.0);
        let scaled: Vec<f32> = flat.iter().map(|v| v * 0.5).collect();
        a.set_grads(&scaled).unwrap();
        a.apply_gradients();
        b.apply_flat_gradients(&flat, 0.5).unwrap();
    }
    assert_eq!(a.params(), b.params());
    assert_ne!(
        a.params()[4],
        &params[4][..],
        "the cross layers were not updated"
    );
}

#[test]
fn dcn_emb_length_is_the_emb_width() {
    let cfg = small_dcn_cfg();
    let mut model = Dlrm::new(cfg.clone(), DenseOptimizer::Sgd { lr: 0.1 }, 0).unwrap();
    let b = random_batch(&cfg, 2, &mut Rng::new(0));
    assert_eq!(b.emb.len(), 2 * 11);
    model.predict(2, &b.dense, &b.emb).unwrap();
    let err = model.predict(2, &b.dense, &b.emb[1..]).unwrap_err();
    assert_eq!(err.to_string(), "emb: length 21, expected 22");
}

#[test]
fn dot_with_explicit_uniform_dims_is_unchanged() {
    let cfg = small_cfg();
    let explicit = DlrmConfig {
        feature_dims: vec![cfg.emb_dim; cfg.num_sparse],
        ..cfg.clone()
    };
    let opt = DenseOptimizer::Sgd { lr: 0.1 };
    let mut a = Dlrm::new(cfg.clone(), opt, 3).unwrap();
    let mut b = Dlrm::new(explicit, opt, 3).unwrap();
    assert_eq!(a.params(), b.params());
    let batch = random_batch(&cfg, 9, &mut Rng::new(1));
    let (mut ga, mut gb) = (vec![0.0; batch.emb.len()], vec![0.0; batch.emb.len()]);
    let la = a
        .train_step(9, &batch.dense, &batch.emb, &batch.labels, &mut ga)
        .unwrap();
    let lb = b
        .train_step(9, &batch.dense, &batch.emb, &batch.labels, &mut gb)
        .unwrap();
    assert_eq!((la, ga), (lb, gb));
    assert_eq!(a.params(), b.params());
}
