//! A table's row cap ([`crate::EvictionConfig`], issue 43): past `max_rows` (or the rows `max_bytes` holds), the
//! least frequently updated rows (LFU), or the lowest scored ([`crate::EvictionPolicy::Score`]), are deleted,
//! from the store and from memory, at each expiry pass ([`crate::Engine::expire`]).
//!
//! # Counts and decay
//! Each row of a capped table keeps a `u32` update count beside its slot (4 bytes per row, `arena.rs`): one per
//! update the table applies ([`Table::apply_scaled`]) or takes from its primary ([`Table::store_rows`]). A new
//! row starts at 0 and its creating update makes it 1. Every `decay_secs` of the clock passed to
//! [`Table::over_cap`], every count halves, so an id that was hot an hour ago and is cold now loses to one that
//! is warm now (LFU with aging, as Redis' `allkeys-lfu` and TinyLFU's reset). Rows recovered from the store
//! restart at 0 (counts are not persisted), like TTL stamps.
//!
//! # Scores
//! A table with the `score` policy keeps, in the same 4 bytes, the bits of a score the trainer gives
//! ([`Table::score`]: added or set; finite and `>= 0`, so the bits order as the values do and the choice below
//! is the same code for both policies). Updates do not change it; a new row starts at 0; decay halves it. Ids
//! without a row in memory are not scored (the score of a row to come is not kept).
//!
//! # Which rows go
//! The `len - cap` rows with the lowest `(count, splitmix64(id))`: the hash breaks ties without favouring low
//! ids. A row updated between the choice and its removal ([`Table::remove_capped`]) stays (its count grew; it is
//! dirty, so the next flush writes it back to the store the pass deleted it from), like a TTL row revived.

use std::sync::atomic::{AtomicU64, Ordering};

use super::stripe::{group_by_stripe, hash};
use super::Table;
use crate::config::{EvictionConfig, EvictionPolicy, ScoreMode};
use crate::error::EmbeddingError;

/// Index buckets (4 bytes at a load of 0.57 to 0.85) and the dirty and reference bits of a row, on average
/// (`sizing.rs` replays the exact growth; 6.5 to 7.1 bytes measured there).
const INDEX_BYTES_PER_ROW: f64 = 7.0;

/// The cap of a table and when its counts last halved.
#[derive(Debug)]
pub(super) struct Cap {
    pub(super) cfg: EvictionConfig,
    /// The clock (seconds) of the last halving; `u64::MAX` before the first [`Table::over_cap`].
    last_decay: AtomicU64,
}

impl Cap {
    pub(super) fn new(cfg: EvictionConfig) -> Cap {
        Cap {
            cfg,
            last_decay: AtomicU64::new(u64::MAX),
        }
    }

    /// How many times the counts halve at `now`, recording it.
    fn halvings(&self, now: u64) -> u32 {
        let Some(every) = self.cfg.decay_secs else {
            return 0;
        };
        let last = self.last_decay.load(Ordering::Relaxed);
        if last == u64::MAX || now < last {
            self.last_decay.store(now, Ordering::Relaxed);
            return 0;
        }
        let periods = (now - last) / every;
        if periods > 0 {
            self.last_decay
                .store(last + periods * every, Ordering::Relaxed);
        }
        periods.min(32) as u32
    }
}

impl Table {
    /// The table's row cap, if it has one.
    pub fn eviction(&self) -> Option<EvictionConfig> {
        self.cap.as_ref().map(|c| c.cfg)
    }

    /// The rows the cap allows: `max_rows`, or the rows `max_bytes` holds, whichever is smaller. `None` without a
    /// cap. Bytes per row are the layout's (the packed row, its 8-byte id, the 4-byte count, a TTL stamp, and
    /// [`INDEX_BYTES_PER_ROW`] for the index and bitsets), not the allocation's: deleted rows' slots stay
    /// allocated for the rows that come next, so [`Table::memory_bytes`] does not fall as rows go, and a cap
    /// computed from it would shrink pass after pass.
    pub fn cap_rows(&self) -> Option<u64> {
        let cfg = self.cap.as_ref()?.cfg;
        let by_bytes = cfg.max_bytes.map(|b| {
            let stamp = if self.ttl.is_some() { 4 } else { 0 };
            let per_row = (self.codec.bytes() + 8 + 4 + stamp) as f64 + INDEX_BYTES_PER_ROW;
            (b as f64 / per_row) as u64
        });
        match (cfg.max_rows, by_bytes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The rows to delete to bring the table within its cap at clock `now` (seconds), with their counts at the
    /// time: the lowest `(count, hash)` first ("Which rows go"); empty without a cap or within it. Halves
    /// the counts first if `decay_secs` passed since the last halving. Rows pinned by a prefetch are never
    /// chosen.
    ///
    /// Call order ([`crate::Engine::expire`]): `over_cap`, delete the ids from the store, `remove_capped`.
    pub fn over_cap(&self, now: u64) -> Vec<(u64, u32)> {
        let Some(cap) = &self.cap else {
            return Vec::new();
        };
        let halvings = cap.halvings(now);
        if halvings > 0 {
            for p in self.stripes.iter() {
                let mut stripe = p.0.lock();
                for _ in 0..halvings {
                    stripe.arena.halve_counts();
                }
            }
        }
        let limit = self.cap_rows().unwrap_or(u64::MAX) as usize;
        if self.len() <= limit {
            return Vec::new();
        }
        let mut rows: Vec<(u32, u64, u64)> = Vec::with_capacity(self.len());
        for p in self.stripes.iter() {
            let stripe = p.0.lock();
            for slot in 0..stripe.arena.slots() {
                let id = stripe.arena.id(slot);
                // A free slot keeps its old id, which the index maps elsewhere or nowhere.
                if stripe.find(id, hash(id)) != Some(slot) || stripe.is_pinned(id) {
                    continue;
                }
                rows.push((stripe.arena.count(slot), hash(id), id));
            }
        }
        let excess = rows.len().saturating_sub(limit);
        if excess == 0 {
            return Vec::new();
        }
        if excess < rows.len() {
            rows.select_nth_unstable_by_key(excess - 1, |&(c, h, _)| (c, h));
        }
        rows[..excess].iter().map(|&(c, _, id)| (id, c)).collect()
    }

    /// Gives the rows of `ids` the scores `scores` (one each, finite and `>= 0`), added to their scores or
    /// replacing them (`mode`), and returns how many ids had a row in memory (the others are not scored). A
    /// table without the `score` policy, a length mismatch, or a negative or non-finite score is refused
    /// (naming the id and value) before any row changes.
    pub fn score(
        &self,
        ids: &[u64],
        scores: &[f32],
        mode: ScoreMode,
    ) -> Result<usize, EmbeddingError> {
        let table = self.cfg.id;
        match self.cap.as_ref().map(|c| c.cfg.policy) {
            Some(EvictionPolicy::Score) => {}
            other => {
                let policy = if other.is_some() { "lfu" } else { "none" };
                return Err(EmbeddingError::NotScored { table, policy });
            }
        }
        if ids.len() != scores.len() {
            return Err(EmbeddingError::WrongLength {
                table,
                what: "scores",
                len: scores.len(),
                expected: ids.len(),
                ids: ids.len(),
                dim: 1,
            });
        }
        if let Some(i) = scores.iter().position(|s| !(s.is_finite() && *s >= 0.0)) {
            return Err(EmbeddingError::BadScore {
                table,
                id: ids[i],
                score: scores[i],
            });
        }
        let set = mode == ScoreMode::Set;
        let (order, bounds) = group_by_stripe(ids);
        let mut found = 0;
        // The closure never fails.
        let _ = self.for_each_group(&order, &bounds, |_, stripe, group| {
            for &i in group {
                let id = ids[i];
                if let Some(slot) = stripe.find(id, hash(id)) {
                    // `-0.0` would sort above every positive score as bits.
                    stripe.arena.score(slot, scores[i] + 0.0, set);
                    found += 1;
                }
            }
            Ok(())
        });
        Ok(found)
    }

    /// Deletes the rows of `victims` (from [`Table::over_cap`]) whose count has not grown since (a row updated
    /// meanwhile stays), and returns how many were deleted. Their slots are reused by later rows; dirty changes
    /// are dropped.
    pub fn remove_capped(&self, victims: &[(u64, u32)]) -> usize {
        let ids: Vec<u64> = victims.iter().map(|v| v.0).collect();
        let (order, bounds) = group_by_stripe(&ids);
        let mut removed = 0;
        // The closure never fails.
        let _ = self.for_each_group(&order, &bounds, |_, stripe, group| {
            for &i in group {
                let (id, count) = victims[i];
                let h = hash(id);
                if let Some(slot) = stripe.find(id, h) {
                    if stripe.arena.count(slot) <= count {
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
