//! The capacity tier of a [`Table`] with a memory budget: CLOCK eviction of cold rows to the store and
//! batched read-back on a miss (DESIGN.md, "RocksDB": "past it, cold rows are evicted to RocksDB and read back
//! (batched multi-get) on a miss").
//!
//! # CLOCK
//! Each slot has a reference bit, set by [`Table::gather`] and [`Table::apply`] hits. An eviction sweep moves
//! each stripe's hand over its slots: a set bit is cleared (second chance), a clear bit makes the row a
//! victim. The quota of a stripe is proportional to its rows. No clock is read (STYLE.md, "Sans-IO cores").
//!
//! # Eviction, in two phases ([`crate::Engine::enforce_budget`])
//! 1. [`Table::select_victims`]: marks the table spilled, picks victims, copies the dirty ones into a batch and
//!    clears their dirty bits. Victims stay in memory and readable.
//! 2. The engine writes the batch to the store; on failure it marks the rows dirty again.
//! 3. [`Table::remove_evicted`]: under the gate's write lock, drops each victim still clean (a victim updated
//!    since phase 1 is dirty again and stays). A clean row always has its current copy in the store, so no row
//!    is lost.
//!
//! Read-back holds the gate's read lock from the miss to the insert, so a stale copy read from the store can
//! never be inserted after a newer one was evicted in between.
//!
//! # One read per row
//! Rows being read back are registered in the tier's `loading` set for the duration of the store read. A
//! caller that misses a row another caller is reading (a pull arriving while the prefetch of its batch is
//! still reading) waits for that read instead of reading the row again ([`ReadBack::waited`]); every caller
//! finishes its own reads before it waits, so waits cannot form a cycle.
//!
//! # Negative cache
//! Most misses of a first pass over data are ids that never had a row: a prefetch, then the pull, then the
//! push would each ask the store for them in vain. A read-back that finds no stored row records the id in its
//! stripe's `absent` set (under the stripe lock, only if the row is still not in memory), and later misses of
//! it skip the store. Creating or inserting the row removes it. A row reaches the store only from memory
//! (write-back, eviction), so an id in the set has no stored row; the gate's read lock, held from the miss
//! to the record, keeps an eviction from removing a row created meanwhile before the check. Each stripe's
//! set is cleared when it reaches [`Tier::absent_cap`] (half the budget over all stripes), which bounds its
//! memory to a fraction of the rows'.
//!
//! # Pins
//! Rows a prefetch pinned (`pin.rs`) are never victims: the sweep passes over them like over a set reference
//! bit, without clearing anything.
//!
//! TTL: read-back rows restart their TTL like recovered rows, and rows that live only in the store do not
//! expire (expiry only looks at memory).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use super::expire::STAMP_UNKNOWN;
use super::stripe::{group_by_stripe, hash, stripe_of};
use super::{Table, STRIPES};
use crate::batch::DirtyBatch;
use crate::error::{EmbeddingError, StoreError};
use crate::store::Store;

/// The capacity tier of a table with a memory budget.
pub(super) struct Tier {
    /// Rows the table should keep in memory; [`crate::Engine::enforce_budget`] evicts the excess.
    pub(super) budget: usize,
    pub(super) store: Arc<dyn Store>,
    /// Some rows live only in the store: misses must look there before the initializer. False until the first
    /// eviction (or a recovery that stopped at the budget), so tables that never evicted skip the store.
    pub(super) spilled: AtomicBool,
    /// Read by calls that may read rows back (miss, store read, insert); written by the removal of evicted
    /// rows. Without it a row read back from the store could be inserted after a newer copy was evicted again.
    pub(super) gate: RwLock<()>,
    /// Rows read back from the store, ever.
    pub(super) read_back: AtomicU64,
    /// Stripe where the next eviction sweep starts.
    pub(super) cursor: AtomicUsize,
    /// Ids whose rows some caller is reading back from the store right now ("One read per row").
    pub(super) loading: Mutex<HashSet<u64>>,
    /// Signalled whenever ids leave `loading`.
    pub(super) loaded: Condvar,
    /// Pinned rows over all stripes (`pin.rs`).
    pub(super) pinned: AtomicUsize,
    /// Callers waiting for another caller's read-back now.
    pub(super) waiting: AtomicUsize,
}

impl Tier {
    /// A tier keeping about `budget` rows in memory over `store`.
    pub(super) fn new(budget: u64, store: Arc<dyn Store>) -> Tier {
        Tier {
            budget: budget.clamp(1, usize::MAX as u64) as usize,
            store,
            spilled: AtomicBool::new(false),
            gate: RwLock::new(()),
            read_back: AtomicU64::new(0),
            cursor: AtomicUsize::new(0),
            loading: Mutex::new(HashSet::new()),
            loaded: Condvar::new(),
            pinned: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Most ids a stripe's negative cache holds before it is cleared: half the budget over all stripes.
    pub(super) fn absent_cap(&self) -> usize {
        (self.budget / 2 / super::STRIPES).max(64)
    }

    /// Most rows pinned at once: half the budget, so eviction can always bring the table back to its
    /// budget and pins never grow memory past it.
    pub(super) fn pin_limit(&self) -> usize {
        (self.budget / 2).max(1)
    }
}

/// What one [`Table::read_back`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReadBack {
    /// Rows this call read from the store and inserted.
    pub(super) inserted: usize,
    /// Rows another caller was reading back; this call waited for them.
    pub(super) waited: usize,
}

/// Removes `ids` from the tier's loading set and wakes the waiters, also when a read fails or panics.
struct Loading<'a> {
    tier: &'a Tier,
    ids: Vec<u64>,
}

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut loading = self.tier.loading.lock();
        for id in &self.ids {
            loading.remove(id);
        }
        drop(loading);
        self.tier.loaded.notify_all();
    }
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier")
            .field("budget", &self.budget)
            .field("spilled", &self.spilled)
            .field("read_back", &self.read_back)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// The memory budget in rows, if the table has one.
    pub fn memory_budget_rows(&self) -> Option<u64> {
        self.tier.as_ref().map(|t| t.budget as u64)
    }

    /// Whether some rows may live only in the store (evicted), so misses look there.
    pub fn spilled(&self) -> bool {
        self.tier
            .as_ref()
            .is_some_and(|t| t.spilled.load(Ordering::Acquire))
    }

    /// Rows read back from the store since the table was built.
    pub fn rows_read_back(&self) -> u64 {
        self.tier
            .as_ref()
            .map_or(0, |t| t.read_back.load(Ordering::Relaxed))
    }

    /// Callers waiting right now for rows another caller is reading back ("One read per row").
    pub fn read_back_waiters(&self) -> usize {
        self.tier
            .as_ref()
            .map_or(0, |t| t.waiting.load(Ordering::Relaxed))
    }

    /// Rows in memory past the budget (0 without a budget).
    pub fn rows_over_budget(&self) -> usize {
        self.tier
            .as_ref()
            .map_or(0, |t| self.len().saturating_sub(t.budget))
    }

    /// Whether the table has a memory budget (rows beyond it are evicted to the store and read back).
    pub fn has_budget(&self) -> bool {
        self.tier.is_some()
    }

    /// Marks the table spilled (recovery stopped loading at the budget).
    pub(crate) fn mark_spilled(&self) {
        if let Some(t) = &self.tier {
            t.spilled.store(true, Ordering::Release);
        }
    }

    /// Reads the rows of `ids[i]` for `i` in `misses` from the store (one batched read) and inserts those found
    /// and still absent, clean, with their reference bit set; rows another caller is reading back are waited
    /// for, not read again ("One read per row"). The caller holds the gate's read lock.
    pub(super) fn read_back(
        &self,
        ids: &[u64],
        misses: &[usize],
    ) -> Result<ReadBack, EmbeddingError> {
        let Some(tier) = &self.tier else {
            return Ok(ReadBack::default());
        };
        let mut wanted: Vec<u64> = misses.iter().map(|&i| ids[i]).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut theirs = Vec::new();
        let mut mine = Loading {
            tier,
            ids: Vec::with_capacity(wanted.len()),
        };
        {
            let mut loading = tier.loading.lock();
            for id in wanted {
                if loading.insert(id) {
                    mine.ids.push(id);
                } else {
                    theirs.push(id);
                }
            }
        }
        let inserted = if mine.ids.is_empty() {
            0
        } else {
            self.read_and_insert(tier, &mine.ids)?
        };
        drop(mine);
        if !theirs.is_empty() {
            let mut loading = tier.loading.lock();
            tier.waiting.fetch_add(1, Ordering::Relaxed);
            while theirs.iter().any(|id| loading.contains(id)) {
                tier.loaded.wait(&mut loading);
            }
            tier.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(ReadBack {
            inserted,
            waited: theirs.len(),
        })
    }

    /// The store read and the insert of [`Table::read_back`] for distinct `wanted` ids; returns the rows
    /// inserted.
    fn read_and_insert(&self, tier: &Tier, wanted: &[u64]) -> Result<usize, EmbeddingError> {
        let table = self.cfg.id;
        let words = self.codec.words();
        let mut rows = vec![0u32; wanted.len() * words];
        let mut found = vec![false; wanted.len()];
        tier.store.get_rows(table, wanted, &mut |k, value| {
            if let Some(bytes) = value {
                if bytes.len() != words * 4 {
                    return Err(StoreError::CorruptValue {
                        table,
                        id: wanted[k],
                        len: bytes.len(),
                        expected: words * 4,
                    });
                }
                self.codec
                    .words_from_bytes(bytes, &mut rows[k * words..(k + 1) * words]);
                found[k] = true;
            }
            Ok(())
        })?;
        let (order, bounds) = group_by_stripe(wanted);
        let mut inserted = 0;
        let cap = tier.absent_cap();
        self.for_each_group(&order, &bounds, |s, stripe, group| {
            for &k in group {
                let id = wanted[k];
                let h = hash(id);
                if stripe.find(id, h).is_some() {
                    continue;
                }
                if !found[k] {
                    if stripe.absent.len() >= cap {
                        stripe.absent.clear();
                    }
                    stripe.absent.insert(id);
                    continue;
                }
                let src = &rows[k * words..(k + 1) * words];
                let slot = stripe
                    .insert(id, h, |dst| dst.copy_from_slice(src))
                    .map_err(|rows| self.full(s, rows))?;
                stripe.arena.set_stamp(slot, STAMP_UNKNOWN);
                stripe.set_ref(slot);
                inserted += 1;
            }
            Ok(())
        })?;
        self.rows.fetch_add(inserted, Ordering::Relaxed);
        tier.read_back.fetch_add(inserted as u64, Ordering::Relaxed);
        Ok(inserted)
    }

    /// Copies the first `width` f32s (weights, or weights and state) of the rows of `ids[i]`, `i` in `misses`,
    /// that are in memory (after a read-back) into `out`; returns the indices still missing.
    pub(super) fn copy_found(
        &self,
        ids: &[u64],
        misses: &[usize],
        out: &mut [f32],
        width: usize,
    ) -> Result<Vec<usize>, EmbeddingError> {
        let dim = width;
        let wanted: Vec<u64> = misses.iter().map(|&i| ids[i]).collect();
        let (order, bounds) = group_by_stripe(&wanted);
        let mut still = Vec::new();
        self.for_each_group(&order, &bounds, |_, stripe, group| {
            for &k in group {
                let (i, id) = (misses[k], wanted[k]);
                match stripe.find(id, hash(id)) {
                    Some(slot) => self
                        .codec
                        .decode(stripe.arena.row(slot), &mut out[i * dim..(i + 1) * dim]),
                    None => still.push(i),
                }
            }
            Ok(())
        })?;
        Ok(still)
    }

    /// Eviction phase 1: picks up to `max` cold rows by CLOCK, appends their ids to `victims`, and moves the
    /// dirty ones into `out` (emptied first; their dirty bits are cleared). Marks the table spilled first, so a
    /// miss on a victim after its removal looks in the store. Returns the number of victims; 0 without a
    /// budget.
    ///
    /// Call order: `select_victims`, write `out` to the store (on failure, [`Table::mark_dirty`] its ids),
    /// then [`Table::remove_evicted`]. Serialized with flushes (the engine holds its flush lock).
    pub fn select_victims(
        &self,
        max: usize,
        victims: &mut Vec<u64>,
        out: &mut DirtyBatch,
    ) -> usize {
        out.reset(self.codec.bytes());
        let Some(tier) = &self.tier else {
            return 0;
        };
        if max == 0 {
            return 0;
        }
        tier.spilled.store(true, Ordering::Release);
        let total = self.len().max(1);
        let start = tier.cursor.load(Ordering::Relaxed);
        let mut picked: HashSet<u64> = HashSet::new();
        // Round 0 gives each stripe a share proportional to its rows; round 1 takes what rounding left.
        for round in 0..2 {
            for k in 0..STRIPES {
                if picked.len() >= max {
                    break;
                }
                let s = (start + k) % STRIPES;
                let mut stripe = self.stripes[s].0.lock();
                let live = stripe.arena.len();
                if live == 0 {
                    continue;
                }
                let remaining = max - picked.len();
                let quota = if round == 0 {
                    (max * live).div_ceil(total).min(remaining)
                } else {
                    remaining
                };
                let slots = stripe.arena.slots();
                let mut taken = 0;
                // Two turns of the hand: the first may only clear reference bits.
                for _ in 0..2 * slots {
                    if taken == quota {
                        break;
                    }
                    let slot = stripe.hand % slots;
                    stripe.hand = (slot + 1) % slots;
                    let id = stripe.arena.id(slot);
                    // A free slot keeps its old id, which the index maps elsewhere or nowhere.
                    if stripe.find(id, hash(id)) != Some(slot)
                        || picked.contains(&id)
                        || stripe.is_pinned(id)
                    {
                        continue;
                    }
                    let (word, bit) = (slot / 64, 1u64 << (slot % 64));
                    if stripe.refs[word] & bit != 0 {
                        stripe.refs[word] &= !bit;
                        continue;
                    }
                    if stripe.is_dirty(slot) {
                        out.push_words(id, stripe.arena.row(slot));
                        stripe.dirty[word] &= !bit;
                        stripe.dirty_count -= 1;
                    }
                    picked.insert(id);
                    victims.push(id);
                    taken += 1;
                }
            }
            tier.cursor.store((start + 1) % STRIPES, Ordering::Relaxed);
            if picked.len() >= max {
                break;
            }
        }
        picked.len()
    }

    /// Eviction phase 3: drops the rows of `victims` that are still clean (their current copy is in the store)
    /// and frees their slots. Returns the rows dropped.
    pub fn remove_evicted(&self, victims: &[u64]) -> usize {
        let Some(tier) = &self.tier else {
            return 0;
        };
        let _gate = tier.gate.write();
        let mut removed = 0;
        let (order, bounds) = group_by_stripe(victims);
        for (s, p) in self.stripes.iter().enumerate() {
            let group = &order[bounds[s]..bounds[s + 1]];
            if group.is_empty() {
                continue;
            }
            let mut stripe = p.0.lock();
            for &k in group {
                let id = victims[k];
                let h = hash(id);
                debug_assert_eq!(stripe_of(h), s);
                if let Some(slot) = stripe.find(id, h) {
                    // A victim pinned by a prefetch since its selection stays.
                    if !stripe.is_dirty(slot) && !stripe.is_pinned(id) {
                        stripe.remove(id, h, slot);
                        removed += 1;
                    }
                }
            }
        }
        self.rows.fetch_sub(removed, Ordering::Relaxed);
        removed
    }
}
