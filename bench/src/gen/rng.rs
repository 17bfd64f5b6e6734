//! Seeded randomness: a stateless 64-bit mixer for "random but fixed" values (teacher weights, hex tokens,
//! chunk seeds) and a small sequential generator for sampling rows.
//!
//! Neither depends on the platform, the thread count or another crate's version, so output bytes stay fixed
//! for given seeds.

/// SplitMix64 finalizer: a bijective mix of all 64 input bits (defined once, in `base::hash`).
pub use base::hash::mix64;

/// Hash of three words, e.g. (seed, feature, value). Each word passes through the mixer in turn, so swapping
/// arguments gives unrelated outputs.
#[inline]
pub fn hash3(a: u64, b: u64, c: u64) -> u64 {
    let h = mix64(a ^ 0x9e37_79b9_7f4a_7c15);
    let h = mix64(h ^ b.wrapping_mul(0xff51_afd7_ed55_8ccd));
    mix64(h ^ c.wrapping_mul(0xc4ce_b9fe_1a85_ec53))
}

/// Maps 16 bits to a uniform value in `[-sqrt(3), sqrt(3))`: mean 0, variance 1.
#[inline]
pub fn unit_uniform16(bits: u64) -> f64 {
    const SQRT3: f64 = 1.732_050_807_568_877_2;
    ((bits & 0xffff) as f64 / 32768.0 - 1.0) * SQRT3
}

/// An approximately standard normal value from a hash: the centred sum of four 16-bit uniforms
/// (Irwin-Hall), scaled to variance 1. Bounded by about ±3.46, which keeps single weights from dominating.
#[inline]
pub fn hash_normal(h: u64) -> f64 {
    let sum = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
    // Four uniforms on [0, 1): mean 2, variance 4/12.
    (sum as f64 / 65536.0 - 2.0) * 3.0f64.sqrt()
}

/// xoshiro256++ (Blackman and Vigna), seeded through SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
    spare_normal: Option<f64>,
}

impl Rng {
    /// A generator whose whole stream is a function of `seed`.
    pub fn new(seed: u64) -> Self {
        let mut seeder = base::rng::SplitMix64::new(seed);
        let mut next = || seeder.next_u64();
        Rng {
            s: [next(), next(), next(), next()],
            spare_normal: None,
        }
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    #[inline]
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// Standard normal (Marsaglia's polar method; the second value of each pair is kept for the next call).
    #[inline]
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        loop {
            let u = 2.0 * self.next_f64() - 1.0;
            let v = 2.0 * self.next_f64() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let m = (-2.0 * s.ln() / s).sqrt();
                self.spare_normal = Some(v * m);
                return u * m;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_different_seed_differs() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut c = Rng::new(8);
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn uniform_and_normal_moments() {
        let mut rng = Rng::new(1);
        let n = 200_000;
        let (mut su, mut sn, mut sn2) = (0.0, 0.0, 0.0);
        for _ in 0..n {
            let u = rng.next_f64();
            assert!((0.0..1.0).contains(&u));
            su += u;
            let z = rng.normal();
            sn += z;
            sn2 += z * z;
        }
        let n = n as f64;
        assert!((su / n - 0.5).abs() < 0.01);
        assert!((sn / n).abs() < 0.01);
        assert!((sn2 / n - 1.0).abs() < 0.02);
    }

    #[test]
    fn hash_values_have_unit_variance() {
        let n = 100_000u64;
        let (mut s1, mut s2, mut u1, mut u2) = (0.0, 0.0, 0.0, 0.0);
        for i in 0..n {
            let h = hash3(3, 5, i);
            let z = hash_normal(h);
            s1 += z;
            s2 += z * z;
            let u = unit_uniform16(h >> 7);
            u1 += u;
            u2 += u * u;
        }
        let n = n as f64;
        assert!((s1 / n).abs() < 0.02 && (s2 / n - 1.0).abs() < 0.03);
        assert!((u1 / n).abs() < 0.02 && (u2 / n - 1.0).abs() < 0.03);
    }
}
