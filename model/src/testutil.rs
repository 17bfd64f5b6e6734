//! Test helpers: random inputs and central finite-difference gradient checks.

use super::rng::Rng;

/// `n` uniform values in `[-scale, scale)`.
pub(crate) fn rand_vec(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.uniform() * 2.0 - 1.0) as f32) * scale)
        .collect()
}

/// Checks `analytic[i]` against the central difference `(f(i, +eps) - f(i, -eps)) / 2 eps` for every `i`,
/// where `f(i, delta)` evaluates the loss with element `i` perturbed by `delta` (and restores it).
/// Passes when `|a - fd| <= rel * max(|a|, |fd|) + abs`.
///
/// A perturbation that moves some ReLU across its kink makes the central difference meaningless; such
/// elements are recognized by their one-sided slopes disagreeing, and then `analytic` must match the slope
/// on the side without the kink.
pub(crate) fn check_grad(
    name: &str,
    analytic: &[f32],
    eps: f32,
    rel: f64,
    abs: f64,
    mut f: impl FnMut(usize, f32) -> f64,
) {
    for (i, &a) in analytic.iter().enumerate() {
        let (up, mid, down) = (f(i, eps), f(i, 0.0), f(i, -eps));
        let h = eps as f64;
        let fd = (up - down) / (2.0 * h);
        let a = a as f64;
        let tol = rel * a.abs().max(fd.abs()) + abs;
        let (right, left) = ((up - mid) / h, (mid - down) / h);
        let ok = if (right - left).abs() > tol {
            (a - right).abs() <= tol || (a - left).abs() <= tol
        } else {
            (a - fd).abs() <= tol
        };
        assert!(
            ok,
            "{name}[{i}]: analytic {a}, finite difference {fd} (right {right}, left {left})"
        );
    }
}

/// `sum(x * r)` in f64: a scalar loss whose gradient with respect to `x` is `r`.
pub(crate) fn dot64(x: &[f32], r: &[f32]) -> f64 {
    x.iter().zip(r).map(|(&x, &r)| x as f64 * r as f64).sum()
}
