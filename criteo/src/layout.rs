//! The feature layout: which Criteo columns become which sparse features, and how (docs/model-spec.md,
//! "Semantics").
//!
//! Feature `f` of a [`FeatureLayout`] reads column `column` (C1 is 0), keeps at most `tokens` of its
//! `|`-separated tokens (1 = one-hot), caps each token to `token % hash_size` (0 = no cap) and keys it as
//! [`feature_id`](crate::feature_id)`(table, token)` ([`IdScheme::Hashed`], the trainer's) or as the capped
//! token itself ([`IdScheme::Token`], TorchRec's Criteo convention). The default layout is today's: 26 one-hot features,
//! feature `j` reading column `j` into table `j` without a cap, so its ids are exactly the one-hot ids.

use super::ids::{feature_id, MAX_FEATURES};
use super::parse::NUM_SPARSE;

/// How a feature's (capped) tokens become row ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdScheme {
    /// [`feature_id`]`(table, token)`: a bijective hash of the table and the token, the missing token an id of
    /// its own (the trainer's ids; rows of different features never collide, whatever the cap).
    #[default]
    Hashed,
    /// The capped token's value itself, the missing token read as token 0: `int(token or "0", 16) %
    /// hash_size`, the ids TorchRec's Criteo pipeline (and a `num_embeddings`-sized table) expects.
    Token,
}

/// One sparse feature: the column it reads and how its tokens become ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeatureInput {
    /// The 0-based Criteo categorical column it reads (C1 = 0), below 26.
    pub column: usize,
    /// The id salt: ids are `feature_id(table, token)`, so features sharing a table share rows.
    pub table: u32,
    /// Tokens become `token % hash_size` before hashing; 0 = no cap.
    pub hash_size: u64,
    /// The most tokens kept per field (the rest are counted as truncated); 1 = one-hot, at least 1.
    pub tokens: usize,
    /// How the capped tokens become ids.
    pub ids: IdScheme,
}

impl FeatureInput {
    /// Feature `j` of the default layout: column `j`, table `j`, one-hot, no cap.
    pub fn one_hot(j: usize) -> Self {
        FeatureInput {
            column: j,
            table: j as u32,
            hash_size: 0,
            tokens: 1,
            ids: IdScheme::Hashed,
        }
    }

    /// The row id of `token` (`None`: the field is empty) in this feature: capped, then keyed by [`Self::ids`].
    #[inline]
    pub fn id(&self, token: Option<u32>) -> u64 {
        match self.ids {
            IdScheme::Hashed => feature_id(self.table as usize, token.map(|t| self.cap(t))),
            IdScheme::Token => u64::from(self.cap(token.unwrap_or(0))),
        }
    }

    /// `token` after the hash-size cap.
    #[inline]
    pub fn cap(&self, token: u32) -> u32 {
        if self.hash_size == 0 {
            token
        } else {
            // The remainder is below both `token` and `hash_size`, so it fits in u32.
            (u64::from(token) % self.hash_size) as u32
        }
    }
}

/// The sparse features a reader produces, in order (`Batch::sparse[f]` is feature `f`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FeatureLayout {
    /// The features, in batch order.
    pub features: Vec<FeatureInput>,
}

impl Default for FeatureLayout {
    /// 26 one-hot features, feature `j` reading column `j` into table `j` without a cap: today's ids.
    fn default() -> Self {
        FeatureLayout {
            features: (0..NUM_SPARSE).map(FeatureInput::one_hot).collect(),
        }
    }
}

/// Why a layout cannot be read. Messages name the feature and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// No features at all.
    #[error("the feature layout has no features")]
    Empty,
    /// A column past C26.
    #[error("feature {feature}: column {column} (0-based) is past C{NUM_SPARSE}")]
    Column {
        /// The feature index.
        feature: usize,
        /// The column it names.
        column: usize,
    },
    /// Two features read the same column.
    #[error("features {first} and {feature} both read column C{}", column + 1)]
    DuplicateColumn {
        /// The earlier feature.
        first: usize,
        /// The later feature.
        feature: usize,
        /// The column, 0-based.
        column: usize,
    },
    /// A token cap of 0.
    #[error("feature {feature} (C{}): tokens 0, must be at least 1", column + 1)]
    ZeroTokens {
        /// The feature index.
        feature: usize,
        /// Its column, 0-based.
        column: usize,
    },
    /// A table index too large for [`feature_id`](crate::feature_id).
    #[error("feature {feature}: table {table} is not below 2^31")]
    Table {
        /// The feature index.
        feature: usize,
        /// The table index.
        table: u32,
    },
}

impl FeatureLayout {
    /// Whether feature `f` is multi-hot (`tokens > 1`): its batch column has offsets.
    ///
    /// # Panics
    /// If `f` is not a feature of the layout.
    #[inline]
    pub fn is_multi_hot(&self, f: usize) -> bool {
        self.features[f].tokens > 1
    }

    /// Whether any feature is multi-hot.
    pub fn any_multi_hot(&self) -> bool {
        self.features.iter().any(|f| f.tokens > 1)
    }

    /// Whether this is the default layout (26 one-hot features, column = table = index, no cap).
    pub fn is_default(&self) -> bool {
        self.features.len() == NUM_SPARSE
            && self
                .features
                .iter()
                .enumerate()
                .all(|(j, f)| *f == FeatureInput::one_hot(j))
    }

    /// A stable 64-bit digest of the layout (feature count, then every feature's column, table, cap and
    /// token count), recorded in columnar shards so a shard is never read with another layout.
    pub fn fingerprint(&self) -> u64 {
        let mix = base::hash::splitmix64;
        let mut h = mix(0x6c61_796f_7574 ^ self.features.len() as u64);
        for f in &self.features {
            for x in [
                f.column as u64,
                u64::from(f.table),
                f.hash_size,
                f.tokens as u64,
            ] {
                h = mix(h ^ x);
            }
            // Hashed ids add nothing, so the digests of shards written before the scheme existed still match.
            if f.ids == IdScheme::Token {
                h = mix(h ^ 0x0074_6f6b_656e);
            }
        }
        h
    }

    /// Checks that there is at least one feature, columns are below 26 and distinct, tables below 2^31 and
    /// token caps at least 1.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.features.is_empty() {
            return Err(LayoutError::Empty);
        }
        let mut seen = [None; NUM_SPARSE];
        for (feature, f) in self.features.iter().enumerate() {
            let column = f.column;
            if column >= NUM_SPARSE {
                return Err(LayoutError::Column { feature, column });
            }
            if let Some(first) = seen[column] {
                return Err(LayoutError::DuplicateColumn {
                    first,
                    feature,
                    column,
                });
            }
            seen[column] = Some(feature);
            if f.tokens == 0 {
                return Err(LayoutError::ZeroTokens { feature, column });
            }
            if f.table as usize >= MAX_FEATURES {
                return Err(LayoutError::Table {
                    feature,
                    table: f.table,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_26_one_hot_features() {
        let layout = FeatureLayout::default();
        assert!(layout.is_default());
        assert!(!layout.any_multi_hot());
        assert_eq!(layout.features.len(), 26);
        assert_eq!(layout.features[7], FeatureInput::one_hot(7));
        layout.validate().unwrap();
    }

    /// Pinned: shards record the fingerprint, so changing it orphans every preprocessed shard.
    #[test]
    fn fingerprint_is_stable_and_sensitive() {
        let default = FeatureLayout::default();
        assert_eq!(default.fingerprint(), default.clone().fingerprint());
        assert_eq!(default.fingerprint(), 0xc62e_c15a_05cc_4162);
        let mut seen = vec![default.fingerprint()];
        for change in 0..5 {
            let mut l = default.clone();
            match change {
                0 => l.features[3].tokens = 2,
                1 => l.features[3].hash_size = 1000,
                2 => l.features[3].table = 2,
                3 => l.features.swap(0, 1),
                _ => l.features.truncate(25),
            }
            assert!(!seen.contains(&l.fingerprint()), "change {change}");
            seen.push(l.fingerprint());
        }
    }

    #[test]
    fn validate_names_the_offender() {
        let check = |l: FeatureLayout, want: &str| {
            let err = l.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        };
        check(FeatureLayout { features: vec![] }, "no features");
        let mut l = FeatureLayout::default();
        l.features[2].column = 26;
        check(l, "feature 2: column 26");
        let mut l = FeatureLayout::default();
        l.features[5].column = 1;
        check(l, "features 1 and 5 both read column C2");
        let mut l = FeatureLayout::default();
        l.features[4].tokens = 0;
        check(l, "feature 4 (C5): tokens 0");
        let mut l = FeatureLayout::default();
        l.features[0].table = u32::MAX;
        check(l, "table 4294967295");
        // Shared tables and fewer features are fine.
        let l = FeatureLayout {
            features: vec![
                FeatureInput {
                    table: 0,
                    ..FeatureInput::one_hot(4)
                },
                FeatureInput::one_hot(0),
            ],
        };
        l.validate().unwrap();
    }

    /// TorchRec's Criteo ids: `int(token or "0", 16) % hash_size`, the same value whatever the table; the
    /// trainer's hashed ids otherwise. The scheme changes the fingerprint (a shard of one is never read as the
    /// other); hashed layouts keep theirs.
    #[test]
    fn token_ids_are_the_capped_token_and_missing_is_zero() {
        let token = FeatureInput {
            hash_size: 1000,
            table: 5,
            ids: IdScheme::Token,
            ..FeatureInput::one_hot(3)
        };
        assert_eq!(token.id(Some(0x1234)), 0x1234 % 1000);
        assert_eq!(token.id(None), 0);
        assert_eq!(token.id(Some(0)), 0);
        let uncapped = FeatureInput {
            hash_size: 0,
            ..token
        };
        assert_eq!(uncapped.id(Some(u32::MAX)), u64::from(u32::MAX));
        let hashed = FeatureInput {
            ids: IdScheme::Hashed,
            ..token
        };
        assert_eq!(hashed.id(Some(0x1234)), feature_id(5, Some(0x1234 % 1000)));
        assert_eq!(hashed.id(None), feature_id(5, None));
        let layout = |f| FeatureLayout { features: vec![f] };
        assert_ne!(layout(token).fingerprint(), layout(hashed).fingerprint());
    }

    #[test]
    fn cap_is_a_remainder() {
        let f = FeatureInput {
            hash_size: 10,
            ..FeatureInput::one_hot(0)
        };
        assert_eq!(f.cap(123), 3);
        assert_eq!(FeatureInput::one_hot(0).cap(u32::MAX), u32::MAX);
        let huge = FeatureInput {
            hash_size: 1 << 40,
            ..FeatureInput::one_hot(0)
        };
        assert_eq!(huge.cap(u32::MAX), u32::MAX);
    }
}
