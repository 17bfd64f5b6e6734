//! Listing a table's rows in id order, a page at a time ([`Table::ids_after`]): the full scan of the delta
//! sync (`ps-server`'s `sync` module) reads every row of every table this way, without holding any lock
//! between pages.

use super::stripe::hash;
use super::Table;

impl Table {
    /// Appends to `out` (cleared first) the smallest `limit` ids above `after` (all ids when `None`) that
    /// have a row in memory, ascending. Rows evicted to the store are not seen here
    /// ([`crate::Engine::scan_ids`] adds them).
    ///
    /// Cost: one pass over every slot of every stripe, under each stripe lock in turn, and memory for at most
    /// `2 x limit` ids; so paging through `n` rows `limit` at a time costs `n / limit` passes.
    pub fn ids_after(&self, after: Option<u64>, limit: usize, out: &mut Vec<u64>) {
        out.clear();
        if limit == 0 {
            return;
        }
        let above = |id: u64| after.is_none_or(|a| id > a);
        for p in self.stripes.iter() {
            let stripe = p.0.lock();
            for slot in 0..stripe.arena.slots() {
                // A free slot keeps its old id, which the index maps to another slot or to nothing.
                let id = stripe.arena.id(slot);
                if above(id) && stripe.find(id, hash(id)) == Some(slot) {
                    out.push(id);
                    if out.len() >= limit.saturating_mul(2) {
                        keep_smallest(out, limit);
                    }
                }
            }
        }
        keep_smallest(out, limit);
        out.sort_unstable();
    }
}

/// Keeps the `limit` smallest values of `ids` (in any order).
pub(crate) fn keep_smallest(ids: &mut Vec<u64>, limit: usize) {
    if ids.len() > limit {
        ids.select_nth_unstable(limit);
        ids.truncate(limit);
    }
}

#[cfg(test)]
mod tests {
    use crate::config::TableConfig;
    use crate::Table;

    fn table() -> Table {
        Table::new(TableConfig::counter(1, 2)).unwrap()
    }

    #[test]
    fn pages_cover_every_row_once_in_id_order() {
        let t = table();
        let ids: Vec<u64> = (0..500u64).map(|i| i * 7919 % 100_003).collect();
        let grads = vec![1.0; ids.len() * 2];
        t.apply(&ids, &grads).unwrap();
        let mut expected = ids.clone();
        expected.sort_unstable();
        let (mut seen, mut page, mut after) = (Vec::new(), Vec::new(), None);
        loop {
            t.ids_after(after, 37, &mut page);
            if page.is_empty() {
                break;
            }
            assert!(page.windows(2).all(|w| w[0] < w[1]));
            after = page.last().copied();
            seen.extend_from_slice(&page);
        }
        assert_eq!(seen, expected);
        t.ids_after(None, 0, &mut page);
        assert!(page.is_empty());
    }
}
