//! The workspace's one hash of ids: the splitmix64 finalizer [`mix64`], its inverse [`unmix64`], the
//! splitmix64 step [`splitmix64`], and [`IdHasher`], the `HashMap` hasher of ids.

use std::hash::Hasher;

/// Golden-ratio increment of splitmix64.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finalizer (Steele et al., 2014): a bijection on `u64` with good avalanche. The one copy
/// in the workspace: row initializers (`embedding::init`), shard routing and wire id coding
/// (`protocol::routing`), feature-id hashing (`criteo::ids`) and the data generator use it.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The inverse of [`mix64`]: `mix64(unmix64(x)) == x` for every `x`.
#[inline]
pub fn unmix64(x: u64) -> u64 {
    // Inverses of the finalizer's odd multipliers modulo 2^64.
    const INV1: u64 = inverse(0xbf58_476d_1ce4_e5b9);
    const INV2: u64 = inverse(0x94d0_49bb_1331_11eb);
    let mut z = x;
    z ^= (z >> 31) ^ (z >> 62);
    z = z.wrapping_mul(INV2);
    z ^= (z >> 27) ^ (z >> 54);
    z = z.wrapping_mul(INV1);
    z ^ (z >> 30) ^ (z >> 60)
}

/// The multiplicative inverse of an odd `a` modulo 2^64 (Newton's iteration doubles the correct bits each
/// step, starting from 3 correct bits since `a * a == 1 mod 8`).
const fn inverse(a: u64) -> u64 {
    let mut x = a;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// The splitmix64 step: [`mix64`] of `z + golden`.
#[inline]
pub fn splitmix64(z: u64) -> u64 {
    mix64(z.wrapping_add(GOLDEN))
}

/// A `HashMap` hasher for ids: one multiply (feature ids are already a bijective 64-bit mix; small sequential
/// ids are spread by the xor-shift and the multiply). Used by the trainer's batch plan and the Python package's
/// dedup.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmix64_inverts_mix64() {
        assert_eq!(
            0xbf58_476d_1ce4_e5b9u64.wrapping_mul(inverse(0xbf58_476d_1ce4_e5b9)),
            1
        );
        assert_eq!(
            0x94d0_49bb_1331_11ebu64.wrapping_mul(inverse(0x94d0_49bb_1331_11eb)),
            1
        );
        let mut x = 1u64;
        for _ in 0..1000 {
            assert_eq!(mix64(unmix64(x)), x);
            assert_eq!(unmix64(mix64(x)), x);
            x = splitmix64(x);
        }
    }
}
