//! [`Sketch`]: the count-min-sketch frequency filter of a table's admission (DESIGN.md, "Admission and
//! eviction": "an id gets a row after k sightings").
//!
//! `depth` rows of `width` `AtomicU32` counters; an id increments one counter per row (chosen by a seeded
//! splitmix64 hash) and its estimated count is the minimum of its counters. Counters only grow (saturating at
//! `u32::MAX`), and every push of an id increments all of its counters, so the estimate never undercounts:
//! an id pushed `k` times is admitted at its `k`-th push at the latest. Collisions can only overcount, which
//! admits some ids early. Memory is `width x depth x 4` bytes per table.
//!
//! Sans-IO and lock-free: increments are relaxed atomic read-modify-writes, so the sketch is shared by all
//! stripes of a table without a lock of its own. Counts are never decayed (an id expired by TTL and pushed
//! again is admitted at once); aging the sketch is a later step.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::config::AdmissionConfig;
use base::hash::splitmix64;

/// A count-min sketch with `depth` rows of `width` saturating counters.
#[derive(Debug)]
pub struct Sketch {
    width: usize,
    depth: usize,
    counters: Box<[AtomicU32]>,
}

/// Per-row hash seeds (odd constants; row `r` hashes `id ^ SEEDS[r]`).
const SEEDS: [u64; 8] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7345,
    0xa409_3822_299f_31d1,
    0x082e_fa98_ec4e_6c89,
    0x4528_21e6_38d0_1377,
    0xbe54_66cf_34e9_0c6d,
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
];

impl Sketch {
    /// A zeroed sketch of `cfg.width x cfg.depth` counters (`depth <= 8`, checked by
    /// [`crate::TableConfig::validate`]).
    pub fn new(cfg: &AdmissionConfig) -> Self {
        let depth = cfg.depth.clamp(1, SEEDS.len());
        let width = cfg.width.max(1);
        Sketch {
            width,
            depth,
            counters: (0..width * depth).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    #[inline]
    fn cell(&self, row: usize, id: u64) -> &AtomicU32 {
        let h = splitmix64(id ^ SEEDS[row]);
        // Multiply-shift maps the hash onto 0..width without a division.
        let col = ((u128::from(h) * self.width as u128) >> 64) as usize;
        &self.counters[row * self.width + col]
    }

    /// Counts one sighting of `id` and returns its estimated count including this one.
    pub fn increment(&self, id: u64) -> u32 {
        let mut min = u32::MAX;
        for row in 0..self.depth {
            let old = self
                .cell(row, id)
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                    Some(c.saturating_add(1))
                })
                .unwrap_or_else(|c| c);
            min = min.min(old.saturating_add(1));
        }
        min
    }

    /// The estimated count of `id`: never below the number of [`Sketch::increment`] calls for it.
    pub fn estimate(&self, id: u64) -> u32 {
        (0..self.depth)
            .map(|row| self.cell(row, id).load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }

    /// Heap bytes of the counters.
    pub fn memory_bytes(&self) -> usize {
        self.counters.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn sketch(width: usize, depth: usize) -> Sketch {
        Sketch::new(&AdmissionConfig {
            min_count: 1,
            width,
            depth,
        })
    }

    #[test]
    fn counts_and_saturates() {
        let s = sketch(64, 4);
        assert_eq!(s.estimate(5), 0);
        assert_eq!(s.increment(5), 1);
        assert_eq!(s.increment(5), 2);
        assert_eq!(s.estimate(5), 2);
        assert_eq!(s.memory_bytes(), 64 * 4 * 4);
        // One counter: every id shares it; it saturates instead of wrapping.
        let s = sketch(1, 1);
        s.counters[0].store(u32::MAX - 1, Ordering::Relaxed);
        assert_eq!(s.increment(1), u32::MAX);
        assert_eq!(s.increment(2), u32::MAX);
        assert_eq!(s.estimate(3), u32::MAX);
    }

    proptest! {
        /// The estimate is never below the true count, for any id stream and sketch shape (small widths force
        /// collisions).
        #[test]
        fn never_undercounts(
            ids in prop::collection::vec(0u64..64, 0..300),
            width in 1usize..32,
            depth in 1usize..=8,
        ) {
            let s = sketch(width, depth);
            let mut truth: HashMap<u64, u32> = HashMap::new();
            for &id in &ids {
                let est = s.increment(id);
                let t = truth.entry(id).or_default();
                *t += 1;
                prop_assert!(est >= *t, "id {id}: estimate {est} < true count {t}");
            }
            for id in 0..64u64 {
                let t = truth.get(&id).copied().unwrap_or(0);
                prop_assert!(s.estimate(id) >= t);
            }
        }
    }
}
