//! Lookahead prefetch into the capacity tier ([`Table::prefetch`]): rows a batch will pull are read back from
//! the store before the pull arrives, and pinned so that no eviction drops them before their pull and push
//! have passed ([`Table::unpin`]). Who holds a pin and for how long is the engine's business
//! ([`crate::Engine::prefetch`], leases); a table only counts pins per id.
//!
//! Pins are bounded: at most [`Tier::pin_limit`] rows (half the budget) are pinned at once, so eviction can
//! always bring the table back to its budget; ids past the limit are still read back, only not pinned.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::stripe::{group_by_stripe, hash, stripe_of};
use super::Table;
use crate::error::EmbeddingError;

/// What [`Table::prefetch`] did, in distinct ids. Part of a prefetch's answer on the wire ([`crate::LeaseStats`]):
/// bincode writes the fields by position (a `usize` as a `u64`), so new fields go last.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchStats {
    /// Ids whose rows were in memory already (every id, duplicates included and not looked up, of a table
    /// that never evicted a row).
    pub resident: usize,
    /// Rows this prefetch read back from the store.
    pub read_back: usize,
    /// Rows another call was reading back; this prefetch waited for them.
    pub waited: usize,
    /// Ids with no row in memory or in the store (never pushed, or rejected by admission).
    pub absent: usize,
    /// Rows pinned by this call.
    pub pinned: usize,
    /// Rows in memory but not pinned: the table's pin limit was reached.
    pub over_pin_limit: usize,
    /// Ids of a table without a memory budget: nothing to do.
    pub untiered: usize,
}

impl std::ops::AddAssign for PrefetchStats {
    fn add_assign(&mut self, o: PrefetchStats) {
        self.resident += o.resident;
        self.read_back += o.read_back;
        self.waited += o.waited;
        self.absent += o.absent;
        self.pinned += o.pinned;
        self.over_pin_limit += o.over_pin_limit;
        self.untiered += o.untiered;
    }
}

impl Table {
    /// Most rows the table pins at once (half its memory budget); 0 without a budget.
    pub fn pin_limit(&self) -> usize {
        self.tier.as_ref().map_or(0, |t| t.pin_limit())
    }

    /// Rows pinned now (0 without a budget).
    pub fn pinned_rows(&self) -> usize {
        self.tier
            .as_ref()
            .map_or(0, |t| t.pinned.load(Ordering::Relaxed))
    }

    /// Refuses a prefetch of more distinct ids than [`Table::pin_limit`] with
    /// [`EmbeddingError::PrefetchTooLarge`] (tables without a budget take any prefetch).
    pub fn check_prefetch(&self, ids: &[u64]) -> Result<(), EmbeddingError> {
        let limit = self.pin_limit();
        if limit == 0 || ids.len() <= limit {
            return Ok(());
        }
        let mut distinct = ids.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() > limit {
            return Err(EmbeddingError::PrefetchTooLarge {
                table: self.cfg.id,
                ids: distinct.len(),
                limit,
            });
        }
        Ok(())
    }

    /// Whether a prefetch pinned the row of `id`.
    pub fn is_pinned(&self, id: u64) -> bool {
        self.tier.is_some() && self.stripes[stripe_of(hash(id))].0.lock().is_pinned(id)
    }

    /// Brings the rows of `ids` that live only in the store into memory (one batched read, or a wait for a
    /// read already under way) and pins them, appending the pinned ids to `pinned` (each distinct id once;
    /// release them with [`Table::unpin`]). Rows already in memory get their CLOCK reference bit instead of a
    /// pin (a second chance is enough for the few batches until their pull: a pin costs a hash-map entry per
    /// row, and most of a batch's rows are resident); ids with no stored row are counted absent (and recorded
    /// in the negative cache, so their pull and push skip the store). A table without a memory budget does
    /// nothing ([`PrefetchStats::untiered`]). More distinct ids than [`Table::pin_limit`] is a
    /// [`EmbeddingError::PrefetchTooLarge`], refused before anything is read.
    pub fn prefetch(
        &self,
        ids: &[u64],
        pinned: &mut Vec<u64>,
    ) -> Result<PrefetchStats, EmbeddingError> {
        let mut stats = PrefetchStats::default();
        let Some(tier) = &self.tier else {
            stats.untiered = ids.len();
            return Ok(stats);
        };
        self.check_prefetch(ids)?;
        if !self.spilled() {
            // Nothing was ever evicted: every id is in memory or has no row at all, and nothing can be read
            // back. Counted resident without looking them up (the lookups would cost as much as the pull's).
            stats.resident = ids.len();
            return Ok(stats);
        }
        let mut uniq = ids.to_vec();
        uniq.sort_unstable();
        uniq.dedup();
        let limit = tier.pin_limit();
        let _gate = tier.gate.read();
        let (order, bounds) = group_by_stripe(&uniq);
        let (mut to_read, mut known_absent) = (Vec::new(), 0);
        self.for_each_group(&order, &bounds, |_, stripe, group| {
            stripe.lookup_each(&uniq, group, |stripe, i, slot| match slot {
                // Resident rows only get their reference bit: a CLOCK sweep passes them once more.
                Some(slot) => stripe.set_ref(slot),
                None if stripe.known_absent(uniq[i]) => known_absent += 1,
                None => to_read.push(i),
            });
            Ok(())
        })?;
        stats.resident = uniq.len() - to_read.len() - known_absent;
        stats.absent = known_absent;
        if to_read.is_empty() {
            stats.absent += to_read.len();
            return Ok(stats);
        }
        let read = self.read_back(&uniq, &to_read)?;
        stats.read_back = read.inserted;
        stats.waited = read.waited;
        // Pin the rows this prefetch brought in (or waited for): the ones eviction would find coldest.
        let wanted: Vec<u64> = to_read.iter().map(|&i| uniq[i]).collect();
        let (order, bounds) = group_by_stripe(&wanted);
        self.for_each_group(&order, &bounds, |_, stripe, group| {
            for &k in group {
                let id = wanted[k];
                if stripe.find(id, hash(id)).is_none() {
                    stats.absent += 1;
                    continue;
                }
                let count = stripe.pins.entry(id).or_insert(0);
                if *count == 0 {
                    if tier.pinned.load(Ordering::Relaxed) >= limit {
                        stripe.pins.remove(&id);
                        stats.over_pin_limit += 1;
                        continue;
                    }
                    tier.pinned.fetch_add(1, Ordering::Relaxed);
                }
                *count += 1;
                pinned.push(id);
                stats.pinned += 1;
            }
            Ok(())
        })?;
        Ok(stats)
    }

    /// Releases one pin of each id of `ids` (as [`Table::prefetch`] returned them); a row without pins may be
    /// evicted again. Ids without a pin are ignored.
    pub fn unpin(&self, ids: &[u64]) {
        let Some(tier) = &self.tier else {
            return;
        };
        let (order, bounds) = group_by_stripe(ids);
        let mut released = 0;
        let _ = self.for_each_group(&order, &bounds, |_, stripe, group| {
            for &i in group {
                let id = ids[i];
                if let Some(count) = stripe.pins.get_mut(&id) {
                    *count -= 1;
                    if *count == 0 {
                        stripe.pins.remove(&id);
                        released += 1;
                    }
                }
            }
            Ok(())
        });
        tier.pinned.fetch_sub(released, Ordering::Relaxed);
    }
}
