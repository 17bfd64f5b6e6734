//! `pstrain._pstrain`: the Rust half of the `pstrain` Python package (PyO3).
//!
//! It links the client side only (DESIGN.md, "Crates and their one job each": `python` must not link the
//! server or RocksDB): [`protocol`]'s [`protocol::PsClient`] and keyed pulls and pushes, [`ops`]'s local
//! cluster of `ps-server` processes, and the [`criteo`] reader. The Python modules in `python/pstrain/`
//! check arguments (dtypes, shapes, names) and give the friendly API; this module trusts nothing either and
//! refuses what does not fit with a Python exception.
//!
//! # Layout
//! - [`client`]: `Client`: requests run on one process-wide tokio runtime ([`runtime`]) with the GIL
//!   released; rows are decoded into a `Vec<f32>` that becomes the numpy array's buffer (no copy).
//! - [`jobs`]: a pull or push copied out of Python's arrays, ready to run; [`handles`]: `PullHandle`,
//!   `PushHandle`, the request in flight.
//! - [`cluster`]: `LocalCluster`, real `ps-server` processes on loopback.
//! - [`data`]: `read_criteo`, a Criteo file into numpy arrays (labels, dense features, feature ids).
//! - [`dedup`]: `unique_inverse`, a batch's distinct ids by hashing.
//! - [`lane`]: `Lane`, one collection's order of pulls and pushes (what replay of its own pushes relies on);
//!   [`replay`]: a push applied to rows pulled before it, as the servers apply it.
//! - [`errors`]: how protocol errors become the exceptions of `pstrain/errors.py`.

use pyo3::prelude::*;

pub mod client;
pub mod cluster;
pub(crate) mod counters;
pub mod data;
pub mod dedup;
pub mod errors;
pub(crate) mod export;
pub mod handles;
pub(crate) mod jobs;
pub mod lane;
pub mod replay;

/// The scheduling policy of the I/O threads from `PSTRAIN_IO_SCHED` (`batch` when unset), or a `ValueError`
/// naming the bad value (`Client(...)` checks it before the runtime starts).
pub fn io_policy() -> PyResult<base::sched::Policy> {
    match std::env::var("PSTRAIN_IO_SCHED") {
        Ok(v) => v.parse().map_err(|e: String| {
            pyo3::exceptions::PyValueError::new_err(format!("PSTRAIN_IO_SCHED: {e}"))
        }),
        Err(_) => Ok(base::sched::Policy::Batch),
    }
}

/// The process-wide tokio runtime every client shares, created on first use with `PSTRAIN_IO_THREADS` worker
/// threads (default 2: requests are I/O and codec work beside the caller's Python and torch threads).
///
/// Its threads are helpers of the training thread ([`base::sched`]): with `PSTRAIN_IO_SCHED=batch` (the
/// default) they run as Linux `SCHED_BATCH`, so a push or pull the training thread hands them does not preempt
/// that thread or torch's OpenMP workers on wake-up; it runs on a free core or at the next scheduler tick.
/// Handing a push over cost the training thread 2.2-3 ms per step before (it was preempted inside the call),
/// 0.8-1.1 ms after (issue 42). `PSTRAIN_IO_SCHED=normal` keeps the system's default ([`io_policy`]).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        let threads = std::env::var("PSTRAIN_IO_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(2);
        // A bad value was refused by `Client(...)`; a runtime started by another path keeps the default.
        base::sched::set_helper_policy(io_policy().unwrap_or_default());
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("pstrain-io")
            .on_thread_start(|| {
                // A refusal leaves the thread at the default policy: slower to share, never wrong.
                let _ = base::sched::enter_helper();
            })
            .enable_all()
            .build()
            .expect("start the tokio runtime")
    })
}

/// The extension module.
#[pymodule]
fn _pstrain(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::Client>()?;
    m.add_class::<handles::PullHandle>()?;
    m.add_class::<handles::PushHandle>()?;
    m.add_class::<lane::Lane>()?;
    m.add_class::<replay::ReplayLog>()?;
    m.add_class::<cluster::LocalCluster>()?;
    m.add_function(wrap_pyfunction!(data::read_criteo, m)?)?;
    m.add_function(wrap_pyfunction!(dedup::unique_inverse, m)?)?;
    m.add_function(wrap_pyfunction!(dedup::plan_group, m)?)?;
    m.add("NUM_DENSE", criteo::NUM_DENSE)?;
    m.add("NUM_SPARSE", criteo::NUM_SPARSE)?;
    Ok(())
}
