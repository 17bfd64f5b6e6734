//! The storage operations of a [`Shard`] that keep its write health current: the write-back of dirty rows,
//! the synced write of a push, a checkpoint, eviction and the recovery probe. Each records its metrics through
//! [`crate::writeback`] or [`crate::checkpoint`] and its outcome in the shard's [`crate::write_health`].
//! Nothing here reads the wall clock: callers pass `now` (Unix seconds) in.

use std::path::{Path, PathBuf};
use std::time::Instant;

use embedding::snapshot::Manifest;
use embedding::{EmbeddingError, EvictStats, FlushStats, SnapshotError};

use super::Shard;
use crate::config::Durability;
use crate::metrics as m;
use crate::write_health::PROBE_KEY;
use crate::{checkpoint, writeback};

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
    pub fn persist_synced(
        &self,
        parts: &[(u32, &[u64])],
        meta: &[embedding::MetaWrite],
    ) -> Result<FlushStats, EmbeddingError> {
        let began = Instant::now();
        match self.engine.persist_with(parts, meta, true) {
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
    /// manifest created at Unix time `now_us`, leaving out the rows `prune` names (an export's); returns the
    /// manifest and that directory ([`checkpoint::checkpoint`]).
    pub fn checkpoint(
        &self,
        dir: &Path,
        step: u64,
        now_us: u64,
        prune: Option<&embedding::ExportPrune>,
    ) -> Result<(Manifest, PathBuf), SnapshotError> {
        let info = checkpoint::shard_info(&self.routing.map(), self.shard_index);
        checkpoint::checkpoint(&self.engine, &self.sync, info, dir, step, now_us, prune)
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
            Ok(()) => {
                self.writes.record_success();
                // Pushes applied whose synced write failed: written now with their answers, which
                // ends their hold on reads ([`crate::shard::unsynced`]) without waiting for a retry.
                self.write_unwritten_pushes();
            }
            Err(e) => {
                tracing::debug!(error = %e, "storage write probe failed");
                self.writes.record_failure("write probe", &e);
            }
        }
    }
}
