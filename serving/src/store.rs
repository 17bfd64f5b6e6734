//! The embedding rows serving holds: one [`Engine`] per shard of the export's snapshot, on a private copy of
//! that shard's RocksDB (SST files hard-linked, so opening a large export costs little time or space), each
//! table with an optional memory budget: past it, cold rows stay on disk and are read back on a miss
//! (the capacity tier of the training servers, DESIGN.md "RocksDB").
//!
//! A shard directory without its RocksDB but with `tables.safetensors` (docs/serving.md, "Reading an export
//! without pstrain") is loaded from that file into a fresh database instead.
//!
//! Ids route to shards by the training cluster's [`ShardMap`], so a shard's rows stay where the snapshot put
//! them; an id no shard holds reads as its table's initializer, exactly as a pull from a training server
//! would. Delta syncs overwrite rows' weights ([`RowStore::apply_rows`]) and mark them dirty, so a row
//! evicted later is written back rather than dropped in favour of its stale copy on disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::compact::{CompactTable, ServePrecision};

use embedding::snapshot::tensors::{read_tables, write_rows_into, TABLES_FILE};
use embedding::snapshot::{parse_shard_dir_name, read_manifest, DB_DIR};
use embedding::{EmbeddingError, Engine, RocksStore, SnapshotError, StoreError};
use protocol::wire::dense::DENSE_TABLE;
use protocol::wire::message::sync::SyncedRows;
use protocol::{ShardMap, TableConfig};

/// Ids a sweep lists at a time ([`RowStore::sweep`]): the rows of a delta sync answer (`serving::sync`).
pub const SWEEP_PAGE: usize = 1 << 16;

/// A position in a scan's (table, id) order: before every id of the table (`None`) or at one id.
pub type ScanKey = (u32, Option<u64>);

/// Why the rows could not be opened or used. Messages name the path or the table.
#[derive(Debug, thiserror::Error)]
pub enum StoreOpenError {
    /// The snapshot directory lacks shards or holds inconsistent ones.
    #[error("snapshot {}: {reason}", path.display())]
    Snapshot {
        /// The snapshot directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A shard's manifest did not read.
    #[error(transparent)]
    Manifest(#[from] SnapshotError),
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// RocksDB refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The engine refused.
    #[error(transparent)]
    Engine(#[from] EmbeddingError),
    /// A shard's `tables.safetensors` did not read or does not fit its tables (named).
    #[error(transparent)]
    Tensors(#[from] embedding::tensors::TensorsError),
}

/// Every shard's rows: an [`Engine`] per shard (the default), or every table's rows at a serving precision
/// ([`crate::compact`], `--row-precision`).
pub struct RowStore {
    map: ShardMap,
    /// The engines of the shards; empty when `compact` holds the rows.
    shards: Vec<Engine>,
    /// The shard count of the export.
    num_shards: usize,
    /// Per table id, its rows at a serving precision, instead of engines.
    compact: Option<HashMap<u32, CompactTable>>,
    /// Per table id: (dim, row_len) of its stored rows.
    shapes: std::collections::HashMap<u32, (usize, usize)>,
}

impl std::fmt::Debug for RowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowStore")
            .field("shards", &self.num_shards)
            .field("rows", &self.rows_in_memory())
            .finish()
    }
}

impl RowStore {
    /// Opens the snapshot in `snapshot_dir` (`shard-<i>-of-<n>/` for every `i`), copying each shard's
    /// database into `data_dir/shard-<i>` (replacing what is there), with `budget_rows` rows of memory per
    /// table and shard. `tables` are the tables the export registered: a shard whose database lacks one gets
    /// it registered empty (its rows read as the initializer).
    pub fn open(
        snapshot_dir: &Path,
        data_dir: &Path,
        budget_rows: Option<u64>,
        tables: &[TableConfig],
    ) -> Result<RowStore, StoreOpenError> {
        let shard_dirs = list_shards(snapshot_dir)?;
        let n = shard_dirs.len() as u32;
        let mut shards = Vec::with_capacity(shard_dirs.len());
        for (i, dir) in shard_dirs.iter().enumerate() {
            check_shard(snapshot_dir, dir, i as u32, n)?;
            let dst = data_dir.join(format!("shard-{i}"));
            let tensors = dir.join(TABLES_FILE);
            if !dir.join(DB_DIR).exists() && tensors.is_file() {
                // An export kept as SafeTensors only (its RocksDB removed or never copied): the shard's rows are
                // loaded from `tables.safetensors` into a fresh database.
                load_tensors(&tensors, &dst)?;
            } else {
                link_copy(&dir.join(DB_DIR), &dst)?;
            }
            let engine = Engine::open_with_budget(Arc::new(RocksStore::open(&dst)?), budget_rows)?;
            for cfg in tables {
                if engine.table(cfg.id).is_err() {
                    engine.register_table(cfg.clone())?;
                }
            }
            shards.push(engine);
        }
        let shapes = shards[0]
            .tables()
            .iter()
            .map(|c| {
                let t = shards[0].table(c.id).expect("listed table");
                (c.id, (t.dim(), t.row_len()))
            })
            .collect();
        Ok(RowStore {
            map: ShardMap::new(n),
            shards,
            num_shards: n as usize,
            compact: None,
            shapes,
        })
    }

    /// Opens the snapshot in `snapshot_dir` as [`RowStore::open`] does, holding the weights of `tables` in
    /// memory at `precision` ([`crate::compact`]): no RocksDB copy, no optimizer state. Each shard's rows are
    /// streamed from its database (or its `tables.safetensors`) and encoded a page at a time.
    pub fn open_compact(
        snapshot_dir: &Path,
        precision: ServePrecision,
        tables: &[TableConfig],
    ) -> Result<RowStore, StoreOpenError> {
        const PAGE: usize = 4096;
        let shard_dirs = list_shards(snapshot_dir)?;
        let n = shard_dirs.len() as u32;
        let compact: HashMap<u32, CompactTable> = tables
            .iter()
            .filter(|c| c.id != DENSE_TABLE)
            .map(|c| (c.id, CompactTable::new(c.clone(), precision)))
            .collect();
        for (i, dir) in shard_dirs.iter().enumerate() {
            check_shard(snapshot_dir, dir, i as u32, n)?;
            let tensors = dir.join(TABLES_FILE);
            if !dir.join(DB_DIR).exists() && tensors.is_file() {
                for t in read_tables(&tensors)? {
                    if let Some(c) = compact.get(&t.config.id) {
                        c.insert(&t.ids, &t.weights);
                    }
                }
                continue;
            }
            let snap = embedding::Snapshot::open(dir)?;
            for entry in &snap.manifest().tables {
                let Some(c) = compact.get(&entry.id) else {
                    continue;
                };
                let codec = entry.config.row_codec();
                let dim = entry.config.dim;
                let mut words = vec![0u32; codec.words()];
                let (mut ids, mut rows) =
                    (Vec::with_capacity(PAGE), Vec::with_capacity(PAGE * dim));
                snap.for_each_row(entry.id, &mut |id, bytes| {
                    codec.words_from_bytes(bytes, &mut words);
                    let at = rows.len();
                    rows.resize(at + dim, 0.0);
                    codec.decode(&words, &mut rows[at..]);
                    ids.push(id);
                    if ids.len() == PAGE {
                        c.insert(&ids, &rows);
                        ids.clear();
                        rows.clear();
                    }
                    Ok(())
                })?;
                c.insert(&ids, &rows);
            }
        }
        for c in compact.values() {
            c.shrink();
        }
        let shapes = compact
            .iter()
            .map(|(&id, c)| (id, (c.config().dim, c.config().dim)))
            .collect();
        Ok(RowStore {
            map: ShardMap::new(n),
            shards: Vec::new(),
            num_shards: n as usize,
            compact: Some(compact),
            shapes,
        })
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.num_shards
    }

    /// The compact table `table`, if the rows are held compactly (`Some(Err)`: no such table).
    fn compact_table(&self, table: u32) -> Option<Result<&CompactTable, EmbeddingError>> {
        self.compact
            .as_ref()
            .map(|c| c.get(&table).ok_or(EmbeddingError::UnknownTable(table)))
    }

    /// The row dimension of `table`, if the export has it.
    pub fn dim(&self, table: u32) -> Option<usize> {
        self.shapes.get(&table).map(|&(dim, _)| dim)
    }

    /// Copies the weights of `ids` of `table` into `out` (`ids.len() x dim`); ids without a row read as
    /// their initializer. `scratch` holds per-shard positions between calls.
    pub fn gather(
        &self,
        table: u32,
        ids: &[u64],
        out: &mut [f32],
        scratch: &mut GatherScratch,
    ) -> Result<(), EmbeddingError> {
        if let Some(t) = self.compact_table(table) {
            let t = t?;
            let expected = ids.len() * t.config().dim;
            if out.len() != expected {
                return Err(EmbeddingError::WrongLength {
                    table,
                    what: "output",
                    len: out.len(),
                    expected,
                    ids: ids.len(),
                    dim: t.config().dim,
                });
            }
            t.gather(ids, out);
            return Ok(());
        }
        if self.shards.len() == 1 {
            return self.shards[0].gather(table, ids, out);
        }
        let dim = self.dim(table).ok_or(EmbeddingError::UnknownTable(table))?;
        self.map.group(ids, &mut scratch.by_shard);
        for (s, positions) in scratch.by_shard.iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            scratch.ids.clear();
            scratch
                .ids
                .extend(positions.iter().map(|&p| ids[p as usize]));
            scratch.rows.resize(positions.len() * dim, 0.0);
            self.shards[s].gather(table, &scratch.ids, &mut scratch.rows)?;
            for (k, &p) in positions.iter().enumerate() {
                let p = p as usize;
                out[p * dim..(p + 1) * dim].copy_from_slice(&scratch.rows[k * dim..(k + 1) * dim]);
            }
        }
        Ok(())
    }

    /// Overwrites the weights of `ids` of `table` with `rows` (`ids.len() x dim`): a delta sync. The rows'
    /// optimizer state, which serving never uses, is zeroed.
    pub fn apply_rows(&self, table: u32, ids: &[u64], rows: &[f32]) -> Result<(), EmbeddingError> {
        let (dim, row_len) = *self
            .shapes
            .get(&table)
            .ok_or(EmbeddingError::UnknownTable(table))?;
        if rows.len() != ids.len() * dim {
            return Err(EmbeddingError::WrongLength {
                table,
                what: "delta rows",
                len: rows.len(),
                expected: ids.len() * dim,
                ids: ids.len(),
                dim,
            });
        }
        if let Some(t) = self.compact_table(table) {
            t?.insert(ids, rows);
            return Ok(());
        }
        let mut full = vec![0.0f32; row_len];
        let mut touched: Vec<Vec<u64>> = vec![Vec::new(); self.shards.len()];
        for (i, &id) in ids.iter().enumerate() {
            let s = self.map.server_of(id) as usize;
            full[..dim].copy_from_slice(&rows[i * dim..(i + 1) * dim]);
            self.shards[s].table(table)?.load_row(id, &full)?;
            touched[s].push(id);
        }
        for (s, ids) in touched.iter().enumerate() {
            if !ids.is_empty() {
                self.shards[s].table(table)?.mark_dirty(ids);
            }
        }
        Ok(())
    }

    /// Deletes the rows of `ids` of `table` from memory and disk (a delta's deletions: the training servers
    /// no longer hold them), so they read as their initializer.
    pub fn delete_rows(&self, table: u32, ids: &[u64]) -> Result<(), EmbeddingError> {
        if let Some(t) = self.compact_table(table) {
            t?.remove(ids);
            return Ok(());
        }
        let mut by_shard: Vec<Vec<u64>> = vec![Vec::new(); self.shards.len()];
        for &id in ids {
            by_shard[self.map.server_of(id) as usize].push(id);
        }
        for (s, ids) in by_shard.iter().enumerate() {
            if !ids.is_empty() {
                self.shards[s].remove_rows(table, ids)?;
            }
        }
        Ok(())
    }

    /// Deletes the rows shard `shard` holds in the (table, id) range a scan page covers, after `from` up to
    /// and including `to` (`None`: to the end), that the page's `listed` rows do not name: the training
    /// server no longer holds them (protocol::wire::message::sync, "Payload of `Deltas`"). Returns how many.
    /// Costs what the server's page cost: one pass over each table's rows in memory per [`SWEEP_PAGE`] ids
    /// held in the range (a server's scan page holds at most that many rows, so usually one).
    pub fn sweep(
        &self,
        shard: usize,
        from: ScanKey,
        to: Option<ScanKey>,
        listed: &[SyncedRows],
    ) -> Result<usize, EmbeddingError> {
        let in_range =
            |t: u32, id: u64| (t, Some(id)) > from && to.is_none_or(|to| (t, Some(id)) <= to);
        if let Some(compact) = &self.compact {
            let mut swept = 0;
            for (&t, c) in compact {
                let keep: &[u64] = listed.iter().find(|r| r.table == t).map_or(&[], |r| &r.ids);
                let victims = c.ids_where(|id| {
                    self.map.server_of(id) as usize == shard
                        && in_range(t, id)
                        && keep.binary_search(&id).is_err()
                });
                swept += c.remove(&victims);
            }
            return Ok(swept);
        }
        let engine = &self.shards[shard];
        let mut swept = 0;
        for cfg in engine.tables() {
            let t = cfg.id;
            if t == DENSE_TABLE || t < from.0 || to.is_some_and(|to| t > to.0) {
                continue;
            }
            // Ids of table `t` in the range: above `after`, at most `upper`.
            let mut after = if t == from.0 { from.1 } else { None };
            let upper = match to {
                Some((tt, a)) if tt == t => match a {
                    Some(a) => a,
                    None => continue,
                },
                _ => u64::MAX,
            };
            let keep: &[u64] = listed.iter().find(|r| r.table == t).map_or(&[], |r| &r.ids);
            loop {
                let ids = engine.scan_ids(t, after, SWEEP_PAGE)?;
                let Some(&last) = ids.last() else { break };
                let victims: Vec<u64> = ids
                    .iter()
                    .copied()
                    .filter(|&id| id <= upper && keep.binary_search(&id).is_err())
                    .collect();
                if !victims.is_empty() {
                    engine.remove_rows(t, &victims)?;
                    swept += victims.len();
                }
                if ids.len() < SWEEP_PAGE || last >= upper {
                    break;
                }
                after = Some(last);
            }
        }
        Ok(swept)
    }

    /// Evicts rows over the memory budget (writing dirty ones back first); call after applying deltas.
    pub fn enforce_budget(&self) -> Result<(), EmbeddingError> {
        for shard in &self.shards {
            if shard.memory_budget_rows().is_some() {
                shard.enforce_budget()?;
            }
        }
        Ok(())
    }

    /// Rows in memory over every shard and table.
    pub fn rows_in_memory(&self) -> usize {
        match &self.compact {
            Some(c) => c.values().map(CompactTable::len).sum(),
            None => self.shards.iter().map(Engine::rows_total).sum(),
        }
    }

    /// Estimated heap bytes of the rows in memory (ids, index, weights; with engines, also the optimizer
    /// state they keep).
    pub fn memory_bytes(&self) -> usize {
        match &self.compact {
            Some(c) => c.values().map(CompactTable::memory_bytes).sum(),
            None => self.shards.iter().map(Engine::memory_bytes).sum(),
        }
    }
}

/// Buffers of [`RowStore::gather`], kept by the caller.
#[derive(Debug, Default)]
pub struct GatherScratch {
    by_shard: Vec<Vec<u32>>,
    ids: Vec<u64>,
    rows: Vec<f32>,
}

/// Checks that the shard directory `dir` of `snapshot_dir` holds shard `i` of `n` (its manifest says so).
fn check_shard(snapshot_dir: &Path, dir: &Path, i: u32, n: u32) -> Result<(), StoreOpenError> {
    let manifest = read_manifest(dir)?;
    if manifest.shard.index != i || manifest.shard.num_shards != n {
        return Err(StoreOpenError::Snapshot {
            path: snapshot_dir.to_path_buf(),
            reason: format!(
                "{} holds shard {} of {}, expected {i} of {n}",
                dir.display(),
                manifest.shard.index,
                manifest.shard.num_shards
            ),
        });
    }
    Ok(())
}

/// The shard directories of a snapshot, in shard order; every one of `0..n` must be there.
fn list_shards(snapshot_dir: &Path) -> Result<Vec<PathBuf>, StoreOpenError> {
    let bad = |reason: String| StoreOpenError::Snapshot {
        path: snapshot_dir.to_path_buf(),
        reason,
    };
    let io = |source| StoreOpenError::Io {
        path: snapshot_dir.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(snapshot_dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        if let Some((i, n)) = parse_shard_dir_name(&entry.file_name().to_string_lossy()) {
            found.push((n, i, entry.path()));
        }
    }
    found.sort();
    let Some(&(n, _, _)) = found.first() else {
        return Err(bad("no shard-<i>-of-<n> directory".into()));
    };
    if found.iter().any(|&(m, _, _)| m != n) {
        return Err(bad("shard directories of different server counts".into()));
    }
    if found.len() != n as usize
        || found
            .iter()
            .enumerate()
            .any(|(k, &(_, i, _))| i != k as u32)
    {
        return Err(bad(format!(
            "{} shard directories for {n} servers",
            found.len()
        )));
    }
    Ok(found.into_iter().map(|(_, _, p)| p).collect())
}

/// Builds the database `dst` (removed first) from a shard's [`TABLES_FILE`]: its tables registered, every row
/// written.
fn load_tensors(file: &Path, dst: &Path) -> Result<(), StoreOpenError> {
    let tables = read_tables(file)?;
    match std::fs::remove_dir_all(dst) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(StoreOpenError::Io {
                path: dst.to_path_buf(),
                source: e,
            })
        }
        _ => {}
    }
    let store = Arc::new(RocksStore::open(dst)?);
    let engine = Engine::open(store.clone())?;
    for t in &tables {
        engine.register_table(t.config.clone())?;
    }
    write_rows_into(&*store, &tables, &|_| true)?;
    embedding::Store::flush(&*store)?;
    Ok(())
}

/// Copies the RocksDB directory `src` to `dst` (removed first): SST files are immutable, so they are
/// hard-linked (copied across file systems); the small rest is copied.
fn link_copy(src: &Path, dst: &Path) -> Result<(), StoreOpenError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreOpenError::Io { path, source }
    };
    match std::fs::remove_dir_all(dst) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(dst)(e)),
        _ => {}
    }
    std::fs::create_dir_all(dst).map_err(io(dst))?;
    for entry in std::fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let from = entry.path();
        if !entry.file_type().map_err(io(&from))?.is_file() {
            continue;
        }
        let to = dst.join(entry.file_name());
        let linked =
            from.extension().is_some_and(|e| e == "sst") && std::fs::hard_link(&from, &to).is_ok();
        if !linked {
            std::fs::copy(&from, &to).map_err(io(&from))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-shard store in memory holding rows `ids` of tables 1 and 2 (dim 1, value = id).
    fn store(ids: &[u64]) -> RowStore {
        let engine = Engine::open(Arc::new(embedding::MemStore::default())).unwrap();
        for t in [1, 2] {
            engine.register_table(TableConfig::counter(t, 1)).unwrap();
            let table = engine.table(t).unwrap();
            for &id in ids {
                table.load_row(id, &[id as f32]).unwrap();
            }
        }
        RowStore {
            map: ShardMap::new(1),
            shards: vec![engine],
            num_shards: 1,
            compact: None,
            shapes: [(1, (1, 1)), (2, (1, 1))].into(),
        }
    }

    fn held(s: &RowStore, table: u32) -> Vec<u64> {
        s.shards[0].scan_ids(table, None, usize::MAX).unwrap()
    }

    fn listed(table: u32, ids: &[u64]) -> SyncedRows {
        SyncedRows {
            table,
            dim: 1,
            ids: ids.to_vec(),
            rows: ids.iter().map(|&i| i as f32).collect(),
        }
    }

    #[test]
    fn a_sweep_deletes_exactly_the_rows_its_range_leaves_out() {
        // More rows than one page of the sweep's own scan.
        let n = SWEEP_PAGE as u64 + 5000;
        let all: Vec<u64> = (1..=n).collect();
        let s = store(&all);
        // Page 1: table 1 up to id 4500, listing the even ids.
        let evens: Vec<u64> = (2..=4500).step_by(2).collect();
        let swept = s
            .sweep(0, (0, None), Some((1, Some(4500))), &[listed(1, &evens)])
            .unwrap();
        assert_eq!(swept, 2250);
        let mut want: Vec<u64> = evens.clone();
        want.extend(4501..=n);
        assert_eq!(held(&s, 1), want);
        assert_eq!(held(&s, 2), all, "table 2 is past the page");
        // Page 2: the rest of table 1 (nothing listed) and table 2 before its first id: table 2 untouched.
        let swept = s.sweep(0, (1, Some(4500)), Some((2, None)), &[]).unwrap();
        assert_eq!(swept, n as usize - 4500);
        assert_eq!(held(&s, 1), evens);
        assert_eq!(held(&s, 2), all);
        // Last page: all of table 2, listing 7 and 5000.
        let swept = s
            .sweep(0, (2, None), None, &[listed(2, &[7, 5000])])
            .unwrap();
        assert_eq!(swept, n as usize - 2);
        assert_eq!(held(&s, 2), [7, 5000]);
        // Deletions of a delta: gone rows read as their initializer (counter tables start at 0).
        s.delete_rows(2, &[7, 99]).unwrap();
        assert_eq!(held(&s, 2), [5000]);
        let mut row = [1.0f32];
        s.gather(2, &[7], &mut row, &mut GatherScratch::default())
            .unwrap();
        assert_eq!(row, [0.0]);
    }
}
