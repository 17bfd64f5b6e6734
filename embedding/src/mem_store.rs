//! [`MemStore`]: an in-memory [`Store`] on `BTreeMap`s, for tests and for servers that need no durability.
//!
//! "Reopening" a `MemStore` means building a new [`crate::Engine`] on the same `Arc<MemStore>`: its contents
//! outlive the engine, as a RocksDB directory would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use crate::batch::DirtyBatch;
use crate::error::StoreError;
use crate::store::{GetFn, MetaWrite, ScanFn, Store};

#[derive(Debug, Default)]
struct Inner {
    tables: BTreeMap<u32, BTreeMap<u64, Vec<u8>>>,
    meta: BTreeMap<String, Vec<u8>>,
}

/// An in-memory [`Store`].
#[derive(Debug, Default)]
pub struct MemStore {
    inner: RwLock<Inner>,
    fail_writes: AtomicBool,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fault injection for tests: while set, [`Store::write_rows`], [`Store::write_tables`] and
    /// [`Store::delete_rows`] fail with
    /// [`StoreError::Backend`] and change nothing.
    pub fn set_fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::Relaxed);
    }

    /// Rows stored for `table` (0 if the table does not exist).
    pub fn row_count(&self, table: u32) -> usize {
        self.inner
            .read()
            .tables
            .get(&table)
            .map_or(0, BTreeMap::len)
    }
}

impl Store for MemStore {
    fn ensure_table(&self, table: u32) -> Result<(), StoreError> {
        self.inner.write().tables.entry(table).or_default();
        Ok(())
    }

    fn write_sorted(
        &self,
        table: u32,
        rows: &mut crate::store::SortedRowsFn<'_>,
    ) -> Result<u64, StoreError> {
        crate::store::write_sorted_in_batches(self, table, rows)
    }

    fn write_rows(&self, table: u32, rows: &DirtyBatch, _sync: bool) -> Result<(), StoreError> {
        if self.fail_writes.load(Ordering::Relaxed) {
            return Err(StoreError::Backend {
                op: format!("write_rows table {table}"),
                detail: "injected failure".into(),
            });
        }
        let mut inner = self.inner.write();
        let t = inner
            .tables
            .get_mut(&table)
            .ok_or(StoreError::UnknownTable(table))?;
        for (id, bytes) in rows.iter() {
            t.insert(id, bytes.to_vec());
        }
        Ok(())
    }

    fn write_tables(
        &self,
        tables: &[(u32, &DirtyBatch)],
        meta: &[MetaWrite],
        _sync: bool,
    ) -> Result<(), StoreError> {
        if self.fail_writes.load(Ordering::Relaxed) {
            return Err(StoreError::Backend {
                op: format!(
                    "write_tables {:?}",
                    tables.iter().map(|t| t.0).collect::<Vec<_>>()
                ),
                detail: "injected failure".into(),
            });
        }
        let mut inner = self.inner.write();
        if let Some(&(table, _)) = tables.iter().find(|t| !inner.tables.contains_key(&t.0)) {
            return Err(StoreError::UnknownTable(table));
        }
        for (table, rows) in tables {
            let t = inner.tables.get_mut(table).expect("checked above");
            for (id, bytes) in rows.iter() {
                t.insert(id, bytes.to_vec());
            }
        }
        for m in meta {
            match &m.value {
                Some(v) => inner.meta.insert(m.key.clone(), v.clone()),
                None => inner.meta.remove(&m.key),
            };
        }
        Ok(())
    }

    fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), StoreError> {
        if self.fail_writes.load(Ordering::Relaxed) {
            return Err(StoreError::Backend {
                op: format!("delete_rows table {table}"),
                detail: "injected failure".into(),
            });
        }
        let mut inner = self.inner.write();
        let t = inner
            .tables
            .get_mut(&table)
            .ok_or(StoreError::UnknownTable(table))?;
        for id in ids {
            t.remove(id);
        }
        Ok(())
    }

    fn scan_rows(&self, table: u32, f: &mut ScanFn<'_>) -> Result<(), StoreError> {
        let inner = self.inner.read();
        let t = inner
            .tables
            .get(&table)
            .ok_or(StoreError::UnknownTable(table))?;
        for (&id, value) in t {
            f(id, value)?;
        }
        Ok(())
    }

    fn scan_ids(
        &self,
        table: u32,
        after: Option<u64>,
        limit: usize,
        out: &mut Vec<u64>,
    ) -> Result<(), StoreError> {
        let inner = self.inner.read();
        let t = inner
            .tables
            .get(&table)
            .ok_or(StoreError::UnknownTable(table))?;
        let from = match after {
            None => std::ops::Bound::Unbounded,
            Some(a) => std::ops::Bound::Excluded(a),
        };
        out.extend(
            t.range((from, std::ops::Bound::Unbounded))
                .map(|(&id, _)| id)
                .take(limit),
        );
        Ok(())
    }

    fn get_rows(&self, table: u32, ids: &[u64], f: &mut GetFn<'_>) -> Result<(), StoreError> {
        let inner = self.inner.read();
        let t = inner
            .tables
            .get(&table)
            .ok_or(StoreError::UnknownTable(table))?;
        for (i, id) in ids.iter().enumerate() {
            f(i, t.get(id).map(Vec::as_slice))?;
        }
        Ok(())
    }

    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner
            .write()
            .meta
            .insert(key.to_owned(), value.to_vec());
        Ok(())
    }

    fn delete_meta(&self, key: &str) -> Result<(), StoreError> {
        self.inner.write().meta.remove(key);
        Ok(())
    }

    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.inner.read().meta.get(key).cloned())
    }

    fn list_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let inner = self.inner.read();
        Ok(inner
            .meta
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn estimate_rows(&self, table: u32) -> Result<u64, StoreError> {
        let inner = self.inner.read();
        let t = inner
            .tables
            .get(&table)
            .ok_or(StoreError::UnknownTable(table))?;
        Ok(t.len() as u64)
    }

    /// Writes the contents into a fresh RocksDB database at `dir` (not a hard-link checkpoint: there are no
    /// files to link), so a snapshot of an in-memory server reads like any other. Holds the read lock
    /// throughout: writers wait, so the copy is consistent.
    fn checkpoint(&self, dir: &std::path::Path) -> Result<(), StoreError> {
        if dir.exists() {
            return Err(StoreError::Backend {
                op: format!("checkpoint {}", dir.display()),
                detail: "directory already exists".into(),
            });
        }
        #[cfg(not(feature = "rocksdb"))]
        return Err(StoreError::Backend {
            op: format!("checkpoint {}", dir.display()),
            detail: "this build has no RocksDB (embedding's `rocksdb` feature is off)".into(),
        });
        #[cfg(feature = "rocksdb")]
        checkpoint_to_rocksdb(&self.inner.read(), dir)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// [`MemStore`]'s checkpoint: its contents written into a fresh RocksDB database at `dir`.
#[cfg(feature = "rocksdb")]
fn checkpoint_to_rocksdb(inner: &Inner, dir: &std::path::Path) -> Result<(), StoreError> {
    let db = crate::RocksStore::open(dir)?;
    for (key, value) in &inner.meta {
        db.put_meta(key, value)?;
    }
    let mut batch = DirtyBatch::new();
    for (&table, rows) in &inner.tables {
        db.ensure_table(table)?;
        for (&id, value) in rows {
            if batch.len() >= crate::FLUSH_BATCH_ROWS || batch.row_bytes() != value.len() {
                if !batch.is_empty() {
                    db.write_rows(table, &batch, false)?;
                }
                batch.reset(value.len());
            }
            batch.push_bytes(id, value);
        }
        if !batch.is_empty() {
            db.write_rows(table, &batch, false)?;
        }
        batch.reset(0);
    }
    db.flush()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store_conformance::Harness;

    /// Reopening returns the same store: its contents persist like a directory's.
    struct MemHarness(Arc<MemStore>);

    impl Harness for MemHarness {
        fn open(&mut self) -> Arc<dyn Store> {
            self.0.clone()
        }
    }

    fn harness() -> MemHarness {
        MemHarness(Arc::new(MemStore::new()))
    }

    crate::store_conformance::store_conformance_tests!(harness());

    #[test]
    fn injected_write_failure() {
        let s = MemStore::new();
        s.ensure_table(1).unwrap();
        s.set_fail_writes(true);
        let mut b = DirtyBatch::new();
        b.reset(4);
        b.push_row(1, &[1.0]);
        assert!(matches!(
            s.write_rows(1, &b, false),
            Err(StoreError::Backend { .. })
        ));
        assert_eq!(s.row_count(1), 0);
        s.set_fail_writes(false);
        s.write_rows(1, &b, false).unwrap();
        assert_eq!(s.row_count(1), 1);
    }
}
