//! CPU cost of the embedding work on the training loop's critical path (issue 44: on a machine whose dense
//! step is fast, this is what bounds a job), measured by hand, nothing asserted:
//!
//! ```text
//! cargo test --release -p trainer --lib step::perf -- --ignored --nocapture --test-threads 1
//! ```
//!
//! One thread (a rayon pool of one, so the figures are the work, not the parallel split), CPU time of the
//! thread (steadier than wall time on a shared machine), median of 15 rounds. Batches of 2048 rows of 26
//! one-hot features at dim 16 with Criteo-like cardinalities, drawn Zipf-like so that consecutive batches
//! share their hot ids as real data does; f16 on the wire; two servers; row-wise Adagrad replayed.

use protocol::{Encoding, InitConfig, OptimizerConfig, ShardMap, TableConfig};

use crate::step::replay::{Push, Replayer};
use protocol::plan::{Plan, SparseLayout, TableCodecs};

const BATCH: usize = 2048;
const DIM: usize = 16;
/// The Criteo Kaggle columns' cardinalities.
const CARD: [u64; 26] = [
    1460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5683, 8_351_593, 3194, 27,
    14_992, 5_461_306, 10, 5652, 2173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
];

fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// One batch's ids per table, Zipf-like: the square of a uniform draw picks the rank, so small ranks (hot
/// ids) come far more often.
fn batch_ids(seed: u64) -> Vec<Vec<u64>> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    CARD.iter()
        .enumerate()
        .map(|(t, &n)| {
            (0..BATCH)
                .map(|_| {
                    let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                    let rank = ((u * u * u) * n as f64) as u64;
                    protocol::routing::mix64(rank * 31 + t as u64)
                })
                .collect()
        })
        .collect()
}

/// Serves a pull: each id's row in `enc`.
fn serve(
    plan: &mut Plan,
    codecs: &TableCodecs,
) -> Vec<(usize, Encoding, Vec<protocol::TableCount>, Vec<u8>)> {
    plan.pull_requests(codecs)
        .into_iter()
        .map(|r| {
            let n: usize = r.counts.iter().map(|c| c.count as usize).sum();
            let rows: Vec<f32> = (0..n * DIM)
                .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
                .collect();
            let mut bytes = Vec::new();
            protocol::compression::codec::encode_rows(&rows, DIM, r.encoding, &mut bytes);
            (r.server, r.encoding, r.counts, bytes)
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "timing; run by hand in release"]
fn embedding_work_per_batch() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        let map = ShardMap::new(2);
        let layout = SparseLayout::uniform(26, DIM);
        let codecs = TableCodecs::uniform(26, Encoding::F16, Encoding::F16);
        let configs: Vec<TableConfig> = (0..26)
            .map(|t| TableConfig {
                optimizer: OptimizerConfig::RowAdagrad {
                    lr: 0.05,
                    eps: 1e-8,
                    initial_accumulator: 0.0,
                },
                init: InitConfig::uniform(0.05),
                seed: t as u64,
                ..TableConfig::new(t, format!("C{}", t + 1), DIM)
            })
            .collect();
        let mut replayer = Replayer::new(&configs);
        let sparse: Vec<Vec<Vec<u64>>> = (0..3).map(|b| batch_ids(b + 1)).collect();
        let mut plans: Vec<Plan> = sparse
            .iter()
            .map(|s| {
                let mut p = Plan::default();
                p.build_with(&layout, BATCH, s, &[], &map);
                p
            })
            .collect();
        let grad: Vec<f32> = (0..BATCH * 26 * DIM).map(|i| ((i % 13) as f32 - 6.0) * 1e-4).collect();
        let mut pushed: Vec<Vec<Vec<f32>>> = Vec::new();
        for p in &plans[..2] {
            let mut g = Vec::new();
            p.reduce_gradients(&grad, 2048.0, &mut g);
            pushed.push(g);
        }
        let mut target = plans.pop().expect("three plans");
        let replies = serve(&mut target, &codecs);
        let (mut rows, mut emb, mut sums) = (Vec::new(), Vec::new(), Vec::new());
        let mut state: Vec<Vec<f32>> =
            (0..26).map(|t| vec![0.01; target.unique(t).len()]).collect();
        let mut times = [(); 5].map(|()| Vec::new());
        let mut replayed = 0;
        for _ in 0..15 {
            let t0 = thread_cpu();
            for (server, enc, counts, bytes) in &replies {
                target
                    .scatter_part(*server, *enc, counts, bytes, &mut rows)
                    .unwrap();
            }
            let t1 = thread_cpu();
            let pushes: Vec<Push<'_>> = plans
                .iter()
                .zip(&pushed)
                .map(|(plan, grads)| Push {
                    plan,
                    grads,
                    scale: 2048.0,
                })
                .collect();
            replayed = replayer.replay(&target, &mut rows, &mut state, &pushes);
            let t2 = thread_cpu();
            target.gather_embeddings(&rows, &mut emb);
            let t3 = thread_cpu();
            target.reduce_gradients(&grad, 2048.0, &mut sums);
            let t4 = thread_cpu();
            let mut p = Plan::default();
            p.build_with(&layout, BATCH, &sparse[2], &[], &map);
            let t5 = thread_cpu();
            for (k, d) in [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4].into_iter().enumerate() {
                times[k].push(d * 1e3);
            }
        }
        let [scatter, replay, gather, reduce, plan] = times.map(median);
        println!(
            "batch {BATCH} x 26 at dim {DIM}: {} unique ids, {replayed} rows replayed from 2 pushes; CPU ms per batch, \
             one thread: scatter (decode f16, place) {scatter:.3}, replay {replay:.3}, gather {gather:.3}, \
             reduce gradients {reduce:.3}, plan (plan thread) {plan:.3}",
            target.unique_ids()
        );
    });
}
