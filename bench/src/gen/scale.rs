//! Vocabulary scaling (`gen-criteo --vocab-scale X [--scaled-zipf S]`): data whose large tables are far
//! larger than Criteo's, for runs where most rows must live in RocksDB (issue 17's scale run).
//!
//! The columns with at least [`LARGE_VOCAB`] values (Criteo's five large ones: C3, C4, C12, C16, C21) get `X`
//! times their vocabulary; the other 21 keep theirs. Draws stay Zipf over the scaled vocabulary, with the
//! column's own exponent (1.05-1.08) or `S`. The planted teacher labels the rows as before (it reads ranks, so
//! nothing limits it to the schema's sizes) and is calibrated on the scaled rows, so the oracle file still
//! gives the best achievable AUC. Most draws of a flat law land past the head, where the teacher's weights
//! are damped ([`super::teacher::head_amplitude`]): the signal shifts to head values and small columns.
//! Tokens of scaled columns are a keyed bijection of the rank ([`bijective_token`]), so distinct ranks are
//! distinct rows of the trainer's tables (the default hash token would merge about 0.6% of 50M values); a
//! scaled vocabulary is therefore at most 2^32.
//!
//! # How many distinct ids a pass touches
//! The expected distinct values of a column in a pass of `R` rows are `sum_k 1 - (1 - q p_k)^R`, with `p_k`
//! the Zipf probability of rank `k` and `q` the column's present rate (C3: 0.965). A Zipf law holds most draws
//! in its head, so a larger vocabulary alone adds few distinct values per pass; a flatter law (a lower
//! exponent) reaches into the tail. Expected values:
//!
//! | setting | column | R = 10M | R = 50M | R = 100M | R = 150M |
//! | ------- | ------ | ------- | ------- | -------- | -------- |
//! | default                              | C3     | 1.5M  | 4.2M  | 6.0M  |      |
//! |                                      | all 26 | 7M    | 17M   | 23M   |      |
//! | `--vocab-scale 400`                  | C3     | 2.9M  | 11.7M | 21.1M |      |
//! |                                      | all 26 | 14M   | 52M   | 94M   |      |
//! | `--vocab-scale 40 --scaled-zipf 0.8` | C3     | 7.3M  | 30.3M | 53.8M | 74.1M |
//! |                                      | all 26 | 35M   | 139M  | 239M  | 322M |
//! | `--vocab-scale 100 --scaled-zipf 0.7` | C3    |       | 40.0M | 74.7M |      |
//! |                                      | all 26 |       | 190M  | 345M  |      |
//!
//! (C3 has 10.1M values by default, 4.05G at scale 400; at scale 40: C3 405M, C12 334M, C21 282M, C16 218M,
//! C4 88M.)
//!
//! So one pass touching a table of 50M+ rows takes a flatter law and about 100M rows (a column cannot have
//! more distinct values than draws). The formula matches the generator: over 200k rows (seed 7) the test
//! below counts 65,531 distinct C3 values by default (expected 65,582), 78,129 at `--vocab-scale 16`
//! (expected 77,954) and 177,184 at `--vocab-scale 40 --scaled-zipf 0.8` (expected 177,224).

use super::rng::{hash3, mix64};
use super::schema::{CAT_VOCAB, CAT_ZIPF_EXPONENT, NUM_CAT};

/// Columns with at least this many values are scaled.
pub const LARGE_VOCAB: u64 = 1_000_000;

/// Largest scaled vocabulary: tokens are 32 bits ([`bijective_token`]).
pub const MAX_SCALED_VOCAB: u64 = 1 << 32;

/// Why a [`VocabScale`] is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScaleError {
    /// The factor is 0.
    #[error("vocabulary scale must be at least 1, got 0")]
    ZeroFactor,
    /// A scaled vocabulary does not fit 32-bit tokens.
    #[error("vocabulary scale {factor}: C{column} would have {vocab} values, above 2^32 (32-bit tokens)")]
    TooLarge {
        /// The factor.
        factor: u64,
        /// The column, 1-based.
        column: usize,
        /// Its scaled vocabulary.
        vocab: u128,
    },
    /// The exponent is not finite and positive.
    #[error("scaled zipf exponent must be finite and positive, got {0}")]
    BadExponent(f64),
}

/// How the large columns' vocabularies are scaled. [`VocabScale::NONE`] is the schema as it is (the default
/// output, byte for byte).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VocabScale {
    /// Vocabulary multiplier of the large columns (1 = unchanged).
    pub factor: u64,
    /// Zipf exponent of the large columns (`None`: each column's own).
    pub exponent: Option<f64>,
}

impl Default for VocabScale {
    fn default() -> Self {
        VocabScale::NONE
    }
}

impl VocabScale {
    /// No scaling.
    pub const NONE: VocabScale = VocabScale {
        factor: 1,
        exponent: None,
    };

    /// Checks the factor and exponent.
    pub fn validated(self) -> Result<VocabScale, ScaleError> {
        if self.factor == 0 {
            return Err(ScaleError::ZeroFactor);
        }
        if let Some(s) = self.exponent {
            if !(s.is_finite() && s > 0.0) {
                return Err(ScaleError::BadExponent(s));
            }
        }
        for (j, &n) in CAT_VOCAB.iter().enumerate() {
            let vocab = n as u128 * self.factor as u128;
            if n >= LARGE_VOCAB && vocab > MAX_SCALED_VOCAB as u128 {
                return Err(ScaleError::TooLarge {
                    factor: self.factor,
                    column: j + 1,
                    vocab,
                });
            }
        }
        Ok(self)
    }

    /// Whether column `cat` (0-based) is scaled: a large column, and a scale other than [`VocabScale::NONE`].
    pub fn scales(&self, cat: usize) -> bool {
        *self != VocabScale::NONE && CAT_VOCAB[cat] >= LARGE_VOCAB
    }

    /// Vocabulary of column `cat`.
    pub fn vocab(&self, cat: usize) -> u64 {
        if self.scales(cat) {
            CAT_VOCAB[cat] * self.factor
        } else {
            CAT_VOCAB[cat]
        }
    }

    /// Zipf exponent of column `cat`.
    pub fn exponent(&self, cat: usize) -> f64 {
        match self.exponent {
            Some(s) if self.scales(cat) => s,
            _ => CAT_ZIPF_EXPONENT[cat],
        }
    }

    /// Scaled vocabularies of all columns.
    pub fn vocabs(&self) -> [u64; NUM_CAT] {
        std::array::from_fn(|j| self.vocab(j))
    }
}

/// The token of rank `rank` (in `1..=2^32`) of column `cat`: a bijection of `rank - 1` onto 32 bits (a
/// column key XORed in, then the murmur3 finalizer, whose steps are each invertible), so distinct ranks never
/// share a token.
#[inline]
pub fn bijective_token(cat: usize, rank: u64) -> u32 {
    let key = (mix64(hash3(0x0053_4341_4c45, cat as u64, 0)) >> 32) as u32;
    let mut x = ((rank - 1) as u32) ^ key;
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::rng::Rng;
    use crate::gen::row::{token, Row, RowSampler};
    use std::collections::HashSet;

    #[test]
    fn none_is_the_schema_and_scaling_touches_only_large_columns() {
        assert_eq!(VocabScale::NONE.vocabs(), CAT_VOCAB);
        assert!((0..NUM_CAT).all(|j| !VocabScale::NONE.scales(j)));
        let s = VocabScale {
            factor: 40,
            exponent: Some(0.8),
        };
        assert_eq!(s.vocab(2), 40 * CAT_VOCAB[2]);
        assert_eq!(s.exponent(2), 0.8);
        assert_eq!(s.vocab(0), CAT_VOCAB[0]);
        assert_eq!(s.exponent(0), CAT_ZIPF_EXPONENT[0]);
        let scaled: Vec<usize> = (0..NUM_CAT).filter(|&j| s.scales(j)).collect();
        assert_eq!(scaled, [2, 3, 11, 15, 20]);
    }

    #[test]
    fn bad_scales_are_refused() {
        let f = |factor, exponent| VocabScale { factor, exponent }.validated();
        assert_eq!(f(0, None), Err(ScaleError::ZeroFactor));
        assert!(matches!(
            f(424, None),
            Err(ScaleError::TooLarge { column: 3, .. })
        ));
        assert!(f(423, None).is_ok());
        assert!(matches!(f(2, Some(0.0)), Err(ScaleError::BadExponent(_))));
        assert!(matches!(
            f(2, Some(f64::NAN)),
            Err(ScaleError::BadExponent(_))
        ));
    }

    #[test]
    fn bijective_tokens_do_not_collide() {
        let tokens: HashSet<u32> = (1..=200_000).map(|r| bijective_token(2, r)).collect();
        assert_eq!(tokens.len(), 200_000);
        assert_ne!(bijective_token(2, 1), bijective_token(3, 1));
        assert_ne!(bijective_token(2, 1), token(2, 1));
    }

    /// Distinct C3 tokens in `rows` rows drawn with `scale`.
    fn distinct_c3(scale: VocabScale, rows: usize) -> usize {
        let sampler = RowSampler::scaled(scale);
        let mut rng = Rng::new(7);
        let mut row = Row::default();
        let mut seen = HashSet::new();
        for _ in 0..rows {
            sampler.sample(&mut rng, &mut row);
            if let Some(rank) = row.cats[2] {
                assert!((1..=scale.vocab(2)).contains(&rank));
                seen.insert(sampler.token(2, rank));
            }
        }
        seen.len()
    }

    #[test]
    fn distinct_ids_of_a_pass_grow_with_the_scale() {
        // The figures in the module documentation.
        let rows = 200_000;
        let none = distinct_c3(VocabScale::NONE, rows);
        let wide = distinct_c3(
            VocabScale {
                factor: 16,
                exponent: None,
            },
            rows,
        );
        let flat = distinct_c3(
            VocabScale {
                factor: 40,
                exponent: Some(0.8),
            },
            rows,
        );
        assert!(none < wide && wide < flat, "{none} {wide} {flat}");
        // A Zipf head holds most draws: 16x the values add little; a flatter law doubles the count.
        assert!(flat > 2 * none, "{none} {flat}");
    }
}
