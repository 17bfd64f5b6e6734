//! [`Dedup`]: first-seen deduplication of ids, the one of the workspace: the plan dedups each table's ids with
//! it, and the Python package's `unique_inverse` (numpy's `np.unique(return_inverse=True)` sorts, which was a
//! tenth of the PyTorch layer's step) is a loop over it. One pass over a hash map keyed by [`IdHasher`].

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use base::hash::IdHasher;

/// Positions of the distinct ids seen so far. Call order: [`Dedup::clear`] per set of ids, then
/// [`Dedup::position`] per id, in order; the caller owns the `unique` list the positions index.
#[derive(Debug, Default)]
pub struct Dedup {
    seen: HashMap<u64, u32, BuildHasherDefault<IdHasher>>,
}

impl Dedup {
    /// Room for `n` distinct ids without growing.
    pub fn with_capacity(n: usize) -> Dedup {
        Dedup {
            seen: HashMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Forgets every id, keeping the memory.
    pub fn clear(&mut self) {
        self.seen.clear();
    }

    /// The position of `id` in `unique`, which gets `id` appended when it was not seen since the last
    /// [`Dedup::clear`].
    #[inline]
    pub fn position(&mut self, id: u64, unique: &mut Vec<u64>) -> u32 {
        let next = unique.len() as u32;
        let pos = *self.seen.entry(id).or_insert(next);
        if pos == next {
            unique.push(id);
        }
        pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_seen_order_and_positions() {
        let mut d = Dedup::default();
        let mut unique = Vec::new();
        let pos: Vec<u32> = [7u64, 3, 7, 9, 3]
            .iter()
            .map(|&id| d.position(id, &mut unique))
            .collect();
        assert_eq!(unique, [7, 3, 9]);
        assert_eq!(pos, [0, 1, 0, 2, 1]);
        d.clear();
        unique.clear();
        assert_eq!(d.position(9, &mut unique), 0);
    }
}
