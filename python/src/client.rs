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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use embedding::{InitConfig, OptimizerConfig, TableConfig};
use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray2};
use protocol::keyed::{write_tables, TableIds};
use protocol::{PsClient, PsClientConfig, Transport};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::sync::oneshot;

use crate::counters::Counters;
use crate::handles::{PullHandle, PushHandle, Slot};
use crate::jobs::{PullJob, PushJob};
use crate::lane::{wait_all, Lane};
use crate::replay::{Logged, ReplayLog};

use crate::errors::RequestError;
use crate::runtime;

/// Requests started and not yet answered, so that `close` can wait for them.
#[derive(Default)]
pub(crate) struct InFlight {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Counts one request in flight until dropped.
pub(crate) struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    /// Waits until no request is in flight.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A cluster's servers, for Python (`pstrain.Client` wraps it).
#[pyclass(module = "pstrain._pstrain")]
pub struct Client {
    inner: Arc<PsClient>,
    timeout: Duration,
    counters: Arc<Counters>,
    /// The configs of the tables this client registered, by id: what replay applies pushes with.
    configs: Mutex<HashMap<u32, TableConfig>>,
    inflight: Arc<InFlight>,
    closed: AtomicBool,
}

impl Client {
    /// Refuses a request on a closed client.
    fn check_open(&self, py: Python<'_>, what: &str) -> PyResult<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(PyErr::from_type(
                crate::errors::class(py, "PsError"),
                format!("{what}: the client is closed"),
            ));
        }
        Ok(())
    }

    /// Starts `push` on the runtime, after `lane`'s earlier requests.
    fn spawn_push(&self, push: PushJob, lane: Option<&Lane>) -> PushHandle {
        self.spawn_push_logged(push, lane, None)
    }

    /// Starts `push` on the runtime, after `lane`'s earlier requests, logged in `log` for replay.
    fn spawn_push_logged(
        &self,
        push: PushJob,
        lane: Option<&Lane>,
        log: Option<&ReplayLog>,
    ) -> PushHandle {
        let (tx, rx) = oneshot::channel();
        let (client, counters, timeout) = (self.inner.clone(), self.counters.clone(), self.timeout);
        let guard = self.inflight.enter();
        let entry = lane.map(|l| l.enter(true));
        let seq = entry.as_ref().map_or(0, |e| e.seq);
        if let Some(log) = log {
            let tables = push
                .tables()
                .zip(push.ids.iter().zip(&push.grads))
                .map(|(table, (ids, grads))| Logged {
                    table,
                    ids: ids.clone(),
                    grads: grads.clone(),
                })
                .collect();
            log.add(seq, push.lr_scale, tables);
        }
        spawn_after(guard, entry, async move {
            let _ = tx.send(push.run(&client, &counters, timeout).await);
        });
        PushHandle {
            state: Slot::Pending(rx),
            counters: self.counters.clone(),
            seq,
        }
    }

    fn config(&self, table: u32) -> PyResult<TableConfig> {
        self.configs
            .lock()
            .expect("configs lock")
            .get(&table)
            .cloned()
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "table id {table} was not registered by this client"
                ))
            })
    }
}

/// Runs `request` on the runtime once the lane requests `entry` waits for are answered (at once without a
/// lane), counted in flight by `guard`; the entry is marked answered when `request` ends, however it ends.
fn spawn_after(
    guard: InFlightGuard,
    entry: Option<crate::lane::Entry>,
    request: impl std::future::Future<Output = ()> + Send + 'static,
) {
    runtime().spawn(async move {
        let _guard = guard;
        let done = match entry {
            Some(e) => {
                wait_all(e.after).await;
                Some(e.done)
            }
            None => None,
        };
        request.await;
        drop(done);
    });
}

/// `register_table`'s `eviction`: policy (`lfu`, `score`), `max_rows`, `max_bytes`, `decay_secs`.
type EvictionArgs = (String, Option<u64>, Option<u64>, Option<u64>);

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
        crate::io_policy()?;
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
            configs: Mutex::new(HashMap::new()),
            inflight: Arc::new(InFlight::default()),
            closed: AtomicBool::new(false),
        })
    }

    /// Number of servers.
    #[getter]
    fn num_servers(&self) -> usize {
        self.inner.num_servers()
    }

    /// The tables the cluster knew when this client connected, as dicts (`id`, `name`, `dim`, `seed`).
    fn known_tables<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .known_tables()
            .iter()
            .map(|t| {
                let d = PyDict::new(py);
                d.set_item("id", t.id)?;
                d.set_item("name", &t.name)?;
                d.set_item("dim", t.dim)?;
                d.set_item("seed", t.seed)?;
                Ok(d)
            })
            .collect()
    }

    /// Registers a table on every server (idempotent for the same settings; different ones under the same id are
    /// refused by the servers). `optimizer`: `sgd`, `row_adagrad` or `adam`; `init`: `uniform` (half-width
    /// `init_scale`) or `normal` (std `init_scale`).
    #[pyo3(signature = (table_id, name, dim, optimizer, lr, eps, initial_accumulator, beta1, beta2,
                        weight_decay, clip_norm, init, init_scale, seed, precision = "f32", eviction = None,
                        state_precision = "f32"))]
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
        precision: &str,
        eviction: Option<EvictionArgs>,
        state_precision: &str,
    ) -> PyResult<()> {
        let precision: protocol::RowPrecision = precision.parse().map_err(|e: String| {
            PyValueError::new_err(format!("table {name:?}: precision: {e}"))
        })?;
        let state_precision: protocol::RowPrecision =
            state_precision.parse().map_err(|e: String| {
                PyValueError::new_err(format!("table {name:?}: state_precision: {e}"))
            })?;
        // The server checks the caps and names what it refuses.
        let eviction = match eviction {
            None => None,
            Some((policy, max_rows, max_bytes, decay_secs)) => Some(protocol::EvictionConfig {
                policy: match policy.as_str() {
                    "lfu" => protocol::EvictionPolicy::Lfu,
                    "score" => protocol::EvictionPolicy::Score,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "table {name:?}: eviction policy {other:?}, expected 'lfu' or 'score'"
                        )))
                    }
                },
                max_rows,
                max_bytes,
                decay_secs,
            }),
        };
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
        let config = TableConfig {
            optimizer,
            init,
            seed,
            weight_decay,
            clip_norm,
            precision,
            state_precision,
            eviction,
            ..TableConfig::new(table_id, name.clone(), dim as usize)
        };
        self.check_open(py, &format!("register table {name:?}"))?;
        // The server validates the rest (learning rates, dimension bounds) and names what it refuses.
        let (client, tables) = (self.inner.clone(), [config.clone()]);
        block_on(
            py,
            self.timeout,
            &format!("register table {name:?}"),
            async move { client.register_tables(&tables).await },
        )?;
        self.configs
            .lock()
            .expect("configs lock")
            .insert(table_id, config);
        Ok(())
    }

    /// f32s of optimizer state per row of registered table `table` (0 for SGD, 1 for row-wise Adagrad).
    fn state_len(&self, table: u32) -> PyResult<usize> {
        Ok(self.config(table)?.state_len())
    }

    /// Applies a push this client made to rows pulled before it was applied, as the servers apply it: for
    /// each id of `target` (distinct) that `pushed` (distinct) holds, its row in `rows` (`len(target) x dim`)
    /// and state in `state` (`len(target) x state_len`) are updated in place with table `table`'s optimizer
    /// and the pushed gradient row of `grads` (`len(pushed) x dim`, as pushed: summed per id, unscaled).
    /// Rows whose gradient is not finite are left, as the servers refuse them. `lr_scale`: the push's learning-rate
    /// multiplier. Returns the rows updated.
    #[pyo3(signature = (table, rows, state, target, pushed, grads, lr_scale = 1.0))]
    #[allow(clippy::too_many_arguments)]
    fn replay(
        &self,
        py: Python<'_>,
        table: u32,
        mut rows: PyReadwriteArray2<'_, f32>,
        mut state: PyReadwriteArray2<'_, f32>,
        target: PyReadonlyArray1<'_, u64>,
        pushed: PyReadonlyArray1<'_, u64>,
        grads: PyReadonlyArray2<'_, f32>,
        lr_scale: f32,
    ) -> PyResult<usize> {
        let cfg = self.config(table)?;
        let opt = cfg
            .optimizer
            .with_lr_scale(lr_scale)
            .filter(|_| lr_scale.is_finite() && lr_scale >= 0.0)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "replay on table {table:?} ({}): lr_scale {lr_scale} does not apply to its optimizer",
                    cfg.name
                ))
            })?;
        let (dim, len) = (cfg.dim, cfg.state_len());
        let target = target.as_slice()?;
        let pushed = pushed.as_slice()?;
        let grads = grads.as_slice()?;
        let rows = rows.as_slice_mut()?;
        let state = state.as_slice_mut()?;
        if rows.len() != target.len() * dim
            || state.len() != target.len() * len
            || grads.len() != pushed.len() * dim
        {
            return Err(PyValueError::new_err(format!(
                "replay on table {table:?} ({}): {} rows and {} state values for {} ids, {} gradients for \
                 {} pushed ids (dim {dim}, state {len} per row)",
                cfg.name,
                rows.len(),
                state.len(),
                target.len(),
                grads.len(),
                pushed.len()
            )));
        }
        Ok(py.detach(|| crate::replay::apply((&cfg, &opt), rows, state, target, pushed, grads)))
    }

    /// Starts a pull of several tables in one request per server: `tables[i]` is `(table id, dim)` and
    /// `ids[i]` its ids; `what` names the tables in errors. Returns a `PullHandle` whose `wait` gives the rows.
    /// `lane`: the collection's order of requests (it then runs after that lane's earlier pushes are
    /// answered, `crate::lane`); `with_state`: the rows' optimizer state too (`PullHandle.take_state`; ids
    /// distinct within each table).
    #[pyo3(signature = (tables, what, encoding, ids, lane = None, with_state = false))]
    #[allow(clippy::too_many_arguments)]
    fn pull_async(
        &self,
        py: Python<'_>,
        tables: Vec<(u32, usize)>,
        what: String,
        encoding: &str,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
        lane: Option<PyRef<'_, Lane>>,
        with_state: bool,
    ) -> PyResult<PullHandle> {
        self.check_open(py, &what)?;
        let mut pull = PullJob::new(tables, &what, encoding, &ids)?;
        let mut replay = None;
        if with_state {
            let configs = pull
                .table_ids()
                .map(|t| self.config(t))
                .collect::<PyResult<Vec<_>>>()?;
            pull.state_lens = Some(configs.iter().map(TableConfig::state_len).collect());
            replay = Some(configs.into_iter().zip(pull.ids.iter().cloned()).collect());
        }
        let (tx, rx) = oneshot::channel();
        let shapes = pull.shapes();
        let (client, counters, timeout) = (self.inner.clone(), self.counters.clone(), self.timeout);
        let guard = self.inflight.enter();
        let entry = lane.map(|l| l.enter(false));
        let seq = entry.as_ref().map_or(0, |e| e.seq);
        spawn_after(guard, entry, async move {
            let _ = tx.send(pull.run(&client, &counters, timeout).await);
        });
        Ok(PullHandle {
            state: Slot::Pending(rx),
            shapes,
            counters: self.counters.clone(),
            seq,
            opt_state: None,
            replay,
            replay_secs: 0.0,
        })
    }

    /// Starts a push of several tables' gradients in one request per server: `grads[i]` is
    /// `len(ids[i]) x dim` of `tables[i]`. Returns a `PushHandle`. `lane`: as for `pull_async` (the push runs
    /// after that lane's earlier pulls are answered). A push whose reply is lost is retried under its first
    /// id, and the servers apply it once (a retry gets the first answer); `close` waits for it. `lr_scale`
    /// multiplies every table's learning rate for this push (a schedule; 1: the registered rate).
    #[pyo3(signature = (tables, what, encoding, ids, grads, lane = None, lr_scale = 1.0))]
    #[allow(clippy::too_many_arguments)]
    fn push_async(
        &self,
        py: Python<'_>,
        tables: Vec<(u32, usize)>,
        what: String,
        encoding: &str,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
        grads: Vec<PyReadonlyArray2<'_, f32>>,
        lane: Option<PyRef<'_, Lane>>,
        lr_scale: f32,
    ) -> PyResult<PushHandle> {
        self.check_open(py, &what)?;
        let push = PushJob::new(tables, &what, (encoding, lr_scale), &ids, &grads)?;
        Ok(self.spawn_push(push, lane.as_deref()))
    }

    /// Starts one push per learning-rate multiplier of a group's gradients: `grads` is `rows x dim` (every
    /// table's dim), table `tables[i]` = `(id, dim, first row)` owns rows `first .. first + len(ids[i])` and
    /// pushes at `lr_scales[i]`. Each gradient is divided by `divisor` (a `GradScaler`'s scale; 1: none) as
    /// it is copied, and checked finite: the first value that is not gives `(None, (row, column, value))` and
    /// nothing is pushed; else `(handles, None)`, one per distinct multiplier in first-seen order. With `log`,
    /// each push is logged there for replay (its ids and gradients shared, not copied). `lane`: as for
    /// `push_async`.
    #[pyo3(signature = (tables, what, encoding, ids, grads, lr_scales, divisor = 1.0, lane = None,
                        log = None))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn push_group(
        &self,
        py: Python<'_>,
        tables: Vec<(u32, usize, usize)>,
        what: String,
        encoding: &str,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
        grads: PyReadonlyArray2<'_, f32>,
        lr_scales: Vec<f32>,
        divisor: f32,
        lane: Option<PyRef<'_, Lane>>,
        log: Option<PyRef<'_, ReplayLog>>,
    ) -> PyResult<(Option<Vec<PushHandle>>, Option<(usize, usize, f32)>)> {
        self.check_open(py, &what)?;
        let encoding = crate::jobs::parse_encoding(encoding)?;
        if ids.len() != tables.len() || lr_scales.len() != tables.len() {
            return Err(PyValueError::new_err(format!(
                "push of {what}: {} id arrays and {} learning-rate multipliers for {} tables",
                ids.len(),
                lr_scales.len(),
                tables.len()
            )));
        }
        if !(divisor.is_finite() && divisor > 0.0) {
            return Err(PyValueError::new_err(format!(
                "push of {what}: divisor {divisor}, expected a finite number > 0"
            )));
        }
        for &s in &lr_scales {
            crate::jobs::check_lr_scale(&what, s)?;
        }
        let view = grads.as_array();
        let (rows, cols) = (view.shape()[0], view.shape()[1]);
        let owned;
        let all: &[f32] = match view.as_slice() {
            Some(s) => s,
            None => {
                owned = view.iter().copied().collect::<Vec<f32>>();
                &owned
            }
        };
        let mut parts = Vec::with_capacity(tables.len());
        for (&(table, dim, first), i) in tables.iter().zip(&ids) {
            let i = i.as_array();
            let n = i.len();
            if dim != cols || first.checked_add(n).is_none_or(|end| end > rows) {
                return Err(PyValueError::new_err(format!(
                    "push of {what}: table {table} (dim {dim}) takes rows {first}..{} of a {rows} x {cols} \
                     gradient",
                    first.saturating_add(n)
                )));
            }
            let src = &all[first * dim..(first + n) * dim];
            let mut g = Vec::with_capacity(src.len());
            if divisor == 1.0 {
                g.extend_from_slice(src);
            } else {
                g.extend(src.iter().map(|x| x / divisor));
            }
            if let Some(k) = g.iter().position(|x| !x.is_finite()) {
                return Ok((None, Some((first + k / dim, k % dim, g[k]))));
            }
            parts.push((table, dim, lr_scales[parts.len()], i.to_vec(), g));
        }
        let mut scales: Vec<f32> = Vec::new();
        for p in &parts {
            if !scales.iter().any(|s| s.to_bits() == p.2.to_bits()) {
                scales.push(p.2);
            }
        }
        let mut handles = Vec::with_capacity(scales.len());
        for scale in scales {
            let (mut ts, mut is, mut gs) = (Vec::new(), Vec::new(), Vec::new());
            for p in parts
                .iter_mut()
                .filter(|p| p.2.to_bits() == scale.to_bits())
            {
                ts.push((p.0, p.1));
                is.push(std::mem::take(&mut p.3));
                gs.push(std::mem::take(&mut p.4));
            }
            let push = PushJob::from_parts(ts, &what, (encoding, scale), is, gs);
            let h = self.spawn_push_logged(push, lane.as_deref(), log.as_deref());
            handles.push(h);
        }
        Ok((Some(handles), None))
    }

    /// Sets the weights of rows of several tables (`rows[i]` is `len(ids[i]) x dim` of `tables[i]`, finite),
    /// keeping their optimizer state (new rows get the initial state): loading saved weights. Waits; returns
    /// the rows written.
    fn write_rows(
        &self,
        py: Python<'_>,
        tables: Vec<(u32, usize)>,
        what: String,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
        rows: Vec<PyReadonlyArray2<'_, f32>>,
    ) -> PyResult<u64> {
        self.check_open(py, &what)?;
        if ids.len() != tables.len() || rows.len() != tables.len() {
            return Err(PyValueError::new_err(format!(
                "{what}: {} id and {} row arrays for {} tables",
                ids.len(),
                rows.len(),
                tables.len()
            )));
        }
        let ids: Vec<Vec<u64>> = ids.iter().map(|a| a.as_array().to_vec()).collect();
        let rows: Vec<Vec<f32>> = rows
            .iter()
            .map(|a| a.as_array().iter().copied().collect())
            .collect();
        let client = self.inner.clone();
        block_on(py, self.timeout, &what, async move {
            let parts: Vec<TableIds<'_>> = tables
                .iter()
                .zip(&ids)
                .map(|(&(table, dim), ids)| TableIds { table, dim, ids })
                .collect();
            let weights: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            write_tables(&client, &parts, &weights).await
        })
    }

    /// Gives the ids of tables that evict by score (`ids[i]` of `tables[i]`) their scores (`scores[i]`, one
    /// per id, finite, `>= 0`), added to the rows' scores or replacing them (`set`), one request per server.
    /// Waits; returns how many distinct ids had a row.
    fn score(
        &self,
        py: Python<'_>,
        tables: Vec<u32>,
        what: String,
        ids: Vec<PyReadonlyArray1<'_, u64>>,
        scores: Vec<PyReadonlyArray1<'_, f32>>,
        set: bool,
    ) -> PyResult<u64> {
        self.check_open(py, &what)?;
        if ids.len() != tables.len() || scores.len() != tables.len() {
            return Err(PyValueError::new_err(format!(
                "{what}: {} id and {} score arrays for {} tables",
                ids.len(),
                scores.len(),
                tables.len()
            )));
        }
        let ids: Vec<Vec<u64>> = ids.iter().map(|a| a.as_array().to_vec()).collect();
        let scores: Vec<Vec<f32>> = scores.iter().map(|a| a.as_array().to_vec()).collect();
        let mode = if set {
            embedding::ScoreMode::Set
        } else {
            embedding::ScoreMode::Add
        };
        let client = self.inner.clone();
        block_on(py, self.timeout, &what, async move {
            let parts: Vec<TableIds<'_>> = tables
                .iter()
                .zip(&ids)
                .map(|(&table, ids)| TableIds { table, dim: 1, ids })
                .collect();
            let scores: Vec<&[f32]> = scores.iter().map(Vec::as_slice).collect();
            protocol::keyed::score_tables(&client, &parts, &scores, mode).await
        })
    }

    /// Asks every server to write its dirty rows to RocksDB; returns the rows written.
    fn flush(&self, py: Python<'_>) -> PyResult<u64> {
        self.check_open(py, "flush")?;
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

    /// Writes an export that `ps-serve --export root` loads (docs/serving.md, "Export"): version `version`
    /// under `root` (on a file system the servers share, inside their checkpoint root), holding the servers'
    /// snapshot of every table, the dense parameters `params` (f32 tensors in the order of the spec's model:
    /// bottom MLP weights and biases, then top MLP's), and a manifest with the model spec `spec_toml`
    /// (docs/model-spec.md) whose tables are `tables` of this client, by name. Every push must be
    /// acknowledged first (the caller waits). Returns the version directory.
    #[pyo3(signature = (root, version, spec_toml, tables, params, samples = 0, keep = 3))]
    #[allow(clippy::too_many_arguments)]
    fn export_dlrm(
        &self,
        py: Python<'_>,
        root: PathBuf,
        version: u64,
        spec_toml: &str,
        tables: Vec<u32>,
        params: Vec<PyReadonlyArray1<'_, f32>>,
        samples: u64,
        keep: usize,
    ) -> PyResult<String> {
        self.check_open(py, "export")?;
        let tables = tables
            .into_iter()
            .map(|t| self.config(t))
            .collect::<PyResult<Vec<TableConfig>>>()?;
        let params: Vec<Vec<f32>> = params.iter().map(|a| a.as_array().to_vec()).collect();
        let (client, timeout) = (self.inner.clone(), self.timeout);
        let dir = py.detach(|| {
            crate::export::write(
                &client,
                timeout,
                &root,
                (version, samples, keep),
                spec_toml,
                tables,
                &params,
            )
        });
        match dir {
            Ok(dir) => Ok(dir.display().to_string()),
            Err(crate::export::ExportError::Request(e)) => Err(e.into_py(py)),
            Err(e) => Err(PyValueError::new_err(e.to_string())),
        }
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

    /// Closes every connection, after the requests in flight are answered or failed (up to the client's
    /// timeout, which bounds each of them anyway): closing a connection under a push would have its retry
    /// send it again. Later requests raise `PsError`. Idempotent.
    fn close(&self, py: Python<'_>) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let (client, inflight, timeout) = (self.inner.clone(), self.inflight.clone(), self.timeout);
        py.detach(|| {
            runtime().block_on(async move {
                let _ = tokio::time::timeout(timeout, inflight.idle()).await;
                let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
            })
        });
    }

    /// Requests started and not yet answered.
    #[getter]
    fn in_flight(&self) -> usize {
        self.inflight.count.load(Ordering::SeqCst)
    }
}
