//! The preprocessed columnar shard format: parsed, log-transformed and hashed rows, laid out so that reading
//! them back into [`Batch`]es is copying, not parsing. Sans-IO: [`write_shard`] encodes a batch, [`Shard`]
//! checks and decodes bytes (an mmapped file in the reader).
//!
//! One shard file, all integers little-endian:
//!
//! ```text
//! offset  size            what
//! 0       8               magic "DLRMCOL\0"
//! 8       4   u32         format version, 1
//! 12      4   u32         dense columns, 13
//! 16      4   u32         sparse columns, 26
//! 20      4   u32         reserved, 0
//! 24      8   u64         rows R
//! 32      26 * R * 8      sparse: feature ids (`feature_id(j, token)`) as u64, column-major [26][R]
//! ..      R * 13 * 4      dense: ln(1 + max(x, 0)) as f32, row-major [R x 13]
//! ..      R               labels: u8, 0 or 1
//! ```
//!
//! The file is exactly `32 + 261 * R` bytes; every section starts aligned to its element size. Ids are the
//! full 64-bit feature ids the trainer keys embeddings by, so a shard reads back bit for bit the batches the
//! text would give (32-bit ids would halve the file but could collide). A shard holds rows, not lines:
//! empty and bad lines were dropped when it was written, so the rank split over shards counts rows.

use std::io::{self, Write};

use super::batch::Batch;
use super::parse::{NUM_DENSE, NUM_SPARSE};

/// The first 8 bytes of every shard.
pub const MAGIC: [u8; 8] = *b"DLRMCOL\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Header bytes before the sparse section.
pub const HEADER_LEN: usize = 32;
/// Bytes per row over the three sections.
pub const ROW_BYTES: usize = NUM_SPARSE * 8 + NUM_DENSE * 4 + 1;

/// Why bytes are not a valid shard. Messages name the values found and expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnarError {
    /// Shorter than the header.
    #[error("{len} bytes, shorter than the {HEADER_LEN}-byte header")]
    TooShort {
        /// The file length.
        len: usize,
    },
    /// The first 8 bytes are not [`MAGIC`].
    #[error("bad magic {found:02x?}, expected \"DLRMCOL\\0\"")]
    BadMagic {
        /// The first 8 bytes.
        found: [u8; 8],
    },
    /// A version other than [`VERSION`].
    #[error("format version {version}, this build reads version {VERSION}")]
    UnsupportedVersion {
        /// The version in the header.
        version: u32,
    },
    /// Column counts other than 13 dense and 26 sparse.
    #[error("{dense} dense and {sparse} sparse columns, expected {NUM_DENSE} and {NUM_SPARSE}")]
    Shape {
        /// Dense columns in the header.
        dense: u32,
        /// Sparse columns in the header.
        sparse: u32,
    },
    /// The file length does not match the row count (a truncated or appended-to file).
    #[error(
        "header says {rows} rows, so {expected} bytes, but the file has {actual} (truncated?)"
    )]
    Length {
        /// Rows in the header.
        rows: u64,
        /// The length those rows need (saturated on overflow).
        expected: u64,
        /// The file length.
        actual: u64,
    },
    /// A label byte other than 0 or 1.
    #[error("row {row}: label byte {value}, expected 0 or 1")]
    BadLabel {
        /// The row, 0-based within the shard.
        row: usize,
        /// The byte.
        value: u8,
    },
}

/// A checked view of one shard's bytes.
#[derive(Debug, Clone, Copy)]
pub struct Shard<'a> {
    rows: usize,
    sparse: &'a [u8],
    dense: &'a [u8],
    labels: &'a [u8],
}

impl<'a> Shard<'a> {
    /// Whether `head` (a file's first bytes) starts with [`MAGIC`].
    pub fn is_shard(head: &[u8]) -> bool {
        head.starts_with(&MAGIC)
    }

    /// Checks the header, the length and every label, then views the sections.
    pub fn parse(bytes: &'a [u8]) -> Result<Shard<'a>, ColumnarError> {
        if bytes.len() < HEADER_LEN {
            return Err(ColumnarError::TooShort { len: bytes.len() });
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let magic: [u8; 8] = bytes[..8].try_into().unwrap();
        if magic != MAGIC {
            return Err(ColumnarError::BadMagic { found: magic });
        }
        if u32_at(8) != VERSION {
            return Err(ColumnarError::UnsupportedVersion { version: u32_at(8) });
        }
        let (dense, sparse) = (u32_at(12), u32_at(16));
        if (dense as usize, sparse as usize) != (NUM_DENSE, NUM_SPARSE) {
            return Err(ColumnarError::Shape { dense, sparse });
        }
        let rows = u64::from_le_bytes(bytes[24..32].try_into().unwrap());
        let expected = rows
            .checked_mul(ROW_BYTES as u64)
            .and_then(|n| n.checked_add(HEADER_LEN as u64))
            .unwrap_or(u64::MAX);
        if expected != bytes.len() as u64 {
            return Err(ColumnarError::Length {
                rows,
                expected,
                actual: bytes.len() as u64,
            });
        }
        let rows = rows as usize; // fits: the file is in memory
        let (sparse, rest) = bytes[HEADER_LEN..].split_at(rows * NUM_SPARSE * 8);
        let (dense, labels) = rest.split_at(rows * NUM_DENSE * 4);
        if let Some(row) = labels.iter().position(|&b| b > 1) {
            return Err(ColumnarError::BadLabel {
                row,
                value: labels[row],
            });
        }
        Ok(Shard {
            rows,
            sparse,
            dense,
            labels,
        })
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends `count` rows `first, first + step, ...` to `batch`.
    ///
    /// # Panics
    /// If `step` is 0 or a row is out of range (callers compute them from [`Shard::rows`]).
    pub fn append_rows(&self, first: usize, step: usize, count: usize, batch: &mut Batch) {
        assert!(step > 0, "step 0");
        if count == 0 {
            return;
        }
        let last = first + (count - 1) * step;
        assert!(last < self.rows, "row {last} of {}", self.rows);
        batch.len += count;
        let picked = |i: usize| first + i * step;
        batch
            .labels
            .extend((0..count).map(|i| f32::from(self.labels[picked(i)])));
        if step == 1 {
            let dense = &self.dense[first * NUM_DENSE * 4..(last + 1) * NUM_DENSE * 4];
            batch.dense.extend(dense.chunks_exact(4).map(f32_le));
        } else {
            for i in 0..count {
                let at = picked(i) * NUM_DENSE * 4;
                let row = &self.dense[at..at + NUM_DENSE * 4];
                batch.dense.extend(row.chunks_exact(4).map(f32_le));
            }
        }
        for (j, column) in batch.sparse.iter_mut().enumerate() {
            let ids = &self.sparse[j * self.rows * 8..(j + 1) * self.rows * 8];
            if step == 1 {
                column.extend(ids[first * 8..(last + 1) * 8].chunks_exact(8).map(u64_le));
            } else {
                column.extend((0..count).map(|i| u64_le(&ids[picked(i) * 8..picked(i) * 8 + 8])));
            }
        }
    }
}

impl Shard<'_> {
    /// Appends the rows `picked` (in that order) to `batch`: a shuffled epoch's reads.
    ///
    /// # Panics
    /// If a row is out of range (callers pick them below [`Shard::rows`]).
    pub fn append_picked(&self, picked: &[u32], batch: &mut Batch) {
        let rows = self.rows;
        if let Some(&bad) = picked.iter().find(|&&r| r as usize >= rows) {
            panic!("row {bad} of {rows}");
        }
        batch.len += picked.len();
        batch
            .labels
            .extend(picked.iter().map(|&r| f32::from(self.labels[r as usize])));
        for &r in picked {
            let at = r as usize * NUM_DENSE * 4;
            let row = &self.dense[at..at + NUM_DENSE * 4];
            batch.dense.extend(row.chunks_exact(4).map(f32_le));
        }
        for (j, column) in batch.sparse.iter_mut().enumerate() {
            let ids = &self.sparse[j * rows * 8..(j + 1) * rows * 8];
            column.extend(
                picked
                    .iter()
                    .map(|&r| u64_le(&ids[r as usize * 8..r as usize * 8 + 8])),
            );
        }
    }
}

#[inline]
fn f32_le(b: &[u8]) -> f32 {
    f32::from_le_bytes(b.try_into().unwrap())
}

#[inline]
fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap())
}

/// Writes `batch` as one shard. Labels must be 0.0 or 1.0 (as the parser makes them).
pub fn write_shard(batch: &Batch, out: &mut impl Write) -> io::Result<()> {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&(NUM_DENSE as u32).to_le_bytes());
    header[16..20].copy_from_slice(&(NUM_SPARSE as u32).to_le_bytes());
    header[24..32].copy_from_slice(&(batch.len as u64).to_le_bytes());
    out.write_all(&header)?;
    let mut buf = Vec::with_capacity(batch.len * 8);
    for column in &batch.sparse {
        buf.clear();
        buf.extend(column.iter().flat_map(|id| id.to_le_bytes()));
        out.write_all(&buf)?;
    }
    buf.clear();
    buf.extend(batch.dense.iter().flat_map(|x| x.to_le_bytes()));
    out.write_all(&buf)?;
    buf.clear();
    buf.extend(batch.labels.iter().map(|&l| u8::from(l != 0.0)));
    out.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Row;

    fn batch(n: u32) -> Batch {
        let mut batch = Batch::with_capacity(n as usize);
        for k in 0..n {
            let mut row = Row {
                label: (k % 3 == 0) as u32 as f32,
                ..Row::default()
            };
            row.dense = std::array::from_fn(|d| k as f32 + d as f32 / 16.0);
            row.sparse =
                std::array::from_fn(|j| (j as u32 != k % 26).then_some(k * 100 + j as u32));
            batch.push_row(&row);
        }
        batch
    }

    fn encode(batch: &Batch) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_shard(batch, &mut bytes).unwrap();
        bytes
    }

    #[test]
    fn round_trip_whole_and_strided() {
        let original = batch(50);
        let bytes = encode(&original);
        assert_eq!(bytes.len(), HEADER_LEN + 50 * ROW_BYTES);
        let shard = Shard::parse(&bytes).unwrap();
        assert_eq!(shard.rows(), 50);
        let mut whole = Batch::default();
        shard.append_rows(0, 1, 30, &mut whole);
        shard.append_rows(30, 1, 20, &mut whole);
        assert_eq!(whole, original);
        // Rows 3, 10, 17, ... against pushing the same rows one by one.
        let mut strided = Batch::default();
        shard.append_rows(3, 7, 7, &mut strided);
        let mut want = Batch::default();
        for r in (3..50).step_by(7) {
            want.len += 1;
            want.labels.push(original.labels[r]);
            want.dense.extend_from_slice(original.dense_row(r));
            for j in 0..NUM_SPARSE {
                want.sparse[j].push(original.sparse[j][r]);
            }
        }
        assert_eq!(strided, want);
        shard.append_rows(0, 1, 0, &mut strided);
        assert_eq!(strided, want);
        assert_eq!(Shard::parse(&encode(&Batch::default())).unwrap().rows(), 0);
    }

    #[test]
    fn corrupt_shards_are_refused() {
        let good = encode(&batch(4));
        let check = |bytes: &[u8], want: &str| {
            let err = Shard::parse(bytes).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        };
        check(&good[..10], "10 bytes, shorter than the 32-byte header");
        check(
            &good[..good.len() - 1],
            "header says 4 rows, so 1076 bytes, but the file has 1075",
        );
        let mut longer = good.clone();
        longer.push(0);
        check(&longer, "but the file has 1077");
        let mut bad = good.clone();
        bad[0] = b'X';
        check(&bad, "bad magic");
        let mut bad = good.clone();
        bad[8] = 2;
        check(&bad, "format version 2, this build reads version 1");
        let mut bad = good.clone();
        bad[16] = 27;
        check(&bad, "13 dense and 27 sparse columns");
        let mut bad = good.clone();
        bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        check(&bad, &format!("header says {} rows", u64::MAX));
        let mut bad = good.clone();
        let at = bad.len() - 2;
        bad[at] = 7;
        check(&bad, "row 2: label byte 7");
    }
}
