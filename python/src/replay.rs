//! Replay of a collection's own pushes on rows pulled before the servers applied them, without I/O: the rows
//! and optimizer state are updated as the servers update them (the same [`embedding::optimizer::update`] with
//! the table's config), so a step computes with the rows a synchronous run would (`pstrain/_lookup.py`; the
//! Rust trainer's counterpart is `trainer/src/step/replay.rs`).
//!
//! [`ReplayLog`] keeps the pushes a prefetched pull may lack (their ids and gradients shared with the push
//! itself, no copy); a pull with state replays them onto its rows before the rows reach Python
//! (`PullHandle.wait(log=...)`), so the optimizer state never leaves Rust.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

use base::hash::IdHasher;
use embedding::optimizer::{update, Regularizer};
use embedding::{OptimizerConfig, TableConfig};
use pyo3::prelude::*;

/// For each id of `target` (distinct) that `pushed` (distinct) holds, updates its row of `rows`
/// (`target.len() x dim`) and its state of `state` (`target.len() x state_len`) with `cfg`'s optimizer and the
/// pushed gradient row of `grads` (`pushed.len() x dim`), at `opt` (the table's optimizer at the push's
/// learning-rate multiplier). Rows whose gradient is not finite are left, as the servers refuse them. The
/// caller checked the lengths. Returns the rows updated.
pub(crate) fn apply(
    (cfg, opt): (&TableConfig, &OptimizerConfig),
    rows: &mut [f32],
    state: &mut [f32],
    target: &[u64],
    pushed: &[u64],
    grads: &[f32],
) -> usize {
    let (dim, len) = (cfg.dim, cfg.state_len());
    let reg = Regularizer::of(cfg);
    // Half-precision weights are rounded after each update as the servers round them.
    let codec = cfg.row_codec();
    let mut at: HashMap<u64, usize, BuildHasherDefault<IdHasher>> =
        HashMap::with_capacity_and_hasher(pushed.len(), Default::default());
    at.extend(pushed.iter().enumerate().map(|(i, &id)| (id, i)));
    let mut updated = 0;
    for (i, id) in target.iter().enumerate() {
        let Some(&j) = at.get(id) else { continue };
        let g = &grads[j * dim..(j + 1) * dim];
        if !g.iter().all(|x| x.is_finite()) {
            continue;
        }
        let (row, st) = (
            &mut rows[i * dim..(i + 1) * dim],
            &mut state[i * len..(i + 1) * len],
        );
        update(opt, reg, row, st, g);
        codec.round_updated(*id, row, st);
        updated += 1;
    }
    updated
}

/// One table's part of a logged push: its distinct ids and their gradients as pushed (`ids x dim`).
pub(crate) struct Logged {
    pub(crate) table: u32,
    pub(crate) ids: Arc<Vec<u64>>,
    pub(crate) grads: Arc<Vec<f32>>,
}

/// A logged push: its sequence number on the collection's lane, its learning-rate multiplier, its tables.
struct Entry {
    seq: u64,
    lr_scale: f32,
    tables: Vec<Logged>,
}

/// The pushes of one collection that a prefetched pull may lack, oldest first (`Client.push_group(log=)` adds,
/// `PullHandle.wait(log=)` replays, `trim` forgets what no pull in flight needs).
#[pyclass(module = "pstrain._pstrain")]
#[derive(Default)]
pub struct ReplayLog {
    entries: Mutex<VecDeque<Entry>>,
}

impl ReplayLog {
    /// Logs the push `seq` (increasing) at `lr_scale`.
    pub(crate) fn add(&self, seq: u64, lr_scale: f32, tables: Vec<Logged>) {
        self.entries
            .lock()
            .expect("replay log lock")
            .push_back(Entry {
                seq,
                lr_scale,
                tables,
            });
    }

    /// Applies every logged push entered after `pull_seq`, in order, to the rows and state of a pull with
    /// state: `tables[t]` (config, distinct ids) holds rows at `rows[row_at[t]..]` and state at
    /// `state[state_at[t]..]`. A push at a multiplier the table's optimizer cannot take (the servers refused
    /// it) is skipped. Returns the rows updated.
    pub(crate) fn replay(
        &self,
        pull_seq: u64,
        tables: &[(TableConfig, Arc<Vec<u64>>)],
        rows: &mut [f32],
        state: &mut [f32],
    ) -> usize {
        let entries = self.entries.lock().expect("replay log lock");
        let (mut row_at, mut state_at) = (Vec::new(), Vec::new());
        let (mut r, mut s) = (0, 0);
        for (cfg, ids) in tables {
            row_at.push(r);
            state_at.push(s);
            r += ids.len() * cfg.dim;
            s += ids.len() * cfg.state_len();
        }
        let mut updated = 0;
        for e in entries.iter().filter(|e| e.seq > pull_seq) {
            for part in &e.tables {
                for (t, (cfg, ids)) in tables.iter().enumerate() {
                    if cfg.id != part.table {
                        continue;
                    }
                    let Some(opt) = cfg.optimizer.with_lr_scale(e.lr_scale) else {
                        continue;
                    };
                    let (n, dim, len) = (ids.len(), cfg.dim, cfg.state_len());
                    updated += apply(
                        (cfg, &opt),
                        &mut rows[row_at[t]..row_at[t] + n * dim],
                        &mut state[state_at[t]..state_at[t] + n * len],
                        ids,
                        &part.ids,
                        &part.grads,
                    );
                }
            }
        }
        updated
    }
}

#[pymethods]
impl ReplayLog {
    /// An empty log.
    #[new]
    fn new() -> ReplayLog {
        ReplayLog::default()
    }

    /// Forgets the pushes entered before `oldest` (the oldest pull in flight); `None`: every push.
    #[pyo3(signature = (oldest = None))]
    fn trim(&self, oldest: Option<u64>) {
        let mut entries = self.entries.lock().expect("replay log lock");
        match oldest {
            None => entries.clear(),
            Some(o) => {
                while entries.front().is_some_and(|e| e.seq < o) {
                    entries.pop_front();
                }
            }
        }
    }

    /// Pushes held.
    fn __len__(&self) -> usize {
        self.entries.lock().expect("replay log lock").len()
    }
}
