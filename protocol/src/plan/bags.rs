//! [`SparseLayout`]: which embedding table each input feature reads, the tables' row dimensions and how a
//! feature's bag of tokens pools (docs/model-spec.md); and the two per-sample loops of a plan that depend on
//! it: gathering pooled rows into the model's `[batch x width]` input, and spreading the model's gradients
//! back onto the unique ids.
//!
//! A one-hot feature has exactly one id per sample; a multi-hot feature has a bag per sample, given by
//! offsets (`bag i = ids[offsets[i]..offsets[i + 1]]`). Sum pooling adds the bag's rows, mean pooling divides
//! by the bag's length; an empty bag pools to zeros and gets no gradient. Features that share a table share
//! its unique ids: the plan deduplicates over all of them, so one row is pulled and pushed once per batch.

/// One input feature of a [`SparseLayout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureShape {
    /// The plan table it reads (an index into [`SparseLayout::dims`]; also the table id on the wire).
    pub table: usize,
    /// Mean pooling (else sum).
    pub mean: bool,
}

/// The sparse side of a model as a plan sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SparseLayout {
    /// Row dimension of each table.
    pub dims: Vec<usize>,
    /// The input features, in the order of the batch's sparse columns and of the model's input.
    pub features: Vec<FeatureShape>,
}

impl SparseLayout {
    /// `features` features, feature `f` reading its own table `f` of dimension `dim`, sum pooling: today's
    /// one-hot DLRM.
    pub fn uniform(features: usize, dim: usize) -> SparseLayout {
        SparseLayout {
            dims: vec![dim; features],
            features: (0..features)
                .map(|table| FeatureShape { table, mean: false })
                .collect(),
        }
    }

    /// Number of tables.
    pub fn tables(&self) -> usize {
        self.dims.len()
    }

    /// The pooled width of feature `f`: its table's dimension.
    pub fn feature_dim(&self, f: usize) -> usize {
        self.dims[self.features[f].table]
    }

    /// Width of one sample's pooled embeddings: the sum of the features' dimensions.
    pub fn width(&self) -> usize {
        (0..self.features.len()).map(|f| self.feature_dim(f)).sum()
    }
}

/// What a plan derives from its layout once: per feature its offset in a sample's input row, per table
/// its features.
#[derive(Debug, Clone, Default)]
pub(super) struct Derived {
    pub layout: SparseLayout,
    /// `offset[f]`: where feature `f` starts in a sample's `[width]` input row.
    pub offset: Vec<usize>,
    /// `of_table[t]`: the features reading table `t`, in feature order.
    pub of_table: Vec<Vec<usize>>,
    pub width: usize,
}

impl Derived {
    /// Recomputes everything if `layout` differs from the one held.
    pub fn set(&mut self, layout: &SparseLayout) {
        if self.layout == *layout && self.of_table.len() == layout.tables() {
            return;
        }
        self.layout = layout.clone();
        self.offset.clear();
        let mut at = 0;
        for f in 0..layout.features.len() {
            self.offset.push(at);
            at += layout.feature_dim(f);
        }
        self.width = at;
        self.of_table = vec![Vec::new(); layout.tables()];
        for (f, shape) in layout.features.iter().enumerate() {
            self.of_table[shape.table].push(f);
        }
    }
}

/// The ids one sample contributes to a feature: positions `from..to` in the feature's id list.
#[inline(always)]
pub(super) fn bag(offsets: &[u32], i: usize) -> (usize, usize) {
    if offsets.is_empty() {
        (i, i + 1)
    } else {
        (offsets[i] as usize, offsets[i + 1] as usize)
    }
}

/// `dst = pool(rows of the bag)`: the bag's positions `inverse[from..to]` in `rows` (`[unique x dim]`).
#[inline(always)]
pub(super) fn pool_into(
    dst: &mut [f32],
    rows: &[f32],
    inverse: &[u32],
    (from, to): (usize, usize),
    mean: bool,
) {
    let dim = dst.len();
    if to == from + 1 {
        prefetch_ahead(rows, inverse, from, dim);
        let u = inverse[from] as usize;
        for_row(dst, &rows[u * dim..(u + 1) * dim], |d, s| *d = s);
        return;
    }
    dst.fill(0.0);
    for (k, &u) in inverse[from..to].iter().enumerate() {
        prefetch_ahead(rows, inverse, from + k, dim);
        let u = u as usize;
        for_row(dst, &rows[u * dim..(u + 1) * dim], |d, s| *d += s);
    }
    if mean && to > from + 1 {
        let inv = 1.0 / (to - from) as f32;
        dst.iter_mut().for_each(|d| *d *= inv);
    }
}

/// `acc[u] += g * scale` for every position `u` of the bag (`scale / len` with mean pooling).
#[inline(always)]
pub(super) fn spread(
    acc: &mut [f32],
    g: &[f32],
    inverse: &[u32],
    (from, to): (usize, usize),
    mean: bool,
    scale: f32,
) {
    let dim = g.len();
    let s = if mean && to > from + 1 {
        scale / (to - from) as f32
    } else {
        scale
    };
    for (k, &u) in inverse[from..to].iter().enumerate() {
        prefetch_ahead(acc, inverse, from + k, dim);
        let u = u as usize;
        for_row(&mut acc[u * dim..(u + 1) * dim], g, |a, g| *a += g * s);
    }
}

/// Ids ahead of the one being pooled or spread whose row [`prefetch_ahead`] asks for.
const AHEAD: usize = 8;

/// Prefetches the row of the id [`AHEAD`] places after `inverse[k]` (the same bag, or the feature's next
/// bags: a feature's ids are laid out sample after sample), when rows are wider than a cache line: the
/// unique rows of a DLRM-v2 batch (325k x 512 bytes) are far larger than the caches and read in an order
/// the hardware prefetchers cannot guess.
#[inline(always)]
fn prefetch_ahead(rows: &[f32], inverse: &[u32], k: usize, dim: usize) {
    if dim >= 32 {
        if let Some(&u) = inverse.get(k + AHEAD) {
            let u = u as usize;
            if let Some(row) = rows.get(u * dim..(u + 1) * dim) {
                base::simd::prefetch(row);
            }
        }
    }
}

/// `f(&mut dst[e], src[e])` for every element of two equal-length rows, as a loop of constant length for the
/// common dimensions (16, 32, 8): vectorized and inlined, where a runtime-length loop of 16 was not, and a
/// `copy_from_slice` of 64 bytes was a `memmove` call (53k calls per batch of 2048 x 26).
#[inline(always)]
fn for_row(dst: &mut [f32], src: &[f32], f: impl Fn(&mut f32, f32)) {
    #[inline(always)]
    fn fixed<const N: usize>(dst: &mut [f32], src: &[f32], f: &impl Fn(&mut f32, f32)) -> bool {
        match (<&mut [f32; N]>::try_from(dst), <&[f32; N]>::try_from(src)) {
            (Ok(d), Ok(s)) => {
                for (d, &s) in d.iter_mut().zip(s) {
                    f(d, s);
                }
                true
            }
            _ => false,
        }
    }
    if !(fixed::<16>(dst, src, &f) || fixed::<32>(dst, src, &f) || fixed::<8>(dst, src, &f)) {
        for (d, &s) in dst.iter_mut().zip(src) {
            f(d, s);
        }
    }
}
