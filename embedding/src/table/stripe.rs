//! One stripe of a [`Table`]: an [`Arena`] of rows, its [`Index`], the dirty and CLOCK reference bits of its
//! slots, and the lookup loop that prefetches ahead; plus grouping a call's ids by stripe and taking each stripe
//! lock once (the "Locking" section of the table module).

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use super::index::Index;
use super::{Table, STRIPES};
use crate::arena::{Arena, Counts};
use crate::batch::DirtyBatch;
use crate::error::EmbeddingError;
use base::hash::splitmix64;

/// Lookahead of [`Stripe::lookup_each`], in ids: rows are prefetched this far ahead, index entries twice as far.
const PREFETCH: usize = 8;

/// One stripe's rows, index and dirty set.
#[derive(Debug)]
pub(super) struct Stripe {
    /// Id → slot of every live row, keyed through `arena`'s ids.
    index: Index,
    /// The rows (weights then optimizer state), their ids and, with a TTL, their last-touched stamps.
    pub(super) arena: Arena,
    /// Dirty bits (1 per slot): rows updated since write-back last took them.
    pub(super) dirty: Vec<u64>,
    /// Set bits in `dirty`.
    pub(super) dirty_count: usize,
    /// CLOCK reference bits (1 per slot), set by gathers and applies of tables with a memory budget.
    pub(super) refs: Vec<u64>,
    /// The CLOCK hand: the next slot the eviction sweep looks at.
    pub(super) hand: usize,
    /// Pin counts of the rows prefetches pinned (`pin.rs`), by id so that a removed and reused slot never
    /// inherits a pin; never victims of eviction.
    pub(super) pins: HashMap<u64, u32>,
    /// Ids known to have no row in the store either (a read-back found none since they were last in memory),
    /// so their misses skip the store: the negative cache of the capacity tier (`budget.rs`).
    pub(super) absent: HashSet<u64>,
}

/// A stripe on its own cache line(s), so neighbouring locks do not false-share.
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct Padded(pub(super) Mutex<Stripe>);

/// The hash of `id` that picks its stripe ([`stripe_of`]) and its place in the stripe's index.
#[inline]
pub(super) fn hash(id: u64) -> u64 {
    splitmix64(id)
}

/// The stripe of a hash: bits 32..38, away from the high bits (home bucket) and low bits (tag) the [`Index`]
/// takes, so ids sharing a stripe still spread over the stripe's index.
#[inline]
pub(super) fn stripe_of(h: u64) -> usize {
    (h >> 32) as usize & (STRIPES - 1)
}

impl Stripe {
    /// An empty stripe for rows of `row_len` words ([`crate::RowCodec::words`]), with a last-touched stamp per row if `stamps` (TTL), and a count or score per row as `counts` says (a cap).
    pub(super) fn new(row_len: usize, stamps: bool, counts: Counts) -> Self {
        Stripe {
            index: Index::new(),
            arena: Arena::with_counts(row_len, stamps, counts),
            dirty: Vec::new(),
            dirty_count: 0,
            refs: Vec::new(),
            hand: 0,
            pins: HashMap::new(),
            absent: HashSet::new(),
        }
    }

    /// The slot of `id` (hash `h`), if it has a row here.
    #[inline]
    pub(super) fn find(&self, id: u64, h: u64) -> Option<usize> {
        let arena = &self.arena;
        self.index.find(h, |slot| arena.id(slot) == id)
    }

    /// Calls `f(stripe, i, slot)` for each `i` in `group` (indices into `ids`), in order, with the slot of
    /// `ids[i]` if it has a row (as found just before the call). A lookup in a table larger than the cache
    /// waits on two or three cache misses in turn (index entry, id, row), so the index entries of the ids
    /// [`PREFETCH`] x 2 ahead and the likely rows of those [`PREFETCH`] ahead are prefetched first. The group's
    /// first ids are prefetched together before the first lookup: a call's ids spread over all the stripes,
    /// so a group often has fewer ids than the prefetch distance.
    #[inline]
    pub(super) fn lookup_each(
        &mut self,
        ids: &[u64],
        group: &[usize],
        mut f: impl FnMut(&mut Stripe, usize, Option<usize>),
    ) {
        for &j in group.iter().take(2 * PREFETCH) {
            self.prefetch_entry(ids[j]);
        }
        for &j in group.iter().take(PREFETCH) {
            self.prefetch_row(ids[j]);
        }
        for k in 0..group.len() {
            if let Some(&j) = group.get(k + 2 * PREFETCH) {
                self.prefetch_entry(ids[j]);
            }
            if let Some(&j) = group.get(k + PREFETCH) {
                self.prefetch_row(ids[j]);
            }
            let i = group[k];
            let id = ids[i];
            let slot = self.find(id, hash(id));
            f(self, i, slot);
        }
    }

    /// Hints the CPU to load the index entry where a lookup of `id` starts.
    #[inline]
    fn prefetch_entry(&self, id: u64) {
        self.index.prefetch(hash(id));
    }

    /// Hints the CPU to load the id and row of the slot `id` most likely has (its index entry should be in
    /// cache already, see [`Stripe::prefetch_entry`]).
    #[inline]
    fn prefetch_row(&self, id: u64) {
        if let Some(slot) = self.index.candidate(hash(id)) {
            self.arena.prefetch(slot);
        }
    }

    /// Adds a row for `id` (absent), filled by `fill`, and returns its slot; `Err(rows held)` if the stripe's
    /// `u32` slot numbers are used up.
    pub(super) fn insert(
        &mut self,
        id: u64,
        h: u64,
        fill: impl FnOnce(&mut [u32]),
    ) -> Result<usize, usize> {
        if self.arena.len() >= u32::MAX as usize {
            return Err(self.arena.len());
        }
        if !self.absent.is_empty() {
            self.absent.remove(&id);
        }
        let (slot, row) = self.arena.push(id);
        fill(row);
        if slot / 64 >= self.dirty.len() {
            self.dirty.push(0);
            self.refs.push(0);
        }
        let arena = &self.arena;
        self.index.insert(h, slot, |s| hash(arena.id(s)));
        Ok(slot)
    }

    /// Removes the row in `slot` (of `id`, hash `h`): index entry, dirty bit, and the slot goes to the free list.
    pub(super) fn remove(&mut self, id: u64, h: u64, slot: usize) {
        debug_assert_eq!(self.arena.id(slot), id);
        let arena = &self.arena;
        self.index.remove(h, slot, |s| hash(arena.id(s)));
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        if self.dirty[word] & bit != 0 {
            self.dirty[word] &= !bit;
            self.dirty_count -= 1;
        }
        self.refs[word] &= !bit;
        self.arena.remove(slot);
    }

    /// Sets the dirty bit of `slot`, counting it if it was clear.
    #[inline]
    pub(super) fn mark_dirty(&mut self, slot: usize) {
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        if self.dirty[word] & bit == 0 {
            self.dirty[word] |= bit;
            self.dirty_count += 1;
        }
    }

    /// Whether `id` is known to have no row in memory or in the store (`budget.rs`, "Negative cache").
    #[inline]
    pub(super) fn known_absent(&self, id: u64) -> bool {
        !self.absent.is_empty() && self.absent.contains(&id)
    }

    /// Whether a prefetch pinned the row of `id`.
    #[inline]
    pub(super) fn is_pinned(&self, id: u64) -> bool {
        !self.pins.is_empty() && self.pins.contains_key(&id)
    }

    /// Sets the CLOCK reference bit of `slot`.
    #[inline]
    pub(super) fn set_ref(&mut self, slot: usize) {
        self.refs[slot / 64] |= 1u64 << (slot % 64);
    }

    /// Whether `slot` was updated since write-back last took it.
    #[inline]
    pub(super) fn is_dirty(&self, slot: usize) -> bool {
        self.dirty[slot / 64] & (1u64 << (slot % 64)) != 0
    }

    /// Moves up to `max` dirty rows into `out`, clearing their bits.
    pub(super) fn drain_dirty(&mut self, max: usize, out: &mut DirtyBatch) {
        self.drain_dirty_slots(max, |arena, slot| {
            out.push_words(arena.id(slot), arena.row(slot))
        });
    }

    /// Appends the ids of up to `max` dirty rows to `out` and clears their flags.
    pub(super) fn drain_dirty_ids(&mut self, max: usize, out: &mut Vec<u64>) {
        self.drain_dirty_slots(max, |arena, slot| out.push(arena.id(slot)));
    }

    /// Calls `f(arena, slot)` for up to `max` dirty slots, in slot order, clearing their bits.
    fn drain_dirty_slots(&mut self, max: usize, mut f: impl FnMut(&Arena, usize)) {
        let mut taken = 0;
        for w in 0..self.dirty.len() {
            if taken == max {
                break;
            }
            let mut word = self.dirty[w];
            while word != 0 && taken < max {
                f(&self.arena, w * 64 + word.trailing_zeros() as usize);
                word &= word - 1;
                taken += 1;
            }
            self.dirty[w] = word;
        }
        self.dirty_count -= taken;
    }

    /// Heap bytes of the stripe: index buckets, arena, dirty and reference bits (capacity, not length).
    pub(super) fn allocated_bytes(&self) -> usize {
        self.index.allocation_size()
            + self.arena.allocated_bytes()
            + self.dirty.capacity() * 8
            + self.refs.capacity() * 8
            + hash_set_bytes(self.absent.capacity(), 8)
            + hash_set_bytes(self.pins.capacity(), 12)
    }
}

/// Heap bytes of a hashbrown table with room for `capacity` entries of `entry` bytes: buckets are the next
/// power of two of `capacity x 8 / 7`, each with its entry and a control byte.
fn hash_set_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    (capacity * 8 / 7).next_power_of_two() * (entry + 1)
}

impl Table {
    /// Calls `f(stripe index, stripe, group)` for each non-empty group of `order`, taking each stripe lock
    /// once. Busy stripes are skipped in a first pass (`try_lock`) and locked in a second, so calls that walk
    /// the stripes in the same order do not queue behind each other stripe after stripe.
    pub(super) fn for_each_group(
        &self,
        order: &[usize],
        bounds: &[usize; STRIPES + 1],
        mut f: impl FnMut(usize, &mut Stripe, &[usize]) -> Result<(), EmbeddingError>,
    ) -> Result<(), EmbeddingError> {
        let mut deferred = 0u64;
        for (s, padded) in self.stripes.iter().enumerate() {
            let group = &order[bounds[s]..bounds[s + 1]];
            if group.is_empty() {
                continue;
            }
            match padded.0.try_lock() {
                Some(mut stripe) => f(s, &mut stripe, group)?,
                None => deferred |= 1 << s,
            }
        }
        while deferred != 0 {
            let s = deferred.trailing_zeros() as usize;
            deferred &= deferred - 1;
            let mut stripe = self.stripes[s].0.lock();
            f(s, &mut stripe, &order[bounds[s]..bounds[s + 1]])?;
        }
        Ok(())
    }
}

/// Indices of `ids` ordered by stripe (stable), and the start of each stripe's group: stripe `s` owns
/// `order[bounds[s]..bounds[s + 1]]`.
pub(super) fn group_by_stripe(ids: &[u64]) -> (Vec<usize>, [usize; STRIPES + 1]) {
    let mut bounds = [0usize; STRIPES + 1];
    let stripes: Vec<u8> = ids.iter().map(|&id| stripe_of(hash(id)) as u8).collect();
    for &s in &stripes {
        bounds[s as usize + 1] += 1;
    }
    for s in 0..STRIPES {
        bounds[s + 1] += bounds[s];
    }
    let mut next = bounds;
    let mut order = vec![0usize; ids.len()];
    for (i, &s) in stripes.iter().enumerate() {
        order[next[s as usize]] = i;
        next[s as usize] += 1;
    }
    (order, bounds)
}
