//! One server's shard: its storage engine, its place in the shard map, its durability and whether storage
//! writes work; the state every request and every timer shares.
//!
//! Beside the state, the storage operations that keep [`Shard::writes`] current: the write-back of dirty rows,
//! the synced write of a push, a checkpoint, eviction and the recovery probe. Each records its metrics through
//! [`crate::writeback`] or [`crate::checkpoint`] and its outcome in [`WriteHealth`].
//!
//! Dependencies point one way: this module uses [`crate::writeback`], [`crate::checkpoint`] and
//! [`crate::write_health`], none of which knows a `Shard`; request handling ([`crate::handler`], which adds
//! [`Shard::handle`]) and the timers that call these operations ([`crate::server`]) sit above it. Nothing here
//! reads the wall clock: callers pass `now` (Unix seconds) in.

use std::path::{Path, PathBuf};
use std::time::Instant;

use embedding::snapshot::Manifest;
use embedding::{EmbeddingError, Engine, EvictStats, FlushStats, SnapshotError};

use crate::config::Durability;
use crate::metrics as m;
use crate::write_health::{WriteHealth, PROBE_KEY};
use crate::{checkpoint, writeback};

/// One server's shard: its storage engine and its place in the shard map.
pub struct Shard {
    /// The tables.
    pub engine: Engine,
    /// The cluster's shard map, which a live reshard changes ([`crate::reshard`]).
    pub routing: crate::reshard::Routing,
    /// This server's index in the map.
    pub shard_index: u32,
    /// When pushed rows reach the store; with [`Durability::Sync`], a push is persisted before its reply.
    pub durability: Durability,
    /// Whether storage writes work; while they fail, pushes are refused ([`crate::write_health`]).
    pub writes: WriteHealth,
    /// Seconds a prefetch's pins last at most ([`crate::config::TierConfig::pin_secs`]).
    pub pin_secs: u64,
    /// Sums of the trainers' reduce contributions (hybrid dense mode, [`crate::reduce`]).
    pub reducer: crate::reduce::Reducer,
    /// Changed rows and published dense parameters for serving's delta sync ([`crate::sync`]).
    pub sync: crate::sync::SyncState,
    /// This server's place among its shard's replicas ([`crate::replica`]).
    pub replica: crate::replica::Replica,
    /// Checkpoints are written under this directory only ([`crate::config::ServerConfig::checkpoint_root`]).
    pub checkpoint_root: PathBuf,
    /// The largest frame this server sends or takes ([`crate::config::ServerConfig::max_frame`]): a delta-sync
    /// answer fits it.
    pub max_frame: u64,
    /// Bounds on the tables trainers register ([`Shard::register_as`]).
    pub registration: crate::config::RegistrationLimits,
}

impl Shard {
    /// Writes every dirty row now ([`writeback::flush`]) and records the outcome in [`Shard::writes`]; `what`
    /// names the occasion in a failure's reason (`"flush"` for a flush request, `"write-back"` for the timer).
    pub fn write_back(&self, what: &str) -> Result<FlushStats, EmbeddingError> {
        writeback::flush(&self.engine)
            .inspect(|_| self.writes.record_success())
            .inspect_err(|e| self.writes.record_failure(what, e))
    }

    /// Writes rows already applied in memory with a synced store write ([`Durability::Sync`]): `parts` are
    /// (table, ids). On a store error the rows stay dirty, so the timer's write-back retries them, and
    /// [`Shard::writes`] records the failure.
    pub fn persist_synced(&self, parts: &[(u32, &[u64])]) -> Result<FlushStats, EmbeddingError> {
        let began = Instant::now();
        match self.engine.persist(parts, true) {
            Ok(stats) => {
                metrics::histogram!(m::SYNC_PUSH_WRITE_SECONDS)
                    .record(began.elapsed().as_secs_f64());
                metrics::counter!(m::SYNC_PUSH_ROWS_TOTAL).increment(stats.rows as u64);
                self.writes.record_success();
                Ok(stats)
            }
            Err(e) => {
                metrics::counter!(m::WRITEBACK_ERRORS_TOTAL).increment(1);
                self.writes.record_failure("synced write of a push", &e);
                tracing::error!(error = %e, "synced write of a push failed; its rows stay dirty");
                Err(e)
            }
        }
    }

    /// Writes a snapshot of every table and its `sync.json` into `dir/shard-<index>-of-<num_shards>/`, its
    /// manifest created at Unix time `now_us`; returns the manifest and that directory
    /// ([`checkpoint::checkpoint`]).
    pub fn checkpoint(
        &self,
        dir: &Path,
        step: u64,
        now_us: u64,
    ) -> Result<(Manifest, PathBuf), SnapshotError> {
        let info = checkpoint::shard_info(&self.routing.map(), self.shard_index);
        checkpoint::checkpoint(&self.engine, &self.sync, info, dir, step, now_us)
    }

    /// Evicts rows of tables over their memory budget ([`writeback::enforce_budget`]); a failed write of an
    /// evicted row is recorded in [`Shard::writes`].
    pub fn enforce_budget(&self) -> Result<EvictStats, EmbeddingError> {
        writeback::enforce_budget(&self.engine)
            .inspect_err(|e| self.writes.record_failure("eviction", e))
    }

    /// Tries the writes a write-refusing server needs to work again ([`crate::write_health`]): the
    /// write-back of every dirty row (not with `durability = "none"`), then a synced metadata write of `now`
    /// under [`PROBE_KEY`]. Records the outcome in [`Shard::writes`].
    pub fn probe_writes(&self, now: u64) {
        let result = (|| -> Result<(), EmbeddingError> {
            if self.durability != Durability::None {
                writeback::flush(&self.engine)?;
            }
            self.engine
                .store()
                .put_meta(PROBE_KEY, &now.to_le_bytes())?;
            Ok(())
        })();
        match result {
            Ok(()) => self.writes.record_success(),
            Err(e) => {
                tracing::debug!(error = %e, "storage write probe failed");
                self.writes.record_failure("write probe", &e);
            }
        }
    }
}
