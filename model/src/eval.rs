//! Evaluation metrics: exact ROC AUC, log loss, and a streaming [`Evaluator`] that gathers both over an
//! evaluation pass.
//!
//! A label counts as positive when it is `>= 0.5` (Criteo labels are exactly 0 or 1).

/// Probabilities are clamped to `[LOGLOSS_EPS, 1 - LOGLOSS_EPS]` before taking logs, so a confident wrong
/// prediction costs about 16 nats instead of infinity.
pub const LOGLOSS_EPS: f64 = 1e-7;

/// Exact area under the ROC curve: the probability that a random positive scores above a random negative,
/// ties counting one half (equivalently, the trapezoid rule over the ROC curve, or the Mann–Whitney `U`
/// statistic from average ranks).
///
/// Returns `None` when the labels hold only one class (or are empty): AUC is undefined then. Scores are
/// ordered by `f32::total_cmp`, so NaN scores do not panic (they sort above `+inf`).
///
/// # Panics
/// If `scores` and `labels` differ in length.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    assert_eq!(
        scores.len(),
        labels.len(),
        "auc: scores and labels differ in length"
    );
    let mut pairs: Vec<(f32, bool)> = scores
        .iter()
        .zip(labels)
        .map(|(&s, &l)| (s, l >= 0.5))
        .collect();
    auc_in_place(&mut pairs)
}

/// [`auc`] on `(score, is_positive)` pairs, sorting them in place.
fn auc_in_place(pairs: &mut [(f32, bool)]) -> Option<f64> {
    let positives = pairs.iter().filter(|p| p.1).count();
    let negatives = pairs.len() - positives;
    if positives == 0 || negatives == 0 {
        return None;
    }
    pairs.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    // Sum of the (1-based, tie-averaged) ranks of the positives.
    let mut rank_sum = 0.0f64;
    let mut start = 0;
    while start < pairs.len() {
        let score = pairs[start].0;
        let end = start
            + pairs[start..]
                .iter()
                .take_while(|p| p.0.total_cmp(&score).is_eq())
                .count();
        let tied_pos = pairs[start..end].iter().filter(|p| p.1).count();
        // Ranks start+1 ..= end, average (start + 1 + end) / 2.
        rank_sum += tied_pos as f64 * (start + 1 + end) as f64 / 2.0;
        start = end;
    }
    let (p, n) = (positives as f64, negatives as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// Mean binary cross-entropy of probabilities against labels, with probabilities clamped to
/// `[LOGLOSS_EPS, 1 - LOGLOSS_EPS]`; labels may be fractional. NaN for empty input.
///
/// # Panics
/// If `probs` and `labels` differ in length.
pub fn logloss(probs: &[f32], labels: &[f32]) -> f64 {
    assert_eq!(
        probs.len(),
        labels.len(),
        "logloss: probs and labels differ in length"
    );
    sum_logloss(probs, labels) / probs.len() as f64
}

fn sum_logloss(probs: &[f32], labels: &[f32]) -> f64 {
    probs
        .iter()
        .zip(labels)
        .map(|(&p, &y)| {
            let p = (p as f64).clamp(LOGLOSS_EPS, 1.0 - LOGLOSS_EPS);
            let y = y as f64;
            -(y * p.ln() + (1.0 - y) * (1.0 - p).ln())
        })
        .sum()
}

/// What an evaluation pass measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalReport {
    /// Samples seen.
    pub count: u64,
    /// Exact ROC AUC; `None` when only one class was seen.
    pub auc: Option<f64>,
    /// Mean clamped log loss (NaN when empty).
    pub logloss: f64,
    /// Mean predicted probability (NaN when empty).
    pub mean_prediction: f64,
    /// Mean label, the empirical click rate (NaN when empty).
    pub positive_rate: f64,
}

impl EvalReport {
    /// Calibration: mean prediction over positive rate (1 = calibrated); `None` without positives.
    pub fn calibration(&self) -> Option<f64> {
        (self.positive_rate > 0.0).then(|| self.mean_prediction / self.positive_rate)
    }

    /// One line: samples, AUC, logloss, calibration, mean prediction and positive rate.
    pub fn render(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.4}"));
        format!(
            "samples {}  AUC {}  logloss {:.4}  calibration {} (mean prediction {:.4}, positive rate {:.4})",
            self.count,
            opt(self.auc),
            self.logloss,
            opt(self.calibration()),
            self.mean_prediction,
            self.positive_rate
        )
    }
}

/// Accumulates `(probability, label)` pairs batch by batch and reports the metrics at the end.
///
/// Log loss and the means are running sums; exact AUC needs every pair, so the evaluator keeps them
/// (8 bytes per sample). Call [`push`](Self::push) per batch, then [`report`](Self::report);
/// [`clear`](Self::clear) starts a new pass and keeps the memory.
#[derive(Debug, Clone, Default)]
pub struct Evaluator {
    pairs: Vec<(f32, bool)>,
    logloss_sum: f64,
    prob_sum: f64,
    label_sum: f64,
}

impl Evaluator {
    /// An empty evaluator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a batch.
    ///
    /// # Panics
    /// If `probs` and `labels` differ in length.
    pub fn push(&mut self, probs: &[f32], labels: &[f32]) {
        assert_eq!(
            probs.len(),
            labels.len(),
            "evaluator: probs and labels differ in length"
        );
        self.logloss_sum += sum_logloss(probs, labels);
        self.prob_sum += probs.iter().map(|&p| p as f64).sum::<f64>();
        self.label_sum += labels.iter().map(|&y| y as f64).sum::<f64>();
        self.pairs
            .extend(probs.iter().zip(labels).map(|(&p, &y)| (p, y >= 0.5)));
    }

    /// Adds everything another evaluator gathered (e.g. from another evaluation thread).
    pub fn merge(&mut self, other: &Evaluator) {
        self.pairs.extend_from_slice(&other.pairs);
        self.logloss_sum += other.logloss_sum;
        self.prob_sum += other.prob_sum;
        self.label_sum += other.label_sum;
    }

    /// Samples pushed so far.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Forgets every sample, keeping the allocation.
    pub fn clear(&mut self) {
        self.pairs.clear();
        self.logloss_sum = 0.0;
        self.prob_sum = 0.0;
        self.label_sum = 0.0;
    }

    /// The metrics over everything pushed. Sorts the stored pairs (`O(n log n)`), hence `&mut`.
    pub fn report(&mut self) -> EvalReport {
        let n = self.pairs.len() as f64;
        EvalReport {
            count: self.pairs.len() as u64,
            auc: auc_in_place(&mut self.pairs),
            logloss: self.logloss_sum / n,
            mean_prediction: self.prob_sum / n,
            positive_rate: self.label_sum / n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn auc_hand_computed() {
        // Perfect and inverted rankings.
        assert_eq!(auc(&[0.1, 0.2, 0.8, 0.9], &[0.0, 0.0, 1.0, 1.0]), Some(1.0));
        assert_eq!(auc(&[0.9, 0.8, 0.2, 0.1], &[0.0, 0.0, 1.0, 1.0]), Some(0.0));
        // sklearn's example: roc_auc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75.
        close(
            auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]).unwrap(),
            0.75,
        );
        // Ties: positives {0.5, 0.7}, negatives {0.5, 0.1, 0.7}. Positive-vs-negative pairs:
        // (0.5 vs 0.5) 0.5, (0.5 vs 0.1) 1, (0.5 vs 0.7) 0, (0.7 vs 0.5) 1, (0.7 vs 0.1) 1,
        // (0.7 vs 0.7) 0.5 -> 4 of 6.
        close(
            auc(&[0.5, 0.7, 0.5, 0.1, 0.7], &[1.0, 1.0, 0.0, 0.0, 0.0]).unwrap(),
            4.0 / 6.0,
        );
    }

    #[test]
    fn auc_all_tied_is_one_half() {
        close(auc(&[0.3; 5], &[1.0, 0.0, 1.0, 0.0, 0.0]).unwrap(), 0.5);
    }

    #[test]
    fn auc_undefined_for_one_class() {
        assert_eq!(auc(&[0.1, 0.9], &[1.0, 1.0]), None);
        assert_eq!(auc(&[0.1, 0.9], &[0.0, 0.0]), None);
        assert_eq!(auc(&[], &[]), None);
    }

    #[test]
    fn auc_matches_pair_counting() {
        // Brute force over all positive/negative pairs, many ties (scores on a coarse grid).
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let scores: Vec<f32> = (0..300).map(|_| (next() % 20) as f32 / 20.0).collect();
        let labels: Vec<f32> = (0..300).map(|_| (next() % 3 == 0) as u8 as f32).collect();
        let (mut won, mut total) = (0.0, 0.0);
        for (i, &si) in scores.iter().enumerate() {
            for (j, &sj) in scores.iter().enumerate() {
                if labels[i] == 1.0 && labels[j] == 0.0 {
                    total += 1.0;
                    won += if si > sj {
                        1.0
                    } else if si == sj {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        close(auc(&scores, &labels).unwrap(), won / total);
    }

    #[test]
    fn logloss_hand_computed() {
        // -(ln 0.8 + ln 0.6) / 2 for p = [0.8, 0.4], y = [1, 0].
        let want = -(0.8f64.ln() + 0.6f64.ln()) / 2.0;
        assert!((logloss(&[0.8, 0.4], &[1.0, 0.0]) - want).abs() < 1e-7);
        // Clamped: a certain, wrong prediction costs -ln(1e-7).
        assert!((logloss(&[0.0], &[1.0]) + LOGLOSS_EPS.ln()).abs() < 1e-9);
        assert!((logloss(&[1.0], &[0.0]) + LOGLOSS_EPS.ln()).abs() < 1e-6);
        assert!(logloss(&[], &[]).is_nan());
    }

    #[test]
    fn evaluator_streams_and_merges() {
        let mut ev = Evaluator::new();
        assert!(ev.is_empty());
        ev.push(&[0.1, 0.4], &[0.0, 0.0]);
        let mut other = Evaluator::new();
        other.push(&[0.35, 0.8], &[1.0, 1.0]);
        ev.merge(&other);
        assert_eq!(ev.len(), 4);
        let r = ev.report();
        assert_eq!(r.count, 4);
        close(r.auc.unwrap(), 0.75);
        close(
            r.logloss,
            logloss(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]),
        );
        assert!((r.mean_prediction - 0.4125).abs() < 1e-7);
        close(r.positive_rate, 0.5);
        assert!((r.calibration().unwrap() - 0.4125 / 0.5).abs() < 1e-7);
        assert!(r.render().contains("AUC 0.7500"), "{}", r.render());
        ev.clear();
        let r = ev.report();
        assert_eq!((r.count, r.auc), (0, None));
        assert!(r.logloss.is_nan());
    }
}
