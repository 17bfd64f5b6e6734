//! [`SplitMix64`], the workspace's one deterministic generator: weight initialization of the dense model,
//! the data generator, the fuzzers.

use crate::hash::{mix64, GOLDEN};

/// A sequential splitmix64 generator (Steele, Lea, Flood 2014): the state advances by the golden increment and
/// each output is [`mix64`] of it. Tiny, fast and a pure function of its seed on every platform, so a seed
/// reproduces a whole run; not for cryptography. Drives the fuzzers (`protocol/tests/fuzz.rs`,
/// `ps-server/tests/fuzz_handler.rs`).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose whole stream is a function of `seed`.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }

    /// A value in `0..n` (`0` for `n == 0`), by remainder: biased by at most `n / 2^64`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True once in `one_in` draws on average (always for `one_in` 0 or 1).
    #[inline]
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    /// One of `items`, uniformly; `items` must not be empty.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// Half the time one of `edges` (boundary values a fuzzer wants hit often), else a `u32` of random
    /// magnitude (random bits shifted right by `0..32`).
    pub fn u32_or_edge(&mut self, edges: &[u32]) -> u32 {
        if self.chance(2) {
            self.pick(edges)
        } else {
            self.next_u64() as u32 >> self.below(32)
        }
    }

    /// Half the time one of `edges`, else an `f32` of random bits (NaNs, infinities and subnormals included).
    pub fn f32_or_edge(&mut self, edges: &[f32]) -> f32 {
        if self.chance(2) {
            self.pick(edges)
        } else {
            f32::from_bits(self.next_u64() as u32)
        }
    }
}

/// A number drawn anew by every call and every process (never 0): the OS-seeded hasher of the standard
/// library over the time and the process id. For identities that must not collide between processes (a
/// server's incarnation, a client's push ids), not for cryptography.
pub fn unique_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::splitmix64;

    #[test]
    fn splitmix64_generator_matches_the_reference() {
        // First outputs of SplitMix64 seeded with 0 (the reference C implementation).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        // The stateless step gives the same stream.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        let mut r = SplitMix64::new(7);
        assert!((0..1000).all(|_| r.below(10) < 10));
        assert_eq!(r.below(0), 0);
        assert!(r.chance(1));
        assert_eq!(r.bytes(5).len(), 5);
        assert!((0..100).all(|_| [1u32, 2].contains(&r.pick(&[1, 2]))));
    }
}
