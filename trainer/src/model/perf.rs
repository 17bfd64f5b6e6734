//! Throughput measurements, run by hand (release build, nothing asserted):
//!
//! ```text
//! cargo test --release -p trainer --lib model::perf -- --ignored --nocapture --test-threads 1
//! ```

use std::time::Instant;

use super::interaction::Interaction;
use super::matmul::{matmul, Op};
use super::rng::Rng;
use super::testutil::rand_vec;
use super::*;

const BATCH: usize = 2048;

/// CPU time of the calling thread, in seconds.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Best-of-`reps` seconds per call of `f`: wall time, and CPU time of the calling thread (equal to the
/// wall time on an idle machine when running on one thread; the minimum and the CPU time filter out
/// other processes on a shared machine).
fn best_time(reps: usize, iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut best = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let (t, c) = (Instant::now(), thread_cpu_seconds());
        for _ in 0..iters {
            f();
        }
        best.0 = best.0.min(t.elapsed().as_secs_f64() / iters as f64);
        best.1 = best.1.min((thread_cpu_seconds() - c) / iters as f64);
    }
    best
}

fn on_threads(threads: usize, f: impl FnOnce() + Send) {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f);
}

#[test]
#[ignore = "timing; run by hand in release"]
fn train_step_throughput() {
    let cfg = DlrmConfig::default();
    let mut rng = Rng::new(1);
    let dense = rand_vec(&mut rng, BATCH * cfg.num_dense, 1.0);
    let emb = rand_vec(&mut rng, BATCH * cfg.num_sparse * cfg.emb_dim, 0.1);
    let labels: Vec<f32> = (0..BATCH)
        .map(|_| (rng.next_u64() & 3 == 0) as u8 as f32)
        .collect();
    let mut emb_grad = vec![0.0; emb.len()];
    let flops = cfg.flops_per_sample() * BATCH as f64;
    for threads in [1, 2] {
        on_threads(threads, || {
            let opt = DenseOptimizer::Adagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            };
            let mut model = Dlrm::new(cfg.clone(), opt, 0).unwrap();
            let t = best_time(5, 10, || {
                model
                    .train_step(BATCH, &dense, &emb, &labels, &mut emb_grad)
                    .unwrap();
            });
            let tp = best_time(5, 10, || {
                model.predict(BATCH, &dense, &emb).unwrap();
            });
            println!(
                "threads {threads}: train_step {:.2} ms = {:.0} samples/s, {:.0} GFLOP/s (main-thread CPU {:.2} ms); \
                 predict {:.2} ms = {:.0} samples/s",
                t.0 * 1e3,
                BATCH as f64 / t.0,
                flops / t.0 / 1e9,
                t.1 * 1e3,
                tp.0 * 1e3,
                BATCH as f64 / tp.0
            );
        });
    }
}

#[test]
#[ignore = "timing; run by hand in release"]
fn kernel_throughput() {
    let mut rng = Rng::new(2);
    let (m, n, k) = (2048, 256, 512);
    let a = rand_vec(&mut rng, m * k, 1.0);
    let b = rand_vec(&mut rng, k * n, 1.0);
    let mut c = vec![0.0; m * n];
    let it = Interaction::new(26, 16);
    let z = rand_vec(&mut rng, BATCH * 16, 1.0);
    let emb = rand_vec(&mut rng, BATCH * 26 * 16, 1.0);
    let mut out = vec![0.0; BATCH * it.out_dim()];
    let (mut dz, mut demb) = (vec![0.0; z.len()], vec![0.0; emb.len()]);
    for threads in [1, 2] {
        on_threads(threads, || {
            let t = best_time(5, 20, || {
                matmul(m, n, k, &mut c, false, &a, Op::N, &b, Op::N)
            });
            let gflops = 2.0 * (m * n * k) as f64 / t.0 / 1e9;
            let tf = best_time(5, 20, || it.forward(BATCH, &z, &emb, &mut out));
            let tb = best_time(5, 20, || {
                it.backward(BATCH, &z, &emb, &out, &mut dz, &mut demb)
            });
            println!(
                "threads {threads}: gemm {m}x{k}x{n} {gflops:.0} GFLOP/s (cpu {:.0}); interaction forward {:.3} ms \
                 (cpu {:.3}), backward {:.3} ms (cpu {:.3})",
                2.0 * (m * n * k) as f64 / t.1 / 1e9,
                tf.0 * 1e3,
                tf.1 * 1e3,
                tb.0 * 1e3,
                tb.1 * 1e3
            );
        });
    }
}
