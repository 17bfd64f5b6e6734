//! Trainer checkpoints: dense parameters, dense optimizer state, data position and step of one rank, in one
//! file per rank under the checkpoint directory, written atomically (a temporary file, fsync, rename, fsync of
//! the directory), so a crash leaves either the previous checkpoint or the new one.
//!
//! File layout (`trainer-rank{R}.ckpt`): the magic `DLRMCKPT`, a u32 LE format version, a u64 LE header length
//! and a JSON [`CheckpointMeta`] header, then every parameter tensor and every optimizer tensor as f32 LE, in
//! the order and sizes the header lists, then the error-feedback residuals of the rank's lossy pushes
//! ([`protocol::compression::feedback::ResidualStore::export`], `residual_bytes` long; absent without error feedback). The parameter servers' snapshot, when taken, is the directory `ps`
//! beside it ([`PS_SNAPSHOT_DIR`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::files::{self, remove_dir_if_present, write_atomic, FileError};
use crate::model::{Dlrm, ModelError};

/// File magic.
const MAGIC: &[u8; 8] = b"DLRMCKPT";
/// Format version.
const VERSION: u32 = 1;
/// Largest header accepted (a corrupt length must not allocate gigabytes).
const MAX_HEADER: u64 = 1 << 20;
/// Subdirectory of the checkpoint directory that holds the parameter servers' snapshot.
pub const PS_SNAPSHOT_DIR: &str = "ps";

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed.
    #[error("checkpoint {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a checkpoint of this format.
    #[error("checkpoint {}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint does not fit the model or the job (sizes, rank, batch size).
    #[error("checkpoint {} does not fit this job: {reason}", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The checkpoint directory's path is not UTF-8, so it cannot be sent to the servers.
    #[error("checkpoint directory {} is not UTF-8", path.display())]
    NotUtf8 {
        /// The directory.
        path: PathBuf,
    },
    /// A server failed to snapshot its tables.
    #[error("snapshot the parameter servers: {0}")]
    PsSnapshot(#[source] protocol::ProtocolError),
}

impl CheckpointError {
    /// Whether a disk, the trainer's or a server's, failed while writing (full, or an I/O error): what a
    /// periodic checkpoint rides out by being skipped, the previous checkpoint staying the latest.
    pub fn is_write_failure(&self) -> bool {
        match self {
            CheckpointError::Io { .. } => true,
            CheckpointError::PsSnapshot(protocol::ProtocolError::Remote { code, .. }) => {
                *code == protocol::ErrorCode::Storage
            }
            _ => false,
        }
    }
}

/// What a checkpoint records besides the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Training batches this rank completed (its step); also its data position in batches.
    pub step: u64,
    /// Training samples this rank completed: the data position, in samples of this rank's share.
    pub samples: u64,
    /// The rank.
    pub rank: usize,
    /// The number of trainers.
    pub world: usize,
    /// Samples per batch (the data position in batches assumes it).
    pub batch_size: usize,
    /// Whether the dense parameters live on the parameter servers (several trainers).
    pub dense_on_ps: bool,
    /// Whether the parameter servers' snapshot was taken into `ps/` at this step.
    pub ps_snapshot: bool,
    /// Dense optimizer steps taken.
    pub optimizer_step: u64,
    /// Length of every parameter tensor.
    pub param_sizes: Vec<usize>,
    /// Length of every optimizer tensor.
    pub optimizer_sizes: Vec<usize>,
    /// Bytes of saved error-feedback residuals after the tensors (0: none).
    #[serde(default)]
    pub residual_bytes: u64,
    /// Values of the dense top-k residual after those (0: none; [`crate::step::dense_sync`]).
    #[serde(default)]
    pub dense_residual_len: u64,
    /// The epoch the checkpoint was taken in (from 0; `--epochs`).
    #[serde(default)]
    pub epoch: u64,
    /// The step that epoch began at: the data position within the epoch is `step - epoch_start_step`
    /// batches.
    #[serde(default)]
    pub epoch_start_step: u64,
}

/// A rank's checkpoint in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The header.
    pub meta: CheckpointMeta,
    /// Parameter tensors, in [`Dlrm::params`] order.
    pub params: Vec<Vec<f32>>,
    /// Optimizer tensors, in [`crate::model::OptimizerState::tensors`] order.
    pub optimizer: Vec<Vec<f32>>,
    /// The error-feedback residuals ([`protocol::compression::feedback::ResidualStore::export`]); empty without.
    pub residuals: Vec<u8>,
    /// The dense top-k residual ([`crate::step::dense_sync::DenseSync::residual`]); empty without.
    pub dense_residual: Vec<f32>,
}

/// Asks every parameter server to snapshot its tables at `step` ([`protocol::PsClient::checkpoint`]) into
/// `dir/ps.tmp` (`dir` made absolute: the servers resolve it on their own file system, which must be the
/// trainer's or shared storage). [`commit_ps_snapshot`] then moves it to `dir/ps`. Every push must be
/// acknowledged before the call for the snapshot to hold exactly `step` batches.
pub async fn ps_snapshot<D: protocol::transport::Dialer>(
    client: &protocol::PsClient<D>,
    dir: &Path,
    step: u64,
) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let dir = dir.canonicalize().map_err(io(dir))?;
    let tmp = dir.join(format!("{PS_SNAPSHOT_DIR}.tmp"));
    remove_dir_if_present(&tmp)?;
    let target = tmp
        .to_str()
        .ok_or_else(|| CheckpointError::NotUtf8 { path: tmp.clone() })?;
    client
        .checkpoint(target, step)
        .await
        .map_err(CheckpointError::PsSnapshot)?;
    Ok(())
}

/// Replaces `dir/ps` by the snapshot [`ps_snapshot`] left in `dir/ps.tmp` (the previous one moves to
/// `dir/ps.old` until [`Checkpoint::write`] has recorded the new step, then [`finish_ps_snapshot`] removes it).
pub fn commit_ps_snapshot(dir: &Path) -> Result<(), CheckpointError> {
    let (cur, tmp, old) = ps_paths(dir);
    remove_dir_if_present(&old)?;
    if cur.exists() {
        std::fs::rename(&cur, &old).map_err(io(&cur))?;
    }
    std::fs::rename(&tmp, &cur).map_err(io(&tmp))
}

/// Removes the previous snapshot once the trainer's file names the new one.
pub fn finish_ps_snapshot(dir: &Path) -> Result<(), CheckpointError> {
    Ok(remove_dir_if_present(&ps_paths(dir).2)?)
}

fn ps_paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join(PS_SNAPSHOT_DIR),
        dir.join(format!("{PS_SNAPSHOT_DIR}.tmp")),
        dir.join(format!("{PS_SNAPSHOT_DIR}.old")),
    )
}

/// The checkpoint file of `rank` in `dir`.
pub fn file_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("trainer-rank{rank}.ckpt"))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| files::at(path)(source).into()
}

impl From<FileError> for CheckpointError {
    fn from(e: FileError) -> CheckpointError {
        CheckpointError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

impl Checkpoint {
    /// Copies `model`'s parameters and optimizer state, with the exported error-feedback `residuals` (empty
    /// for none); `meta`'s sizes and optimizer step are filled in.
    pub fn capture(
        model: &Dlrm,
        mut meta: CheckpointMeta,
        residuals: Vec<u8>,
        dense_residual: Vec<f32>,
    ) -> Checkpoint {
        let params: Vec<Vec<f32>> = model.params().iter().map(|p| p.to_vec()).collect();
        let opt = model.optimizer_state();
        let optimizer: Vec<Vec<f32>> = opt.tensors().iter().map(|t| t.to_vec()).collect();
        meta.optimizer_step = opt.step();
        meta.param_sizes = params.iter().map(Vec::len).collect();
        meta.optimizer_sizes = optimizer.iter().map(Vec::len).collect();
        meta.residual_bytes = residuals.len() as u64;
        meta.dense_residual_len = dense_residual.len() as u64;
        Checkpoint {
            meta,
            params,
            optimizer,
            residuals,
            dense_residual,
        }
    }

    /// Writes the checkpoint of `meta.rank` into `dir` (created if missing), atomically; returns the file.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, CheckpointError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = file_path(dir, self.meta.rank);
        let tmp = path.with_extension("ckpt.tmp");
        let header = serde_json::to_vec(&self.meta).expect("meta serializes");
        let tensors = self.params.iter().chain(&self.optimizer);
        let floats: usize = tensors.clone().map(Vec::len).sum();
        let mut buf = Vec::with_capacity(20 + header.len() + floats * 4 + self.residuals.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&(header.len() as u64).to_le_bytes());
        buf.extend_from_slice(&header);
        for t in tensors {
            for v in t {
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        buf.extend_from_slice(&self.residuals);
        for v in &self.dense_residual {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        write_atomic(dir, &path, &tmp, &buf)?;
        Ok(path)
    }

    /// Reads the checkpoint of `rank` from `dir`.
    pub fn read(dir: &Path, rank: usize) -> Result<Checkpoint, CheckpointError> {
        let path = file_path(dir, rank);
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.clone(),
            reason,
        };
        if bytes.len() < 20 || &bytes[..8] != MAGIC {
            return Err(corrupt("not a trainer checkpoint (bad magic)".into()));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(corrupt(format!(
                "format version {version}, expected {VERSION}"
            )));
        }
        let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        if len > MAX_HEADER || 20 + len as usize > bytes.len() {
            return Err(corrupt(format!(
                "header length {len} does not fit the file"
            )));
        }
        let end = 20 + len as usize;
        let meta: CheckpointMeta =
            serde_json::from_slice(&bytes[20..end]).map_err(|e| corrupt(format!("header: {e}")))?;
        let floats: usize = meta.param_sizes.iter().chain(&meta.optimizer_sizes).sum();
        let dense_bytes = meta.dense_residual_len.saturating_mul(4);
        let expected = (floats as u64 * 4)
            .saturating_add(meta.residual_bytes)
            .saturating_add(dense_bytes);
        if (bytes.len() - end) as u64 != expected {
            return Err(corrupt(format!(
                "{} bytes after the header, expected {expected} ({} of tensors, {} of residuals, {dense_bytes} of \
                 the dense residual; truncated?)",
                bytes.len() - end,
                floats * 4,
                meta.residual_bytes
            )));
        }
        let mut at = end;
        let mut take = |n: usize| {
            let t: Vec<f32> = bytes[at..at + n * 4]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            at += n * 4;
            t
        };
        let params = meta.param_sizes.iter().map(|&n| take(n)).collect();
        let optimizer = meta.optimizer_sizes.iter().map(|&n| take(n)).collect();
        let residuals_end = end + floats * 4 + meta.residual_bytes as usize;
        let residuals = bytes[end + floats * 4..residuals_end].to_vec();
        let dense_residual = bytes[residuals_end..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok(Checkpoint {
            meta,
            params,
            optimizer,
            residuals,
            dense_residual,
        })
    }

    /// Sets `model`'s parameters and optimizer state to the checkpoint's.
    pub fn restore_into(&self, model: &mut Dlrm, dir: &Path) -> Result<(), CheckpointError> {
        let mismatch = |e: ModelError| CheckpointError::Mismatch {
            path: file_path(dir, self.meta.rank),
            reason: e.to_string(),
        };
        let params: Vec<&[f32]> = self.params.iter().map(Vec::as_slice).collect();
        model.set_params(&params).map_err(mismatch)?;
        let tensors: Vec<&[f32]> = self.optimizer.iter().map(Vec::as_slice).collect();
        model
            .optimizer_state_mut()
            .restore(self.meta.optimizer_step, &tensors)
            .map_err(mismatch)
    }

    /// Checks that the checkpoint belongs to a job with this rank, world and batch size.
    pub fn check_job(
        &self,
        dir: &Path,
        rank: usize,
        world: usize,
        batch_size: usize,
    ) -> Result<(), CheckpointError> {
        let m = &self.meta;
        if (m.rank, m.world, m.batch_size) != (rank, world, batch_size) {
            return Err(CheckpointError::Mismatch {
                path: file_path(dir, rank),
                reason: format!(
                    "saved by rank {} of {} with batch size {}, resumed as rank {rank} of {world} with batch size {batch_size}",
                    m.rank, m.world, m.batch_size
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DenseOptimizer;

    fn model(seed: u64) -> Dlrm {
        let opt = DenseOptimizer::adam(0.01);
        Dlrm::tiny(opt, seed)
    }

    fn meta() -> CheckpointMeta {
        CheckpointMeta {
            step: 7,
            samples: 21,
            rank: 1,
            world: 2,
            batch_size: 3,
            dense_on_ps: false,
            ps_snapshot: false,
            optimizer_step: 0,
            param_sizes: vec![],
            optimizer_sizes: vec![],
            residual_bytes: 0,
            dense_residual_len: 0,
            epoch: 1,
            epoch_start_step: 5,
        }
    }

    #[test]
    fn round_trip_restores_params_and_optimizer_state() {
        let mut a = model(1);
        let (b, ns, d) = (3, 2, 4);
        let mut g = vec![0.0; b * ns * d];
        for _ in 0..2 {
            a.train_step(
                b,
                &vec![0.3; b * 13],
                &vec![0.1; b * ns * d],
                &[1.0, 0.0, 1.0],
                &mut g,
            )
            .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let ckpt = Checkpoint::capture(&a, meta(), b"residual bytes".to_vec(), vec![0.5, -2.0]);
        let path = ckpt.write(dir.path()).unwrap();
        assert!(path.ends_with("trainer-rank1.ckpt"));
        let back = Checkpoint::read(dir.path(), 1).unwrap();
        assert_eq!(back, ckpt);
        assert_eq!(back.residuals, b"residual bytes");
        assert_eq!(back.dense_residual, [0.5, -2.0]);
        assert_eq!(back.meta.optimizer_step, 2);
        let mut fresh = model(2);
        back.restore_into(&mut fresh, dir.path()).unwrap();
        assert_eq!(fresh.params(), a.params());
        assert_eq!(
            fresh.optimizer_state().tensors(),
            a.optimizer_state().tensors()
        );
        assert_eq!(fresh.steps(), 2);
        assert!(back.check_job(dir.path(), 1, 2, 3).is_ok());
        let err = back.check_job(dir.path(), 0, 2, 3).unwrap_err().to_string();
        assert!(err.contains("resumed as rank 0 of 2"), "{err}");
    }

    #[test]
    fn truncated_and_foreign_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = Checkpoint::capture(&model(1), meta(), vec![7; 10], vec![1.0; 3])
            .write(dir.path())
            .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = Checkpoint::read(dir.path(), 1).unwrap_err().to_string();
        assert!(
            err.contains("truncated") && err.contains("10 of residuals"),
            "{err}"
        );
        std::fs::write(&path, b"hello world, not a checkpoint").unwrap();
        let err = Checkpoint::read(dir.path(), 1).unwrap_err().to_string();
        assert!(err.contains("bad magic"), "{err}");
        let err = Checkpoint::read(dir.path(), 5).unwrap_err().to_string();
        assert!(err.contains("trainer-rank5.ckpt"), "{err}");
    }
}
