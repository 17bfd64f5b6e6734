//! Snapshots of one server's tables: [`Engine::checkpoint`] writes a consistent copy into a directory, and
//! [`Snapshot`] opens one read-only and iterates its rows (for `ps-server restore`, which re-routes the rows of
//! N snapshots onto M servers).
//!
//! # Layout
//! A snapshot of a cluster is a directory with one subdirectory per server, `shard-<index>-of-<num_shards>`
//! ([`shard_dir`]), each holding:
//! - `rocksdb/`: a RocksDB database with the server's whole store, rows and metadata ([`Store::checkpoint`]; on
//!   RocksDB a checkpoint, whose SST files are hard links when on the same filesystem, so it costs little time
//!   or space).
//! - `manifest.json`: a [`Manifest`] (format version, step, creation time, shard map, tables with their
//!   configs and row counts), written last and atomically (temporary file, fsync, rename): a shard directory
//!   without it is an incomplete snapshot, and [`Snapshot::open`] refuses it.
//!
//! # Consistency
//! [`Engine::checkpoint`]:
//! 1. writes back the dirty rows while pushes keep running (the bulk of the work, outside any pause);
//! 2. takes the engine's push gate for writing: it waits for applies in flight and holds new ones back. Every
//!    [`Engine::apply`] holds the gate for reading, and a wire push spanning several tables holds it across all
//!    of them through one [`PushGuard`], so a snapshot holds all of a push or none of it. Pulls do not wait;
//! 3. writes back the rows dirtied since step 1 and takes the store checkpoint; then releases the gate.
//!
//! After step 3's write-back, every row in memory has its current copy in the store (rows are only dirtied by
//! applies, which are held back), so the store checkpoint is the whole table, including rows that a memory
//! budget evicted to the store. Pushes wait for step 3 only: one write-back of the rows dirtied in step 1 and
//! a memtable flush plus hard links. TTL expiry may run concurrently: a row expiring during a checkpoint is in
//! it or not, whole. The snapshot is consistent per server, not across servers (training is asynchronous); a
//! trainer that needs one cut for the whole cluster pauses its pushes around [`Engine::checkpoint`] calls.

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::{Mutex, RwLockReadGuard};

/// Serializes checkpoints in this process (see [`Engine::checkpoint`]).
static CHECKPOINT_LOCK: Mutex<()> = Mutex::new(());
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::{ExportPrune, TableConfig};
use crate::engine::Engine;
use crate::error::{EmbeddingError, StoreError};
use crate::rocks_store::RocksStore;
use crate::store::Store;
use crate::table::ApplyStats;

/// Version of the snapshot layout and manifest; readers refuse other versions.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// File name of the manifest in a shard directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Directory of the RocksDB database in a shard directory.
pub const DB_DIR: &str = "rocksdb";

/// The directory of shard `index` of `num_shards` under a snapshot directory: `dir/shard-<index>-of-<num>`.
pub fn shard_dir(dir: &Path, index: u32, num_shards: u32) -> PathBuf {
    dir.join(format!("shard-{index}-of-{num_shards}"))
}

/// Parses a shard directory name `shard-<index>-of-<num_shards>`; `None` for other names.
pub fn parse_shard_dir_name(name: &str) -> Option<(u32, u32)> {
    let (index, num) = name.strip_prefix("shard-")?.split_once("-of-")?;
    let (index, num): (u32, u32) = (index.parse().ok()?, num.parse().ok()?);
    (index < num).then_some((index, num))
}

/// The server's place in the cluster when the snapshot was taken (the shard map).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardInfo {
    /// This server's shard index.
    pub index: u32,
    /// Number of servers.
    pub num_shards: u32,
    /// Shard-map epoch.
    pub epoch: u64,
    /// Number of virtual shards of the routing (fixed for the life of the data).
    pub num_virtual_shards: u32,
    /// Fingerprint of the id routing function (`protocol::ShardMap::routing_fingerprint`): a restore refuses
    /// snapshots routed by another function.
    pub routing_fingerprint: u64,
}

/// One table of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableEntry {
    /// Table id.
    pub id: u32,
    /// Table name.
    pub name: String,
    /// Weights per row.
    pub dim: usize,
    /// f32s per stored row (weights then optimizer state).
    pub row_len: usize,
    /// Rows of this table in the snapshot.
    pub rows: u64,
    /// The full config: optimizer, initializer, seed, regularization, admission, TTL.
    pub config: TableConfig,
}

/// `manifest.json` of a shard directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`SNAPSHOT_FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The caller's training step (opaque to the server).
    pub step: u64,
    /// Creation time, Unix seconds (passed in by the caller: this crate reads no clock).
    pub created_unix_secs: u64,
    /// The shard map.
    pub shard: ShardInfo,
    /// Tables by id.
    pub tables: Vec<TableEntry>,
}

impl Manifest {
    /// Rows over all tables.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.rows).sum()
    }
}

/// An error taking or reading a snapshot. Messages name the path and the offending value.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The shard directory has no manifest: not a snapshot, or a checkpoint that did not finish.
    #[error("{}: no {MANIFEST_FILE} (not a snapshot, or an incomplete one)", .path.display())]
    MissingManifest {
        /// The shard directory.
        path: PathBuf,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("{}: unreadable manifest: {detail}", .path.display())]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The manifest has another format version.
    #[error("{}: snapshot format version {found}, this build reads version {expected}", .path.display())]
    FormatVersion {
        /// The manifest file.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// The target of a checkpoint exists already (snapshots are never overwritten).
    #[error("{}: already exists; checkpoint into a new directory", .path.display())]
    Exists {
        /// The shard directory.
        path: PathBuf,
    },
    /// A file system operation failed.
    #[error("{}: {op}: {detail}", .path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done, e.g. `"create directory"`.
        op: &'static str,
        /// The OS error.
        detail: String,
    },
    /// The snapshot's database failed or holds corrupt data (a wrong-length value, a bad key).
    #[error("snapshot {}: {source}", .path.display())]
    Store {
        /// The shard directory.
        path: PathBuf,
        /// The store error, naming table and id.
        source: StoreError,
    },
    /// The manifest and the database disagree.
    #[error("snapshot {}: {detail}", .path.display())]
    Mismatch {
        /// The shard directory.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// The engine failed (writing back dirty rows).
    #[error(transparent)]
    Engine(#[from] EmbeddingError),
}

fn io(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_owned();
    move |e| SnapshotError::Io {
        path,
        op,
        detail: e.to_string(),
    }
}

/// Held across the applies of one logical push (all tables of a wire push): a checkpoint waits for it and
/// sees all of the push or none of it. Created by [`Engine::begin_push`]. While holding one, apply through it,
/// never through [`Engine::apply`] (which would take the gate again and can deadlock behind a waiting
/// checkpoint).
pub struct PushGuard<'a> {
    engine: &'a Engine,
    _gate: RwLockReadGuard<'a, ()>,
}

impl PushGuard<'_> {
    /// [`Engine::apply`] under this guard.
    pub fn apply(
        &self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
    ) -> Result<ApplyStats, EmbeddingError> {
        self.engine.table(table)?.apply(ids, grads)
    }

    /// [`Engine::apply_at`] under this guard.
    pub fn apply_at(
        &self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
        now: u64,
    ) -> Result<ApplyStats, EmbeddingError> {
        self.engine.table(table)?.apply_at(ids, grads, now)
    }

    /// [`Table::apply_scaled`](crate::Table::apply_scaled) on table `table`: a push at time `now` (seconds)
    /// with its learning rate multiplied by `lr_scale`.
    pub fn apply_scaled(
        &self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
        now: u64,
        lr_scale: f32,
    ) -> Result<ApplyStats, EmbeddingError> {
        self.engine
            .table(table)?
            .apply_scaled(ids, grads, now, lr_scale)
    }
}

impl Engine {
    /// Starts a push that may span several tables; see [`PushGuard`].
    pub fn begin_push(&self) -> PushGuard<'_> {
        PushGuard {
            engine: self,
            _gate: self.push_gate.read(),
        }
    }

    /// Writes a consistent snapshot of every table into `shard_dir(dir, shard.index, shard.num_shards)`
    /// (module docs: layout and consistency), creating `dir` if needed, and returns its manifest. Blocking
    /// (disk writes and fsyncs). Idempotent for retries: if that shard directory holds a complete snapshot of the
    /// same step and shard, its manifest is returned; a directory without a manifest (left by a checkpoint that
    /// was killed) is replaced; any other existing directory fails with [`SnapshotError::Exists`]. A failed
    /// checkpoint removes what it wrote. `created_unix_secs` goes into the manifest.
    pub fn checkpoint(
        &self,
        dir: &Path,
        step: u64,
        shard: ShardInfo,
        created_unix_secs: u64,
    ) -> Result<Manifest, SnapshotError> {
        self.checkpoint_with(dir, step, shard, created_unix_secs, &mut Vec::new, None)
    }

    /// [`Engine::checkpoint`], calling `on_pause` once while pushes are held (after the store checkpoint):
    /// the files it returns, `(name, contents)`, are written into the shard directory (fsynced) before the
    /// manifest. The server cuts its delta sync there and records where in `sync.json`, so the snapshot holds
    /// exactly the changes up to that cut. Not called for a retry answered from a complete snapshot.
    ///
    /// With `prune` (an export's publish-time pruning), the rows it leaves out at `created_unix_secs`
    /// ([`crate::Table::pruned`]) are deleted from the snapshot's database before the manifest counts its rows;
    /// the training tables keep them.
    pub fn checkpoint_with(
        &self,
        dir: &Path,
        step: u64,
        shard: ShardInfo,
        created_unix_secs: u64,
        on_pause: &mut dyn FnMut() -> Vec<(String, Vec<u8>)>,
        prune: Option<&ExportPrune>,
    ) -> Result<Manifest, SnapshotError> {
        let target = shard_dir(dir, shard.index, shard.num_shards);
        // One checkpoint at a time per process: a retried request (its first attempt's answer was lost) waits for
        // the first attempt instead of racing it in the same directory.
        let _one_at_a_time = CHECKPOINT_LOCK.lock();
        if target.exists() {
            match read_manifest(&target) {
                // A retry of a checkpoint that completed: answer as the first attempt did.
                Ok(m)
                    if m.step == step
                        && m.shard.index == shard.index
                        && m.shard.num_shards == shard.num_shards =>
                {
                    return Ok(m)
                }
                // Left by a checkpoint that died before writing its manifest (the manifest is written last):
                // nothing in it can be trusted, so it is replaced.
                Err(SnapshotError::MissingManifest { .. }) => {
                    tracing::warn!(path = %target.display(), "replacing an incomplete snapshot (no manifest)");
                    std::fs::remove_dir_all(&target)
                        .map_err(io(&target, "remove incomplete snapshot"))?;
                }
                _ => return Err(SnapshotError::Exists { path: target }),
            }
        }
        std::fs::create_dir_all(dir).map_err(io(dir, "create directory"))?;
        std::fs::create_dir(&target).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => SnapshotError::Exists {
                path: target.clone(),
            },
            _ => io(&target, "create directory")(e),
        })?;
        let result = self.checkpoint_into(&target, step, shard, created_unix_secs, on_pause, prune);
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&target);
        }
        result
    }

    fn checkpoint_into(
        &self,
        target: &Path,
        step: u64,
        shard: ShardInfo,
        created_unix_secs: u64,
        on_pause: &mut dyn FnMut() -> Vec<(String, Vec<u8>)>,
        prune: Option<&ExportPrune>,
    ) -> Result<Manifest, SnapshotError> {
        let started = std::time::Instant::now();
        self.flush_dirty()?;
        let (tables, extra) = {
            let _quiet = self.push_gate.write();
            let paused = std::time::Instant::now();
            let flushed = self.flush_dirty()?;
            self.store()
                .checkpoint(&target.join(DB_DIR))
                .map_err(|source| SnapshotError::Store {
                    path: target.to_owned(),
                    source,
                })?;
            tracing::debug!(
                rows = flushed.rows,
                pause_secs = paused.elapsed().as_secs_f64(),
                "pushes paused for the checkpoint"
            );
            (self.tables(), on_pause())
        };
        for (name, contents) in extra {
            write_file(&target.join(name), &contents)?;
        }
        if let Some(prune) = prune {
            self.prune_snapshot(target, prune, created_unix_secs)?;
        }
        // Everything but the manifest is on disk: a crash here must leave a snapshot nobody takes as valid.
        #[cfg(feature = "failpoints")]
        crate::failpoints::crash_point(crate::failpoints::CHECKPOINT_BEFORE_MANIFEST);
        let db = RocksStore::open_read_only(target.join(DB_DIR)).map_err(|source| {
            SnapshotError::Store {
                path: target.to_owned(),
                source,
            }
        })?;
        let mut entries = Vec::with_capacity(tables.len());
        for cfg in tables {
            let rows = count_rows(&db, target, &cfg)?;
            entries.push(TableEntry {
                id: cfg.id,
                name: cfg.name.clone(),
                dim: cfg.dim,
                row_len: cfg.row_len(),
                rows,
                config: cfg,
            });
        }
        drop(db);
        let manifest = Manifest {
            format_version: SNAPSHOT_FORMAT_VERSION,
            step,
            created_unix_secs,
            shard,
            tables: entries,
        };
        write_manifest(target, &manifest)?;
        tracing::info!(
            dir = %target.display(),
            step,
            rows = manifest.rows(),
            secs = started.elapsed().as_secs_f64(),
            "checkpoint written"
        );
        Ok(manifest)
    }
}

impl Engine {
    /// Deletes from the snapshot database in `target` the rows `prune` leaves out at `now` ([`crate::Table::pruned`],
    /// chosen from the tables in memory), before the manifest counts the rows; returns how many.
    fn prune_snapshot(
        &self,
        target: &Path,
        prune: &ExportPrune,
        now: u64,
    ) -> Result<u64, SnapshotError> {
        let victims: Vec<(u32, Vec<u64>)> = self
            .tables_snapshot()
            .iter()
            .map(|t| (t.id(), t.pruned(prune, now)))
            .filter(|(_, ids)| !ids.is_empty())
            .collect();
        let pruned: u64 = victims.iter().map(|(_, ids)| ids.len() as u64).sum();
        if pruned == 0 {
            return Ok(0);
        }
        let store = |source| SnapshotError::Store {
            path: target.to_owned(),
            source,
        };
        let db = RocksStore::open(target.join(DB_DIR)).map_err(store)?;
        for (table, ids) in &victims {
            db.delete_rows(*table, ids).map_err(store)?;
        }
        Store::flush(&db).map_err(store)?;
        tracing::info!(dir = %target.display(), pruned, ?prune, "rows left out of the snapshot");
        Ok(pruned)
    }
}

/// Rows of `cfg`'s table in `db`, checking every value's length.
fn count_rows(db: &RocksStore, path: &Path, cfg: &TableConfig) -> Result<u64, SnapshotError> {
    let mut rows = 0u64;
    let expected = cfg.row_bytes();
    db.scan_rows(cfg.id, &mut |id, value| {
        if value.len() != expected {
            return Err(StoreError::CorruptValue {
                table: cfg.id,
                id,
                len: value.len(),
                expected,
            });
        }
        rows += 1;
        Ok(())
    })
    .map_err(|source| SnapshotError::Store {
        path: path.to_owned(),
        source,
    })?;
    Ok(rows)
}

/// Writes and fsyncs one file of a shard directory (the directory is fsynced with the manifest, last).
fn write_file(path: &Path, contents: &[u8]) -> Result<(), SnapshotError> {
    let mut f = std::fs::File::create(path).map_err(io(path, "create"))?;
    f.write_all(contents).map_err(io(path, "write"))?;
    f.sync_all().map_err(io(path, "fsync"))
}

fn write_manifest(target: &Path, manifest: &Manifest) -> Result<(), SnapshotError> {
    let tmp = target.join(format!("{MANIFEST_FILE}.tmp"));
    let path = target.join(MANIFEST_FILE);
    // A validated TableConfig holds only finite floats, which serde_json always encodes.
    let json = serde_json::to_vec_pretty(manifest).expect("a manifest serializes");
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp, "create"))?;
    f.write_all(&json).map_err(io(&tmp, "write"))?;
    f.sync_all().map_err(io(&tmp, "fsync"))?;
    std::fs::rename(&tmp, &path).map_err(io(&path, "rename"))?;
    std::fs::File::open(target)
        .and_then(|d| d.sync_all())
        .map_err(io(target, "fsync directory"))
}

/// Reads a manifest, checking its format version.
pub fn read_manifest(shard_dir: &Path) -> Result<Manifest, SnapshotError> {
    let path = shard_dir.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SnapshotError::MissingManifest {
                path: shard_dir.to_owned(),
            })
        }
        Err(e) => return Err(io(&path, "read")(e)),
    };
    let bad = |detail: String| SnapshotError::BadManifest {
        path: path.clone(),
        detail,
    };
    // The version first, so a newer layout is reported as a version mismatch, not as a parse error.
    #[derive(Deserialize)]
    struct Version {
        format_version: u32,
    }
    let version: Version = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if version.format_version != SNAPSHOT_FORMAT_VERSION {
        return Err(SnapshotError::FormatVersion {
            path,
            found: version.format_version,
            expected: SNAPSHOT_FORMAT_VERSION,
        });
    }
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    for t in &manifest.tables {
        t.config
            .validate()
            .map_err(|e| bad(format!("table {}: {e}", t.id)))?;
        if t.id != t.config.id || t.dim != t.config.dim || t.row_len != t.config.row_len() {
            return Err(bad(format!(
                "table {}: id/dim/row_len ({}, {}, {}) disagree with its config ({}, {}, {})",
                t.id,
                t.id,
                t.dim,
                t.row_len,
                t.config.id,
                t.config.dim,
                t.config.row_len()
            )));
        }
    }
    Ok(manifest)
}

/// Callback of [`Snapshot::for_each_row`]: called with each row's id and stored bytes.
pub type RowFn<'a> = dyn FnMut(u64, &[u8]) -> Result<(), SnapshotError> + 'a;

/// One shard directory of a snapshot, opened read-only.
pub struct Snapshot {
    dir: PathBuf,
    manifest: Manifest,
    db: RocksStore,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("dir", &self.dir)
            .field("step", &self.manifest.step)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// Opens a shard directory: reads and checks the manifest ([`read_manifest`]), then opens the database
    /// read-only.
    pub fn open(shard_dir: &Path) -> Result<Snapshot, SnapshotError> {
        let manifest = read_manifest(shard_dir)?;
        let db = RocksStore::open_read_only(shard_dir.join(DB_DIR)).map_err(|source| {
            SnapshotError::Store {
                path: shard_dir.to_owned(),
                source,
            }
        })?;
        Ok(Snapshot {
            dir: shard_dir.to_owned(),
            manifest,
            db,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The shard directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Calls `f(id, row bytes)` for every row of table `table` (in the manifest), in increasing id order; the
    /// bytes are the stored encoding (the words of [`TableConfig::row_codec`], little-endian: `row_len` f32s
    /// for an f32 table, packed half weights then f32 state for bf16 and f16; decode with
    /// [`crate::RowCodec::words_from_bytes`], then [`crate::RowCodec::decode`]). A value of
    /// the wrong length or a bad key is a [`SnapshotError::Store`] naming table and id; the first error from
    /// `f` stops the scan and is returned. Returns the rows visited.
    pub fn for_each_row(&self, table: u32, f: &mut RowFn<'_>) -> Result<u64, SnapshotError> {
        let entry = self
            .manifest
            .tables
            .iter()
            .find(|t| t.id == table)
            .ok_or_else(|| SnapshotError::Mismatch {
                path: self.dir.clone(),
                detail: format!("table {table} is not in the manifest"),
            })?;
        let expected = entry.config.row_bytes();
        let mut failure = None;
        let mut rows = 0u64;
        let scanned = self.db.scan_rows(table, &mut |id, value| {
            if value.len() != expected {
                return Err(StoreError::CorruptValue {
                    table,
                    id,
                    len: value.len(),
                    expected,
                });
            }
            rows += 1;
            f(id, value).map_err(|e| {
                let detail = e.to_string();
                failure = Some(e);
                StoreError::Backend {
                    op: "snapshot row callback".into(),
                    detail,
                }
            })
        });
        match (scanned, failure) {
            (_, Some(e)) => Err(e),
            (Err(source), None) => Err(SnapshotError::Store {
                path: self.dir.clone(),
                source,
            }),
            (Ok(()), None) if rows != entry.rows => Err(SnapshotError::Mismatch {
                path: self.dir.clone(),
                detail: format!(
                    "table {table}: manifest says {} rows, the database holds {rows}",
                    entry.rows
                ),
            }),
            (Ok(()), None) => Ok(rows),
        }
    }
}

pub mod tensors;

#[cfg(test)]
mod tests;
