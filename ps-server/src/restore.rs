//! `ps-server restore`: builds the data directory of shard `I` of `M` servers from a snapshot taken on `N`
//! servers (`N` and `M` independent; `N == M` restores a cluster as it was).
//!
//! The snapshot directory holds `shard-<k>-of-<N>/` for every `k` ([`embedding::snapshot`]). Every one is
//! read (read-only RocksDB) and every row whose id routes to shard `I` of `M` ([`ShardMap::server_of`], the
//! function servers and clients use) is written to `OUT/rocksdb`, together with the table configs; a
//! `ps-server --data-dir OUT --shard-index I --num-shards M` then recovers and serves them. Ids map to one of
//! 4096 virtual shards whatever the server count, so re-routing is exact.
//!
//! Refused, before anything is written: a shard directory without a manifest or with another format version,
//! a missing `shard-k-of-N`, directories of different `N`, manifests of different steps, a table whose config
//! (dim, optimizer, ...) differs between shards, a snapshot routed by another function, and an `OUT` that
//! exists and is not empty. A restore that fails while writing removes `OUT/rocksdb`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use embedding::snapshot::{parse_shard_dir_name, Snapshot};
use embedding::{DirtyBatch, EmbeddingError, Engine, RocksStore, SnapshotError, TableConfig};
use protocol::ShardMap;
use thiserror::Error;

/// Metadata key of the restored store recording where its rows came from (JSON).
pub const RESTORED_FROM_META: &str = "snapshot/restored-from";

/// Rows per write batch of the restored store.
const BATCH_ROWS: usize = embedding::FLUSH_BATCH_ROWS;

/// Why a restore was refused or failed. Messages name the paths and values involved.
#[derive(Debug, Error)]
pub enum RestoreError {
    /// The target shard is not in the target map.
    #[error("--shard-index {index} is not below --num-shards {num_shards}")]
    BadTarget {
        /// Requested shard index.
        index: u32,
        /// Requested server count.
        num_shards: u32,
    },
    /// The snapshot directory has no `shard-<k>-of-<n>` entries.
    #[error("{}: no shard-<k>-of-<n> directories, not a snapshot", .path.display())]
    NoShards {
        /// The snapshot directory.
        path: PathBuf,
    },
    /// Shard directories of different server counts in one snapshot directory.
    #[error("{}: holds snapshots of {a} and of {b} servers; restore from one snapshot at a time", .path.display())]
    MixedShardCounts {
        /// The snapshot directory.
        path: PathBuf,
        /// One server count.
        a: u32,
        /// Another.
        b: u32,
    },
    /// A shard of the snapshot is missing.
    #[error("{}: shard-{index}-of-{num_shards} is missing", .path.display())]
    MissingShard {
        /// The snapshot directory.
        path: PathBuf,
        /// The missing shard.
        index: u32,
        /// Servers of the snapshot.
        num_shards: u32,
    },
    /// A shard directory's manifest is missing, unreadable, of another version, or its rows are corrupt.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A manifest disagrees with its directory name, the other manifests, or this build's routing.
    #[error("{}: {detail}", .path.display())]
    Inconsistent {
        /// The shard directory.
        path: PathBuf,
        /// What disagrees.
        detail: String,
    },
    /// A table has different configs in two shards.
    #[error("table {table}: {differences} (in {} and {})", .a.display(), .b.display())]
    TableMismatch {
        /// The table.
        table: u32,
        /// The differing fields, e.g. `"dim: registered 16, requested 32"`.
        differences: String,
        /// One shard directory.
        a: PathBuf,
        /// The other.
        b: PathBuf,
    },
    /// The output directory already holds something.
    #[error("{}: exists and is not empty; restore into a new directory", .path.display())]
    OutNotEmpty {
        /// The output directory.
        path: PathBuf,
    },
    /// A file system operation failed.
    #[error("{}: {op}: {detail}", .path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        detail: String,
    },
    /// A SafeTensors file did not read, or its tensors do not fit their tables (named).
    #[error(transparent)]
    Tensors(#[from] embedding::tensors::TensorsError),
    /// Writing the restored store failed.
    #[error("restored store {}: {source}", .path.display())]
    Store {
        /// The output database.
        path: PathBuf,
        /// The engine or store error.
        source: EmbeddingError,
    },
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreStats {
    /// Servers of the snapshot (`N`).
    pub from_shards: u32,
    /// The snapshot's step.
    pub step: u64,
    /// Tables restored.
    pub tables: usize,
    /// Rows read over all shard directories.
    pub rows_read: u64,
    /// Rows written (those routed to the target shard).
    pub rows_written: u64,
    /// The database written (`OUT/rocksdb`).
    pub db: PathBuf,
}

fn io(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> RestoreError {
    let path = path.to_owned();
    move |e| RestoreError::Io {
        path,
        op,
        detail: e.to_string(),
    }
}

/// Opens every shard directory of the snapshot in `from`, in shard order, and checks them against each other.
pub fn open_snapshots(from: &Path) -> Result<Vec<Snapshot>, RestoreError> {
    let snapshots = shard_dirs(from)?
        .iter()
        .map(|p| Snapshot::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    check_consistent(&snapshots)?;
    Ok(snapshots)
}

/// Every `shard-<k>-of-<N>` directory in `from`, in shard order (one `N`, no `k` missing).
fn shard_dirs(from: &Path) -> Result<Vec<PathBuf>, RestoreError> {
    let mut found: BTreeMap<u32, PathBuf> = BTreeMap::new();
    let mut num = None;
    for entry in std::fs::read_dir(from).map_err(io(from, "list snapshot directory"))? {
        let entry = entry.map_err(io(from, "list snapshot directory"))?;
        let name = entry.file_name();
        let Some((index, n)) = name.to_str().and_then(parse_shard_dir_name) else {
            continue;
        };
        match num {
            Some(a) if a != n => {
                return Err(RestoreError::MixedShardCounts {
                    path: from.to_owned(),
                    a,
                    b: n,
                })
            }
            _ => num = Some(n),
        }
        found.insert(index, entry.path());
    }
    let Some(num) = num else {
        return Err(RestoreError::NoShards {
            path: from.to_owned(),
        });
    };
    if let Some(index) = (0..num).find(|k| !found.contains_key(k)) {
        return Err(RestoreError::MissingShard {
            path: from.to_owned(),
            index,
            num_shards: num,
        });
    }
    Ok(found.into_values().collect())
}

/// Checks manifests against their names, each other and this build's routing.
fn check_consistent(snapshots: &[Snapshot]) -> Result<(), RestoreError> {
    let routing = ShardMap::new(1);
    let first = snapshots[0].manifest();
    let mut tables: BTreeMap<u32, (&TableConfig, &Path)> = BTreeMap::new();
    for (k, s) in snapshots.iter().enumerate() {
        let m = s.manifest();
        let bad = |detail: String| RestoreError::Inconsistent {
            path: s.dir().to_owned(),
            detail,
        };
        if m.shard.index != k as u32 || m.shard.num_shards != snapshots.len() as u32 {
            return Err(bad(format!(
                "manifest says shard {} of {}, the directory name says {k} of {}",
                m.shard.index,
                m.shard.num_shards,
                snapshots.len()
            )));
        }
        if m.shard.num_virtual_shards != routing.num_virtual
            || m.shard.routing_fingerprint != routing.routing_fingerprint()
        {
            return Err(bad(format!(
                "routed over {} virtual shards with fingerprint {:#x}; this build routes over {} with {:#x}",
                m.shard.num_virtual_shards,
                m.shard.routing_fingerprint,
                routing.num_virtual,
                routing.routing_fingerprint()
            )));
        }
        if m.step != first.step || m.shard.epoch != first.shard.epoch {
            return Err(bad(format!(
                "step {} epoch {}, but shard 0 has step {} epoch {}: shards of different checkpoints",
                m.step, m.shard.epoch, first.step, first.shard.epoch
            )));
        }
        for t in &m.tables {
            match tables.get(&t.id) {
                Some((cfg, path)) if **cfg != t.config => {
                    return Err(RestoreError::TableMismatch {
                        table: t.id,
                        differences: cfg.differences(&t.config),
                        a: path.to_path_buf(),
                        b: s.dir().to_owned(),
                    })
                }
                Some(_) => {}
                None => {
                    tables.insert(t.id, (&t.config, s.dir()));
                }
            }
        }
    }
    Ok(())
}

/// Fails unless shard `shard_index` is one of `num_shards` and `out` is missing or an empty directory.
fn check_target(num_shards: u32, shard_index: u32, out: &Path) -> Result<(), RestoreError> {
    if shard_index >= num_shards {
        return Err(RestoreError::BadTarget {
            index: shard_index,
            num_shards,
        });
    }
    check_out(out)
}

/// Fails unless `out` is missing or an empty directory.
fn check_out(out: &Path) -> Result<(), RestoreError> {
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(RestoreError::OutNotEmpty {
                    path: out.to_owned(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(out, "read output directory")(e)),
    }
}

/// Restores shard `shard_index` of `num_shards` from the snapshot in `from` into the data directory `out`
/// (module docs). Blocking.
pub fn restore(
    from: &Path,
    num_shards: u32,
    shard_index: u32,
    out: &Path,
) -> Result<RestoreStats, RestoreError> {
    check_target(num_shards, shard_index, out)?;
    let snapshots = open_snapshots(from)?;
    std::fs::create_dir_all(out).map_err(io(out, "create output directory"))?;
    let db = out.join("rocksdb");
    let result = write_shard(
        &snapshots,
        ShardMap::new(num_shards),
        shard_index,
        &db,
        from,
    );
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&db);
    }
    result
}

fn write_shard(
    snapshots: &[Snapshot],
    map: ShardMap,
    shard_index: u32,
    db: &Path,
    from: &Path,
) -> Result<RestoreStats, RestoreError> {
    let mut configs: BTreeMap<u32, TableConfig> = BTreeMap::new();
    for s in snapshots {
        for t in &s.manifest().tables {
            configs.entry(t.id).or_insert_with(|| t.config.clone());
        }
    }
    let first = snapshots[0].manifest();
    let (from_shards, step) = (snapshots.len() as u32, first.step);
    write_store(
        db,
        (map, shard_index),
        &configs,
        (from, from_shards, step),
        &mut |sink| {
            let mut rows_read = 0;
            for s in snapshots {
                for t in &s.manifest().tables {
                    rows_read += s.for_each_row(t.id, &mut |id, bytes| {
                        sink.row(t.id, id, bytes)
                            .map_err(|e| SnapshotError::Engine(e.into()))
                    })?;
                }
            }
            Ok(rows_read)
        },
    )
}

/// Restores shard `shard_index` of `num_shards` into `out` from SafeTensors files
/// (`embedding::snapshot::tensors`, docs/serving.md): `from` is one `.safetensors` file (tables made by another
/// tool: each table's `<name>.config` in the metadata, its ids, weights and optimizer state as tensors), or a
/// snapshot or export directory whose every `shard-<k>-of-<N>/` holds `tables.safetensors`. Rows are routed
/// as a snapshot's are. Refused before anything is written: a file that does not read or a tensor that does not
/// fit its table's config (named), a table with different configs in two files, files of different steps, an
/// id in two files. Each file is read whole into memory. Blocking.
pub fn restore_tensors(
    from: &Path,
    num_shards: u32,
    shard_index: u32,
    out: &Path,
) -> Result<RestoreStats, RestoreError> {
    use embedding::snapshot::tensors::{tables_of, write_rows_into, TABLES_FILE};
    check_target(num_shards, shard_index, out)?;
    let files = if from.is_file() {
        vec![from.to_owned()]
    } else {
        shard_dirs(from)?
            .into_iter()
            .map(|d| d.join(TABLES_FILE))
            .collect()
    };
    let mut read = Vec::with_capacity(files.len());
    let mut step = None;
    for f in &files {
        let file = embedding::tensors::read_file(f)?;
        let meta_step = file
            .metadata()
            .get("step")
            .and_then(|v| v.parse::<u64>().ok());
        match (step, meta_step) {
            (Some(a), Some(b)) if a != b => {
                return Err(RestoreError::Inconsistent {
                    path: f.clone(),
                    detail: format!(
                        "step {b}, but {} has step {a}: files of different checkpoints",
                        files[0].display()
                    ),
                })
            }
            (None, b) => step = b,
            _ => {}
        }
        read.push(tables_of(&file)?);
    }
    let mut configs: BTreeMap<u32, (TableConfig, &Path)> = BTreeMap::new();
    let mut ids: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (tables, f) in read.iter().zip(&files) {
        for t in tables {
            match configs.get(&t.config.id) {
                Some((cfg, path)) if *cfg != t.config => {
                    return Err(RestoreError::TableMismatch {
                        table: t.config.id,
                        differences: cfg.differences(&t.config),
                        a: path.to_path_buf(),
                        b: f.clone(),
                    })
                }
                Some(_) => {}
                None => {
                    configs.insert(t.config.id, (t.config.clone(), f));
                }
            }
            if let Some(k) = t.weights.iter().position(|x| !x.is_finite()) {
                return Err(RestoreError::Inconsistent {
                    path: f.clone(),
                    detail: format!(
                        "table {:?}: weight {} of id {} is {}: weights must be finite",
                        t.prefix,
                        k % t.config.dim,
                        t.ids[k / t.config.dim],
                        t.weights[k]
                    ),
                });
            }
            ids.entry(t.config.id).or_default().extend(&t.ids);
        }
    }
    for (table, all) in &mut ids {
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(RestoreError::Inconsistent {
                path: from.to_owned(),
                detail: format!("table {table}: id {} is in two files", w[0]),
            });
        }
    }
    let configs: BTreeMap<u32, TableConfig> =
        configs.into_iter().map(|(k, (c, _))| (k, c)).collect();
    std::fs::create_dir_all(out).map_err(io(out, "create output directory"))?;
    let db = out.join("rocksdb");
    let result = write_store(
        &db,
        (ShardMap::new(num_shards), shard_index),
        &configs,
        (from, files.len() as u32, step.unwrap_or(0)),
        &mut |sink| {
            // Every row is read; those routed to the target shard are written.
            let map = sink.map.clone();
            let routed = |id: u64| map.server_of(id) == shard_index;
            for tables in &read {
                sink.written += write_rows_into(sink.store, tables, &routed).map_err(|e| {
                    RestoreError::Store {
                        path: out.join("rocksdb"),
                        source: e.into(),
                    }
                })?;
            }
            Ok(read.iter().flatten().map(|t| t.ids.len() as u64).sum())
        },
    );
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&db);
    }
    result
}

/// Where rows go while a restore writes its store: each row routed to the target shard joins the current
/// table's batch, written every [`BATCH_ROWS`] rows and when the table changes.
struct RowSink<'a> {
    store: &'a RocksStore,
    map: ShardMap,
    shard_index: u32,
    configs: &'a BTreeMap<u32, TableConfig>,
    table: Option<u32>,
    batch: DirtyBatch,
    written: u64,
}

impl RowSink<'_> {
    /// Takes row `id` of `table` (its stored bytes, `TableConfig::row_bytes` of them) if it routes here.
    fn row(&mut self, table: u32, id: u64, bytes: &[u8]) -> Result<(), embedding::StoreError> {
        if self.map.server_of(id) != self.shard_index {
            return Ok(());
        }
        if self.table != Some(table) {
            self.write()?;
            self.table = Some(table);
            self.batch.reset(self.configs[&table].row_bytes());
        }
        self.batch.push_bytes(id, bytes);
        if self.batch.len() >= BATCH_ROWS {
            self.write()?;
        }
        Ok(())
    }

    fn write(&mut self) -> Result<(), embedding::StoreError> {
        if let (Some(table), false) = (self.table, self.batch.is_empty()) {
            embedding::Store::write_rows(self.store, table, &self.batch, false)?;
            self.written += self.batch.len() as u64;
            let row_len = self.batch.row_bytes();
            self.batch.reset(row_len);
        }
        Ok(())
    }
}

/// Creates the store `db` with `configs` registered, fills it with `fill` (which returns the rows it read),
/// and records where it came from (`from`, its server count and step).
fn write_store(
    db: &Path,
    (map, shard_index): (ShardMap, u32),
    configs: &BTreeMap<u32, TableConfig>,
    (from, from_shards, step): (&Path, u32, u64),
    fill: &mut dyn FnMut(&mut RowSink<'_>) -> Result<u64, RestoreError>,
) -> Result<RestoreStats, RestoreError> {
    let store_err = |source: EmbeddingError| RestoreError::Store {
        path: db.to_owned(),
        source,
    };
    let store = Arc::new(RocksStore::open(db).map_err(|e| store_err(e.into()))?);
    let engine = Engine::open(store.clone()).map_err(store_err)?;
    for cfg in configs.values() {
        engine.register_table(cfg.clone()).map_err(store_err)?;
    }
    let num_shards = map.num_servers;
    let mut sink = RowSink {
        store: &store,
        map,
        shard_index,
        configs,
        table: None,
        batch: DirtyBatch::new(),
        written: 0,
    };
    let rows_read = fill(&mut sink)?;
    sink.write().map_err(|e| store_err(e.into()))?;
    let rows_written = sink.written;
    let record = format!(
        "{{\"from\":{:?},\"step\":{},\"from_shards\":{},\"num_shards\":{},\"shard_index\":{}}}",
        from.display().to_string(),
        step,
        from_shards,
        num_shards,
        shard_index
    );
    embedding::Store::put_meta(&*store, RESTORED_FROM_META, record.as_bytes())
        .and_then(|()| embedding::Store::flush(&*store))
        .map_err(|e| store_err(e.into()))?;
    Ok(RestoreStats {
        from_shards,
        step,
        tables: configs.len(),
        rows_read,
        rows_written,
        db: db.to_owned(),
    })
}

/// Refuses to serve a data directory that `restore` built for another shard: its rows are the ones routed to
/// the recorded `shard_index` of `num_shards`, so serving them as any other shard would hide rows and create
/// duplicates. Directories not built by `restore` pass.
pub fn check_restored_shard(
    store: &dyn embedding::Store,
    shard_index: u32,
    num_shards: u32,
) -> anyhow::Result<()> {
    let Some(raw) = store
        .get_meta(RESTORED_FROM_META)
        .map_err(|e| anyhow::anyhow!("read {RESTORED_FROM_META}: {e}"))?
    else {
        return Ok(());
    };
    let record = String::from_utf8_lossy(&raw);
    let field = |name: &str| -> Option<u32> {
        let key = format!("\"{name}\":");
        let rest = &record[record.find(&key)? + key.len()..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    match (field("shard_index"), field("num_shards")) {
        (Some(i), Some(n)) if (i, n) == (shard_index, num_shards) => Ok(()),
        (Some(i), Some(n)) => anyhow::bail!(
            "this data directory was restored for shard {i} of {n} (ps-server restore), but the server is \
             configured as shard {shard_index} of {num_shards}: start it with --shard-index {i} --num-shards {n}"
        ),
        _ => anyhow::bail!("unreadable {RESTORED_FROM_META} record in the store: {record:?}"),
    }
}

#[cfg(test)]
mod tests;
