//! Copying whole rows between the replicas of a shard: [`Table::store_rows`], with which a backup takes its
//! primary's rows, and [`Table::stripe_ids`], the primary's catch-up scan of a joining backup, one stripe at a
//! time (one pass over the table in all, where paging by id ([`Table::ids_after`]) passes once per page).

use std::sync::atomic::Ordering;

use super::expire::stamp_of;
use super::stripe::{group_by_stripe, hash};
use super::{EmbeddingError, Table};

impl Table {
    /// Deletes the rows of `ids` from memory (a reshard moved them to another server), dirty changes
    /// included; returns how many were held. Their slots are reused by later rows.
    pub fn remove_rows(&self, ids: &[u64]) -> usize {
        let (order, bounds) = group_by_stripe(ids);
        let mut removed = 0;
        // The closure never fails.
        let _ = self.for_each_group(&order, &bounds, |_, stripe, group| {
            for &i in group {
                let id = ids[i];
                let h = hash(id);
                if let Some(slot) = stripe.find(id, h) {
                    stripe.remove(id, h, slot);
                    removed += 1;
                }
            }
            Ok(())
        });
        self.rows.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Number of stripes ([`Table::stripe_ids`] takes `0..stripe_count()`).
    pub fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    /// Appends to `out` (cleared first) the ids of the rows stripe `stripe` holds in memory, in slot order.
    /// Rows evicted to the store are not seen here. Panics if `stripe >= stripe_count()`.
    pub fn stripe_ids(&self, stripe: usize, out: &mut Vec<u64>) {
        out.clear();
        let s = self.stripes[stripe].0.lock();
        for slot in 0..s.arena.slots() {
            // A free slot keeps its old id, which the index maps to another slot or to nothing.
            let id = s.arena.id(slot);
            if s.find(id, hash(id)) == Some(slot) {
                out.push(id);
            }
        }
    }

    /// Inserts or overwrites the full rows (weights then optimizer state, `row_len` f32s each) of `ids`,
    /// marks them dirty (so the write-back stores them) and stamps them with `now` (seconds) for TTL expiry:
    /// a backup taking rows its primary computed. No optimizer runs and no admission applies: the rows are
    /// the primary's. Duplicate ids keep the last row. Returns the rows created. A bf16 or f16 table refuses the
    /// call, changing nothing, if a weight is not exact in its precision ([`EmbeddingError::InexactRow`]).
    pub fn store_rows(&self, ids: &[u64], rows: &[f32], now: u64) -> Result<usize, EmbeddingError> {
        if rows.len() != ids.len() * self.row_len {
            return Err(EmbeddingError::WrongLength {
                table: self.cfg.id,
                what: "replicated rows",
                len: rows.len(),
                expected: ids.len() * self.row_len,
                ids: ids.len(),
                dim: self.row_len,
            });
        }
        self.advance_clock(now);
        let stamp = stamp_of(now);
        let row_len = self.row_len;
        let _gate = self.tier.as_ref().map(|t| t.gate.read());
        let clock = self.tier.is_some();
        for (i, &id) in ids.iter().enumerate() {
            self.check_exact(id, &rows[i * row_len..(i + 1) * row_len])?;
        }
        let (order, bounds) = group_by_stripe(ids);
        let mut created = 0;
        self.for_each_group(&order, &bounds, |s, stripe, group| {
            let mut full = None;
            stripe.lookup_each(ids, group, |stripe, i, found| {
                if full.is_some() {
                    return;
                }
                let row = &rows[i * row_len..(i + 1) * row_len];
                let slot = match found {
                    Some(slot) => {
                        self.codec.encode(row, stripe.arena.row_mut(slot));
                        slot
                    }
                    None => {
                        match stripe.insert(ids[i], hash(ids[i]), |dst| self.codec.encode(row, dst))
                        {
                            Ok(slot) => {
                                created += 1;
                                slot
                            }
                            Err(n) => {
                                full = Some(self.full(s, n));
                                return;
                            }
                        }
                    }
                };
                stripe.arena.set_stamp(slot, stamp);
                stripe.arena.bump_count(slot);
                if clock {
                    stripe.set_ref(slot);
                }
                stripe.mark_dirty(slot);
            });
            full.map_or(Ok(()), Err)
        })?;
        self.rows.fetch_add(created, Ordering::Relaxed);
        Ok(created)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{OptimizerConfig, TableConfig};
    use crate::Table;

    fn table() -> Table {
        let mut cfg = TableConfig::new(3, "t", 2);
        cfg.optimizer = OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        Table::new(cfg).unwrap()
    }

    #[test]
    fn stored_rows_are_read_back_whole_and_dirty() {
        let t = table();
        let ids = [5u64, 9, 5];
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        assert_eq!(t.store_rows(&ids, &rows, 10).unwrap(), 2);
        assert_eq!(t.row(5).unwrap(), vec![7.0, 8.0, 9.0]);
        assert_eq!(t.row(9).unwrap(), vec![4.0, 5.0, 6.0]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.dirty_len(), 2);
        let err = t.store_rows(&[1], &[1.0], 10).unwrap_err().to_string();
        assert!(err.contains("replicated rows"), "{err}");
    }

    #[test]
    fn stripes_list_every_row_once() {
        let t = table();
        let ids: Vec<u64> = (0..1000).map(|i| i * 7919).collect();
        let rows = vec![0.5f32; ids.len() * 3];
        t.store_rows(&ids, &rows, 0).unwrap();
        let (mut all, mut page) = (Vec::new(), Vec::new());
        for s in 0..t.stripe_count() {
            t.stripe_ids(s, &mut page);
            all.extend_from_slice(&page);
        }
        all.sort_unstable();
        assert_eq!(all, ids);
    }
}
