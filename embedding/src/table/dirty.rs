//! Write-back of a [`Table`]'s dirty rows: counting, taking and copying them for the store, and giving them
//! back after a failed write ([`crate::Engine::flush_dirty`], [`crate::Engine::persist`]). The dirty bits live
//! in each stripe (`stripe.rs`).

use std::sync::atomic::Ordering;

use super::stripe::{group_by_stripe, hash, stripe_of};
use super::{Table, STRIPES};
use crate::batch::DirtyBatch;

impl Table {
    /// Rows updated since they were last taken by [`Table::take_dirty`].
    pub fn dirty_len(&self) -> usize {
        self.stripes.iter().map(|p| p.0.lock().dirty_count).sum()
    }

    /// Moves up to `max_rows` dirty rows (id + full stored row as little-endian bytes) into `out`, which is emptied
    /// first, and clears their dirty flags. Each stripe lock is held only while its rows are copied. Returns the
    /// number of rows taken; 0 means nothing is dirty.
    ///
    /// Call order: take, write to the store, and on a failed write give the rows back with
    /// [`Table::mark_dirty`]. Takes for one table must not run concurrently with each other if their writes
    /// can reorder (the engine serializes flushes), or an older copy could overwrite a newer one in the store.
    pub fn take_dirty(&self, max_rows: usize, out: &mut DirtyBatch) -> usize {
        out.reset(self.codec.bytes());
        let start = self.dirty_cursor.load(Ordering::Relaxed);
        let mut last = start;
        for k in 0..STRIPES {
            if out.len() >= max_rows {
                break;
            }
            let s = (start + k) % STRIPES;
            last = s;
            let mut stripe = self.stripes[s].0.lock();
            if stripe.dirty_count > 0 {
                stripe.drain_dirty(max_rows - out.len(), out);
            }
        }
        self.dirty_cursor.store(last, Ordering::Relaxed);
        out.len()
    }

    /// Clears the dirty flags of up to `max_rows` rows and appends their ids to `out` (in no particular order);
    /// returns how many: the first half of a sorted write-back, whose second copies the rows
    /// ([`Table::copy_rows`]). A row updated in between is copied with its newer value and is dirty again, so
    /// it is written again next time. Same call order as [`Table::take_dirty`] (give the ids back with
    /// [`Table::mark_dirty`] if the write fails).
    pub fn take_dirty_ids(&self, max_rows: usize, out: &mut Vec<u64>) -> usize {
        let start = out.len();
        for stripe in &self.stripes {
            let left = max_rows - (out.len() - start);
            if left == 0 {
                break;
            }
            let mut stripe = stripe.0.lock();
            if stripe.dirty_count > 0 {
                stripe.drain_dirty_ids(left, out);
            }
        }
        out.len() - start
    }

    /// Appends the current full rows (weights then optimizer state) of those `ids` that are in memory to `out`,
    /// which is emptied first, leaving dirty flags alone: for synchronous persistence of a push
    /// ([`crate::Engine::persist`]). Each stripe lock is held only while its rows are copied. Returns the
    /// number of `ids` not in memory (never created, or evicted to the store).
    pub fn copy_rows(&self, ids: &[u64], out: &mut DirtyBatch) -> usize {
        out.reset(self.codec.bytes());
        let (order, bounds) = group_by_stripe(ids);
        let mut missing = 0;
        for s in 0..STRIPES {
            let group = &order[bounds[s]..bounds[s + 1]];
            if group.is_empty() {
                continue;
            }
            let stripe = self.stripes[s].0.lock();
            for &i in group {
                let id = ids[i];
                match stripe.find(id, hash(id)) {
                    Some(slot) => out.push_words(id, stripe.arena.row(slot)),
                    None => missing += 1,
                }
            }
        }
        missing
    }

    /// Marks the rows of `ids` dirty again (those that exist), e.g. after a failed store write.
    pub fn mark_dirty(&self, ids: &[u64]) {
        for &id in ids {
            let h = hash(id);
            let mut stripe = self.stripes[stripe_of(h)].0.lock();
            if let Some(slot) = stripe.find(id, h) {
                stripe.mark_dirty(slot);
            }
        }
    }
}
