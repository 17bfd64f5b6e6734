//! Throughput of the bf16 products (each kernel this CPU runs) and packers (run by hand, nothing asserted;
//! see the parent's doc).

use super::*;
use std::time::Instant;

fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..20 {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / 20.0);
    }
    best
}

/// The u16 buffer as f32 (for an aligned `c`).
fn bytemuck_f32(x: &mut [u16]) -> &mut [f32] {
    // SAFETY: `Buf` storage is 64-byte aligned; two u16 per f32; every bit pattern is an f32.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len() / 2) }
}

#[test]
#[ignore = "timing; run by hand in release"]
fn shapes() {
    if kernels().is_empty() {
        eprintln!("skipped: no AMX-BF16 or AVX512-BF16 on this machine");
        return;
    }
    for (m, n, k) in [
        (512, 512, 384),
        (512, 256, 512),
        (256, 512, 512),
        (512, 512, 32),
        (512, 64, 256),
        (512, 1024, 3456),
        (512, 512, 3456),
        (512, 3456, 512),
        (3456, 512, 512),
        (1024, 3456, 512),
    ] {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
        let (mut pa, mut pb) = (Buf::default(), Buf::default());
        pa.get(pad(m) * pad(k));
        pb.get(pad(k) * pad(n));
        // An aligned `c`, as the model's activation buffers are not necessarily.
        let mut c = Buf::default();
        let c: &mut [f32] = bytemuck_f32(c.get(2 * m * n + 32));
        let t_rows = time(|| pack_rows(&a, m, k, pa.get(pad(m) * pad(k))));
        let t_cols = time(|| pack_cols(&a, k, m, pa.get(pad(m) * pad(k))));
        let t_b = time(|| pack_b(&b, k, n, pb.get(pad(k) * pad(n))));
        let flops = 2.0 * (m * n * k) as f64;
        // The f32 path on the same shape, for the ratio.
        let (af, bf) = (a.clone(), b.clone());
        let mut cf = vec![0.0f32; m * n];
        let t_f32 = time(|| {
            use crate::matmul::{matmul_on, Op};
            matmul_on(false, m, n, k, &mut cf, false, &af, Op::N, &bf, Op::N)
        });
        println!(
            "{m}x{n}x{k}: f32 gemm {:.1} us = {:.0} GFLOP/s; pack_rows {:.1} us, pack_cols {:.1} us, \
             pack_b {:.1} us",
            t_f32 * 1e6,
            flops / t_f32 / 1e9,
            t_rows * 1e6,
            t_cols * 1e6,
            t_b * 1e6
        );
        for kernel in kernels() {
            let t_gemm = time(|| gemm_on(kernel, m, n, k, &pa, &pb, c, n));
            let t_unaligned = time(|| gemm_on(kernel, m, n, k, &pa, &pb, &mut c[1..], n));
            println!(
                "  {kernel}: gemm {:.1} us = {:.0} GFLOP/s ({:.0} GFLOP/s into an unaligned c), \
                 {:.2}x f32",
                t_gemm * 1e6,
                flops / t_gemm / 1e9,
                flops / t_unaligned / 1e9,
                t_f32 / t_gemm
            );
        }
    }
}
