//! [`Store`]: the narrow interface between tables and their durable tier.
//!
//! This file never imports rocksdb (STYLE.md, "Crates and seams"): [`crate::RocksStore`] implements the trait
//! on RocksDB, [`crate::MemStore`] on `BTreeMap`s, and one conformance suite (`store_conformance.rs`) runs
//! against both.
//!
//! # Model
//! - Rows live per table; a key is a `u64` id, a value is the row's bytes (little-endian f32s). The store does
//!   not know row lengths: the engine checks them when it reads rows back and reports a wrong length as
//!   [`StoreError::CorruptValue`].
//! - Metadata is a flat map from string keys to bytes (table configs live under `table/<id>`).
//! - `write_rows` is atomic per call (one write batch), and so is `write_tables` over several tables and metadata changes. Writes with `sync = false` are durable after the next
//!   [`Store::flush`].
//! - Callbacks passed to `scan_rows` and `get_rows` must not call back into the store.

use crate::batch::DirtyBatch;
use crate::error::StoreError;

/// Callback of [`Store::scan_rows`]: called with each stored (id, value).
pub type ScanFn<'a> = dyn FnMut(u64, &[u8]) -> Result<(), StoreError> + 'a;

/// Callback of [`Store::get_rows`]: called with each requested index and its value, if stored.
pub type GetFn<'a> = dyn FnMut(usize, Option<&[u8]>) -> Result<(), StoreError> + 'a;

/// What [`Store::write_sorted`] calls with each row: `(id, stored row bytes)`.
pub type PutFn<'a> = dyn FnMut(u64, &[u8]) -> Result<(), StoreError> + 'a;

/// The rows of a [`Store::write_sorted`]: called once, it passes each row to the [`PutFn`] it is given, in
/// strictly ascending id order, and returns the first error the [`PutFn`] gave it (or its own).
pub type SortedRowsFn<'a> = dyn FnMut(&mut PutFn<'_>) -> Result<(), StoreError> + 'a;

/// A metadata change written with rows in one [`Store::write_tables`] batch: `Some` sets `key` to the value,
/// `None` deletes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaWrite {
    /// The metadata key.
    pub key: String,
    /// Its new value, or `None` to delete it.
    pub value: Option<Vec<u8>>,
}

/// Durable storage of table rows and metadata. Implementations are shared across threads (`Arc<dyn Store>`).
pub trait Store: Send + Sync {
    /// Creates the storage of `table` if it does not exist yet (idempotent).
    fn ensure_table(&self, table: u32) -> Result<(), StoreError>;

    /// Writes every row of `rows` to `table` atomically, overwriting existing ids; `sync` makes the write
    /// durable before returning. Fails with [`StoreError::UnknownTable`] if `table` was never ensured.
    fn write_rows(&self, table: u32, rows: &DirtyBatch, sync: bool) -> Result<(), StoreError>;

    /// Writes the rows of several tables (`(table, rows)` pairs) and the metadata changes `meta` as one atomic
    /// write, all or nothing: one push touching several tables in `sync` durability, with its answer
    /// ([`crate::Engine::persist_with`]). `sync` makes the write durable before returning. Fails with
    /// [`StoreError::UnknownTable`], writing nothing, if any table was never ensured. [`crate::RocksStore`]
    /// uses one WriteBatch across column families and [`crate::MemStore`] one lock; this default (for wrappers
    /// and test doubles) writes table by table with [`Store::write_rows`] (syncing the last), then the
    /// metadata (then flushing when `sync`), which is not atomic.
    fn write_tables(
        &self,
        tables: &[(u32, &DirtyBatch)],
        meta: &[MetaWrite],
        sync: bool,
    ) -> Result<(), StoreError> {
        let last = tables.len().saturating_sub(1);
        for (k, (table, rows)) in tables.iter().enumerate() {
            self.write_rows(*table, rows, sync && k == last && meta.is_empty())?;
        }
        for m in meta {
            match &m.value {
                Some(v) => self.put_meta(&m.key, v)?,
                None => self.delete_meta(&m.key)?,
            }
        }
        if sync && !meta.is_empty() {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes many rows of `table` at once, overwriting existing ids: the write-back of a table's dirty rows
    /// ([`crate::Engine::flush_dirty`]). `rows` produces them in strictly ascending id order; a row out of
    /// order fails the write with [`StoreError::Backend`] naming both ids. Returns the number of rows written.
    /// Durable after the next [`Store::flush`]. [`crate::RocksStore`] writes them into sorted files beside the
    /// database and ingests those (no write-ahead log, no memtable, no memtable flush: the rows reach the
    /// on-disk levels directly), all or nothing; [`crate::MemStore`] uses [`write_sorted_in_batches`]. No
    /// default: a wrapper that kept one would silently lose its inner store's way of writing.
    fn write_sorted(&self, table: u32, rows: &mut SortedRowsFn<'_>) -> Result<u64, StoreError>;

    /// Deletes the rows of `ids` from `table` atomically (one write batch); ids without a stored row are
    /// ignored. Durable after the next [`Store::flush`]. Fails with [`StoreError::UnknownTable`] if `table` was
    /// never ensured.
    fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), StoreError>;

    /// Calls `f(id, value)` for every row of `table`, in increasing id order. The first error (from `f` or the
    /// store) stops the scan and is returned.
    fn scan_rows(&self, table: u32, f: &mut ScanFn<'_>) -> Result<(), StoreError>;

    /// Appends to `out` the smallest `limit` ids of `table` above `after` (all when `None`), ascending: a page
    /// of a full scan. This default walks [`Store::scan_rows`] from the first row; [`crate::RocksStore`] and
    /// [`crate::MemStore`] seek to `after` and stop after `limit` ids. Wrappers forward it.
    fn scan_ids(
        &self,
        table: u32,
        after: Option<u64>,
        limit: usize,
        out: &mut Vec<u64>,
    ) -> Result<(), StoreError> {
        let start = out.len();
        self.scan_rows(table, &mut |id, _| {
            if after.is_none_or(|a| id > a) && out.len() - start < limit {
                out.push(id);
            }
            Ok(())
        })
    }

    /// Reads the rows of `ids` in one batch: calls `f(i, value)` for each `ids[i]`, in order, with `None` for
    /// ids that have no stored row.
    fn get_rows(&self, table: u32, ids: &[u64], f: &mut GetFn<'_>) -> Result<(), StoreError>;

    /// Sets a metadata entry.
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;

    /// Deletes a metadata entry (nothing if absent), durable after the next [`Store::flush`].
    fn delete_meta(&self, key: &str) -> Result<(), StoreError>;

    /// Reads a metadata entry.
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// All metadata entries whose key starts with `prefix`, sorted by key.
    fn list_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;

    /// Makes every earlier write durable.
    fn flush(&self) -> Result<(), StoreError>;

    /// Writes a consistent copy of the whole store (rows and metadata) as a RocksDB database into `dir`, which
    /// must not exist yet (its parent must). [`crate::RocksStore`] takes a RocksDB checkpoint (SST files
    /// hard-linked on the same filesystem); [`crate::MemStore`] writes its contents into a fresh RocksDB
    /// database. Callers quiesce writers first ([`crate::Engine::checkpoint`]). Stores without snapshots keep
    /// this default, which fails with [`StoreError::Backend`].
    fn checkpoint(&self, dir: &std::path::Path) -> Result<(), StoreError> {
        Err(StoreError::Backend {
            op: format!("checkpoint {}", dir.display()),
            detail: "this store does not support checkpoints".into(),
        })
    }

    /// Rows of `table` in the store: exact for in-memory stores, RocksDB's estimate (`estimate-num-keys`,
    /// which counts overwritten keys until compaction) for RocksDB. For gauges, not for logic.
    fn estimate_rows(&self, table: u32) -> Result<u64, StoreError>;

    /// Memory the store holds outside the tables' rows, for gauges and for checking `ps-server plan`. Stores
    /// that keep nothing of their own (or cannot tell) keep this default: zeros.
    fn memory_usage(&self) -> StoreMemory {
        StoreMemory::default()
    }
}

/// A [`Store::write_sorted`] through [`Store::write_rows`]: [`crate::FLUSH_BATCH_ROWS`] rows at a time, each
/// batch atomic, not the whole.
pub fn write_sorted_in_batches<S: Store + ?Sized>(
    store: &S,
    table: u32,
    rows: &mut SortedRowsFn<'_>,
) -> Result<u64, StoreError> {
    let mut batch = DirtyBatch::new();
    let mut written = 0u64;
    let mut last: Option<u64> = None;
    rows(&mut |id, bytes| {
        check_ascending(table, last, id)?;
        last = Some(id);
        if batch.row_bytes() != bytes.len() {
            if !batch.is_empty() {
                store.write_rows(table, &batch, false)?;
                written += batch.len() as u64;
            }
            batch.reset(bytes.len());
        }
        batch.push_bytes(id, bytes);
        if batch.len() >= crate::FLUSH_BATCH_ROWS {
            store.write_rows(table, &batch, false)?;
            written += batch.len() as u64;
            batch.reset(bytes.len());
        }
        Ok(())
    })?;
    if !batch.is_empty() {
        store.write_rows(table, &batch, false)?;
        written += batch.len() as u64;
    }
    Ok(written)
}

/// The check every [`Store::write_sorted`] makes of each id: strictly above the one before it (`last`).
pub(crate) fn check_ascending(table: u32, last: Option<u64>, id: u64) -> Result<(), StoreError> {
    match last {
        Some(prev) if id <= prev => Err(StoreError::Backend {
            op: format!("write_sorted table {table}"),
            detail: format!(
                "row {id} after row {prev}: rows must come in strictly ascending id order"
            ),
        }),
        _ => Ok(()),
    }
}

/// Memory of a [`Store`] ([`Store::memory_usage`]), bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreMemory {
    /// Memtables, flushed or not (RocksDB's `cur-size-all-mem-tables`, over all column families).
    pub memtables: u64,
    /// Blocks in the block cache, index and filter blocks included.
    pub block_cache: u64,
    /// Table readers outside the block cache (`estimate-table-readers-mem`).
    pub table_readers: u64,
}
