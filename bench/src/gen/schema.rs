//! What a synthetic Criteo row looks like before the teacher labels it: the 13 integer and 26 categorical
//! columns, their distributions and their missingness.
//!
//! The tables are fixed (not seeded) so that every file, whatever its seeds, has the same shape. Vocabulary
//! sizes are the per-column distinct-value counts of the Criteo Kaggle `train.txt`; missing rates follow its
//! per-column rates, with the same groups of columns that go missing together.

use super::multi_hot::BagSizes;
use super::rng::{hash3, Rng};
use super::scale::{bijective_token, VocabScale};
use super::zipf::Zipf;

/// Integer columns `I1..I13`.
pub const NUM_INT: usize = 13;
/// Categorical columns `C1..C26`.
pub const NUM_CAT: usize = 26;
/// Tab-separated fields per line: label, integers, categoricals.
pub const NUM_FIELDS: usize = 1 + NUM_INT + NUM_CAT;

/// Vocabulary size of each categorical column (Criteo Kaggle distinct counts: from 3 values to 10 million).
pub const CAT_VOCAB: [u64; NUM_CAT] = [
    1_460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593, 3_194,
    27, 14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
];

/// Zipf exponent of each categorical column, within 1.05..=1.2.
pub const CAT_ZIPF_EXPONENT: [f64; NUM_CAT] = [
    1.10, 1.15, 1.05, 1.08, 1.20, 1.15, 1.10, 1.12, 1.20, 1.08, 1.10, 1.05, 1.12, 1.18, 1.10, 1.06,
    1.20, 1.12, 1.15, 1.20, 1.06, 1.18, 1.18, 1.08, 1.15, 1.10,
];

/// Integer column shape: `x = max(0, round(exp(mu + sigma * z)) - 1)` with `z` standard normal and partly shared
/// across the row (see [`ROW_FACTOR_WEIGHT`]), which gives heavy-tailed counts with many zeros.
#[derive(Debug, Clone, Copy)]
pub struct IntShape {
    /// Location of `ln(1 + x)`.
    pub mu: f64,
    /// Scale of `ln(1 + x)`.
    pub sigma: f64,
    /// Probability of a small negative value (-1, -2 or -3) instead, as in Criteo's `I2`.
    pub negative: f64,
}

const fn shape(mu: f64, sigma: f64, negative: f64) -> IntShape {
    IntShape {
        mu,
        sigma,
        negative,
    }
}

/// Shape of each integer column; `I2` and `I3` take small negative values sometimes.
pub const INT_SHAPE: [IntShape; NUM_INT] = [
    shape(0.8, 1.2, 0.0),
    shape(1.5, 2.0, 0.05),
    shape(2.0, 1.3, 0.001),
    shape(1.7, 1.0, 0.0),
    shape(7.5, 2.0, 0.0),
    shape(3.5, 1.6, 0.0),
    shape(1.2, 1.5, 0.0),
    shape(2.3, 1.0, 0.0),
    shape(3.5, 1.5, 0.0),
    shape(0.0, 0.8, 0.0),
    shape(0.7, 1.2, 0.0),
    shape(0.0, 1.2, 0.0),
    shape(1.8, 1.1, 0.0),
];

/// Weight of the per-row shared factor in each integer column's normal draw (the rest is the column's own
/// noise), so counts are correlated within a row as in real logs.
pub const ROW_FACTOR_WEIGHT: f64 = 0.6;

/// A group of columns that go missing together in a row with probability `p`.
#[derive(Debug, Clone, Copy)]
pub struct MissingGroup {
    /// Probability that the whole group is missing in a row.
    pub p: f64,
    /// Integer columns of the group (0-based: 0 is `I1`).
    pub ints: &'static [usize],
    /// Categorical columns of the group (0-based: 0 is `C1`).
    pub cats: &'static [usize],
}

/// Correlated missingness: `I1, I10, I12` together, a block of count columns together, the
/// `C19, C20, C22, C25, C26` block, and the `C3, C4, C12, C16, C21, C24` block (with `I`-columns of the
/// second group), as seen in Criteo.
pub const MISSING_GROUPS: [MissingGroup; 4] = [
    MissingGroup {
        p: 0.40,
        ints: &[0, 9, 11],
        cats: &[],
    },
    MissingGroup {
        p: 0.20,
        ints: &[2, 3, 5, 12],
        cats: &[],
    },
    MissingGroup {
        p: 0.44,
        ints: &[],
        cats: &[18, 19, 21, 24, 25],
    },
    MissingGroup {
        p: 0.034,
        ints: &[6, 8, 10],
        cats: &[2, 3, 11, 15, 20, 23],
    },
];

/// Independent per-column missing probability of the integer columns, on top of the groups.
pub const INT_MISSING: [f64; NUM_INT] = [
    0.08, 0.0, 0.02, 0.02, 0.026, 0.02, 0.005, 0.0005, 0.005, 0.08, 0.005, 0.60, 0.02,
];

/// Independent per-column missing probability of the categorical columns, on top of the groups.
pub const CAT_MISSING: [f64; NUM_CAT] = [
    0.0, 0.0, 0.001, 0.001, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.001, 0.0, 0.0, 0.0, 0.001, 0.0,
    0.0, 0.0, 0.0, 0.0, 0.57, 0.0, 0.0, 0.0, 0.0,
];

/// One row before labelling. Categorical values are Zipf ranks (1 is the most frequent value); `None` is an
/// empty field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// `I1..I13`.
    pub ints: [Option<i64>; NUM_INT],
    /// `C1..C26` as ranks in `1..=CAT_VOCAB[j]` (scaled: `1..=VocabScale::vocab(j)`); the first rank of a
    /// multi-hot column's bag.
    pub cats: [Option<u64>; NUM_CAT],
    /// The bags of the multi-hot columns, concatenated (reused from row to row).
    pub bag_ranks: Vec<u64>,
    /// Where column `j`'s bag lies in `bag_ranks`; an empty range for a one-hot column.
    pub bag_spans: [(u32, u32); NUM_CAT],
}

impl Row {
    /// The ranks of column `j`'s field if it is multi-hot (a bag), `None` if it is one-hot.
    #[inline]
    pub fn bag(&self, j: usize) -> Option<&[u64]> {
        let (start, end) = self.bag_spans[j];
        (end > start).then(|| &self.bag_ranks[start as usize..end as usize])
    }
}

/// The 32-bit token written for rank `rank` of categorical column `cat`: a hash, so tokens look random and
/// carry no hint of frequency.
#[inline]
pub fn token(cat: usize, rank: u64) -> u32 {
    (hash3(0x43_52_49_54_45_4f, cat as u64, rank) >> 32) as u32
}

/// Samples rows from the fixed schema, or from its [`VocabScale`]d version; holds one [`Zipf`] per
/// categorical column.
#[derive(Debug, Clone)]
pub struct RowSampler {
    zipf: Vec<Zipf>,
    scale: VocabScale,
    bags: Option<BagSizes>,
}

impl Default for RowSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl RowSampler {
    /// A sampler for the tables above.
    pub fn new() -> Self {
        Self::scaled(VocabScale::NONE)
    }

    /// A sampler whose large columns are scaled (`scale` checked by [`VocabScale::validated`]; an unchecked
    /// one panics if a vocabulary is 0 or an exponent invalid).
    pub fn scaled(scale: VocabScale) -> Self {
        let zipf = (0..NUM_CAT)
            .map(|j| Zipf::new(scale.vocab(j), scale.exponent(j)).expect("valid vocabulary scale"))
            .collect();
        RowSampler {
            zipf,
            scale,
            bags: None,
        }
    }

    /// This sampler drawing multi-hot rows: each field of a column of size `n > 1` is a bag of exactly `n`
    /// ranks from the column's Zipf (never missing); columns of size 1 stay as they are.
    pub fn with_bags(mut self, bags: BagSizes) -> Self {
        self.bags = Some(bags);
        self
    }

    /// The bag sizes, if multi-hot.
    pub fn bags(&self) -> Option<BagSizes> {
        self.bags
    }

    /// The scaling this sampler draws with.
    pub fn scale(&self) -> VocabScale {
        self.scale
    }

    /// The token written for rank `rank` of column `cat`: [`token`], or [`bijective_token`] on a scaled
    /// column.
    #[inline]
    pub fn token(&self, cat: usize, rank: u64) -> u32 {
        if self.scale.scales(cat) {
            bijective_token(cat, rank)
        } else {
            token(cat, rank)
        }
    }

    /// Overwrites `row` with a fresh sample.
    pub fn sample(&self, rng: &mut Rng, row: &mut Row) {
        let mut int_missing = [false; NUM_INT];
        let mut cat_missing = [false; NUM_CAT];
        for g in &MISSING_GROUPS {
            if rng.bernoulli(g.p) {
                g.ints.iter().for_each(|&j| int_missing[j] = true);
                g.cats.iter().for_each(|&j| cat_missing[j] = true);
            }
        }
        let factor = rng.normal();
        let own = (1.0 - ROW_FACTOR_WEIGHT * ROW_FACTOR_WEIGHT).sqrt();
        for (j, shape) in INT_SHAPE.iter().enumerate() {
            // Draw every column even when it ends up missing, so one column's missingness does not shift the
            // random stream of the next.
            let z = ROW_FACTOR_WEIGHT * factor + own * rng.normal();
            let u = rng.next_f64();
            let missing = int_missing[j] || rng.bernoulli(INT_MISSING[j]);
            row.ints[j] = if missing {
                None
            } else if u < shape.negative {
                Some(-1 - (u / shape.negative * 3.0) as i64 % 3)
            } else {
                Some(((shape.mu + shape.sigma * z).exp().round() as i64 - 1).max(0))
            };
        }
        row.bag_ranks.clear();
        for (j, zipf) in self.zipf.iter().enumerate() {
            let rank = zipf.sample(rng);
            let missing = cat_missing[j] || rng.bernoulli(CAT_MISSING[j]);
            let size = self.bags.map_or(1, |b| b.size(j));
            if size > 1 {
                // Without bag sizes nothing else is drawn, so one-hot rows keep their random stream.
                let start = row.bag_ranks.len() as u32;
                row.bag_ranks.push(rank);
                row.bag_ranks.extend((1..size).map(|_| zipf.sample(rng)));
                row.bag_spans[j] = (start, row.bag_ranks.len() as u32);
                row.cats[j] = Some(rank);
            } else {
                row.bag_spans[j] = (0, 0);
                row.cats[j] = (!missing).then_some(rank);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_consistent() {
        assert!(CAT_VOCAB.iter().any(|&n| n <= 10));
        assert!(CAT_VOCAB.iter().any(|&n| n >= 5_000_000));
        assert!(CAT_ZIPF_EXPONENT.iter().all(|&s| (1.05..=1.2).contains(&s)));
        for g in &MISSING_GROUPS {
            assert!(g.ints.iter().all(|&j| j < NUM_INT) && g.cats.iter().all(|&j| j < NUM_CAT));
        }
    }

    #[test]
    fn multi_hot_fields_hold_exactly_their_size() {
        let sizes = BagSizes::MLPERF;
        let sampler = RowSampler::new().with_bags(sizes);
        let mut rng = Rng::new(5);
        let mut row = Row::default();
        for _ in 0..2_000 {
            sampler.sample(&mut rng, &mut row);
            for (j, vocab) in CAT_VOCAB.iter().enumerate() {
                match row.bag(j) {
                    Some(bag) => {
                        assert_eq!(bag.len(), sizes.size(j), "C{}", j + 1);
                        assert!(bag.iter().all(|r| (1..=*vocab).contains(r)));
                        assert_eq!(row.cats[j], Some(bag[0]));
                    }
                    None => assert_eq!(sizes.size(j), 1, "C{}", j + 1),
                }
            }
        }
    }

    #[test]
    fn samples_are_in_range_and_sometimes_negative() {
        let sampler = RowSampler::new();
        let mut rng = Rng::new(5);
        let mut row = Row::default();
        let mut negatives = 0;
        for _ in 0..20_000 {
            sampler.sample(&mut rng, &mut row);
            for (j, x) in row.ints.iter().enumerate() {
                if let Some(x) = *x {
                    let lowest = if INT_SHAPE[j].negative > 0.0 { -3 } else { 0 };
                    assert!(x >= lowest, "I{} = {x}", j + 1);
                    negatives += usize::from(x < 0);
                }
            }
            for (j, r) in row.cats.iter().enumerate() {
                if let Some(r) = *r {
                    assert!((1..=CAT_VOCAB[j]).contains(&r));
                }
            }
        }
        assert!(negatives > 0);
    }
}
