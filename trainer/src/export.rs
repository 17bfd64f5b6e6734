//! Writing an export (the format: [`model::export`]): the servers snapshot their tables into a staged version,
//! then the model's files complete it (docs/serving.md, "Export").

use std::path::{Path, PathBuf};

use crate::model::export::{ExportManifest, Staging};
use crate::model::Dlrm;

/// Why an export could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A file of the export could not be written.
    #[error(transparent)]
    Files(#[from] crate::model::export::ExportError),
    /// The export directory's path is not UTF-8, so it cannot be sent to the servers.
    #[error("export directory {} is not UTF-8", path.display())]
    NotUtf8 {
        /// The directory.
        path: PathBuf,
    },
    /// A server failed to snapshot its tables.
    #[error("snapshot the parameter servers: {0}")]
    PsSnapshot(#[source] protocol::ProtocolError),
}

/// Writes version `manifest.version` under `root`: the servers snapshot their tables into it (every push must
/// be acknowledged for the rows to match `model`), then the dense parameters and the manifest; renames it into
/// place, points `LATEST` at it and removes versions beyond the newest `keep`. Returns the version directory.
/// The servers leave out of their snapshots the rows `prune` names (publish-time pruning).
pub async fn write<D: protocol::transport::Dialer>(
    client: &protocol::PsClient<D>,
    root: &Path,
    mut manifest: ExportManifest,
    model: &Dlrm,
    keep: usize,
    prune: Option<embedding::ExportPrune>,
) -> Result<PathBuf, ExportError> {
    let staging = Staging::begin(root, manifest.version)?;
    let snapshot = staging.snapshot_dir();
    let target = snapshot.to_str().ok_or_else(|| ExportError::NotUtf8 {
        path: snapshot.clone(),
    })?;
    let shards = client
        .export_snapshot(target, manifest.version, prune)
        .await
        .map_err(ExportError::PsSnapshot)?;
    manifest.num_shards = shards.len() as u32;
    Ok(tokio::task::block_in_place(|| {
        staging.commit(manifest, model, keep)
    })?)
}
