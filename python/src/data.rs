//! Criteo files into numpy arrays, through the same reader and feature ids as the Rust trainer ([`criteo`]),
//! so a PyTorch model trained from Python sees exactly the rows and ids `trainer` would.

use std::path::PathBuf;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `(labels [n] float32, dense [n, 13] float32, ids [n, 26] uint64)` of the Criteo file(s) `paths` (TSV or
/// Kaggle CSV, plain/gzip/zstd, or `trainer preprocess` shards): dense features as `ln(1 + max(x, 0))`, ids
/// as the trainer's feature ids. Malformed lines are skipped up to `max_bad_lines`, then it raises.
#[pyfunction]
#[pyo3(signature = (paths, max_bad_lines = 1000))]
#[allow(clippy::type_complexity)]
pub fn read_criteo<'py>(
    py: Python<'py>,
    paths: Vec<PathBuf>,
    max_bad_lines: u64,
) -> PyResult<(
    Bound<'py, PyArray1<f32>>,
    Bound<'py, PyArray2<f32>>,
    Bound<'py, PyArray2<u64>>,
)> {
    if paths.is_empty() {
        return Err(PyValueError::new_err("paths: no file given"));
    }
    let (labels, dense, ids) = py
        .detach(|| -> Result<_, criteo::ReadError> {
            let cfg = criteo::ReaderConfig {
                max_bad_lines,
                ..criteo::ReaderConfig::new(paths.iter().cloned(), 65536)
            };
            let (batches, _) = criteo::read_all(&cfg)?;
            let n: usize = batches.iter().map(|b| b.len).sum();
            let mut labels = Vec::with_capacity(n);
            let mut dense = Vec::with_capacity(n * criteo::NUM_DENSE);
            let mut ids = Vec::with_capacity(n * criteo::NUM_SPARSE);
            for b in &batches {
                labels.extend_from_slice(&b.labels);
                dense.extend_from_slice(&b.dense);
                for i in 0..b.len {
                    ids.extend(b.sparse.iter().map(|col| col[i]));
                }
            }
            Ok((labels, dense, ids))
        })
        .map_err(|e| PyValueError::new_err(format!("read {paths:?}: {e}")))?;
    let n = labels.len();
    Ok((
        PyArray1::from_vec(py, labels),
        PyArray1::from_vec(py, dense).reshape([n, criteo::NUM_DENSE])?,
        PyArray1::from_vec(py, ids).reshape([n, criteo::NUM_SPARSE])?,
    ))
}
