//! `unique_inverse`: a batch's distinct ids and each id's position among them, in one pass over the
//! workspace's one dedup ([`protocol::plan::Dedup`]; numpy's `np.unique(return_inverse=True)` sorts, which was
//! a tenth of the PyTorch layer's step).

use protocol::plan::Dedup;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

/// The distinct ids of `ids` in first-seen order, and for each id its position among them.
pub fn dedup(ids: impl Iterator<Item = u64>, len: usize) -> (Vec<u64>, Vec<i64>) {
    let mut seen = Dedup::with_capacity(len);
    let mut unique = Vec::with_capacity(len);
    let inverse = ids
        .map(|id| i64::from(seen.position(id, &mut unique)))
        .collect();
    (unique, inverse)
}

/// `(unique uint64, inverse int64)` of a 1-D uint64 array: `unique[inverse] == ids`, unique in first-seen
/// order.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn unique_inverse<'py>(
    py: Python<'py>,
    ids: PyReadonlyArray1<'py, u64>,
) -> (Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<i64>>) {
    let view = ids.as_array();
    let (unique, inverse) = dedup(view.iter().copied(), view.len());
    (
        PyArray1::from_vec(py, unique),
        PyArray1::from_vec(py, inverse),
    )
}
