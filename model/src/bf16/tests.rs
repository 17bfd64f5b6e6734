//! Tests of the bf16 products (every kernel this CPU runs) and packers against an f64 reference of the
//! bf16-rounded inputs.

use super::*;
use crate::rng::Rng;

/// `a · b` in f64 from bf16-rounded inputs: what the tiles compute, up to f32 summation order.
fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
    let r = |x: f32| f32_of(bf16(x)) as f64;
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| r(a[i * k + p]) * r(b[p * n + j])).sum();
        }
    }
    c
}

fn random(rng: &mut Rng, len: usize) -> Vec<f32> {
    let mut v = vec![0.0; len];
    rng.fill_normal(&mut v, 1.0);
    v
}

fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

fn check(m: usize, n: usize, k: usize) {
    let mut rng = Rng::new((m * 1000 + n * 10 + k) as u64);
    let a = random(&mut rng, m * k);
    let b = random(&mut rng, k * n);
    let want = reference(m, n, k, &a, &b);
    let (mp, np, kp) = (pad(m), pad(n), pad(k));
    let at = transpose(&a, m, k);
    let bt = transpose(&b, k, n);
    // Every way of packing each operand gives the same product.
    for a_kind in 0..2 {
        let mut pa_buf = Buf::default();
        let pa = pa_buf.get(mp * kp);
        pa.fill(0xffff);
        match a_kind {
            0 => pack_rows(&a, m, k, pa),
            _ => pack_cols(&at, k, m, pa),
        }
        let pa = &*pa;
        for b_kind in 0..2 {
            let mut pb_buf = Buf::default();
            let pb = pb_buf.get(kp * np);
            pb.fill(0xffff);
            match b_kind {
                0 => pack_b(&b, k, n, pb),
                _ => pack_b_transposed(&bt, n, k, pb),
            }
            let pb = &*pb;
            for kernel in kernels() {
                let ldc = n + 3;
                let mut c = vec![f32::NAN; m * ldc];
                gemm_on(kernel, m, n, k, pa, pb, &mut c, ldc);
                for i in 0..m {
                    for j in 0..n {
                        let (got, want) = (c[i * ldc + j] as f64, want[i * n + j]);
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()) * (k as f64).sqrt(),
                            "{kernel}: {m}x{n}x{k} a{a_kind} b{b_kind} c[{i}][{j}] = {got}, want {want}"
                        );
                    }
                    for j in n..ldc {
                        assert!(
                            c[i * ldc + j].is_nan(),
                            "{kernel}: wrote past n at [{i}][{j}]"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn products_match_a_bf16_reference() {
    if kernels().is_empty() {
        eprintln!("skipped: no AMX-BF16 or AVX512-BF16 on this machine");
        return;
    }
    for (m, n, k) in [
        (1, 1, 1),
        (32, 32, 32),
        (64, 96, 128),
        (37, 19, 70),
        (100, 16, 13),
        (512, 256, 64),
        (33, 367, 47),
        (16, 1, 256),
        // k >= 256: whole blocks are stored straight into the misaligned `c` (ldc = n + 3).
        (64, 96, 300),
        (70, 45, 256),
        // Row blocks of 8 that end inside a 16-row tile; k of several tiles.
        (9, 33, 96),
        (24, 64, 1024),
    ] {
        check(m, n, k);
    }
}

#[test]
fn rounding_is_to_nearest_even() {
    assert_eq!(bf16(1.0), 0x3f80);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1.0).
    assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
    assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
    assert!(f32_of(bf16(f32::NAN)).is_nan());
    assert_eq!(f32_of(bf16(f32::INFINITY)), f32::INFINITY);
    if available() {
        // The vector conversion rounds like the scalar reference.
        let x: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 / 512.0 - 0.0625).collect();
        let mut out = vec![0u16; 32 * 64];
        pack_rows(&x, 1, 64, &mut out);
        for (p, &v) in x.iter().enumerate() {
            assert_eq!(out[a_at(0, p, 64)], bf16(v), "x[{p}] = {v}");
            out[a_at(0, p, 64)] = 0;
        }
        assert!(out.iter().all(|&x| x == 0), "padding rows are zero");
    }
}

#[test]
fn the_kernel_follows_the_cpu_and_the_environment() {
    // Without AVX512-BF16 there is no kernel; with it, AVX512-BF16 is always one of them, AMX first where
    // the CPU has it. `kernel()` is the first the environment allows.
    let all = kernels();
    if !all.is_empty() {
        assert_eq!(all.last(), Some(&Kernel::Avx512Bf16));
    }
    let off = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0");
    let want = if off(DISABLE_BF16_ENV) {
        None
    } else {
        all.into_iter()
            .find(|&k| !(off(DISABLE_ENV) && k == Kernel::Amx))
    };
    assert_eq!(kernel(), want);
}

/// The AMX product computed panel by panel of `b` (what big products do to keep a panel in L2) gives the
/// bits of the one-panel order, for panels of one and several blocks, partial edges included.
#[test]
fn amx_panels_change_no_bit() {
    if !kernels().contains(&Kernel::Amx) {
        eprintln!("skipped: no AMX on this machine");
        return;
    }
    let mut rng = Rng::new(5);
    for (m, n, k) in [(45, 200, 100), (70, 300, 64), (33, 97, 520), (64, 64, 32)] {
        let (mp, np, kp) = (pad(m), pad(n), pad(k));
        let (a, b) = (random(&mut rng, m * k), random(&mut rng, k * n));
        let (mut pa, mut pb) = (Buf::default(), Buf::default());
        pack_rows(&a, m, k, pa.get(mp * kp));
        pack_b(&b, k, n, pb.get(kp * np));
        let ldc = n + 3;
        let run = |panel_bytes: usize| {
            let mut c = vec![f32::NAN; m * ldc];
            // SAFETY: AMX checked above (`kernels()` lists it only when usable); the operands are packed to
            // their padded sizes and `c` holds `m` rows of `ldc >= n`.
            unsafe { x86::gemm_in_panels(m, n, kp, &pa, &pb, &mut c, ldc, panel_bytes) };
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let whole = run(usize::MAX);
        for blocks in [1, 2, 3] {
            assert!(
                run(2 * kp * BLOCK * blocks) == whole,
                "{m}x{n}x{k}: panels of {blocks} blocks changed the product"
            );
        }
    }
}
