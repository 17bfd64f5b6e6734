//! The columnar batch the trainer consumes (DESIGN.md, "Read"): labels `[B]`, dense `[B x 13]` row-major,
//! and per sparse feature its ids (one column per feature, so planning can dedup a table's ids in one
//! slice), with per-row offsets for multi-hot features (docs/model-spec.md).

use super::ids::feature_id;
use super::layout::FeatureLayout;
use super::parse::{Row, NUM_DENSE, NUM_SPARSE};

/// A batch of parsed lines in columnar form, for a [`FeatureLayout`] (the default one unless built with
/// [`Batch::with_layout`]).
///
/// Invariant: `labels.len() == len`, `dense.len() == len * NUM_DENSE`, `sparse.len() == offsets.len()` is
/// the layout's feature count, and for each feature `f` either `offsets[f]` is empty and
/// `sparse[f].len() == len` (one-hot: one id per row), or `offsets[f]` has `len + 1` entries, starts at 0,
/// never decreases and ends at `sparse[f].len()` (multi-hot: row `i`'s bag is
/// `sparse[f][offsets[f][i]..offsets[f][i + 1]]`, maybe empty). The methods keep it.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Number of rows.
    pub len: usize,
    /// Click labels, 0.0 or 1.0: `[len]`.
    pub labels: Vec<f32>,
    /// `ln(1 + max(x, 0))` of I1..I13: `[len x 13]`, row-major.
    pub dense: Vec<f32>,
    /// Per feature (layout order) its ids from [`feature_id`]: `[features][len]` for one-hot features,
    /// the concatenated bags for multi-hot ones.
    pub sparse: Vec<Vec<u64>>,
    /// Per feature: empty for a one-hot feature, the `len + 1` bag offsets into `sparse[f]` for a
    /// multi-hot one.
    pub offsets: Vec<Vec<u32>>,
    /// Tokens dropped from this batch's rows because a field held more than its feature's `tokens`.
    pub truncated: u64,
}

impl Batch {
    /// An empty batch of the default layout (26 one-hot features) with room for `n` rows.
    pub fn with_capacity(n: usize) -> Self {
        Batch {
            len: 0,
            labels: Vec::with_capacity(n),
            dense: Vec::with_capacity(n * NUM_DENSE),
            sparse: (0..NUM_SPARSE).map(|_| Vec::with_capacity(n)).collect(),
            offsets: vec![Vec::new(); NUM_SPARSE],
            truncated: 0,
        }
    }

    /// An empty batch of `layout`'s features with room for `n` rows (and `n * tokens` ids of a multi-hot
    /// feature).
    pub fn with_layout(n: usize, layout: &FeatureLayout) -> Self {
        let features = &layout.features;
        Batch {
            len: 0,
            labels: Vec::with_capacity(n),
            dense: Vec::with_capacity(n * NUM_DENSE),
            sparse: features
                .iter()
                .map(|f| Vec::with_capacity(n.saturating_mul(f.tokens)))
                .collect(),
            offsets: features
                .iter()
                .map(|f| {
                    if f.tokens > 1 {
                        let mut offsets = Vec::with_capacity(n + 1);
                        offsets.push(0);
                        offsets
                    } else {
                        Vec::new()
                    }
                })
                .collect(),
            truncated: 0,
        }
    }

    /// Appends every row of `other`, a batch of the same layout (bag offsets shifted): micro-batching
    /// several requests' rows into one prediction.
    ///
    /// # Panics
    /// If `other` has another number of features or other one-hot/multi-hot features.
    pub fn append(&mut self, other: &Batch) {
        assert_eq!(
            self.sparse.len(),
            other.sparse.len(),
            "batch of another layout"
        );
        self.len += other.len;
        self.truncated += other.truncated;
        self.labels.extend_from_slice(&other.labels);
        self.dense.extend_from_slice(&other.dense);
        let columns = self.sparse.iter_mut().zip(&mut self.offsets);
        for ((ids, offsets), (oids, ooffsets)) in
            columns.zip(other.sparse.iter().zip(&other.offsets))
        {
            assert_eq!(
                offsets.is_empty(),
                ooffsets.is_empty(),
                "batch of another layout"
            );
            let base = ids.len() as u32;
            ids.extend_from_slice(oids);
            offsets.extend(ooffsets.iter().skip(1).map(|&o| o + base));
        }
    }

    /// Removes all rows, keeping the allocations (and the layout).
    pub fn clear(&mut self) {
        self.len = 0;
        self.truncated = 0;
        self.labels.clear();
        self.dense.clear();
        self.sparse.iter_mut().for_each(Vec::clear);
        self.offsets.iter_mut().for_each(|o| o.truncate(1));
    }

    /// Appends one parsed row in the default layout, hashing its tokens into feature ids (feature `j` is
    /// column C(j+1)); a field's tokens past the first are dropped and counted in `truncated`.
    ///
    /// The batch must be of the default layout ([`Batch::with_capacity`]).
    #[inline]
    pub fn push_row(&mut self, row: &Row) {
        debug_assert!(self.sparse.len() == NUM_SPARSE && self.offsets.iter().all(Vec::is_empty));
        self.len += 1;
        self.labels.push(row.label);
        self.dense.extend_from_slice(&row.dense);
        for (j, (column, &token)) in self.sparse.iter_mut().zip(&row.sparse).enumerate() {
            column.push(feature_id(j, token));
        }
        self.truncated += u64::from(row.extra_tokens());
    }

    /// Appends one parsed row in `layout` (the layout the batch was made with): per feature its column's
    /// tokens, at most `tokens` of them (the rest counted in `truncated`), each capped to its `hash_size`
    /// and keyed by its `table`. A one-hot feature keeps the field's first token, or the missing token of
    /// an empty field; a multi-hot feature's empty field is an empty bag.
    ///
    /// # Panics
    /// If the batch was made for a layout with another number of features.
    #[inline]
    pub fn push_row_in(&mut self, row: &Row, layout: &FeatureLayout) {
        assert_eq!(
            self.sparse.len(),
            layout.features.len(),
            "batch of another layout"
        );
        self.len += 1;
        self.labels.push(row.label);
        self.dense.extend_from_slice(&row.dense);
        let extra = row.extra_tokens() != 0;
        let mut truncated = 0;
        let columns = self.sparse.iter_mut().zip(&mut self.offsets);
        for (input, (ids, offsets)) in layout.features.iter().zip(columns) {
            if input.tokens == 1 {
                ids.push(input.id(row.sparse[input.column]));
                if extra {
                    truncated += row.tokens(input.column).len().saturating_sub(1);
                }
            } else {
                let tokens = row.tokens(input.column);
                let kept = &tokens[..tokens.len().min(input.tokens)];
                ids.extend(kept.iter().map(|&t| input.id(Some(t))));
                offsets.push(ids.len() as u32);
                truncated += tokens.len() - kept.len();
            }
        }
        self.truncated += truncated as u64;
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether feature `f` has bags (offsets) rather than one id per row.
    #[inline]
    pub fn is_multi_hot(&self, f: usize) -> bool {
        !self.offsets[f].is_empty()
    }

    /// The ids of feature `f` in row `i`: one id for a one-hot feature, the bag for a multi-hot one.
    ///
    /// # Panics
    /// If `f` or `i` is out of range.
    #[inline]
    pub fn bag(&self, f: usize, i: usize) -> &[u64] {
        let offsets = &self.offsets[f];
        if offsets.is_empty() {
            std::slice::from_ref(&self.sparse[f][i])
        } else {
            &self.sparse[f][offsets[i] as usize..offsets[i + 1] as usize]
        }
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

    use crate::layout::FeatureInput;
    use crate::parse::parse_line;

    /// A line whose C1 is `c1`, C2 `c2`, C3 `c3` and the rest empty.
    fn parsed(c1: &str, c2: &str, c3: &str) -> Row {
        let mut row = Row::default();
        let line = format!("1{}\t{c1}\t{c2}\t{c3}", "\t".repeat(NUM_DENSE));
        parse_line(line.as_bytes(), &mut row).unwrap();
        row
    }

    fn layout() -> FeatureLayout {
        FeatureLayout {
            features: vec![
                // C3, multi-hot (3 tokens), table 0, capped at 16.
                FeatureInput {
                    ids: Default::default(),
                    column: 2,
                    table: 0,
                    hash_size: 16,
                    tokens: 3,
                },
                // C1, one-hot, sharing table 0.
                FeatureInput {
                    ids: Default::default(),
                    column: 0,
                    table: 0,
                    hash_size: 0,
                    tokens: 1,
                },
                // C2, multi-hot, table 7.
                FeatureInput {
                    ids: Default::default(),
                    column: 1,
                    table: 7,
                    hash_size: 0,
                    tokens: 2,
                },
            ],
        }
    }

    #[test]
    fn default_layout_is_with_capacity() {
        let layout = FeatureLayout::default();
        assert_eq!(Batch::with_layout(5, &layout), Batch::with_capacity(5));
        let row = parsed("1", "", "a|b");
        let (mut a, mut b) = (Batch::with_capacity(1), Batch::with_layout(1, &layout));
        a.push_row(&row);
        b.push_row_in(&row, &layout);
        assert_eq!(a, b);
        assert_eq!(a.truncated, 1, "C3's second token");
        assert_eq!(a.sparse[2], [feature_id(2, Some(0xa))]);
        assert_eq!(a.bag(2, 0), [feature_id(2, Some(0xa))]);
    }

    #[test]
    fn append_is_pushing_the_rows_in_order() {
        let layout = layout();
        let rows = [
            parsed("11", "5|6|7", "12|13|14|15"),
            parsed("", "", "22"),
            parsed("a|b", "8", ""),
        ];
        let mut whole = Batch::with_layout(3, &layout);
        rows.iter().for_each(|r| whole.push_row_in(r, &layout));
        let (mut a, mut b) = (
            Batch::with_layout(1, &layout),
            Batch::with_layout(2, &layout),
        );
        a.push_row_in(&rows[0], &layout);
        rows[1..].iter().for_each(|r| b.push_row_in(r, &layout));
        a.append(&b);
        assert_eq!(a, whole);
        a.append(&Batch::with_layout(0, &layout));
        assert_eq!(a, whole);
    }

    #[test]
    fn layout_bags_salts_caps_and_truncation() {
        let layout = layout();
        let mut batch = Batch::with_layout(4, &layout);
        assert_eq!(batch.offsets, [vec![0], vec![], vec![0]]);
        batch.push_row_in(&parsed("11", "5|6|7", "12|13|14|15"), &layout);
        batch.push_row_in(&parsed("", "", "22"), &layout);
        batch.push_row_in(&parsed("a|b", "8", ""), &layout);
        assert_eq!(batch.len, 3);
        let id = |table: usize, t: u32| feature_id(table, Some(t));
        // C3 capped to % 16, truncated to 3 tokens; an empty field is an empty bag.
        assert_eq!(batch.offsets[0], [0, 3, 4, 4]);
        assert_eq!(batch.bag(0, 0), [id(0, 2), id(0, 3), id(0, 4)]);
        assert_eq!(batch.bag(0, 1), [id(0, 0x22 % 16)]);
        assert!(batch.bag(0, 2).is_empty());
        // C1 one-hot in the shared table 0: the same token gets C3's id; empty is the missing id.
        assert_eq!(
            batch.sparse[1],
            [id(0, 0x11), feature_id(0, None), id(0, 0xa)]
        );
        let mut c3_a = Batch::with_layout(1, &layout);
        c3_a.push_row_in(&parsed("", "", "a"), &layout);
        assert_eq!(c3_a.bag(0, 0), batch.bag(1, 2), "C1 and C3 share table 0");
        assert!(batch.offsets[1].is_empty());
        assert_eq!(batch.bag(1, 1), [feature_id(0, None)]);
        // C2 in table 7, 2 tokens.
        assert_eq!(batch.offsets[2], [0, 2, 2, 3]);
        assert_eq!(batch.bag(2, 0), [id(7, 5), id(7, 6)]);
        assert_eq!(batch.bag(2, 2), [id(7, 8)]);
        // Dropped: C3's 4th token, C2's 3rd, C1's second.
        assert_eq!(batch.truncated, 3);
        assert!(batch.is_multi_hot(0) && !batch.is_multi_hot(1));
        batch.clear();
        assert_eq!(batch, Batch::with_layout(0, &layout));
    }

    #[test]
    #[should_panic(expected = "batch of another layout")]
    fn pushing_in_another_layout_panics() {
        Batch::with_capacity(1).push_row_in(&Row::default(), &layout());
    }
}
