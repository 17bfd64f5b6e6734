//! The requests that write to storage: a push's synced write, checkpoints and flushes.

use std::path::{Component, Path, PathBuf};

use protocol::{ErrorCode, Response, TableCount};

use crate::reply::{refuse, Refusal, Reply};
use crate::shard::Shard;

impl Shard {
    /// Refuses an export prune that is malformed, or that asks for what no table keeps (last-update stamps:
    /// tables with a TTL; update counts: tables with an LFU row cap; scores: tables with a score row cap), which
    /// would prune nothing.
    fn check_prune(&self, p: &embedding::ExportPrune) -> Result<(), Refusal> {
        p.validate().map_err(|e| refuse(ErrorCode::BadRequest, e))?;
        let tables: Vec<_> = self
            .engine
            .tables()
            .iter()
            .filter_map(|c| self.engine.table(c.id).ok())
            .collect();
        if let Some(age) = p.max_age_secs {
            if !tables.iter().any(|t| t.keeps_stamps()) {
                return Err(refuse(
                    ErrorCode::BadRequest,
                    format!(
                        "export prune: max_age_secs {age} needs last-update stamps, which only tables with a \
                         TTL keep (row-ttl-secs, or a table's ttl_secs): no table here has one"
                    ),
                ));
            }
        }
        if let Some(count) = p.min_count {
            if !tables.iter().any(|t| t.keeps_counts()) {
                return Err(refuse(
                    ErrorCode::BadRequest,
                    format!(
                        "export prune: min_count {count} needs update counts, which only tables with an LFU \
                         row cap (eviction policy lfu) keep: no table here has one"
                    ),
                ));
            }
        }
        if let Some(score) = p.min_score {
            if !tables.iter().any(|t| t.keeps_scores()) {
                return Err(refuse(
                    ErrorCode::BadRequest,
                    format!(
                        "export prune: min_score {score} needs scores, which only tables evicting by score \
                         (eviction policy score) keep: no table here has one"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Writes the rows of a push, already applied, with `meta` (its answer, [`crate::shard::push_window`]) in
    /// one synced store write ([`Durability::Sync`]). On a store
    /// error the push is refused with `Storage`, though its rows were applied in memory: they stay dirty, and
    /// the timer's write-back retries them ([`Shard::persist_synced`]).
    pub(super) fn persist_push(
        &self,
        tables: &[TableCount],
        all_ids: &[u64],
        meta: &[embedding::MetaWrite],
    ) -> Result<(), Refusal> {
        self.persist_synced(&super::table_parts(tables, all_ids), meta)?;
        Ok(())
    }

    /// A checkpoint into `dir`, its manifest created at `now_us`.
    pub(super) fn checkpoint_request(
        &self,
        dir: &str,
        step: u64,
        tensors: bool,
        prune: Option<embedding::ExportPrune>,
        now_us: u64,
    ) -> Result<Reply, Refusal> {
        let path = checkpoint_dir(&self.checkpoint_root, dir)?;
        if let Some(p) = &prune {
            self.check_prune(p)?;
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
        let done = self.checkpoint(&path, step, now_us, prune.as_ref()).and_then(|(manifest, written)| {
            // An export's shard also gets its tables as SafeTensors, from the snapshot just written (a retry
            // answered from a complete snapshot writes it if an earlier attempt died before it).
            let file = written.join(embedding::snapshot::tensors::TABLES_FILE);
            if tensors && !file.exists() {
                let bytes = embedding::snapshot::tensors::write_tables(&written)?;
                metrics::counter!(crate::metrics::CHECKPOINT_TENSOR_BYTES_TOTAL).increment(bytes);
                tracing::info!(path = %file.display(), bytes, "wrote the snapshot's tables as SafeTensors");
            }
            Ok((manifest, written))
        });
        match done {
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
            // A full or failing disk: transient (the client retries; a retry replaces the folder the failed
            // attempt left, [`embedding::Engine::checkpoint_with`]).
            Err(
                e @ (embedding::SnapshotError::Io { .. } | embedding::SnapshotError::Store { .. }),
            ) => {
                metrics::counter!(crate::metrics::CHECKPOINTS_FAILED_TOTAL).increment(1);
                tracing::error!(dir = %path.display(), error = %e, "checkpoint failed");
                Err(refuse(ErrorCode::Storage, e.to_string()))
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

/// Where a checkpoint request's `dir` points under `root`: a relative name (no `..`, no root or drive) is
/// joined to it, an absolute path must lie inside it; the deepest folder of it that exists must resolve
/// (symbolic links followed) inside the resolved root too. `root` is created if missing.
pub(crate) fn checkpoint_dir(root: &Path, dir: &str) -> Result<PathBuf, Refusal> {
    let bad = |why: &str| {
        Err(refuse(
            ErrorCode::BadRequest,
            format!(
                "checkpoint directory {dir:?}: {why}; checkpoints go under this server's checkpoint root {} \
                 (a name relative to it, or an absolute path inside it)",
                root.display()
            ),
        ))
    };
    let path = Path::new(dir);
    if dir.is_empty() || path.components().all(|c| c == Component::CurDir) {
        return bad("empty");
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return bad("'..' is not allowed");
    }
    let candidate = if path.is_absolute() {
        if !path.starts_with(root) {
            return bad("outside the checkpoint root");
        }
        path.to_path_buf()
    } else {
        root.join(path)
    };
    std::fs::create_dir_all(root).map_err(|e| {
        refuse(
            ErrorCode::Storage,
            format!("create the checkpoint root {}: {e}", root.display()),
        )
    })?;
    let real_root = root.canonicalize().map_err(|e| {
        refuse(
            ErrorCode::Storage,
            format!("resolve the checkpoint root {}: {e}", root.display()),
        )
    })?;
    let existing = candidate.ancestors().find(|a| a.exists()).unwrap_or(root);
    match existing.canonicalize() {
        Ok(real) if real.starts_with(&real_root) => Ok(candidate),
        Ok(real) => bad(&format!(
            "{} resolves to {}, outside the checkpoint root",
            existing.display(),
            real.display()
        )),
        Err(e) => bad(&format!("resolve {}: {e}", existing.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoint_dir;

    #[test]
    fn checkpoints_stay_under_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ckpt");
        assert_eq!(
            checkpoint_dir(&root, "job/step-5").unwrap(),
            root.join("job/step-5")
        );
        let inside = root.join("abs");
        assert_eq!(
            checkpoint_dir(&root, inside.to_str().unwrap()).unwrap(),
            inside
        );
        for bad in ["", ".", "../x", "job/../../x", "/etc", "/tmp/x"] {
            let e = checkpoint_dir(&root, bad).unwrap_err().into_reply();
            let protocol::Response::Error { code, message } = e.header else {
                panic!("{bad}");
            };
            assert_eq!(code, protocol::ErrorCode::BadRequest, "{bad}");
            assert!(message.contains("checkpoint root"), "{message}");
        }
        // A link inside the root that points out of it.
        std::os::unix::fs::symlink(tmp.path(), root.join("out")).unwrap();
        let e = checkpoint_dir(&root, "out/x").unwrap_err().into_reply();
        let protocol::Response::Error { message, .. } = e.header else {
            panic!()
        };
        assert!(message.contains("outside the checkpoint root"), "{message}");
    }
}
