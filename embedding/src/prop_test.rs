//! Property test: random gather / apply / expire / flush / reopen / crash sequences on the engine (arenas +
//! store) and on a plain `HashMap<u64, Vec<f32>>` model, compared bit for bit after every step (STYLE.md,
//! "Tests"; after tikv's `in_memory_engine/src/prop_test.rs`). Runs once over [`MemStore`] and once over
//! [`RocksStore`]. Time is simulated: each apply and expire moves a shared clock forward by 0..3 seconds.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;

use crate::config::{AdmissionConfig, InitConfig, OptimizerConfig, TableConfig};
use crate::engine::Engine;
use crate::mem_store::MemStore;
use crate::prop_model::{bits, RowModel, Rows};
use crate::rocks_store::RocksStore;
use crate::store::Store;

const MAX_DIM: usize = 3;

fn configs() -> Vec<TableConfig> {
    let mut a = TableConfig::new(1, "row_adagrad", 3);
    a.seed = 7;
    let mut b = TableConfig::new(2, "sgd", 2);
    b.optimizer = OptimizerConfig::Sgd { lr: 0.5 };
    b.init = InitConfig::normal(0.1);
    let mut c = TableConfig::new(3, "adagrad", 1);
    c.optimizer = OptimizerConfig::Adagrad {
        lr: 0.2,
        eps: 1e-6,
        initial_accumulator: 0.1,
    };
    // Adam with weight decay, clipping and a TTL of 4 seconds.
    let mut d = TableConfig::new(4, "adam_ttl", 2);
    d.optimizer = OptimizerConfig::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-6,
    };
    d.weight_decay = 0.05;
    d.clip_norm = 1.0;
    d.ttl_secs = Some(4);
    // FTRL with admission after 2 pushes (a wide sketch: the few ids used never collide in all rows).
    let mut e = TableConfig::new(5, "ftrl_admission", 3);
    e.optimizer = OptimizerConfig::Ftrl {
        alpha: 0.1,
        beta: 1.0,
        l1: 0.01,
        l2: 0.1,
    };
    e.admission = Some(AdmissionConfig {
        min_count: 2,
        width: 4096,
        depth: 4,
    });
    vec![a, b, c, d, e]
}

const TABLES: usize = 5;

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
        dt: u64,
    },
    /// [`Engine::expire`] after the clock moves `dt` seconds.
    Expire {
        dt: u64,
    },
    Flush,
    /// Flush, drop the engine and the store, reopen.
    Reopen,
    /// Drop without flushing and reopen: rows since the last flush are lost.
    Crash,
}

fn id() -> impl Strategy<Value = u64> {
    // Mostly a few ids, so rows are updated repeatedly and calls hold duplicates.
    prop_oneof![8 => 0u64..12, 1 => any::<u64>()]
}

fn grad() -> impl Strategy<Value = f32> {
    prop_oneof![20 => -2.0f32..2.0, 1 => Just(f32::NAN), 1 => Just(f32::NEG_INFINITY)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..TABLES, prop::collection::vec(id(), 0..10)).prop_map(|(table, ids)| Op::Gather { table, ids }),
        8 => (0..TABLES, prop::collection::vec((id(), prop::collection::vec(grad(), MAX_DIM)), 0..10), 0..3u64)
            .prop_map(|(table, rows, dt)| {
                let (ids, grads) = rows.into_iter().unzip::<_, _, Vec<u64>, Vec<Vec<f32>>>();
                Op::Apply { table, ids, grads: grads.concat(), dt }
            }),
        2 => (0..3u64).prop_map(|dt| Op::Expire { dt }),
        2 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

/// Where the store lives: reopening yields a store with the same contents.
enum Backend {
    Mem(Arc<MemStore>),
    Rocks(tempfile::TempDir),
}

impl Backend {
    fn open(&self) -> Arc<dyn Store> {
        match self {
            Backend::Mem(s) => s.clone(),
            Backend::Rocks(dir) => Arc::new(RocksStore::open(dir.path()).unwrap()),
        }
    }
}

/// The reference: rows per table, live ([`RowModel`]) and as of the last flush; last-touched times of live rows
/// (`None`: recovered, unknown until the next expire).
struct Model {
    rows: RowModel,
    durable: Vec<Rows>,
    stamps: Vec<HashMap<u64, Option<u64>>>,
}

impl Model {
    fn apply(&mut self, t: usize, ids: &[u64], grads: &[f32], now: u64) {
        let stamps = &mut self.stamps[t];
        self.rows.apply(t, ids, grads, |id| {
            stamps.insert(id, Some(now));
        });
    }

    /// Deletes rows untouched for their table's TTL, live and durable; returns how many.
    fn expire(&mut self, now: u64) -> usize {
        let mut deleted = 0;
        for (t, cfg) in self.rows.configs.iter().enumerate() {
            let Some(ttl) = cfg.ttl_secs else { continue };
            let mut gone = Vec::new();
            for (id, stamp) in self.stamps[t].iter_mut() {
                match stamp {
                    None => *stamp = Some(now),
                    Some(s) if now - *s >= ttl => gone.push(*id),
                    Some(_) => {}
                }
            }
            for id in gone {
                self.stamps[t].remove(&id);
                self.rows.live[t].remove(&id);
                self.durable[t].remove(&id);
                deleted += 1;
            }
        }
        deleted
    }

    /// A restart: `live` rows are recovered with unknown stamps and the sketches start empty.
    fn restart(&mut self) {
        for t in 0..self.rows.configs.len() {
            self.stamps[t] = self.rows.live[t].keys().map(|&id| (id, None)).collect();
            self.rows.sightings[t].clear();
        }
    }
}

fn open_engine(backend: &Backend, configs: &[TableConfig]) -> Engine {
    let engine = Engine::open(backend.open()).unwrap();
    for c in configs {
        engine.register_table(c.clone()).unwrap();
    }
    engine
}

fn check_rows(engine: &Engine, model: &Model) -> Result<(), TestCaseError> {
    for (t, cfg) in model.rows.configs.iter().enumerate() {
        let table = engine.table(cfg.id).unwrap();
        prop_assert_eq!(
            table.len(),
            model.rows.live[t].len(),
            "rows of table {}",
            cfg.id
        );
        for (id, want) in &model.rows.live[t] {
            let got = table.row(*id);
            prop_assert!(got.is_some(), "table {} lost id {}", cfg.id, id);
            prop_assert_eq!(
                bits(&got.unwrap()),
                bits(want),
                "table {} id {}",
                cfg.id,
                id
            );
        }
    }
    Ok(())
}

fn run(backend: Backend, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let configs = configs();
    let mut model = Model {
        rows: RowModel::new(configs.clone()),
        durable: vec![Rows::new(); configs.len()],
        stamps: vec![HashMap::new(); configs.len()],
    };
    let mut now = 0u64;
    let mut engine = Some(open_engine(&backend, &configs));
    for op in ops {
        let e = engine.as_ref().unwrap();
        match op {
            Op::Gather { table, ids } => {
                let mut out = vec![0.0; ids.len() * configs[table].dim];
                e.gather(configs[table].id, &ids, &mut out).unwrap();
                prop_assert_eq!(bits(&out), bits(&model.rows.gather(table, &ids)));
            }
            Op::Apply {
                table,
                ids,
                mut grads,
                dt,
            } => {
                now += dt;
                let dim = configs[table].dim;
                // Keep the first `dim` values of each MAX_DIM-long gradient row.
                grads = grads
                    .chunks(MAX_DIM)
                    .flat_map(|g| g[..dim].to_vec())
                    .collect();
                e.apply_at(configs[table].id, &ids, &grads, now).unwrap();
                model.apply(table, &ids, &grads, now);
            }
            Op::Expire { dt } => {
                now += dt;
                let stats = e.expire(now).unwrap();
                prop_assert_eq!(stats.rows_deleted, model.expire(now));
            }
            Op::Flush => {
                e.flush_dirty().unwrap();
                model.durable = model.rows.live.clone();
            }
            Op::Reopen => {
                e.flush_dirty().unwrap();
                model.durable = model.rows.live.clone();
                drop(engine.take());
                model.restart();
                engine = Some(open_engine(&backend, &configs));
            }
            Op::Crash => {
                drop(engine.take());
                model.rows.live = model.durable.clone();
                model.restart();
                engine = Some(open_engine(&backend, &configs));
            }
        }
        check_rows(engine.as_ref().unwrap(), &model)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn engine_matches_model_on_mem_store(ops in prop::collection::vec(op(), 1..40)) {
        run(Backend::Mem(Arc::new(MemStore::new())), ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn engine_matches_model_on_rocks_store(ops in prop::collection::vec(op(), 1..40)) {
        run(Backend::Rocks(tempfile::tempdir().unwrap()), ops)?;
    }
}
