//! `LocalCluster`: real `ps-server` processes on loopback ([`local_cluster`]) for examples and tests,
//! started from Python and stopped with SIGTERM (`stop`) or killed when the object goes away.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A running local cluster.
#[pyclass(module = "pstrain._pstrain")]
pub struct LocalCluster {
    inner: Option<local_cluster::LocalCluster>,
    run_dir: PathBuf,
}

impl LocalCluster {
    fn running(&self) -> PyResult<&local_cluster::LocalCluster> {
        self.inner
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the local cluster was stopped"))
    }
}

#[pymethods]
impl LocalCluster {
    /// Starts `servers` processes of the `ps_server` binary under `run_dir` (RocksDB directories, logs and a
    /// dev CA in `run_dir/tls`), each with `extra_args`, and waits until every one reports ready.
    #[new]
    #[pyo3(signature = (ps_server, servers, run_dir, extra_args = Vec::new()))]
    fn new(
        py: Python<'_>,
        ps_server: PathBuf,
        servers: usize,
        run_dir: PathBuf,
        extra_args: Vec<String>,
    ) -> PyResult<LocalCluster> {
        if servers == 0 {
            return Err(PyValueError::new_err("servers = 0: expected at least 1"));
        }
        if !ps_server.is_file() {
            return Err(PyValueError::new_err(format!(
                "ps_server = {}: not a file (build it with `cargo build --release -p ps-server`)",
                ps_server.display()
            )));
        }
        let dir = run_dir.clone();
        let cluster = py
            .detach(move || {
                local_cluster::LocalCluster::start_with(
                    &|| Ok(Command::new(&ps_server)),
                    servers,
                    &dir,
                    &extra_args,
                )
            })
            .map_err(|e| PyRuntimeError::new_err(format!("start the local cluster: {e:#}")))?;
        Ok(LocalCluster {
            inner: Some(cluster),
            run_dir,
        })
    }

    /// The servers' QUIC addresses, `host:port`, in shard order.
    #[getter]
    fn servers(&self) -> PyResult<Vec<String>> {
        Ok(self.running()?.quic.iter().map(|a| a.to_string()).collect())
    }

    /// The servers' metrics (HTTP) addresses, in shard order.
    #[getter]
    fn metrics(&self) -> PyResult<Vec<String>> {
        Ok(self
            .running()?
            .metrics
            .iter()
            .map(|a| a.to_string())
            .collect())
    }

    /// The TLS directory clients use.
    #[getter]
    fn tls_dir(&self) -> PyResult<String> {
        Ok(self.running()?.tls_dir.display().to_string())
    }

    /// The run directory.
    #[getter]
    fn run_dir(&self) -> String {
        self.run_dir.display().to_string()
    }

    /// Process ids, in shard order.
    #[getter]
    fn pids(&self) -> PyResult<Vec<u32>> {
        Ok(self.running()?.pids())
    }

    /// Whether the cluster is still running (not stopped).
    #[getter(running)]
    fn is_running(&self) -> bool {
        self.inner.is_some()
    }

    /// Sends SIGTERM to every server and waits up to `timeout_secs` for each to exit; raises unless every one
    /// exited cleanly. A second call does nothing.
    #[pyo3(signature = (timeout_secs = 60.0))]
    fn stop(&mut self, py: Python<'_>, timeout_secs: f64) -> PyResult<()> {
        let Some(cluster) = self.inner.take() else {
            return Ok(());
        };
        py.detach(move || cluster.shutdown(Duration::from_secs_f64(timeout_secs.max(0.0))))
            .map_err(|e| PyRuntimeError::new_err(format!("stop the local cluster: {e:#}")))
    }
}
