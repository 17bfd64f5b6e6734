//! `PullHandle` and `PushHandle`: a request in flight, its result taken once by `wait` (GIL released).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio::sync::oneshot;

use crate::counters::Counters;
use crate::errors::RequestError;
use crate::replay::ReplayLog;
use crate::runtime;

/// A request's result slot: still pending, or taken.
pub(crate) enum Slot<T> {
    Pending(oneshot::Receiver<Result<T, RequestError>>),
    Ready(Result<T, RequestError>),
    Taken,
}

impl<T: Send> Slot<T> {
    /// Whether the result is there (without blocking).
    fn poll(&mut self) -> bool {
        if let Slot::Pending(rx) = self {
            match rx.try_recv() {
                Ok(r) => *self = Slot::Ready(r),
                Err(oneshot::error::TryRecvError::Empty) => return false,
                Err(oneshot::error::TryRecvError::Closed) => {
                    *self = Slot::Ready(Err(RequestError {
                        kind: crate::errors::Kind::Server,
                        message: "the request's task ended without an answer".into(),
                    }))
                }
            }
        }
        !matches!(self, Slot::Pending(_))
    }

    /// Blocks (GIL released) until the result, up to `timeout` seconds if given.
    fn wait(&mut self, py: Python<'_>, timeout: Option<f64>, counters: &Counters) -> PyResult<T> {
        let start = Instant::now();
        if let Slot::Pending(rx) = self {
            let got = py.detach(|| {
                runtime().block_on(async {
                    match timeout {
                        Some(t) => tokio::time::timeout(Duration::from_secs_f64(t.max(0.0)), rx)
                            .await
                            .ok(),
                        None => Some(rx.await),
                    }
                })
            });
            counters
                .wait_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match got {
                None => {
                    return Err(PyErr::from_type(
                        crate::errors::class(py, "PsTimeoutError"),
                        format!("wait: no result within {:.1} s", timeout.unwrap_or(0.0)),
                    ))
                }
                Some(Ok(r)) => *self = Slot::Ready(r),
                Some(Err(_)) => {
                    *self = Slot::Ready(Err(RequestError {
                        kind: crate::errors::Kind::Server,
                        message: "the request's task ended without an answer".into(),
                    }))
                }
            }
        }
        match std::mem::replace(self, Slot::Taken) {
            Slot::Ready(r) => r.map_err(|e| e.into_py(py)),
            Slot::Taken => Err(PyRuntimeError::new_err(
                "this handle's result was already taken by an earlier wait()",
            )),
            Slot::Pending(_) => unreachable!("waited above"),
        }
    }
}

/// A pull in flight.
#[pyclass(module = "pstrain._pstrain")]
pub struct PullHandle {
    /// Every table's rows, one after another.
    pub(crate) state: Slot<(Vec<f32>, Vec<f32>)>,
    /// `(ids, dim)` of each table.
    pub(crate) shapes: Vec<(usize, usize)>,
    pub(crate) counters: Arc<Counters>,
    /// Its sequence number on its lane (0: no lane).
    pub(crate) seq: u64,
    /// The optimizer state of a pull with state, once waited for.
    pub(crate) opt_state: Option<Vec<f32>>,
    /// A pull with state's tables (config, ids): what `wait(log=)` replays onto.
    pub(crate) replay: Option<Vec<(embedding::TableConfig, Arc<Vec<u64>>)>>,
    /// Seconds `wait(log=)` spent replaying.
    pub(crate) replay_secs: f64,
}

#[pymethods]
impl PullHandle {
    /// Whether the reply (or the error) is there.
    fn done(&mut self) -> bool {
        self.state.poll()
    }

    /// The rows: with `concat`, one `float32` array of `(sum of len(ids)) x dim` holding every table's rows
    /// one after another (tables of one dimension only); else per table a `len(ids) x dim` array (views of
    /// that one buffer). The buffer is the decoded rows themselves (no copy). Raises the request's error.
    /// `timeout`: seconds to wait at most (`PsTimeoutError` past it; the request goes on). `log` (a pull
    /// with state): the pushes of that log entered after this pull are first applied to the rows and their
    /// optimizer state, as the servers apply them (`crate::replay`).
    #[pyo3(signature = (timeout = None, concat = false, log = None))]
    fn wait<'py>(
        &mut self,
        py: Python<'py>,
        timeout: Option<f64>,
        concat: bool,
        log: Option<PyRef<'py, ReplayLog>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let (mut rows, mut opt_state) = self.state.wait(py, timeout, &self.counters)?;
        if let Some(log) = log {
            let tables = self.replay.as_ref().ok_or_else(|| {
                PyValueError::new_err("wait(log=...): only a pull with state replays pushes")
            })?;
            let start = Instant::now();
            let (seq, log) = (self.seq, &*log);
            py.detach(|| log.replay(seq, tables, &mut rows, &mut opt_state));
            self.replay_secs += start.elapsed().as_secs_f64();
        }
        self.opt_state = Some(opt_state);
        let dims: std::collections::BTreeSet<usize> = self.shapes.iter().map(|s| s.1).collect();
        let total: usize = self.shapes.iter().map(|s| s.0).sum();
        let all = PyArray1::from_vec(py, rows);
        if concat {
            let dim = match dims.len() {
                0 => 1,
                1 => *dims.first().expect("one"),
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "wait(concat=True): the tables have different dimensions {dims:?}"
                    )))
                }
            };
            return Ok(vec![all.reshape([total, dim])?.into_any()]);
        }
        let slice = py.import("builtins")?.getattr("slice")?;
        let mut out = Vec::with_capacity(self.shapes.len());
        let mut at = 0;
        for &(n, dim) in &self.shapes {
            let part = all.get_item(slice.call1((at, at + n * dim))?)?;
            out.push(part.call_method1("reshape", ((n, dim),))?);
            at += n * dim;
        }
        Ok(out)
    }

    /// The optimizer state of a pull with state (every table's `ids x state_len` f32s, one table after
    /// another), after `wait`; once.
    fn take_state<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let s = self.opt_state.take().ok_or_else(|| {
            PyRuntimeError::new_err(
                "take_state: no state (wait() first, on a pull with state; once)",
            )
        })?;
        Ok(PyArray1::from_vec(py, s))
    }

    /// The pull's sequence number on its lane (0 without one).
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }

    /// Seconds `wait(log=)` spent replaying pushes onto the rows.
    #[getter]
    fn replay_seconds(&self) -> f64 {
        self.replay_secs
    }
}

/// A push in flight.
#[pyclass(module = "pstrain._pstrain")]
pub struct PushHandle {
    pub(crate) state: Slot<u64>,
    pub(crate) counters: Arc<Counters>,
    /// Its sequence number on its lane (0: no lane).
    pub(crate) seq: u64,
}

#[pymethods]
impl PushHandle {
    /// Whether the acknowledgement (or the error) is there.
    fn done(&mut self) -> bool {
        self.state.poll()
    }

    /// The rows the servers applied; raises the request's error.
    #[pyo3(signature = (timeout = None))]
    fn wait(&mut self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u64> {
        self.state.wait(py, timeout, &self.counters)
    }

    /// The push's sequence number on its lane (0 without one).
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }
}
