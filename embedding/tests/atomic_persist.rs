//! Issue 3, "durability sync": a push touching several tables is written in one atomic store write
//! (`Store::write_tables`, one RocksDB WriteBatch) before its acknowledgement, all or nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use embedding::{
    DirtyBatch, Engine, GetFn, MemStore, MetaWrite, RocksStore, ScanFn, Store, StoreError,
    TableConfig,
};

/// A [`MemStore`] that records how rows were written.
#[derive(Default)]
struct Recording {
    inner: MemStore,
    write_rows: AtomicUsize,
    /// Tables of each `write_tables` call, and whether it was synced.
    write_tables: Mutex<Vec<(Vec<u32>, bool)>>,
}

impl Store for Recording {
    fn ensure_table(&self, table: u32) -> Result<(), StoreError> {
        self.inner.ensure_table(table)
    }
    fn write_rows(&self, table: u32, rows: &DirtyBatch, sync: bool) -> Result<(), StoreError> {
        self.write_rows.fetch_add(1, Ordering::Relaxed);
        self.inner.write_rows(table, rows, sync)
    }
    fn write_tables(
        &self,
        tables: &[(u32, &DirtyBatch)],
        meta: &[MetaWrite],
        sync: bool,
    ) -> Result<(), StoreError> {
        self.write_tables
            .lock()
            .unwrap()
            .push((tables.iter().map(|t| t.0).collect(), sync));
        self.inner.write_tables(tables, meta, sync)
    }
    fn write_sorted(
        &self,
        table: u32,
        rows: &mut embedding::SortedRowsFn<'_>,
    ) -> Result<u64, StoreError> {
        embedding::write_sorted_in_batches(self, table, rows)
    }
    fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), StoreError> {
        self.inner.delete_rows(table, ids)
    }
    fn scan_rows(&self, table: u32, f: &mut ScanFn<'_>) -> Result<(), StoreError> {
        self.inner.scan_rows(table, f)
    }
    fn get_rows(&self, table: u32, ids: &[u64], f: &mut GetFn<'_>) -> Result<(), StoreError> {
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

fn two_tables(engine: &Engine) {
    engine.register_table(TableConfig::new(1, "a", 4)).unwrap();
    engine.register_table(TableConfig::new(2, "b", 8)).unwrap();
}

#[test]
fn sync_persist_of_two_tables_is_one_synced_store_write() {
    let store = Arc::new(Recording::default());
    let engine = Engine::open(store.clone()).unwrap();
    two_tables(&engine);
    let (a, b) = ([1u64, 2, 3], [10u64, 20]);
    engine.apply(1, &a, &[0.5; 12]).unwrap();
    engine.apply(2, &b, &[0.25; 16]).unwrap();
    let stats = engine
        .persist(&[(1, &a[..]), (2, &b[..]), (1, &[][..])], true)
        .unwrap();
    assert_eq!((stats.rows, stats.batches), (5, 2));
    assert_eq!(
        *store.write_tables.lock().unwrap(),
        vec![(vec![1, 2], true)]
    );
    assert_eq!(store.write_rows.load(Ordering::Relaxed), 0);
    assert_eq!((store.inner.row_count(1), store.inner.row_count(2)), (3, 2));
}

/// Rows of `ids` with row length `len`.
fn batch(ids: &[u64], len: usize) -> DirtyBatch {
    let mut b = DirtyBatch::new();
    b.reset(len * 4);
    for &id in ids {
        b.push_row(id, &vec![id as f32; len]);
    }
    b
}

fn all_or_nothing(store: &dyn Store) -> Result<(), StoreError> {
    store.ensure_table(1)?;
    let (a, b) = (batch(&[1, 2], 5), batch(&[7], 9));
    // Table 2 was never ensured: nothing is written, not even table 1's rows.
    let err = store
        .write_tables(&[(1, &a), (2, &b)], &[], true)
        .unwrap_err();
    assert!(matches!(err, StoreError::UnknownTable(2)), "{err}");
    let mut found = 0;
    store.get_rows(1, &[1, 2], &mut |_, v| {
        found += usize::from(v.is_some());
        Ok(())
    })?;
    assert_eq!(found, 0, "a failed multi-table write left rows behind");
    store.ensure_table(2)?;
    store.write_tables(&[(1, &a), (2, &b)], &[], true)
}

#[test]
fn write_tables_is_all_or_nothing_in_memory() {
    let store = MemStore::new();
    all_or_nothing(&store).unwrap();
    assert_eq!((store.row_count(1), store.row_count(2)), (2, 1));
    store.set_fail_writes(true);
    assert!(store
        .write_tables(&[(1, &batch(&[3], 5))], &[], false)
        .is_err());
    assert_eq!(store.row_count(1), 2);
}

#[test]
fn write_tables_is_all_or_nothing_in_rocksdb_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    all_or_nothing(&RocksStore::open(dir.path()).unwrap()).unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let mut rows = Vec::new();
    for (table, ids) in [(1u32, &[1u64, 2][..]), (2, &[7][..])] {
        store
            .get_rows(table, ids, &mut |_, v| {
                rows.push(v.map(<[u8]>::len));
                Ok(())
            })
            .unwrap();
    }
    assert_eq!(rows, vec![Some(20), Some(20), Some(36)]);
}

#[test]
fn persisted_multi_table_push_is_recovered_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = ([5u64, 6], [9u64]);
    let expected;
    {
        let engine = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
        two_tables(&engine);
        engine.apply(1, &a, &[0.5; 8]).unwrap();
        engine.apply(2, &b, &[0.25; 8]).unwrap();
        engine.persist(&[(1, &a[..]), (2, &b[..])], true).unwrap();
        expected = (
            engine.table(1).unwrap().row(5).unwrap(),
            engine.table(2).unwrap().row(9).unwrap(),
        );
        // Dropped without flush_dirty: only the persisted write is in RocksDB.
    }
    let engine = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
    assert_eq!(engine.table(1).unwrap().row(5).unwrap(), expected.0);
    assert_eq!(engine.table(2).unwrap().row(9).unwrap(), expected.1);
}
