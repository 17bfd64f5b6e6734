//! Sigmoid + binary cross-entropy on logits, numerically stable for any logit.
//!
//! For a logit `x` and label `y ∈ [0, 1]`: `BCE = max(x, 0) - x y + ln(1 + e^{-|x|})`, which equals
//! `-y ln σ(x) - (1 - y) ln(1 - σ(x))` without ever forming `ln 0` or overflowing `e^x`
//! (PyTorch's `BCEWithLogitsLoss`). Its derivative is `σ(x) - y`.

/// Logistic sigmoid `1 / (1 + e^{-x})`, stable for large `|x|`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Binary cross-entropy of one logit against a label, in f64 for accumulation.
#[inline]
pub fn bce_with_logit(x: f32, y: f32) -> f64 {
    let (x, y) = (x as f64, y as f64);
    x.max(0.0) - x * y + (-x.abs()).exp().ln_1p()
}

/// Mean BCE over the batch. Writes `σ(logit)` into `probs` and `d mean / d logit = (σ - y) / batch` into
/// `grad`, and returns the mean loss.
///
/// # Panics
/// If the slices differ in length.
pub fn bce_forward_backward(
    logits: &[f32],
    labels: &[f32],
    probs: &mut [f32],
    grad: &mut [f32],
) -> f32 {
    assert_eq!(logits.len(), labels.len(), "bce: labels");
    assert_eq!(logits.len(), probs.len(), "bce: probs");
    assert_eq!(logits.len(), grad.len(), "bce: grad");
    let scale = 1.0 / logits.len().max(1) as f32;
    (bce_sum(logits, labels, probs, grad, scale) * scale as f64) as f32
}

/// BCE summed over a slice of a batch: writes `σ(logit)` into `probs` and `(σ - y) · scale` into `grad`, and
/// returns the (unscaled) sum of the losses. With `scale = 1 / batch` over the slices of a batch, the
/// gradients are those of the batch's mean loss.
///
/// # Panics
/// If the slices differ in length.
pub(crate) fn bce_sum(
    logits: &[f32],
    labels: &[f32],
    probs: &mut [f32],
    grad: &mut [f32],
    scale: f32,
) -> f64 {
    assert_eq!(logits.len(), labels.len(), "bce: labels");
    assert_eq!(logits.len(), probs.len(), "bce: probs");
    assert_eq!(logits.len(), grad.len(), "bce: grad");
    let mut total = 0.0f64;
    for (((&x, &y), p), g) in logits
        .iter()
        .zip(labels)
        .zip(probs.iter_mut())
        .zip(grad.iter_mut())
    {
        *p = sigmoid(x);
        *g = (*p - y) * scale;
        total += bce_with_logit(x, y);
    }
    total
}

/// The shift `d` of every logit that makes the mean prediction `mean(sigmoid(logit_i + d))` equal `rate`
/// (clamped to [1e-4, 1 - 1e-4]), from the predictions `probs` (Newton's method on the logits; 0 for no
/// predictions). The trainer's initial output bias: a random network starts far from the data's positive rate,
/// and the dense optimizer's bounded steps take hundreds of steps to move the mean prediction there.
pub fn logit_shift_to_rate(probs: &[f32], rate: f32) -> f32 {
    if probs.is_empty() {
        return 0.0;
    }
    let rate = rate.clamp(1e-4, 1.0 - 1e-4) as f64;
    let logits: Vec<f64> = probs
        .iter()
        .map(|&p| {
            let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
            (p / (1.0 - p)).ln()
        })
        .collect();
    let mut d = 0.0f64;
    for _ in 0..50 {
        let (mut f, mut df) = (0.0, 0.0);
        for z in &logits {
            let s = 1.0 / (1.0 + (-(z + d)).exp());
            f += s;
            df += s * (1.0 - s);
        }
        let n = logits.len() as f64;
        let (f, df) = (f / n - rate, df / n);
        if f.abs() < 1e-7 || df < 1e-12 {
            break;
        }
        d = (d - f / df).clamp(-30.0, 30.0);
    }
    d as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_shift_reaches_the_rate() {
        let probs = [0.9f32, 0.7, 0.6, 0.95, 0.5];
        for rate in [0.03f32, 0.25, 0.5, 0.9] {
            let d = logit_shift_to_rate(&probs, rate);
            let mean: f64 = probs
                .iter()
                .map(|&p| {
                    let z = (p as f64 / (1.0 - p as f64)).ln() + d as f64;
                    1.0 / (1.0 + (-z).exp())
                })
                .sum::<f64>()
                / probs.len() as f64;
            assert!(
                (mean - rate as f64).abs() < 1e-4,
                "rate {rate}: mean {mean}"
            );
        }
        assert_eq!(logit_shift_to_rate(&[], 0.3), 0.0);
    }

    #[test]
    fn hand_computed_values() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(2.0) - 0.880_797_1).abs() < 1e-6);
        assert!((sigmoid(-2.0) - 0.119_202_92).abs() < 1e-6);
        // -ln(0.5)
        assert!((bce_with_logit(0.0, 1.0) - std::f64::consts::LN_2).abs() < 1e-12);
        // y = 1, x = 2: -ln σ(2) = ln(1 + e^-2) = 0.126928011...
        assert!((bce_with_logit(2.0, 1.0) - 0.126_928_011_042_973).abs() < 1e-9);
        // y = 0, x = 2: -ln(1 - σ(2)) = 2 + ln(1 + e^-2)
        assert!((bce_with_logit(2.0, 0.0) - 2.126_928_011_042_973).abs() < 1e-9);
    }

    #[test]
    fn extreme_logits_stay_finite() {
        assert!((0.0..1e-30).contains(&sigmoid(-200.0)));
        assert_eq!(sigmoid(200.0), 1.0);
        assert!((bce_with_logit(100.0, 0.0) - 100.0).abs() < 1e-9);
        assert!(bce_with_logit(100.0, 1.0).abs() < 1e-30);
        assert!((bce_with_logit(-100.0, 1.0) - 100.0).abs() < 1e-9);
    }

    #[test]
    fn mean_loss_and_gradient() {
        let logits = [0.0, 2.0, -1.0, 3.0];
        let labels = [1.0, 0.0, 0.0, 1.0];
        let mut probs = [0.0; 4];
        let mut grad = [0.0; 4];
        let loss = bce_forward_backward(&logits, &labels, &mut probs, &mut grad);
        let want: f64 = logits
            .iter()
            .zip(&labels)
            .map(|(&x, &y)| bce_with_logit(x, y))
            .sum::<f64>()
            / 4.0;
        assert!((loss as f64 - want).abs() < 1e-6);
        // Finite differences of the mean loss.
        for i in 0..4 {
            let eps = 1e-3f64;
            let f = |d: f64| {
                let x = logits[i] as f64 + d;
                let y = labels[i] as f64;
                (x.max(0.0) - x * y + (-x.abs()).exp().ln_1p()) / 4.0
            };
            let fd = (f(eps) - f(-eps)) / (2.0 * eps);
            assert!(
                (grad[i] as f64 - fd).abs() < 1e-5,
                "grad[{i}] {} vs {fd}",
                grad[i]
            );
            assert!((probs[i] - sigmoid(logits[i])).abs() == 0.0);
        }
    }
}
