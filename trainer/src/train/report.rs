//! What a training pass reports: its result, its progress, its events, and the options that shape it.

use std::path::PathBuf;

use crate::criteo::{ReadStats, ReaderConfig};
use crate::model::eval::EvalReport;
use crate::progressive::ProgressiveReport;
use crate::timing::TimeReport;

/// What one pass over the training data did.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// Samples trained on in this pass (not counting a resumed run's earlier samples).
    pub samples: u64,
    /// Batches trained on in this pass.
    pub batches: u64,
    /// Wall-clock seconds of the pass (reading, pulls, compute and pushes; the last pushes acknowledged),
    /// not counting periodic evaluations and checkpoints.
    pub seconds: f64,
    /// Mean training loss over the last 10% of the samples (at least the last batch).
    pub final_loss: f64,
    /// Mean training loss over the whole pass.
    pub mean_loss: f64,
    /// Gradient rows the servers rejected as non-finite.
    pub rejected_nonfinite: u64,
    /// The reader's counts (bad lines, padded lines).
    pub read: ReadStats,
    /// The periodic evaluations: `(step, report)`.
    pub evals: Vec<(u64, EvalReport)>,
    /// Embedding rows and gradients on the wire during the pass (frame payloads, both directions; the
    /// pulls of evaluations within the pass included).
    pub wire_bytes: u64,
    /// Progressive validation over the pass's last `--progressive-window` rows ([`crate::progressive`]);
    /// `None` when off or without rows.
    pub progressive: Option<ProgressiveReport>,
    /// Where the pass's time went ([`crate::timing`]).
    pub time: TimeReport,
    /// Unique rows pulled per table (training batches).
    pub rows_pulled: Vec<u64>,
    /// Unique gradient rows pushed per table.
    pub rows_pushed: Vec<u64>,
}

/// Progress of a running pass, reported every progress interval.
#[derive(Debug, Clone)]
pub struct Progress {
    /// The trainer's step (batches trained, including a resumed run's).
    pub step: u64,
    /// Samples so far.
    pub samples: u64,
    /// Seconds since the pass began (evaluations and checkpoints left out).
    pub seconds: f64,
    /// The fraction of the pass done, when its rows are known ([`crate::train`]'s estimate: exact for
    /// columnar shards, from the file sizes for plain text, unknown for compressed text and streams).
    pub fraction: Option<f64>,
    /// Seconds until the end of the pass at the pass's mean speed so far, with `fraction`.
    pub eta_secs: Option<f64>,
    /// Where the time of the last interval went.
    pub time: TimeReport,
    /// Unique rows pulled per table in the last interval.
    pub rows_pulled: Vec<u64>,
    /// Unique gradient rows pushed per table in the last interval.
    pub rows_pushed: Vec<u64>,
    /// Samples per second over the last interval.
    pub samples_per_sec: f64,
    /// Mean loss over the last interval.
    pub loss: f64,
    /// Over the last interval, the mean prediction (made before each batch's update) over the positive rate:
    /// the training-time calibration (NaN without positives).
    pub calibration: f64,
    /// Progressive validation over the last `--progressive-window` rows (`None` when off).
    pub progressive: Option<ProgressiveReport>,
}

/// Something a pass reports while it runs.
#[derive(Debug, Clone)]
pub enum Event {
    /// Throughput and loss over the last progress interval.
    Progress(Box<Progress>),
    /// A periodic evaluation on the held-out set.
    Eval {
        /// The trainer's step (batches trained, including a resumed run's).
        step: u64,
        /// The metrics.
        report: EvalReport,
    },
    /// A checkpoint was written.
    Checkpoint {
        /// The step it holds.
        step: u64,
        /// Its file.
        path: PathBuf,
        /// Whether the servers' snapshot was taken with it.
        ps_snapshot: bool,
    },
    /// A periodic checkpoint could not be written (a full or failing disk, after the client's retries) and
    /// was skipped: the previous one stays the latest, training goes on
    /// ([`crate::checkpoint::CheckpointError::is_write_failure`]). A final checkpoint that fails ends the pass
    /// with its error instead.
    CheckpointSkipped {
        /// The step it would have held.
        step: u64,
        /// Why it failed.
        error: String,
    },
    /// An export was written.
    Export {
        /// The step (and version) it holds.
        step: u64,
        /// Its version directory.
        path: PathBuf,
    },
}

/// What a pass does besides training: periodic evaluation and checkpoints, and an early stop.
#[derive(Debug, Clone, Default)]
pub struct PassOptions {
    /// Evaluate on `eval_data` every this many steps (0 = never during the pass).
    pub eval_every: u64,
    /// The held-out set of periodic evaluations.
    pub eval_data: Option<ReaderConfig>,
    /// Write checkpoints here.
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every this many steps (0 = only at the end); needs `checkpoint_dir`.
    pub checkpoint_every: u64,
    /// Stop once the trainer's step reaches this (0 = run to the end of the data).
    pub max_steps: u64,
    /// Write exports (servable models) here (rank 0): at every checkpoint, every `export_every` steps and
    /// at the end.
    pub export_dir: Option<PathBuf>,
    /// Export every this many steps besides the checkpoints (0 = at checkpoints and the end only).
    pub export_every: u64,
    /// Complete exports kept (older ones are removed; at least 1).
    pub export_keep: usize,
    /// Rows each export leaves out (publish-time pruning), if any.
    pub export_prune: Option<embedding::ExportPrune>,
    /// Publish the dense parameters to server 0 for serving's delta sync every this many steps (rank 0;
    /// 0 = never).
    pub publish_dense_every: u64,
    /// Rows of progressive validation's sliding window (0 = off; [`crate::progressive`]).
    pub progressive_window: usize,
    /// Processes whose CPU seconds the pass reports besides its own (the local servers of `trainer demo`).
    pub watch_pids: Vec<u32>,
}

/// Sample-weighted mean loss over the last `tail` samples (at least the last batch).
pub(super) fn tail_mean(losses: &[(u64, f32)], tail: u64) -> f64 {
    let (mut n, mut sum) = (0u64, 0.0f64);
    for &(b, l) in losses.iter().rev() {
        n += b;
        sum += l as f64 * b as f64;
        if n >= tail {
            break;
        }
    }
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn tail_mean_weights_by_samples() {
        let l = [(10, 1.0), (10, 3.0), (5, 5.0)];
        assert_eq!(tail_mean(&l, 5), 5.0);
        assert!((tail_mean(&l, 15) - (30.0 + 25.0) / 15.0).abs() < 1e-9);
        assert!(tail_mean(&[], 3).is_nan());
    }
}
