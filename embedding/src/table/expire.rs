//! TTL expiry of a [`Table`]'s rows: finding rows untouched for `ttl_secs` and deleting them (see the
//! "Admission and TTL" section of the table module).

use std::sync::atomic::Ordering;

use super::stripe::{group_by_stripe, hash};
use super::Table;

/// Stamp of a row whose last touch is unknown (recovered from the store, which keeps no times): the next
/// [`Table::expired`] sets it to its `now`, so recovered rows get a full TTL after a restart.
pub(super) const STAMP_UNKNOWN: u32 = u32::MAX;

/// The stamp of time `now` (seconds), saturating below [`STAMP_UNKNOWN`].
#[inline]
pub(super) fn stamp_of(now: u64) -> u32 {
    now.min(u64::from(STAMP_UNKNOWN - 1)) as u32
}

impl Table {
    /// The TTL in seconds, if the table has one.
    pub fn ttl_secs(&self) -> Option<u64> {
        self.ttl.map(u64::from)
    }

    /// Whether a row stamped `stamp` is expired at `now` (its age reached the TTL).
    #[inline]
    fn is_expired(ttl: u32, stamp: u32, now: u32) -> bool {
        stamp != STAMP_UNKNOWN && now.saturating_sub(stamp) >= ttl
    }

    /// Ids of the rows untouched for at least `ttl_secs` at `now` (seconds), in no particular order; empty if
    /// the table has no TTL. Advances the logical clock to `now`, and starts the TTL of rows recovered from
    /// the store (unknown last touch) at `now`. Rows stay until [`Table::remove_expired`].
    ///
    /// Call order ([`crate::Engine::expire`]): `expired`, delete the ids from the store, `remove_expired`.
    pub fn expired(&self, now: u64) -> Vec<u64> {
        let Some(ttl) = self.ttl else {
            return Vec::new();
        };
        self.advance_clock(now);
        let now = stamp_of(now);
        let mut out = Vec::new();
        for p in self.stripes.iter() {
            let mut stripe = p.0.lock();
            for slot in 0..stripe.arena.slots() {
                // A free slot keeps its old id, which the index maps to another slot or to nothing: the
                // lookup skips free slots without a free-slot bitmap.
                let id = stripe.arena.id(slot);
                if stripe.find(id, hash(id)) != Some(slot) {
                    continue;
                }
                let stamp = stripe.arena.stamp(slot);
                if stamp == STAMP_UNKNOWN {
                    stripe.arena.set_stamp(slot, now);
                } else if Self::is_expired(ttl, stamp, now) {
                    out.push(id);
                }
            }
        }
        out
    }

    /// Deletes the rows of `ids` that are still expired at `now` (a row touched since [`Table::expired`] stays)
    /// and returns how many were deleted. Their slots are reused by later rows; dirty changes are dropped.
    pub fn remove_expired(&self, ids: &[u64], now: u64) -> usize {
        let Some(ttl) = self.ttl else {
            return 0;
        };
        let now = stamp_of(now);
        let (order, bounds) = group_by_stripe(ids);
        let mut removed = 0;
        // The closure never fails.
        let _ = self.for_each_group(&order, &bounds, |_, stripe, group| {
            for &i in group {
                let id = ids[i];
                let h = hash(id);
                if let Some(slot) = stripe.find(id, h) {
                    if Self::is_expired(ttl, stripe.arena.stamp(slot), now) {
                        stripe.remove(id, h, slot);
                        removed += 1;
                    }
                }
            }
            Ok(())
        });
        self.rows.fetch_sub(removed, Ordering::Relaxed);
        removed
    }
}
