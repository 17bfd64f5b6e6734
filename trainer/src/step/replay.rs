//! Replaying the trainer's own unacknowledged updates on pulled embedding rows, without I/O.
//!
//! With a staleness bound `k > 0`, the rows of a pass's batch `n` are pulled while the pushes of batches
//! `n - k .. n - 1` are not applied on the servers yet: those rows lack the trainer's own last `k` updates,
//! which is what costs asynchronous training its accuracy (hot rows appear in every batch). The trainer
//! knows those updates exactly: it computed them. So before batch `n` computes, it applies each of them to
//! the pulled rows with the table's optimizer, as the server will ([`embedding::optimizer::update`], with the
//! row's optimizer state pulled alongside the row: [`protocol::Request::PullWithState`]).
//!
//! Exactly which pushes a pull holds is fixed by the training loop ([`crate::train`]):
//! - the pull of batch `n` is sent once the pushes of batches `0 .. n - k` are all acknowledged (a prefix,
//!   not a count), and servers apply a push before acknowledging it, so the rows hold those;
//! - the push of batch `j` is sent only after the pulls of every batch `n > j` that must lack it have been
//!   answered, so the rows hold none of `n - k .. n - 1`.
//!
//! With f32 rows on the wire and one trainer, a run at `k = 4` therefore computes with the very rows of a
//! `k = 0` run (trainer/tests/resume.rs checks bit equality). Lossy pull encodings replay onto the decoded
//! rows; other trainers' updates are not replayed (they are unknown until pulled). Tables with an admission
//! filter on the servers would drop some updates the trainer replays; tables registered by trainers have
//! none.
//!
//! Common ids of two batches are found by merging: [`Plan::share`] lists each server's ids of a table in one
//! ascending key order, so replaying one batch costs one linear pass over both batches' ids.

use embedding::optimizer::{self, Regularizer};
use embedding::{OptimizerConfig, RowCodec, TableConfig};

use base::multiversion;
use protocol::plan::Plan;

/// The optimizers of the embedding tables, to replay updates with.
#[derive(Debug, Clone)]
pub struct Replayer {
    /// `tables[t]`: table `t`'s optimizer, gradient regularizer and row packing (its precision).
    tables: Vec<(OptimizerConfig, Regularizer, RowCodec)>,
}

impl Replayer {
    /// The replayer of the embedding tables `configs` (table `t` of a plan is `configs[t]`), with the
    /// optimizers and regularizers the servers build from the same configs.
    pub fn new(configs: &[TableConfig]) -> Replayer {
        let tables = configs
            .iter()
            .map(|cfg| (cfg.optimizer, Regularizer::of(cfg), cfg.row_codec()))
            .collect();
        Replayer { tables }
    }

    /// f32s of optimizer state per row of table `t` (0 for SGD, 1 for row-wise Adagrad).
    pub fn state_len(&self, t: usize, dim: usize) -> usize {
        self.tables.get(t).map_or(0, |(o, _, _)| o.state_len(dim))
    }

    /// Applies pushed batches, in order, to the rows of `target`'s unique ids that they touched: `rows[t]` is
    /// `[unique_t x dim]` and `state[t]` `[unique_t x state_len_t]` (as pulled, both updated in place);
    /// each push's `grads[t]` are its summed gradients per unique id multiplied by its `scale` (as pushed).
    /// Rows whose gradient is not finite are skipped, as the servers refuse them. Returns the row updates
    /// made (a row updated by two pushes counts twice).
    ///
    /// The pushes are replayed together, a block of the target's rows at a time (each push's updates of
    /// the block, in push order), so a row that several pushes touch is updated again while it is still in
    /// cache: one pass over the pulled rows instead of one per push (DLRM-v2's rows and Adagrad state are
    /// ~1 KB per row and 150k rows per batch, far more than the caches). Each row sees the same updates in
    /// the same order as pushes replayed one after another, so the results are the same bit for bit.
    pub fn replay(
        &mut self,
        target: &Plan,
        rows: &mut [Vec<f32>],
        state: &mut [Vec<f32>],
        pushes: &[Push<'_>],
    ) -> usize {
        self.replay_blocks(target, rows, state, pushes, REPLAY_BLOCK_BYTES)
    }

    /// [`Replayer::replay`] with blocks of `block_bytes` of pulled rows and state (at least one row): the
    /// results do not depend on it (tests replay with blocks of one row).
    fn replay_blocks(
        &mut self,
        target: &Plan,
        rows: &mut [Vec<f32>],
        state: &mut [Vec<f32>],
        pushes: &[Push<'_>],
        block_bytes: usize,
    ) -> usize {
        use rayon::prelude::*;
        let tables = target
            .tables()
            .min(self.tables.len())
            .min(rows.len())
            .min(state.len());
        // Tables are independent: split over the rayon pool (this runs on the training loop's critical
        // path, between dense steps).
        let per_table = rows[..tables]
            .par_iter_mut()
            .zip(state[..tables].par_iter_mut())
            .zip(self.tables[..tables].par_iter());
        let updated = per_table
            .enumerate()
            .map(|(t, ((w, st), (opt, reg, codec)))| {
                let dim = target.dim(t);
                let len = opt.state_len(dim);
                if w.len() < target.unique(t).len() * dim || st.len() < target.unique(t).len() * len
                {
                    return 0;
                }
                // The pushes that hold table t at the same dimension (others are skipped for it).
                let pushes: Vec<&Push<'_>> = pushes
                    .iter()
                    .filter(|p| t < p.plan.tables() && t < p.grads.len() && p.plan.dim(t) == dim)
                    .collect();
                if pushes.is_empty() {
                    return 0;
                }
                let mut updated = 0;
                let mut grad = vec![0.0f32; dim];
                let (mut cursors, mut matches) = (vec![0usize; pushes.len()], Vec::new());
                let table = TableReplay {
                    target,
                    pushes: &pushes,
                    block: (block_bytes / (4 * (dim + len))).max(1),
                    t,
                    opt,
                    reg: *reg,
                    codec: *codec,
                };
                replay_table(
                    &table,
                    w,
                    st,
                    &mut grad,
                    &mut cursors,
                    &mut matches,
                    &mut updated,
                );
                updated
            });
        updated.sum()
    }
}

/// One pushed batch to replay ([`Replayer::replay`]).
#[derive(Clone, Copy)]
pub struct Push<'a> {
    /// The pushed batch's plan (its unique ids, by server, in wire order).
    pub plan: &'a Plan,
    /// Its gradients, summed per unique id of `plan`, times `scale` (as pushed).
    pub grads: &'a [Vec<f32>],
    /// The loss scale the gradients carry.
    pub scale: f32,
}

/// One table of the pushes to replay ([`replay_table`]).
struct TableReplay<'a> {
    /// The batch whose pulled rows are updated.
    target: &'a Plan,
    /// The pushed batches, in push order (each holds table `t` at the target's dimension).
    pushes: &'a [&'a Push<'a>],
    /// Target rows per block.
    block: usize,
    /// The table.
    t: usize,
    opt: &'a OptimizerConfig,
    reg: Regularizer,
    /// How the servers store the table's rows: half-precision weights are rounded after each update as the
    /// servers round them.
    codec: RowCodec,
}

/// Bytes of pulled rows and state one block of [`replay_table`] spans: the rows stay in L2 (1 MiB per core
/// on Zen 4, 2 MiB on Sapphire Rapids) while every push updates them, with room for the pushes' gradients.
const REPLAY_BLOCK_BYTES: usize = 256 << 10;

/// Matches of a block ahead of the one being applied whose rows [`replay_table`] prefetches: enough to
/// cover a memory access (~100 ns) with the ~50 ns one Adagrad update of 128 weights takes.
const PREFETCH_AHEAD: usize = 4;

multiversion! {
    /// Replays `p.pushes`' gradients of table `p.t` onto the rows `w` and state `st` of `p.target`'s ids
    /// that they touched, adding the row updates to `updated`; `grad` is a row of scratch, `cursors` one
    /// position per push and `matches` scratch. Per server, the target's ids are taken a block at a time;
    /// each push's ids are merged with the block in turn (each merge resumes where the previous block left
    /// it: the same merge as one pass per push, interleaved), listing the block's matches in push order;
    /// then the matches are applied, the rows of a later match prefetched (rows are scattered over the
    /// pulled buffers, which the hardware prefetchers cannot follow). The body of [`Replayer::replay`] for
    /// one table, compiled for AVX-512 and AVX2 too (the workspace's baseline is SSE2, where it ran one
    /// float at a time): the same operations in the same order, so the rows stay bit for bit what the
    /// servers, built for the baseline, compute.
    fn replay_table(
        p: &TableReplay<'_>,
        w: &mut [f32],
        st: &mut [f32],
        grad: &mut [f32],
        cursors: &mut [usize],
        matches: &mut Vec<(u32, u32, u32)>,
        updated: &mut usize,
    ) {
        let (dim, t) = (grad.len(), p.t);
        let (len, block) = (p.opt.state_len(dim), p.block);
        for s in 0..p.target.servers() {
            let (pa, ka) = p.target.share(s, t);
            cursors.fill(0);
            for i0 in (0..ka.len()).step_by(block) {
                let i1 = (i0 + block).min(ka.len());
                matches.clear();
                for (n, (push, j)) in p.pushes.iter().zip(cursors.iter_mut()).enumerate() {
                    if s >= push.plan.servers() {
                        continue;
                    }
                    let (pb, kb) = push.plan.share(s, t);
                    let mut i = i0;
                    // Branch-free advance: which list moves is data-dependent and unpredictable.
                    while i < i1 && *j < kb.len() {
                        let (x, y) = (ka[i], kb[*j]);
                        if x == y {
                            matches.push((n as u32, pa[i], pb[*j]));
                        }
                        i += usize::from(x <= y);
                        *j += usize::from(y <= x);
                    }
                }
                for m in 0..matches.len() {
                    if let Some(&(n, a, b)) = matches.get(m + PREFETCH_AHEAD) {
                        let (a, b) = (a as usize, b as usize);
                        base::simd::prefetch(&w[a * dim..(a + 1) * dim]);
                        base::simd::prefetch(&st[a * len..(a + 1) * len]);
                        base::simd::prefetch(&p.pushes[n as usize].grads[t][b * dim..(b + 1) * dim]);
                    }
                    let (n, a, b) = matches[m];
                    let (push, a, b) = (p.pushes[n as usize], a as usize, b as usize);
                    // The servers multiply by the inverse (and skip a scale of 1): the same f32 arithmetic.
                    let (scale, inv) = (push.scale, 1.0 / push.scale);
                    let src = &push.grads[t][b * dim..(b + 1) * dim];
                    for (d, &x) in grad.iter_mut().zip(src) {
                        *d = if scale != 1.0 { x * inv } else { x };
                    }
                    if grad.iter().all(|x| x.is_finite()) {
                        let row = &mut w[a * dim..(a + 1) * dim];
                        let state = &mut st[a * len..(a + 1) * len];
                        optimizer::update(p.opt, p.reg, row, state, grad);
                        p.codec.round_updated(p.target.unique(t)[a], row, state);
                        *updated += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedding::{InitConfig, Table};
    use protocol::ShardMap;

    fn configs(
        optimizer: OptimizerConfig,
        (precision, state_precision): (embedding::RowPrecision, embedding::RowPrecision),
    ) -> Vec<TableConfig> {
        (0..2)
            .map(|t| TableConfig {
                optimizer,
                precision,
                state_precision,
                init: InitConfig::uniform(0.1),
                seed: 7 + t as u64,
                ..TableConfig::new(t, format!("C{t}"), 3)
            })
            .collect()
    }

    fn plan(batch: &[[u64; 2]], map: &ShardMap) -> Plan {
        let sparse: Vec<Vec<u64>> = (0..2)
            .map(|t| {
                batch
                    .iter()
                    .map(|s| protocol::routing::mix64(s[t]))
                    .collect()
            })
            .collect();
        let mut p = Plan::default();
        p.build(&sparse, 3, map);
        p
    }

    /// Replaying pushes onto rows pulled before them gives the rows (and state) pulled after them, bit for
    /// bit, for every optimizer the trainer uses and for bf16 and f16 rows, and Adam's bf16 moments (rounded
    /// as the servers round them); a gradient that is not finite is skipped like the server skips it.
    #[test]
    fn replay_equals_pulling_after_the_pushes() {
        use embedding::RowPrecision::{Bf16, F16, F32};
        let adagrad = OptimizerConfig::RowAdagrad {
            lr: 0.05,
            eps: 1e-8,
            initial_accumulator: 0.1,
        };
        let adam = OptimizerConfig::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        for (optimizer, precision) in [
            (OptimizerConfig::Sgd { lr: 0.3 }, (F32, F32)),
            (adagrad, (F32, F32)),
            (adagrad, (Bf16, F32)),
            (adagrad, (F16, F32)),
            (adam, (Bf16, Bf16)),
            (adam, (F32, Bf16)),
        ] {
            let configs = configs(optimizer, precision);
            let map = ShardMap::new(3);
            let tables: Vec<Table> = configs
                .iter()
                .map(|c| Table::new(c.clone()).unwrap())
                .collect();
            let mut replayer = Replayer::new(&configs);
            // Pull batch "target" now, then push three batches overlapping it, then replay.
            // Batches of 60 samples over few ids, so that most ids recur in every batch and the blocks
            // below end in the middle of every push's ids.
            let batch = |n: u64| -> Vec<[u64; 2]> {
                (0..60u64)
                    .map(|i| [(i * 7 + n * 3) % 41, (i * 5 + n) % 29 + 100])
                    .collect()
            };
            let target = plan(&batch(0), &map);
            let pull = |p: &Plan| -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
                let (mut rows, mut state) = (Vec::new(), Vec::new());
                for (t, table) in tables.iter().enumerate() {
                    let ids = p.unique(t);
                    let len = table.row_len();
                    let mut full = vec![0.0; ids.len() * len];
                    table.gather_with_state(ids, &mut full).unwrap();
                    rows.push(full.chunks(len).flat_map(|r| r[..3].to_vec()).collect());
                    state.push(full.chunks(len).flat_map(|r| r[3..].to_vec()).collect());
                }
                (rows, state)
            };
            let (mut rows, mut state) = pull(&target);
            let before = (rows.clone(), state.clone());
            let pushes = [
                plan(&batch(1), &map),
                plan(&batch(2), &map),
                plan(&batch(3), &map),
            ];
            let scale = 4.0;
            let mut all_grads = Vec::new();
            for (n, pushed) in pushes.iter().enumerate() {
                let grads: Vec<Vec<f32>> = (0..2)
                    .map(|t| {
                        (0..pushed.unique(t).len() * 3)
                            .map(|i| match (n, t, i) {
                                (1, 0, 0) => f32::NAN,
                                _ => ((i + 7 * n + t) as f32 * 0.7).sin() * scale,
                            })
                            .collect()
                    })
                    .collect();
                for (t, table) in tables.iter().enumerate() {
                    let mut g = grads[t].clone();
                    g.iter_mut().for_each(|x| *x *= 1.0 / scale);
                    table.apply(pushed.unique(t), &g).unwrap();
                }
                let one = Push {
                    plan: pushed,
                    grads: &grads,
                    scale,
                };
                replayer.replay(&target, &mut rows, &mut state, &[one]);
                all_grads.push(grads);
            }
            let (want_rows, want_state) = pull(&target);
            let bits =
                |v: &[Vec<f32>]| -> Vec<u32> { v.concat().iter().map(|x| x.to_bits()).collect() };
            assert_eq!(bits(&rows), bits(&want_rows), "{optimizer:?} {precision:?}");
            assert_eq!(
                bits(&state),
                bits(&want_state),
                "{optimizer:?} {precision:?}"
            );
            // All three pushes in one call, in blocks of 1, 3 and 10 rows and the default size: the same bits.
            let all: Vec<Push<'_>> = pushes
                .iter()
                .zip(&all_grads)
                .map(|(plan, grads)| Push { plan, grads, scale })
                .collect();
            let row_bytes = 4 * (3 + configs[0].optimizer.state_len(3));
            for block_bytes in [row_bytes, 3 * row_bytes, 10 * row_bytes, REPLAY_BLOCK_BYTES] {
                let (mut rows, mut state) = before.clone();
                replayer.replay_blocks(&target, &mut rows, &mut state, &all, block_bytes);
                let what = format!("{optimizer:?} {precision:?}, blocks of {block_bytes} bytes");
                assert_eq!(bits(&rows), bits(&want_rows), "{what}");
                assert_eq!(bits(&state), bits(&want_state), "{what}");
            }
            assert_eq!(replayer.state_len(0, 3), configs[0].optimizer.state_len(3));
        }
    }
}

/// Cost of the replay stage on a demo-sized batch, run by hand (release build, nothing asserted):
///
/// ```text
/// cargo test --release -p trainer --lib replay::perf -- --ignored --nocapture --test-threads 1
/// ```
#[cfg(test)]
mod perf {
    use super::*;
    use embedding::InitConfig;
    use protocol::ShardMap;
    use std::time::Instant;

    /// Skewed ids like Criteo's: table `t` draws `floor(card_t * u^4)` (most draws hit a few hot ids).
    fn batch(seed: u64, b: usize, tables: usize) -> Vec<Vec<u64>> {
        let mut z = seed;
        (0..tables)
            .map(|t| {
                let card = [10u64, 1_000, 100_000, 10_000_000][t % 4] as f64;
                (0..b)
                    .map(|_| {
                        z = protocol::routing::mix64(z.wrapping_add(0x9e37_79b9_7f4a_7c15));
                        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
                        protocol::routing::mix64(((t as u64) << 48) | (card * u.powi(4)) as u64)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    #[ignore]
    fn replay_cost_per_batch() {
        // (ids per table per batch, dim, optimizer, pushes in flight): the Kaggle demo's one-hot tables at
        // k = 4, and DLRM-v2-like tables (dim 128, Adagrad, 8 ids per sample and table) at k = 2.
        let adagrad = OptimizerConfig::Adagrad {
            lr: 0.05,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        let row_adagrad = OptimizerConfig::RowAdagrad {
            lr: 0.05,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        for (b, dim, optimizer, k) in [(2048, 16, row_adagrad, 4), (2048 * 8, 128, adagrad, 2)] {
            let tables = 26;
            let map = ShardMap::new(2);
            let config = |t: usize| TableConfig {
                optimizer,
                init: InitConfig::uniform(0.05),
                seed: t as u64,
                ..TableConfig::new(t as u32, format!("C{}", t + 1), dim)
            };
            let configs: Vec<_> = (0..tables).map(config).collect();
            let mut replayer = Replayer::new(&configs);
            let plans: Vec<Plan> = (0..=k as u64)
                .map(|s| {
                    let mut p = Plan::default();
                    p.build(&batch(s, b, tables), dim, &map);
                    p
                })
                .collect();
            let emb_grad: Vec<f32> = (0..b * tables * dim).map(|i| (i as f32).sin()).collect();
            let mut grads: Vec<Vec<Vec<f32>>> = vec![Vec::new(); k];
            let target = &plans[k];
            let unique = target.unique_ids();
            let len = optimizer.state_len(dim);
            let mut rows: Vec<Vec<f32>> = (0..tables)
                .map(|t| vec![0.01; target.unique(t).len() * dim])
                .collect();
            let mut state: Vec<Vec<f32>> = (0..tables)
                .map(|t| vec![1.0; target.unique(t).len() * len])
                .collect();
            let reps = 10;
            let t0 = Instant::now();
            for _ in 0..reps {
                plans[0].reduce_gradients(&emb_grad, 2048.0, &mut grads[0]);
            }
            let reduce = t0.elapsed().as_secs_f64() / reps as f64;
            for j in 1..k {
                plans[j].reduce_gradients(&emb_grad, 2048.0, &mut grads[j]);
            }
            let pushes: Vec<Push<'_>> = plans[..k]
                .iter()
                .zip(&grads)
                .map(|(plan, grads)| Push {
                    plan,
                    grads,
                    scale: 2048.0,
                })
                .collect();
            // Interleaved: one call per push (a pass over the rows each), then all pushes in one call.
            let (mut apart, mut together, mut replayed) = (Vec::new(), Vec::new(), 0);
            for _ in 0..reps {
                let t0 = Instant::now();
                for p in &pushes {
                    replayer.replay(target, &mut rows, &mut state, std::slice::from_ref(p));
                }
                apart.push(t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                replayed = replayer.replay(target, &mut rows, &mut state, &pushes);
                together.push(t0.elapsed().as_secs_f64());
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2] * 1e3
            };
            println!(
                "{b} ids x {tables} tables, dim {dim}, {optimizer:?}: {unique} unique ids; reduce (sum per \
                 unique id) {:.2} ms; replay of {k} pushes: one call per push {:.2} ms, one call {:.2} ms \
                 ({replayed} row updates)",
                reduce * 1e3,
                median(&mut apart),
                median(&mut together),
            );
        }
    }
}
