//! [`Table`]: the in-memory rows of one embedding table, lock-striped, with dirty tracking for write-back.
//!
//! # Layout
//! - `mod.rs`: [`Table`], its constructors, pulls ([`Table::gather`]) and pushes ([`Table::apply`]),
//!   recovery ([`Table::load_row`]).
//! - `stripe.rs`: one stripe (arena, index, dirty and reference bits) and its prefetching lookup loop;
//!   grouping a call's ids by stripe and taking each stripe lock once.
//! - `index.rs`: a stripe's id → slot index (open addressing, `u32` entries with hash tags).
//! - `dirty.rs`: write-back of dirty rows ([`Table::take_dirty`], [`Table::copy_rows`],
//!   [`Table::mark_dirty`]).
//! - `expire.rs`: last-touched stamps and TTL expiry ([`Table::expired`], [`Table::remove_expired`]).
//! - `budget.rs`: the capacity tier (memory budget, CLOCK eviction, batched read-back).
//! - `pin.rs`: lookahead prefetch into the tier: read rows back ahead of their pull and pin them.
//! - `scan.rs`: listing the rows in id order, a page at a time ([`Table::ids_after`]).
//! - `prune.rs`: the rows an export leaves out ([`Table::pruned`], [`crate::ExportPrune`]).
//! - `tests.rs`: unit tests of the whole table.
//!
//! # Stripes
//! Ids are hashed once (splitmix64, since ids from the trainer are hashes already but a malicious or unlucky id
//! set must not degrade the index) and the hash picks one of [`STRIPES`] stripes. Each stripe is a
//! `parking_lot::Mutex` around:
//! - an [`Arena`](crate::arena::Arena) of rows (`dim` weights then optimizer state, `row_len` f32s, no per-row
//!   allocation) and the id of each slot;
//! - an index ([`Index`](index::Index), `index.rs`): an open-addressing table of `u32` slot numbers with hash
//!   tags, keyed through the arena's ids. It costs 4.7 to 7.1 bytes per row where a `HashMap<u64, u32>` costs
//!   19 to 38, which is what keeps memory under DESIGN.md's 1.25x of payload;
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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::admission::Sketch;
use crate::arena::Counts;
use crate::config::{EvictionPolicy, TableConfig};
use crate::error::EmbeddingError;
use crate::init;
use crate::optimizer::{self, Regularizer};
use crate::precision::RowCodec;
use crate::store::Store;

mod budget;
mod cap;
mod dirty;
mod expire;
mod index;
mod pin;
mod prune;
mod replica;
mod scan;
mod stripe;

use budget::Tier;
use expire::{stamp_of, STAMP_UNKNOWN};
pub use pin::PrefetchStats;
use stripe::{group_by_stripe, hash, stripe_of, Padded, Stripe};

#[cfg(test)]
mod tests;

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
    /// Updates undone because they would have left a non-finite weight or state in the row
    /// ([`crate::WeightGuard`]).
    pub refused_nonfinite_weights: usize,
    /// Updates whose weights were bounded by [`crate::WeightGuard::Clamp`].
    pub clamped_weights: usize,
    /// Rows read back from the store (evicted earlier by the memory budget) before their update.
    pub rows_read_back: usize,
    /// Rows another call (a prefetch) was reading back; this one waited for them instead of reading them.
    pub rows_waited: usize,
}

/// What [`Table::gather_stats`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GatherStats {
    /// Rows found in memory, counted for tables with a memory budget only (the tier's hits).
    pub rows_resident: usize,
    /// Rows read back from the store (evicted earlier by the memory budget) and kept in memory again.
    pub rows_read_back: usize,
    /// Rows another call (a prefetch) was reading back; this one waited for them instead of reading them
    /// (a late prefetch).
    pub rows_waited: usize,
}

impl std::ops::AddAssign for ApplyStats {
    fn add_assign(&mut self, o: ApplyStats) {
        self.applied += o.applied;
        self.created += o.created;
        self.rejected_nonfinite += o.rejected_nonfinite;
        self.rejected_admission += o.rejected_admission;
        self.refused_nonfinite_weights += o.refused_nonfinite_weights;
        self.clamped_weights += o.clamped_weights;
        self.rows_read_back += o.rows_read_back;
        self.rows_waited += o.rows_waited;
    }
}

/// The rows of one embedding table. Thread-safe: share it as `Arc<Table>`.
#[derive(Debug)]
pub struct Table {
    /// The validated config.
    cfg: TableConfig,
    /// f32s per row as calls pass it: `dim` weights, then the optimizer state.
    row_len: usize,
    /// How a row is packed in the arena and the store (its precision).
    codec: RowCodec,
    /// Clipping and weight decay applied to gradients before the optimizer.
    reg: Regularizer,
    /// Frequency admission, if configured.
    sketch: Option<Sketch>,
    /// `ttl_secs` as stamps, if configured.
    ttl: Option<u32>,
    /// The latest `now` passed to [`Table::apply_at`], [`Table::advance_clock`] or [`Table::expired`]: the
    /// time [`Table::apply`] stamps rows with.
    clock: AtomicU64,
    /// The [`STRIPES`] stripes, each behind its own lock.
    stripes: Box<[Padded]>,
    /// Rows in memory, over all stripes ([`Table::len`]).
    rows: AtomicUsize,
    /// Stripe where the next [`Table::take_dirty`] starts, so a bounded take does not favour stripe 0.
    dirty_cursor: AtomicUsize,
    /// The capacity tier, for a table with a memory budget.
    tier: Option<Tier>,
    /// What an update may leave in a row ([`Table::set_weight_guard`]).
    guard: parking_lot::RwLock<crate::WeightGuard>,
    /// The row cap, for a table with one (`cap.rs`).
    cap: Option<cap::Cap>,
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
        let codec = cfg.row_codec();
        let counts = match cfg.eviction.map(|e| e.policy) {
            None => Counts::None,
            Some(EvictionPolicy::Lfu) => Counts::Updates,
            Some(EvictionPolicy::Score) => Counts::Scores,
        };
        let cap = cfg.eviction.map(cap::Cap::new);
        let ttl = cfg.ttl_secs.map(|t| t.min(u64::from(u32::MAX)) as u32);
        Ok(Table {
            stripes: (0..STRIPES)
                .map(|_| {
                    Padded(Mutex::new(Stripe::new(
                        codec.words(),
                        ttl.is_some(),
                        counts,
                    )))
                })
                .collect(),
            reg: Regularizer::of(&cfg),
            sketch: cfg.admission.as_ref().map(Sketch::new),
            ttl,
            clock: AtomicU64::new(0),
            cfg,
            row_len,
            codec,
            rows: AtomicUsize::new(0),
            dirty_cursor: AtomicUsize::new(0),
            tier: budget.map(|(budget, store)| Tier::new(budget, store)),
            guard: parking_lot::RwLock::new(crate::WeightGuard::default()),
            cap,
        })
    }

    /// Sets what an update may leave in a row (default [`crate::WeightGuard::Refuse`]).
    pub fn set_weight_guard(&self, guard: crate::WeightGuard) {
        *self.guard.write() = guard;
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

    /// f32s per whole row (weights + optimizer state), as [`Table::load_row`] takes it and
    /// [`Table::gather_with_state`] gives it.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Bytes per stored row, in memory and in the store ([`TableConfig::row_bytes`]).
    pub fn row_bytes(&self) -> usize {
        self.codec.bytes()
    }

    /// How a row of this table is packed ([`TableConfig::row_codec`]).
    pub fn codec(&self) -> RowCodec {
        self.codec
    }

    /// Writes the new row of `id` (initial weights and optimizer state) into its `words`; `scratch` holds the
    /// f32 row of a half-precision table on the way (one buffer per call, not per row).
    fn init_words(&self, id: u64, words: &mut [u32], scratch: &mut Vec<f32>) {
        if self.codec.is_plain() {
            init::fill_row(&self.cfg, id, bytemuck::cast_slice_mut(words));
        } else {
            scratch.resize(self.row_len, 0.0);
            init::fill_row(&self.cfg, id, scratch);
            self.codec.encode(scratch, words);
        }
    }

    /// [`EmbeddingError::InexactRow`] if a weight of `row` is not exact in the table's precision.
    fn check_exact(&self, id: u64, row: &[f32]) -> Result<(), EmbeddingError> {
        self.codec
            .check_exact(row)
            .map_err(|(element, value)| EmbeddingError::InexactRow {
                table: self.cfg.id,
                id,
                element,
                value,
                precision: self.codec.precision_of(element).name(),
            })
    }

    /// Rows held in memory.
    pub fn len(&self) -> usize {
        self.rows.load(Ordering::Relaxed)
    }

    /// True if no row was created or loaded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that `len` f32s hold `ids` rows of `dim` weights; the error names `what` was passed.
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
        self.gather_width(ids, out, self.cfg.dim, None)
    }

    /// [`Table::gather`], appending to `absent` the positions in `ids` (ascending) of the ids without a row in
    /// memory or the store, whose `out` rows are their initializer values: what the delta sync sends as
    /// deletions (a row expired, capped or never admitted).
    pub fn gather_or_absent(
        &self,
        ids: &[u64],
        out: &mut [f32],
        absent: &mut Vec<usize>,
    ) -> Result<GatherStats, EmbeddingError> {
        self.check_len("output", ids.len(), out.len())?;
        self.gather_width(ids, out, self.cfg.dim, Some(absent))
    }

    /// The weights of `ids` as bf16 bits (`ids.len() x dim`), for a table storing bf16 weights: what a pull in
    /// bf16 sends, copied from the stored halves without a conversion (a bf16 weight is the top half of its
    /// f32). Rows not in memory (read back from the store, or initial) go through [`Table::gather_stats`] and
    /// are converted, exactly. A table of another precision is refused (`InvalidConfig` on `precision`).
    pub fn gather_bf16(&self, ids: &[u64], out: &mut [u16]) -> Result<GatherStats, EmbeddingError> {
        let dim = self.cfg.dim;
        if self.codec.precision() != crate::RowPrecision::Bf16 {
            return Err(EmbeddingError::InvalidConfig {
                table: self.cfg.id,
                field: "precision",
                value: self.codec.precision().name().into(),
                expected: "bf16 for a pull of the stored bf16 weights",
            });
        }
        self.check_len("output", ids.len(), out.len())?;
        let clock = self.tier.is_some();
        let (order, bounds) = group_by_stripe(ids);
        let mut misses = Vec::new();
        {
            let _gate = self.tier.as_ref().map(|t| t.gate.read());
            self.for_each_group(&order, &bounds, |_, stripe, group| {
                stripe.lookup_each(ids, group, |stripe, i, slot| match slot {
                    Some(slot) => {
                        if clock {
                            stripe.set_ref(slot);
                        }
                        // Element 2k is the low half of word k: on a little-endian machine the words' halves in
                        // memory order are the weights, one copy.
                        let words = &stripe.arena.row(slot)[..dim.div_ceil(2)];
                        let dst = &mut out[i * dim..(i + 1) * dim];
                        if cfg!(target_endian = "little") {
                            dst.copy_from_slice(&bytemuck::cast_slice::<u32, u16>(words)[..dim]);
                        } else {
                            for (k, d) in dst.iter_mut().enumerate() {
                                *d = (words[k / 2] >> ((k % 2) * 16)) as u16;
                            }
                        }
                    }
                    None => misses.push(i),
                });
                Ok(())
            })?;
        }
        let mut stats = GatherStats::default();
        if clock {
            stats.rows_resident = ids.len() - misses.len();
        }
        if !misses.is_empty() {
            let missed: Vec<u64> = misses.iter().map(|&i| ids[i]).collect();
            let mut rows = vec![0f32; missed.len() * dim];
            let more = self.gather_stats(&missed, &mut rows)?;
            stats.rows_resident += more.rows_resident;
            stats.rows_read_back += more.rows_read_back;
            stats.rows_waited += more.rows_waited;
            for (&i, row) in misses.iter().zip(rows.chunks_exact(dim)) {
                for (d, w) in out[i * dim..(i + 1) * dim].iter_mut().zip(row) {
                    // Exact: the table holds bf16 values, and initial weights are rounded to them.
                    *d = (w.to_bits() >> 16) as u16;
                }
            }
        }
        Ok(stats)
    }

    /// Copies the whole stored rows of `ids` into `out` (`ids.len() x row_len`: the weights, then the
    /// optimizer state, as [`Table::row_len`] counts them). Ids without a row get their initializer values
    /// and a new row's optimizer state; no row is created. A trainer replaying its own unacknowledged
    /// updates on pulled rows needs the state the server will apply them with.
    pub fn gather_with_state(
        &self,
        ids: &[u64],
        out: &mut [f32],
    ) -> Result<GatherStats, EmbeddingError> {
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
        self.gather_width(ids, out, self.row_len, None)
    }

    /// Copies the first `width` f32s of each row of `ids` into `out` (`ids.len() x width`): `dim` (weights)
    /// or `row_len` (weights and state); the positions of ids without a row go to `absent`, if given.
    fn gather_width(
        &self,
        ids: &[u64],
        out: &mut [f32],
        width: usize,
        absent: Option<&mut Vec<usize>>,
    ) -> Result<GatherStats, EmbeddingError> {
        let dim = width;
        let _gate = self.tier.as_ref().map(|t| t.gate.read());
        let clock = self.tier.is_some();
        let (order, bounds) = group_by_stripe(ids);
        // Misses, and the misses that may have a stored row (not in the negative cache).
        let (mut misses, mut to_read) = (Vec::new(), Vec::new());
        self.for_each_group(&order, &bounds, |_, stripe, group| {
            stripe.lookup_each(ids, group, |stripe, i, slot| match slot {
                Some(slot) => {
                    if clock {
                        stripe.set_ref(slot);
                    }
                    self.codec
                        .decode(stripe.arena.row(slot), &mut out[i * dim..(i + 1) * dim])
                }
                None => {
                    misses.push(i);
                    if clock && !stripe.known_absent(ids[i]) {
                        to_read.push(i);
                    }
                }
            });
            Ok(())
        })?;
        let mut stats = GatherStats::default();
        if clock {
            stats.rows_resident = ids.len() - misses.len();
        }
        if !to_read.is_empty() && self.spilled() {
            let read = self.read_back(ids, &to_read)?;
            stats.rows_read_back = read.inserted;
            stats.rows_waited = read.waited;
            // Also when this call inserted nothing: another caller may have read a row back between this
            // call's miss and its read (which then found the row in memory and left it).
            misses = self.copy_found(ids, &misses, out, width)?;
        }
        if let Some(absent) = absent {
            let from = absent.len();
            absent.extend_from_slice(&misses);
            absent[from..].sort_unstable();
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

    /// The table's optimizer at `lr_scale` times its learning rate, or why not (not finite, negative, or an FTRL
    /// table's scale other than 1): what [`Table::apply_scaled`] checks first, for callers that must check
    /// several tables before applying to any.
    pub fn scaled_optimizer(
        &self,
        lr_scale: f32,
    ) -> Result<crate::config::OptimizerConfig, EmbeddingError> {
        let invalid = |expected| EmbeddingError::InvalidConfig {
            table: self.cfg.id,
            field: "lr_scale",
            value: lr_scale.to_string(),
            expected,
        };
        if !(lr_scale.is_finite() && lr_scale >= 0.0) {
            return Err(invalid("a finite number >= 0"));
        }
        self.cfg.optimizer.with_lr_scale(lr_scale).ok_or_else(|| {
            invalid("1 for an FTRL table (its per-coordinate rates take no multiplier)")
        })
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
        self.apply_scaled(ids, grads, now, 1.0)
    }

    /// [`Table::apply_at`] with the optimizer's learning rate multiplied by `lr_scale` (finite, >= 0) for this
    /// call ([`OptimizerConfig::with_lr_scale`](crate::config::OptimizerConfig::with_lr_scale)): a trainer's
    /// learning-rate schedule. Refused before any row changes for an FTRL table unless `lr_scale` is 1.
    pub fn apply_scaled(
        &self,
        ids: &[u64],
        grads: &[f32],
        now: u64,
        lr_scale: f32,
    ) -> Result<ApplyStats, EmbeddingError> {
        let opt = self.scaled_optimizer(lr_scale)?;
        self.check_len("gradient", ids.len(), grads.len())?;
        self.advance_clock(now);
        let stamp = stamp_of(now);
        let dim = self.cfg.dim;
        let _gate = self.tier.as_ref().map(|t| t.gate.read());
        let clock = self.tier.is_some();
        let (order, bounds) = group_by_stripe(ids);
        let mut stats = ApplyStats::default();
        let guard = *self.guard.read();
        // The row before its update, to undo an update that would leave a non-finite value (one buffer per
        // call, not per row).
        let mut before = vec![0f32; self.row_len];
        // The f32 row of a half-precision table while it is updated, and of a new row while it is packed.
        let half = !self.codec.is_plain();
        let (mut work, mut init_buf) =
            (vec![0f32; if half { self.row_len } else { 0 }], Vec::new());
        if self.spilled() {
            // Rows evicted to the store are read back before their update, not recreated.
            let mut misses = Vec::new();
            self.for_each_group(&order, &bounds, |_, stripe, group| {
                misses.extend(group.iter().filter(|&&i| {
                    let id = ids[i];
                    stripe.find(id, hash(id)).is_none() && !stripe.known_absent(id)
                }));
                Ok(())
            })?;
            if !misses.is_empty() {
                let read = self.read_back(ids, &misses)?;
                stats.rows_read_back = read.inserted;
                stats.rows_waited = read.waited;
            }
        }
        self.for_each_group(&order, &bounds, |s, stripe, group| {
            let mut full = None;
            stripe.lookup_each(ids, group, |stripe, i, found| {
                let grad = &grads[i * dim..(i + 1) * dim];
                if full.is_some() {
                    return;
                }
                if !crate::weight_guard::all_finite(grad) {
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
                        match stripe.insert(id, hash(id), |w| self.init_words(id, w, &mut init_buf))
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
                let words = stripe.arena.row_mut(slot);
                let row: &mut [f32] = if half {
                    self.codec.decode(words, &mut work);
                    &mut work
                } else {
                    bytemuck::cast_slice_mut(words)
                };
                before.copy_from_slice(row);
                let (weights, state) = row.split_at_mut(dim);
                optimizer::update(&opt, self.reg, weights, state, grad);
                // A half-precision row's new weights are rounded (stochastically) before the guard sees them,
                // so what it checks is what is stored.
                self.codec.round_updated(id, weights, state);
                match guard.check(&before, row, dim) {
                    crate::Guarded::Kept => {}
                    crate::Guarded::Refused => {
                        // The row is as before (a new one as its initializer made it, which needs no write).
                        stats.refused_nonfinite_weights += 1;
                        return;
                    }
                    crate::Guarded::Clamped => {
                        self.codec.round_weights_nearest(&mut row[..dim]);
                        stats.clamped_weights += 1
                    }
                }
                if half {
                    self.codec.encode(&work, stripe.arena.row_mut(slot));
                }
                stripe.arena.bump_count(slot);
                stripe.mark_dirty(slot);
                stats.applied += 1;
            });
            full.map_or(Ok(()), Err)
        })?;
        Ok(stats)
    }

    /// The error of stripe `stripe` holding `rows` rows, as many as its `u32` slot numbers address.
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
        stripe.find(id, h).map(|slot| {
            let mut row = vec![0f32; self.row_len];
            self.codec.decode(stripe.arena.row(slot), &mut row);
            row
        })
    }

    /// Inserts or overwrites the full row of `id` (`row_len` f32s) without marking it dirty: for recovery from
    /// the store. A bf16 or f16 table refuses a weight its precision does not hold exactly
    /// ([`EmbeddingError::InexactRow`]), changing nothing. With a TTL, its last touch is unknown until the next [`Table::expired`], which starts its
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
        self.check_exact(id, row)?;
        let h = hash(id);
        let s = stripe_of(h);
        let mut stripe = self.stripes[s].0.lock();
        let slot = match stripe.find(id, h) {
            Some(slot) => {
                self.codec.encode(row, stripe.arena.row_mut(slot));
                slot
            }
            None => {
                let slot = stripe
                    .insert(id, h, |dst| self.codec.encode(row, dst))
                    .map_err(|rows| self.full(s, rows))?;
                self.rows.fetch_add(1, Ordering::Relaxed);
                slot
            }
        };
        stripe.arena.set_stamp(slot, STAMP_UNKNOWN);
        Ok(())
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
