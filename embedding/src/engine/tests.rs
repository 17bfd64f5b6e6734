//! Unit tests of [`Engine`]: registration, recovery, write-back, corruption.

use super::*;
use crate::config::{InitConfig, OptimizerConfig};
use crate::mem_store::MemStore;
use crate::rocks_store::RocksStore;

fn cfg(id: u32, dim: usize) -> TableConfig {
    let mut c = TableConfig::new(id, format!("C{id}"), dim);
    c.seed = 99;
    c
}

fn mem_engine() -> (Arc<MemStore>, Engine) {
    let store = Arc::new(MemStore::new());
    let engine = Engine::open(store.clone()).unwrap();
    (store, engine)
}

#[test]
fn register_is_idempotent_and_conflicts_name_the_fields() {
    let (store, e) = mem_engine();
    e.register_table(cfg(3, 16)).unwrap();
    e.register_table(cfg(3, 16)).unwrap();
    let mut other = cfg(3, 32);
    other.init = InitConfig::for_dim(16);
    let err = e.register_table(other).unwrap_err();
    assert_eq!(
        err.to_string(),
        "table 3: already registered with a different config (dim: registered 16, requested 32)"
    );
    assert!(matches!(
        err,
        EmbeddingError::TableConflict { table: 3, .. }
    ));
    assert_eq!(e.tables(), vec![cfg(3, 16)]);
    assert!(store.get_meta("table/3").unwrap().is_some());
    // The conflict also holds after a restart.
    drop(e);
    let e = Engine::open(store).unwrap();
    e.register_table(cfg(3, 16)).unwrap();
    assert!(e.register_table(cfg(3, 8)).is_err());
}

#[test]
fn invalid_config_is_not_registered() {
    let (store, e) = mem_engine();
    let mut c = cfg(1, 4);
    c.optimizer = OptimizerConfig::Sgd { lr: -1.0 };
    assert!(matches!(
        e.register_table(c),
        Err(EmbeddingError::InvalidConfig {
            field: "optimizer.lr",
            ..
        })
    ));
    assert!(e.tables().is_empty());
    assert_eq!(store.list_meta("").unwrap(), vec![]);
}

#[test]
fn unknown_table() {
    let (_, e) = mem_engine();
    assert_eq!(e.table(42).unwrap_err().to_string(), "unknown table 42");
    assert!(matches!(
        e.apply(42, &[1], &[0.0]),
        Err(EmbeddingError::UnknownTable(42))
    ));
    assert!(e.gather(42, &[], &mut []).is_err());
}

#[test]
fn flush_writes_dirty_rows_in_batches() {
    let (store, e) = mem_engine();
    e.register_table(cfg(1, 4)).unwrap();
    e.register_table(cfg(2, 2)).unwrap();
    let ids: Vec<u64> = (0..10_000).collect();
    e.apply(1, &ids, &vec![0.5; 40_000]).unwrap();
    e.apply(2, &[7], &[1.0, 1.0]).unwrap();
    let stats = e.flush_dirty().unwrap();
    assert_eq!(stats.rows, 10_001);
    // Tables without a memory budget are written in sorted writes of at most 1,000 rows in tests
    // (SORTED_WRITE_ROWS otherwise).
    assert_eq!(stats.batches, 10 + 1);
    assert_eq!(stats.bytes, 10_000 * 5 * 4 + 3 * 4);
    assert_eq!(store.row_count(1), 10_000);
    assert_eq!(e.flush_dirty().unwrap(), FlushStats::default());
    assert_eq!(e.rows_total(), 10_001);
    assert!(e.memory_bytes() > 10_000 * 20);
}

#[test]
fn failed_write_keeps_rows_dirty() {
    let (store, e) = mem_engine();
    e.register_table(cfg(1, 4)).unwrap();
    e.apply(1, &[1, 2, 3], &[1.0; 12]).unwrap();
    store.set_fail_writes(true);
    let err = e.flush_dirty().unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert_eq!(e.table(1).unwrap().dirty_len(), 3);
    store.set_fail_writes(false);
    assert_eq!(e.flush_dirty().unwrap().rows, 3);
    assert_eq!(store.row_count(1), 3);
}

#[test]
fn restart_recovery_through_rocksdb_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let mut ada = cfg(5, 8);
    ada.optimizer = OptimizerConfig::Adagrad {
        lr: 0.05,
        eps: 1e-8,
        initial_accumulator: 0.1,
    };
    let mut sgd = cfg(6, 3);
    sgd.optimizer = OptimizerConfig::Sgd { lr: 0.3 };
    let configs = vec![cfg(4, 16), ada, sgd];
    // More ids than one write-back chunk (FLUSH_BATCH_ROWS), in no order, so the sorted write sorts across chunks.
    let ids: Vec<u64> = (0..5000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut before = Vec::new();
    {
        let e = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
        for c in &configs {
            e.register_table(c.clone()).unwrap();
            let grads: Vec<f32> = (0..ids.len() * c.dim)
                .map(|i| (i % 7) as f32 * 0.25 - 0.7)
                .collect();
            e.apply(c.id, &ids, &grads).unwrap();
            e.apply(c.id, &ids[..100], &grads[..100 * c.dim]).unwrap();
        }
        assert_eq!(e.flush_dirty().unwrap().rows, 3 * ids.len());
        // A second write-back overwrites what the first wrote.
        for c in &configs {
            let grads = vec![0.125; 300 * c.dim];
            e.apply(c.id, &ids[200..500], &grads).unwrap();
        }
        assert_eq!(e.flush_dirty().unwrap().rows, 3 * 300);
        for c in &configs {
            let t = e.table(c.id).unwrap();
            before.push(ids.iter().map(|&id| t.row(id).unwrap()).collect::<Vec<_>>());
        }
    }
    let e = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
    assert_eq!(e.tables(), configs);
    assert_eq!(e.rows_total(), 3 * ids.len());
    for (c, rows) in configs.iter().zip(&before) {
        let t = e.table(c.id).unwrap();
        assert_eq!(t.dirty_len(), 0);
        for (&id, want) in ids.iter().zip(rows) {
            let got = t.row(id).unwrap();
            assert_eq!(got.len(), c.row_len());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(want), "table {} id {id}", c.id);
        }
    }
    // Registering the recovered configs again is a no-op.
    for c in configs {
        e.register_table(c).unwrap();
    }
}

fn write_raw(store: &dyn Store, table: u32, id: u64, bytes: &[u8]) {
    let mut b = DirtyBatch::new();
    b.reset(bytes.len());
    b.push_bytes(id, bytes);
    store.write_rows(table, &b, true).unwrap();
}

#[test]
fn corrupt_row_values_are_errors_not_panics() {
    for bad_len in [10usize, 8, 72] {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
            e.register_table(cfg(3, 16)).unwrap();
            write_raw(&**e.store(), 3, 77, &vec![0u8; bad_len]);
        }
        let err = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap_err();
        assert_eq!(
            err,
            EmbeddingError::Store(StoreError::CorruptValue {
                table: 3,
                id: 77,
                len: bad_len,
                expected: 68
            })
        );
        assert_eq!(
            err.to_string(),
            format!("table 3 id 77: corrupt row value of {bad_len} bytes, expected 68")
        );
    }
}

#[test]
fn corrupt_meta_is_an_error() {
    let store = Arc::new(MemStore::new());
    store.put_meta("table/1", b"{not json").unwrap();
    let err = Engine::open(store.clone()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("meta table/1: invalid table config"),
        "{err}"
    );
    store
        .put_meta("table/1", &serde_json::to_vec(&cfg(2, 4)).unwrap())
        .unwrap();
    let err = Engine::open(store.clone()).unwrap_err();
    assert_eq!(err.to_string(), "meta table/1: config has id 2");
    store.put_meta("table/1", b"").unwrap();
    store.put_meta("table/x", b"").unwrap();
    assert!(Engine::open(store).is_err());
}

#[test]
fn pull_of_new_id_needs_no_write() {
    let (store, e) = mem_engine();
    e.register_table(cfg(1, 4)).unwrap();
    let mut out = [0.0; 8];
    e.gather(1, &[10, 11], &mut out).unwrap();
    assert_eq!(e.rows_total(), 0);
    assert_eq!(e.flush_dirty().unwrap().rows, 0);
    assert_eq!(store.row_count(1), 0);
}

#[test]
fn engine_and_table_are_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Engine>();
    send_sync::<Table>();
    send_sync::<RocksStore>();
    send_sync::<MemStore>();
}

fn ttl_cfg(id: u32, ttl: u64) -> TableConfig {
    let mut c = cfg(id, 4);
    c.ttl_secs = Some(ttl);
    c
}

/// Issue 3: a row pushed at t=0 with ttl 10 survives expire(9) and is gone after expire(11), from memory and,
/// after a reopen, from the store.
fn ttl_deletes_from_memory_and_store(open: &dyn Fn() -> Arc<dyn Store>) {
    let e = Engine::open(open()).unwrap();
    e.register_table(ttl_cfg(1, 10)).unwrap();
    e.register_table(cfg(2, 4)).unwrap();
    e.apply_at(1, &[7, 8], &[1.0; 8], 0).unwrap();
    e.apply_at(2, &[7], &[1.0; 4], 0).unwrap();
    e.flush_dirty().unwrap();
    assert_eq!(e.expire(9).unwrap(), ExpireStats::default());
    assert!(e.table(1).unwrap().row(7).is_some());
    e.apply_at(1, &[8], &[1.0; 4], 5).unwrap();
    let stats = e.expire(11).unwrap();
    assert_eq!(stats.rows_deleted, 1);
    assert_eq!(e.table(1).unwrap().row(7), None);
    assert!(e.table(1).unwrap().row(8).is_some());
    assert!(
        e.table(2).unwrap().row(7).is_some(),
        "tables without a TTL keep their rows"
    );
    e.flush_dirty().unwrap();
    drop(e);
    let e = Engine::open(open()).unwrap();
    assert_eq!(
        e.table(1).unwrap().row(7),
        None,
        "deleted from the store too"
    );
    assert!(e.table(1).unwrap().row(8).is_some());
    assert!(e.table(2).unwrap().row(7).is_some());
    // Recovered rows start their TTL at the first expire after the reopen.
    assert_eq!(e.expire(100).unwrap().rows_deleted, 0);
    assert_eq!(e.expire(110).unwrap().rows_deleted, 1);
    assert!(e.table(1).unwrap().is_empty());
}

#[test]
fn ttl_expiry_on_mem_store() {
    let store = Arc::new(MemStore::new());
    ttl_deletes_from_memory_and_store(&|| store.clone());
}

#[test]
fn ttl_expiry_on_rocks_store() {
    let dir = tempfile::tempdir().unwrap();
    ttl_deletes_from_memory_and_store(&|| Arc::new(RocksStore::open(dir.path()).unwrap()));
}

#[test]
fn failed_store_delete_keeps_rows_in_memory() {
    let (store, e) = mem_engine();
    e.register_table(ttl_cfg(1, 10)).unwrap();
    e.apply_at(1, &[7], &[1.0; 4], 0).unwrap();
    e.flush_dirty().unwrap();
    store.set_fail_writes(true);
    assert!(matches!(e.expire(20), Err(EmbeddingError::Store(_))));
    assert!(e.table(1).unwrap().row(7).is_some());
    store.set_fail_writes(false);
    assert_eq!(e.expire(21).unwrap().rows_deleted, 1);
    assert_eq!(store.row_count(1), 0);
}

#[test]
fn apply_without_time_is_stamped_by_the_last_expire() {
    let (_store, e) = mem_engine();
    e.register_table(ttl_cfg(1, 10)).unwrap();
    e.expire(1_000).unwrap();
    e.apply(1, &[7], &[1.0; 4]).unwrap();
    assert_eq!(e.expire(1_009).unwrap().rows_deleted, 0);
    assert_eq!(e.expire(1_010).unwrap().rows_deleted, 1);
}

#[test]
fn new_config_fields_survive_a_restart() {
    let store = Arc::new(MemStore::new());
    let e = Engine::open(store.clone()).unwrap();
    let mut c = ttl_cfg(1, 60);
    c.optimizer = OptimizerConfig::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    c.weight_decay = 0.01;
    c.clip_norm = 5.0;
    c.admission = Some(crate::config::AdmissionConfig {
        min_count: 2,
        width: 128,
        depth: 2,
    });
    e.register_table(c.clone()).unwrap();
    e.apply(1, &[3, 3], &[1.0; 8]).unwrap();
    e.flush_dirty().unwrap();
    drop(e);
    let e = Engine::open(store).unwrap();
    assert_eq!(e.tables(), vec![c.clone()]);
    let row = e.table(1).unwrap().row(3).unwrap();
    assert_eq!(row.len(), 4 + 9);
    assert_eq!(
        row[12], 1.0,
        "one Adam step: the second push was the admitting one"
    );
}

#[test]
fn persist_writes_full_rows_without_a_flush_and_keeps_them_dirty() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u64> = (0..300).map(|i| i * 7919).collect();
    let grads: Vec<f32> = (0..ids.len() * 4).map(|i| (i % 5) as f32 - 2.0).collect();
    let expected: Vec<Vec<f32>> = {
        let store = Arc::new(RocksStore::open(dir.path()).unwrap());
        let e = Engine::open(store).unwrap();
        let mut c = cfg(1, 4);
        c.optimizer = OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        e.register_table(c).unwrap();
        e.register_table(cfg(2, 4)).unwrap();
        e.apply(1, &ids, &grads).unwrap();
        e.apply(2, &ids[..10], &grads[..40]).unwrap();
        let stats = e
            .persist(&[(1, &ids), (2, &ids[..10]), (2, &[])], true)
            .unwrap();
        assert_eq!((stats.rows, stats.batches), (310, 2));
        let row_bytes = |t: u32| e.table(t).unwrap().row_len() * 4;
        assert_eq!(stats.bytes, 300 * row_bytes(1) + 10 * row_bytes(2));
        // Still dirty: the periodic write-back rewrites them.
        assert_eq!(e.table(1).unwrap().dirty_len(), 300);
        assert!(matches!(
            e.persist(&[(9, &ids)], true),
            Err(EmbeddingError::UnknownTable(9))
        ));
        let t = e.table(1).unwrap();
        ids.iter().map(|&id| t.row(id).unwrap()).collect()
        // Dropped without flush_dirty: only the persisted writes are on disk.
    };
    let e = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
    let t = e.table(1).unwrap();
    for (id, row) in ids.iter().zip(&expected) {
        assert_eq!(t.row(*id).as_ref(), Some(row), "id {id}");
    }
    assert_eq!(e.table(2).unwrap().len(), 10);
}

/// The cost of `sync` durability: the same pushes applied only (periodic mode) and applied then persisted
/// with a synced write (sync mode), against RocksDB in a temp dir.
/// `cargo test --release -p embedding persist_cost -- --ignored --nocapture`
#[test]
#[ignore = "measurement; run in release with --nocapture"]
fn persist_cost() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
    let mut c = cfg(1, 16);
    c.optimizer = OptimizerConfig::RowAdagrad {
        lr: 0.05,
        eps: 1e-8,
        initial_accumulator: 0.0,
    };
    e.register_table(c).unwrap();
    let batch = 1024usize;
    let pushes = 200u64;
    let grads: Vec<f32> = (0..batch * 16).map(|i| (i % 7) as f32 * 0.01).collect();
    let mut results = Vec::new();
    for sync in [false, true] {
        let start = std::time::Instant::now();
        let mut worst = std::time::Duration::ZERO;
        for p in 0..pushes {
            let ids: Vec<u64> = (0..batch as u64)
                .map(|i| (p * 7 + i * 104_729) % 1_000_000)
                .collect();
            let t = std::time::Instant::now();
            e.apply(1, &ids, &grads).unwrap();
            if sync {
                e.persist(&[(1, &ids)], true).unwrap();
            }
            worst = worst.max(t.elapsed());
        }
        let secs = start.elapsed().as_secs_f64();
        let rows_per_sec = (pushes as f64 * batch as f64) / secs;
        println!(
            "{}: {pushes} pushes of {batch} rows (dim 16, row-wise Adagrad): mean {:.3} ms/push, max {:.3} ms, {:.0} rows/s",
            if sync { "sync" } else { "periodic" },
            secs * 1e3 / pushes as f64,
            worst.as_secs_f64() * 1e3,
            rows_per_sec
        );
        results.push(secs);
    }
    println!("sync/periodic time ratio: {:.1}x", results[1] / results[0]);
}

/// Tables are listed as registered: the table policy's admission and TTL are left out, a table's own are
/// kept, and registering a listed config again is a no-op (what backups and reshard destinations do).
#[test]
fn registered_tables_leave_out_the_table_policy() {
    let (_, e) = mem_engine();
    let admission = Some(crate::AdmissionConfig {
        min_count: 2,
        width: 64,
        depth: 2,
    });
    e.set_table_policy(admission, Some(60));
    e.register_table(cfg(1, 4)).unwrap();
    let own = TableConfig {
        ttl_secs: Some(5),
        ..cfg(2, 4)
    };
    e.register_table(own.clone()).unwrap();
    assert_eq!(e.table(1).unwrap().config().ttl_secs, Some(60));
    assert_eq!(e.registered_tables(), vec![cfg(1, 4), own]);
    for c in e.registered_tables() {
        e.register_table(c).unwrap();
    }
    assert_eq!(e.table_count(), 2);
}

/// A table exempt from the policy (a trainer's dense parameters) gets neither its admission nor its TTL:
/// it is never expired and its first push is applied.
#[test]
fn an_exempt_table_keeps_every_row_and_update() {
    let (_, e) = mem_engine();
    e.set_table_policy(
        Some(crate::AdmissionConfig {
            min_count: 2,
            width: 64,
            depth: 2,
        }),
        Some(1),
    );
    e.exempt_from_table_policy(9);
    e.register_table(cfg(9, 2)).unwrap();
    e.register_table(cfg(1, 2)).unwrap();
    let c = e.table(9).unwrap().config().clone();
    assert_eq!((c.admission, c.ttl_secs), (None, None));
    assert!(e.table(1).unwrap().config().ttl_secs.is_some());
    let stats = e.apply_at(9, &[3], &[1.0, 1.0], 10).unwrap();
    assert_eq!(stats.applied, 1, "admitted at its first push");
    assert_eq!(e.expire(1_000_000).unwrap().rows_deleted, 0);
    assert_eq!(e.table(9).unwrap().len(), 1);
}

/// Written weights replace a row's weights and keep its optimizer state; a row not held yet gets the initial
/// state; the rows are dirty (written back) and a wrong length is refused naming it.
#[test]
fn written_weights_keep_the_optimizer_state() {
    let (_, e) = mem_engine();
    let mut c = cfg(1, 2);
    c.optimizer = OptimizerConfig::RowAdagrad {
        lr: 0.1,
        eps: 1e-8,
        initial_accumulator: 0.5,
    };
    e.register_table(c).unwrap();
    e.apply(1, &[7], &[1.0, 1.0]).unwrap();
    let state = |id: u64| {
        let mut row = vec![0.0; 3];
        e.gather_with_state(1, &[id], &mut row).unwrap();
        row
    };
    let before = state(7);
    assert_eq!(
        e.write_weights(1, &[7, 9], &[3.0, 4.0, 5.0, 6.0], 10)
            .unwrap(),
        2
    );
    assert_eq!(
        state(7),
        [3.0, 4.0, before[2]],
        "weights set, accumulator kept"
    );
    assert_eq!(
        state(9),
        [5.0, 6.0, 0.5],
        "a new row: the initial accumulator"
    );
    assert!(e.flush_dirty().unwrap().rows >= 2);
    let err = e
        .write_weights(1, &[7], &[1.0], 10)
        .unwrap_err()
        .to_string();
    assert!(err.contains("weights"), "{err}");
}
