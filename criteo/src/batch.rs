//! The columnar batch the trainer consumes (DESIGN.md, "Read"): labels `[B]`, dense `[B x 13]` row-major,
//! sparse ids `[26][B]` (one column per embedding table, so planning can dedup a table's ids in one slice).

use super::ids::feature_id;
use super::parse::{Row, NUM_DENSE, NUM_SPARSE};

/// A batch of parsed lines in columnar form.
///
/// Invariant: `labels.len() == len`, `dense.len() == len * NUM_DENSE`, `sparse.len() == NUM_SPARSE` and
/// every `sparse[j].len() == len`. [`Batch::push_row`] and [`Batch::clear`] keep it.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Number of rows.
    pub len: usize,
    /// Click labels, 0.0 or 1.0: `[len]`.
    pub labels: Vec<f32>,
    /// `ln(1 + max(x, 0))` of I1..I13: `[len x 13]`, row-major.
    pub dense: Vec<f32>,
    /// Feature ids from [`feature_id`] of C1..C26: `[26][len]`.
    pub sparse: Vec<Vec<u64>>,
}

impl Batch {
    /// An empty batch with room for `n` rows.
    pub fn with_capacity(n: usize) -> Self {
        Batch {
            len: 0,
            labels: Vec::with_capacity(n),
            dense: Vec::with_capacity(n * NUM_DENSE),
            sparse: (0..NUM_SPARSE).map(|_| Vec::with_capacity(n)).collect(),
        }
    }

    /// Removes all rows, keeping the allocations.
    pub fn clear(&mut self) {
        self.len = 0;
        self.labels.clear();
        self.dense.clear();
        self.sparse.iter_mut().for_each(Vec::clear);
    }

    /// Appends one parsed row, hashing its tokens into feature ids (feature `j` is column C(j+1)).
    pub fn push_row(&mut self, row: &Row) {
        self.len += 1;
        self.labels.push(row.label);
        self.dense.extend_from_slice(&row.dense);
        for (j, (column, &token)) in self.sparse.iter_mut().zip(&row.sparse).enumerate() {
            column.push(feature_id(j, token));
        }
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The dense features of row `i`.
    ///
    /// # Panics
    /// If `i >= len`.
    pub fn dense_row(&self, i: usize) -> &[f32] {
        &self.dense[i * NUM_DENSE..(i + 1) * NUM_DENSE]
    }
}

impl Default for Batch {
    fn default() -> Self {
        Batch::with_capacity(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: f32, k: u32) -> Row {
        let mut row = Row {
            label,
            ..Row::default()
        };
        row.dense[0] = k as f32;
        row.dense[12] = -(k as f32);
        row.sparse[3] = Some(k);
        row
    }

    #[test]
    fn push_row_fills_every_column() {
        let mut batch = Batch::with_capacity(2);
        batch.push_row(&row(1.0, 7));
        batch.push_row(&row(0.0, 9));
        assert_eq!(batch.len, 2);
        assert_eq!(batch.labels, [1.0, 0.0]);
        assert_eq!(batch.dense.len(), 2 * NUM_DENSE);
        assert_eq!(batch.dense_row(1)[0], 9.0);
        assert_eq!(batch.dense_row(1)[12], -9.0);
        assert_eq!(batch.sparse.len(), NUM_SPARSE);
        assert_eq!(
            batch.sparse[3],
            [feature_id(3, Some(7)), feature_id(3, Some(9))]
        );
        assert_eq!(batch.sparse[0], [feature_id(0, None); 2]);
        assert!(batch.sparse.iter().all(|c| c.len() == 2));
    }

    #[test]
    fn clear_keeps_capacity() {
        let mut batch = Batch::with_capacity(4);
        batch.push_row(&row(1.0, 1));
        batch.clear();
        assert!(batch.is_empty());
        assert!(batch.labels.is_empty() && batch.dense.is_empty());
        assert!(batch
            .sparse
            .iter()
            .all(|c| c.is_empty() && c.capacity() >= 4));
        assert_eq!(batch, Batch::default());
    }
}
