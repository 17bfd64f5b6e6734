//! Row precision (issue 43): a table's weights stored as f32, bf16 or f16, its optimizer state as f32 or (the
//! per-element moments of Adam and Adagrad) bf16.
//!
//! # Choice of state and rounding
//! The optimizer runs in f32 on a decoded copy of the row, and only the weights are narrowed after each update;
//! the state (Adagrad's sums of squares, Adam's moments) stays f32, because a sum of squares that grows by
//! small steps stalls in 8 bits of mantissa (bf16 `1024 + 2` is `1024`), and the step size of every later update
//! depends on it. A weight narrowed to nearest would lose every update smaller than half its unit in the last
//! place (a weight of 0.05 in bf16 moves by steps of 2^-12: Adagrad's late updates are below that), so weights
//! are rounded **stochastically**: up with the probability of the distance to the lower neighbour, unbiased in
//! expectation (FBGEMM's half-precision TBE weights do the same). The random bits are a hash of (id, element,
//! value before rounding, the row's optimizer state after the update), not a generator's state: two servers
//! applying the same push to the same row (a replay after a restore) round it the same way, bit for bit. The
//! state makes the bits change from one update to the next even when a row's weight and gradient repeat; SGD
//! keeps no state, so a repeated update of an SGD row would round the same way every time (a weight under
//! weight decay alone would never move): half-precision tables take an optimizer with state, and an SGD table
//! with bf16 or f16 rows is refused at validation. Initial weights are rounded to nearest
//! ([`crate::init::fill_weights`]), so a pull of a new id equals the row a push creates.
//!
//! # bf16 state (`state_precision = "bf16"`)
//! Adam's moments (`2 x dim` of its `2 x dim + 1` state values) dominate its row, so halving the weights alone
//! leaves an Adam row at 0.84x. With `state_precision = "bf16"` the per-element state (Adam's `m` and `v`,
//! Adagrad's accumulators) is stored in bf16 too, rounded **stochastically** after each f32 update like the
//! weights (to nearest it would stall: `v = 0.999 v + 0.001 g^2` moves `v` by a tenth of a bf16 unit), with
//! its own random bits from the same hash (so replays round it the same way); Adam's step count stays f32
//! (exact), and row-wise Adagrad's one accumulator, SGD and FTRL (whose weights are recomputed from its state
//! at every update) keep f32 state. The optimizer still computes in f32 on the decoded row.
//!
//! # Layout of a stored row
//! [`RowCodec`] packs a row into `u32` words: f32 weights one per word; half weights two per word (element
//! `2k` in the low half of word `k`), padded to a whole word for odd `dim`; then the bf16 part of the state
//! (with `state_precision = "bf16"`), two per word the same way; then the f32 state, one per word.
//! The words, little-endian, are also the row's bytes in the store, snapshots and the capacity tier, so a bf16
//! row of dim 128 with row-wise Adagrad is 260 bytes instead of 516. Everything outside the table (pulls,
//! pushes, replication, resharding, delta sync, SafeTensors) still sees f32 values, which for a half table are
//! exactly representable in its precision: a replica or a restore loading them converts exactly, and a value
//! that is not representable is refused naming the table, the id and both precisions
//! ([`crate::EmbeddingError::InexactRow`]).

use base::hash::splitmix64;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// How a table stores its weights (its optimizer state is always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowPrecision {
    /// 4 bytes per weight: what every table stored before issue 43.
    #[default]
    F32,
    /// bfloat16: f32's range, 8 bits of mantissa; 2 bytes per weight.
    Bf16,
    /// IEEE half: 11 bits of mantissa, magnitudes up to 65504; 2 bytes per weight.
    F16,
}

impl RowPrecision {
    /// Whether this is [`RowPrecision::F32`] (serde skips the field then, so f32 configs read as before).
    pub fn is_f32(&self) -> bool {
        *self == RowPrecision::F32
    }

    /// Bytes per stored weight.
    pub fn weight_bytes(self) -> usize {
        match self {
            RowPrecision::F32 => 4,
            RowPrecision::Bf16 | RowPrecision::F16 => 2,
        }
    }

    /// The name used in configs and errors: `f32`, `bf16`, `f16`.
    pub fn name(self) -> &'static str {
        match self {
            RowPrecision::F32 => "f32",
            RowPrecision::Bf16 => "bf16",
            RowPrecision::F16 => "f16",
        }
    }

    /// `x` rounded to nearest (ties to even) in this precision, as f32; f16 overflow becomes infinity.
    #[inline]
    pub fn round_nearest(self, x: f32) -> f32 {
        match self {
            RowPrecision::F32 => x,
            RowPrecision::Bf16 => bf16::from_f32(x).to_f32(),
            RowPrecision::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// Whether `x` is exactly representable in this precision (NaN never is: rows hold finite values).
    #[inline]
    pub fn holds(self, x: f32) -> bool {
        let r = self.round_nearest(x);
        r == x && (r != 0.0 || r.to_bits() == x.to_bits())
    }

    /// `x` rounded stochastically in this precision: to one of its two neighbours, up with probability
    /// (distance to the lower) / (distance between them), by the 32 random bits `rand`. Exact values, NaN and
    /// infinities are returned as rounded to nearest.
    #[inline]
    pub fn round_stochastic(self, x: f32, rand: u32) -> f32 {
        match self {
            RowPrecision::F32 => x,
            RowPrecision::Bf16 => {
                if !x.is_finite() {
                    return bf16::from_f32(x).to_f32();
                }
                // Adding 16 random bits below bf16's last place to the magnitude, then truncating, rounds the
                // magnitude up with exactly the probability of its remainder; sign-magnitude makes that
                // unbiased for negative values too. A carry into the exponent is the next binade's first value
                // (or infinity past the largest finite, which the weight guard then sees).
                f32::from_bits(x.to_bits().wrapping_add(rand & 0xffff) & 0xffff_0000)
            }
            RowPrecision::F16 => {
                let near = f16::from_f32(x);
                let nf = near.to_f32();
                if nf == x || !x.is_finite() {
                    return nf;
                }
                // Neighbours of |x| by their bit patterns (monotonic for non-negative halves, subnormals and
                // infinity included).
                let a = x.abs();
                let nb = near.to_bits() & 0x7fff;
                let (lo, hi) = if nf.abs() < a {
                    (nb, nb + 1)
                } else {
                    (nb - 1, nb)
                };
                let (lo_f, hi_f) = (f16::from_bits(lo).to_f32(), f16::from_bits(hi).to_f32());
                let p = (a - lo_f) / (hi_f - lo_f);
                let u = (rand >> 8) as f32 * (1.0 / (1u32 << 24) as f32);
                let m = if u < p { hi_f } else { lo_f };
                m.copysign(x)
            }
        }
    }
}

impl std::fmt::Display for RowPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RowPrecision {
    type Err = String;

    /// `f32`, `bf16` or `f16` (any case).
    fn from_str(s: &str) -> Result<RowPrecision, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(RowPrecision::F32),
            "bf16" => Ok(RowPrecision::Bf16),
            "f16" => Ok(RowPrecision::F16),
            other => Err(format!(
                "{other:?} is not a row precision (f32, bf16 or f16)"
            )),
        }
    }
}

/// The 32 random bits with which element `i` (value `x` before rounding) of row `id` is rounded; `salt` is
/// [`RowCodec::salt`] of the row's state after the update.
#[inline]
fn rounding_bits(id: u64, salt: u64, i: usize, x: f32) -> u32 {
    (splitmix64(id ^ salt ^ splitmix64(((i as u64) << 32) | u64::from(x.to_bits()))) >> 32) as u32
}

/// What [`rounding_bits`] mixes into the salt of a row's state (so the state's bits differ from the
/// weights').
const STATE_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// How one table's rows are packed into `u32` words (module docs, "Layout of a stored row").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowCodec {
    precision: RowPrecision,
    dim: usize,
    state: usize,
    /// Leading state values stored in bf16 (the rest f32).
    half_state: usize,
}

impl RowCodec {
    /// The codec of rows with `dim` weights in `precision` and `state` f32s of optimizer state.
    pub fn new(precision: RowPrecision, dim: usize, state: usize) -> RowCodec {
        RowCodec {
            precision,
            dim,
            state,
            half_state: 0,
        }
    }

    /// This codec with the first `n` values of the state (at most all of it) stored in bf16.
    pub fn with_half_state(self, n: usize) -> RowCodec {
        RowCodec {
            half_state: n.min(self.state),
            ..self
        }
    }

    /// The weights' precision.
    pub fn precision(&self) -> RowPrecision {
        self.precision
    }

    /// State values stored in bf16 (the leading ones).
    pub fn half_state(&self) -> usize {
        self.half_state
    }

    /// Whether a stored row is plain f32 words (f32 weights and state): read and updated in place, no
    /// conversion.
    #[inline]
    pub fn is_plain(&self) -> bool {
        self.precision == RowPrecision::F32 && self.half_state == 0
    }

    /// Words holding the bf16 part of the state.
    #[inline]
    fn half_state_words(&self) -> usize {
        self.half_state.div_ceil(2)
    }

    /// Words holding the weights.
    #[inline]
    fn weight_words(&self) -> usize {
        match self.precision {
            RowPrecision::F32 => self.dim,
            _ => self.dim.div_ceil(2),
        }
    }

    /// `u32` words per stored row.
    #[inline]
    pub fn words(&self) -> usize {
        self.weight_words() + self.half_state_words() + (self.state - self.half_state)
    }

    /// Bytes per stored row (in memory, in the store, in snapshots).
    #[inline]
    pub fn bytes(&self) -> usize {
        self.words() * 4
    }

    /// f32s of a decoded row (weights then state).
    #[inline]
    pub fn row_len(&self) -> usize {
        self.dim + self.state
    }

    /// Decodes the first `out.len()` values of the row in `words` (`dim`: the weights; `row_len`: weights and
    /// state) into `out`.
    #[inline]
    pub fn decode(&self, words: &[u32], out: &mut [f32]) {
        debug_assert_eq!(words.len(), self.words());
        debug_assert!(out.len() <= self.row_len());
        let dim = self.dim.min(out.len());
        let (w_out, s_out) = out.split_at_mut(dim);
        let ww = self.weight_words();
        match self.precision {
            RowPrecision::F32 => w_out.copy_from_slice(bytemuck::cast_slice(&words[..dim])),
            RowPrecision::Bf16 => {
                // A bf16 is the top half of its f32: two per word, no conversion (vectorizes).
                let mut pairs = w_out.chunks_exact_mut(2);
                for (o, &w) in (&mut pairs).zip(words) {
                    o[0] = f32::from_bits(w << 16);
                    o[1] = f32::from_bits(w & 0xffff_0000);
                }
                if let [last] = pairs.into_remainder() {
                    *last = f32::from_bits(words[dim / 2] << 16);
                }
            }
            RowPrecision::F16 => {
                for (i, o) in w_out.iter_mut().enumerate() {
                    *o = f16::from_bits(half_bits(words, i) as u16).to_f32();
                }
            }
        }
        if !s_out.is_empty() {
            let h = self.half_state.min(s_out.len());
            let (h_out, f_out) = s_out.split_at_mut(h);
            for (i, o) in h_out.iter_mut().enumerate() {
                *o = f32::from_bits(half_bits(&words[ww..], i) << 16);
            }
            let fw = ww + self.half_state_words();
            f_out.copy_from_slice(bytemuck::cast_slice(&words[fw..fw + f_out.len()]));
        }
    }

    /// Encodes the row `row` (`row_len` f32s) into `words`. Every caller passes weights the precision holds
    /// (rounded by [`RowCodec::round_weights`] or [`crate::init::fill_weights`], or checked by
    /// [`RowCodec::check_exact`]), so a bf16 weight is the top half of its f32 as it is (checked in debug
    /// builds); f16 weights go through the conversion, exact for them.
    #[inline]
    pub fn encode(&self, row: &[f32], words: &mut [u32]) {
        debug_assert_eq!(row.len(), self.row_len());
        debug_assert_eq!(words.len(), self.words());
        let (weights, state) = row.split_at(self.dim);
        let ww = self.weight_words();
        match self.precision {
            RowPrecision::F32 => {
                words[..ww].copy_from_slice(bytemuck::cast_slice(weights));
            }
            RowPrecision::Bf16 => {
                debug_assert!(weights
                    .iter()
                    .all(|&w| w.is_nan() || self.precision.holds(w)));
                let mut pairs = weights.chunks_exact(2);
                for (word, w) in words[..ww].iter_mut().zip(&mut pairs) {
                    *word = (w[0].to_bits() >> 16) | (w[1].to_bits() & 0xffff_0000);
                }
                if let [last] = pairs.remainder() {
                    words[ww - 1] = last.to_bits() >> 16;
                }
            }
            RowPrecision::F16 => {
                for (k, word) in words[..ww].iter_mut().enumerate() {
                    let lo = self.half_of(weights[2 * k]);
                    let hi = weights.get(2 * k + 1).map_or(0, |&w| self.half_of(w));
                    *word = u32::from(lo) | (u32::from(hi) << 16);
                }
            }
        }
        let (half, full) = state.split_at(self.half_state);
        let hw = self.half_state_words();
        debug_assert!(half
            .iter()
            .all(|&s| s.is_nan() || RowPrecision::Bf16.holds(s)));
        for (k, word) in words[ww..ww + hw].iter_mut().enumerate() {
            let lo = half[2 * k].to_bits() >> 16;
            let hi = half.get(2 * k + 1).map_or(0, |s| s.to_bits() & 0xffff_0000);
            *word = lo | hi;
        }
        words[ww + hw..].copy_from_slice(bytemuck::cast_slice(full));
    }

    /// The 16 bits of `x` rounded to nearest in the half precision.
    #[inline]
    fn half_of(&self, x: f32) -> u16 {
        match self.precision {
            RowPrecision::Bf16 => bf16::from_f32(x).to_bits(),
            _ => f16::from_f32(x).to_bits(),
        }
    }

    /// A hash of a row's optimizer state after its update, which [`RowCodec::round_weights`] mixes into its
    /// random bits: the state moves with every update (an accumulator, a moment, a step count), so a row whose
    /// weights and update repeat still gets new bits.
    #[inline]
    pub fn salt(state: &[f32]) -> u64 {
        state
            .iter()
            .fold(0u64, |h, s| splitmix64(h ^ u64::from(s.to_bits())))
    }

    /// Rounds the weights of row `id` in place, stochastically (module docs), to values the precision holds;
    /// `salt` is [`RowCodec::salt`] of the row's new state.
    #[inline]
    pub fn round_weights(&self, id: u64, salt: u64, weights: &mut [f32]) {
        if self.precision == RowPrecision::F32 {
            return;
        }
        for (i, w) in weights.iter_mut().enumerate() {
            *w = self
                .precision
                .round_stochastic(*w, rounding_bits(id, salt, i, *w));
        }
    }

    /// Rounds the weights of row `id` just updated, whose optimizer state is now `state`, and the bf16 part of
    /// that state: what a table does after each update ([`RowCodec::round_weights`] with [`RowCodec::salt`] of
    /// `state` before its rounding; the state with bits of the same salt, mixed with its own constant), and what
    /// a trainer replaying its own pushes on pulled rows does to compute the same bits. Nothing for a plain
    /// f32 row.
    #[inline]
    pub fn round_updated(&self, id: u64, weights: &mut [f32], state: &mut [f32]) {
        if self.is_plain() {
            return;
        }
        let salt = RowCodec::salt(state);
        self.round_weights(id, salt, weights);
        for (i, s) in state[..self.half_state].iter_mut().enumerate() {
            *s = RowPrecision::Bf16
                .round_stochastic(*s, rounding_bits(id, salt ^ STATE_SALT, i, *s));
        }
    }

    /// Rounds the weights in place to nearest, with f16 overflow saturated to its largest finite value (after a
    /// clamp, whose bound may exceed it).
    #[inline]
    pub fn round_weights_nearest(&self, weights: &mut [f32]) {
        if self.precision == RowPrecision::F32 {
            return;
        }
        for w in weights.iter_mut() {
            let r = self.precision.round_nearest(*w);
            *w = if r.is_infinite() && w.is_finite() {
                f16::MAX.to_f32().copysign(*w)
            } else {
                r
            };
        }
    }

    /// Checks that every weight of `row` is exactly representable in the precision, and every value of the
    /// state's bf16 part in bf16; the first one that is not, as (element of the row, value).
    pub fn check_exact(&self, row: &[f32]) -> Result<(), (usize, f32)> {
        if self.is_plain() {
            return Ok(());
        }
        let weights = &row[..self.dim.min(row.len())];
        if let Some(i) = weights.iter().position(|&w| !self.precision.holds(w)) {
            return Err((i, row[i]));
        }
        let half = &row[self.dim.min(row.len())..(self.dim + self.half_state).min(row.len())];
        match half.iter().position(|&s| !RowPrecision::Bf16.holds(s)) {
            None => Ok(()),
            Some(i) => Err((self.dim + i, row[self.dim + i])),
        }
    }

    /// The precision element `element` of a row is held in: the weights', bf16 for the state's bf16 part,
    /// f32 for the rest (what an [`crate::EmbeddingError::InexactRow`] names).
    pub fn precision_of(&self, element: usize) -> RowPrecision {
        if element < self.dim {
            self.precision
        } else if element < self.dim + self.half_state {
            RowPrecision::Bf16
        } else {
            RowPrecision::F32
        }
    }

    /// Decodes a stored row's little-endian bytes (`bytes()` long) into its words.
    #[inline]
    pub fn words_from_bytes(&self, bytes: &[u8], words: &mut [u32]) {
        debug_assert_eq!(bytes.len(), words.len() * 4);
        for (w, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
            *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}

/// Half-precision element `i` of packed weights.
#[inline]
fn half_bits(words: &[u32], i: usize) -> u32 {
    (words[i / 2] >> ((i % 2) * 16)) & 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_in_every_precision() {
        for p in [RowPrecision::F32, RowPrecision::Bf16, RowPrecision::F16] {
            for dim in [1usize, 2, 3, 16, 17] {
                let c = RowCodec::new(p, dim, 2);
                let mut row: Vec<f32> = (0..dim).map(|i| (i as f32 - 3.0) * 0.125).collect();
                row.extend([1.5e-7, 3.0e30]);
                c.check_exact(&row).unwrap();
                let mut words = vec![0u32; c.words()];
                c.encode(&row, &mut words);
                let mut back = vec![0f32; c.row_len()];
                c.decode(&words, &mut back);
                assert_eq!(back, row, "{p:?} dim {dim}");
                let mut weights = vec![0f32; dim];
                c.decode(&words, &mut weights);
                assert_eq!(weights, row[..dim]);
            }
        }
        assert_eq!(RowCodec::new(RowPrecision::Bf16, 128, 1).bytes(), 260);
        assert_eq!(RowCodec::new(RowPrecision::F32, 128, 1).bytes(), 516);
        assert_eq!(RowCodec::new(RowPrecision::F16, 3, 0).bytes(), 8);
    }

    #[test]
    fn inexact_weights_are_named() {
        let c = RowCodec::new(RowPrecision::Bf16, 3, 1);
        assert_eq!(c.check_exact(&[0.5, 0.1, 1.0, 0.1]), Err((1, 0.1)));
        // The state is f32: any value is fine.
        assert_eq!(c.check_exact(&[0.5, 0.25, 1.0, 0.1]), Ok(()));
        let f = RowCodec::new(RowPrecision::F16, 1, 0);
        assert_eq!(f.check_exact(&[70000.0]), Err((0, 70000.0)));
        assert!(!RowPrecision::F16.holds(f32::NAN));
    }

    #[test]
    fn stochastic_rounding_is_unbiased_and_lands_on_neighbours() {
        for p in [RowPrecision::Bf16, RowPrecision::F16] {
            for &x in &[0.0123f32, -0.0123, 3.3e-6, 1.0 + 1.0 / 3.0, -777.7] {
                let (mut sum, mut lo, mut hi) = (0f64, f32::MAX, f32::MIN);
                let n = 20_000;
                for k in 0..n {
                    let r = p.round_stochastic(x, rounding_bits(k, 0, 0, x));
                    assert!(p.holds(r), "{p:?} {x} -> {r}");
                    (lo, hi) = (lo.min(r), hi.max(r));
                    sum += f64::from(r);
                }
                // Two neighbours, around x; the mean within 2% of their distance (the standard error is under
                // 0.4% of it at 20,000 draws).
                let near = p.round_nearest(x);
                assert!(
                    lo < x && x < hi && (near == lo || near == hi),
                    "{p:?} {x}: {lo} {hi}"
                );
                let mean = sum / n as f64;
                let spacing = f64::from(hi - lo);
                assert!(
                    (mean - f64::from(x)).abs() < spacing * 0.02,
                    "{p:?} {x}: mean {mean}, neighbours {lo} {hi}"
                );
            }
            assert_eq!(p.round_stochastic(0.5, 12345), 0.5);
        }
    }

    #[test]
    fn small_updates_survive_in_expectation() {
        // A bf16 weight at 0.05 has a last place of 2^-12 ~ 2.4e-4; a thousand updates of -1e-5 move it by
        // -0.01 in f32, and by about as much through stochastic rounding (to nearest: not at all).
        let p = RowPrecision::Bf16;
        let (mut sr, mut rn, mut exact) = (0.05f32, 0.05f32, 0.05f64);
        for k in 0..1000u64 {
            sr = p.round_stochastic(sr - 1e-5, rounding_bits(0, k, 0, sr - 1e-5));
            rn = p.round_nearest(rn - 1e-5);
            exact -= 1e-5;
        }
        assert_eq!(rn, p.round_nearest(0.05));
        assert!((f64::from(sr) - exact).abs() < 2e-3, "{sr} vs {exact}");
    }
}
