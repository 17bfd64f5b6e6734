//! Progressive validation: every training batch's forward pass predicts its rows before the model trains on
//! them, so those predictions score the model on data it has not seen, like a held-out set that moves with
//! the stream. [`Window`] keeps the last `n` of them (`--progressive-window`) and scores them exactly (AUC
//! and logloss) when asked, at each progress line.
//!
//! What "before" means in the pipelined trainer: a batch is predicted before its own update, but its pulled
//! rows lack up to `--max-in-flight` earlier batches' pushes (the staleness bound), and with several trainers
//! the dense parameters and rows may hold other trainers' updates, including ones made after rows of this
//! batch's time. Neither uses this batch's labels, so the predictions remain out-of-sample.
//!
//! Cost: a push copies the batch's probabilities and labels into a ring (8 bytes per row); a report sorts
//! the window (`O(n log n)`: 22 ms for 100,000 rows in a test build, `report_cost_at_100k`), once per progress
//! line (every `--progress-secs`, 2 s by default: about 1% of a core), never per step.

use crate::model::eval;

/// The last `capacity` (probability, label) pairs of the training stream.
#[derive(Debug, Clone)]
pub struct Window {
    capacity: usize,
    probs: Vec<f32>,
    labels: Vec<f32>,
    /// Where the next row goes once the ring is full.
    next: usize,
    /// Rows ever pushed.
    seen: u64,
}

/// The scores of a [`Window`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProgressiveReport {
    /// Rows in the window.
    pub rows: u64,
    /// AUC over the window (`None` while it holds one class only).
    pub auc: Option<f64>,
    /// Mean logloss over the window.
    pub logloss: f64,
}

impl Window {
    /// A window of the last `capacity` rows (0: keeps nothing, reports nothing).
    pub fn new(capacity: usize) -> Window {
        Window {
            capacity,
            probs: Vec::new(),
            labels: Vec::new(),
            next: 0,
            seen: 0,
        }
    }

    /// Adds a batch's predictions (made before training on it) and labels, in row order.
    ///
    /// # Panics
    /// If `probs` and `labels` differ in length.
    pub fn push(&mut self, probs: &[f32], labels: &[f32]) {
        assert_eq!(probs.len(), labels.len(), "progressive: probs and labels");
        self.seen += probs.len() as u64;
        let keep = probs.len().min(self.capacity);
        let (probs, labels) = (&probs[probs.len() - keep..], &labels[labels.len() - keep..]);
        // Fill up to the capacity, then overwrite the oldest rows in ring order.
        let fill = keep.min(self.capacity - self.probs.len());
        self.probs.extend_from_slice(&probs[..fill]);
        self.labels.extend_from_slice(&labels[..fill]);
        let (mut probs, mut labels) = (&probs[fill..], &labels[fill..]);
        while !probs.is_empty() {
            let n = probs.len().min(self.capacity - self.next);
            self.probs[self.next..self.next + n].copy_from_slice(&probs[..n]);
            self.labels[self.next..self.next + n].copy_from_slice(&labels[..n]);
            self.next = (self.next + n) % self.capacity;
            (probs, labels) = (&probs[n..], &labels[n..]);
        }
    }

    /// Rows ever pushed.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The scores over the window; `None` while it is empty.
    pub fn report(&self) -> Option<ProgressiveReport> {
        if self.probs.is_empty() {
            return None;
        }
        Some(ProgressiveReport {
            rows: self.probs.len() as u64,
            auc: eval::auc(&self.probs, &self.labels),
            logloss: eval::logloss(&self.probs, &self.labels),
        })
    }

    /// [`report`](Self::report), also setting the gauges of [`crate::metrics`].
    pub fn export(&self) -> Option<ProgressiveReport> {
        let report = self.report()?;
        if let Some(auc) = report.auc {
            metrics::gauge!(crate::metrics::PROGRESSIVE_AUC).set(auc);
        }
        metrics::gauge!(crate::metrics::PROGRESSIVE_LOGLOSS).set(report.logloss);
        Some(report)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// AUC by counting pairs (ties one half): the definition, in O(n²).
    fn brute_auc(rows: &[(f32, f32)]) -> Option<f64> {
        let (mut wins, mut pairs) = (0.0, 0.0);
        for &(p, _) in rows.iter().filter(|r| r.1 >= 0.5) {
            for &(q, _) in rows.iter().filter(|r| r.1 < 0.5) {
                pairs += 1.0;
                wins += if p > q {
                    1.0
                } else if p == q {
                    0.5
                } else {
                    0.0
                };
            }
        }
        (pairs > 0.0).then(|| wins / pairs)
    }

    proptest! {
        /// The window scores exactly the last `capacity` rows of the stream, whatever the batch sizes.
        #[test]
        fn scores_the_last_rows_like_brute_force(
            capacity in 0usize..40,
            batches in prop::collection::vec(
                prop::collection::vec((0u8..6, any::<bool>()), 0..25), 0..12),
        ) {
            let mut window = Window::new(capacity);
            let mut all: Vec<(f32, f32)> = Vec::new();
            for batch in &batches {
                // Few distinct probabilities, so ties are common.
                let rows: Vec<(f32, f32)> = batch
                    .iter()
                    .map(|&(p, y)| (0.1 + 0.15 * p as f32, if y { 1.0 } else { 0.0 }))
                    .collect();
                let (p, y): (Vec<f32>, Vec<f32>) = rows.iter().copied().unzip();
                window.push(&p, &y);
                all.extend(rows);
                let tail = &all[all.len().saturating_sub(capacity)..];
                let report = window.report();
                prop_assert_eq!(window.seen(), all.len() as u64);
                if tail.is_empty() {
                    prop_assert!(report.is_none());
                    continue;
                }
                let report = report.unwrap();
                prop_assert_eq!(report.rows, tail.len() as u64);
                match (report.auc, brute_auc(tail)) {
                    (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-9, "{} vs {}", a, b),
                    (a, b) => prop_assert_eq!(a, b),
                }
                let (p, y): (Vec<f32>, Vec<f32>) = tail.iter().copied().unzip();
                prop_assert!((report.logloss - eval::logloss(&p, &y)).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn a_batch_larger_than_the_window_keeps_its_last_rows() {
        let mut w = Window::new(3);
        w.push(&[0.9, 0.1, 0.4, 0.8, 0.3], &[0.0, 0.0, 1.0, 1.0, 0.0]);
        // Last three rows: (0.4, 1), (0.8, 1), (0.3, 0): both positives above the negative (the first
        // rows, where a negative scores 0.9, are gone).
        assert_eq!(w.report().unwrap().auc, Some(1.0));
        assert_eq!(w.report().unwrap().rows, 3);
        assert!(Window::new(0).report().is_none());
    }

    /// The report's cost at the default window, for the module doc (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn report_cost_at_100k() {
        let mut w = Window::new(100_000);
        let mut x = 1u64;
        for _ in 0..50 {
            let (p, y): (Vec<f32>, Vec<f32>) = (0..4096)
                .map(|_| {
                    x = base::hash::splitmix64(x);
                    ((x >> 40) as f32 / (1u64 << 24) as f32, (x & 1) as f32)
                })
                .unzip();
            w.push(&p, &y);
        }
        let started = std::time::Instant::now();
        for _ in 0..20 {
            std::hint::black_box(w.report());
        }
        eprintln!("report of 100k rows: {:?}", started.elapsed() / 20);
    }
}
