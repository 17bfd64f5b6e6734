//! Publish-time pruning ([`crate::ExportPrune`]): which rows of a table an export leaves out, chosen from what
//! the table keeps per row in memory (last-update stamps with a TTL, update counts with an LFU cap, scores with a
//! score cap).

use super::expire::{stamp_of, STAMP_UNKNOWN};
use super::stripe::hash;
use super::Table;
use crate::{EvictionPolicy, ExportPrune};

impl Table {
    /// Whether the table keeps a last-update stamp per row (it has a TTL).
    pub fn keeps_stamps(&self) -> bool {
        self.ttl.is_some()
    }

    /// Whether the table keeps an update count per row (it has an LFU row cap).
    pub fn keeps_counts(&self) -> bool {
        self.eviction()
            .is_some_and(|e| e.policy == EvictionPolicy::Lfu)
    }

    /// Whether the table keeps a score per row (it has a score row cap).
    pub fn keeps_scores(&self) -> bool {
        self.eviction()
            .is_some_and(|e| e.policy == EvictionPolicy::Score)
    }

    /// Ids of the rows in memory that an export pruned by `prune` leaves out at `now` (seconds), in no order:
    /// untouched for `max_age_secs` (if the table keeps stamps; a row recovered since the last expiry pass has
    /// no known stamp and stays), counted fewer than `min_count` updates (if it keeps counts), or scored below
    /// `min_score` (if it keeps scores).
    pub fn pruned(&self, prune: &ExportPrune, now: u64) -> Vec<u64> {
        let age = prune.max_age_secs.filter(|_| self.keeps_stamps());
        let count = prune.min_count.filter(|_| self.keeps_counts());
        let score = prune.min_score.filter(|_| self.keeps_scores());
        if age.is_none() && count.is_none() && score.is_none() {
            return Vec::new();
        }
        let now = stamp_of(now);
        let mut out = Vec::new();
        for p in self.stripes.iter() {
            let stripe = p.0.lock();
            for slot in 0..stripe.arena.slots() {
                let id = stripe.arena.id(slot);
                // A free slot keeps its old id, which the index maps elsewhere or nowhere.
                if stripe.find(id, hash(id)) != Some(slot) {
                    continue;
                }
                let old = age.is_some_and(|a| {
                    let stamp = stripe.arena.stamp(slot);
                    stamp != STAMP_UNKNOWN && u64::from(now.saturating_sub(stamp)) >= a
                });
                let rare = count.is_some_and(|c| stripe.arena.count(slot) < c);
                let low = score.is_some_and(|s| f32::from_bits(stripe.arena.count(slot)) < s);
                if old || rare || low {
                    out.push(id);
                }
            }
        }
        out
    }
}
