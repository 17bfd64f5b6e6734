//! Exact ROC AUC, used to check the planted teacher (the trainer has its own streaming evaluator).

/// Exact area under the ROC curve of `scores` against `labels` (the Mann-Whitney statistic, ties counted as
/// one half). `None` if the slices differ in length or either class is absent.
pub fn auc(scores: &[f64], labels: &[bool]) -> Option<f64> {
    if scores.len() != labels.len() {
        return None;
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_unstable_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let positives = labels.iter().filter(|&&l| l).count() as f64;
    let negatives = labels.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return None;
    }
    // Sum of the (mid-)ranks of the positives, 1-based.
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let mid_rank = (i + j) as f64 / 2.0 + 1.0;
        let tied_positives = order[i..=j].iter().filter(|&&k| labels[k]).count() as f64;
        rank_sum += mid_rank * tied_positives;
        i = j + 1;
    }
    Some((rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        assert_eq!(
            auc(&[0.1, 0.2, 0.3, 0.4], &[false, false, true, true]),
            Some(1.0)
        );
        assert_eq!(
            auc(&[0.4, 0.3, 0.2, 0.1], &[false, false, true, true]),
            Some(0.0)
        );
        assert_eq!(auc(&[0.5, 0.5, 0.5], &[true, false, false]), Some(0.5));
        // Pairs (pos, neg): (0.35 > 0.1), (0.35 < 0.4), (0.8 > 0.1), (0.8 > 0.4): 3 of 4.
        assert_eq!(
            auc(&[0.1, 0.4, 0.35, 0.8], &[false, false, true, true]),
            Some(0.75)
        );
        assert_eq!(auc(&[0.1], &[true]), None);
        assert_eq!(auc(&[0.1, 0.2], &[true]), None);
    }
}
