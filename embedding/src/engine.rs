//! [`Engine`]: the tables of one server over one [`Store`]: registration, recovery and dirty write-back.
//!
//! # Call order
//! 1. [`Engine::open`] on a store: every table whose config is in the store's metadata (`table/<id>`, JSON) is
//!    rebuilt and its rows are loaded (clean, not dirty).
//! 2. [`Engine::register_table`] for the tables the server should have (idempotent for an identical config).
//! 3. [`Engine::gather`] / [`Engine::apply`] from any number of threads; hot paths may keep the `Arc<Table>`
//!    from [`Engine::table`] to skip the table-map lookup.
//! 4. [`Engine::flush_dirty`] on a timer and at shutdown (DESIGN.md: "dirty rows are written back in batches on
//!    a timer"). Rows updated after the last flush are lost if the process dies: that is the durability
//!    contract of asynchronous training.
//!    For pushes that must be durable before they are acknowledged, [`Engine::persist`] writes the rows of
//!    the given ids right away with a synced write (the server's `durability = "sync"`).
//! 5. [`Engine::expire`] on a timer, with the caller's time in seconds, for tables with `ttl_secs`: deletes
//!    rows untouched for their TTL from the store, then from memory. It also sets the tables' logical clock,
//!    which stamps rows updated through [`Engine::apply`] (use [`Engine::apply_at`] to pass time per push).
//!    Rows recovered at open have no known last touch: their TTL starts at the first `expire` after open.
//! 6. With a memory budget ([`Engine::open_with_budget`]): [`Engine::enforce_budget`] on a timer (and whenever
//!    a table is far over budget) evicts cold rows to the store; gathers and applies read evicted rows back.
//!    Recovery loads at most the budget of each table; the rest is read back on demand.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::batch::DirtyBatch;
use crate::config::{AdmissionConfig, TableConfig};
use crate::error::{EmbeddingError, StoreError};
use crate::lease::{LeaseStats, Leases};
use crate::store::{MetaWrite, Store};
use crate::table::{ApplyStats, GatherStats, Table};

/// Rows per store write batch in [`Engine::flush_dirty`] (4096 rows of dim 16 with row-wise Adagrad are
/// 272 KiB: large enough to amortize a RocksDB write, small enough to bound the time any stripe waits).
pub const FLUSH_BATCH_ROWS: usize = 4096;

/// Dirty ids a sorted write-back ([`Engine::flush_dirty`], [`Store::write_sorted`]) holds at once: 4 Mi ids,
/// 32 MiB of ids (and the rows of one [`FLUSH_BATCH_ROWS`] chunk). A table with more dirty rows is written in
/// several sorted writes, so a write-back's memory does not grow with the table.
pub const SORTED_WRITE_ROWS: usize = 1 << 22;

/// [`SORTED_WRITE_ROWS`], and 1,000 in this crate's tests, so that their write-backs take several rounds.
const fn sorted_write_rows() -> usize {
    if cfg!(test) {
        1000
    } else {
        SORTED_WRITE_ROWS
    }
}

/// Metadata key prefix of table configs: `table/<id>`.
pub const TABLE_META_PREFIX: &str = "table/";

fn meta_key(table: u32) -> String {
    format!("{TABLE_META_PREFIX}{table}")
}

/// What [`Engine::flush_dirty`] wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlushStats {
    /// Rows written.
    pub rows: usize,
    /// Store writes: batches of rows ([`Store::write_rows`]), or sorted writes of up to [`SORTED_WRITE_ROWS`]
    /// rows of a table ([`Store::write_sorted`]).
    pub batches: usize,
    /// Row bytes written (keys not counted).
    pub bytes: usize,
}

/// What [`Engine::expire`] deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExpireStats {
    /// Rows deleted from memory (and from the store).
    pub rows_deleted: usize,
    /// Rows found expired (or chosen by a row cap) but touched again before their deletion from memory; they
    /// were deleted from the store, stay in memory dirty, and are written back by the next flush.
    pub rows_revived: usize,
    /// Rows deleted from memory and the store by a table's row cap ([`crate::EvictionConfig`]).
    pub rows_capped: usize,
}

/// What [`Engine::enforce_budget`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EvictStats {
    /// Rows dropped from memory (their current copy is in the store).
    pub rows_evicted: usize,
    /// Dirty victims written to the store before they were dropped.
    pub rows_written: usize,
    /// Row bytes written (keys not counted).
    pub bytes: usize,
}

/// The embedding tables of one server, backed by a [`Store`].
pub struct Engine {
    /// Memory budget in rows given to every table, if any.
    budget: Option<u64>,
    tables: RwLock<BTreeMap<u32, Arc<Table>>>,
    store: Arc<dyn Store>,
    /// Serializes flushes (so an older copy of a row is never written after a newer one) and holds the
    /// reusable batch buffer.
    flush: Mutex<DirtyBatch>,
    /// Read by every apply (one wire push holds it across its tables: [`crate::PushGuard`]); written by
    /// [`Engine::checkpoint`], so a snapshot never holds half of a push (`snapshot.rs`).
    pub(crate) push_gate: RwLock<()>,
    /// Admission and TTL given to tables registered without their own ([`Engine::set_table_policy`]).
    policy: RwLock<(Option<AdmissionConfig>, Option<u64>)>,
    /// Tables the policy is not given to ([`Engine::exempt_from_table_policy`]).
    policy_exempt: RwLock<Vec<u32>>,
    /// What an update may leave in a row, for every table ([`Engine::set_weight_guard`]).
    guard: RwLock<crate::WeightGuard>,
    /// Pins of prefetched rows ([`Engine::prefetch`], `lease.rs`).
    pub(crate) leases: Leases,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("tables", &self.tables.read().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Opens the engine on `store`, recovering every table whose config is in the store's metadata, with its
    /// rows. A stored row of the wrong length is a [`StoreError::CorruptValue`] naming table, id and lengths.
    pub fn open(store: Arc<dyn Store>) -> Result<Engine, EmbeddingError> {
        Engine::open_with_budget(store, None)
    }

    /// [`Engine::open`], giving every table (recovered or registered later) a memory budget of `budget_rows`
    /// rows (`>= 1`; see [`Table::with_budget`]). Recovery loads at most `budget_rows` rows per table (lowest
    /// ids first) and leaves the rest in the store, to be read back on a miss.
    pub fn open_with_budget(
        store: Arc<dyn Store>,
        budget_rows: Option<u64>,
    ) -> Result<Engine, EmbeddingError> {
        let budget = budget_rows.map(|b| b.max(1));
        let mut tables = BTreeMap::new();
        for (key, value) in store.list_meta(TABLE_META_PREFIX)? {
            let cfg = parse_config(&key, &value)?;
            let id = cfg.id;
            store.ensure_table(id)?;
            let table = make_table(cfg, budget, &store)?;
            load_rows(&*store, &table)?;
            tracing::info!(table = id, name = %table.config().name, rows = table.len(), "recovered table");
            tables.insert(id, Arc::new(table));
        }
        Ok(Engine {
            budget,
            tables: RwLock::new(tables),
            store,
            flush: Mutex::new(DirtyBatch::new()),
            push_gate: RwLock::new(()),
            policy: RwLock::new((None, None)),
            policy_exempt: RwLock::default(),
            guard: RwLock::new(crate::WeightGuard::default()),
            leases: Leases::default(),
        })
    }

    /// The store behind the engine.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Sets the admission filter and TTL (seconds) that [`Engine::register_table`] gives tables whose config
    /// has neither (a server's policy, for the tables whose registration leaves them to it).
    pub fn set_table_policy(&self, admission: Option<AdmissionConfig>, ttl_secs: Option<u64>) {
        *self.policy.write() = (admission, ttl_secs);
    }

    /// Registers table `table` as it is configured even when its config has no admission or TTL of its own:
    /// a table that must never lose a row or drop an update to the server's policy (a trainer's dense
    /// parameters and counters, `protocol::wire::dense::DENSE_TABLE`).
    pub fn exempt_from_table_policy(&self, table: u32) {
        let mut exempt = self.policy_exempt.write();
        if !exempt.contains(&table) {
            exempt.push(table);
        }
    }

    /// Sets what an update may leave in a row ([`crate::WeightGuard`]), for every table, recovered or
    /// registered later (default: refuse an update that would leave a non-finite value).
    pub fn set_weight_guard(&self, guard: crate::WeightGuard) {
        *self.guard.write() = guard;
        for t in self.tables.read().values() {
            t.set_weight_guard(guard);
        }
    }

    /// Adds a table and persists its config. Registering an identical config again is a no-op; a different
    /// config for a registered id is a [`EmbeddingError::TableConflict`] listing the differing fields.
    ///
    /// A config without admission and TTL gets the table policy's ([`Engine::set_table_policy`]). A table
    /// registered earlier under another policy keeps its admission and TTL (logged), so a changed server
    /// policy does not make trainers' registrations conflict after a restart.
    pub fn register_table(&self, cfg: TableConfig) -> Result<(), EmbeddingError> {
        self.register_table_within(cfg, None)
    }

    /// [`Engine::register_table`], refusing a new table ([`EmbeddingError::TooManyTables`]) when the engine
    /// already holds `max_tables`; checked under the tables' lock, so concurrent registrations cannot pass it
    /// together. Registering a table it already holds is never refused.
    pub fn register_table_within(
        &self,
        cfg: TableConfig,
        max_tables: Option<usize>,
    ) -> Result<(), EmbeddingError> {
        let from_policy = cfg.admission.is_none()
            && cfg.ttl_secs.is_none()
            && !self.policy_exempt.read().contains(&cfg.id);
        let cfg = if from_policy {
            let (admission, ttl_secs) = *self.policy.read();
            TableConfig {
                admission,
                ttl_secs,
                ..cfg
            }
        } else {
            cfg
        };
        cfg.validate()?;
        let mut tables = self.tables.write();
        if let Some(existing) = tables.get(&cfg.id) {
            let existing = existing.config();
            if *existing == cfg {
                return Ok(());
            }
            let same_but_policy = TableConfig {
                admission: existing.admission,
                ttl_secs: existing.ttl_secs,
                ..cfg.clone()
            } == *existing;
            if from_policy && same_but_policy {
                tracing::warn!(
                    table = cfg.id,
                    kept_admission = ?existing.admission,
                    kept_ttl_secs = ?existing.ttl_secs,
                    "table keeps the admission and TTL it was created with, not the server's current ones"
                );
                return Ok(());
            }
            return Err(EmbeddingError::TableConflict {
                table: cfg.id,
                differences: existing.differences(&cfg),
            });
        }
        if let Some(max) = max_tables.filter(|&max| tables.len() >= max) {
            return Err(EmbeddingError::TooManyTables {
                table: cfg.id,
                tables: tables.len(),
                max,
            });
        }
        let table = make_table(cfg, self.budget, &self.store)?;
        table.set_weight_guard(*self.guard.read());
        let cfg = table.config();
        // A validated config holds only finite floats, which serde_json always encodes.
        let json = serde_json::to_vec(cfg).expect("a validated TableConfig serializes");
        self.store.ensure_table(cfg.id)?;
        self.store.put_meta(&meta_key(cfg.id), &json)?;
        tracing::info!(table = cfg.id, name = %cfg.name, dim = cfg.dim, optimizer = ?cfg.optimizer, "registered table");
        tables.insert(cfg.id, Arc::new(table));
        Ok(())
    }

    /// The table with this id.
    pub fn table(&self, id: u32) -> Result<Arc<Table>, EmbeddingError> {
        self.tables
            .read()
            .get(&id)
            .cloned()
            .ok_or(EmbeddingError::UnknownTable(id))
    }

    /// [`Table::gather`] on table `table`.
    pub fn gather(&self, table: u32, ids: &[u64], out: &mut [f32]) -> Result<(), EmbeddingError> {
        self.table(table)?.gather(ids, out)
    }

    /// [`Table::gather_with_state`] on table `table`.
    pub fn gather_with_state(
        &self,
        table: u32,
        ids: &[u64],
        out: &mut [f32],
    ) -> Result<GatherStats, EmbeddingError> {
        self.table(table)?.gather_with_state(ids, out)
    }

    /// [`Table::gather_or_absent`] on table `table`.
    pub fn gather_or_absent(
        &self,
        table: u32,
        ids: &[u64],
        out: &mut [f32],
        absent: &mut Vec<usize>,
    ) -> Result<GatherStats, EmbeddingError> {
        self.table(table)?.gather_or_absent(ids, out, absent)
    }

    /// [`Table::gather_stats`] on table `table`.
    pub fn gather_stats(
        &self,
        table: u32,
        ids: &[u64],
        out: &mut [f32],
    ) -> Result<GatherStats, EmbeddingError> {
        self.table(table)?.gather_stats(ids, out)
    }

    /// [`Table::gather_bf16`] of table `table`: the stored bf16 weights of `ids`, without a conversion.
    pub fn gather_bf16(
        &self,
        table: u32,
        ids: &[u64],
        out: &mut [u16],
    ) -> Result<GatherStats, EmbeddingError> {
        self.table(table)?.gather_bf16(ids, out)
    }

    /// The memory budget of every table, in rows, if any.
    pub fn memory_budget_rows(&self) -> Option<u64> {
        self.budget
    }

    /// Whether some table has rows only in the store (evicted), so pulls and pushes may read the store.
    pub fn spilled(&self) -> bool {
        self.budget.is_some() && self.tables.read().values().any(|t| t.spilled())
    }

    /// Rows read back from the store over all tables since open.
    pub fn rows_read_back(&self) -> u64 {
        self.tables
            .read()
            .values()
            .map(|t| t.rows_read_back())
            .sum()
    }

    /// Rows in memory past the budget, summed over tables (0 without a budget): a cheap check for callers
    /// deciding whether to call [`Engine::enforce_budget`] now.
    pub fn rows_over_budget(&self) -> usize {
        self.tables
            .read()
            .values()
            .map(|t| t.rows_over_budget())
            .sum()
    }

    /// Evicts the coldest rows (CLOCK) of every table over its memory budget until it is back at the budget:
    /// dirty victims are written to the store in batches of at most [`FLUSH_BATCH_ROWS`] rows (not synced,
    /// like [`Engine::flush_dirty`]), then victims still clean are dropped and their slots freed. Runs under
    /// the flush lock. A failed write marks its rows dirty again, drops nothing of that batch, and returns the
    /// error. Without a budget, or under it, this is a few atomic loads.
    pub fn enforce_budget(&self) -> Result<EvictStats, EmbeddingError> {
        let mut stats = EvictStats::default();
        if self.budget.is_none() || self.rows_over_budget() == 0 {
            return Ok(stats);
        }
        let mut batch = self.flush.lock();
        let tables: Vec<Arc<Table>> = self.tables.read().values().cloned().collect();
        let mut victims = Vec::new();
        for table in tables {
            loop {
                let excess = table.rows_over_budget();
                if excess == 0 {
                    break;
                }
                victims.clear();
                if table.select_victims(excess.min(FLUSH_BATCH_ROWS), &mut victims, &mut batch) == 0
                {
                    break;
                }
                if !batch.is_empty() {
                    if let Err(e) = self.store.write_rows(table.id(), &batch, false) {
                        table.mark_dirty(batch.ids());
                        tracing::warn!(table = table.id(), rows = batch.len(), error = %e, "eviction write failed; rows stay");
                        return Err(e.into());
                    }
                    stats.rows_written += batch.len();
                    stats.bytes += batch.byte_len();
                }
                // The batch (if any) is in the store, the victims still in memory: a crash here loses nothing (each
                // victim's current value is stored or was never evicted).
                #[cfg(feature = "failpoints")]
                crate::failpoints::crash_point(crate::failpoints::EVICT_BEFORE_RELEASE);
                let removed = table.remove_evicted(&victims);
                stats.rows_evicted += removed;
                if removed == 0 {
                    break;
                }
            }
        }
        if stats.rows_evicted > 0 {
            tracing::debug!(
                rows = stats.rows_evicted,
                written = stats.rows_written,
                bytes = stats.bytes,
                "evicted rows over the memory budget"
            );
        }
        Ok(stats)
    }

    /// [`Table::apply`] on table `table`.
    pub fn apply(
        &self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
    ) -> Result<ApplyStats, EmbeddingError> {
        let _push = self.push_gate.read();
        self.table(table)?.apply(ids, grads)
    }

    /// [`Table::apply_at`] on table `table`: pushes at time `now` (seconds).
    pub fn apply_at(
        &self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
        now: u64,
    ) -> Result<ApplyStats, EmbeddingError> {
        let _push = self.push_gate.read();
        self.table(table)?.apply_at(ids, grads, now)
    }

    /// [`Table::store_rows`] on table `table`, under the push gate (a checkpoint holds all of these rows or
    /// none): a backup taking rows its primary computed.
    pub fn store_rows(
        &self,
        table: u32,
        ids: &[u64],
        rows: &[f32],
        now: u64,
    ) -> Result<usize, EmbeddingError> {
        let _push = self.push_gate.read();
        self.table(table)?.store_rows(ids, rows, now)
    }

    /// Sets the weights of `ids` in table `table` to `weights` (`dim` f32s per id), keeping each row's optimizer
    /// state (a row not held yet, in memory or the store, gets the table's initial state), stamped with `now`
    /// (seconds) and dirty: a trainer loading saved weights. No optimizer runs and no admission applies. Not
    /// atomic with a concurrent push of the same rows (either may win). Returns the rows written.
    pub fn write_weights(
        &self,
        table: u32,
        ids: &[u64],
        weights: &[f32],
        now: u64,
    ) -> Result<usize, EmbeddingError> {
        let t = self.table(table)?;
        let (dim, row_len) = (t.dim(), t.row_len());
        if weights.len() != ids.len() * dim {
            return Err(EmbeddingError::WrongLength {
                table,
                what: "weights",
                len: weights.len(),
                expected: ids.len() * dim,
                ids: ids.len(),
                dim,
            });
        }
        let mut rows = vec![0.0; ids.len() * row_len];
        t.gather_with_state(ids, &mut rows)?;
        for (row, w) in rows
            .chunks_exact_mut(row_len)
            .zip(weights.chunks_exact(dim))
        {
            row[..dim].copy_from_slice(w);
        }
        let _push = self.push_gate.read();
        t.store_rows(ids, &rows, now)?;
        Ok(ids.len())
    }

    /// Gives rows of `table` scores (`Table::score`: the table must evict by score; added or set as `mode`
    /// says) and returns how many of `ids` had a row in memory.
    pub fn score(
        &self,
        table: u32,
        ids: &[u64],
        scores: &[f32],
        mode: crate::ScoreMode,
    ) -> Result<usize, EmbeddingError> {
        self.table(table)?.score(ids, scores, mode)
    }

    /// Deletes the rows of every table with a TTL that were untouched for `ttl_secs` at `now_secs`, and of
    /// every table with a row cap the rows past it ([`Table::over_cap`]), first from the store (one atomic delete
    /// batch per table and kind), then from memory, and advances every table's logical clock to `now_secs`. Each
    /// table's pass runs under the push gate (read) and the flush lock, so a flush never rewrites a row this call
    /// deletes and a checkpoint sees a table's deletions all or none.
    /// A failed store delete leaves that table's rows in memory and returns the error. Deletions are not
    /// synced: like row writes, they are durable after the next [`Engine::flush_dirty`] ([`Store::flush`]).
    ///
    /// Cost: one pass over every slot of every table with a TTL, under each stripe lock in turn; for a table
    /// over its cap, one more pass to collect the counts and a selection (linear in its rows).
    pub fn expire(&self, now_secs: u64) -> Result<ExpireStats, EmbeddingError> {
        self.expire_telling(now_secs, &mut |_, _| {})
    }

    /// [`Engine::expire`], telling `deleting(table, ids)` the ids of each batch it deleted, once they are gone
    /// from the store and memory (rows revived meanwhile stayed, so a caller must treat them as "maybe
    /// deleted"): what the delta sync records, to send the deletions to serving (docs/serving.md, "Delta
    /// sync"). Told after the deletion, so whoever reads the record finds the rows gone (told before, a delta
    /// cut and answered in between sent them as rows, and nothing sent their deletion later); a table's batch is
    /// deleted and told under the push gate (read), so a checkpoint falls before or after all of it.
    pub fn expire_telling(
        &self,
        now_secs: u64,
        deleting: &mut dyn FnMut(u32, &[u64]),
    ) -> Result<ExpireStats, EmbeddingError> {
        let tables: Vec<Arc<Table>> = self.tables.read().values().cloned().collect();
        let mut stats = ExpireStats::default();
        for table in tables {
            // Each table's deletions and their record happen under the push gate, as a push's update and its
            // record do: a checkpoint (which takes the gate to copy the store and cut the delta sync) sees them
            // all or none, so a snapshot holding a row never has its deletion in the deltas it already covers.
            // Gate, then flush lock: the order every path takes them in.
            let _push = self.push_gate.read();
            let _flush = self.flush.lock();
            table.advance_clock(now_secs);
            let victims = table.over_cap(now_secs);
            if !victims.is_empty() {
                let ids: Vec<u64> = victims.iter().map(|v| v.0).collect();
                self.store.delete_rows(table.id(), &ids)?;
                let deleted = table.remove_capped(&victims);
                deleting(table.id(), &ids);
                stats.rows_revived += ids.len() - deleted;
                stats.rows_capped += deleted;
                tracing::debug!(table = table.id(), deleted, cap = ?table.cap_rows(), "rows past the cap");
            }
            let ids = table.expired(now_secs);
            if ids.is_empty() {
                continue;
            }
            self.store.delete_rows(table.id(), &ids)?;
            let deleted = table.remove_expired(&ids, now_secs);
            deleting(table.id(), &ids);
            // Revived rows were updated after `expired`, so they are dirty: the next flush restores them.
            stats.rows_revived += ids.len() - deleted;
            stats.rows_deleted += deleted;
            tracing::debug!(
                table = table.id(),
                deleted,
                revived = ids.len() - deleted,
                "expired rows"
            );
        }
        Ok(stats)
    }

    /// The smallest `limit` ids above `after` (all when `None`) with a row in table `table`, ascending: a
    /// page of a full scan of the table. Rows in memory and, for a table that evicted rows to the store
    /// ([`Table::spilled`]), rows there too; each id once. Cost: a pass over the table's memory
    /// ([`Table::ids_after`]) plus a seek in the store.
    pub fn scan_ids(
        &self,
        table: u32,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<u64>, EmbeddingError> {
        let t = self.table(table)?;
        let mut ids = Vec::new();
        t.ids_after(after, limit, &mut ids);
        if t.spilled() {
            // The smallest `limit` of the union are among the smallest `limit` of each part.
            self.store.scan_ids(table, after, limit, &mut ids)?;
            ids.sort_unstable();
            ids.dedup();
            ids.truncate(limit);
        }
        Ok(ids)
    }

    /// Every table, by id.
    pub(crate) fn tables_snapshot(&self) -> Vec<Arc<Table>> {
        self.tables.read().values().cloned().collect()
    }

    /// Number of registered tables.
    pub fn table_count(&self) -> usize {
        self.tables.read().len()
    }

    /// Whether a table with this id is registered.
    pub fn has_table(&self, id: u32) -> bool {
        self.tables.read().contains_key(&id)
    }

    /// Configs of all tables, by id.
    pub fn tables(&self) -> Vec<TableConfig> {
        self.tables
            .read()
            .values()
            .map(|t| t.config().clone())
            .collect()
    }

    /// Configs of all tables, by id, as they were registered: a table with exactly the admission and TTL of
    /// the table policy ([`Engine::set_table_policy`]) got them from it and is listed without them. What a
    /// server tells clients and passes to its backups and a reshard's destinations, which apply their own
    /// policy.
    pub fn registered_tables(&self) -> Vec<TableConfig> {
        let policy = *self.policy.read();
        let mut tables = self.tables();
        for cfg in &mut tables {
            if (cfg.admission, cfg.ttl_secs) == policy {
                (cfg.admission, cfg.ttl_secs) = (None, None);
            }
        }
        tables
    }

    /// Rows in memory over all tables.
    pub fn rows_total(&self) -> usize {
        self.tables.read().values().map(|t| t.len()).sum()
    }

    /// Estimated heap bytes of all tables ([`Table::memory_bytes`]).
    pub fn memory_bytes(&self) -> usize {
        self.tables.read().values().map(|t| t.memory_bytes()).sum()
    }

    /// Writes the rows that are dirty when the call starts, table by table (not synced), then calls
    /// [`Store::flush`]. A table without a memory budget is written in id order by [`Store::write_sorted`],
    /// at most [`SORTED_WRITE_ROWS`] rows a call (RocksDB takes them as sorted files, bypassing its write-ahead log and
    /// memtables: the periodic write-back of a large table was about half of a server's CPU through them,
    /// bench/figures/issue-44.md section 9); a table with a budget, whose evicted rows are read back mostly
    /// from the memtables, in store batches of [`FLUSH_BATCH_ROWS`] rows. Rows dirtied during the flush may
    /// or may not be included; they stay dirty for the next flush otherwise. If a write fails, its rows are
    /// marked dirty again and the error is returned. Concurrent calls run one after another.
    pub fn flush_dirty(&self) -> Result<FlushStats, EmbeddingError> {
        let mut batch = self.flush.lock();
        let tables: Vec<Arc<Table>> = self.tables.read().values().cloned().collect();
        let mut stats = FlushStats::default();
        let mut ids = Vec::new();
        for table in tables {
            if !table.has_budget() {
                // Bounded by the dirty count at the start, like the batches below, and at most
                // SORTED_WRITE_ROWS ids held at once (each round its own sorted write).
                let mut budget = table.dirty_len();
                while budget > 0 {
                    ids.clear();
                    let n = table.take_dirty_ids(sorted_write_rows().min(budget), &mut ids);
                    if n == 0 {
                        break;
                    }
                    budget = budget.saturating_sub(n);
                    let written = self.write_sorted(&table, &mut ids, &mut batch);
                    match written {
                        Ok((rows, bytes)) => {
                            stats.rows += rows;
                            stats.batches += 1;
                            stats.bytes += bytes;
                        }
                        Err(e) => {
                            table.mark_dirty(&ids);
                            tracing::warn!(table = table.id(), rows = ids.len(), error = %e, "write-back failed; rows stay dirty");
                            return Err(e.into());
                        }
                    }
                }
                continue;
            }
            // Bounded by the dirty count at the start, so steady updates cannot keep the flush going forever.
            let mut budget = table.dirty_len();
            while budget > 0 {
                let n = table.take_dirty(FLUSH_BATCH_ROWS.min(budget), &mut batch);
                if n == 0 {
                    break;
                }
                budget = budget.saturating_sub(n);
                if let Err(e) = self.store.write_rows(table.id(), &batch, false) {
                    table.mark_dirty(batch.ids());
                    tracing::warn!(table = table.id(), rows = n, error = %e, "write-back failed; rows stay dirty");
                    return Err(e.into());
                }
                stats.rows += n;
                stats.batches += 1;
                stats.bytes += batch.byte_len();
            }
        }
        self.store.flush()?;
        tracing::debug!(
            rows = stats.rows,
            batches = stats.batches,
            bytes = stats.bytes,
            "flushed dirty rows"
        );
        Ok(stats)
    }

    /// One sorted write of [`Engine::flush_dirty`]: sorts `ids` (taken dirty from `table`), copies their rows
    /// [`FLUSH_BATCH_ROWS`] at a time through `batch`, and hands them to [`Store::write_sorted`] in id order.
    /// Returns the rows written and their bytes.
    fn write_sorted(
        &self,
        table: &Table,
        ids: &mut [u64],
        batch: &mut DirtyBatch,
    ) -> Result<(usize, usize), StoreError> {
        ids.sort_unstable();
        let mut order: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        let rows = self.store.write_sorted(table.id(), &mut |put| {
            for chunk in ids.chunks(FLUSH_BATCH_ROWS) {
                // Rows come out stripe by stripe; the chunk's ids are ascending and above the last chunk's,
                // so sorting within it gives the store ascending ids.
                table.copy_rows(chunk, batch);
                order.clear();
                order.extend(0..batch.len());
                let batch_ids = batch.ids();
                order.sort_unstable_by_key(|&i| batch_ids[i]);
                for &i in &order {
                    put(batch_ids[i], batch.row(i))?;
                }
                bytes += batch.byte_len();
            }
            Ok(())
        })?;
        Ok((rows as usize, bytes))
    }
}

impl Engine {
    /// Lookahead prefetch ([`Table::prefetch`] on each table of `tables`, `(table, ids)` pairs): releases
    /// `owner`'s leases numbered below `release_below`, reads back the rows that live only in the store and
    /// pins the rows of every table under lease `(owner, lease)` until Unix time `now + pin_secs` at the
    /// latest ([`crate::lease`]). Every table is checked (known, ids within its pin limit) before anything is
    /// read or released. Blocks on store reads: call it off async workers.
    pub fn prefetch(
        &self,
        owner: u64,
        lease: u64,
        release_below: u64,
        tables: &[(u32, &[u64])],
        now: u64,
        pin_secs: u64,
    ) -> Result<LeaseStats, EmbeddingError> {
        let resolved = tables
            .iter()
            .map(|&(id, ids)| {
                let table = self.table(id)?;
                table.check_prefetch(ids)?;
                Ok((table, ids))
            })
            .collect::<Result<Vec<_>, EmbeddingError>>()?;
        self.leases
            .prefetch(resolved, owner, lease, release_below, now, pin_secs)
    }

    /// Releases every lease whose deadline (set by [`Engine::prefetch`]) is at or before Unix time `now`;
    /// returns how many.
    pub fn expire_leases(&self, now: u64) -> usize {
        self.leases.expire(now)
    }

    /// Prefetch leases held now.
    pub fn leases(&self) -> usize {
        self.leases.len()
    }

    /// Rows pinned by prefetches now, over all tables.
    pub fn pinned_rows(&self) -> usize {
        self.tables_snapshot().iter().map(|t| t.pinned_rows()).sum()
    }
}

impl Engine {
    /// Writes the current full rows (weights and optimizer state) of the given ids of each table to the store:
    /// the durability of a push in `sync` mode. All tables' rows go in one [`Store::write_tables`] call (one
    /// RocksDB WriteBatch), so a push touching several tables is stored all or nothing; with `sync`, it is
    /// synced. Ids not in memory (never created, or evicted: their latest copy is already in the store) are
    /// skipped, and with `sync` a [`Store::flush`] then makes evicted copies durable.
    ///
    /// Dirty flags are left alone, so the timer's [`Engine::flush_dirty`] rewrites these rows later (and
    /// retries them after a failed write here). Runs under the flush lock, so an older copy of a row never
    /// overwrites a newer one in the store. Returns the rows and row bytes written; `batches` counts the tables
    /// written, all in that one store write.
    pub fn persist(
        &self,
        tables: &[(u32, &[u64])],
        sync: bool,
    ) -> Result<FlushStats, EmbeddingError> {
        self.persist_with(tables, &[], sync)
    }

    /// [`Engine::persist`] with the metadata changes `meta` in the same atomic store write: a push's rows and
    /// the answer its retries get are durable together, or neither is.
    pub fn persist_with(
        &self,
        tables: &[(u32, &[u64])],
        meta: &[MetaWrite],
        sync: bool,
    ) -> Result<FlushStats, EmbeddingError> {
        let resolved = tables
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|&(id, ids)| Ok((self.table(id)?, ids)))
            .collect::<Result<Vec<_>, EmbeddingError>>()?;
        let _flush = self.flush.lock();
        let mut stats = FlushStats::default();
        let mut missing = 0;
        let mut batches = Vec::with_capacity(resolved.len());
        for (table, ids) in &resolved {
            let mut batch = DirtyBatch::new();
            missing += table.copy_rows(ids, &mut batch);
            if !batch.is_empty() {
                stats.rows += batch.len();
                stats.bytes += batch.byte_len();
                batches.push((table.id(), batch));
            }
        }
        if !batches.is_empty() || !meta.is_empty() {
            let parts: Vec<(u32, &DirtyBatch)> = batches.iter().map(|(t, b)| (*t, b)).collect();
            self.store
                .write_tables(&parts, meta, sync && missing == 0)?;
            stats.batches = batches.len();
        }
        if sync && (missing > 0 || (batches.is_empty() && meta.is_empty())) && !resolved.is_empty()
        {
            self.store.flush()?;
        }
        Ok(stats)
    }
}

/// Parses a `table/<id>` metadata entry; the id in the key must match the config's.
fn parse_config(key: &str, value: &[u8]) -> Result<TableConfig, EmbeddingError> {
    let corrupt = |detail: String| {
        EmbeddingError::Store(StoreError::CorruptMeta {
            key: key.to_owned(),
            detail,
        })
    };
    let key_id: u32 = key[TABLE_META_PREFIX.len()..]
        .parse()
        .map_err(|e| corrupt(format!("key does not end in a table id: {e}")))?;
    let cfg: TableConfig =
        serde_json::from_slice(value).map_err(|e| corrupt(format!("invalid table config: {e}")))?;
    if cfg.id != key_id {
        return Err(corrupt(format!("config has id {}", cfg.id)));
    }
    Ok(cfg)
}

fn make_table(
    cfg: TableConfig,
    budget: Option<u64>,
    store: &Arc<dyn Store>,
) -> Result<Table, EmbeddingError> {
    if let (Some(b), Some(e)) = (budget, &cfg.eviction) {
        // The capacity tier keeps rows past the budget on disk; a cap deletes rows past it: one table cannot
        // have both (and prefetch pins, which a cap must not delete, exist only with the tier).
        return Err(EmbeddingError::InvalidConfig {
            table: cfg.id,
            field: "eviction",
            value: format!("{e:?} on a server with a memory budget of {b} rows"),
            expected: "no row cap where the server keeps rows past its memory budget on disk \
                       (--memory-budget-rows): drop one of the two",
        });
    }
    match budget {
        Some(b) => Table::with_budget(cfg, b, store.clone()),
        None => Table::new(cfg),
    }
}

/// Loads the stored rows of `table` from `store`, checking value lengths; with a memory budget, only up to
/// the budget (the table is then marked spilled if rows were left in the store).
fn load_rows(store: &dyn Store, table: &Table) -> Result<(), EmbeddingError> {
    let id = table.id();
    let (codec, row_bytes) = (table.codec(), table.row_bytes());
    let (mut row, mut words) = (vec![0f32; table.row_len()], vec![0u32; codec.words()]);
    let mut failure = None;
    let scanned = store.scan_rows(id, &mut |row_id, bytes| {
        if bytes.len() != row_bytes {
            return Err(StoreError::CorruptValue {
                table: id,
                id: row_id,
                len: bytes.len(),
                expected: row_bytes,
            });
        }
        if table
            .memory_budget_rows()
            .is_some_and(|b| table.len() as u64 >= b)
        {
            table.mark_spilled();
            return Ok(());
        }
        codec.words_from_bytes(bytes, &mut words);
        codec.decode(&words, &mut row);
        table.load_row(row_id, &row).map_err(|e| {
            let detail = e.to_string();
            failure = Some(e);
            StoreError::Backend {
                op: format!("load table {id}"),
                detail,
            }
        })
    });
    match (scanned, failure) {
        (_, Some(e)) => Err(e),
        (Err(e), None) => Err(e.into()),
        (Ok(()), None) => Ok(()),
    }
}

#[cfg(test)]
mod tests;

mod remove;
