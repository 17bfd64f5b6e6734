//! `Lane`: the order of one embedding collection's pulls and pushes, kept by the I/O threads.
//!
//! A collection that replays its own pushes (DESIGN.md, "Wave 3", TorchRec; `trainer/src/step/replay.rs` for the
//! Rust trainer) must know exactly which of its pushes a pulled row holds. A pull that reads while one of the
//! collection's pushes is being applied may hold it or not. So a pull waits until every push entered before it
//! is answered, and a push waits until every request entered before it (pulls and pushes) is answered; pulls
//! overlap each other freely. Then a pull holds exactly the pushes entered before it (those that succeeded),
//! and none entered after it, and the Python side replays the latter (their sequence numbers are larger than
//! the pull's). Pushes are applied in the order they were entered: two updates of one row by row-wise Adagrad
//! or Adam give other bits in the other order, and the replayed rows must be the servers' rows.
//!
//! Nothing here blocks a thread: a request waits on the runtime, after its handle was returned to Python.

use std::sync::Mutex;

use pyo3::prelude::*;
use tokio::sync::watch;

/// Signalled (`true`) when a request has its answer or its error.
pub(crate) type Done = watch::Receiver<bool>;

/// Sets the request's [`Done`] when dropped: when the task ends, however it ends.
pub(crate) struct DoneGuard(pub(crate) Option<watch::Sender<bool>>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(true);
        }
    }
}

/// What a request entering a lane waits for, and its place.
pub(crate) struct Entry {
    /// The lane's sequence number of the request (from 1).
    pub(crate) seq: u64,
    /// The requests of the other kind entered before it and not yet answered.
    pub(crate) after: Vec<Done>,
    /// Set when the request is answered.
    pub(crate) done: DoneGuard,
}

#[derive(Default)]
struct State {
    /// Kind of the current run: `Some(true)` pushes, `Some(false)` pulls.
    kind: Option<bool>,
    /// Unanswered requests of the current run.
    current: Vec<Done>,
    /// Unanswered requests of the runs before it (of the other kind, as seen by the current run).
    before: Vec<Done>,
    /// The last sequence number given.
    seq: u64,
}

/// One collection's order of pulls and pushes (see the module docs). Pass it to `Client.pull_async` and
/// `Client.push_async`.
#[pyclass(module = "pstrain._pstrain")]
#[derive(Default)]
pub struct Lane {
    state: Mutex<State>,
}

fn pending(v: &mut Vec<Done>) {
    v.retain(|d| !*d.borrow());
}

impl Lane {
    /// Enters a request of kind `push` (else a pull).
    pub(crate) fn enter(&self, push: bool) -> Entry {
        let mut s = self.state.lock().expect("lane lock");
        // Answered requests need no waiting for: only unanswered ones are kept, so the lists stay as short as
        // the requests in flight.
        pending(&mut s.current);
        pending(&mut s.before);
        if s.kind != Some(push) {
            let run = std::mem::take(&mut s.current);
            s.before = run;
            s.kind = Some(push);
        }
        let (tx, rx) = watch::channel(false);
        let mut after = s.before.clone();
        if push {
            // Pushes of one run follow each other too.
            after.extend(s.current.iter().cloned());
        }
        s.current.push(rx);
        s.seq += 1;
        Entry {
            seq: s.seq,
            after,
            done: DoneGuard(Some(tx)),
        }
    }
}

/// Waits until every request of `after` is answered (a request whose task ended counts as answered).
pub(crate) async fn wait_all(after: Vec<Done>) {
    for mut d in after {
        let _ = d.wait_for(|done| *done).await;
    }
}

#[pymethods]
impl Lane {
    /// An empty lane.
    #[new]
    fn new() -> Lane {
        Lane::default()
    }

    /// The sequence number the last request entered got (0 before any).
    #[getter]
    fn seq(&self) -> u64 {
        self.state.lock().expect("lane lock").seq
    }
}
