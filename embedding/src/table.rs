//! [`Table`]: the in-memory rows of one embedding table, lock-striped, with dirty tracking for write-back.
//!
//! # Layout
//! Ids are hashed once (splitmix64, since ids from the trainer are hashes already but a malicious or unlucky id
//! set must not degrade the index) and the hash picks one of [`STRIPES`] stripes. Each stripe is a
//! `parking_lot::Mutex` around:
//! - an [`Arena`] of rows (`dim` weights then optimizer state, `row_len` f32s, no per-row allocation) and the id
//!   of each slot;
//! - an index ([`Index`], `table_index.rs`): an open-addressing table of `u32` slot numbers with hash tags,
//!   keyed through the arena's ids. It costs 4.7 to 7.1 bytes per row where a `HashMap<u64, u32>` costs 19 to
//!   38, which is what keeps memory under DESIGN.md's 1.25x of payload;
//! - a dirty bitset (1 bit per slot) and its population count.
//!
//! # Admission and TTL
//! With [`crate::AdmissionConfig`], a table has one count-min [`Sketch`] shared by its stripes (atomic
//! counters): a push of an id without a row counts a sighting, and the row is created only at the
//! `min_count`-th; earlier pushes are dropped ([`ApplyStats::rejected_admission`]) and pulls return the
//! initializer.
//!
//! With `ttl_secs`, each row keeps a `u32` last-touched time in seconds (4 bytes per row; see [`Table::apply_at`]
//! for where time comes from), and [`Table::expired`] / [`Table::remove_expired`] find and delete rows
//! untouched for `ttl_secs`. The table never reads a clock (STYLE.md, "Sans-IO cores"): callers pass `now` in
//! seconds of any clock that only moves forward (the server uses Unix time; `u32` seconds last until 2106).
//! Removed slots are reused through the arena's free list.
//!
//! # Locking
//! A call groups its ids by stripe (a stable counting sort), then takes each stripe lock once, so a batch of
//! `n` ids costs at most [`STRIPES`] lock acquisitions, and duplicate ids (same stripe) keep their call order.
//! Stripes found busy are visited again after the others.
//! Initializer values for unseen ids in [`Table::gather`] are computed after the locks are released.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::admission::Sketch;
use crate::arena::Arena;
use crate::batch::DirtyBatch;
use crate::config::TableConfig;
use crate::error::EmbeddingError;
use crate::init::{self, splitmix64};
use crate::optimizer::{self, Regularizer};
use crate::store::Store;

/// Number of lock stripes per table (a power of two, at most 64: a `u64` holds a set of stripes).
///
/// A call groups its ids by stripe and prefetches within a group, so more stripes mean smaller groups and less
/// of each lookup's cache misses overlapped. A trainer's request at batch 2048 brings ~260 unique ids per table
/// to a server: ~4 per stripe at 64 stripes, 16 at 16. `ps-bench --in-process --distribution uniform --vocab
/// 300000 --ids-per-table 258 --pool-batches 1000 --populate` (rows far out of cache), rows/s each way: 4.8-5.3M
/// at 64 stripes, 6.4-7.1M with the group warm-up of `lookup_each`, 11.0-11.3M with that and 16 stripes. 16
/// locks per table still let a server's workers apply different parts of a table at once.
pub const STRIPES: usize = 16;
const _: () = assert!(STRIPES.is_power_of_two() && STRIPES <= 64);

/// Lookahead of [`Stripe::lookup_each`], in ids: rows are prefetched this far ahead, index entries twice as far.
const PREFETCH: usize = 8;

/// What [`Table::apply`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ApplyStats {
    /// Gradient rows applied (duplicates count once each).
    pub applied: usize,
    /// Rows created from the initializer before their first update.
    pub created: usize,
    /// Gradient rows skipped because they held NaN or infinity; their rows were not touched or created.
    pub rejected_nonfinite: usize,
    /// Gradient rows dropped because their id has no row and was not yet pushed `min_count` times (frequency
    /// admission); the push was counted in the sketch.
    pub rejected_admission: usize,
    /// Rows read back from the store (evicted earlier by the memory budget) before their update.
    pub rows_read_back: usize,
}

/// What [`Table::gather_stats`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GatherStats {
    /// Rows read back from the store (evicted earlier by the memory budget) and kept in memory again.
    pub rows_read_back: usize,
}

impl std::ops::AddAssign for ApplyStats {
    fn add_assign(&mut self, o: ApplyStats) {
        self.applied += o.applied;
        self.created += o.created;
        self.rejected_nonfinite += o.rejected_nonfinite;
        self.rejected_admission += o.rejected_admission;
        self.rows_read_back += o.rows_read_back;
    }
}

/// Stamp of a row whose last touch is unknown (recovered from the store, which keeps no times): the next
/// [`Table::expired`] sets it to its `now`, so recovered rows get a full TTL after a restart.
const STAMP_UNKNOWN: u32 = u32::MAX;

/// The stamp of time `now` (seconds), saturating below [`STAMP_UNKNOWN`].
#[inline]
fn stamp_of(now: u64) -> u32 {
    now.min(u64::from(STAMP_UNKNOWN - 1)) as u32
}

/// One stripe's rows, index and dirty set.
#[derive(Debug)]
struct Stripe {
    index: Index,
    arena: Arena,
    dirty: Vec<u64>,
    dirty_count: usize,
    /// CLOCK reference bits (1 per slot), set by gathers and applies of tables with a memory budget.
    refs: Vec<u64>,
    /// The CLOCK hand: the next slot the eviction sweep looks at.
    hand: usize,
}

/// A stripe on its own cache line(s), so neighbouring locks do not false-share.
#[derive(Debug)]
#[repr(align(64))]
struct Padded(Mutex<Stripe>);

#[inline]
fn hash(id: u64) -> u64 {
    splitmix64(id)
}

/// The stripe of a hash: bits 32..38, away from the high bits (home bucket) and low bits (tag) the [`Index`]
/// takes, so ids sharing a stripe still spread over the stripe's index.
#[inline]
fn stripe_of(h: u64) -> usize {
    (h >> 32) as usize & (STRIPES - 1)
}

impl Stripe {
    fn new(row_len: usize, stamps: bool) -> Self {
        Stripe {
            index: Index::new(),
            arena: Arena::new(row_len, stamps),
            dirty: Vec::new(),
            dirty_count: 0,
            refs: Vec::new(),
            hand: 0,
        }
    }

    #[inline]
    fn find(&self, id: u64, h: u64) -> Option<usize> {
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
    fn lookup_each(
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

    /// Adds a row for `id` (absent), filled by `fill`, and returns its slot.
    fn insert(&mut self, id: u64, h: u64, fill: impl FnOnce(&mut [f32])) -> Result<usize, usize> {
        if self.arena.len() >= u32::MAX as usize {
            return Err(self.arena.len());
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
    fn remove(&mut self, id: u64, h: u64, slot: usize) {
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

    #[inline]
    fn mark_dirty(&mut self, slot: usize) {
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        if self.dirty[word] & bit == 0 {
            self.dirty[word] |= bit;
            self.dirty_count += 1;
        }
    }

    /// Sets the CLOCK reference bit of `slot`.
    #[inline]
    fn set_ref(&mut self, slot: usize) {
        self.refs[slot / 64] |= 1u64 << (slot % 64);
    }

    #[inline]
    fn is_dirty(&self, slot: usize) -> bool {
        self.dirty[slot / 64] & (1u64 << (slot % 64)) != 0
    }

    /// Moves up to `max` dirty rows into `out`, clearing their bits.
    fn drain_dirty(&mut self, max: usize, out: &mut DirtyBatch) {
        let mut taken = 0;
        for w in 0..self.dirty.len() {
            if taken == max {
                break;
            }
            let mut word = self.dirty[w];
            while word != 0 && taken < max {
                let slot = w * 64 + word.trailing_zeros() as usize;
                out.push_row(self.arena.id(slot), self.arena.row(slot));
                word &= word - 1;
                taken += 1;
            }
            self.dirty[w] = word;
        }
        self.dirty_count -= taken;
    }

    fn allocated_bytes(&self) -> usize {
        self.index.allocation_size()
            + self.arena.allocated_bytes()
            + self.dirty.capacity() * 8
            + self.refs.capacity() * 8
    }
}

/// The rows of one embedding table. Thread-safe: share it as `Arc<Table>`.
#[derive(Debug)]
pub struct Table {
    cfg: TableConfig,
    row_len: usize,
    reg: Regularizer,
    /// Frequency admission, if configured.
    sketch: Option<Sketch>,
    /// `ttl_secs` as stamps, if configured.
    ttl: Option<u32>,
    /// The latest `now` passed to [`Table::apply_at`], [`Table::advance_clock`] or [`Table::expired`]: the
    /// time [`Table::apply`] stamps rows with.
    clock: AtomicU64,
    stripes: Box<[Padded]>,
    rows: AtomicUsize,
    /// Stripe where the next [`Table::take_dirty`] starts, so a bounded take does not favour stripe 0.
    dirty_cursor: AtomicUsize,
    /// The capacity tier, for a table with a memory budget.
    tier: Option<Tier>,
}

impl Table {
    /// An empty table; fails if the config does not [`validate`](TableConfig::validate).
    pub fn new(cfg: TableConfig) -> Result<Table, EmbeddingError> {
        Table::build(cfg, None)
    }

    /// An empty table that keeps at most about `budget_rows` rows in memory (`>= 1`): past it,
    /// [`crate::Engine::enforce_budget`] writes cold rows to `store` and drops them, and misses read them back
    /// from it.
    pub fn with_budget(
        cfg: TableConfig,
        budget_rows: u64,
        store: Arc<dyn Store>,
    ) -> Result<Table, EmbeddingError> {
        Table::build(cfg, Some((budget_rows, store)))
    }

    fn build(
        cfg: TableConfig,
        budget: Option<(u64, Arc<dyn Store>)>,
    ) -> Result<Table, EmbeddingError> {
        cfg.validate()?;
        let row_len = cfg.row_len();
        let ttl = cfg.ttl_secs.map(|t| t.min(u64::from(u32::MAX)) as u32);
        Ok(Table {
            stripes: (0..STRIPES)
                .map(|_| Padded(Mutex::new(Stripe::new(row_len, ttl.is_some()))))
                .collect(),
            reg: Regularizer::of(&cfg),
            sketch: cfg.admission.as_ref().map(Sketch::new),
            ttl,
            clock: AtomicU64::new(0),
            cfg,
            row_len,
            rows: AtomicUsize::new(0),
            dirty_cursor: AtomicUsize::new(0),
            tier: budget.map(|(budget, store)| Tier {
                budget: budget.clamp(1, usize::MAX as u64) as usize,
                store,
                spilled: AtomicBool::new(false),
                gate: RwLock::new(()),
                read_back: AtomicU64::new(0),
                cursor: AtomicUsize::new(0),
            }),
        })
    }

    /// The table's config.
    pub fn config(&self) -> &TableConfig {
        &self.cfg
    }

    /// The table id.
    pub fn id(&self) -> u32 {
        self.cfg.id
    }

    /// Weights per row.
    pub fn dim(&self) -> usize {
        self.cfg.dim
    }

    /// f32s per stored row (weights + optimizer state).
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Rows held in memory.
    pub fn len(&self) -> usize {
        self.rows.load(Ordering::Relaxed)
    }

    /// True if no row was created or loaded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check_len(&self, what: &'static str, ids: usize, len: usize) -> Result<(), EmbeddingError> {
        let dim = self.cfg.dim;
        let expected = ids.saturating_mul(dim);
        if len == expected {
            Ok(())
        } else {
            Err(EmbeddingError::WrongLength {
                table: self.cfg.id,
                what,
                len,
                expected,
                ids,
                dim,
            })
        }
    }

    /// Copies the weights of `ids` into `out` (`ids.len() x dim`, row `i` at `out[i * dim..]`). Ids without a
    /// row get their initializer values; no row is created (a pull of a new id needs no write).
    pub fn gather(&self, ids: &[u64], out: &mut [f32]) -> Result<(), EmbeddingError> {
        self.gather_stats(ids, out).map(|_| ())
    }

    /// [`Table::gather`], returning counts. With a memory budget, ids missing from memory are first looked up
    /// in the store (one batched read for the call) once any row was evicted, and rows found there are kept
    /// in memory again (clean).
    pub fn gather_stats(
        &self,
        ids: &[u64],
        out: &mut [f32],
    ) -> Result<GatherStats, EmbeddingError> {
        self.check_len("output", ids.len(), out.len())?;
        self.gather_width(ids, out, self.cfg.dim)
    }

    /// Copies the whole stored rows of `ids` into `out` (`ids.len() x row_len`: the weights, then the
    /// optimizer state, as [`Table::row_len`] counts them). Ids without a row get their initializer values
    /// and a new row's optimizer state; no row is created. A trainer replaying its own unacknowledged
    /// updates on pulled rows needs the state the server will apply them with.
    pub fn gather_with_state(&self, ids: &[u64], out: &mut [f32]) -> Result<(), EmbeddingError> {
        let expected = ids.len().saturating_mul(self.row_len);
        if out.len() != expected {
            return Err(EmbeddingError::WrongLength {
                table: self.cfg.id,
                what: "output (weights and state)",
                len: out.len(),
                expected,
                ids: ids.len(),
                dim: self.row_len,
            });
        }
        self.gather_width(ids, out, self.row_len).map(|_| ())
    }

    /// Copies the first `width` f32s of each row of `ids` into `out` (`ids.len() x width`): `dim` (weights)
    /// or `row_len` (weights and state).
    fn gather_width(
        &self,
        ids: &[u64],
        out: &mut [f32],
        width: usize,
    ) -> Result<GatherStats, EmbeddingError> {
        let dim = width;
        let _gate = self.tier.as_ref().map(|t| t.gate.read());
        let clock = self.tier.is_some();
        let (order, bounds) = group_by_stripe(ids);
        let mut misses = Vec::new();
        self.for_each_group(&order, &bounds, |_, stripe, group| {
            stripe.lookup_each(ids, group, |stripe, i, slot| match slot {
                Some(slot) => {
                    if clock {
                        stripe.set_ref(slot);
                    }
                    out[i * dim..(i + 1) * dim].copy_from_slice(&stripe.arena.row(slot)[..dim])
                }
                None => misses.push(i),
            });
            Ok(())
        })?;
        let mut stats = GatherStats::default();
        if !misses.is_empty() && self.spilled() {
            stats.rows_read_back = self.read_back(ids, &misses)?;
            misses = self.copy_found(ids, &misses, out, width)?;
        }
        for i in misses {
            let row = &mut out[i * width..(i + 1) * width];
            if width == self.row_len {
                init::fill_row(&self.cfg, ids[i], row);
            } else {
                init::fill_weights(&self.cfg, ids[i], row);
            }
        }
        Ok(stats)
    }

    /// The table's logical clock: the latest `now` it was given, in seconds.
    pub fn clock(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// Moves the logical clock forward to `now` (seconds; an earlier `now` is ignored).
    pub fn advance_clock(&self, now: u64) {
        self.clock.fetch_max(now, Ordering::Relaxed);
    }

    /// [`Table::apply_at`] at the table's logical clock ([`Table::clock`]), for callers without a time source:
    /// with a TTL, rows are then stamped with the `now` of the latest [`Table::expired`] call, so they expire
    /// between `ttl_secs` and `ttl_secs` plus one expiry interval after their last update.
    pub fn apply(&self, ids: &[u64], grads: &[f32]) -> Result<ApplyStats, EmbeddingError> {
        self.apply_at(ids, grads, self.clock())
    }

    /// Applies the optimizer (after the table's clipping and weight decay) to the rows of `ids` with `grads`
    /// (`ids.len() x dim`), creating missing rows from the initializer first and marking updated rows dirty.
    /// A gradient row with NaN or infinity is skipped and counted in [`ApplyStats::rejected_nonfinite`]. With
    /// admission, a missing row is created only at its id's `min_count`-th push; earlier pushes are dropped
    /// and counted in [`ApplyStats::rejected_admission`]. Duplicate ids are applied one after another, in call
    /// order. With a TTL, updated rows are stamped with `now` (seconds), which also advances the logical
    /// clock.
    ///
    /// Updates are per row, not per call: a concurrent gather may see some rows of this call updated and
    /// others not (asynchronous training, DESIGN.md).
    pub fn apply_at(
        &self,
        ids: &[u64],
        grads: &[f32],
        now: u64,
    ) -> Result<ApplyStats, EmbeddingError> {
        self.check_len("gradient", ids.len(), grads.len())?;
        self.advance_clock(now);
        let stamp = stamp_of(now);
        let dim = self.cfg.dim;
        let _gate = self.tier.as_ref().map(|t| t.gate.read());
        let clock = self.tier.is_some();
        let (order, bounds) = group_by_stripe(ids);
        let mut stats = ApplyStats::default();
        if self.spilled() {
            // Rows evicted to the store are read back before their update, not recreated.
            let mut misses = Vec::new();
            self.for_each_group(&order, &bounds, |_, stripe, group| {
                misses.extend(
                    group
                        .iter()
                        .filter(|&&i| stripe.find(ids[i], hash(ids[i])).is_none()),
                );
                Ok(())
            })?;
            if !misses.is_empty() {
                stats.rows_read_back = self.read_back(ids, &misses)?;
            }
        }
        self.for_each_group(&order, &bounds, |s, stripe, group| {
            let mut full = None;
            stripe.lookup_each(ids, group, |stripe, i, found| {
                let grad = &grads[i * dim..(i + 1) * dim];
                if full.is_some() {
                    return;
                }
                if !grad.iter().all(|g| g.is_finite()) {
                    stats.rejected_nonfinite += 1;
                    return;
                }
                let id = ids[i];
                let slot = match found {
                    Some(slot) => slot,
                    None => {
                        if let (Some(sketch), Some(adm)) = (&self.sketch, &self.cfg.admission) {
                            if sketch.increment(id) < adm.min_count {
                                stats.rejected_admission += 1;
                                return;
                            }
                        }
                        match stripe.insert(id, hash(id), |row| init::fill_row(&self.cfg, id, row))
                        {
                            Ok(slot) => slot,
                            Err(rows) => {
                                full = Some(self.full(s, rows));
                                return;
                            }
                        }
                    }
                };
                if found.is_none() {
                    self.rows.fetch_add(1, Ordering::Relaxed);
                    stats.created += 1;
                }
                stripe.arena.set_stamp(slot, stamp);
                if clock {
                    stripe.set_ref(slot);
                }
                let (weights, state) = stripe.arena.row_mut(slot).split_at_mut(dim);
                optimizer::update(&self.cfg.optimizer, self.reg, weights, state, grad);
                stripe.mark_dirty(slot);
                stats.applied += 1;
            });
            full.map_or(Ok(()), Err)
        })?;
        Ok(stats)
    }

    /// Calls `f(stripe index, stripe, group)` for each non-empty group of `order`, taking each stripe lock
    /// once. Busy stripes are skipped in a first pass (`try_lock`) and locked in a second, so calls that walk
    /// the stripes in the same order do not queue behind each other stripe after stripe.
    fn for_each_group(
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

    fn full(&self, stripe: usize, rows: usize) -> EmbeddingError {
        EmbeddingError::TableFull {
            table: self.cfg.id,
            stripe,
            rows,
        }
    }

    /// The stored row of `id` (weights then optimizer state), or `None` if it has none. For tests and tools.
    pub fn row(&self, id: u64) -> Option<Vec<f32>> {
        let h = hash(id);
        let stripe = self.stripes[stripe_of(h)].0.lock();
        stripe
            .find(id, h)
            .map(|slot| stripe.arena.row(slot).to_vec())
    }

    /// Inserts or overwrites the full row of `id` (`row_len` f32s) without marking it dirty: for recovery from
    /// the store. With a TTL, its last touch is unknown until the next [`Table::expired`], which starts its
    /// TTL then.
    pub fn load_row(&self, id: u64, row: &[f32]) -> Result<(), EmbeddingError> {
        if row.len() != self.row_len {
            return Err(EmbeddingError::RowLength {
                table: self.cfg.id,
                id,
                len: row.len(),
                expected: self.row_len,
                dim: self.cfg.dim,
            });
        }
        let h = hash(id);
        let s = stripe_of(h);
        let mut stripe = self.stripes[s].0.lock();
        let slot = match stripe.find(id, h) {
            Some(slot) => {
                stripe.arena.row_mut(slot).copy_from_slice(row);
                slot
            }
            None => {
                let slot = stripe
                    .insert(id, h, |dst| dst.copy_from_slice(row))
                    .map_err(|rows| self.full(s, rows))?;
                self.rows.fetch_add(1, Ordering::Relaxed);
                slot
            }
        };
        stripe.arena.set_stamp(slot, STAMP_UNKNOWN);
        Ok(())
    }

    /// Rows updated since they were last taken by [`Table::take_dirty`].
    pub fn dirty_len(&self) -> usize {
        self.stripes.iter().map(|p| p.0.lock().dirty_count).sum()
    }

    /// Moves up to `max_rows` dirty rows (id + full row as little-endian bytes) into `out`, which is emptied
    /// first, and clears their dirty flags. Each stripe lock is held only while its rows are copied. Returns the
    /// number of rows taken; 0 means nothing is dirty.
    ///
    /// Call order: take, write to the store, and on a failed write give the rows back with
    /// [`Table::mark_dirty`]. Takes for one table must not run concurrently with each other if their writes
    /// can reorder (the engine serializes flushes), or an older copy could overwrite a newer one in the store.
    pub fn take_dirty(&self, max_rows: usize, out: &mut DirtyBatch) -> usize {
        out.reset(self.row_len * 4);
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

    /// Appends the current full rows (weights then optimizer state) of those `ids` that are in memory to `out`,
    /// which is emptied first, leaving dirty flags alone: for synchronous persistence of a push
    /// ([`crate::Engine::persist`]). Each stripe lock is held only while its rows are copied. Returns the
    /// number of `ids` not in memory (never created, or evicted to the store).
    pub fn copy_rows(&self, ids: &[u64], out: &mut DirtyBatch) -> usize {
        out.reset(self.row_len * 4);
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
                    Some(slot) => out.push_row(id, stripe.arena.row(slot)),
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

    /// Estimated heap bytes: arena chunks (capacity), ids, TTL stamps, free lists, index buckets, dirty bits,
    /// stripe headers and the admission sketch.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Table>()
            + self.sketch.as_ref().map_or(0, Sketch::memory_bytes)
            + self.stripes.len() * std::mem::size_of::<Padded>()
            + self
                .stripes
                .iter()
                .map(|p| p.0.lock().allocated_bytes())
                .sum::<usize>()
    }
}

/// Indices of `ids` ordered by stripe (stable), and the start of each stripe's group: stripe `s` owns
/// `order[bounds[s]..bounds[s + 1]]`.
fn group_by_stripe(ids: &[u64]) -> (Vec<usize>, [usize; STRIPES + 1]) {
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

#[path = "table_expire.rs"]
mod expire;

#[path = "table_index.rs"]
mod index;
use index::Index;

#[path = "table_budget.rs"]
mod budget;
use budget::Tier;

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
