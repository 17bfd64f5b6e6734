//! Tests of lookahead prefetch and its leases ([`Engine::prefetch`]): one store read per row when a pull
//! arrives while a prefetch of its rows is reading, pins released by a later prefetch of their owner or at
//! their deadline (a prefetch whose batch never comes cannot pin memory forever), and typed refusals.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use crate::batch::DirtyBatch;
use crate::config::TableConfig;
use crate::engine::Engine;
use crate::error::{EmbeddingError, StoreError};
use crate::mem_store::MemStore;
use crate::store::{GetFn, ScanFn, Store};

const BUDGET: u64 = 100;

/// A [`MemStore`] that counts the ids read and, while `hold` is set, makes `get_rows` report that it started
/// (on `entered`) and wait for a message on `release` first.
struct HeldStore {
    inner: MemStore,
    reads: AtomicUsize,
    hold: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl Store for HeldStore {
    fn ensure_table(&self, table: u32) -> Result<(), StoreError> {
        self.inner.ensure_table(table)
    }
    fn write_rows(&self, table: u32, rows: &DirtyBatch, sync: bool) -> Result<(), StoreError> {
        self.inner.write_rows(table, rows, sync)
    }
    fn write_sorted(
        &self,
        table: u32,
        rows: &mut crate::SortedRowsFn<'_>,
    ) -> Result<u64, StoreError> {
        crate::write_sorted_in_batches(self, table, rows)
    }
    fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), StoreError> {
        self.inner.delete_rows(table, ids)
    }
    fn scan_rows(&self, table: u32, f: &mut ScanFn<'_>) -> Result<(), StoreError> {
        self.inner.scan_rows(table, f)
    }
    fn get_rows(&self, table: u32, ids: &[u64], f: &mut GetFn<'_>) -> Result<(), StoreError> {
        if let Some((entered, release)) = self.hold.lock().unwrap().take() {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
        self.reads.fetch_add(ids.len(), Ordering::SeqCst);
        self.inner.get_rows(table, ids, f)
    }
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.put_meta(key, value)
    }
    fn delete_meta(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete_meta(key)
    }
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_meta(key)
    }
    fn list_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.list_meta(prefix)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn estimate_rows(&self, table: u32) -> Result<u64, StoreError> {
        self.inner.estimate_rows(table)
    }
}

/// An engine with one SGD table (id 1, dim 2) of [`BUDGET`] rows holding ids `0..rows`, all pushed once,
/// then evicted down to the budget: ids past the budget live only in the store.
fn spilled(rows: u64) -> (Arc<HeldStore>, Engine) {
    let store = Arc::new(HeldStore {
        inner: MemStore::new(),
        reads: AtomicUsize::new(0),
        hold: Mutex::new(None),
    });
    let engine = Engine::open_with_budget(store.clone(), Some(BUDGET)).unwrap();
    engine.register_table(TableConfig::new(1, "t", 2)).unwrap();
    let ids: Vec<u64> = (0..rows).collect();
    engine.apply(1, &ids, &vec![0.5; ids.len() * 2]).unwrap();
    engine.enforce_budget().unwrap();
    assert_eq!(engine.table(1).unwrap().len() as u64, BUDGET);
    (store, engine)
}

/// Ids of table 1 that live only in the store.
fn evicted(engine: &Engine, rows: u64, n: usize) -> Vec<u64> {
    let t = engine.table(1).unwrap();
    (0..rows)
        .filter(|&id| t.row(id).is_none())
        .take(n)
        .collect()
}

#[test]
fn a_pull_during_its_prefetch_waits_instead_of_reading_again() {
    let (store, engine) = spilled(400);
    let engine = Arc::new(engine);
    let ids = evicted(&engine, 400, 20);
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    *store.hold.lock().unwrap() = Some((entered_tx, release_rx));
    let reads_before = store.reads.load(Ordering::SeqCst);
    let prefetch = {
        let (engine, ids) = (engine.clone(), ids.clone());
        std::thread::spawn(move || engine.prefetch(7, 0, 0, &[(1, &ids)], 0, 60).unwrap())
    };
    entered.recv().unwrap();
    let pull = {
        let (engine, ids) = (engine.clone(), ids.clone());
        std::thread::spawn(move || {
            let mut out = vec![0.0; ids.len() * 2];
            let stats = engine.gather_stats(1, &ids, &mut out).unwrap();
            (stats, out)
        })
    };
    // The pull parks on the prefetch's read (a condition, not a timing guess); a pull that read the rows
    // itself would finish instead, and fail the assertions below.
    let table = engine.table(1).unwrap();
    while table.read_back_waiters() == 0 && !pull.is_finished() {
        std::thread::yield_now();
    }
    release.send(()).unwrap();
    let stats = prefetch.join().unwrap();
    let (pulled, out) = pull.join().unwrap();
    assert_eq!(stats.rows.read_back, ids.len());
    assert_eq!(stats.rows.pinned, ids.len());
    assert_eq!(pulled.rows_waited, ids.len(), "{pulled:?}");
    assert_eq!(pulled.rows_read_back, 0);
    assert_eq!(
        store.reads.load(Ordering::SeqCst) - reads_before,
        ids.len(),
        "each row read from the store once"
    );
    // The pull saw the stored rows, not the initializer.
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(&out[k * 2..k * 2 + 2], &table.row(id).unwrap()[..2]);
    }
}

#[test]
fn pins_last_until_released_by_their_owner_or_their_deadline() {
    let (_store, engine) = spilled(400);
    let t = engine.table(1).unwrap();
    let first = evicted(&engine, 400, 30);
    let s = engine.prefetch(5, 0, 0, &[(1, &first)], 1000, 60).unwrap();
    assert_eq!((s.rows.read_back, s.rows.pinned), (30, 30));
    // Read-backs put the table over budget; eviction keeps every pinned row.
    engine.enforce_budget().unwrap();
    assert_eq!(t.len() as u64, BUDGET);
    assert!(first.iter().all(|&id| t.row(id).is_some()));
    // Another owner's prefetch releases nothing of owner 5.
    let second = evicted(&engine, 400, 10);
    let s = engine.prefetch(6, 0, 1, &[(1, &second)], 1000, 60).unwrap();
    assert_eq!((s.released, t.pinned_rows()), (0, 40));
    // Owner 5's next prefetch releases its lease 0 (its batch's push was acknowledged).
    let s = engine.prefetch(5, 1, 1, &[], 1000, 60).unwrap();
    assert_eq!((s.released, t.pinned_rows()), (1, 10));
    // Owner 6 never comes back: its pins end at the deadline, not before.
    assert_eq!(engine.expire_leases(1059), 0);
    assert_eq!(t.pinned_rows(), 10);
    assert_eq!(engine.expire_leases(1060), 1);
    assert_eq!((t.pinned_rows(), engine.leases()), (0, 0));
    // Unpinned, they are ordinary rows again: eviction may take any of them.
    let ids: Vec<u64> = (400..800).collect();
    engine.apply(1, &ids, &vec![0.5; ids.len() * 2]).unwrap();
    engine.enforce_budget().unwrap();
    assert_eq!(t.len() as u64, BUDGET);
}

#[test]
fn a_retried_prefetch_keeps_or_replaces_its_lease_and_pins_do_not_stack() {
    let (_store, engine) = spilled(400);
    let t = engine.table(1).unwrap();
    let ids = evicted(&engine, 400, 8);
    engine.prefetch(9, 3, 0, &[(1, &ids)], 0, 60).unwrap();
    // The retry finds the rows resident: it pins nothing more, and the first attempt's pins stay.
    let again = engine.prefetch(9, 3, 0, &[(1, &ids)], 0, 60).unwrap();
    assert_eq!(
        (again.released, again.rows.resident, again.rows.pinned),
        (0, 8, 0)
    );
    assert_eq!((t.pinned_rows(), engine.leases()), (8, 1));
    // A retry that does read rows back replaces the lease: pins never stack.
    let more = evicted(&engine, 400, 4);
    let third = engine.prefetch(9, 3, 0, &[(1, &more)], 0, 60).unwrap();
    assert_eq!((third.released, third.rows.pinned), (1, 4));
    assert_eq!((t.pinned_rows(), engine.leases()), (4, 1));
    engine.prefetch(9, 4, 4, &[], 0, 60).unwrap();
    assert_eq!((t.pinned_rows(), engine.leases()), (0, 0));
}

#[test]
fn bad_prefetches_are_refused_before_anything_is_pinned_or_released() {
    let (_store, engine) = spilled(400);
    let t = engine.table(1).unwrap();
    let ids = evicted(&engine, 400, 5);
    engine.prefetch(1, 0, 0, &[(1, &ids)], 0, 60).unwrap();
    let err = engine
        .prefetch(1, 1, 1, &[(1, &ids), (42, &ids)], 0, 60)
        .unwrap_err();
    assert!(matches!(err, EmbeddingError::UnknownTable(42)), "{err}");
    let many: Vec<u64> = (0..=BUDGET / 2).collect();
    let err = engine.prefetch(1, 1, 1, &[(1, &many)], 0, 60).unwrap_err();
    assert!(
        matches!(
            err,
            EmbeddingError::PrefetchTooLarge {
                table: 1,
                ids: 51,
                limit: 50
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("51 distinct ids for table 1"),
        "{err}"
    );
    // Duplicates count once: 50 distinct ids in 100 are within the limit.
    let dup: Vec<u64> = (0..BUDGET / 2).chain(0..BUDGET / 2).collect();
    assert!(t.check_prefetch(&dup).is_ok());
    // Neither refusal released lease 0 or pinned anything.
    assert_eq!((t.pinned_rows(), engine.leases()), (5, 1));
}

#[test]
fn tables_without_a_budget_take_any_prefetch_and_do_nothing() {
    let engine = Engine::open(Arc::new(MemStore::new())).unwrap();
    engine.register_table(TableConfig::new(1, "t", 2)).unwrap();
    let ids: Vec<u64> = (0..10_000).collect();
    let s = engine.prefetch(1, 0, 0, &[(1, &ids)], 0, 60).unwrap();
    assert_eq!(
        (s.rows.untiered, s.rows.pinned, engine.leases()),
        (10_000, 0, 0)
    );
}
