//! `Client`: a connection to every parameter server of a cluster, for Python.
//!
//! Every request runs on the shared runtime ([`crate::runtime`]) with the GIL released. `pull_async` and
//! `push_async` return a handle at once (the ids and gradients are copied first, so the caller may reuse its
//! arrays); `wait` blocks (GIL released) until the reply, or raises. Each operation has a deadline, the
//! client's `timeout_secs`, past which it fails with `PsTimeoutError` whatever the servers do (the
//! protocol client's retries and liveness probes run inside it).
//!
//! Rows are decoded straight into a `Vec<f32>` that numpy then owns as the array's buffer: one copy from the
//! wire bytes, none after. The client also counts, per kind, calls, rows, and seconds spent in requests and
//! in `wait` (`stats()`), for the package's per-batch timing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use embedding::spec::table_spec;
use embedding::{InitConfig, OptimizerConfig, TableConfig};
use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use protocol::{Encoding, PsClient, PsClientConfig, Transport};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::sync::oneshot;

use crate::handles::{PullHandle, PushHandle, Slot};
use crate::jobs::{PullJob, PushJob};

use crate::errors::RequestError;
use crate::runtime;

/// Counters of one client (nanoseconds and counts), shared with its in-flight requests.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) pull_calls: AtomicU64,
    pub(crate) pull_rows: AtomicU64,
    pub(crate) pull_ns: AtomicU64,
    pub(crate) push_calls: AtomicU64,
    pub(crate) push_rows: AtomicU64,
    pub(crate) push_ns: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
}

pub(crate) fn parse_encoding(s: &str) -> PyResult<Encoding> {
    match s {
        "f32" => Ok(Encoding::F32),
        "f16" => Ok(Encoding::F16),
        "bf16" => Ok(Encoding::Bf16),
        "int8" => Ok(Encoding::Int8),
        other => Err(PyValueError::new_err(format!(
            "encoding = {other:?}: expected one of 'f32', 'f16', 'bf16', 'int8'"
        ))),
    }
}

/// A cluster's servers, for Python (`pstrain.Client` wraps it).
#[pyclass(module = "pstrain._pstrain")]
pub struct Client {
    inner: Arc<PsClient>,
    timeout: Duration,
    counters: Arc<Counters>,
}

/// Runs `fut` on the runtime under the client's deadline, the GIL released.
fn block_on<T: Send>(
    py: Python<'_>,
    timeout: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, protocol::ProtocolError>> + Send,
) -> PyResult<T> {
    let r = py.detach(|| {
        runtime().block_on(async {
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r.map_err(|e| RequestError::new(what, e)),
                Err(_) => Err(RequestError::timeout(what, timeout.as_secs_f64())),
            }
        })
    });
    r.map_err(|e| e.into_py(py))
}

#[pymethods]
impl Client {
    /// Connects to `servers` (`host:port`, in shard order) with the client certificate in `tls_dir`, over
    /// `transport` (`quic` or `tcp`); every request must finish within `timeout_secs`.
    #[new]
    #[pyo3(signature = (servers, tls_dir, transport = "quic", timeout_secs = 30.0, server_name = None))]
    fn new(
        py: Python<'_>,
        servers: Vec<String>,
        tls_dir: PathBuf,
        transport: &str,
        timeout_secs: f64,
        server_name: Option<String>,
    ) -> PyResult<Client> {
        if servers.is_empty() {
            return Err(PyValueError::new_err("servers: the list is empty"));
        }
        if !(timeout_secs.is_finite() && timeout_secs > 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout_secs = {timeout_secs}: expected a number > 0"
            )));
        }
        // One entry per shard; a shard's replicas separated by `/` (docs/replication.md).
        let addrs = servers
            .iter()
            .map(|s| {
                s.parse::<protocol::cluster::ShardAddrs>()
                    .map(|a| a.0)
                    .map_err(|e| {
                        PyValueError::new_err(format!(
                            "servers: {s:?} is not host:port (replicas separated by '/') with numeric \
                             addresses ({e})"
                        ))
                    })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let transport = match transport {
            "quic" => Transport::Quic,
            "tcp" => Transport::Tcp,
            other => {
                return Err(PyValueError::new_err(format!(
                    "transport = {other:?}: expected 'quic' or 'tcp'"
                )))
            }
        };
        if !tls_dir.join("ca.pem").is_file() {
            return Err(PyValueError::new_err(format!(
                "tls_dir = {}: no ca.pem there (make one with `ps-server certs init --tls-dir DIR`)",
                tls_dir.display()
            )));
        }
        let timeout = Duration::from_secs_f64(timeout_secs);
        let mut cfg = PsClientConfig::replicated(addrs, tls_dir);
        cfg.transport = transport;
        cfg.request_timeout = timeout;
        // Retries of transient failures stop well inside the operation's deadline.
        cfg.retry_for = timeout.mul_f64(0.8);
        if let Some(name) = server_name {
            cfg.server_name = name;
        }
        let inner = block_on(py, timeout, "connect", PsClient::connect(cfg))?;
        Ok(Client {
            inner: Arc::new(inner),
            timeout,
            counters: Arc::new(Counters::default()),
        })
    }

    /// Number of servers.
    #[getter]
    fn num_servers(&self) -> usize {
        self.inner.num_servers()
    }

    /// The tables the cluster knew when this client connected, as dicts (`id`, `name`, `dim`).
    fn known_tables<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .known_tables()
            .iter()
            .map(|t| {
                let d = PyDict::new(py);
                d.set_item("id", t.id)?;
                d.set_item("name", &t.name)?;
                d.set_item("dim", t.dim)?;
                Ok(d)
            })
            .collect()
    }

    /// Registers a table on every server (idempotent for the same spec; a different spec under the same id is
    /// refused by the servers). `optimizer`: `sgd`, `row_adagrad` or `adam`; `init`: `uniform` (half-width
    /// `init_scale`) or `normal` (std `init_scale`).
    #[pyo3(signature = (table_id, name, dim, optimizer, lr, eps, initial_accumulator, beta1, beta2,
                        weight_decay, clip_norm, init, init_scale, seed))]
    #[allow(clippy::too_many_arguments)]
    fn register_table(
        &self,
        py: Python<'_>,
        table_id: u32,
        name: String,
        dim: u32,
        optimizer: &str,
        lr: f32,
        eps: f32,
        initial_accumulator: f32,
        beta1: f32,
        beta2: f32,
        weight_decay: f32,
        clip_norm: f32,
        init: &str,
        init_scale: f32,
        seed: u64,
    ) -> PyResult<()> {
        let optimizer = match optimizer {
            "sgd" => OptimizerConfig::Sgd { lr },
            "row_adagrad" => OptimizerConfig::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            },
            "adam" => OptimizerConfig::Adam {
                lr,
                beta1,
                beta2,
                eps,
            },
            other => {
                return Err(PyValueError::new_err(format!(
                    "optimizer = {other:?}: expected 'sgd', 'row_adagrad' or 'adam'"
                )))
            }
        };
        let init = match init {
            "uniform" => InitConfig::uniform(init_scale),
            "normal" => InitConfig::normal(init_scale),
            other => {
                return Err(PyValueError::new_err(format!(
                    "init = {other:?}: expected 'uniform' or 'normal'"
                )))
            }
        };
        // The engine's config, turned into the wire spec by the one conversion the servers also use (it picks
        // the regularized variants when weight decay or clipping is set).
        let config = TableConfig {
            optimizer,
            init,
            seed,
            weight_decay,
            clip_norm,
            ..TableConfig::new(table_id, name.clone(), dim as usize)
        };
        let spec = table_spec(&config).expect("sgd, row-wise Adagrad and Adam have wire specs");
        // The server validates the rest (learning rates, dimension bounds) and names what it refuses.
        let client = self.inner.clone();
        block_on(
            py,
            self.timeout,
            &format!("register table {name:?}"),
            async move { client.register_tables(&[spec]).await },
        )
    }

    /// Starts a pull of several tables in one request per server: `tables[i]` is `(table id, dim)` and
    /// `ids[i]` its ids; `what` names the tables in errors. Returns a `PullHandle` whose `wait` gives the rows.
    fn pull_async(
        &self,
        tables: Vec<(u32, usize)>,
        what: String,
        encoding: &str,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
    ) -> PyResult<PullHandle> {
        let pull = PullJob::new(tables, &what, encoding, &ids)?;
        let (tx, rx) = oneshot::channel();
        let shapes = pull.shapes();
        let (client, counters, timeout) = (self.inner.clone(), self.counters.clone(), self.timeout);
        runtime().spawn(async move {
            let _ = tx.send(pull.run(&client, &counters, timeout).await);
        });
        Ok(PullHandle {
            state: Slot::Pending(rx),
            shapes,
            counters: self.counters.clone(),
        })
    }

    /// Starts a push of several tables' gradients in one request per server: `grads[i]` is
    /// `len(ids[i]) x dim` of `tables[i]`. Returns a `PushHandle`.
    fn push_async(
        &self,
        tables: Vec<(u32, usize)>,
        what: String,
        encoding: &str,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
        grads: Vec<PyReadonlyArray2<'_, f32>>,
    ) -> PyResult<PushHandle> {
        let push = PushJob::new(tables, &what, encoding, &ids, &grads)?;
        let (tx, rx) = oneshot::channel();
        let (client, counters, timeout) = (self.inner.clone(), self.counters.clone(), self.timeout);
        runtime().spawn(async move {
            let _ = tx.send(push.run(&client, &counters, timeout).await);
        });
        Ok(PushHandle {
            state: Slot::Pending(rx),
            counters: self.counters.clone(),
        })
    }

    /// A push, then, once every server acknowledged it, a pull (of rows the push changed and a prefetch had
    /// read before): one task, no round trip through Python between the two. A failed push fails the pull
    /// with the same error. Returns `(PushHandle, PullHandle)`.
    #[allow(clippy::too_many_arguments)]
    fn push_then_pull_async(
        &self,
        tables: Vec<(u32, usize)>,
        what: String,
        encoding: &str,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
        grads: Vec<PyReadonlyArray2<'_, f32>>,
        pull_tables: Vec<(u32, usize)>,
        pull_encoding: &str,
        pull_ids: Vec<PyReadonlyArray1<'_, u64>>,
    ) -> PyResult<(PushHandle, PullHandle)> {
        let push = PushJob::new(tables, &what, encoding, &ids, &grads)?;
        let pull = PullJob::new(pull_tables, &what, pull_encoding, &pull_ids)?;
        let shapes = pull.shapes();
        let (push_tx, push_rx) = oneshot::channel();
        let (pull_tx, pull_rx) = oneshot::channel();
        let (client, counters, timeout) = (self.inner.clone(), self.counters.clone(), self.timeout);
        runtime().spawn(async move {
            let pushed = push.run(&client, &counters, timeout).await;
            let failed = pushed.as_ref().err().cloned();
            let _ = push_tx.send(pushed);
            let pulled = match failed {
                Some(e) => Err(e),
                None => pull.run(&client, &counters, timeout).await,
            };
            let _ = pull_tx.send(pulled);
        });
        Ok((
            PushHandle {
                state: Slot::Pending(push_rx),
                counters: self.counters.clone(),
            },
            PullHandle {
                state: Slot::Pending(pull_rx),
                shapes,
                counters: self.counters.clone(),
            },
        ))
    }

    /// Asks every server to write its dirty rows to RocksDB; returns the rows written.
    fn flush(&self, py: Python<'_>) -> PyResult<u64> {
        let client = self.inner.clone();
        block_on(
            py,
            self.timeout,
            "flush",
            async move { client.flush().await },
        )
    }

    /// Asks every server to write a consistent snapshot of its tables under `dir` (a path on the servers'
    /// file systems, not yet holding a snapshot); returns `(rows, shard directory)` per server.
    fn checkpoint(&self, py: Python<'_>, dir: String, step: u64) -> PyResult<Vec<(u64, String)>> {
        let client = self.inner.clone();
        block_on(
            py,
            self.timeout,
            &format!("checkpoint into {dir}"),
            async move { client.checkpoint(&dir, step).await },
        )
    }

    /// The client's counters: calls, rows and seconds of pulls and pushes (seconds from start to reply, on the
    /// I/O threads), and seconds the caller spent blocked in `wait`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.counters;
        let d = PyDict::new(py);
        let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        d.set_item("pull_calls", c.pull_calls.load(Ordering::Relaxed))?;
        d.set_item("pull_rows", c.pull_rows.load(Ordering::Relaxed))?;
        d.set_item("pull_seconds", secs(&c.pull_ns))?;
        d.set_item("push_calls", c.push_calls.load(Ordering::Relaxed))?;
        d.set_item("push_rows", c.push_rows.load(Ordering::Relaxed))?;
        d.set_item("push_seconds", secs(&c.push_ns))?;
        d.set_item("wait_seconds", secs(&c.wait_ns))?;
        Ok(d)
    }

    /// Closes every connection.
    fn close(&self, py: Python<'_>) {
        let client = self.inner.clone();
        py.detach(|| {
            runtime().block_on(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
            })
        });
    }
}
