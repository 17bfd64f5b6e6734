//! Tests of [`Linear`]: gradients against finite differences, the bf16 products, the parallel bias sum.

use super::super::testutil::{check_grad, dot64, rand_vec};
use super::*;

fn layer_loss(layer: &Linear, batch: usize, x: &[f32], r: &[f32]) -> f64 {
    let mut y = vec![0.0; batch * layer.out_dim()];
    layer.forward(batch, x, &mut y);
    dot64(&y, r)
}

fn grad_check(relu: bool, batch: usize, n_in: usize, n_out: usize) {
    let mut rng = Rng::new(42 + relu as u64 + batch as u64);
    let mut layer = Linear::init(n_in, n_out, relu, &mut rng);
    let mut x = rand_vec(&mut rng, batch * n_in, 1.0);
    let r = rand_vec(&mut rng, batch * n_out, 1.0);
    let mut y = vec![0.0; batch * n_out];
    layer.forward(batch, &x, &mut y);
    let mut dy = r.clone();
    let mut dx = vec![0.0; batch * n_in];
    layer.backward(batch, &x, &y, &mut dy, Some(&mut dx));

    let eps = 1e-3;
    let (rel, abs) = (1e-2, 1e-3);
    let (gw, gb) = (layer.weight_grad.clone(), layer.bias_grad.clone());
    check_grad("weight", &gw, eps, rel, abs, |i, d| {
        layer.weight[i] += d;
        let l = layer_loss(&layer, batch, &x, &r);
        layer.weight[i] -= d;
        l
    });
    check_grad("bias", &gb, eps, rel, abs, |i, d| {
        layer.bias[i] += d;
        let l = layer_loss(&layer, batch, &x, &r);
        layer.bias[i] -= d;
        l
    });
    check_grad("x", &dx, eps, rel, abs, |i, d| {
        x[i] += d;
        let l = layer_loss(&layer, batch, &x, &r);
        x[i] -= d;
        l
    });
}

#[test]
fn gradients_without_relu() {
    grad_check(false, 5, 7, 3);
}

#[test]
fn gradients_with_relu() {
    grad_check(true, 6, 4, 9);
}

#[test]
fn bf16_products_are_exact_on_bf16_inputs() {
    if !bf16::available() {
        eprintln!("skipped: no bf16 kernel (AMX-BF16 or AVX512-BF16) on this machine");
        return;
    }
    // Inputs already representable in bf16: the bf16 path then differs from f32 only in the order of
    // the f32 sums. Odd sizes exercise every padding.
    let round = |v: &mut Vec<f32>| {
        for x in v.iter_mut() {
            *x = f32::from_bits((bf16::bf16(*x) as u32) << 16);
        }
    };
    for (batch, n_in, n_out, relu) in [(45, 37, 19, true), (70, 13, 64, false), (33, 100, 16, true)]
    {
        let mut rng = Rng::new(batch as u64);
        let mut f32_layer = Linear::init(n_in, n_out, relu, &mut rng);
        round(&mut f32_layer.weight);
        let mut bf16_layer = f32_layer.clone();
        bf16_layer.pack_bf16();
        let mut x = rand_vec(&mut rng, batch * n_in, 1.0);
        round(&mut x);
        let mut dy0 = rand_vec(&mut rng, batch * n_out, 1.0);
        round(&mut dy0);
        let mut scratch = bf16::Scratch::default();
        let run = |layer: &Linear, scratch: &mut bf16::Scratch| {
            let mut y = vec![0.0; batch * n_out];
            layer.forward_chunk(false, batch, &x, &mut y, scratch);
            // Without a ReLU mask in the way, dy is the (bf16-exact) dy0.
            let (mut dy, mut dx) = (dy0.clone(), vec![0.0; batch * n_in]);
            let (mut wg, mut bg) = (vec![0.0; n_in * n_out], vec![0.0; n_out]);
            let y_for_mask = vec![1.0; batch * n_out];
            layer.backward_into(
                false,
                batch,
                &x,
                &y_for_mask,
                &mut dy,
                Some(&mut dx),
                &mut wg,
                &mut bg,
                scratch,
            );
            (y, dx, wg, bg)
        };
        let want = run(&f32_layer, &mut scratch);
        let got = run(&bf16_layer, &mut scratch);
        let close = |what: &str, a: &[f32], b: &[f32]| {
            for (i, (&a, &b)) in a.iter().zip(b).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{batch}x{n_in}x{n_out} {what}[{i}]: {a} vs {b}"
                );
            }
        };
        close("y", &got.0, &want.0);
        close("dx", &got.1, &want.1);
        close("weight_grad", &got.2, &want.2);
        assert_eq!(got.3, want.3, "bias_grad");
    }
}

#[test]
fn forward_hand_computed() {
    // W = [[1, 2], [-3, 0.5]], b = [0.5, -1], x = [1, -1].
    let layer = Linear::with_params(2, 2, true, vec![1.0, 2.0, -3.0, 0.5], vec![0.5, -1.0]);
    let mut y = vec![0.0; 2];
    layer.forward(1, &[1.0, -1.0], &mut y);
    // pre-activation: [1 - 2 + 0.5, -3 - 0.5 - 1] = [-0.5, -4.5] -> ReLU -> [0, 0]
    assert_eq!(y, [0.0, 0.0]);
    let affine = Linear::with_params(2, 2, false, vec![1.0, 2.0, -3.0, 0.5], vec![0.5, -1.0]);
    affine.forward(1, &[1.0, -1.0], &mut y);
    assert_eq!(y, [-0.5, -4.5]);
}

#[test]
fn parallel_backward_matches_serial_bias_sum() {
    // Big enough to take the parallel path; compare the bias gradient with a plain f64 column sum.
    let (batch, n_in, n_out) = (1000, 8, 100);
    let mut rng = Rng::new(3);
    let mut layer = Linear::init(n_in, n_out, true, &mut rng);
    let x = rand_vec(&mut rng, batch * n_in, 1.0);
    let mut y = vec![0.0; batch * n_out];
    layer.forward(batch, &x, &mut y);
    let mut dy = rand_vec(&mut rng, batch * n_out, 1.0);
    let masked: Vec<f32> = dy
        .iter()
        .zip(&y)
        .map(|(&d, &v)| if v > 0.0 { d } else { 0.0 })
        .collect();
    layer.backward(batch, &x, &y, &mut dy, None);
    assert_eq!(dy, masked);
    for j in 0..n_out {
        let want: f64 = (0..batch).map(|b| masked[b * n_out + j] as f64).sum();
        assert!(
            (layer.bias_grad[j] as f64 - want).abs() < 1e-4,
            "bias_grad[{j}]"
        );
    }
}

#[test]
fn without_bias() {
    let (batch, n_in, n_out) = (4, 5, 3);
    let mut rng = Rng::new(8);
    let mut layer = Linear::init_without_bias(n_in, n_out, &mut rng);
    assert!(!layer.has_bias() && !layer.relu());
    assert_eq!(layer.params().count(), 1);
    assert_eq!(layer.grads().count(), 1);
    assert_eq!(layer.params_and_grads_mut().count(), 1);
    let mut x = rand_vec(&mut rng, batch * n_in, 1.0);
    let r = rand_vec(&mut rng, batch * n_out, 1.0);
    let mut y = vec![0.0; batch * n_out];
    layer.forward(batch, &x, &mut y);
    // y = x Wᵀ exactly.
    for b in 0..batch {
        for o in 0..n_out {
            let want: f32 = (0..n_in)
                .map(|i| x[b * n_in + i] * layer.weight[o * n_in + i])
                .sum();
            assert!((y[b * n_out + o] - want).abs() < 1e-5);
        }
    }
    let (mut dy, mut dx) = (r.clone(), vec![0.0; batch * n_in]);
    layer.backward(batch, &x, &y, &mut dy, Some(&mut dx));
    // The chunk path writes no bias gradient.
    let (mut wg, mut scratch) = (vec![0.0; n_in * n_out], bf16::Scratch::default());
    let mut dy = r.clone();
    layer.backward_into(
        false,
        batch,
        &x,
        &y,
        &mut dy,
        None,
        &mut wg,
        &mut [],
        &mut scratch,
    );
    assert_eq!(wg, layer.weight_grad);
    let gw = layer.weight_grad.clone();
    check_grad("weight", &gw, 1e-3, 1e-2, 1e-3, |i, d| {
        layer.weight[i] += d;
        let l = layer_loss(&layer, batch, &x, &r);
        layer.weight[i] -= d;
        l
    });
    check_grad("x", &dx, 1e-3, 1e-2, 1e-3, |i, d| {
        x[i] += d;
        let l = layer_loss(&layer, batch, &x, &r);
        x[i] -= d;
        l
    });
}
