//! [`Arena`]: rows of one stripe stored contiguously in fixed-size chunks, each row beside its id. A row is
//! `u32` words, packed by the table's [`crate::RowCodec`] (f32 weights, or two half weights a word, then f32
//! optimizer state).
//!
//! DESIGN.md asks for rows "stored contiguously (weights followed by optimizer state) in arenas ... no heap
//! allocation per row" and memory close to the payload. One `Vec<f32>` per stripe would double on growth: up to 2x
//! the payload, and a copy of the whole stripe under its lock. Chunks of about 64 KiB bound the slack to the last
//! chunk, whose capacity itself grows by doubling, so small tables stay small too. A slot number is a `u32`
//! (chunk = slot >> shift, row = slot & mask); the id of each slot is kept so the dirty write-back and the index
//! (which stores only slot numbers) can find it.
//!
//! Removed rows leave their slot on a free list, and the next [`Arena::push`] reuses it, so a table whose rows
//! expire (TTL) does not grow without bound. Tables with a TTL also keep a `u32` last-touched time per slot
//! (4 bytes per row), and tables with a row cap a `u32` per slot (4 bytes per row): an update count (LFU), or
//! the bits of a score (a non-negative f32, whose bits order as its values do); other tables allocate nothing
//! for them.

use crate::prefetch;

/// Target bytes of row data per chunk.
const CHUNK_BYTES: usize = 64 * 1024;
/// Smallest capacity, in rows, of a chunk's first allocation.
const MIN_ROWS: usize = 16;

/// One chunk: up to `1 << shift` rows, their ids and (with stamps on) their last-touched times.
#[derive(Debug)]
struct Chunk {
    ids: Vec<u64>,
    rows: Vec<u32>,
    stamps: Vec<u32>,
    counts: Vec<u32>,
}

/// The rows of one stripe.
#[derive(Debug)]
pub(crate) struct Arena {
    /// `u32` words per row ([`crate::RowCodec::words`]).
    row_len: usize,
    shift: u32,
    /// Slots ever used (live + free): the next new slot.
    len: usize,
    chunks: Vec<Chunk>,
    /// Removed slots, reused by [`Arena::push`] (last removed first).
    free: Vec<u32>,
    /// Whether each slot has a `u32` stamp.
    stamps: bool,
    /// Whether each slot has a `u32` update count.
    counts: bool,
    /// Whether those `u32`s are the bits of scores (non-negative f32) rather than update counts.
    scores: bool,
}

/// What the `u32` kept per slot of a capped table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counts {
    /// Nothing is kept.
    None,
    /// Update counts: each update adds one; a decay halves them.
    Updates,
    /// Scores set by the trainer, as f32 bits: updates leave them; a decay halves them.
    Scores,
}

impl Arena {
    /// An empty arena for rows of `row_len` words (`row_len >= 1`; a row's packing is [`crate::RowCodec`]'s), with a `u32` stamp per slot if `stamps`.
    #[cfg(test)]
    pub(crate) fn new(row_len: usize, stamps: bool) -> Self {
        Arena::with_counts(row_len, stamps, Counts::None)
    }

    /// [`Arena::new`], with a `u32` update count or score per slot as `counts` says (tables with a cap).
    pub(crate) fn with_counts(row_len: usize, stamps: bool, counts: Counts) -> Self {
        let rows = (CHUNK_BYTES / (row_len * 4)).max(1);
        // Largest power of two <= rows.
        let shift = usize::BITS - 1 - rows.leading_zeros();
        Arena {
            row_len,
            shift,
            len: 0,
            chunks: Vec::new(),
            free: Vec::new(),
            stamps,
            counts: counts != Counts::None,
            scores: counts == Counts::Scores,
        }
    }

    /// Live rows held.
    pub(crate) fn len(&self) -> usize {
        self.len - self.free.len()
    }

    /// Slots ever used (live or free): every slot number is below it.
    pub(crate) fn slots(&self) -> usize {
        self.len
    }

    fn chunk_rows(&self) -> usize {
        1 << self.shift
    }

    /// Adds a zeroed row for `id` (stamp 0), reusing a free slot if there is one, and returns its slot and the
    /// row to fill.
    pub(crate) fn push(&mut self, id: u64) -> (usize, &mut [u32]) {
        if let Some(slot) = self.free.pop() {
            let slot = slot as usize;
            let (c, r) = (slot >> self.shift, slot & (self.chunk_rows() - 1));
            let chunk = &mut self.chunks[c];
            chunk.ids[r] = id;
            if self.stamps {
                chunk.stamps[r] = 0;
            }
            if self.counts {
                chunk.counts[r] = 0;
            }
            let row = &mut chunk.rows[r * self.row_len..(r + 1) * self.row_len];
            row.fill(0);
            return (slot, row);
        }
        let chunk_rows = self.chunk_rows();
        let row_len = self.row_len;
        if self.len & (chunk_rows - 1) == 0 {
            self.chunks.push(Chunk {
                ids: Vec::new(),
                rows: Vec::new(),
                stamps: Vec::new(),
                counts: Vec::new(),
            });
        }
        let chunk = self.chunks.last_mut().expect("a chunk was just ensured");
        if chunk.ids.len() == chunk.ids.capacity() {
            // Double up to the chunk size, exactly: the slack stays within this chunk.
            let want = (chunk.ids.len() * 2).clamp(MIN_ROWS.min(chunk_rows), chunk_rows);
            chunk.ids.reserve_exact(want - chunk.ids.len());
            chunk.rows.reserve_exact(want * row_len - chunk.rows.len());
            if self.stamps {
                chunk.stamps.reserve_exact(want - chunk.stamps.len());
            }
            if self.counts {
                chunk.counts.reserve_exact(want - chunk.counts.len());
            }
        }
        chunk.ids.push(id);
        if self.stamps {
            chunk.stamps.push(0);
        }
        if self.counts {
            chunk.counts.push(0);
        }
        let start = chunk.rows.len();
        chunk.rows.resize(start + row_len, 0);
        let slot = self.len;
        self.len += 1;
        (slot, &mut chunk.rows[start..])
    }

    /// Frees `slot` (live) for reuse by a later [`Arena::push`]. Its contents stay until then.
    pub(crate) fn remove(&mut self, slot: usize) {
        debug_assert!(slot < self.len && !self.free.contains(&(slot as u32)));
        self.free.push(slot as u32);
    }

    /// The stamp of `slot` (0 if the arena keeps no stamps).
    #[inline]
    pub(crate) fn stamp(&self, slot: usize) -> u32 {
        if !self.stamps {
            return 0;
        }
        self.chunks[slot >> self.shift].stamps[slot & (self.chunk_rows() - 1)]
    }

    /// Sets the stamp of `slot` (ignored if the arena keeps no stamps).
    #[inline]
    pub(crate) fn set_stamp(&mut self, slot: usize, stamp: u32) {
        if self.stamps {
            let mask = self.chunk_rows() - 1;
            self.chunks[slot >> self.shift].stamps[slot & mask] = stamp;
        }
    }

    /// The update count of `slot` (0 if the arena keeps no counts).
    #[inline]
    pub(crate) fn count(&self, slot: usize) -> u32 {
        if !self.counts {
            return 0;
        }
        self.chunks[slot >> self.shift].counts[slot & (self.chunk_rows() - 1)]
    }

    /// Adds one to the update count of `slot`, saturating (nothing if the arena keeps no counts, or scores).
    #[inline]
    pub(crate) fn bump_count(&mut self, slot: usize) {
        if self.counts && !self.scores {
            let mask = self.chunk_rows() - 1;
            let c = &mut self.chunks[slot >> self.shift].counts[slot & mask];
            *c = c.saturating_add(1);
        }
    }

    /// Adds `score` (finite, `>= 0`) to the score of `slot`, or sets it (`set`); the sum saturates at
    /// `f32::MAX`. Nothing if the arena keeps no scores.
    #[inline]
    pub(crate) fn score(&mut self, slot: usize, score: f32, set: bool) {
        if self.scores {
            let mask = self.chunk_rows() - 1;
            let c = &mut self.chunks[slot >> self.shift].counts[slot & mask];
            let new = if set {
                score
            } else {
                f32::from_bits(*c) + score
            };
            *c = new.min(f32::MAX).to_bits();
        }
    }

    /// Halves every slot's update count or score (the decay of a cap).
    pub(crate) fn halve_counts(&mut self) {
        let scores = self.scores;
        for chunk in &mut self.chunks {
            if scores {
                chunk
                    .counts
                    .iter_mut()
                    .for_each(|c| *c = (f32::from_bits(*c) * 0.5).to_bits());
            } else {
                chunk.counts.iter_mut().for_each(|c| *c >>= 1);
            }
        }
    }

    /// The id stored in `slot`.
    #[inline]
    pub(crate) fn id(&self, slot: usize) -> u64 {
        self.chunks[slot >> self.shift].ids[slot & (self.chunk_rows() - 1)]
    }

    /// The row in `slot`.
    #[inline]
    pub(crate) fn row(&self, slot: usize) -> &[u32] {
        let start = (slot & (self.chunk_rows() - 1)) * self.row_len;
        &self.chunks[slot >> self.shift].rows[start..start + self.row_len]
    }

    /// The row in `slot`, mutably.
    #[inline]
    pub(crate) fn row_mut(&mut self, slot: usize) -> &mut [u32] {
        let start = (slot & (self.chunk_rows() - 1)) * self.row_len;
        let row_len = self.row_len;
        &mut self.chunks[slot >> self.shift].rows[start..start + row_len]
    }

    /// Hints the CPU to load the id and row of `slot` (live or free) into cache; no effect on results.
    #[inline]
    pub(crate) fn prefetch(&self, slot: usize) {
        let (c, r) = (slot >> self.shift, slot & (self.chunk_rows() - 1));
        if let Some(chunk) = self.chunks.get(c) {
            prefetch::read(chunk.ids.as_ptr().wrapping_add(r));
            let row = chunk.rows.as_ptr().wrapping_add(r * self.row_len);
            prefetch::read(row);
            prefetch::read(row.wrapping_add(self.row_len - 1));
        }
    }

    /// Heap bytes allocated (capacity, not length).
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Chunk>()
            + self.free.capacity() * 4
            + self
                .chunks
                .iter()
                .map(|c| {
                    c.ids.capacity() * 8
                        + c.rows.capacity() * 4
                        + (c.stamps.capacity() + c.counts.capacity()) * 4
                })
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_across_chunks() {
        // 64 KiB / (4096 * 4) = 4 rows per chunk.
        let mut a = Arena::new(4096, false);
        assert_eq!(a.chunk_rows(), 4);
        for id in 0..10u64 {
            let (slot, row) = a.push(id * 3);
            assert_eq!(slot as u64, id);
            row[0] = id as u32;
            row[4095] = !(id as u32);
        }
        assert_eq!(a.len(), 10);
        assert_eq!(a.chunks.len(), 3);
        for slot in 0..10 {
            assert_eq!(a.id(slot), slot as u64 * 3);
            assert_eq!(a.row(slot)[0], slot as u32);
            assert_eq!(a.row(slot)[4095], !(slot as u32));
        }
        a.row_mut(9)[1] = 5;
        assert_eq!(a.row(9)[1], 5);
    }

    #[test]
    fn slack_is_bounded() {
        let mut a = Arena::new(17, false);
        for id in 0..100_000u64 {
            a.push(id);
        }
        let payload = 100_000 * (17 * 4 + 8);
        let bytes = a.allocated_bytes();
        assert!(
            bytes >= payload && bytes < payload + payload / 10,
            "{bytes} vs {payload}"
        );
    }

    #[test]
    fn removed_slots_are_reused_and_zeroed() {
        let mut a = Arena::new(2, true);
        for id in 0..5u64 {
            let (slot, row) = a.push(id);
            row.fill(id as u32 + 1);
            a.set_stamp(slot, 100 + id as u32);
        }
        assert_eq!(a.stamp(3), 103);
        a.remove(1);
        a.remove(3);
        assert_eq!((a.len(), a.slots()), (3, 5));
        let (slot, row) = a.push(42);
        assert_eq!(slot, 3);
        assert_eq!(row, &[0, 0]);
        assert_eq!((a.id(3), a.stamp(3)), (42, 0));
        assert_eq!(a.push(43).0, 1);
        assert_eq!(a.push(44).0, 5);
        assert_eq!((a.len(), a.slots()), (6, 6));
        assert_eq!(a.row(4), &[5, 5]);
    }

    #[test]
    fn stamps_cost_four_bytes_per_row_only_when_on() {
        let (mut off, mut on) = (Arena::new(16, false), Arena::new(16, true));
        for id in 0..10_000u64 {
            off.push(id);
            on.push(id);
        }
        // 4 bytes per row, plus the last chunk's slack (10,000 rows fill 10 chunks of 1,024).
        let extra = on.allocated_bytes() - off.allocated_bytes();
        assert_eq!(extra, 10 * 1024 * 4);
        assert_eq!(off.stamp(5), 0);
    }

    #[test]
    fn scores_add_set_halve_and_order_as_their_values() {
        let mut a = Arena::with_counts(2, false, Counts::Scores);
        for id in 0..3 {
            a.push(id);
        }
        a.bump_count(0); // An update leaves a score.
        a.score(0, 1.5, false);
        a.score(0, 0.25, false);
        a.score(1, 7.0, true);
        a.score(1, 3.0, true);
        a.score(2, f32::MAX, false);
        a.score(2, f32::MAX, false); // Saturates.
        let s = |a: &Arena, slot| f32::from_bits(a.count(slot));
        assert_eq!((s(&a, 0), s(&a, 1), s(&a, 2)), (1.75, 3.0, f32::MAX));
        assert!(a.count(0) < a.count(1) && a.count(1) < a.count(2));
        a.halve_counts();
        assert_eq!((s(&a, 0), s(&a, 1)), (0.875, 1.5));
        // A reused slot starts at 0.
        a.remove(0);
        let (slot, _) = a.push(9);
        assert_eq!((slot, a.count(slot)), (0, 0));
        // Counts ignore scores, and the reverse.
        let mut c = Arena::with_counts(2, false, Counts::Updates);
        c.push(1);
        c.score(0, 5.0, false);
        c.bump_count(0);
        assert_eq!(c.count(0), 1);
    }
}
