//! Exports: a servable model written by a training job and read by the serving process (docs/serving.md,
//! "Export"). This module is the format: its layout, [`ExportManifest`], reading ([`Export::open`]) and the
//! file half of writing ([`Staging`]); the trainer fills a staged version with the servers' snapshot
//! (`trainer::export::write`).
//!
//! An export root holds one directory per version, `v<step, 12 digits>/`, each with
//! - `manifest.json`: an [`ExportManifest`] (the resolved model spec, table configs, precision, tensor sizes),
//!   written last and atomically: a version directory without it is incomplete and refused;
//! - `dense.bin`: the dense parameters, f32 LE, in [`Dlrm::params`] order;
//! - `ps/shard-<i>-of-<n>/`: the parameter servers' snapshot (`embedding::snapshot`), each shard with its
//!   `sync.json` (where delta sync resumes);
//!
//! and `LATEST`, naming the newest complete version, replaced atomically after it. A version is built in
//! `v<step>.tmp/` and renamed, so a reader never sees half of one; older versions beyond `--export-keep`
//! are removed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files::{at, remove_dir_if_present, write_atomic, FileError};
use crate::spec::ModelSpec;
use crate::{Dlrm, DlrmConfig, Precision};
use protocol::TableConfig;

/// Version of the export layout; readers refuse others. Version 2: the manifest's tables are
/// [`TableConfig`]s (in their JSON form, as in a server's store), no longer the wire-only table specs of
/// version 1.
pub const EXPORT_FORMAT_VERSION: u32 = 2;
/// The manifest's file name in a version directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The dense parameters' file name in a version directory.
pub const DENSE_FILE: &str = "dense.bin";
/// The dense parameters as SafeTensors, one tensor per parameter ([`Dlrm::param_names`]), readable without
/// our code (docs/serving.md).
pub const DENSE_TENSORS_FILE: &str = "dense.safetensors";
/// `format` in [`DENSE_TENSORS_FILE`]'s metadata.
pub const DENSE_TENSORS_FORMAT: &str = "pstrain.dense.v1";
/// The servers' snapshot directory in a version directory.
pub const SNAPSHOT_DIR: &str = "ps";
/// The file naming the newest complete version in an export root.
pub const LATEST_FILE: &str = "LATEST";

/// What an export records besides its tensors and rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportManifest {
    /// [`EXPORT_FORMAT_VERSION`].
    pub format: u32,
    /// The export's version: the training step it was taken at.
    pub version: u64,
    /// Training samples seen by the exporting rank.
    pub samples: u64,
    /// Wall-clock time of the export, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// The model, every setting resolved.
    pub spec: ModelSpec,
    /// The embedding tables as the servers registered them (ids, dims, initializers: a row the snapshot lacks
    /// reads as its initializer, as a pull would).
    pub tables: Vec<TableConfig>,
    /// Arithmetic of the dense layers the trainer evaluated with.
    pub precision: Precision,
    /// Length of each parameter tensor in `dense.bin`.
    pub param_sizes: Vec<usize>,
    /// Number of parameter servers whose snapshot is in `ps/`.
    pub num_shards: u32,
}

/// Why an export could not be written or read. Messages name the path and the value.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A file operation failed.
    #[error("export {0}")]
    File(#[from] FileError),
    /// The path holds no export.
    #[error("{}: no export here (neither {LATEST_FILE} nor {MANIFEST_FILE})", path.display())]
    NotAnExport {
        /// The path given.
        path: PathBuf,
    },
    /// A file of the export is not what the manifest says.
    #[error("export {}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The directory name of version `version`.
pub fn version_dir_name(version: u64) -> String {
    format!("v{version:012}")
}

/// One export read back: its directory, manifest and dense parameters.
#[derive(Debug, Clone)]
pub struct Export {
    /// The version directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: ExportManifest,
    /// The dense parameters, one tensor per [`ExportManifest::param_sizes`] entry.
    pub params: Vec<Vec<f32>>,
    /// Per table of the spec (in spec order), its id on the servers (and in the snapshot): the id of the
    /// registered table of the same name. A trainer registers spec table `t` as id `t`; a Python job's tables
    /// have ids of their own (`pstrain`: a hash of the name).
    pub table_ids: Vec<u32>,
}

impl Export {
    /// Opens `path`: an export root (its `LATEST` version) or one version directory.
    pub fn open(path: &Path) -> Result<Export, ExportError> {
        let dir = resolve(path)?;
        let manifest_path = dir.join(MANIFEST_FILE);
        let corrupt = |p: &Path, reason: String| ExportError::Corrupt {
            path: p.to_path_buf(),
            reason,
        };
        let text = std::fs::read(&manifest_path).map_err(at(&manifest_path))?;
        let manifest: ExportManifest = serde_json::from_slice(&text)
            .map_err(|e| corrupt(&manifest_path, format!("manifest: {e}")))?;
        if manifest.format != EXPORT_FORMAT_VERSION {
            return Err(corrupt(
                &manifest_path,
                format!(
                    "format version {}, expected {EXPORT_FORMAT_VERSION}",
                    manifest.format
                ),
            ));
        }
        let dense_path = dir.join(DENSE_FILE);
        let bytes = std::fs::read(&dense_path).map_err(at(&dense_path))?;
        let floats: usize = manifest.param_sizes.iter().sum();
        if bytes.len() != floats.saturating_mul(4) {
            return Err(corrupt(
                &dense_path,
                format!(
                    "{} bytes, expected {} ({floats} f32 parameters; truncated?)",
                    bytes.len(),
                    floats * 4
                ),
            ));
        }
        let table_ids = manifest
            .spec
            .tables
            .iter()
            .map(|t| {
                manifest
                    .tables
                    .iter()
                    .find(|c| c.name == t.name)
                    .map(|c| c.id)
                    .ok_or_else(|| {
                        let names: Vec<&str> =
                            manifest.tables.iter().map(|c| c.name.as_str()).collect();
                        corrupt(
                            &manifest_path,
                            format!(
                                "the spec's table {:?} is not among the registered tables {names:?}",
                                t.name
                            ),
                        )
                    })
            })
            .collect::<Result<Vec<u32>, ExportError>>()?;
        let mut at = 0;
        let params = manifest
            .param_sizes
            .iter()
            .map(|&n| {
                let t = bytes[at..at + n * 4]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect();
                at += n * 4;
                t
            })
            .collect();
        Ok(Export {
            dir,
            manifest,
            params,
            table_ids,
        })
    }

    /// The dense model's sizes.
    pub fn dlrm_config(&self) -> DlrmConfig {
        self.manifest.spec.dlrm_config()
    }

    /// The servers' snapshot directory of this version.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_DIR)
    }
}

/// The version directory `path` names: itself when it holds a manifest, else its root's `LATEST`.
fn resolve(path: &Path) -> Result<PathBuf, ExportError> {
    if path.join(MANIFEST_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join(LATEST_FILE);
    match std::fs::read_to_string(&latest) {
        Ok(name) => {
            let name = name.trim();
            let ok =
                name.starts_with('v') && !name.contains(['/', '\\']) && name != "." && name != "..";
            if !ok {
                return Err(ExportError::Corrupt {
                    path: latest,
                    reason: format!("names {name:?}, not a version directory"),
                });
            }
            Ok(path.join(name))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ExportError::NotAnExport {
            path: path.to_path_buf(),
        }),
        Err(source) => Err(FileError {
            path: latest,
            source,
        }
        .into()),
    }
}

/// A version being written: built in `v<version>.tmp/` under the root, then renamed into place by
/// [`Staging::commit`]. Call order: [`Staging::begin`], fill [`Staging::snapshot_dir`] (the servers' snapshot),
/// [`Staging::commit`].
#[derive(Debug)]
pub struct Staging {
    root: PathBuf,
    name: String,
    tmp: PathBuf,
}

impl Staging {
    /// Creates `root` if missing and an empty `v<version>.tmp/` in it (a stale one is removed first).
    pub fn begin(root: &Path, version: u64) -> Result<Staging, ExportError> {
        std::fs::create_dir_all(root).map_err(at(root))?;
        let root = root.canonicalize().map_err(at(root))?;
        let name = version_dir_name(version);
        let tmp = root.join(format!("{name}.tmp"));
        remove_dir_if_present(&tmp)?;
        std::fs::create_dir_all(&tmp).map_err(at(&tmp))?;
        Ok(Staging { root, name, tmp })
    }

    /// Where the servers' snapshot goes.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.tmp.join(SNAPSHOT_DIR)
    }

    /// Writes the dense parameters of `model` and `manifest` (its `param_sizes` set from `model`), renames the
    /// version into place, points `LATEST` at it and removes versions beyond the newest `keep`. Returns the
    /// version directory. Blocking file I/O.
    pub fn commit(
        self,
        mut manifest: ExportManifest,
        model: &Dlrm,
        keep: usize,
    ) -> Result<PathBuf, ExportError> {
        let Staging { root, name, tmp } = self;
        let done = root.join(&name);
        let params = model.params();
        manifest.param_sizes = params.iter().map(|p| p.len()).collect();
        let mut dense = Vec::with_capacity(manifest.param_sizes.iter().sum::<usize>() * 4);
        for v in params.iter().flat_map(|p| p.iter()) {
            dense.extend_from_slice(&v.to_le_bytes());
        }
        write_atomic(
            &tmp,
            &tmp.join(DENSE_FILE),
            &tmp.join("dense.bin.tmp"),
            &dense,
        )?;
        write_dense_tensors(&tmp.join(DENSE_TENSORS_FILE), model)?;
        let json = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
        write_atomic(
            &tmp,
            &tmp.join(MANIFEST_FILE),
            &tmp.join("manifest.json.tmp"),
            &json,
        )?;
        remove_dir_if_present(&done)?;
        std::fs::rename(&tmp, &done).map_err(at(&done))?;
        write_atomic(
            &root,
            &root.join(LATEST_FILE),
            &root.join("LATEST.tmp"),
            format!("{name}\n").as_bytes(),
        )?;
        prune(&root, keep, &name)?;
        Ok(done)
    }
}

/// Writes `model`'s dense parameters as SafeTensors ([`DENSE_TENSORS_FILE`]), one tensor per parameter named
/// as [`Dlrm::param_names`] says.
fn write_dense_tensors(path: &Path, model: &Dlrm) -> Result<(), FileError> {
    use embedding::tensors::{write_file, Dtype, TensorSpec};
    let names = model.param_names();
    let params = model.params();
    let specs: Vec<TensorSpec> = names
        .into_iter()
        .map(|(name, shape)| TensorSpec {
            name,
            dtype: Dtype::F32,
            shape,
        })
        .collect();
    let meta = std::collections::BTreeMap::from([(
        "format".to_string(),
        DENSE_TENSORS_FORMAT.to_string(),
    )]);
    write_file(path, &specs, &meta, &mut |k, out| {
        let bytes: Vec<u8> = params[k].iter().flat_map(|v| v.to_le_bytes()).collect();
        out.write_all(&bytes)
            .map_err(|source| embedding::tensors::TensorsError::Io {
                path: path.to_owned(),
                source,
            })
    })
    .map_err(|e| match e {
        embedding::tensors::TensorsError::Io { path, source } => FileError { path, source },
        other => FileError {
            path: path.to_owned(),
            source: std::io::Error::other(other.to_string()),
        },
    })?;
    Ok(())
}

/// Keeps `latest` (the version `LATEST` names, whatever its number: a job restarted with a lower step count
/// exports lower versions than the ones it finds) and the newest of the others up to `keep` versions in all
/// (at least `latest`); removes the rest.
fn prune(root: &Path, keep: usize, latest: &str) -> Result<(), FileError> {
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(root).map_err(at(root))? {
        let entry = entry.map_err(at(root))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(digits) = name.strip_prefix('v') else {
            continue;
        };
        if name == latest {
            continue;
        }
        if let Ok(v) = digits.parse::<u64>() {
            versions.push((v, entry.path()));
        }
    }
    versions.sort();
    let drop = versions.len().saturating_sub(keep.max(1) - 1);
    for (_, path) in &versions[..drop] {
        remove_dir_if_present(path)?;
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_refuses_what_is_not_an_export() {
        let dir = tempfile::tempdir().unwrap();
        let e = Export::open(dir.path()).unwrap_err();
        assert!(matches!(e, ExportError::NotAnExport { .. }), "{e}");
        std::fs::write(dir.path().join(LATEST_FILE), "../etc\n").unwrap();
        let e = Export::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a version directory"), "{e}");
    }

    #[test]
    fn prune_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        for v in [3u64, 10, 7, 12] {
            std::fs::create_dir(dir.path().join(version_dir_name(v))).unwrap();
        }
        std::fs::create_dir(dir.path().join("other")).unwrap();
        let left = |dir: &Path| {
            let mut left: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            left.sort();
            left
        };
        prune(dir.path(), 2, &version_dir_name(12)).unwrap();
        assert_eq!(
            left(dir.path()),
            ["other", "v000000000010", "v000000000012"]
        );
        // A restarted job exports a lower version than those it finds: the one LATEST names stays.
        std::fs::create_dir(dir.path().join(version_dir_name(2))).unwrap();
        prune(dir.path(), 2, &version_dir_name(2)).unwrap();
        assert_eq!(
            left(dir.path()),
            ["other", "v000000000002", "v000000000012"]
        );
        prune(dir.path(), 0, &version_dir_name(2)).unwrap();
        assert_eq!(left(dir.path()), ["other", "v000000000002"]);
    }

    /// The spec's tables are found among the registered ones by name, whatever their ids (a Python job's tables
    /// have ids of their own); a spec table missing from them refuses the export naming it.
    #[test]
    fn tables_are_matched_by_name() {
        let text = "name = \"t\"\nbottom_mlp = [8, 4]\ntop_mlp = [4, 1]\n[sparse]\ndim = 4\n\
                    [[feature]]\ncolumn = \"C1\"\ntable = \"a\"\n[[feature]]\ncolumn = \"C2\"\ntable = \"b\"\n";
        let spec = ModelSpec::parse(text).unwrap();
        let model = Dlrm::new(
            spec.dlrm_config(),
            crate::DenseOptimizer::Sgd { lr: 1.0 },
            1,
        )
        .unwrap();
        let write = |tables: Vec<TableConfig>| {
            let dir = tempfile::tempdir().unwrap();
            let staging = Staging::begin(dir.path(), 3).unwrap();
            std::fs::create_dir_all(staging.snapshot_dir()).unwrap();
            let manifest = ExportManifest {
                format: EXPORT_FORMAT_VERSION,
                version: 3,
                samples: 0,
                created_unix_ms: 0,
                spec: spec.clone(),
                tables,
                precision: Precision::F32,
                param_sizes: Vec::new(),
                num_shards: 1,
            };
            staging.commit(manifest, &model, 1).unwrap();
            (Export::open(dir.path()), dir)
        };
        let (export, _dir) = write(vec![
            TableConfig::new(5, "b", 4),
            TableConfig::new(77, "a", 4),
        ]);
        assert_eq!(export.unwrap().table_ids, [77, 5]);
        let (export, _dir) = write(vec![TableConfig::new(77, "a", 4)]);
        let err = export.unwrap_err().to_string();
        assert!(
            err.contains("table \"b\" is not among the registered tables [\"a\"]"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod tensor_tests {
    use super::*;
    use crate::spec::ModelSpec;

    /// `dense.safetensors` holds every parameter under its name and shape, equal to `dense.bin`'s values.
    #[test]
    fn dense_tensors_name_every_parameter() {
        let text = "name = \"t\"\nbottom_mlp = [8, 4]\ntop_mlp = [4, 1]\n[sparse]\ndim = 4\n\
                    [[feature]]\ncolumn = \"C1\"\ntable = \"a\"\n\
                    [interaction]\nkind = \"dcn\"\nlayers = 2\nrank = 3\n";
        let spec = ModelSpec::parse(text).unwrap();
        let model = Dlrm::new(
            spec.dlrm_config(),
            crate::DenseOptimizer::Sgd { lr: 1.0 },
            5,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging::begin(dir.path(), 4).unwrap();
        std::fs::create_dir_all(staging.snapshot_dir()).unwrap();
        let manifest = ExportManifest {
            format: EXPORT_FORMAT_VERSION,
            version: 4,
            samples: 0,
            created_unix_ms: 0,
            spec: spec.clone(),
            tables: vec![TableConfig::new(1, "a", 4)],
            precision: Precision::F32,
            param_sizes: Vec::new(),
            num_shards: 1,
        };
        let done = staging.commit(manifest, &model, 1).unwrap();
        let f = embedding::tensors::read_file(&done.join(DENSE_TENSORS_FILE)).unwrap();
        assert_eq!(f.metadata()["format"], DENSE_TENSORS_FORMAT);
        let names = model.param_names();
        assert_eq!(names.len(), model.params().len());
        let mut listed: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            listed[..4],
            [
                "bottom.0.weight",
                "bottom.0.bias",
                "bottom.1.weight",
                "bottom.1.bias"
            ]
        );
        assert!(listed.contains(&"cross.1.v.weight") && listed.contains(&"cross.1.u.bias"));
        assert_eq!(listed.last(), Some(&"top.1.bias"));
        for ((name, shape), values) in names.iter().zip(model.params()) {
            assert_eq!(shape.iter().product::<usize>(), values.len(), "{name}");
            assert_eq!(f.f32(name, shape).unwrap(), values, "{name}");
        }
        listed.sort();
        let mut in_file: Vec<&str> = f.names().collect();
        in_file.sort();
        assert_eq!(in_file, listed, "no other tensor");
    }
}
