//! Row-wise top-k sparsification with error feedback, sans-IO: the dense parameter deltas a trainer pushes
//! through the servers' dense table (`trainer::step::dense_sync`, `--dense-push-fraction`).
//!
//! Each step [`RowTopK::sparsify`] adds the residual to the new delta, keeps the `k` rows of largest L2 norm
//! in it, and moves every other row into the residual for the next step. Nothing is lost: the rows sent plus
//! the residual always sum to the deltas given (Stich et al. 2018, "Sparsified SGD with memory"; Lin et al.
//! 2018, "Deep gradient compression"). Rows, not single values, are the unit because the dense table's rows
//! are what travel (one id per row), so an element-wise top-k would pay an id per value.

/// A top-k sparsifier of vectors of `rows x row_dim` values, sending `k` rows per step.
#[derive(Debug, Clone)]
pub struct RowTopK {
    k: usize,
    row_dim: usize,
    /// Updates not sent yet, one value per parameter.
    residual: Vec<f32>,
    /// Scratch: (squared norm, row) of every row.
    norms: Vec<(f32, u32)>,
    /// Which rows the last [`sparsify`](Self::sparsify) kept.
    sent: Vec<bool>,
}

/// A saved residual that does not fit this sparsifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("top-k residual of {saved} values, expected {expected}")]
pub struct ResidualMismatch {
    /// Values in the saved residual.
    pub saved: usize,
    /// Values this sparsifier keeps.
    pub expected: usize,
}

impl RowTopK {
    /// A sparsifier of `rows` rows of `row_dim` values sending `k` rows per step (`k` clamped to `1..=rows`).
    pub fn new(rows: usize, row_dim: usize, k: usize) -> RowTopK {
        RowTopK {
            k: k.clamp(1, rows.max(1)),
            row_dim,
            residual: vec![0.0; rows * row_dim],
            norms: Vec::with_capacity(rows),
            sent: vec![false; rows],
        }
    }

    /// Rows sent per step.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Adds the residual to `delta`, keeps the `k` rows with the largest norms in `delta` (ties to the lower
    /// row, for determinism) and moves the others into the residual (zeroing them in `delta`); returns which
    /// rows are sent. A NaN row counts as largest, so it is sent (and refused by the server) rather than kept.
    ///
    /// # Panics
    /// If `delta.len()` is not `rows x row_dim` of [`RowTopK::new`] (a programming error).
    pub fn sparsify(&mut self, delta: &mut [f32]) -> &[bool] {
        assert_eq!(delta.len(), self.residual.len(), "delta length");
        for (d, r) in delta.iter_mut().zip(&self.residual) {
            *d += r;
        }
        self.norms.clear();
        for (row, v) in delta.chunks_exact(self.row_dim).enumerate() {
            self.norms.push((v.iter().map(|x| x * x).sum(), row as u32));
        }
        let k = self.k.min(self.norms.len());
        if k > 0 {
            self.norms
                .select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        }
        self.sent.fill(false);
        for &(_, row) in &self.norms[..k] {
            self.sent[row as usize] = true;
        }
        for (row, &keep) in self.sent.iter().enumerate() {
            let range = row * self.row_dim..(row + 1) * self.row_dim;
            if keep {
                self.residual[range].fill(0.0);
            } else {
                self.residual[range.clone()].copy_from_slice(&delta[range.clone()]);
                delta[range].fill(0.0);
            }
        }
        &self.sent
    }

    /// What has not been sent yet.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Restores a residual saved from [`residual`](Self::residual) (a resumed run); empty clears it.
    pub fn set_residual(&mut self, residual: &[f32]) -> Result<(), ResidualMismatch> {
        if residual.is_empty() {
            self.residual.fill(0.0);
            return Ok(());
        }
        if residual.len() != self.residual.len() {
            return Err(ResidualMismatch {
                saved: residual.len(),
                expected: self.residual.len(),
            });
        }
        self.residual.copy_from_slice(residual);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_the_largest_rows_and_keeps_the_rest() {
        let mut t = RowTopK::new(3, 2, 1);
        let mut delta = vec![1.0, 0.0, 0.0, 3.0, 0.5, 0.5];
        assert_eq!(t.sparsify(&mut delta), &[false, true, false]);
        assert_eq!(delta, [0.0, 0.0, 0.0, 3.0, 0.0, 0.0]);
        assert_eq!(t.residual(), &[1.0, 0.0, 0.0, 0.0, 0.5, 0.5]);
        // The residual joins the next delta: row 0 (norm 2 after adding) now wins.
        let mut delta = vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(t.sparsify(&mut delta), &[true, false, false]);
        assert_eq!(delta, [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn nothing_is_lost_and_ties_go_to_the_lower_row() {
        let mut t = RowTopK::new(4, 3, 2);
        let mut total_in = [0.0f64; 12];
        let mut total_out = [0.0f64; 12];
        for step in 0..50u64 {
            let mut delta: Vec<f32> = (0..12)
                .map(|i| (base::hash::mix64(step * 12 + i) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            for (a, d) in total_in.iter_mut().zip(&delta) {
                *a += *d as f64;
            }
            assert_eq!(t.sparsify(&mut delta).iter().filter(|&&s| s).count(), 2);
            for (a, d) in total_out.iter_mut().zip(&delta) {
                *a += *d as f64;
            }
        }
        for ((i, o), r) in total_in.iter().zip(&total_out).zip(t.residual()) {
            assert!((i - o - *r as f64).abs() < 1e-4, "{i} = {o} + {r}");
        }
        let mut t = RowTopK::new(3, 1, 1);
        assert_eq!(t.sparsify(&mut [1.0, 1.0, 1.0]), &[true, false, false]);
    }

    #[test]
    fn a_saved_residual_must_fit() {
        let mut t = RowTopK::new(2, 2, 1);
        assert_eq!(
            t.set_residual(&[1.0; 3]),
            Err(ResidualMismatch {
                saved: 3,
                expected: 4
            })
        );
        t.set_residual(&[1.0; 4]).unwrap();
        assert_eq!(t.residual(), &[1.0; 4]);
        t.set_residual(&[]).unwrap();
        assert_eq!(t.residual(), &[0.0; 4]);
    }
}
