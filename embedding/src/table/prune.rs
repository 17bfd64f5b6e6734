//! Publish-time pruning ([`crate::ExportPrune`]): which rows of a table an export leaves out, chosen from what
//! the table keeps per row in memory (last-update stamps with a TTL, update counts with a cap).

use super::expire::{stamp_of, STAMP_UNKNOWN};
use super::stripe::hash;
use super::Table;
use crate::ExportPrune;

impl Table {
    /// Whether the table keeps a last-update stamp per row (it has a TTL).
    pub fn keeps_stamps(&self) -> bool {
        self.ttl.is_some()
    }

    /// Whether the table keeps an update count per row (it has a row cap).
    pub fn keeps_counts(&self) -> bool {
        self.cap.is_some()
    }

    /// Ids of the rows in memory that an export pruned by `prune` leaves out at `now` (seconds), in no order:
    /// untouched for `max_age_secs` (if the table keeps stamps; a row recovered since the last expiry pass has
    /// no known stamp and stays), or counted fewer than `min_count` updates (if it keeps counts).
    pub fn pruned(&self, prune: &ExportPrune, now: u64) -> Vec<u64> {
        let age = prune.max_age_secs.filter(|_| self.keeps_stamps());
        let count = prune.min_count.filter(|_| self.keeps_counts());
        if age.is_none() && count.is_none() {
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
                if old || rare {
                    out.push(id);
                }
            }
        }
        out
    }
}
