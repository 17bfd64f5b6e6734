//! Error feedback for lossy gradient pushes: the quantization residual of each row is kept by the sender and
//! added to that row's next push.
//!
//! A row pushed as `v = g + r` (its gradient plus its residual) goes on the wire as `Q(v)`; the sender decodes
//! its own bytes and keeps `r' = v - D(Q(v))`. Over any number of pushes, the decoded values the server applied
//! plus the residual still held equal the sum of the true gradients (up to f32 rounding), so quantization
//! delays part of a gradient instead of losing it (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019,
//! "Error feedback fixes SignSGD").
//!
//! Residuals are stored unscaled: pushes are loss-scaled by a per-batch factor (the trainer multiplies by the
//! batch size), so [`ResidualStore::encode_rows`] takes the scale of the push and converts.
//!
//! # Bounded memory
//! Rows are keyed by (table, id); a residual lives in a fixed-size slot of one arena (no allocation per row
//! once the arena has grown). Two limits, both in [`FeedbackConfig`]:
//! - **Age**: a residual whose row was not pushed for `max_age_steps` steps ([`ResidualStore::end_step`]) is
//!   dropped. Rows are pushed when they occur in a batch, so rare rows lose a residual of at most half a
//!   quantization step per element: a bounded, one-off error.
//! - **Count**: at most `max_rows` residuals are held. When the store is full, rows without a residual yet
//!   are pushed without feedback (their new residual is dropped and counted in
//!   [`FeedbackStats::dropped_full`]); rows already held keep theirs.
//!
//! The age sweep runs every `max_age_steps / 2` steps (at least every step), so it costs O(rows held) per
//! half-age, not per step.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::codec::{decode_rows, encode_rows, Encoding};

/// Limits of a [`ResidualStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedbackConfig {
    /// Residuals of rows not pushed for this many steps are dropped (at least 1).
    pub max_age_steps: u64,
    /// Most residuals held at once.
    pub max_rows: usize,
}

impl Default for FeedbackConfig {
    /// 100 steps and 4M rows (at dim 16 about 340 MB at the cap; the demo holds far fewer).
    fn default() -> Self {
        FeedbackConfig {
            max_age_steps: 100,
            max_rows: 4 << 20,
        }
    }
}

/// Counters of a [`ResidualStore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedbackStats {
    /// Residuals held now.
    pub rows: usize,
    /// Residuals dropped for age so far.
    pub dropped_age: u64,
    /// New residuals not stored because the store was full.
    pub dropped_full: u64,
}

/// Hasher for (table, id) keys whose ids are already well mixed.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 ^= (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v ^ (v >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    }
}

type SlotMap = HashMap<(u32, u64), u32, BuildHasherDefault<KeyHasher>>;

/// Residuals of lossy pushes, per (table, id). Call order: any number of [`ResidualStore::encode_rows`] per
/// step, then [`ResidualStore::end_step`].
pub struct ResidualStore {
    dim: usize,
    cfg: FeedbackConfig,
    slots: SlotMap,
    /// `values[slot * dim..][..dim]`: the residual of a slot.
    values: Vec<f32>,
    /// Key and last step each slot was pushed (for the age sweep).
    owner: Vec<((u32, u64), u64)>,
    free: Vec<u32>,
    step: u64,
    last_sweep: u64,
    stats: FeedbackStats,
    v: Vec<f32>,
    decoded: Vec<f32>,
}

impl ResidualStore {
    /// An empty store for rows of `dim` elements.
    pub fn new(dim: usize, cfg: FeedbackConfig) -> ResidualStore {
        ResidualStore {
            dim,
            cfg: FeedbackConfig {
                max_age_steps: cfg.max_age_steps.max(1),
                ..cfg
            },
            slots: SlotMap::default(),
            values: Vec::new(),
            owner: Vec::new(),
            free: Vec::new(),
            step: 0,
            last_sweep: 0,
            stats: FeedbackStats::default(),
            v: vec![0.0; dim],
            decoded: vec![0.0; dim],
        }
    }

    /// Row dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Counters.
    pub fn stats(&self) -> FeedbackStats {
        FeedbackStats {
            rows: self.slots.len(),
            ..self.stats
        }
    }

    /// The residual held for a row (unscaled), if any.
    pub fn residual(&self, table: u32, id: u64) -> Option<&[f32]> {
        let s = *self.slots.get(&(table, id))? as usize;
        Some(&self.values[s * self.dim..][..self.dim])
    }

    /// Appends the rows of `grads` (row `i` is the gradient of `ids[i]`, already multiplied by `scale`) to `out`
    /// encoded as `enc`, each with its residual added, and keeps the new residuals. Lossless encodings pass
    /// through without touching the store.
    pub fn encode_rows(
        &mut self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
        scale: f32,
        enc: Encoding,
        out: &mut Vec<u8>,
    ) {
        let dim = self.dim;
        debug_assert_eq!(ids.len() * dim, grads.len());
        if !enc.is_lossy() || dim == 0 {
            encode_rows(grads, dim, enc, out);
            return;
        }
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let width = enc.row_bytes(dim);
        for (&id, g) in ids.iter().zip(grads.chunks_exact(dim)) {
            let slot = self.slots.get(&(table, id)).copied();
            match slot {
                Some(s) => {
                    let r = &self.values[s as usize * dim..][..dim];
                    for ((v, g), r) in self.v.iter_mut().zip(g).zip(r) {
                        *v = g + r * scale;
                    }
                }
                None => self.v.copy_from_slice(g),
            }
            let at = out.len();
            encode_rows(&self.v, dim, enc, out);
            decode_rows(&out[at..at + width], dim, enc, &mut self.decoded)
                .expect("a row just encoded decodes");
            let slot = match slot {
                Some(s) => Some(s),
                // Exact rows need no residual: keep the store to rows that carry one.
                None if self.v == self.decoded => None,
                None => self.allocate(table, id),
            };
            if let Some(s) = slot {
                self.owner[s as usize].1 = self.step;
                let r = &mut self.values[s as usize * dim..][..dim];
                for ((r, v), d) in r.iter_mut().zip(&self.v).zip(&self.decoded) {
                    // A non-finite gradient is refused by the server; do not carry it forward.
                    let e = (v - d) * inv;
                    *r = if e.is_finite() { e } else { 0.0 };
                }
            }
        }
    }

    fn allocate(&mut self, table: u32, id: u64) -> Option<u32> {
        if self.slots.len() >= self.cfg.max_rows {
            self.stats.dropped_full += 1;
            return None;
        }
        let s = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = self.owner.len() as u32;
                self.owner.push(((table, id), 0));
                self.values.resize(self.values.len() + self.dim, 0.0);
                s
            }
        };
        self.owner[s as usize].0 = (table, id);
        self.slots.insert((table, id), s);
        Some(s)
    }

    /// Ends a step: advances the step counter and, every half-age, drops residuals older than the age limit.
    pub fn end_step(&mut self) {
        self.step += 1;
        let half = (self.cfg.max_age_steps / 2).max(1);
        if self.step - self.last_sweep < half {
            return;
        }
        self.last_sweep = self.step;
        let (max_age, step, dim) = (self.cfg.max_age_steps, self.step, self.dim);
        let (owner, values, free, stats) = (
            &self.owner,
            &mut self.values,
            &mut self.free,
            &mut self.stats,
        );
        self.slots.retain(|_, s| {
            let keep = step - owner[*s as usize].1 < max_age;
            if !keep {
                values[*s as usize * dim..][..dim].fill(0.0);
                free.push(*s);
                stats.dropped_age += 1;
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(bytes: &[u8], n: usize, dim: usize, enc: Encoding) -> Vec<f32> {
        let mut out = vec![0.0; n * dim];
        decode_rows(bytes, dim, enc, &mut out).unwrap();
        out
    }

    proptest! {
        /// Sum of the applied (decoded, unscaled) pushes plus the final residual equals the sum of the true
        /// gradients, for every lossy encoding and changing loss scales.
        #[test]
        fn pushed_plus_residual_equals_true_sum(
            steps in proptest::collection::vec(
                (proptest::collection::vec(-1.0f32..1.0, 12), 1u32..5, proptest::bool::ANY), 1..30),
            enc_i in 1usize..4,
        ) {
            let enc = Encoding::ALL[enc_i];
            let dim = 4;
            let mut store = ResidualStore::new(dim, FeedbackConfig { max_age_steps: 1000, max_rows: 100 });
            let ids = [3u64, 9, 11];
            let mut truth = [0.0f64; 12];
            let mut applied = [0.0f64; 12];
            for (g, scale_pow, tiny) in &steps {
                // Some steps carry tiny gradients that f16 and int8 round away without feedback.
                let g: Vec<f32> = g.iter().map(|x| if *tiny { x * 1e-4 } else { *x }).collect();
                let scale = (1u32 << (3 * scale_pow)) as f32;
                let scaled: Vec<f32> = g.iter().map(|x| x * scale).collect();
                let mut bytes = Vec::new();
                store.encode_rows(1, &ids, &scaled, scale, enc, &mut bytes);
                let d = decode_all(&bytes, 3, dim, enc);
                for i in 0..12 {
                    truth[i] += g[i] as f64;
                    applied[i] += (d[i] / scale) as f64;
                }
                store.end_step();
            }
            for (i, &id) in ids.iter().enumerate() {
                let r = store.residual(1, id).map(|r| r.to_vec()).unwrap_or(vec![0.0; dim]);
                for (e, r) in r.iter().enumerate() {
                    let k = i * dim + e;
                    let err = (applied[k] + *r as f64 - truth[k]).abs();
                    prop_assert!(err <= 1e-5 * (1.0 + steps.len() as f64), "{:?} element {}: {}", enc, k, err);
                }
            }
        }
    }

    #[test]
    fn feedback_recovers_what_int8_rounds_away() {
        // A row whose second element is far below the int8 step: without feedback it is never applied.
        let mut store = ResidualStore::new(2, FeedbackConfig::default());
        let mut sum = 0.0;
        for _ in 0..1000 {
            let mut b = Vec::new();
            store.encode_rows(0, &[1], &[1.0, 0.001], 1.0, Encoding::Int8, &mut b);
            sum += decode_all(&b, 1, 2, Encoding::Int8)[1];
        }
        assert!((sum - 1.0).abs() < 0.01, "{sum}");
    }

    #[test]
    fn lossless_rows_and_exact_rows_keep_no_residual() {
        let mut store = ResidualStore::new(2, FeedbackConfig::default());
        let mut b = Vec::new();
        store.encode_rows(
            0,
            &[1, 2],
            &[0.1, 0.2, 0.3, 0.4],
            1.0,
            Encoding::F32,
            &mut b,
        );
        store.encode_rows(0, &[3], &[1.0, 0.5], 1.0, Encoding::F16, &mut b);
        assert_eq!(b.len(), 16 + 4);
        assert_eq!(store.stats().rows, 0);
        store.encode_rows(0, &[4], &[0.1, 0.3], 1.0, Encoding::F16, &mut b);
        assert_eq!(store.stats().rows, 1);
        assert!(store.residual(0, 4).is_some() && store.residual(1, 4).is_none());
    }

    #[test]
    fn old_residuals_are_dropped_and_the_cap_holds() {
        let cfg = FeedbackConfig {
            max_age_steps: 4,
            max_rows: 3,
        };
        let mut store = ResidualStore::new(1, cfg);
        let mut b = Vec::new();
        store.encode_rows(
            0,
            &[1, 2, 3, 4],
            &[0.1, 0.1, 0.1, 0.1],
            1.0,
            Encoding::F16,
            &mut b,
        );
        assert_eq!(store.stats().rows, 3);
        assert_eq!(store.stats().dropped_full, 1);
        for step in 0..6 {
            // Row 1 keeps being pushed; rows 2 and 3 age out after 4 steps.
            store.encode_rows(0, &[1], &[0.1], 1.0, Encoding::F16, &mut b);
            store.end_step();
            let held = store.stats().rows;
            assert!(held == 3 || (step >= 3 && held == 1), "step {step}: {held}");
        }
        assert_eq!(store.stats().rows, 1);
        assert_eq!(store.stats().dropped_age, 2);
        // Freed slots are reused.
        store.encode_rows(0, &[7, 8], &[0.1, 0.1], 1.0, Encoding::F16, &mut b);
        assert_eq!(store.stats().rows, 3);
        assert_eq!(store.owner.len(), 3);
    }

    #[test]
    fn nonfinite_gradients_leave_no_residual_behind() {
        let mut store = ResidualStore::new(2, FeedbackConfig::default());
        let mut b = Vec::new();
        store.encode_rows(0, &[1], &[f32::NAN, 0.3], 1.0, Encoding::Int8, &mut b);
        let r = store.residual(0, 1).unwrap();
        assert!(r.iter().all(|x| x.is_finite()), "{r:?}");
    }
}
