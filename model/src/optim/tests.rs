//! Tests of the dense optimizers and the learning-rate schedule.

use super::*;

fn close(a: &[f32], b: &[f64]) {
    for (i, (&a, &b)) in a.iter().zip(b).enumerate() {
        assert!(
            (a as f64 - b).abs() < 1e-6 * (1.0 + b.abs()),
            "[{i}] {a} vs {b}"
        );
    }
}

#[test]
fn sgd_reference() {
    let mut st = OptimizerState::new(DenseOptimizer::Sgd { lr: 0.1 }, &[2]);
    let mut p = [1.0, -2.0];
    st.begin_step();
    st.update(0, &mut p, &[0.5, -1.0]);
    close(&p, &[0.95, -1.9]);
}

#[test]
fn adagrad_reference() {
    let kind = DenseOptimizer::Adagrad {
        lr: 0.1,
        eps: 1e-10,
        initial_accumulator: 0.1,
    };
    let mut st = OptimizerState::new(kind, &[1]);
    let mut p = [1.0];
    // step 1: s = 0.1 + 0.25 = 0.35; p = 1 - 0.1 * 0.5 / √0.35 = 0.915484...
    st.begin_step();
    st.update(0, &mut p, &[0.5]);
    close(&p, &[1.0 - 0.05 / 0.35f64.sqrt()]);
    // step 2: g = -1: s = 1.35; p += 0.1 / √1.35
    st.begin_step();
    st.update(0, &mut p, &[-1.0]);
    close(&p, &[1.0 - 0.05 / 0.35f64.sqrt() + 0.1 / 1.35f64.sqrt()]);
}

#[test]
fn adam_reference() {
    let kind = DenseOptimizer::adam(0.01);
    let mut st = OptimizerState::new(kind, &[2]);
    let mut p = [1.0, 0.0];
    // Step 1: m̂ = g, v̂ = g², so each parameter moves by lr · sign(g) (up to eps).
    st.begin_step();
    st.update(0, &mut p, &[0.5, -2.0]);
    close(&p, &[0.99, 0.01]);
    // Step 2 by hand for the first parameter, g = 0.1:
    // m = 0.9·0.05 + 0.1·0.1 = 0.055; v = 0.999·0.00025 + 0.001·0.01 = 0.00025975
    // m̂ = 0.055 / 0.19 = 0.289473...; v̂ = 0.00025975 / 0.001999 = 0.129939...
    st.begin_step();
    st.update(0, &mut p, &[0.1, 0.0]);
    let m_hat = 0.055 / 0.19;
    let v_hat: f64 = 0.00025975 / (1.0 - 0.999f64 * 0.999);
    close(&p[..1], &[0.99 - 0.01 * m_hat / (v_hat.sqrt() + 1e-8)]);
}

#[test]
fn parallel_update_matches_serial() {
    let n = PARALLEL_MIN_ELEMS * 3 + 17;
    let grad: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 10.0).collect();
    for kind in [
        DenseOptimizer::Sgd { lr: 0.1 },
        DenseOptimizer::Adagrad {
            lr: 0.1,
            eps: 1e-10,
            initial_accumulator: 0.0,
        },
        DenseOptimizer::adam(0.01),
    ] {
        let mut big = OptimizerState::new(kind, &[n]);
        let mut p = vec![1.0; n];
        big.begin_step();
        big.update(0, &mut p, &grad);
        for i in [0, 1, 96, n / 2, n - 1] {
            let mut small = OptimizerState::new(kind, &[1]);
            let mut q = [1.0];
            small.begin_step();
            small.update(0, &mut q, &grad[i..i + 1]);
            assert_eq!(p[i], q[0], "{kind:?} [{i}]");
        }
    }
}

#[test]
fn fused_update_matches_fill_then_update() {
    // Serial and parallel sizes, with a partial last block.
    for n in [5, FUSED_BLOCK + 3, PARALLEL_MIN_ELEMS + FUSED_BLOCK / 2] {
        let src: Vec<f32> = (0..n).map(|i| ((i % 89) as f32 - 44.0) / 10.0).collect();
        for kind in [
            DenseOptimizer::Sgd { lr: 0.1 },
            DenseOptimizer::Adagrad {
                lr: 0.1,
                eps: 1e-10,
                initial_accumulator: 0.1,
            },
            DenseOptimizer::adam(0.01),
        ] {
            let (mut a, mut b) = (
                OptimizerState::new(kind, &[n]),
                OptimizerState::new(kind, &[n]),
            );
            let (mut pa, mut pb) = (vec![1.0; n], vec![1.0; n]);
            let mut grad = vec![0.0; n];
            for step in 1..=2 {
                let g: Vec<f32> = src.iter().map(|&x| x * step as f32).collect();
                a.begin_step();
                a.update(0, &mut pa, &g);
                b.begin_step();
                b.update_with(0, &mut pb, &mut grad, |at, block| {
                    block.copy_from_slice(&g[at..at + block.len()])
                });
                assert_eq!(grad, g, "{kind:?} n {n}");
            }
            assert_eq!(pa, pb, "{kind:?} n {n}");
            assert_eq!(a.tensors(), b.tensors(), "{kind:?} n {n}");
        }
    }
}

#[test]
fn validate_rejects_bad_hyper_parameters() {
    let field = |o: DenseOptimizer| match o.validate() {
        Err(ModelError::Config { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(DenseOptimizer::Sgd { lr: f32::NAN }), "lr");
    assert_eq!(
        field(DenseOptimizer::Adam {
            lr: 0.1,
            beta1: 1.0,
            beta2: 0.9,
            eps: 1e-8
        }),
        "beta1"
    );
    assert_eq!(
        field(DenseOptimizer::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.9,
            eps: 0.0
        }),
        "eps"
    );
    assert_eq!(
        field(DenseOptimizer::Adagrad {
            lr: 0.1,
            eps: 0.0,
            initial_accumulator: -1.0
        }),
        "initial_accumulator"
    );
    assert_eq!(
        field(DenseOptimizer::Adagrad {
            lr: 0.1,
            eps: 0.0,
            initial_accumulator: 0.0
        }),
        "eps"
    );
    DenseOptimizer::Adagrad {
        lr: 0.1,
        eps: 0.0,
        initial_accumulator: 0.1,
    }
    .validate()
    .unwrap();
}

#[test]
fn lr_decay_is_constant_then_falls_quadratically_to_zero() {
    let d = LrDecay {
        start: 10,
        steps: 4,
    };
    let f: Vec<f32> = (1..=16).map(|t| d.factor(t)).collect();
    assert!(f[..10].iter().all(|&x| x == 1.0), "{f:?}");
    assert_eq!(&f[10..], &[0.5625, 0.25, 0.0625, 0.0, 0.0, 0.0]);
    assert_eq!(LrDecay::default().factor(1_000_000), 1.0);
}

#[test]
fn the_decay_scales_every_optimizer_step() {
    for kind in [DenseOptimizer::Sgd { lr: 0.1 }, DenseOptimizer::adam(0.1)] {
        let run = |decay: LrDecay| {
            let mut opt = OptimizerState::new(kind, &[3]);
            opt.set_decay(decay);
            let mut p = vec![1.0f32; 3];
            let mut moves = Vec::new();
            for _ in 0..4 {
                let before = p[0];
                opt.begin_step();
                opt.update(0, &mut p, &[0.5, -0.5, 0.25]);
                moves.push(p[0] - before);
            }
            moves
        };
        let flat = run(LrDecay::default());
        let decayed = run(LrDecay { start: 2, steps: 2 });
        assert_eq!(&flat[..2], &decayed[..2], "{kind:?}");
        assert!(
            (decayed[2] - 0.25 * flat[2]).abs() < 1e-6,
            "{kind:?}: {decayed:?} vs {flat:?}"
        );
        assert_eq!(decayed[3], 0.0, "{kind:?}");
    }
}
