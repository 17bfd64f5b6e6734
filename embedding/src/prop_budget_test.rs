//! Property test of the capacity tier: random gather / apply / prefetch / lease expiry / enforce-budget / flush /
//! reopen sequences on an engine whose tables keep at most [`BUDGET`] rows in memory, against a `HashMap` model, compared bit for bit
//! (weights and optimizer state) after every step. A row is where the engine keeps it: in memory, or evicted
//! to the store. Also: a table 5x over budget trains exactly like the model, and an `#[ignore]` measurement of
//! hit ratio and gather speed at 1x, 2x and 5x over budget under a Zipf-like access pattern.

use std::sync::Arc;

use proptest::prelude::*;

use crate::batch;
use crate::config::{AdmissionConfig, InitConfig, OptimizerConfig, TableConfig};
use crate::engine::Engine;
use crate::init;
use crate::mem_store::MemStore;
use crate::prop_model::{bits, RowModel};
use crate::rocks_store::RocksStore;
use crate::store::Store;

const BUDGET: u64 = 8;
const MAX_DIM: usize = 3;

fn configs() -> Vec<TableConfig> {
    let mut a = TableConfig::new(1, "row_adagrad", 3);
    a.seed = 7;
    let mut b = TableConfig::new(2, "sgd", 2);
    b.optimizer = OptimizerConfig::Sgd { lr: 0.5 };
    b.init = InitConfig::normal(0.1);
    let mut c = TableConfig::new(3, "adam", 2);
    c.optimizer = OptimizerConfig::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-6,
    };
    c.weight_decay = 0.05;
    c.clip_norm = 1.0;
    let mut d = TableConfig::new(4, "ftrl_admission", 3);
    d.optimizer = OptimizerConfig::Ftrl {
        alpha: 0.1,
        beta: 1.0,
        l1: 0.01,
        l2: 0.1,
    };
    d.admission = Some(AdmissionConfig {
        min_count: 2,
        width: 4096,
        depth: 4,
    });
    vec![a, b, c, d]
}

const TABLES: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Gather {
        table: usize,
        ids: Vec<u64>,
    },
    Apply {
        table: usize,
        ids: Vec<u64>,
        grads: Vec<f32>,
    },
    /// A prefetch of one table's ids under lease `lease` of owner `owner % 2`, releasing that owner's leases
    /// below `release_below`.
    Prefetch {
        table: usize,
        ids: Vec<u64>,
        owner: u64,
        lease: u64,
        release_below: u64,
    },
    /// Lease deadlines at `now` (prefetches pin until time 10).
    ExpireLeases {
        now: u64,
    },
    Enforce,
    Flush,
    /// Flush, drop the engine, reopen (recovery loads at most the budget).
    Reopen,
}

fn id() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0u64..30, 1 => any::<u64>()]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..TABLES, prop::collection::vec(id(), 0..12)).prop_map(|(table, ids)| Op::Gather { table, ids }),
        8 => (0..TABLES, prop::collection::vec((id(), prop::collection::vec(-2.0f32..2.0, MAX_DIM)), 0..12))
            .prop_map(|(table, rows)| {
                let (ids, grads) = rows.into_iter().unzip::<_, _, Vec<u64>, Vec<Vec<f32>>>();
                Op::Apply { table, ids, grads: grads.concat() }
            }),
        3 => (0..TABLES, prop::collection::vec(id(), 0..7), 0u64..2, 0u64..6, 0u64..6)
            .prop_map(|(table, ids, owner, lease, release_below)| Op::Prefetch { table, ids, owner, lease, release_below }),
        1 => (0u64..20).prop_map(|now| Op::ExpireLeases { now }),
        3 => Just(Op::Enforce),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

type Model = RowModel;

fn open_engine(store: Arc<dyn Store>, configs: &[TableConfig]) -> Engine {
    let engine = Engine::open_with_budget(store, Some(BUDGET)).unwrap();
    for c in configs {
        engine.register_table(c.clone()).unwrap();
    }
    engine
}

/// The row of `id` wherever the engine keeps it: memory first, else the store.
fn stored_row(engine: &Engine, table: u32, id: u64, row_len: usize) -> Option<Vec<f32>> {
    if let Some(row) = engine.table(table).unwrap().row(id) {
        return Some(row);
    }
    let mut out = None;
    engine
        .store()
        .get_rows(table, &[id], &mut |_, v| {
            out = v.map(|b| {
                let mut row = vec![0.0; row_len];
                batch::decode_row(b, &mut row);
                row
            });
            Ok(())
        })
        .unwrap();
    out
}

fn check_rows(engine: &Engine, model: &Model) -> Result<(), TestCaseError> {
    for (t, cfg) in model.configs.iter().enumerate() {
        let table = engine.table(cfg.id).unwrap();
        let mut in_memory = 0;
        for (id, want) in &model.live[t] {
            in_memory += usize::from(table.row(*id).is_some());
            let got = stored_row(engine, cfg.id, *id, cfg.row_len());
            prop_assert!(got.is_some(), "table {} lost id {}", cfg.id, id);
            prop_assert_eq!(
                bits(&got.unwrap()),
                bits(want),
                "table {} id {}",
                cfg.id,
                id
            );
        }
        // Every row in memory is a model row.
        prop_assert_eq!(table.len(), in_memory, "rows in memory of table {}", cfg.id);
    }
    Ok(())
}

fn run(store: impl Fn() -> Arc<dyn Store>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let configs = configs();
    let mut model = RowModel::new(configs.clone());
    let mut engine = Some(open_engine(store(), &configs));
    for op in ops {
        let e = engine.as_ref().unwrap();
        match op {
            Op::Gather { table, ids } => {
                let mut out = vec![0.0; ids.len() * configs[table].dim];
                e.gather(configs[table].id, &ids, &mut out).unwrap();
                prop_assert_eq!(bits(&out), bits(&model.gather(table, &ids)));
            }
            Op::Apply { table, ids, grads } => {
                let dim = configs[table].dim;
                let grads: Vec<f32> = grads
                    .chunks(MAX_DIM)
                    .flat_map(|g| g[..dim].to_vec())
                    .collect();
                e.apply(configs[table].id, &ids, &grads).unwrap();
                model.apply(table, &ids, &grads, |_| ());
            }
            Op::Prefetch {
                table,
                ids,
                owner,
                lease,
                release_below,
            } => {
                let t = e.table(configs[table].id).unwrap();
                let mut distinct = ids.clone();
                distinct.sort_unstable();
                distinct.dedup();
                let before = t.pinned_rows();
                match e.prefetch(owner, lease, release_below, &[(t.id(), &ids)], 0, 10) {
                    Ok(stats) => {
                        prop_assert!(distinct.len() <= t.pin_limit());
                        let rows = stats.rows;
                        // A table that never evicted counts every id resident, unlooked-up.
                        let counted = if t.spilled() {
                            distinct.len()
                        } else {
                            ids.len()
                        };
                        prop_assert_eq!(
                            rows.resident + rows.absent + rows.pinned + rows.over_pin_limit,
                            counted
                        );
                        prop_assert!(rows.pinned + rows.over_pin_limit <= rows.read_back);
                        prop_assert_eq!(stats.rows.waited, 0, "no concurrent read here");
                        // Every pinned id is in memory now.
                        for id in &distinct {
                            if model.live[table].contains_key(id) {
                                prop_assert!(
                                    t.row(*id).is_some(),
                                    "prefetched id {} not in memory",
                                    id
                                );
                            }
                        }
                    }
                    Err(crate::EmbeddingError::PrefetchTooLarge { ids: n, limit, .. }) => {
                        prop_assert!(n > limit);
                        prop_assert_eq!(t.pinned_rows(), before, "a refused prefetch pins nothing");
                    }
                    Err(other) => prop_assert!(false, "prefetch failed: {}", other),
                }
            }
            Op::ExpireLeases { now } => {
                e.expire_leases(now);
                if now >= 10 {
                    prop_assert_eq!(e.leases(), 0);
                    prop_assert_eq!(e.pinned_rows(), 0, "expired leases leave no pin");
                }
            }
            Op::Enforce => {
                let pinned = pinned_ids(e, &configs);
                e.enforce_budget().unwrap();
                for c in &configs {
                    prop_assert!(e.table(c.id).unwrap().len() as u64 <= BUDGET);
                }
                for (table, id) in pinned {
                    prop_assert!(
                        e.table(table).unwrap().row(id).is_some(),
                        "pinned row {}/{} evicted",
                        table,
                        id
                    );
                }
            }
            Op::Flush => {
                e.flush_dirty().unwrap();
            }
            Op::Reopen => {
                e.flush_dirty().unwrap();
                drop(engine.take());
                for s in &mut model.sightings {
                    s.clear();
                }
                engine = Some(open_engine(store(), &configs));
                for c in &configs {
                    prop_assert!(e_len(engine.as_ref().unwrap(), c.id) as u64 <= BUDGET);
                }
            }
        }
        check_rows(engine.as_ref().unwrap(), &model)?;
    }
    Ok(())
}

/// `(table, id)` of every pinned row (ids 0..30, the ones the strategy mostly draws, plus none other).
fn pinned_ids(engine: &Engine, configs: &[TableConfig]) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    for c in configs {
        let t = engine.table(c.id).unwrap();
        out.extend((0..30).filter(|&id| t.is_pinned(id)).map(|id| (c.id, id)));
    }
    out
}

fn e_len(engine: &Engine, table: u32) -> usize {
    engine.table(table).unwrap().len()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn budget_engine_matches_model_on_mem_store(ops in prop::collection::vec(op(), 1..50)) {
        let store = Arc::new(MemStore::new());
        run(|| store.clone(), ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn budget_engine_matches_model_on_rocks_store(ops in prop::collection::vec(op(), 1..50)) {
        let dir = tempfile::tempdir().unwrap();
        // One RocksDB handle at a time: the previous engine is dropped before the next open.
        run(|| Arc::new(RocksStore::open(dir.path()).unwrap()), ops)?;
    }
}

#[test]
fn sgd_table_five_times_over_budget_trains_exactly() {
    let mut cfg = TableConfig::new(1, "sgd", 4);
    cfg.optimizer = OptimizerConfig::Sgd { lr: 1.0 };
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let engine = Engine::open_with_budget(store, Some(100)).unwrap();
    engine.register_table(cfg.clone()).unwrap();
    let mut model = RowModel::new(vec![cfg.clone()]);
    let ids: Vec<u64> = (0..500).collect();
    let mut evicted = 0;
    for step in 0..20u64 {
        // Gradients of small integers: SGD sums of them are exact in f32.
        let grads: Vec<f32> = ids
            .iter()
            .flat_map(|&id| (0..4).map(move |k| ((id + step + k) % 5) as f32 - 2.0))
            .collect();
        for (c, g) in ids.chunks(64).zip(grads.chunks(64 * 4)) {
            engine.apply(1, c, g).unwrap();
            model.apply(0, c, g, |_| ());
        }
        evicted += engine.enforce_budget().unwrap().rows_evicted;
        assert!(engine.table(1).unwrap().len() <= 100);
    }
    assert!(evicted >= 400 * 20, "evicted {evicted}");
    let mut out = vec![0.0; ids.len() * 4];
    engine.gather(1, &ids, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&model.gather(0, &ids)));
    let mut init_row = vec![0.0; 4];
    init::fill_weights(&cfg, 7, &mut init_row);
    // The same updates in the same order, by hand.
    let w = (0..20u64).fold(init_row[0], |w, s| w - (((7 + s) % 5) as f32 - 2.0));
    assert_eq!(out[7 * 4].to_bits(), w.to_bits());
    assert!(engine.rows_read_back() > 0);
}

/// Hit ratio and gather speed over budget. Run:
/// `cargo test --release -p embedding --lib capacity_tier_hit_ratio -- --ignored --nocapture`
#[test]
#[ignore]
fn capacity_tier_hit_ratio() {
    const DIM: usize = 16;
    const BUDGET_ROWS: u64 = 100_000;
    const BATCH: usize = 4096;
    let cfg = TableConfig::new(1, "t", DIM);
    for over in [1u64, 2, 5] {
        let n = BUDGET_ROWS * over;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
        let engine = Engine::open_with_budget(store, Some(BUDGET_ROWS)).unwrap();
        engine.register_table(cfg.clone()).unwrap();
        let all: Vec<u64> = (0..n).collect();
        let grads = vec![0.01f32; BATCH * DIM];
        for c in all.chunks(BATCH) {
            engine.apply(1, c, &grads[..c.len() * DIM]).unwrap();
            engine.enforce_budget().unwrap();
        }
        engine.flush_dirty().unwrap();
        // Zipf-like (s ~ 1) ids: rank = n^u for u uniform in [0, 1), scattered over the id space.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut zipf = || {
            x = base::hash::splitmix64(x);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            let rank = ((n as f64).powf(u) as u64).min(n - 1);
            base::hash::splitmix64(rank) % n
        };
        let mut out = vec![0.0f32; BATCH * DIM];
        let batches = 200;
        let before = engine.rows_read_back();
        let start = std::time::Instant::now();
        for _ in 0..batches {
            let ids: Vec<u64> = (0..BATCH).map(|_| zipf()).collect();
            engine.gather(1, &ids, &mut out).unwrap();
            engine.enforce_budget().unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        let rows = (batches * BATCH) as f64;
        let misses = (engine.rows_read_back() - before) as f64;
        println!(
            "{over}x over budget ({n} rows, budget {BUDGET_ROWS}, dim {DIM}, RocksDB): hit ratio {:.3}, {:.2} M rows/s gathered (incl. enforce_budget)",
            1.0 - misses / rows,
            rows / secs / 1e6
        );
    }
}
