//! Tests of the cross layers: exact gradients against finite differences, the forward against the
//! formula, and the bf16 products against f32.

use super::super::testutil::{check_grad, dot64, rand_vec};
use super::*;

/// A small net: `z` of width 3, embeddings of width 5 (`D = 8`), rank 3, two layers.
fn small_net(seed: u64) -> CrossNet {
    CrossNet::init(3, 5, 3, 2, &mut Rng::new(seed))
}

/// `x_L` for `rows` rows, through a fresh set of buffers.
fn forward(net: &CrossNet, rows: usize, z: &[f32], emb: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; rows * net.dim()];
    let (mut bufs, mut scratch) = (CrossBuffers::default(), bf16::Scratch::default());
    net.forward_chunk(false, rows, z, emb, &mut out, &mut bufs, &mut scratch);
    out
}

#[test]
fn forward_matches_the_formula() {
    let net = small_net(1);
    let (rows, d, r) = (3, net.dim(), net.rank());
    let mut rng = Rng::new(2);
    let z = rand_vec(&mut rng, rows * 3, 1.0);
    let emb = rand_vec(&mut rng, rows * 5, 1.0);
    let got = forward(&net, rows, &z, &emb);
    for i in 0..rows {
        let x0: Vec<f64> = z[i * 3..][..3]
            .iter()
            .chain(&emb[i * 5..][..5])
            .map(|&v| v as f64)
            .collect();
        let mut x = x0.clone();
        for l in 0..net.num_layers() {
            let (v_w, u) = (net.layers()[2 * l].weight(), &net.layers()[2 * l + 1]);
            let v: Vec<f64> = (0..r)
                .map(|k| (0..d).map(|j| v_w[k * d + j] as f64 * x[j]).sum())
                .collect();
            x = (0..d)
                .map(|j| {
                    let uj: f64 = (0..r).map(|k| u.weight()[j * r + k] as f64 * v[k]).sum();
                    x0[j] * (uj + u.bias()[j] as f64) + x[j]
                })
                .collect();
        }
        for (j, &want) in x.iter().enumerate() {
            let have = got[i * d + j] as f64;
            assert!(
                (have - want).abs() < 1e-5 * (1.0 + want.abs()),
                "row {i} [{j}]: {have} vs {want}"
            );
        }
    }
}

#[test]
fn parameters_in_order_and_counted() {
    let net = small_net(3);
    let shapes: Vec<usize> = net
        .layers()
        .iter()
        .flat_map(Linear::params)
        .map(<[f32]>::len)
        .collect();
    // Per layer: V [3 x 8], U [8 x 3], b [8].
    assert_eq!(shapes, [24, 24, 8, 24, 24, 8]);
    assert_eq!(net.num_params(), 112);
    assert!(!net.layers()[0].has_bias() && net.layers()[1].has_bias());
    assert_eq!(
        (net.dim(), net.dense_dim(), net.rank(), net.num_layers()),
        (8, 3, 3, 2)
    );
}

/// One forward and backward pass of `rows` samples with output gradient `dout`: `[out, dz, demb, grads]`,
/// the parameter gradients' buffer starting at `grads_init` everywhere.
fn forward_backward(
    net: &CrossNet,
    rows: usize,
    (z, emb): (&[f32], &[f32]),
    dout: &[f32],
    grads_init: f32,
) -> [Vec<f32>; 4] {
    let (mut bufs, mut scratch) = (CrossBuffers::default(), bf16::Scratch::default());
    let mut out = vec![0.0; dout.len()];
    net.forward_chunk(false, rows, z, emb, &mut out, &mut bufs, &mut scratch);
    let mut dout = dout.to_vec();
    let (mut dz, mut demb) = (vec![0.0; z.len()], vec![0.0; emb.len()]);
    let mut grads = vec![grads_init; net.grads_len()];
    net.backward_chunk(
        false,
        rows,
        &mut dout,
        &mut dz,
        &mut demb,
        &mut grads,
        &mut bufs,
        &mut scratch,
    );
    [out, dz, demb, grads]
}

#[test]
fn gradients_match_finite_differences() {
    let mut net = small_net(4);
    let rows = 4;
    let (d, wz, we) = (net.dim(), 3, 5);
    let mut rng = Rng::new(5);
    let mut z = rand_vec(&mut rng, rows * wz, 1.0);
    let mut emb = rand_vec(&mut rng, rows * we, 1.0);
    // Loss = Σ out * r: its gradient with respect to the output is r.
    let r = rand_vec(&mut rng, rows * d, 1.0);

    let [_, dz, demb, grads] = forward_backward(&net, rows, (&z, &emb), &r, f32::NAN);

    let loss = |net: &CrossNet, z: &[f32], emb: &[f32]| dot64(&forward(net, rows, z, emb), &r);
    let (eps, rel, abs) = (1e-2, 1e-2, 1e-3);
    check_grad("z", &dz, eps, rel, abs, |i, h| {
        z[i] += h;
        let l = loss(&net, &z, &emb);
        z[i] -= h;
        l
    });
    check_grad("emb", &demb, eps, rel, abs, |i, h| {
        emb[i] += h;
        let l = loss(&net, &z, &emb);
        emb[i] -= h;
        l
    });
    // Per layer V, U, b, each in its slot of the flat gradients.
    let mut at = 0;
    for k in 0..net.layers().len() {
        for t in 0..net.layers()[k].params().count() {
            let len = net.layers()[k].params().nth(t).unwrap().len();
            let analytic = grads[at..at + len].to_vec();
            at += slot(len);
            let name = format!("layer {k} tensor {t}");
            check_grad(&name, &analytic, eps, rel, abs, |i, h| {
                net.layers_mut()[k].params_and_grads_mut().nth(t).unwrap().0[i] += h;
                let l = loss(&net, &z, &emb);
                net.layers_mut()[k].params_and_grads_mut().nth(t).unwrap().0[i] -= h;
                l
            });
        }
    }
    assert_eq!(at, net.grads_len());
}

#[test]
fn bf16_products_are_close_to_f32() {
    if !bf16::available() {
        eprintln!("skipped: no bf16 kernel (AMX-BF16 or AVX512-BF16) on this machine");
        return;
    }
    // Wide enough (rank and D >= 16) for both products to run on the bf16 kernel.
    let (rows, dz_w, we) = (70, 16, 40);
    let f32_net = CrossNet::init(dz_w, we, 24, 2, &mut Rng::new(6));
    let mut bf16_net = f32_net.clone();
    bf16_net.layers_mut().iter_mut().for_each(|l| {
        assert!(l.suits_bf16());
        l.pack_bf16();
    });
    let mut rng = Rng::new(7);
    let z = rand_vec(&mut rng, rows * dz_w, 1.0);
    let emb = rand_vec(&mut rng, rows * we, 1.0);
    let r = rand_vec(&mut rng, rows * (dz_w + we), 1.0);
    let want = forward_backward(&f32_net, rows, (&z, &emb), &r, 0.0);
    let got = forward_backward(&bf16_net, rows, (&z, &emb), &r, 0.0);
    // Relative L2 error: bf16 keeps 8 bits of mantissa; a wrong layout gives errors near 100%.
    for (what, (a, b)) in ["out", "dz", "demb", "grads"]
        .iter()
        .zip(want.iter().zip(&got))
    {
        let num: f64 = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| ((x - y) as f64).powi(2))
            .sum();
        let den: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 0.03, "{what}: relative error {rel}");
        assert!(
            a != b,
            "{what}: bf16 gave exactly the f32 result: the bf16 kernel did not run"
        );
    }
}
