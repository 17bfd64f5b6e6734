//! Deleting rows a server no longer owns (a live reshard moved their virtual shards away).

use super::{EmbeddingError, Engine};

impl Engine {
    /// Deletes the rows of `ids` from table `table`: from the store first (one delete batch), then from
    /// memory, under the flush lock, so a write-back never rewrites a row this call deletes. Returns the
    /// rows deleted from memory. Like row writes, the deletion is durable after the next flush.
    pub fn remove_rows(&self, table: u32, ids: &[u64]) -> Result<usize, EmbeddingError> {
        let t = self.table(table)?;
        let _flush = self.flush.lock();
        self.store.delete_rows(table, ids)?;
        Ok(t.remove_rows(ids))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::mem_store::MemStore;
    use crate::{Engine, TableConfig};

    #[test]
    fn removed_rows_are_gone_from_memory_and_store() {
        let e = Engine::open(Arc::new(MemStore::new())).unwrap();
        e.register_table(TableConfig::new(1, "C1", 2)).unwrap();
        e.apply(1, &[1, 2, 3], &[1.0; 6]).unwrap();
        e.flush_dirty().unwrap();
        assert_eq!(e.remove_rows(1, &[1, 3, 99]).unwrap(), 2);
        assert_eq!(e.rows_total(), 1);
        let mut left = Vec::new();
        e.store().scan_ids(1, None, 10, &mut left).unwrap();
        assert_eq!(left, vec![2]);
        assert!(e.remove_rows(9, &[1]).is_err(), "unknown table");
    }
}
