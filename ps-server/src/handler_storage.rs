//! The requests that write to storage: a push's synced write, checkpoints and flushes.

use protocol::{ErrorCode, Response, TableCount};

use super::{refuse, Refusal, Reply};
use crate::shard::Shard;

impl Shard {
    /// Writes the rows of a push, already applied, with a synced store write ([`Durability::Sync`]). On a store
    /// error the push is refused with `Storage`, though its rows were applied in memory: they stay dirty, and
    /// the timer's write-back retries them ([`Shard::persist_synced`]).
    pub(super) fn persist_push(
        &self,
        tables: &[TableCount],
        all_ids: &[u64],
    ) -> Result<(), Refusal> {
        let mut parts = Vec::with_capacity(tables.len());
        let mut start = 0;
        for t in tables {
            let n = t.count as usize;
            parts.push((t.table, &all_ids[start..start + n]));
            start += n;
        }
        self.persist_synced(&parts)?;
        Ok(())
    }

    /// A checkpoint into `dir`, its manifest created at `now_us`.
    pub(super) fn checkpoint_request(
        &self,
        dir: &str,
        step: u64,
        now_us: u64,
    ) -> Result<Reply, Refusal> {
        let path = std::path::Path::new(dir);
        if !path.is_absolute()
            || path
                .components()
                .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("checkpoint directory {dir:?}: expected an absolute path without '..'"),
            ));
        }
        if let Some(target) = self.routing.moving_to() {
            // Rows of moving virtual shards are on two servers until the commit: a snapshot cut now could
            // restore both copies.
            return Err(refuse(
                ErrorCode::Resharding,
                format!("a reshard to map epoch {target} is under way: checkpoint once it commits"),
            ));
        }
        if *self.routing.cleaning.borrow() {
            return Err(refuse(
                ErrorCode::Resharding,
                "rows the last reshard moved away are being deleted here: checkpoint once they are",
            ));
        }
        match self.checkpoint(path, step, now_us) {
            Ok((manifest, written)) => Ok(Reply {
                header: Response::Checkpointed {
                    rows: manifest.rows(),
                    dir: written.display().to_string(),
                },
                payload: Vec::new(),
            }),
            Err(embedding::SnapshotError::Engine(e)) => Err(e.into()),
            Err(e @ embedding::SnapshotError::Exists { .. }) => {
                Err(refuse(ErrorCode::BadRequest, e.to_string()))
            }
            Err(e) => Err(refuse(ErrorCode::Internal, e.to_string())),
        }
    }

    pub(super) fn flush(&self) -> Result<Reply, Refusal> {
        let stats = self.write_back("flush")?;
        Ok(Reply {
            header: Response::Flushed {
                rows: stats.rows as u64,
            },
            payload: Vec::new(),
        })
    }
}
