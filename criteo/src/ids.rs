//! Feature ids: one `u64` per (sparse feature, raw token), as the embedding tables key their rows.
//!
//! DESIGN.md ("Read"): `u64 = hash(feature index, raw token)`, and an empty token is its own id per feature.
//! The id is a *bijective* mix of a 64-bit key, so two different (feature, token) pairs can never share an
//! embedding row; the key is
//!
//! ```text
//! bits 63..33: feature index (< 2^31)   bit 32: token present   bits 31..0: token value
//! ```
//!
//! and the mix is splitmix64 (add the golden-ratio increment, then the variant-13 finalizer of Stafford's
//! "Better bit mixing"), which spreads ids evenly over shards whichever bits the raw tokens use. The mix is a
//! permutation of `u64`, so every `u64` (0 included) is some pair's id: consumers must not reserve sentinel ids.
//!
//! Changing anything here changes every id and so invalidates every trained table; the unit tests pin known
//! values so that cannot happen silently.

// The splitmix64 increment (2^64 / golden ratio); adding it keeps feature 0's empty token away from id 0.
use base::hash::GOLDEN;

/// The largest feature index plus one: the feature occupies the key's top 31 bits.
pub const MAX_FEATURES: usize = 1 << 31;

/// The id of `token` in sparse feature `feature` (0-based: C1 is feature 0).
///
/// `None` is the empty token, which has an id of its own in each feature. Distinct (feature, token) pairs
/// always get distinct ids.
///
/// # Panics
/// If `feature >= MAX_FEATURES` (a programming error: Criteo has 26 features).
#[inline]
pub fn feature_id(feature: usize, token: Option<u32>) -> u64 {
    assert!(
        feature < MAX_FEATURES,
        "feature index {feature} exceeds 2^31"
    );
    let low = match token {
        Some(value) => (1 << 32) | u64::from(value),
        None => 0,
    };
    mix((feature as u64) << 33 | low)
}

/// Inverts [`feature_id`]: the (feature, token) pair an id was made from, or `None` if no pair maps to it.
///
/// For debugging and for tests; the training path never needs it.
pub fn decode_feature_id(id: u64) -> Option<(usize, Option<u32>)> {
    let key = unmix(id);
    let feature = (key >> 33) as usize;
    let value = key as u32;
    if key & (1 << 32) != 0 {
        Some((feature, Some(value)))
    } else if value == 0 {
        Some((feature, None))
    } else {
        None
    }
}

/// splitmix64: a permutation of `u64`.
#[inline]
fn mix(key: u64) -> u64 {
    base::hash::splitmix64(key)
}

/// The inverse of [`mix`].
fn unmix(id: u64) -> u64 {
    base::hash::unmix64(id).wrapping_sub(GOLDEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pinned ids (computed by an independent Python splitmix64; `(0, None)` is splitmix64's well-known first
    /// output for seed 0): if this test fails, every trained embedding table would be keyed differently.
    #[test]
    fn known_values_are_stable() {
        let pinned: [(usize, Option<u32>, u64); 6] = [
            (0, None, 0xe220_a839_7b1d_cdaf),
            (0, Some(0), 0xc42c_5a1a_a382_0138),
            (1, None, 0xe7b2_5ad2_7bcc_b532),
            (5, Some(0x68fd_1e64), 0xacec_5431_60ff_c217),
            (25, Some(u32::MAX), 0x0f7f_4ba9_33c6_a063),
            (25, None, 0x1dd6_417c_9021_8a6e),
        ];
        for (feature, token, id) in pinned {
            assert_eq!(
                feature_id(feature, token),
                id,
                "feature {feature} token {token:?}: {:#018x}",
                feature_id(feature, token)
            );
        }
    }

    #[test]
    fn empty_token_differs_from_zero_token() {
        for f in 0..26 {
            assert_ne!(feature_id(f, None), feature_id(f, Some(0)));
        }
    }

    #[test]
    #[should_panic(expected = "exceeds 2^31")]
    fn huge_feature_index_panics() {
        feature_id(MAX_FEATURES, None);
    }

    fn pair() -> impl Strategy<Value = (usize, Option<u32>)> {
        (0..MAX_FEATURES, proptest::option::of(any::<u32>()))
    }

    proptest! {
        #[test]
        fn injective(a in pair(), b in pair()) {
            prop_assume!(a != b);
            prop_assert_ne!(feature_id(a.0, a.1), feature_id(b.0, b.1));
        }

        #[test]
        fn decode_round_trips(p in pair()) {
            prop_assert_eq!(decode_feature_id(feature_id(p.0, p.1)), Some(p));
        }

        #[test]
        fn unmix_inverts_mix(x in any::<u64>()) {
            prop_assert_eq!(unmix(mix(x)), x);
            prop_assert_eq!(mix(unmix(x)), x);
        }

        /// The same token in two features gets unrelated ids (the feature salts the hash).
        #[test]
        fn feature_salt_matters(f in 0usize..26, g in 0usize..26, token in proptest::option::of(any::<u32>())) {
            prop_assume!(f != g);
            let (a, b) = (feature_id(f, token), feature_id(g, token));
            prop_assert_ne!(a, b);
            // Not just different: the low bits (which pick shards) differ too, most of the time.
            prop_assert!((a ^ b).count_ones() >= 8, "{a:#x} vs {b:#x}");
        }
    }
}
