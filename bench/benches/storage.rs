//! Storage engine throughput: gather (pull) and apply (push) rows per second of [`embedding::Table`], on 1 and
//! 2 threads, at dim 16, 64 and 128, for every optimizer (and row-wise Adagrad with bf16 rows,
//! `rowwise_adagrad_bf16`: decode and stochastic rounding included), in memory and over a memory budget (2x and
//! 5x, the rest in RocksDB), each against a `HashMap<u64, Vec<f32>>` in the same run.
//!
//! Setup: a table of [`ROWS`] rows, then batches of [`BATCH`] distinct-ish random ids drawn from those rows
//! (a trainer's deduplicated batch), so nearly every lookup misses the CPU cache, as on a real server.
//! Throughput is rows per second over all threads: divide by the thread count for rows/s per core.
//! Over budget, the table holds `ROWS / factor` rows in memory and each batch is followed by
//! `Engine::enforce_budget` when the table is over budget by more than a batch (the server does it on a
//! timer), so eviction and read-back cost are included; the hit ratio is printed to stderr.
//!
//! Run: `cargo bench -p bench --bench storage` (about 5 minutes); filter with e.g. `-- gather/dim16`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use embedding::{Engine, OptimizerConfig, RocksStore, RowPrecision, Table, TableConfig};

/// Rows per table.
const ROWS: usize = 500_000;
/// Rows of the hot (cache-resident) table: about one demo batch's unique ids (2048 samples x 26 tables).
const HOT_ROWS: usize = 27_000;
/// Ids per gather or apply call.
const BATCH: usize = 4096;
/// Batches of ids prepared per thread (cycled).
const BATCHES: usize = 64;
const DIMS: [usize; 3] = [16, 64, 128];
const THREADS: [usize; 2] = [1, 2];

/// The benchmarked tables: every optimizer with f32 rows, and row-wise Adagrad with bf16 rows.
fn variants() -> Vec<(&'static str, OptimizerConfig, RowPrecision)> {
    let mut out: Vec<_> = optimizers()
        .into_iter()
        .map(|(name, opt)| (name, opt, RowPrecision::F32))
        .collect();
    out.push((
        "rowwise_adagrad_bf16",
        optimizers()[1].1,
        RowPrecision::Bf16,
    ));
    out
}

fn optimizers() -> [(&'static str, OptimizerConfig); 5] {
    [
        ("sgd", OptimizerConfig::Sgd { lr: 0.01 }),
        (
            "rowwise_adagrad",
            OptimizerConfig::RowAdagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
        ),
        (
            "adagrad",
            OptimizerConfig::Adagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
        ),
        (
            "adam",
            OptimizerConfig::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        ),
        (
            "ftrl",
            OptimizerConfig::Ftrl {
                alpha: 0.05,
                beta: 1.0,
                l1: 0.0,
                l2: 0.0,
            },
        ),
    ]
}

/// Row `k` of the table has id `row_id(k)` (spread like the trainer's salted ids).
fn row_id(k: u64) -> u64 {
    protocol::routing::mix64(k * 7 + 1)
}

/// `n` batches of `BATCH` random ids of rows `0..rows` for thread `t`.
fn batches_of(t: usize, n: usize, rows: usize) -> Vec<Vec<u64>> {
    let mut x = 0x5eed ^ (t as u64) << 40;
    (0..n)
        .map(|_| {
            (0..BATCH)
                .map(|_| {
                    x = protocol::routing::mix64(x + 1);
                    row_id(x % rows as u64)
                })
                .collect()
        })
        .collect()
}

/// `BATCHES` batches of `BATCH` random row ids for thread `t`.
fn batches(t: usize) -> Vec<Vec<u64>> {
    batches_of(t, BATCHES, ROWS)
}

fn grads(dim: usize) -> Vec<f32> {
    (0..BATCH * dim)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.001)
        .collect()
}

fn table_config(dim: usize, opt: OptimizerConfig) -> TableConfig {
    TableConfig {
        optimizer: opt,
        ..TableConfig::new(1, "bench", dim)
    }
}

fn table_config_in(dim: usize, opt: OptimizerConfig, precision: RowPrecision) -> TableConfig {
    TableConfig {
        precision,
        ..table_config(dim, opt)
    }
}

/// Creates rows `0..rows` of `table` by applying `grads`.
fn fill(table: &Table, grads: &[f32], rows: usize) {
    let ids: Vec<u64> = (0..rows as u64).map(row_id).collect();
    for chunk in ids.chunks(BATCH) {
        table
            .apply(chunk, &grads[..chunk.len() * table.dim()])
            .unwrap();
    }
}

/// Batches used so far (over all threads and calls), where the next call of [`timed`] starts.
static CURSOR: AtomicUsize = AtomicUsize::new(0);

/// Runs `iters` calls of `f(batch, out)` on each of `threads` threads, thread `t` cycling through
/// `batches[t]`, with a reusable output buffer per thread; returns the wall time.
fn timed(
    threads: usize,
    iters: u64,
    batches: &[Vec<Vec<u64>>],
    f: impl Fn(&[u64], &mut Vec<f32>) + Sync,
) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for mine in batches.iter().take(threads) {
            let f = &f;
            s.spawn(move || {
                let mut out = Vec::new();
                // Continue where the previous call stopped: criterion calls this many times, and restarting at
                // batch 0 would make over-budget runs re-read rows the last call just read back.
                let first = CURSOR.fetch_add(iters as usize, Ordering::Relaxed);
                for k in first..first + iters as usize {
                    f(&mine[k % mine.len()], &mut out);
                }
            });
        }
    });
    start.elapsed()
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g
}

/// In memory: every optimizer at every dim, plus the HashMap baseline per dim.
fn in_memory(c: &mut Criterion) {
    let per_thread = [batches(0), batches(1)];
    for dim in DIMS {
        let grads = grads(dim);
        for (name, opt, precision) in variants() {
            let table = Table::new(table_config_in(dim, opt, precision)).unwrap();
            fill(&table, &grads, ROWS);
            for threads in THREADS {
                let mut g = group(c, &format!("gather/dim{dim}"));
                g.throughput(Throughput::Elements((BATCH * threads) as u64));
                // Gather does not depend on the optimizer beyond the row length: measure it for two.
                if matches!(name, "sgd" | "rowwise_adagrad" | "rowwise_adagrad_bf16") {
                    g.bench_function(BenchmarkId::new(name, format!("{threads}t")), |b| {
                        b.iter_custom(|iters| {
                            timed(threads, iters, &per_thread, |ids, out| {
                                out.resize(ids.len() * dim, 0.0);
                                table.gather(black_box(ids), out).unwrap();
                                black_box(out);
                            })
                        })
                    });
                }
                g.finish();
                let mut g = group(c, &format!("apply/dim{dim}"));
                g.throughput(Throughput::Elements((BATCH * threads) as u64));
                g.bench_function(BenchmarkId::new(name, format!("{threads}t")), |b| {
                    b.iter_custom(|iters| {
                        timed(threads, iters, &per_thread, |ids, _| {
                            table.apply(black_box(ids), &grads).unwrap();
                        })
                    })
                });
                g.finish();
            }
        }
        baseline(c, dim, &grads, &per_thread);
    }
}

/// The naive parameter store: a `HashMap` of `Vec`s (row-wise Adagrad rows: dim weights + 1 accumulator).
/// Gather runs on 1 and 2 threads (shared read-only); apply needs `&mut`, so on 1 thread only.
fn baseline(c: &mut Criterion, dim: usize, grads: &[f32], per_thread: &[Vec<Vec<u64>>]) {
    let mut naive: HashMap<u64, Vec<f32>> = (0..ROWS as u64)
        .map(|k| (row_id(k), vec![0.01; dim + 1]))
        .collect();
    for threads in THREADS {
        let mut g = group(c, &format!("gather/dim{dim}"));
        g.throughput(Throughput::Elements((BATCH * threads) as u64));
        let naive = &naive;
        g.bench_function(
            BenchmarkId::new("hashmap_vec_baseline", format!("{threads}t")),
            |b| {
                b.iter_custom(|iters| {
                    timed(threads, iters, per_thread, |ids, out| {
                        out.resize(ids.len() * dim, 0.0);
                        for (k, id) in black_box(ids).iter().enumerate() {
                            out[k * dim..(k + 1) * dim].copy_from_slice(&naive[id][..dim]);
                        }
                        black_box(out);
                    })
                })
            },
        );
        g.finish();
    }
    let mut g = group(c, &format!("apply/dim{dim}"));
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function(BenchmarkId::new("hashmap_vec_baseline", "1t"), |b| {
        let mut k = 0;
        b.iter(|| {
            let ids = &per_thread[0][k % BATCHES];
            k += 1;
            for (i, id) in black_box(ids).iter().enumerate() {
                let row = naive.get_mut(id).unwrap();
                let g = &grads[i * dim..(i + 1) * dim];
                let (w, acc) = row.split_at_mut(dim);
                acc[0] += g.iter().map(|x| x * x).sum::<f32>() / dim as f32;
                let step = 0.01 / (acc[0].sqrt() + 1e-8);
                w.iter_mut().zip(g).for_each(|(w, g)| *w -= step * g);
            }
        })
    });
    g.finish();
}

/// Over a memory budget of `ROWS / factor` rows (factor 2 and 5), dim 16, row-wise Adagrad, RocksDB in a
/// tempdir. Ids are uniform over all rows (512 batches per thread, each row about 4 times), so the hit ratio
/// is near `1 / factor`: the worst case; skewed (real) traffic hits more.
fn over_budget(c: &mut Criterion) {
    let per_thread = [batches_of(0, 512, ROWS), batches_of(1, 512, ROWS)];
    let dim = 16;
    let grads = grads(dim);
    for factor in [2usize, 5] {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RocksStore::open(dir.path()).unwrap());
        let budget = (ROWS / factor) as u64;
        let engine = Engine::open_with_budget(store, Some(budget)).unwrap();
        let cfg = table_config(
            dim,
            OptimizerConfig::RowAdagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
        );
        engine.register_table(cfg).unwrap();
        let table = engine.table(1).unwrap();
        let ids: Vec<u64> = (0..ROWS as u64).map(row_id).collect();
        for chunk in ids.chunks(BATCH) {
            table.apply(chunk, &grads[..chunk.len() * dim]).unwrap();
            if engine.rows_over_budget() > BATCH {
                engine.enforce_budget().unwrap();
            }
        }
        engine.enforce_budget().unwrap();
        let enforce = || {
            if engine.rows_over_budget() > BATCH {
                engine.enforce_budget().unwrap();
            }
        };
        for threads in THREADS {
            for op in ["gather", "apply"] {
                let mut g = group(c, &format!("{op}_over_budget/dim{dim}"));
                g.throughput(Throughput::Elements((BATCH * threads) as u64));
                let (read_back0, rows0) = (table.rows_read_back(), std::cell::Cell::new(0u64));
                g.bench_function(
                    BenchmarkId::new(format!("{factor}x"), format!("{threads}t")),
                    |b| {
                        b.iter_custom(|iters| {
                            rows0.set(rows0.get() + iters * (BATCH * threads) as u64);
                            timed(threads, iters, &per_thread, |ids, out| {
                                if op == "gather" {
                                    out.resize(ids.len() * dim, 0.0);
                                    table.gather(black_box(ids), out).unwrap();
                                } else {
                                    table.apply(black_box(ids), &grads).unwrap();
                                }
                                enforce();
                            })
                        })
                    },
                );
                g.finish();
                let read = table.rows_read_back() - read_back0;
                if rows0.get() == 0 {
                    continue; // filtered out
                }
                eprintln!(
                    "{op} {factor}x over budget, {threads} thread(s): hit ratio {:.3} ({read} rows read back of {} looked up)",
                    1.0 - read as f64 / rows0.get().max(1) as f64,
                    rows0.get()
                );
            }
        }
    }
}

/// A hot table: [`HOT_ROWS`] rows (one demo batch's unique ids over 26 tables), dim 16, row-wise Adagrad,
/// small enough to stay in the CPU caches (2.3 MB), against the `HashMap` baseline.
fn hot(c: &mut Criterion) {
    let dim = 16;
    let grads = grads(dim);
    let per_thread = [
        batches_of(0, BATCHES, HOT_ROWS),
        batches_of(1, BATCHES, HOT_ROWS),
    ];
    let table = Table::new(table_config(dim, optimizers()[1].1)).unwrap();
    fill(&table, &grads, HOT_ROWS);
    let naive: HashMap<u64, Vec<f32>> = (0..HOT_ROWS as u64)
        .map(|k| (row_id(k), vec![0.01; dim + 1]))
        .collect();
    for threads in THREADS {
        let mut g = group(c, "hot/dim16");
        g.throughput(Throughput::Elements((BATCH * threads) as u64));
        g.bench_function(BenchmarkId::new("gather", format!("{threads}t")), |b| {
            b.iter_custom(|iters| {
                timed(threads, iters, &per_thread, |ids, out| {
                    out.resize(ids.len() * dim, 0.0);
                    table.gather(black_box(ids), out).unwrap();
                })
            })
        });
        g.bench_function(
            BenchmarkId::new("gather_hashmap_vec_baseline", format!("{threads}t")),
            |b| {
                b.iter_custom(|iters| {
                    timed(threads, iters, &per_thread, |ids, out| {
                        out.resize(ids.len() * dim, 0.0);
                        for (k, id) in black_box(ids).iter().enumerate() {
                            out[k * dim..(k + 1) * dim].copy_from_slice(&naive[id][..dim]);
                        }
                    })
                })
            },
        );
        g.bench_function(
            BenchmarkId::new("apply_rowwise_adagrad", format!("{threads}t")),
            |b| {
                b.iter_custom(|iters| {
                    timed(threads, iters, &per_thread, |ids, _| {
                        table.apply(black_box(ids), &grads).unwrap();
                    })
                })
            },
        );
        g.finish();
    }
}

/// A pull in bf16 of a bf16 table, as a server answers it: the weights gathered as f32 then encoded to bf16
/// (`decode_encode`, what every pull did before) against the stored halves copied as they are (`direct`,
/// `Table::gather_bf16`), both ending in the reply's bytes. Run: `cargo bench -p bench --bench storage --
/// pull_bf16`.
fn pull_bf16(c: &mut Criterion) {
    use protocol::compression::codec::{encode_rows, Encoding};
    let per_thread = [batches(0), batches(1)];
    for dim in [16, 128] {
        let grads = grads(dim);
        let table =
            Table::new(table_config_in(dim, optimizers()[1].1, RowPrecision::Bf16)).unwrap();
        fill(&table, &grads, ROWS);
        for threads in THREADS {
            let mut g = group(c, &format!("pull_bf16/dim{dim}"));
            g.throughput(Throughput::Elements((BATCH * threads) as u64));
            g.bench_function(
                BenchmarkId::new("decode_encode", format!("{threads}t")),
                |b| {
                    b.iter_custom(|iters| {
                        timed(threads, iters, &per_thread, |ids, out| {
                            out.resize(ids.len() * dim, 0.0);
                            table.gather(black_box(ids), out).unwrap();
                            let mut bytes = Vec::with_capacity(out.len() * 2);
                            encode_rows(out, dim, Encoding::Bf16, &mut bytes);
                            black_box(bytes);
                        })
                    })
                },
            );
            g.bench_function(BenchmarkId::new("direct", format!("{threads}t")), |b| {
                b.iter_custom(|iters| {
                    timed(threads, iters, &per_thread, |ids, _| {
                        let mut halves = vec![0u16; ids.len() * dim];
                        table.gather_bf16(black_box(ids), &mut halves).unwrap();
                        let mut bytes: Vec<u8> = Vec::with_capacity(halves.len() * 2);
                        bytes.extend_from_slice(bytemuck::cast_slice(&halves));
                        black_box(bytes);
                    })
                })
            });
            g.finish();
        }
    }
}

criterion_group!(benches, hot, in_memory, over_budget, pull_bf16);
criterion_main!(benches);
