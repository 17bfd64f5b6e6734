//! What an optimizer step may leave in a row (issue 40): never a non-finite weight. Two pushes of `3e38` to
//! an SGD table once left a row at `-inf`, which pulls then served to every trainer and to serving.
//!
//! Sans-IO: [`WeightGuard::check`] compares a row after its update with its copy from before, and either keeps
//! the update, undoes it ([`WeightGuard::Refuse`]) or bounds the weights ([`WeightGuard::Clamp`]).
//! [`crate::Table::apply_at`] counts each outcome in [`crate::table::ApplyStats`].

use serde::{Deserialize, Serialize};

/// What to do with an update that would leave a non-finite value in a row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum WeightGuard {
    /// The update of that row is undone (weights and optimizer state as before it); the row is counted as
    /// refused. The default: a diverging trainer cannot poison the row, and the metric tells.
    #[default]
    Refuse,
    /// Weights are kept within `±max_abs` (an infinite weight becomes `±max_abs`, a NaN weight keeps its
    /// value from before the update); the row is counted as clamped. Non-finite optimizer state is refused
    /// as with [`WeightGuard::Refuse`] (no clamp can repair a sum of squares).
    Clamp {
        /// Largest magnitude a weight may have; finite and > 0.
        max_abs: f32,
    },
}

/// What [`WeightGuard::check`] did to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarded {
    /// The update stands as computed.
    Kept,
    /// The update was undone.
    Refused,
    /// Some weights were bounded.
    Clamped,
}

impl WeightGuard {
    /// Checks `row` (`dim` weights then optimizer state) after an update whose row before was `before`
    /// (same length), repairing it by the guard's rule.
    pub fn check(self, before: &[f32], row: &mut [f32], dim: usize) -> Guarded {
        debug_assert_eq!(before.len(), row.len());
        let (weights, state) = row.split_at_mut(dim);
        let state_ok = all_finite(state);
        match self {
            WeightGuard::Refuse => {
                if state_ok && all_finite(weights) {
                    Guarded::Kept
                } else {
                    row.copy_from_slice(before);
                    Guarded::Refused
                }
            }
            WeightGuard::Clamp { max_abs } => {
                if !state_ok {
                    row.copy_from_slice(before);
                    return Guarded::Refused;
                }
                let mut clamped = false;
                for (w, &old) in weights.iter_mut().zip(before) {
                    if w.is_nan() {
                        *w = old;
                        clamped = true;
                    } else if w.abs() > max_abs {
                        *w = w.clamp(-max_abs, max_abs);
                        clamped = true;
                    }
                }
                if clamped {
                    Guarded::Clamped
                } else {
                    Guarded::Kept
                }
            }
        }
    }

    /// Checks the guard's own settings: a clamp bound must be finite and > 0.
    pub fn validate(self) -> Result<WeightGuard, String> {
        match self {
            WeightGuard::Clamp { max_abs } if !(max_abs.is_finite() && max_abs > 0.0) => Err(
                format!("weight clamp bound {max_abs}, expected a finite number > 0"),
            ),
            g => Ok(g),
        }
    }
}

/// Whether every value is finite. No early exit: the loop compiles to vector compares (a row is tens to
/// hundreds of values, and almost always finite), where `iter().all` tested one value per branch.
#[inline]
pub fn all_finite(values: &[f32]) -> bool {
    values.iter().fold(true, |ok, v| ok & v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuse_undoes_an_update_to_infinity() {
        let before = [3e38f32, 1.0, 0.5];
        let mut row = [f32::INFINITY, 2.0, 0.5];
        assert_eq!(
            WeightGuard::Refuse.check(&before, &mut row, 2),
            Guarded::Refused
        );
        assert_eq!(row, before);
        let mut fine = [1.0f32, 2.0, 0.6];
        assert_eq!(
            WeightGuard::Refuse.check(&before, &mut fine, 2),
            Guarded::Kept
        );
        assert_eq!(fine, [1.0, 2.0, 0.6]);
        // Non-finite state (an Adagrad sum of squares overflowing) is refused too.
        let mut state = [1.0f32, 2.0, f32::INFINITY];
        assert_eq!(
            WeightGuard::Refuse.check(&before, &mut state, 2),
            Guarded::Refused
        );
        assert_eq!(state, before);
    }

    #[test]
    fn clamp_bounds_weights_and_keeps_the_old_value_of_nan() {
        let g = WeightGuard::Clamp { max_abs: 10.0 };
        let before = [1.0f32, 2.0, 3.0, 0.0];
        let mut row = [f32::NEG_INFINITY, f32::NAN, 4.0, 0.0];
        assert_eq!(g.check(&before, &mut row, 3), Guarded::Clamped);
        assert_eq!(row, [-10.0, 2.0, 4.0, 0.0]);
        let mut bad_state = [1.0f32, 2.0, 3.0, f32::NAN];
        assert_eq!(g.check(&before, &mut bad_state, 3), Guarded::Refused);
        assert_eq!(bad_state, before);
        assert!(WeightGuard::Clamp { max_abs: 0.0 }
            .validate()
            .unwrap_err()
            .contains("bound 0"));
        assert!(WeightGuard::Clamp {
            max_abs: f32::INFINITY
        }
        .validate()
        .is_err());
    }
}
