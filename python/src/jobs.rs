//! Requests checked and copied out of Python's arrays ([`PullJob`], [`PushJob`]), ready to run on the
//! runtime: the GIL is not needed once they exist, and the caller may reuse its arrays at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use protocol::keyed::{pull_tables, push_tables, TableIds};
use protocol::{Encoding, PsClient};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::client::{parse_encoding, Counters};
use crate::errors::RequestError;

/// A pull, checked and copied out of Python's arrays, ready to run on the runtime.
pub(crate) struct PullJob {
    tables: Vec<(u32, usize)>,
    encoding: Encoding,
    ids: Vec<Vec<u64>>,
    what: String,
}

impl PullJob {
    pub(crate) fn new(
        tables: Vec<(u32, usize)>,
        what: &str,
        encoding: &str,
        ids: &[PyReadonlyArray1<'_, u64>],
    ) -> PyResult<PullJob> {
        let encoding = parse_encoding(encoding)?;
        if ids.len() != tables.len() {
            return Err(PyValueError::new_err(format!(
                "{what}: {} id arrays for {} tables",
                ids.len(),
                tables.len()
            )));
        }
        let ids: Vec<Vec<u64>> = ids
            .iter()
            .map(|a| a.as_array().iter().copied().collect())
            .collect();
        let n: usize = ids.iter().map(Vec::len).sum();
        Ok(PullJob {
            tables,
            encoding,
            ids,
            what: format!("pull of {what} ({n} ids)"),
        })
    }

    pub(crate) fn shapes(&self) -> Vec<(usize, usize)> {
        self.ids
            .iter()
            .zip(&self.tables)
            .map(|(i, t)| (i.len(), t.1))
            .collect()
    }

    pub(crate) async fn run(
        self,
        client: &Arc<PsClient>,
        counters: &Counters,
        timeout: Duration,
    ) -> Result<Vec<f32>, RequestError> {
        let start = Instant::now();
        let parts: Vec<TableIds<'_>> = self
            .tables
            .iter()
            .zip(&self.ids)
            .map(|(&(table, dim), ids)| TableIds { table, dim, ids })
            .collect();
        let total: usize = parts.iter().map(|p| p.ids.len() * p.dim).sum();
        let mut rows = vec![0f32; total];
        let r = tokio::time::timeout(
            timeout,
            pull_tables(client, self.encoding, &parts, &mut rows),
        )
        .await;
        let r = match r {
            Ok(Ok(())) => Ok(rows),
            Ok(Err(e)) => Err(RequestError::new(&self.what, e)),
            Err(_) => Err(RequestError::timeout(&self.what, timeout.as_secs_f64())),
        };
        let n: usize = self.ids.iter().map(Vec::len).sum();
        counters.pull_calls.fetch_add(1, Ordering::Relaxed);
        counters.pull_rows.fetch_add(n as u64, Ordering::Relaxed);
        counters
            .pull_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

/// A push, checked and copied out of Python's arrays, ready to run on the runtime.
pub(crate) struct PushJob {
    tables: Vec<(u32, usize)>,
    encoding: Encoding,
    ids: Vec<Vec<u64>>,
    grads: Vec<Vec<f32>>,
    what: String,
}

impl PushJob {
    pub(crate) fn new(
        tables: Vec<(u32, usize)>,
        what: &str,
        encoding: &str,
        ids: &[PyReadonlyArray1<'_, u64>],
        grads: &[PyReadonlyArray2<'_, f32>],
    ) -> PyResult<PushJob> {
        let encoding = parse_encoding(encoding)?;
        if ids.len() != tables.len() || grads.len() != tables.len() {
            return Err(PyValueError::new_err(format!(
                "{what}: {} id arrays and {} gradient arrays for {} tables",
                ids.len(),
                grads.len(),
                tables.len()
            )));
        }
        let mut all_ids = Vec::with_capacity(ids.len());
        let mut all_grads = Vec::with_capacity(ids.len());
        for ((i, g), &(_, dim)) in ids.iter().zip(grads).zip(&tables) {
            let i: Vec<u64> = i.as_array().iter().copied().collect();
            let shape = g.as_array().shape().to_vec();
            if shape != [i.len(), dim] {
                return Err(PyValueError::new_err(format!(
                    "push of {what}: grads shape {shape:?} for {} ids of dim {dim}",
                    i.len()
                )));
            }
            all_grads.push(g.as_array().iter().copied().collect::<Vec<f32>>());
            all_ids.push(i);
        }
        let n: usize = all_ids.iter().map(Vec::len).sum();
        Ok(PushJob {
            tables,
            encoding,
            ids: all_ids,
            grads: all_grads,
            what: format!("push of {what} ({n} ids)"),
        })
    }

    pub(crate) async fn run(
        self,
        client: &Arc<PsClient>,
        counters: &Counters,
        timeout: Duration,
    ) -> Result<u64, RequestError> {
        let start = Instant::now();
        let parts: Vec<TableIds<'_>> = self
            .tables
            .iter()
            .zip(&self.ids)
            .map(|(&(table, dim), ids)| TableIds { table, dim, ids })
            .collect();
        let grads: Vec<&[f32]> = self.grads.iter().map(Vec::as_slice).collect();
        let r =
            tokio::time::timeout(timeout, push_tables(client, self.encoding, &parts, &grads)).await;
        let r = match r {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(e)) => Err(RequestError::new(&self.what, e)),
            Err(_) => Err(RequestError::timeout(&self.what, timeout.as_secs_f64())),
        };
        let n: usize = self.ids.iter().map(Vec::len).sum();
        counters.push_calls.fetch_add(1, Ordering::Relaxed);
        counters.push_rows.fetch_add(n as u64, Ordering::Relaxed);
        counters
            .push_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}
