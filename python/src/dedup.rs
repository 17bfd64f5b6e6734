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

/// A group's plan in one call: `tables[t]` is table t's features' id arrays (uint64). Returns per table its
/// distinct ids (first-seen order over its features in order), and every feature's positions among the
/// group's rows (the tables' distinct ids one table after another), all features concatenated in order
/// (int64): feature k of table t is the slice after the features before it.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn plan_group<'py>(
    py: Python<'py>,
    tables: Vec<Vec<PyReadonlyArray1<'py, u64>>>,
) -> (Vec<Bound<'py, PyArray1<u64>>>, Bound<'py, PyArray1<i64>>) {
    let total: usize = tables.iter().flatten().map(|a| a.as_array().len()).sum();
    let mut inverse = Vec::with_capacity(total);
    let mut uniques = Vec::with_capacity(tables.len());
    let mut seen = Dedup::default();
    let mut base = 0i64;
    for features in &tables {
        let n: usize = features.iter().map(|a| a.as_array().len()).sum();
        seen.clear();
        let mut unique = Vec::with_capacity(n);
        for f in features {
            let view = f.as_array();
            let mut add = |id: u64| inverse.push(base + i64::from(seen.position(id, &mut unique)));
            match view.as_slice() {
                Some(s) => s.iter().for_each(|&id| add(id)),
                None => view.iter().for_each(|&id| add(id)),
            }
        }
        base += unique.len() as i64;
        uniques.push(PyArray1::from_vec(py, unique));
    }
    (uniques, PyArray1::from_vec(py, inverse))
}
