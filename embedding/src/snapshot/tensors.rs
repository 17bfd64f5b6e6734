//! A shard snapshot's tables as one SafeTensors file, [`TABLES_FILE`] in the shard directory: per table
//! `<name>.ids` (U64 `[rows]`, increasing), `<name>.weight` (`[rows, dim]`, in the table's precision: F32,
//! BF16 or F16, as stored) and, for optimizers with
//! state, `<name>.state` (F32 `[rows, state_len]`: row-wise Adagrad's accumulator, Adam's moments and step;
//! F32 also for a table whose moments are stored in bf16, `state_precision`: the values are bf16 values then);
//! `__metadata__` holds the format, the step, the shard and each table's config (`<name>.config`, the JSON
//! of [`TableConfig`]). A table whose name another table of the shard shares is written as `<name>@<id>`.
//! Written from the snapshot's database (every row, the cold ones too) after its manifest, so it holds
//! exactly the snapshot's rows.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::{Snapshot, SnapshotError};
use crate::tensors::{read_file, write_file, Dtype, TensorFile, TensorSpec, TensorsError};
use crate::TableConfig;

/// The file's name in a shard directory.
pub const TABLES_FILE: &str = "tables.safetensors";

/// `format` in the metadata.
pub const TABLES_FORMAT: &str = "pstrain.tables.v1";

/// One table of a [`TABLES_FILE`], read back.
#[derive(Debug, Clone, PartialEq)]
pub struct TableTensors {
    /// The tensors' name prefix (the table's name, or `<name>@<id>`).
    pub prefix: String,
    /// The table's config.
    pub config: TableConfig,
    /// Ids, increasing.
    pub ids: Vec<u64>,
    /// Weights, `ids x dim`.
    pub weights: Vec<f32>,
    /// Optimizer state, `ids x state_len` (empty for SGD).
    pub state: Vec<f32>,
}

/// The dtype of a table's `.weight` tensor: its row precision.
fn weight_dtype(p: crate::RowPrecision) -> Dtype {
    match p {
        crate::RowPrecision::F32 => Dtype::F32,
        crate::RowPrecision::Bf16 => Dtype::BF16,
        crate::RowPrecision::F16 => Dtype::F16,
    }
}

/// Each table's tensor name prefix, by position in `tables`.
fn prefixes(tables: &[&TableConfig]) -> Vec<String> {
    tables
        .iter()
        .map(|t| {
            if tables.iter().filter(|o| o.name == t.name).count() > 1 {
                format!("{}@{}", t.name, t.id)
            } else {
                t.name.clone()
            }
        })
        .collect()
}

/// Writes `shard_dir/`[`TABLES_FILE`] from the snapshot in `shard_dir` (which must be complete: its manifest
/// written). Returns the file's size in bytes.
pub fn write_tables(shard_dir: &Path) -> Result<u64, SnapshotError> {
    let snap = Snapshot::open(shard_dir)?;
    let m = snap.manifest();
    let mut entries: Vec<_> = m.tables.iter().collect();
    entries.sort_by_key(|t| t.id);
    let configs: Vec<&TableConfig> = entries.iter().map(|t| &t.config).collect();
    let prefixes = prefixes(&configs);
    let mut specs = Vec::new();
    // Per tensor: (table position, part: 0 ids, 1 weights, 2 state).
    let mut parts = Vec::new();
    let mut meta = BTreeMap::from([
        ("format".to_string(), TABLES_FORMAT.to_string()),
        ("step".to_string(), m.step.to_string()),
        ("shard".to_string(), m.shard.index.to_string()),
        ("num_shards".to_string(), m.shard.num_shards.to_string()),
    ]);
    for (k, (t, prefix)) in entries.iter().zip(&prefixes).enumerate() {
        let rows = t.rows as usize;
        let state_len = t.row_len - t.dim;
        meta.insert(
            format!("{prefix}.config"),
            serde_json::to_string(&t.config).expect("config serializes"),
        );
        specs.push(TensorSpec {
            name: format!("{prefix}.ids"),
            dtype: Dtype::U64,
            shape: vec![rows],
        });
        parts.push((k, 0));
        specs.push(TensorSpec {
            name: format!("{prefix}.weight"),
            dtype: weight_dtype(t.config.precision),
            shape: vec![rows, t.dim],
        });
        parts.push((k, 1));
        if state_len > 0 {
            specs.push(TensorSpec {
                name: format!("{prefix}.state"),
                dtype: Dtype::F32,
                shape: vec![rows, state_len],
            });
            parts.push((k, 2));
        }
    }
    let path = shard_dir.join(TABLES_FILE);
    // A failing disk stays an I/O error (transient for the caller); anything else is the snapshot's fault.
    let to_snapshot = |e: TensorsError| match e {
        TensorsError::Io { path, source } => SnapshotError::Io {
            path,
            op: "write the tables as SafeTensors",
            detail: source.to_string(),
        },
        other => SnapshotError::Mismatch {
            path: shard_dir.to_owned(),
            detail: other.to_string(),
        },
    };
    write_file(&path, &specs, &meta, &mut |n, out: &mut dyn Write| {
        let (k, part) = parts[n];
        let t = entries[k];
        // The stored row is the weights in the table's precision, padded to whole words (odd dims of half
        // tables), then the f32 state, all little-endian: the file's bytes as they are.
        let dim_bytes = t.dim * t.config.precision.weight_bytes();
        let state_at = dim_bytes.next_multiple_of(4);
        // Moments stored in bf16 (`state_precision`) are written as F32: decoded first.
        let codec = t.config.row_codec();
        let (mut words, mut row, mut state_bytes) = (Vec::new(), Vec::new(), Vec::new());
        if codec.half_state() > 0 {
            (words, row) = (vec![0u32; codec.words()], vec![0f32; codec.row_len()]);
        }
        let mut failed = None;
        let scanned = snap.for_each_row(t.id, &mut |id, bytes| {
            let r = match part {
                0 => out.write_all(&id.to_le_bytes()),
                1 => out.write_all(&bytes[..dim_bytes]),
                _ if codec.half_state() > 0 && bytes.len() == words.len() * 4 => {
                    codec.words_from_bytes(bytes, &mut words);
                    codec.decode(&words, &mut row);
                    state_bytes.clear();
                    for v in &row[t.dim..] {
                        state_bytes.extend_from_slice(&v.to_le_bytes());
                    }
                    out.write_all(&state_bytes)
                }
                _ => out.write_all(&bytes[state_at..]),
            };
            r.map_err(|e| {
                let detail = e.to_string();
                failed = Some(e);
                SnapshotError::Mismatch {
                    path: path.clone(),
                    detail,
                }
            })
        });
        match (scanned, failed) {
            (_, Some(source)) => Err(TensorsError::Io {
                path: path.clone(),
                source,
            }),
            (Err(e), None) => Err(TensorsError::Format {
                path: path.clone(),
                detail: e.to_string(),
            }),
            (Ok(_), None) => Ok(()),
        }
    })
    .map_err(to_snapshot)
}

/// Reads a [`TABLES_FILE`] back, checking every table's tensors against its config (dtype, shape, ids
/// increasing); a missing or malformed tensor is refused naming it.
pub fn read_tables(path: &Path) -> Result<Vec<TableTensors>, TensorsError> {
    tables_of(&read_file(path)?)
}

/// The tables of a [`TABLES_FILE`] already read ([`read_file`]), checked as [`read_tables`] does: for a caller
/// that also needs the file's metadata, without reading it twice.
pub fn tables_of(f: &TensorFile) -> Result<Vec<TableTensors>, TensorsError> {
    let path = f.path();
    let bad = |tensor: &str, detail: String| TensorsError::Tensor {
        path: path.to_owned(),
        tensor: tensor.to_owned(),
        detail,
    };
    match f.metadata().get("format") {
        Some(v) if v == TABLES_FORMAT => {}
        other => {
            return Err(bad(
                "__metadata__",
                format!("format {other:?}, expected {TABLES_FORMAT:?}"),
            ))
        }
    }
    let mut prefixes: Vec<&String> = f
        .metadata()
        .keys()
        .filter_map(|k| k.strip_suffix(".config").map(|_| k))
        .collect();
    prefixes.sort();
    let mut out = Vec::new();
    for key in prefixes {
        let prefix = key.strip_suffix(".config").expect("filtered").to_string();
        let config: TableConfig = serde_json::from_str(&f.metadata()[key])
            .map_err(|e| bad(key, format!("config does not parse: {e}")))?;
        let name = format!("{prefix}.ids");
        let rows = match f.shape(&name)? {
            [n] => *n,
            other => return Err(bad(&name, format!("shape {other:?}, expected [rows]"))),
        };
        let ids = f.u64(&name, &[rows])?.to_vec();
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad(&name, "ids are not increasing".into()));
        }
        let name = format!("{prefix}.weight");
        let weights = f.f32(&name, &[rows, config.dim])?.to_vec();
        // Weights of another precision load where exact (a bf16 file into an f32 table; f32 values that happen
        // to be bf16 values into a bf16 table), and are refused naming both precisions otherwise.
        // Non-finite weights are refused by the restore's own check, naming them as such.
        let p = config.precision;
        if let Some(k) = weights.iter().position(|&w| w.is_finite() && !p.holds(w)) {
            return Err(bad(
                &name,
                format!(
                    "weight {} of id {} is {:e}, not exact in the table's {} precision (the tensor is {}): \
                     a table of {} rows cannot take these weights without rounding",
                    k % config.dim,
                    ids[k / config.dim],
                    weights[k],
                    p.name(),
                    f.dtype(&name)?.name(),
                    p.name()
                ),
            ));
        }
        let state_len = config.state_len();
        let state = if state_len > 0 {
            f.f32(&format!("{prefix}.state"), &[rows, state_len])?
                .to_vec()
        } else {
            Vec::new()
        };
        // A table storing part of its state in bf16 takes only bf16 values there (written as F32, exact).
        let half = config.row_codec().half_state();
        if half > 0 {
            let inexact = state
                .chunks_exact(state_len)
                .enumerate()
                .find_map(|(r, s)| {
                    s[..half]
                        .iter()
                        .position(|&v| v.is_finite() && !crate::RowPrecision::Bf16.holds(v))
                        .map(|k| (r, k, s[k]))
                });
            if let Some((r, k, v)) = inexact {
                return Err(bad(
                    &format!("{prefix}.state"),
                    format!(
                        "state value {k} of id {} is {v:e}, not exact in the table's bf16 optimizer state \
                         (state_precision bf16): state of f32 precision cannot be loaded without rounding",
                        ids[r]
                    ),
                ));
            }
        }
        out.push(TableTensors {
            prefix,
            config,
            ids,
            weights,
            state,
        });
    }
    Ok(out)
}

/// Writes the rows of `tables` whose id `keep` accepts into `store` (each table registered there before),
/// in batches; returns the rows written. What `ps-server restore --tensors` and `ps-serve` do with a
/// [`TABLES_FILE`].
pub fn write_rows_into(
    store: &dyn crate::Store,
    tables: &[TableTensors],
    keep: &dyn Fn(u64) -> bool,
) -> Result<u64, crate::StoreError> {
    let mut batch = crate::DirtyBatch::new();
    let (mut row, mut words) = (Vec::new(), Vec::new());
    let mut written = 0u64;
    for t in tables {
        let (dim, sl) = (t.config.dim, t.config.state_len());
        let codec = t.config.row_codec();
        words.resize(codec.words(), 0u32);
        batch.reset(codec.bytes());
        for (i, &id) in t.ids.iter().enumerate() {
            if !keep(id) {
                continue;
            }
            row.clear();
            row.extend_from_slice(&t.weights[i * dim..(i + 1) * dim]);
            row.extend_from_slice(&t.state[i * sl..(i + 1) * sl]);
            // Exact: `tables_of` checked every weight against the precision.
            codec.encode(&row, &mut words);
            batch.push_words(id, &words);
            if batch.len() >= crate::FLUSH_BATCH_ROWS {
                store.write_rows(t.config.id, &batch, false)?;
                written += batch.len() as u64;
                batch.reset(codec.bytes());
            }
        }
        if !batch.is_empty() {
            store.write_rows(t.config.id, &batch, false)?;
            written += batch.len() as u64;
        }
    }
    Ok(written)
}
