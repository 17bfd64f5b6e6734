//! The preprocessed columnar shard format: parsed, log-transformed and hashed rows, laid out so that reading
//! them back into [`Batch`]es is copying, not parsing. Sans-IO: [`write_shard_for`] encodes a batch,
//! [`Shard`] checks and decodes bytes (an mmapped file in the reader).
//!
//! All integers are little-endian. Version 1, written for the default [`FeatureLayout`] (26 one-hot
//! features):
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
//! That file is exactly `32 + 261 * R` bytes. Version 2, written for any other layout (multi-hot features,
//! shared tables, caps, another feature count), records the layout's [`FeatureLayout::fingerprint`] and per
//! feature its id count, and gives each multi-hot feature its bag offsets:
//!
//! ```text
//! 0       8               magic "DLRMCOL\0"
//! 8       4   u32         format version, 2
//! 12      4   u32         dense columns, 13
//! 16      4   u32         features F (1..=26)
//! 20      4   u32         reserved, 0
//! 24      8   u64         rows R
//! 32      8   u64         the layout's fingerprint
//! 40      16 * F          per feature: u32 kind (0 one-hot, 1 multi-hot), u32 reserved 0, u64 ids N_f
//!                         (N_f = R for a one-hot feature)
//! ..                      per feature: if multi-hot, offsets u32 [R + 1] (0, ..., N_f; row i's bag is
//!                         ids[off[i]..off[i+1]]) and 4 zero bytes if R + 1 is odd; then ids u64 [N_f]
//! ..      R * 13 * 4      dense f32 [R x 13]
//! ..      R               labels u8
//! ```
//!
//! Every section starts aligned to its element size. A version 1 shard reads as the default layout; a
//! reader whose layout's fingerprint differs from the shard's refuses it ([`Shard::check_layout`]). Ids are
//! the full 64-bit feature ids the trainer keys embeddings by, so a shard reads back bit for bit the
//! batches the text would give. A shard holds rows, not lines: empty and bad lines were dropped when it was
//! written, so the rank split over shards counts rows.

use std::io::{self, Write};

use super::batch::Batch;
use super::layout::FeatureLayout;
use super::parse::{NUM_DENSE, NUM_SPARSE};

/// The first 8 bytes of every shard.
pub const MAGIC: [u8; 8] = *b"DLRMCOL\0";
/// The format version of default-layout shards.
pub const VERSION: u32 = 1;
/// The format version of shards of any other layout.
pub const VERSION_LAYOUT: u32 = 2;
/// Header bytes before the sparse section (version 1).
pub const HEADER_LEN: usize = 32;
/// Bytes per row over the three sections (version 1).
pub const ROW_BYTES: usize = NUM_SPARSE * 8 + NUM_DENSE * 4 + 1;
/// Header bytes of version 2 before the per-feature entries.
const HEADER2_LEN: usize = 40;
/// Bytes of one version 2 per-feature entry.
const FEATURE_ENTRY: usize = 16;

/// Why bytes are not a valid shard, or not one for this reader. Messages name the values found and
/// expected.
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
    /// A version other than [`VERSION`] and [`VERSION_LAYOUT`].
    #[error("format version {version}, this build reads versions {VERSION} and {VERSION_LAYOUT}")]
    UnsupportedVersion {
        /// The version in the header.
        version: u32,
    },
    /// Column counts other than 13 dense and 26 sparse (1 to 26 features in version 2).
    #[error("{dense} dense and {sparse} sparse columns, expected {NUM_DENSE} and {NUM_SPARSE}")]
    Shape {
        /// Dense columns in the header.
        dense: u32,
        /// Sparse columns (features) in the header.
        sparse: u32,
    },
    /// A version 2 feature entry of an unknown kind.
    #[error("feature {feature}: kind {kind}, expected 0 (one-hot) or 1 (multi-hot)")]
    FeatureKind {
        /// The feature index.
        feature: usize,
        /// The kind found.
        kind: u32,
    },
    /// The file length does not match the row (and id) counts (a truncated or appended-to file).
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
    /// A multi-hot feature's offsets do not start at 0, decrease, or do not end at its id count.
    #[error("feature {feature}: offset {value} at row {row} breaks 0 <= ... <= {ids} (ids)")]
    BadOffsets {
        /// The feature index.
        feature: usize,
        /// The offset's index (0..=R).
        row: usize,
        /// The offset.
        value: u32,
        /// The feature's id count.
        ids: u64,
    },
    /// A label byte other than 0 or 1.
    #[error("row {row}: label byte {value}, expected 0 or 1")]
    BadLabel {
        /// The row, 0-based within the shard.
        row: usize,
        /// The byte.
        value: u8,
    },
    /// The shard was written for another feature layout than the reader's.
    #[error("shard of feature layout {shard:#018x}, but the reader's layout is {reader:#018x}")]
    Layout {
        /// The shard's layout fingerprint (the default layout's for version 1).
        shard: u64,
        /// The reader's.
        reader: u64,
    },
}

/// One feature's sections of a shard.
#[derive(Debug, Clone, Copy)]
struct Column<'a> {
    /// `u32 [R + 1]` for a multi-hot feature.
    offsets: Option<&'a [u8]>,
    /// `u64 [N_f]`.
    ids: &'a [u8],
}

impl Column<'_> {
    /// The offset at index `i` (multi-hot only).
    #[inline]
    fn offset(offsets: &[u8], i: usize) -> usize {
        u32::from_le_bytes(offsets[i * 4..i * 4 + 4].try_into().unwrap()) as usize
    }

    /// Appends row `r`'s ids (and for a multi-hot feature its end offset) to a batch column.
    #[inline]
    fn append(&self, r: usize, ids: &mut Vec<u64>, offsets: &mut Vec<u32>) {
        match self.offsets {
            None => ids.push(u64_le(&self.ids[r * 8..r * 8 + 8])),
            Some(off) => {
                let (start, end) = (Self::offset(off, r), Self::offset(off, r + 1));
                ids.extend(self.ids[start * 8..end * 8].chunks_exact(8).map(u64_le));
                offsets.push(ids.len() as u32);
            }
        }
    }
}

/// A checked view of one shard's bytes.
#[derive(Debug, Clone)]
pub struct Shard<'a> {
    rows: usize,
    fingerprint: u64,
    columns: Vec<Column<'a>>,
    dense: &'a [u8],
    labels: &'a [u8],
}

impl<'a> Shard<'a> {
    /// Whether `head` (a file's first bytes) starts with [`MAGIC`].
    pub fn is_shard(head: &[u8]) -> bool {
        head.starts_with(&MAGIC)
    }

    /// Checks the header, the length, every offset and every label, then views the sections.
    pub fn parse(bytes: &'a [u8]) -> Result<Shard<'a>, ColumnarError> {
        if bytes.len() < HEADER_LEN {
            return Err(ColumnarError::TooShort { len: bytes.len() });
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64_le(&bytes[at..at + 8]);
        let magic: [u8; 8] = bytes[..8].try_into().unwrap();
        if magic != MAGIC {
            return Err(ColumnarError::BadMagic { found: magic });
        }
        let version = u32_at(8);
        if version != VERSION && version != VERSION_LAYOUT {
            return Err(ColumnarError::UnsupportedVersion { version });
        }
        let (dense, sparse) = (u32_at(12), u32_at(16));
        let shape_ok = if version == VERSION {
            sparse as usize == NUM_SPARSE
        } else {
            (1..=NUM_SPARSE).contains(&(sparse as usize))
        };
        if dense as usize != NUM_DENSE || !shape_ok {
            return Err(ColumnarError::Shape { dense, sparse });
        }
        let rows = u64_at(24);
        let features = sparse as usize;
        // (multi-hot, ids) per feature, and the header length.
        let (fingerprint, kinds, header) = if version == VERSION {
            let kinds = vec![(false, rows); NUM_SPARSE];
            (FeatureLayout::default().fingerprint(), kinds, HEADER_LEN)
        } else {
            let header = HEADER2_LEN + features * FEATURE_ENTRY;
            if bytes.len() < header {
                return Err(ColumnarError::Length {
                    rows,
                    expected: header as u64,
                    actual: bytes.len() as u64,
                });
            }
            let mut kinds = Vec::with_capacity(features);
            for feature in 0..features {
                let at = HEADER2_LEN + feature * FEATURE_ENTRY;
                let (kind, ids) = (u32_at(at), u64_at(at + 8));
                if kind > 1 {
                    return Err(ColumnarError::FeatureKind { feature, kind });
                }
                kinds.push((kind == 1, if kind == 1 { ids } else { rows }));
            }
            (u64_at(32), kinds, header)
        };
        let mut expected = Some(header as u64);
        for &(multi, ids) in &kinds {
            let offsets = multi.then(|| rows.checked_add(1).map(|n| n.next_multiple_of(2) * 4));
            let section = offsets
                .unwrap_or(Some(0))
                .and_then(|o| o.checked_add(ids.checked_mul(8)?));
            expected = expected.zip(section).and_then(|(a, b)| a.checked_add(b));
        }
        let expected = expected
            .and_then(|n| n.checked_add(rows.checked_mul((NUM_DENSE * 4 + 1) as u64)?))
            .unwrap_or(u64::MAX);
        if expected != bytes.len() as u64 {
            return Err(ColumnarError::Length {
                rows,
                expected,
                actual: bytes.len() as u64,
            });
        }
        // Everything fits: the file is in memory.
        let rows = rows as usize;
        let mut rest = &bytes[header..];
        let mut columns = Vec::with_capacity(features);
        for (feature, &(multi, ids)) in kinds.iter().enumerate() {
            let offsets = if multi {
                let (offsets, tail) = rest.split_at((rows + 1).next_multiple_of(2) * 4);
                rest = tail;
                check_offsets(feature, &offsets[..(rows + 1) * 4], ids)?;
                Some(&offsets[..(rows + 1) * 4])
            } else {
                None
            };
            let (ids, tail) = rest.split_at(ids as usize * 8);
            rest = tail;
            columns.push(Column { offsets, ids });
        }
        let (dense, labels) = rest.split_at(rows * NUM_DENSE * 4);
        if let Some(row) = labels.iter().position(|&b| b > 1) {
            return Err(ColumnarError::BadLabel {
                row,
                value: labels[row],
            });
        }
        Ok(Shard {
            rows,
            fingerprint,
            columns,
            dense,
            labels,
        })
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The fingerprint of the layout the shard was written for (the default layout's for version 1).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Refuses the shard unless it was written for `layout` (same fingerprint, feature count and kinds).
    pub fn check_layout(&self, layout: &FeatureLayout) -> Result<(), ColumnarError> {
        let same = self.fingerprint == layout.fingerprint()
            && self.columns.len() == layout.features.len()
            && (self.columns.iter().enumerate())
                .all(|(f, c)| c.offsets.is_some() == layout.is_multi_hot(f));
        if same {
            Ok(())
        } else {
            Err(ColumnarError::Layout {
                shard: self.fingerprint,
                reader: layout.fingerprint(),
            })
        }
    }

    /// Panics unless `batch` has this shard's features (one-hot and multi-hot alike).
    fn check_batch(&self, batch: &Batch) {
        let same = batch.sparse.len() == self.columns.len()
            && (self.columns.iter().zip(&batch.offsets))
                .all(|(c, o)| c.offsets.is_some() != o.is_empty());
        assert!(same, "batch of another layout than the shard");
    }

    /// Appends `count` rows `first, first + step, ...` to `batch` (of the shard's layout).
    ///
    /// # Panics
    /// If `step` is 0, a row is out of range (callers compute them from [`Shard::rows`]) or the batch is of
    /// another layout.
    pub fn append_rows(&self, first: usize, step: usize, count: usize, batch: &mut Batch) {
        assert!(step > 0, "step 0");
        if count == 0 {
            return;
        }
        let last = first + (count - 1) * step;
        assert!(last < self.rows, "row {last} of {}", self.rows);
        self.check_batch(batch);
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
        let columns = batch.sparse.iter_mut().zip(&mut batch.offsets);
        for (column, (ids, offsets)) in self.columns.iter().zip(columns) {
            match column.offsets {
                None if step == 1 => {
                    let run = &column.ids[first * 8..(last + 1) * 8];
                    ids.extend(run.chunks_exact(8).map(u64_le));
                }
                _ => (0..count).for_each(|i| column.append(picked(i), ids, offsets)),
            }
        }
    }

    /// Appends the rows `picked` (in that order) to `batch` (of the shard's layout): a shuffled epoch's
    /// reads.
    ///
    /// # Panics
    /// If a row is out of range (callers pick them below [`Shard::rows`]) or the batch is of another
    /// layout.
    pub fn append_picked(&self, picked: &[u32], batch: &mut Batch) {
        let rows = self.rows;
        if let Some(&bad) = picked.iter().find(|&&r| r as usize >= rows) {
            panic!("row {bad} of {rows}");
        }
        self.check_batch(batch);
        batch.len += picked.len();
        batch
            .labels
            .extend(picked.iter().map(|&r| f32::from(self.labels[r as usize])));
        for &r in picked {
            let at = r as usize * NUM_DENSE * 4;
            let row = &self.dense[at..at + NUM_DENSE * 4];
            batch.dense.extend(row.chunks_exact(4).map(f32_le));
        }
        let columns = batch.sparse.iter_mut().zip(&mut batch.offsets);
        for (column, (ids, offsets)) in self.columns.iter().zip(columns) {
            for &r in picked {
                column.append(r as usize, ids, offsets);
            }
        }
    }
}

/// Checks that `offsets` (`u32 [R + 1]`) start at 0, never decrease and end at `ids`.
fn check_offsets(feature: usize, offsets: &[u8], ids: u64) -> Result<(), ColumnarError> {
    let n = offsets.len() / 4;
    let mut previous = 0;
    for row in 0..n {
        let value = Column::offset(offsets, row) as u32;
        let last = row + 1 == n;
        if (row == 0 && value != 0) || value < previous || (last && u64::from(value) != ids) {
            return Err(ColumnarError::BadOffsets {
                feature,
                row,
                value,
                ids,
            });
        }
        previous = value;
    }
    Ok(())
}

#[inline]
fn f32_le(b: &[u8]) -> f32 {
    f32::from_le_bytes(b.try_into().unwrap())
}

#[inline]
fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap())
}

/// Writes `batch` (of the default layout) as one version 1 shard. Labels must be 0.0 or 1.0 (as the parser
/// makes them). Fails with `InvalidInput` for a batch of another layout: see [`write_shard_for`].
pub fn write_shard(batch: &Batch, out: &mut impl Write) -> io::Result<()> {
    if batch.sparse.len() != NUM_SPARSE || batch.offsets.iter().any(|o| !o.is_empty()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a version {VERSION} shard holds 26 one-hot features, the batch has {} features",
                batch.sparse.len()
            ),
        ));
    }
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&(NUM_DENSE as u32).to_le_bytes());
    header[16..20].copy_from_slice(&(NUM_SPARSE as u32).to_le_bytes());
    header[24..32].copy_from_slice(&(batch.len as u64).to_le_bytes());
    out.write_all(&header)?;
    let mut buf = Vec::with_capacity(batch.len * 8);
    for column in &batch.sparse {
        write_ids(column, &mut buf, out)?;
    }
    write_dense_and_labels(batch, &mut buf, out)
}

/// Writes `batch`, made for `layout`, as one shard: version 1 for the default layout (byte for byte what
/// [`write_shard`] writes), version 2 with the layout's fingerprint and the bags' offsets otherwise.
/// Fails with `InvalidInput` if the batch does not have the layout's features.
pub fn write_shard_for(
    batch: &Batch,
    layout: &FeatureLayout,
    out: &mut impl Write,
) -> io::Result<()> {
    if layout.is_default() {
        return write_shard(batch, out);
    }
    let features = layout.features.len();
    let fits = batch.sparse.len() == features
        && (0..features).all(|f| layout.is_multi_hot(f) != batch.offsets[f].is_empty());
    if !fits || features > NUM_SPARSE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the batch's {} features do not fit layout {:#018x} of {features}",
                batch.sparse.len(),
                layout.fingerprint()
            ),
        ));
    }
    let mut header = Vec::with_capacity(HEADER2_LEN + features * FEATURE_ENTRY);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&VERSION_LAYOUT.to_le_bytes());
    header.extend_from_slice(&(NUM_DENSE as u32).to_le_bytes());
    header.extend_from_slice(&(features as u32).to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&(batch.len as u64).to_le_bytes());
    header.extend_from_slice(&layout.fingerprint().to_le_bytes());
    for (ids, offsets) in batch.sparse.iter().zip(&batch.offsets) {
        header.extend_from_slice(&u32::from(!offsets.is_empty()).to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    }
    out.write_all(&header)?;
    let mut buf = Vec::with_capacity(batch.len * 8);
    for (ids, offsets) in batch.sparse.iter().zip(&batch.offsets) {
        if !offsets.is_empty() {
            buf.clear();
            buf.extend(offsets.iter().flat_map(|o| o.to_le_bytes()));
            if offsets.len() % 2 == 1 {
                buf.extend_from_slice(&[0; 4]);
            }
            out.write_all(&buf)?;
        }
        write_ids(ids, &mut buf, out)?;
    }
    write_dense_and_labels(batch, &mut buf, out)
}

/// Writes one id section through `buf`.
fn write_ids(ids: &[u64], buf: &mut Vec<u8>, out: &mut impl Write) -> io::Result<()> {
    buf.clear();
    buf.extend(ids.iter().flat_map(|id| id.to_le_bytes()));
    out.write_all(buf)
}

/// Writes the dense and label sections through `buf`.
fn write_dense_and_labels(
    batch: &Batch,
    buf: &mut Vec<u8>,
    out: &mut impl Write,
) -> io::Result<()> {
    buf.clear();
    buf.extend(batch.dense.iter().flat_map(|x| x.to_le_bytes()));
    out.write_all(buf)?;
    buf.clear();
    buf.extend(batch.labels.iter().map(|&l| u8::from(l != 0.0)));
    out.write_all(buf)
}

#[cfg(test)]
mod tests;
