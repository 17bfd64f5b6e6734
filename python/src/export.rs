//! Exports of models trained from Python (`Client.export_dlrm`, `pstrain.torchrec.export_dlrm`): the same
//! format the trainer writes (`model::export`, docs/serving.md "Export"), so that `ps-serve --export` loads
//! a TorchRec DLRM trained through the servers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use embedding::TableConfig;
use model::export::{ExportManifest, Staging, EXPORT_FORMAT_VERSION};
use model::spec::ModelSpec;
use model::{DenseOptimizer, Dlrm, Precision};
use protocol::PsClient;

use crate::errors::RequestError;
use crate::runtime;

/// Why an export could not be written. Messages name the value at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    /// The model spec does not parse or does not describe the model.
    #[error("export: model spec: {0}")]
    Spec(String),
    /// The dense parameters do not fit the spec's model.
    #[error("export: dense parameters: {0}")]
    Params(String),
    /// A file of the export could not be written.
    #[error("export: {0}")]
    Files(#[from] model::export::ExportError),
    /// The servers' snapshot failed.
    #[error("{}", .0.message)]
    Request(RequestError),
}

/// Writes version `version` under `root`: the servers snapshot their tables into the staged version, then
/// the dense parameters and the manifest complete it (`LATEST` names it; versions beyond the newest `keep` are
/// removed). `tables` are the spec's tables as registered on the servers (matched by name when the export is
/// opened). Returns the version directory.
pub(crate) fn write(
    client: &Arc<PsClient>,
    timeout: Duration,
    root: &Path,
    (version, samples, keep): (u64, u64, usize),
    spec_toml: &str,
    tables: Vec<TableConfig>,
    params: &[Vec<f32>],
) -> Result<PathBuf, ExportError> {
    let spec = ModelSpec::parse(spec_toml).map_err(|e| ExportError::Spec(e.to_string()))?;
    for t in &spec.tables {
        let Some(cfg) = tables.iter().find(|c| c.name == t.name) else {
            let names: Vec<&str> = tables.iter().map(|c| c.name.as_str()).collect();
            return Err(ExportError::Spec(format!(
                "table {:?} is not among the tables given {names:?}",
                t.name
            )));
        };
        if cfg.dim != t.dim {
            return Err(ExportError::Spec(format!(
                "table {:?} has dim {} on the servers, {} in the spec",
                t.name, cfg.dim, t.dim
            )));
        }
    }
    // The optimizer is never used: the model only carries the parameters into the export's files.
    let mut dlrm = Dlrm::new(spec.dlrm_config(), DenseOptimizer::Sgd { lr: 1.0 }, 0)
        .map_err(|e| ExportError::Spec(e.to_string()))?;
    let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    dlrm.set_params(&refs)
        .map_err(|e| ExportError::Params(e.to_string()))?;
    if let Some((tensor, i)) = params
        .iter()
        .enumerate()
        .find_map(|(t, p)| p.iter().position(|x| !x.is_finite()).map(|i| (t, i)))
    {
        return Err(ExportError::Params(format!(
            "tensor {tensor} element {i} is {}: parameters must be finite",
            params[tensor][i]
        )));
    }
    let staging = Staging::begin(root, version)?;
    let target = staging.snapshot_dir();
    let what = format!("snapshot of the servers into {}", target.display());
    let shards = runtime()
        .block_on(async {
            let target = target.to_string_lossy().into_owned();
            match tokio::time::timeout(timeout, client.export_snapshot(&target, version, None))
                .await
            {
                Ok(r) => r.map_err(|e| RequestError::new(&what, e)),
                Err(_) => Err(RequestError::timeout(&what, timeout.as_secs_f64())),
            }
        })
        .map_err(ExportError::Request)?;
    let created_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let manifest = ExportManifest {
        format: EXPORT_FORMAT_VERSION,
        version,
        samples,
        created_unix_ms,
        spec,
        tables,
        precision: Precision::F32,
        param_sizes: Vec::new(),
        num_shards: shards.len() as u32,
    };
    Ok(staging.commit(manifest, &dlrm, keep)?)
}
