//! Sampling rows from the [`super::schema`]: [`Row`] (one row before labelling), [`RowSampler`] and the
//! categorical [`token`]s written for Zipf ranks.

use super::multi_hot::BagSizes;
use super::rng::{hash3, Rng};
use super::scale::{bijective_token, VocabScale};
use super::schema::*;
use super::zipf::Zipf;

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
