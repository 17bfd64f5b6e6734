//! Write-back of dirty rows to RocksDB (on a timer, on a flush request, and at shutdown), eviction of cold rows
//! under a memory budget, expiry of rows past their TTL, and the timing of read-backs ([`MeteredStore`]): each
//! an engine call with its metrics. The timers that call them run in [`crate::server`]; what a failed write
//! means for the server is recorded by [`crate::shard::Shard`].
//!
//! Rows are written in WriteBatches by [`embedding::Engine::flush_dirty`]; losses after a crash are bounded by
//! the timer's interval (DESIGN.md, "RocksDB"). That is [`crate::config::Durability::Periodic`], the default;
//! `none` turns the timer and the shutdown write-back off (loss bound: everything), and `sync` additionally
//! writes each push's rows with a synced write before acknowledging it ([`crate::shard::Shard::persist_synced`]).

use std::time::Instant;

use embedding::{
    DirtyBatch, EmbeddingError, Engine, EvictStats, ExpireStats, FlushStats, GetFn, ScanFn, Store,
    StoreError, StoreMemory,
};

use crate::metrics as m;

/// Writes every dirty row now, recording metrics, and refreshes the memory gauges.
pub fn flush(engine: &Engine) -> Result<FlushStats, EmbeddingError> {
    let start = Instant::now();
    let result = engine.flush_dirty();
    match &result {
        Ok(stats) => {
            metrics::histogram!(m::WRITEBACK_SECONDS).record(start.elapsed().as_secs_f64());
            metrics::counter!(m::WRITEBACK_ROWS_TOTAL).increment(stats.rows as u64);
            metrics::counter!(m::WRITEBACK_BATCHES_TOTAL).increment(stats.batches as u64);
            if stats.rows > 0 {
                tracing::debug!(
                    rows = stats.rows,
                    batches = stats.batches,
                    bytes = stats.bytes,
                    "wrote back dirty rows"
                );
            }
        }
        Err(e) => {
            metrics::counter!(m::WRITEBACK_ERRORS_TOTAL).increment(1);
            tracing::error!(error = %e, "write-back of dirty rows failed");
        }
    }
    update_gauges(engine);
    result
}

/// Evicts rows of tables over their memory budget ([`Engine::enforce_budget`]), recording metrics.
pub fn enforce_budget(engine: &Engine) -> Result<EvictStats, EmbeddingError> {
    let result = engine.enforce_budget();
    match &result {
        Ok(stats) => {
            metrics::counter!(m::EVICTIONS_TOTAL).increment(stats.rows_evicted as u64);
            metrics::counter!(m::EVICTION_WRITES_TOTAL).increment(stats.rows_written as u64);
        }
        Err(e) => {
            metrics::counter!(m::WRITEBACK_ERRORS_TOTAL).increment(1);
            tracing::error!(error = %e, "eviction of rows over the memory budget failed");
        }
    }
    result
}

/// A [`Store`] that times batched reads: the engine's only `get_rows` calls are read-backs of evicted rows,
/// so this is where `ps_readback_*` are measured (the engine reads no clock).
pub struct MeteredStore<S>(pub S);

impl<S: Store> Store for MeteredStore<S> {
    fn ensure_table(&self, table: u32) -> Result<(), StoreError> {
        self.0.ensure_table(table)
    }
    fn write_rows(&self, table: u32, rows: &DirtyBatch, sync: bool) -> Result<(), StoreError> {
        self.0.write_rows(table, rows, sync)
    }
    fn write_tables(
        &self,
        tables: &[(u32, &DirtyBatch)],
        meta: &[embedding::MetaWrite],
        sync: bool,
    ) -> Result<(), StoreError> {
        self.0.write_tables(tables, meta, sync)
    }
    fn write_sorted(
        &self,
        table: u32,
        rows: &mut embedding::SortedRowsFn<'_>,
    ) -> Result<u64, StoreError> {
        self.0.write_sorted(table, rows)
    }
    fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), StoreError> {
        self.0.delete_rows(table, ids)
    }
    fn scan_rows(&self, table: u32, f: &mut ScanFn<'_>) -> Result<(), StoreError> {
        self.0.scan_rows(table, f)
    }
    fn scan_ids(
        &self,
        table: u32,
        after: Option<u64>,
        limit: usize,
        out: &mut Vec<u64>,
    ) -> Result<(), StoreError> {
        self.0.scan_ids(table, after, limit, out)
    }
    fn get_rows(&self, table: u32, ids: &[u64], f: &mut GetFn<'_>) -> Result<(), StoreError> {
        let start = Instant::now();
        let mut found = 0u64;
        let result = self.0.get_rows(table, ids, &mut |i, v| {
            found += u64::from(v.is_some());
            f(i, v)
        });
        metrics::histogram!(m::READBACK_SECONDS).record(start.elapsed().as_secs_f64());
        metrics::counter!(m::READBACK_ROWS_TOTAL).increment(found);
        result
    }
    fn memory_usage(&self) -> StoreMemory {
        self.0.memory_usage()
    }
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.0.put_meta(key, value)
    }
    fn delete_meta(&self, key: &str) -> Result<(), StoreError> {
        self.0.delete_meta(key)
    }
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get_meta(key)
    }
    fn list_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.0.list_meta(prefix)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.0.flush()
    }
    fn checkpoint(&self, dir: &std::path::Path) -> Result<(), StoreError> {
        self.0.checkpoint(dir)
    }
    fn estimate_rows(&self, table: u32) -> Result<u64, StoreError> {
        self.0.estimate_rows(table)
    }
}

/// Sets the rows-in-memory and memory-bytes gauges.
pub fn update_gauges(engine: &Engine) {
    for cfg in engine.tables() {
        if let Ok(t) = engine.table(cfg.id) {
            metrics::gauge!(m::ROWS_IN_MEMORY, "table" => cfg.name.clone()).set(t.len() as f64);
        }
        if let Ok(rows) = engine.store().estimate_rows(cfg.id) {
            metrics::gauge!(m::ROWS_ON_DISK, "table" => cfg.name.clone()).set(rows as f64);
        }
    }
    metrics::gauge!(m::MEMORY_BYTES).set(engine.memory_bytes() as f64);
    let store = engine.store().memory_usage();
    for (kind, bytes) in [
        ("memtables", store.memtables),
        ("block_cache", store.block_cache),
        ("table_readers", store.table_readers),
    ] {
        metrics::gauge!(m::ROCKSDB_MEMORY_BYTES, "kind" => kind).set(bytes as f64);
    }
    if let Some(rss) = resident_bytes() {
        metrics::gauge!(m::PROCESS_RESIDENT_BYTES).set(rss as f64);
    }
    for (kind, bytes) in allocator_stats() {
        metrics::gauge!(m::ALLOCATOR_BYTES, "kind" => kind).set(bytes as f64);
    }
}

/// jemalloc's statistics (refreshed by advancing its epoch), as `(kind, bytes)`; empty where jemalloc is not
/// linked or its statistics cannot be read.
pub fn allocator_stats() -> Vec<(&'static str, u64)> {
    #[cfg(target_os = "linux")]
    {
        use tikv_jemalloc_ctl::{epoch, stats};
        if epoch::advance().is_err() {
            return Vec::new();
        }
        let read = [
            ("allocated", stats::allocated::read()),
            ("active", stats::active::read()),
            ("resident", stats::resident::read()),
            ("metadata", stats::metadata::read()),
            ("retained", stats::retained::read()),
        ];
        read.into_iter()
            .filter_map(|(k, v)| v.ok().map(|v| (k, v as u64)))
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    Vec::new()
}

/// The process's resident set size (`VmRSS` of `/proc/self/status`), `None` where there is no procfs.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = kib.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Deletes rows untouched for their table's TTL and rows past their table's cap ([`Engine::expire_telling`]
/// at Unix time `now_secs`, each batch of ids told to `deleting` first), recording metrics and refreshing
/// the row gauges.
pub fn expire(
    engine: &Engine,
    now_secs: u64,
    deleting: &mut dyn FnMut(u32, &[u64]),
) -> Result<ExpireStats, EmbeddingError> {
    let start = Instant::now();
    let result = engine.expire_telling(now_secs, deleting);
    match &result {
        Ok(stats) => {
            metrics::histogram!(m::EXPIRE_SECONDS).record(start.elapsed().as_secs_f64());
            metrics::counter!(m::ROWS_EXPIRED_TOTAL).increment(stats.rows_deleted as u64);
            metrics::counter!(m::ROWS_CAPPED_TOTAL).increment(stats.rows_capped as u64);
            if stats.rows_capped > 0 {
                tracing::info!(
                    deleted = stats.rows_capped,
                    "deleted the least frequently updated rows past their tables' caps"
                );
            }
            if stats.rows_deleted > 0 {
                tracing::info!(
                    deleted = stats.rows_deleted,
                    revived = stats.rows_revived,
                    "expired rows past their TTL"
                );
            }
        }
        Err(e) => {
            metrics::counter!(m::WRITEBACK_ERRORS_TOTAL).increment(1);
            tracing::error!(error = %e, "expiry of rows past their TTL failed");
        }
    }
    update_gauges(engine);
    result
}
