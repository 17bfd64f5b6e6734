//! Throughput measurements, run by hand (release build, nothing asserted):
//!
//! ```text
//! cargo test --release -p trainer --lib model::perf -- --ignored --nocapture --test-threads 1
//! ```
//!
//! `DENSE_PERF_THREADS=1` (or `2`, `1,2`) picks the pool sizes (default 1 and 2); `dcn_train_step_throughput`
//! times the DLRM-v2 model (DCNv2 interaction); `gemm_shapes` times every
//! matrix product of one step alone, in the layout the model uses and transposed, for `DENSE_PERF_ROWS`
//! rows (default 2048; 512 is one chunk of the data-parallel step).

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

/// The thread counts to measure: `DENSE_PERF_THREADS` (e.g. `1`) or 1 and 2.
fn thread_counts() -> Vec<usize> {
    match std::env::var("DENSE_PERF_THREADS") {
        Ok(v) => v
            .split(',')
            .map(|t| t.trim().parse().expect("DENSE_PERF_THREADS"))
            .collect(),
        Err(_) => vec![1, 2],
    }
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
    step_throughput("", &DlrmConfig::default(), (5, 10));
}

/// Prints the train step and prediction times of `cfg` at batch [`BATCH`], best of `rounds.0` rounds of
/// `rounds.1` steps, per thread count and precision (`DENSE_PERF_PRECISION=f32` or `bf16` picks one; default
/// both, bf16 where a bf16 kernel runs), each line prefixed with `label`.
fn step_throughput(label: &str, cfg: &DlrmConfig, rounds: (usize, usize)) {
    let mut rng = Rng::new(1);
    let dense = rand_vec(&mut rng, BATCH * cfg.num_dense, 1.0);
    let emb = rand_vec(&mut rng, BATCH * cfg.emb_width(), 0.1);
    let labels: Vec<f32> = (0..BATCH)
        .map(|_| (rng.next_u64() & 3 == 0) as u8 as f32)
        .collect();
    let mut emb_grad = vec![0.0; emb.len()];
    let flops = cfg.flops_per_sample() * BATCH as f64;
    let want = std::env::var("DENSE_PERF_PRECISION").unwrap_or_default();
    let mut precisions = Vec::new();
    if want != "bf16" {
        precisions.push(Precision::F32);
    }
    if want != "f32" && bf16_available() {
        precisions.push(Precision::Bf16);
    }
    for threads in thread_counts() {
        for &precision in &precisions {
            on_threads(threads, || {
                let opt = DenseOptimizer::Adagrad {
                    lr: 0.01,
                    eps: 1e-8,
                    initial_accumulator: 0.0,
                };
                let mut model = Dlrm::new(cfg.clone(), opt, 0).unwrap();
                model.set_precision(precision).unwrap();
                let t = best_time(rounds.0, rounds.1, || {
                    model
                        .train_step(BATCH, &dense, &emb, &labels, &mut emb_grad)
                        .unwrap();
                });
                let tp = best_time(rounds.0, rounds.1, || {
                    model.predict(BATCH, &dense, &emb).unwrap();
                });
                println!(
                    "{label}{precision:?} threads {threads}: train_step {:.2} ms = {:.0} samples/s, {:.0} GFLOP/s \
                     (main-thread CPU {:.2} ms); predict {:.2} ms = {:.0} samples/s",
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
}

/// The DLRM-v2 dense model (MLPerf): 13 dense inputs, 26 features of dim 128, bottom 512-256-128, 3 cross
/// layers of rank 512 (`D = 3456`), top 1024-1024-512-256-1; about 96 MFLOP per sample.
fn dlrm_v2() -> DlrmConfig {
    DlrmConfig {
        num_dense: 13,
        num_sparse: 26,
        emb_dim: 128,
        feature_dims: Vec::new(),
        bottom: vec![512, 256, 128],
        top: vec![1024, 1024, 512, 256, 1],
        interaction: InteractionConfig::Dcn {
            layers: 3,
            rank: 512,
        },
    }
}

/// Train steps (and predictions) of the DLRM-v2 model at batch 2048, f32 and bf16 (where a bf16 kernel
/// runs; `DENSE_PERF_PRECISION` picks one): best of 3 rounds of 2 steps.
#[test]
#[ignore = "timing; run by hand in release"]
fn dcn_train_step_throughput() {
    step_throughput("dlrm-v2 dcn ", &dlrm_v2(), (3, 2));
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
    for threads in thread_counts() {
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

/// Every matrix product of one default-size train step, timed alone: which shapes run below the big
/// square product's rate, and whether the transposed layout would be faster.
#[test]
#[ignore = "timing; run by hand in release"]
fn gemm_shapes() {
    let cfg = DlrmConfig::default();
    let b = std::env::var("DENSE_PERF_ROWS").map_or(BATCH, |v| v.parse().expect("DENSE_PERF_ROWS"));
    let mut rng = Rng::new(3);
    let mut layers = cfg.bottom_layers();
    layers.extend(cfg.top_layers());
    for threads in thread_counts() {
        on_threads(threads, || {
            let mut total = 0.0;
            for &(i, o) in &layers {
                let x = rand_vec(&mut rng, b * i, 1.0);
                let w = rand_vec(&mut rng, o * i, 1.0);
                let dy = rand_vec(&mut rng, b * o, 1.0);
                let mut y = vec![0.0; b * o];
                let mut dw = vec![0.0; o * i];
                let mut dx = vec![0.0; b * i];
                let f = best_time(5, 10, || {
                    matmul(b, o, i, &mut y, false, &x, Op::N, &w, Op::T)
                });
                let g = best_time(5, 10, || {
                    matmul(o, i, b, &mut dw, false, &dy, Op::T, &x, Op::N)
                });
                let d = best_time(5, 10, || {
                    matmul(b, i, o, &mut dx, false, &dy, Op::N, &w, Op::N)
                });
                let mut dwt = vec![0.0; o * i];
                let gt = best_time(5, 10, || {
                    matmul(i, o, b, &mut dwt, false, &x, Op::T, &dy, Op::N)
                });
                let ft = best_time(5, 10, || {
                    matmul(o, b, i, &mut y, false, &w, Op::N, &x, Op::T)
                });
                let dt = best_time(5, 10, || {
                    matmul(i, b, o, &mut dx, false, &w, Op::T, &dy, Op::T)
                });
                let gf = |t: (f64, f64)| 2.0 * (b * i * o) as f64 / t.0 / 1e9;
                println!(
                    "threads {threads}: {i:>4}x{o:<4} transposed: fwd {:.3} ms ({:.0}) wgrad {:.3} ms ({:.0}) dx {:.3} ms ({:.0})",
                    ft.0 * 1e3,
                    gf(ft),
                    gt.0 * 1e3,
                    gf(gt),
                    dt.0 * 1e3,
                    gf(dt)
                );
                total += f.0 + g.0 + d.0;
                println!(
                    "threads {threads}: {i:>4}x{o:<4} fwd {:.3} ms ({:.0} GF/s) wgrad {:.3} ms ({:.0}) dx {:.3} ms ({:.0})",
                    f.0 * 1e3,
                    gf(f),
                    g.0 * 1e3,
                    gf(g),
                    d.0 * 1e3,
                    gf(d)
                );
            }
            println!("threads {threads}: total {:.2} ms", total * 1e3);
        });
    }
}

/// Train steps with several chunk sizes, interleaved in one process so that they see the same load:
/// median over `DENSE_PERF_ROUNDS` (default 15) rounds of 3 steps each, for the target rows per chunk in
/// `DENSE_PERF_CHUNKS` (default `256,512,1024,2048`; 2048 is one chunk, split per product as before);
/// `DENSE_PERF_PRECISION=bf16` for the bf16 products.
#[test]
#[ignore = "timing; run by hand in release"]
fn chunk_sizes() {
    let cfg = DlrmConfig::default();
    let mut rng = Rng::new(1);
    let dense = rand_vec(&mut rng, BATCH * cfg.num_dense, 1.0);
    let emb = rand_vec(&mut rng, BATCH * cfg.num_sparse * cfg.emb_dim, 0.1);
    let labels: Vec<f32> = (0..BATCH)
        .map(|_| (rng.next_u64() & 3 == 0) as u8 as f32)
        .collect();
    let mut emb_grad = vec![0.0; emb.len()];
    let rounds = std::env::var("DENSE_PERF_ROUNDS").map_or(15, |v| v.parse().expect("rounds"));
    let sizes: Vec<usize> = std::env::var("DENSE_PERF_CHUNKS")
        .unwrap_or_else(|_| "256,512,1024,2048".into())
        .split(',')
        .map(|v| v.trim().parse().expect("DENSE_PERF_CHUNKS"))
        .collect();
    for threads in thread_counts() {
        on_threads(threads, || {
            let opt = DenseOptimizer::Adagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            };
            let mut models: Vec<Dlrm> = sizes
                .iter()
                .map(|&rows| {
                    let mut m = Dlrm::new(cfg.clone(), opt, 0).unwrap();
                    m.set_chunk_rows(rows);
                    if std::env::var("DENSE_PERF_PRECISION").as_deref() == Ok("bf16") {
                        m.set_precision(Precision::Bf16).unwrap();
                    }
                    m.train_step(BATCH, &dense, &emb, &labels, &mut emb_grad)
                        .unwrap();
                    m
                })
                .collect();
            let mut times = vec![Vec::new(); sizes.len()];
            for _ in 0..rounds {
                for (m, t) in models.iter_mut().zip(&mut times) {
                    let start = Instant::now();
                    for _ in 0..3 {
                        m.train_step(BATCH, &dense, &emb, &labels, &mut emb_grad)
                            .unwrap();
                    }
                    t.push(start.elapsed().as_secs_f64() / 3.0);
                }
            }
            let line: Vec<String> = sizes
                .iter()
                .zip(&mut times)
                .map(|(rows, t)| {
                    t.sort_by(f64::total_cmp);
                    let med = t[t.len() / 2];
                    format!(
                        "{rows}: {:.2} ms ({:.0} samples/s)",
                        med * 1e3,
                        BATCH as f64 / med
                    )
                })
                .collect();
            println!("threads {threads}: chunk rows {}", line.join(", "));
        });
    }
}

/// The step's matrix products alone against the whole train step, as the data-parallel step runs them
/// (chunks of [`chunk::CHUNK_ROWS`] rows split over the pool, each layer's forward, weight-gradient and
/// input-gradient products): the machine's measured GEMM rate for this model's shapes, and the dense
/// step's share of it (issue 44's goal: >= 60%). In bf16 a product counts with the packing of its f32
/// operands into bf16 (what any bf16 GEMM called on f32 activations pays) and once more without it; the
/// weights are packed once per step in both (the step does the same). Layers the step runs in f32 (the
/// logit layer) run in f32 here too. `DENSE_PERF_PRECISION` picks one precision.
#[test]
#[ignore = "timing; run by hand in release"]
fn gemm_bound() {
    use super::bf16;
    let cfg = DlrmConfig::default();
    let rows = chunk::CHUNK_ROWS;
    let chunks = BATCH / rows;
    let mut layers: Vec<(usize, usize, bool)> = cfg
        .bottom_layers()
        .into_iter()
        .enumerate()
        .map(|(i, (a, b))| (a, b, i > 0))
        .collect();
    layers.extend(cfg.top_layers().into_iter().map(|(a, b)| (a, b, true)));
    let product_flops: f64 = layers
        .iter()
        .map(|&(i, o, dx)| (if dx { 3.0 } else { 2.0 }) * 2.0 * (i * o) as f64)
        .sum::<f64>()
        * BATCH as f64;
    let mut rng = Rng::new(4);
    struct Layer {
        i: usize,
        o: usize,
        dx: bool,
        w: Vec<f32>,
        fwd: bf16::Buf,
        bwd: bf16::Buf,
    }
    let mut ls: Vec<Layer> = layers
        .iter()
        .map(|&(i, o, dx)| Layer {
            i,
            o,
            dx,
            w: rand_vec(&mut rng, o * i, 0.1),
            fwd: bf16::Buf::default(),
            bwd: bf16::Buf::default(),
        })
        .collect();
    struct Chunk {
        x: Vec<Vec<f32>>,
        y: Vec<Vec<f32>>,
        dx: Vec<Vec<f32>>,
        wg: Vec<Vec<f32>>,
        scratch: bf16::Scratch,
    }
    let mut cs: Vec<Chunk> = (0..chunks)
        .map(|_| Chunk {
            x: layers
                .iter()
                .map(|&(i, _, _)| rand_vec(&mut rng, rows * i, 1.0))
                .collect(),
            y: layers
                .iter()
                .map(|&(_, o, _)| rand_vec(&mut rng, rows * o, 1.0))
                .collect(),
            dx: layers
                .iter()
                .map(|&(i, _, _)| vec![0.0; rows * i])
                .collect(),
            wg: layers.iter().map(|&(i, o, _)| vec![0.0; i * o]).collect(),
            scratch: bf16::Scratch::default(),
        })
        .collect();
    let want = std::env::var("DENSE_PERF_PRECISION").unwrap_or_default();
    let mut modes: Vec<(&str, Option<bool>)> = Vec::new();
    if want != "bf16" {
        modes.push(("F32", None));
    }
    if want != "f32" && bf16_available() {
        modes.push(("Bf16 products with packing", Some(true)));
        modes.push(("Bf16 products without packing", Some(false)));
    }
    for threads in thread_counts() {
        on_threads(threads, || {
            let mut step = |precision| {
                let opt = DenseOptimizer::Adagrad {
                    lr: 0.01,
                    eps: 1e-8,
                    initial_accumulator: 0.0,
                };
                let mut model = Dlrm::new(cfg.clone(), opt, 0).unwrap();
                model.set_precision(precision).unwrap();
                let dense = rand_vec(&mut rng, BATCH * cfg.num_dense, 1.0);
                let emb = rand_vec(&mut rng, BATCH * cfg.emb_width(), 0.1);
                let labels: Vec<f32> = (0..BATCH).map(|k| (k % 4 == 0) as u8 as f32).collect();
                let mut emb_grad = vec![0.0; emb.len()];
                best_time(5, 10, || {
                    model
                        .train_step(BATCH, &dense, &emb, &labels, &mut emb_grad)
                        .unwrap();
                })
                .0
            };
            for &(label, bf) in &modes {
                let t = best_time(5, 10, || {
                    use rayon::prelude::*;
                    if bf.is_some() {
                        for l in ls.iter_mut() {
                            if l.o >= 16 {
                                let len = bf16::pad(l.i) * bf16::pad(l.o);
                                bf16::pack_b_transposed(&l.w, l.o, l.i, l.fwd.get(len));
                                bf16::pack_b(&l.w, l.o, l.i, l.bwd.get(len));
                            }
                        }
                    }
                    let ls = &ls;
                    cs.par_iter_mut().for_each(|c| {
                        for (k, l) in ls.iter().enumerate() {
                            let (i, o) = (l.i, l.o);
                            let (bp, ip, op) = (bf16::pad(rows), bf16::pad(i), bf16::pad(o));
                            let Some(pack) = bf.filter(|_| o >= 16) else {
                                matmul_on_thread(
                                    rows,
                                    o,
                                    i,
                                    &mut c.y[k],
                                    &c.x[k],
                                    Op::N,
                                    &l.w,
                                    Op::T,
                                );
                                matmul_on_thread(
                                    o,
                                    i,
                                    rows,
                                    &mut c.wg[k],
                                    &c.y[k],
                                    Op::T,
                                    &c.x[k],
                                    Op::N,
                                );
                                if l.dx {
                                    matmul_on_thread(
                                        rows,
                                        i,
                                        o,
                                        &mut c.dx[k],
                                        &c.y[k],
                                        Op::N,
                                        &l.w,
                                        Op::N,
                                    );
                                }
                                continue;
                            };
                            let s = &mut c.scratch;
                            // Forward: a = x (rows), b = Wᵀ.
                            if pack {
                                bf16::pack_rows(&c.x[k], rows, i, s.a.get(bp * ip));
                            }
                            bf16::gemm(rows, o, i, s.a.get(bp * ip), &l.fwd, &mut c.y[k], o);
                            // Weight gradient: a = dyᵀ, b = x.
                            if pack {
                                bf16::pack_cols(&c.y[k], rows, o, s.a.get(op * bp));
                                bf16::pack_b(&c.x[k], rows, i, s.b.get(bp * ip));
                            }
                            bf16::gemm(
                                o,
                                i,
                                rows,
                                s.a.get(op * bp),
                                s.b.get(bp * ip),
                                &mut c.wg[k],
                                i,
                            );
                            if l.dx {
                                if pack {
                                    bf16::pack_rows(&c.y[k], rows, o, s.a.get(bp * op));
                                }
                                bf16::gemm(rows, i, o, s.a.get(bp * op), &l.bwd, &mut c.dx[k], i);
                            }
                        }
                    });
                })
                .0;
                let precision = if bf.is_some() {
                    Precision::Bf16
                } else {
                    Precision::F32
                };
                let s = step(precision);
                println!(
                    "threads {threads}: {label}: {:.2} ms = {:.0} GFLOP/s; train step {:.2} ms = {:.0} GFLOP/s of \
                     products: {:.0}% of the products' rate",
                    t * 1e3,
                    product_flops / t / 1e9,
                    s * 1e3,
                    product_flops / s / 1e9,
                    100.0 * t / s
                );
            }
        });
    }
}

/// `c = op(a) · op(b)` on the calling thread (f32).
#[allow(clippy::too_many_arguments)]
fn matmul_on_thread(
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    a: &[f32],
    ta: Op,
    b: &[f32],
    tb: Op,
) {
    super::matmul::matmul_on(false, m, n, k, c, false, a, ta, b, tb)
}
