//! Deterministic row initializer: weight `i` of row `id` is a pure function of (table seed, id, i).
//!
//! DESIGN.md: "Initializers: deterministic from (table seed, id), so a pull of a new id needs no write." A pull of
//! an unseen id therefore returns these values without inserting a row, and a later push creates the row with the
//! very same values. The generator is counter-based: the row key is `splitmix64(seed ^ splitmix64(id))` and
//! element `i` is output `i` of a splitmix64 stream started at that key, mapped to the distribution with f64
//! arithmetic (no libm for the uniform case, so the values are the same on every IEEE platform).

use crate::config::{InitKind, TableConfig};
use crate::optimizer;

/// Golden-ratio increment of splitmix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finalizer (Steele et al., 2014): a bijection on `u64` with good avalanche. The one copy
/// in the workspace: shard routing and wire id coding (`protocol::routing::mix64`) and the data generator use
/// it too.
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

/// The key from which the row's element stream is drawn.
#[inline]
fn row_key(seed: u64, id: u64) -> u64 {
    splitmix64(seed ^ splitmix64(id))
}

/// 64 random bits for element `i` of the row with key `key`.
#[inline]
fn element_bits(key: u64, i: usize) -> u64 {
    splitmix64(key.wrapping_add((i as u64).wrapping_mul(GOLDEN)))
}

/// Writes the initial weights of row `id` into `weights` (normally `dim` long; any length works, element `i`
/// does not depend on the length).
pub fn fill_weights(cfg: &TableConfig, id: u64, weights: &mut [f32]) {
    let key = row_key(cfg.seed, id);
    match cfg.init.kind {
        InitKind::Uniform { scale } => {
            let scale = f64::from(scale);
            for (i, w) in weights.iter_mut().enumerate() {
                // Top 53 bits -> [0, 1) exactly, then [-scale, scale).
                let u = (element_bits(key, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
                *w = (scale * (2.0 * u - 1.0)) as f32;
            }
        }
        InitKind::Normal { std } => {
            let std = f64::from(std);
            for (i, w) in weights.iter_mut().enumerate() {
                // Box-Muller from two 24-bit halves of one draw; u1 in (0, 1] so ln is finite.
                let bits = element_bits(key, i);
                let u1 = ((bits >> 40) + 1) as f64 * (1.0 / (1u64 << 24) as f64);
                let u2 = (bits & 0xFF_FFFF) as f64 * (1.0 / (1u64 << 24) as f64);
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                *w = (std * z) as f32;
            }
        }
    }
}

/// Writes a whole new row: initial weights followed by the optimizer's initial state.
/// `row.len()` must be `cfg.row_len()`.
pub fn fill_row(cfg: &TableConfig, id: u64, row: &mut [f32]) {
    let (weights, state) = row.split_at_mut(cfg.dim);
    fill_weights(cfg, id, weights);
    optimizer::init_state(&cfg.optimizer, state);
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
    use crate::config::InitConfig;

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

    #[test]
    fn deterministic_and_seed_dependent() {
        let cfg = TableConfig::new(1, "t", 8);
        let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
        fill_weights(&cfg, 42, &mut a);
        fill_weights(&cfg, 42, &mut b);
        assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
        fill_weights(&cfg, 43, &mut b);
        assert_ne!(a, b);
        let mut other = cfg.clone();
        other.seed = 1;
        fill_weights(&other, 42, &mut b);
        assert_ne!(a, b);
        // A prefix does not depend on the length asked for.
        let mut short = [0f32; 3];
        fill_weights(&cfg, 42, &mut short);
        assert_eq!(short, a[..3]);
    }

    #[test]
    fn uniform_range_and_mean() {
        let mut cfg = TableConfig::new(1, "t", 64);
        cfg.init = InitConfig::uniform(0.5);
        let mut row = vec![0f32; 64];
        let (mut sum, mut n) = (0f64, 0usize);
        for id in 0..2000u64 {
            fill_weights(&cfg, id, &mut row);
            for &w in &row {
                assert!((-0.5..0.5).contains(&w), "{w}");
                sum += f64::from(w);
                n += 1;
            }
        }
        assert!((sum / n as f64).abs() < 0.01);
    }

    #[test]
    fn normal_moments() {
        let mut cfg = TableConfig::new(1, "t", 64);
        cfg.init = InitConfig::normal(2.0);
        let mut row = vec![0f32; 64];
        let (mut s1, mut s2, mut n) = (0f64, 0f64, 0f64);
        for id in 0..2000u64 {
            fill_weights(&cfg, id, &mut row);
            for &w in &row {
                assert!(w.is_finite());
                s1 += f64::from(w);
                s2 += f64::from(w) * f64::from(w);
                n += 1.0;
            }
        }
        let mean = s1 / n;
        let std = (s2 / n - mean * mean).sqrt();
        assert!(mean.abs() < 0.05, "{mean}");
        assert!((std - 2.0).abs() < 0.05, "{std}");
    }

    #[test]
    fn zero_scale_gives_zeros_and_state_is_initialized() {
        let mut cfg = TableConfig::new(1, "t", 4);
        cfg.init = InitConfig::uniform(0.0);
        cfg.optimizer = crate::OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.25,
        };
        let mut row = [9f32; 5];
        fill_row(&cfg, 7, &mut row);
        assert_eq!(row, [0.0, 0.0, 0.0, 0.0, 0.25]);
    }

    #[test]
    fn dlrm_scale() {
        assert_eq!(InitConfig::dlrm(10_000), InitConfig::uniform(0.01));
    }
}
