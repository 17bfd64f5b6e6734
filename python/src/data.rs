//! Criteo files into numpy arrays, through the same reader and feature ids as the Rust trainer ([`criteo`]),
//! so a PyTorch model trained from Python sees exactly the rows and ids `trainer` would: one-hot or multi-hot
//! features (`|`-separated tokens) by a feature layout, and the reader's counts of bad lines and dropped
//! tokens.

use std::path::PathBuf;

use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One feature's ids of every row: `(values, lengths)`, `lengths` `None` for a one-hot feature (one id per row).
type Column<'py> = (Bound<'py, PyArray1<u64>>, Option<Bound<'py, PyArray1<i64>>>);

/// `(labels [n] float32, dense [n x 13] float32 (flat), features, stats)` of the Criteo file(s) `paths` (TSV or
/// Kaggle CSV, plain/gzip/zstd, or `trainer preprocess` shards). `layout`: per feature `(column (C1 = 0),
/// table salt, hash size (0 = none), tokens kept (1 = one-hot), token ids (`criteo::IdScheme::Token`: the
/// capped token itself, TorchRec's Criteo ids))`; `None` is the default 26 one-hot features.
/// `features[f]` is `(values uint64, lengths int64 or None)`; `stats` counts lines, rows, bad lines (the first
/// of them as `path:line: message`), padded lines and dropped tokens. Malformed lines are skipped up to
/// `max_bad_lines`, then it raises naming the first ones.
#[pyfunction]
#[pyo3(signature = (paths, max_bad_lines = 1000, layout = None))]
#[allow(clippy::type_complexity)]
pub fn read_criteo<'py>(
    py: Python<'py>,
    paths: Vec<PathBuf>,
    max_bad_lines: u64,
    layout: Option<Vec<(usize, u32, u64, usize, bool)>>,
) -> PyResult<(
    Bound<'py, PyArray1<f32>>,
    Bound<'py, PyArray1<f32>>,
    Vec<Column<'py>>,
    Bound<'py, PyDict>,
)> {
    if paths.is_empty() {
        return Err(PyValueError::new_err("paths: no file given"));
    }
    let layout = match layout {
        None => criteo::FeatureLayout::default(),
        Some(fs) => criteo::FeatureLayout {
            features: fs
                .into_iter()
                .map(
                    |(column, table, hash_size, tokens, token)| criteo::FeatureInput {
                        ids: if token {
                            criteo::IdScheme::Token
                        } else {
                            criteo::IdScheme::Hashed
                        },
                        column,
                        table,
                        hash_size,
                        tokens,
                    },
                )
                .collect(),
        },
    };
    layout
        .validate()
        .map_err(|e| PyValueError::new_err(format!("layout: {e}")))?;
    let multi: Vec<bool> = (0..layout.features.len())
        .map(|f| layout.is_multi_hot(f))
        .collect();
    let read = py
        .detach(|| -> Result<_, criteo::ReadError> {
            let cfg = criteo::ReaderConfig {
                max_bad_lines,
                layout,
                ..criteo::ReaderConfig::new(paths.iter().cloned(), 65536)
            };
            let (batches, stats) = criteo::read_all(&cfg)?;
            let n: usize = batches.iter().map(|b| b.len).sum();
            let mut labels = Vec::with_capacity(n);
            let mut dense = Vec::with_capacity(n * criteo::NUM_DENSE);
            let mut values: Vec<Vec<u64>> = vec![Vec::new(); multi.len()];
            let mut lengths: Vec<Vec<i64>> = vec![Vec::new(); multi.len()];
            for b in &batches {
                labels.extend_from_slice(&b.labels);
                dense.extend_from_slice(&b.dense);
                for f in 0..multi.len() {
                    values[f].extend_from_slice(&b.sparse[f]);
                    if multi[f] {
                        lengths[f].extend(b.offsets[f].windows(2).map(|w| i64::from(w[1] - w[0])));
                    }
                }
            }
            Ok((labels, dense, values, lengths, stats))
        })
        .map_err(|e| PyValueError::new_err(format!("read {paths:?}: {e}")))?;
    let (labels, dense, values, lengths, stats) = read;
    let features = values
        .into_iter()
        .zip(lengths)
        .zip(&multi)
        .map(|((v, l), &m)| {
            (
                PyArray1::from_vec(py, v),
                m.then(|| PyArray1::from_vec(py, l)),
            )
        })
        .collect();
    let d = PyDict::new(py);
    d.set_item("lines", stats.lines)?;
    d.set_item("rows", stats.rows)?;
    d.set_item("bad_lines", stats.bad_lines)?;
    d.set_item("padded_lines", stats.padded_lines)?;
    d.set_item("empty_lines", stats.empty_lines)?;
    d.set_item("truncated_tokens", stats.truncated_tokens)?;
    d.set_item("first_errors", stats.first_errors)?;
    Ok((
        PyArray1::from_vec(py, labels),
        PyArray1::from_vec(py, dense),
        features,
        d,
    ))
}
