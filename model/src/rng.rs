//! A tiny deterministic PRNG for weight initialization.
//!
//! SplitMix64 (Steele, Lea, Flood 2014; [`base::rng::SplitMix64`], defined once in the workspace) for the
//! bits and Box–Muller for normals. Self-written so that initial weights depend only on the seed, not on a
//! crate version.

/// SplitMix64 generator with a Box–Muller normal sampler.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    bits: base::rng::SplitMix64,
    /// Second Box–Muller value, kept for the next call.
    spare: Option<f64>,
}

impl Rng {
    /// A generator whose whole output is determined by `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            bits: base::rng::SplitMix64::new(seed),
            spare: None,
        }
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.bits.next_u64()
    }

    /// Uniform in the open interval (0, 1): never 0, so `ln` is finite.
    pub(crate) fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal sample.
    pub(crate) fn normal(&mut self) -> f64 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        let r = (-2.0 * self.uniform().ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * self.uniform();
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }

    /// Fills `out` with normal(0, std) samples.
    pub(crate) fn fill_normal(&mut self, out: &mut [f32], std: f64) {
        for x in out {
            *x = (self.normal() * std) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_seed() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::new(7);
        let b: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(8).next_u64(), a[0]);
    }

    #[test]
    fn splitmix_reference_value() {
        // First output of SplitMix64 seeded with 0 (reference C implementation).
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn normal_moments() {
        let mut r = Rng::new(1);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
    }
}
