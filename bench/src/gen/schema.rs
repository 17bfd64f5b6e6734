//! What a synthetic Criteo row looks like before the teacher labels it: the 13 integer and 26 categorical
//! columns, their distributions and their missingness.
//!
//! The tables are fixed (not seeded) so that every file, whatever its seeds, has the same shape. Vocabulary
//! sizes are the per-column distinct-value counts of the Criteo Kaggle `train.txt`; missing rates follow its
//! per-column rates, with the same groups of columns that go missing together.

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
}
