//! [`DirtyBatch`]: a reusable buffer of rows on their way to the store, as (id, little-endian row bytes).
//!
//! The encoding is the stored one (DESIGN.md: "key = id (big-endian), value = row bytes"): each row's words
//! ([`crate::RowCodec`]: f32 weights, or packed bf16/f16 weights, then the f32 optimizer state) as little-endian
//! bytes; for f32 tables, the row's f32s. [`crate::Table::take_dirty`] fills a batch and
//! [`crate::Store::write_rows`] consumes it; the engine keeps one batch and reuses its allocation.

/// Rows of one table, each `row_bytes` long, with their ids.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DirtyBatch {
    row_bytes: usize,
    ids: Vec<u64>,
    data: Vec<u8>,
}

impl DirtyBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties the batch, keeping its allocation, and sets the length of the rows to come.
    pub fn reset(&mut self, row_bytes: usize) {
        self.row_bytes = row_bytes;
        self.ids.clear();
        self.data.clear();
    }

    /// Appends a row of f32s, encoded little-endian.
    ///
    /// # Panics
    /// If `row.len() * 4` is not the batch's `row_bytes` (a caller bug, not a data error).
    pub fn push_row(&mut self, id: u64, row: &[f32]) {
        assert_eq!(
            row.len() * 4,
            self.row_bytes,
            "row of {} f32s in a batch of {}-byte rows",
            row.len(),
            self.row_bytes
        );
        self.ids.push(id);
        if cfg!(target_endian = "little") {
            self.data.extend_from_slice(bytemuck::cast_slice(row));
        } else {
            for x in row {
                self.data.extend_from_slice(&x.to_le_bytes());
            }
        }
    }

    /// Appends a row packed in words ([`crate::RowCodec`]), encoded little-endian: a table's stored row as it
    /// is in memory.
    ///
    /// # Panics
    /// If `words.len() * 4` is not the batch's `row_bytes`.
    pub fn push_words(&mut self, id: u64, words: &[u32]) {
        assert_eq!(
            words.len() * 4,
            self.row_bytes,
            "row of {} words in a batch of {}-byte rows",
            words.len(),
            self.row_bytes
        );
        self.ids.push(id);
        if cfg!(target_endian = "little") {
            self.data.extend_from_slice(bytemuck::cast_slice(words));
        } else {
            for x in words {
                self.data.extend_from_slice(&x.to_le_bytes());
            }
        }
    }

    /// Appends an already encoded row.
    ///
    /// # Panics
    /// If `bytes.len()` is not the batch's `row_bytes`.
    pub fn push_bytes(&mut self, id: u64, bytes: &[u8]) {
        assert_eq!(
            bytes.len(),
            self.row_bytes,
            "row of {} bytes in a batch of {}-byte rows",
            bytes.len(),
            self.row_bytes
        );
        self.ids.push(id);
        self.data.extend_from_slice(bytes);
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True if the batch holds no rows.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Total row bytes held (ids not counted).
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// The ids, in insertion order.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// The bytes of row `i` (in insertion order).
    ///
    /// # Panics
    /// If `i` is not below [`DirtyBatch::len`].
    pub fn row(&self, i: usize) -> &[u8] {
        &self.data[i * self.row_bytes..(i + 1) * self.row_bytes]
    }

    /// The rows as (id, bytes), in insertion order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u64, &[u8])> + '_ {
        // `max(1)` keeps `chunks_exact` happy for zero-length rows, which no table produces.
        self.ids
            .iter()
            .copied()
            .zip(self.data.chunks_exact(self.row_bytes.max(1)))
    }
}

/// Decodes little-endian f32 row bytes into `out`; `bytes.len()` must be `out.len() * 4`.
#[cfg(test)]
pub(crate) fn decode_row(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 4);
    for (x, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_reuse() {
        let mut b = DirtyBatch::new();
        b.reset(8);
        b.push_row(7, &[1.5, -2.0]);
        b.push_row(9, &[f32::from_bits(0x7fc0_0001), 0.0]);
        assert_eq!(b.len(), 2);
        assert_eq!(b.byte_len(), 16);
        let rows: Vec<_> = b.iter().collect();
        assert_eq!(rows[0].0, 7);
        assert_eq!(rows[0].1, [0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0]);
        let mut out = [0f32; 2];
        decode_row(rows[1].1, &mut out);
        assert_eq!(out[0].to_bits(), 0x7fc0_0001);
        b.reset(4);
        assert!(b.is_empty());
        b.push_bytes(1, &[1, 2, 3, 4]);
        assert_eq!(b.iter().next(), Some((1, &[1u8, 2, 3, 4][..])));
    }
}
