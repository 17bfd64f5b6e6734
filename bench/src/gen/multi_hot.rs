//! Multi-hot generation: how many tokens each categorical field holds ([`BagSizes`]).
//!
//! MLPerf's multi-hot Criteo (DLRM-v2) turns each one-hot field into a bag of a fixed size per column; with
//! sizes the generator writes each field of a column whose size is above 1 as exactly that many tokens,
//! each drawn from the column's Zipf vocabulary, joined by `|` (docs/model-spec.md). Columns of size 1 stay
//! one-hot, missing fields included.

use super::schema::NUM_CAT;

/// MLPerf DLRM-v2's bag sizes of C1..C26.
pub const MLPERF_SIZES: [usize; NUM_CAT] = [
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
];

/// [`MLPERF_SIZES`] as `--multi-hot` takes them.
pub const MLPERF_SIZES_TEXT: &str = "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1";

/// Largest bag size accepted (a line must stay well under the reader's 64 KiB line limit).
pub const MAX_BAG: usize = 256;

/// Why bag sizes are refused; messages name the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BagSizesError {
    /// Not one size per categorical column.
    #[error("{count} bag sizes, expected {NUM_CAT} (one per column C1..C26)")]
    Count {
        /// How many were given.
        count: usize,
    },
    /// A size that is not a number.
    #[error("bag size {text:?} of C{column} is not a number")]
    NotANumber {
        /// The column, 1-based.
        column: usize,
        /// The text.
        text: String,
    },
    /// A size out of `1..=MAX_BAG`.
    #[error("bag size {size} of C{column} is not in 1..={MAX_BAG}")]
    OutOfRange {
        /// The column, 1-based.
        column: usize,
        /// The size.
        size: usize,
    },
}

/// Tokens per field of each categorical column, each in `1..=MAX_BAG` (checked on construction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BagSizes([usize; NUM_CAT]);

impl BagSizes {
    /// MLPerf DLRM-v2's sizes.
    pub const MLPERF: BagSizes = BagSizes(MLPERF_SIZES);

    /// Checks every size is in `1..=MAX_BAG`.
    pub fn new(sizes: [usize; NUM_CAT]) -> Result<Self, BagSizesError> {
        for (j, &size) in sizes.iter().enumerate() {
            if !(1..=MAX_BAG).contains(&size) {
                return Err(BagSizesError::OutOfRange {
                    column: j + 1,
                    size,
                });
            }
        }
        Ok(BagSizes(sizes))
    }

    /// Parses 26 comma-separated sizes (`3,2,1,...`).
    pub fn parse(text: &str) -> Result<Self, BagSizesError> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        if parts.len() != NUM_CAT {
            return Err(BagSizesError::Count { count: parts.len() });
        }
        let mut sizes = [0; NUM_CAT];
        for (j, part) in parts.iter().enumerate() {
            sizes[j] = part.parse().map_err(|_| BagSizesError::NotANumber {
                column: j + 1,
                text: part.to_string(),
            })?;
        }
        Self::new(sizes)
    }

    /// The size of column `j` (0-based).
    #[inline]
    pub fn size(&self, j: usize) -> usize {
        self.0[j]
    }

    /// All sizes, C1 first.
    pub fn sizes(&self) -> [usize; NUM_CAT] {
        self.0
    }

    /// Tokens per row beyond one per column (what a line grows by, in tokens).
    pub fn extra_tokens(&self) -> usize {
        self.0.iter().map(|s| s - 1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mlperf_and_names_bad_values() {
        assert_eq!(BagSizes::parse(MLPERF_SIZES_TEXT), Ok(BagSizes::MLPERF));
        assert_eq!(BagSizes::MLPERF.extra_tokens(), 214 - 26);
        let err = |text: &str| BagSizes::parse(text).unwrap_err().to_string();
        assert_eq!(
            err("1,2"),
            "2 bag sizes, expected 26 (one per column C1..C26)"
        );
        let mut parts = vec!["1"; 26];
        parts[4] = "x";
        assert_eq!(
            err(&parts.join(",")),
            r#"bag size "x" of C5 is not a number"#
        );
        parts[4] = "0";
        assert_eq!(err(&parts.join(",")), "bag size 0 of C5 is not in 1..=256");
        parts[4] = "257";
        assert_eq!(
            err(&parts.join(",")),
            "bag size 257 of C5 is not in 1..=256"
        );
        parts[4] = " 4 ";
        assert_eq!(BagSizes::parse(&parts.join(",")).unwrap().size(4), 4);
    }
}
