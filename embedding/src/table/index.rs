//! [`Index`]: one stripe's map from row id to arena slot, an open-addressing table of `u32` entries.
//!
//! # Why not `hashbrown::HashTable<u32>`
//! hashbrown costs 5 bytes per bucket (a `u32` plus a control byte), doubles its buckets and fills them to at
//! most 7/8, so it costs 5.7 to 11.4 bytes per row depending on where the row count falls between two powers
//! of two: at 10M rows of dim 16 with row-wise Adagrad the table came to 85.1 bytes per row against a limit of
//! 85 (1.25x the 68-byte payload). This index costs 4 bytes per bucket and grows by 1.5x at a load of 0.85, so
//! it stays between 4.7 and 7.1 bytes per row at every size.
//!
//! # Layout
//! - The bucket count is any number (not a power of two): the home bucket of hash `h` is `h * cap / 2^64`
//!   (Lemire's multiply-shift range reduction), from the high bits of `h`.
//! - An entry is `0` (empty) or `tag << slot_bits | (slot + 1)`, where `slot_bits` is the width of the bucket
//!   count (slots are always below it, see [`Index::insert`]) and the tag is the low `32 - slot_bits` bits of
//!   `h`: a probe compares tags first and reads the row's id from the arena (a cache miss) only on a tag
//!   match. At 625k rows per stripe (10M rows in 16 stripes) tags have 12 bits.
//! - Linear probing: a lookup scans forward from the home bucket to an empty entry, 16 entries per cache line.
//!   Removal shifts later entries of the run back (no tombstones), so lookups never slow down with churn.
//!
//! The index does not know ids: callers pass closures that compare a slot's id or compute a slot's hash, read
//! from the arena.

/// Largest load (entries / buckets) before growing, as a fraction `LOAD_NUM / LOAD_DEN` (0.85).
const LOAD_NUM: usize = 17;
const LOAD_DEN: usize = 20;
/// Smallest bucket count allocated.
const MIN_BUCKETS: usize = 16;

/// A stripe's id → slot index. Entries are `u32`; see the module docs.
#[derive(Debug, Default)]
pub(super) struct Index {
    entries: Box<[u32]>,
    len: usize,
    /// Width of the slot part of an entry (`slot + 1` fits in it).
    slot_bits: u32,
}

impl Index {
    /// An empty index (no allocation).
    pub(super) fn new() -> Self {
        Index::default()
    }

    /// Entries held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.entries.len() * 4
    }

    #[inline]
    fn slot_mask(&self) -> u32 {
        u32::MAX.checked_shr(32 - self.slot_bits).unwrap_or(0)
    }

    /// The tag part of an entry for hash `h` (0 when slots take all 32 bits).
    #[inline]
    fn tag(&self, h: u64) -> u32 {
        (h as u32).checked_shl(self.slot_bits).unwrap_or(0)
    }

    #[inline]
    fn home(h: u64, cap: usize) -> usize {
        ((u128::from(h) * cap as u128) >> 64) as usize
    }

    /// The slot whose entry has hash `h` and for which `is(slot)` holds (the caller compares ids).
    #[inline]
    pub(super) fn find(&self, h: u64, mut is: impl FnMut(usize) -> bool) -> Option<usize> {
        let cap = self.entries.len();
        if cap == 0 {
            return None;
        }
        let (mask, want) = (self.slot_mask(), self.tag(h));
        let mut i = Self::home(h, cap);
        loop {
            let e = self.entries[i];
            if e == 0 {
                return None;
            }
            if e & !mask == want {
                let slot = (e & mask) as usize - 1;
                if is(slot) {
                    return Some(slot);
                }
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
    }

    /// Hints the CPU to load the home bucket of `h` into cache.
    #[inline]
    pub(super) fn prefetch(&self, h: u64) {
        let cap = self.entries.len();
        if cap > 0 {
            crate::prefetch::read(self.entries.as_ptr().wrapping_add(Self::home(h, cap)));
        }
    }

    /// The slot of the first entry from the home of `h` whose tag matches: most likely the slot of the id
    /// with hash `h`, for prefetching its row before [`Index::find`] confirms it.
    #[inline]
    pub(super) fn candidate(&self, h: u64) -> Option<usize> {
        self.find(h, |_| true)
    }

    /// Adds `slot` (not in the index) under hash `h`; `hash_of(slot)` gives the hash of any slot already held,
    /// for growing. Slots must stay below the largest entry count the index ever held plus one, which an arena
    /// that reuses freed slots before new ones guarantees; a larger slot is still handled (the index grows).
    pub(super) fn insert(&mut self, h: u64, slot: usize, hash_of: impl Fn(usize) -> u64) {
        debug_assert!(slot < u32::MAX as usize);
        let cap = self.entries.len();
        if (self.len + 1) * LOAD_DEN > cap * LOAD_NUM || slot + 1 > self.slot_mask() as usize {
            let want = ((self.len + 1) * LOAD_DEN / LOAD_NUM + 1)
                .max(cap + cap / 2)
                .max(slot + 2)
                .max(MIN_BUCKETS);
            self.rebuild(want, &hash_of);
        }
        self.place(h, slot);
        self.len += 1;
    }

    /// Writes the entry of `slot` into the first empty bucket from its home (there is always one).
    #[inline]
    fn place(&mut self, h: u64, slot: usize) {
        let cap = self.entries.len();
        let e = self.tag(h) | (slot as u32 + 1);
        let mut i = Self::home(h, cap);
        while self.entries[i] != 0 {
            i += 1;
            if i == cap {
                i = 0;
            }
        }
        self.entries[i] = e;
    }

    /// Moves every entry into `cap` new buckets.
    fn rebuild(&mut self, cap: usize, hash_of: &impl Fn(usize) -> u64) {
        let old = std::mem::replace(&mut self.entries, vec![0u32; cap].into_boxed_slice());
        let old_mask = self.slot_mask();
        self.slot_bits = (usize::BITS - cap.leading_zeros()).min(32);
        for e in old.iter().copied().filter(|&e| e != 0) {
            let slot = (e & old_mask) as usize - 1;
            self.place(hash_of(slot), slot);
        }
    }

    /// Removes the entry of `slot` (hash `h`); returns whether it was there. `hash_of` as for
    /// [`Index::insert`]: the entries after it in its run move back, so no tombstone is left.
    pub(super) fn remove(&mut self, h: u64, slot: usize, hash_of: impl Fn(usize) -> u64) -> bool {
        let cap = self.entries.len();
        if cap == 0 {
            return false;
        }
        let mask = self.slot_mask();
        let mut hole = Self::home(h, cap);
        loop {
            let e = self.entries[hole];
            if e == 0 {
                return false;
            }
            if (e & mask) as usize == slot + 1 {
                break;
            }
            hole = if hole + 1 == cap { 0 } else { hole + 1 };
        }
        // Backward shift: an entry at `j` whose home is `k` may fill the hole if the hole lies in [k, j)
        // (cyclically), i.e. the hole is no farther back from `j` than its home is.
        let mut j = hole;
        loop {
            j = if j + 1 == cap { 0 } else { j + 1 };
            let e = self.entries[j];
            if e == 0 {
                break;
            }
            let k = Self::home(hash_of((e & mask) as usize - 1), cap);
            let from_home = (j + cap - k) % cap;
            let from_hole = (j + cap - hole) % cap;
            if from_home >= from_hole {
                self.entries[hole] = e;
                hole = j;
            }
        }
        self.entries[hole] = 0;
        self.len -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use base::hash::splitmix64;

    /// A model arena: slot → id, with freed slots reused last-freed first, like `Arena`.
    struct Model {
        ids: Vec<u64>,
        free: Vec<usize>,
        by_id: HashMap<u64, usize>,
        index: Index,
    }

    impl Model {
        fn new() -> Self {
            Model {
                ids: Vec::new(),
                free: Vec::new(),
                by_id: HashMap::new(),
                index: Index::new(),
            }
        }

        fn find(&self, id: u64) -> Option<usize> {
            self.index.find(splitmix64(id), |s| self.ids[s] == id)
        }

        fn insert(&mut self, id: u64) {
            let slot = match self.free.pop() {
                Some(s) => {
                    self.ids[s] = id;
                    s
                }
                None => {
                    self.ids.push(id);
                    self.ids.len() - 1
                }
            };
            let ids = &self.ids;
            self.index
                .insert(splitmix64(id), slot, |s| splitmix64(ids[s]));
            self.by_id.insert(id, slot);
        }

        fn remove(&mut self, id: u64) {
            let slot = self.by_id.remove(&id).unwrap();
            let ids = &self.ids;
            assert!(self
                .index
                .remove(splitmix64(id), slot, |s| splitmix64(ids[s])));
            self.free.push(slot);
        }

        fn check(&self) {
            assert_eq!(self.index.len(), self.by_id.len());
            for (&id, &slot) in &self.by_id {
                assert_eq!(self.find(id), Some(slot), "id {id}");
            }
        }
    }

    #[test]
    fn insert_find_remove_against_a_hashmap() {
        let mut m = Model::new();
        let mut x = 1u64;
        for step in 0..60_000u64 {
            x = splitmix64(x);
            // Ids from a small range, so inserts, hits and removals all happen.
            let id = x % 20_000;
            if m.by_id.contains_key(&id) {
                if x >> 62 == 0 {
                    m.remove(id);
                } else {
                    assert!(m.find(id).is_some());
                }
            } else {
                assert_eq!(m.find(id), None);
                m.insert(id);
            }
            if step % 10_000 == 0 {
                m.check();
            }
        }
        m.check();
        for id in m.by_id.keys().copied().collect::<Vec<_>>() {
            m.remove(id);
        }
        assert_eq!(m.index.len(), 0);
        assert!(m.index.entries.iter().all(|&e| e == 0));
    }

    #[test]
    fn colliding_hashes_wrap_around_the_end() {
        // Hashes near 2^64 all have their home in the last bucket: their run wraps to bucket 0.
        let mut index = Index::new();
        let hashes: Vec<u64> = (0..10u64).map(|k| u64::MAX - k).collect();
        for (slot, &h) in hashes.iter().enumerate() {
            index.insert(h, slot, |s| hashes[s]);
        }
        assert_eq!(index.entries.len(), MIN_BUCKETS);
        assert_ne!(index.entries[0], 0, "the run wrapped");
        for (slot, &h) in hashes.iter().enumerate() {
            assert_eq!(index.find(h, |s| s == slot), Some(slot));
        }
        for slot in [0, 5, 9, 1] {
            assert!(index.remove(hashes[slot], slot, |s| hashes[s]));
            assert_eq!(index.find(hashes[slot], |s| s == slot), None);
        }
        for slot in [2, 3, 4, 6, 7, 8] {
            assert_eq!(index.find(hashes[slot], |s| s == slot), Some(slot));
        }
        assert!(!index.remove(hashes[0], 0, |s| hashes[s]));
    }

    #[test]
    fn bytes_per_entry_stay_between_4_7_and_7_1() {
        let mut m = Model::new();
        for id in 0..200_000u64 {
            m.insert(id);
            let n = id as usize + 1;
            if n >= 1000 {
                let per = m.index.allocation_size() as f64 / n as f64;
                assert!((4.7..7.1).contains(&per), "{per} bytes per entry at {n}");
            }
        }
        m.check();
    }

    #[test]
    fn tags_shrink_as_slots_grow() {
        let mut index = Index::new();
        index.rebuild(16, &|_| 0);
        assert_eq!(index.slot_bits, 5);
        assert_eq!(index.tag(0xFFFF_FFFF), 0xFFFF_FFE0);
        index.rebuild(usize::from(u16::MAX) * 2, &|_| 0);
        assert_eq!(index.slot_bits, 17);
        index.slot_bits = 32;
        assert_eq!((index.tag(0xFFFF_FFFF), index.slot_mask()), (0, u32::MAX));
    }
}
