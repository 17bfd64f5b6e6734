//! Zipf sampling in O(1) time per draw, whatever the vocabulary size.
//!
//! Large vocabularies use rejection-inversion (W. Hörmann and G. Derflinger, "Rejection-inversion to generate
//! variates from monotone discrete distributions", ACM TOMACS 6(3), 1996), the same method as Apache Commons
//! RNG's `RejectionInversionZipfSampler` and rand_distr's `Zipf`. It needs no table, so a feature with ten
//! million values costs as much as one with ten; the expected number of rejections per draw is well under one.
//! Vocabularies of at most [`TABLE_MAX`] values use a Walker alias table instead: one random word and no
//! transcendental functions per draw, for a table of 8 bytes per value.

use super::rng::Rng;

/// Largest vocabulary sampled through an [`AliasTable`] (512 KiB of table at most).
pub const TABLE_MAX: u64 = 1 << 16;

/// Why a [`Zipf`] cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ZipfError {
    /// The vocabulary is empty.
    #[error("zipf: vocabulary size must be at least 1, got 0")]
    EmptyVocabulary,
    /// The exponent is not a finite positive number.
    #[error("zipf: exponent must be finite and positive, got {0}")]
    BadExponent(f64),
}

/// Zipf distribution over ranks `1..=n`: `P(k)` proportional to `k^-exponent`. An alias table up to
/// [`TABLE_MAX`] values, rejection-inversion above.
#[derive(Debug, Clone)]
pub enum Zipf {
    /// Small vocabulary.
    Table(AliasTable),
    /// Large vocabulary.
    RejectionInversion(RejectionInversion),
}

impl Zipf {
    /// A sampler over `1..=n` with the given exponent.
    pub fn new(n: u64, exponent: f64) -> Result<Self, ZipfError> {
        let ri = RejectionInversion::new(n, exponent)?;
        Ok(if n <= TABLE_MAX {
            let weights: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-exponent)).collect();
            Zipf::Table(AliasTable::new(&weights))
        } else {
            Zipf::RejectionInversion(ri)
        })
    }

    /// Vocabulary size `n`.
    pub fn n(&self) -> u64 {
        match self {
            Zipf::Table(t) => t.len() as u64,
            Zipf::RejectionInversion(r) => r.n(),
        }
    }

    /// One rank in `1..=n`.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            Zipf::Table(t) => t.sample(rng) as u64 + 1,
            Zipf::RejectionInversion(r) => r.sample(rng),
        }
    }
}

/// Walker's alias method (Vose's construction): O(1) draws from any finite distribution.
#[derive(Debug, Clone)]
pub struct AliasTable {
    /// Per slot: (probability of keeping the slot, scaled to 2^32; the slot's alias).
    slots: Vec<(u32, u32)>,
}

impl AliasTable {
    /// A table for indices `0..weights.len()` with probabilities proportional to `weights` (non-negative,
    /// finite, not all zero; at most `u32::MAX` of them).
    pub fn new(weights: &[f64]) -> Self {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        let mut scaled: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut slots: Vec<(u32, u32)> = (0..n as u32).map(|i| (u32::MAX, i)).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|&i| scaled[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            slots[s] = ((scaled[s] * 4_294_967_296.0) as u32, l as u32);
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Whatever is left has probability 1 up to rounding and keeps its (u32::MAX, self) slot.
        AliasTable { slots }
    }

    /// Number of indices.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the table has no indices.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// One index in `0..len()`. Panics if the table is empty.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.next_u64();
        // High 32 bits pick the slot (multiply-shift, no modulo bias worth the name), low 32 bits the side.
        let i = (((u >> 32) * self.slots.len() as u64) >> 32) as usize;
        let (keep, alias) = self.slots[i];
        if (u as u32) < keep {
            i
        } else {
            alias as usize
        }
    }
}

/// Rejection-inversion Zipf sampler over ranks `1..=n`; no table.
#[derive(Debug, Clone)]
pub struct RejectionInversion {
    n: f64,
    exponent: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl RejectionInversion {
    /// A sampler over `1..=n` with the given exponent.
    pub fn new(n: u64, exponent: f64) -> Result<Self, ZipfError> {
        if n == 0 {
            return Err(ZipfError::EmptyVocabulary);
        }
        if !(exponent.is_finite() && exponent > 0.0) {
            return Err(ZipfError::BadExponent(exponent));
        }
        let mut z = RejectionInversion {
            n: n as f64,
            exponent,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// Vocabulary size `n`.
    pub fn n(&self) -> u64 {
        self.n as u64
    }

    /// One rank in `1..=n`.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            // x >= 1, so truncation is floor (and avoids a libm call without SSE4.1).
            let k = ((x + 0.5) as u64 as f64).clamp(1.0, self.n);
            // The first test accepts most draws without evaluating the integral again.
            if k - x <= self.s || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// `h(x) = x^-exponent`.
    #[inline]
    fn h(&self, x: f64) -> f64 {
        (-self.exponent * x.ln()).exp()
    }

    /// `H(x)`, an antiderivative of `h` that stays accurate as the exponent approaches 1.
    #[inline]
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.exponent) * log_x) * log_x
    }

    /// Inverse of `H`.
    #[inline]
    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.exponent)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, with the series near 0.
#[inline]
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, with the series near 0.
#[inline]
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::rng::Rng;
    use proptest::prelude::*;

    #[test]
    fn rejects_bad_parameters() {
        assert_eq!(Zipf::new(0, 1.1).unwrap_err(), ZipfError::EmptyVocabulary);
        assert!(matches!(Zipf::new(5, 0.0), Err(ZipfError::BadExponent(_))));
        assert!(matches!(
            Zipf::new(5, f64::NAN),
            Err(ZipfError::BadExponent(_))
        ));
    }

    /// Checks `draws` samples in `1..=weights.len()` against the normalized weights, 5 sigma per value.
    fn check_pmf(weights: &[f64], mut sample: impl FnMut(&mut Rng) -> u64) {
        let mut rng = Rng::new(weights.len() as u64);
        let draws = 200_000;
        let mut counts = vec![0u64; weights.len()];
        for _ in 0..draws {
            counts[(sample(&mut rng) - 1) as usize] += 1;
        }
        let total: f64 = weights.iter().sum();
        for (i, (&c, &w)) in counts.iter().zip(weights).enumerate() {
            let p = w / total;
            let sd = (draws as f64 * p * (1.0 - p)).sqrt();
            let diff = (c as f64 - draws as f64 * p).abs();
            assert!(
                diff <= 5.0 * sd + 1.0,
                "value {}: {c} vs {}",
                i + 1,
                draws as f64 * p
            );
        }
    }

    #[test]
    fn matches_exact_pmf_on_small_vocabulary() {
        for &(n, s) in &[
            (1u64, 1.1),
            (3, 1.05),
            (10, 1.2),
            (50, 1.0),
            (7, 2.0),
            (1000, 1.1),
        ] {
            let weights: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
            let table = Zipf::new(n, s).unwrap();
            assert!(matches!(table, Zipf::Table(_)));
            check_pmf(&weights, |rng| table.sample(rng));
            let ri = RejectionInversion::new(n, s).unwrap();
            check_pmf(&weights, |rng| ri.sample(rng));
        }
    }

    #[test]
    fn alias_table_matches_arbitrary_weights() {
        let weights = [0.0, 5.0, 1.0, 0.5, 3.0, 0.0, 2.5];
        let table = AliasTable::new(&weights);
        check_pmf(&weights, |rng| table.sample(rng) as u64 + 1);
    }

    #[test]
    fn huge_vocabulary_head_mass_is_as_expected() {
        // With n = 10M and s = 1.1 about half of the mass lies in the top 100 ranks (generalized harmonic
        // numbers: H(100) / H(1e7) = 4.27 / 8.58).
        let z = Zipf::new(10_000_000, 1.1).unwrap();
        let mut rng = Rng::new(9);
        let draws = 100_000;
        let head = (0..draws).filter(|_| z.sample(&mut rng) <= 100).count();
        let frac = head as f64 / draws as f64;
        assert!((frac - 0.50).abs() < 0.03, "head fraction {frac}");
    }

    proptest! {
        #[test]
        fn samples_stay_in_range(n in prop_oneof![1u64..100, 1u64..20_000_000], s in 0.3f64..3.0, seed: u64) {
            let z = Zipf::new(n, s).unwrap();
            let ri = RejectionInversion::new(n, s).unwrap();
            prop_assert_eq!(z.n(), n);
            let mut rng = Rng::new(seed);
            for _ in 0..200 {
                let (a, b) = (z.sample(&mut rng), ri.sample(&mut rng));
                prop_assert!((1..=n).contains(&a) && (1..=n).contains(&b), "{} {} n={}", a, b, n);
            }
        }
    }
}
