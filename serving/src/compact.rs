//! Rows held in memory at a serving precision (`ps-serve --row-precision f32|bf16|int8`, docs/serving.md,
//! "Quantized rows"): per table, an id index and one flat array of encoded weights, without the optimizer
//! state the training servers keep (serving never uses it) and without a RocksDB copy.
//!
//! - `f32`: the weights as they are (the same predictions as the default engine store).
//! - `bf16`: each weight rounded to the nearest bf16 (ties to even), 2 bytes.
//! - `int8`: symmetric per-row quantization: a row's scale is its largest magnitude / 127, each weight is
//!   `round(w / scale)` in -127..=127, 1 byte, plus the scale (4 bytes). A weight comes back within half a
//!   scale step (`max|w| / 254`) of its value.
//!
//! Rows load from the export's snapshot (streamed table by table, never the whole shard as f32) or its
//! `tables.safetensors`; delta syncs encode rows as they arrive and delete rows as the engine store does. An
//! id without a row reads as its table's initializer, as from a training server.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use base::hash::IdHasher;
use embedding::TableConfig;
use parking_lot::RwLock;

/// How `ps-serve` holds its rows (`--row-precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServePrecision {
    /// 4 bytes a weight.
    F32,
    /// 2 bytes a weight, rounded to nearest.
    Bf16,
    /// 1 byte a weight and a 4-byte scale per row.
    Int8,
}

impl std::str::FromStr for ServePrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(ServePrecision::F32),
            "bf16" => Ok(ServePrecision::Bf16),
            "int8" => Ok(ServePrecision::Int8),
            other => Err(format!(
                "--row-precision {other:?}, expected f32, bf16 or int8"
            )),
        }
    }
}

impl std::fmt::Display for ServePrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServePrecision::F32 => "f32",
            ServePrecision::Bf16 => "bf16",
            ServePrecision::Int8 => "int8",
        })
    }
}

impl ServePrecision {
    /// Bytes of a row's encoded weights (the int8 scale apart).
    pub fn stride(self, dim: usize) -> usize {
        match self {
            ServePrecision::F32 => 4 * dim,
            ServePrecision::Bf16 => 2 * dim,
            ServePrecision::Int8 => dim,
        }
    }

    /// Encodes `row` into `out` (`stride(row.len())` bytes); returns the row's scale (int8; 1 otherwise).
    pub fn encode(self, row: &[f32], out: &mut [u8]) -> f32 {
        match self {
            ServePrecision::F32 => {
                for (o, w) in out.chunks_exact_mut(4).zip(row) {
                    o.copy_from_slice(&w.to_le_bytes());
                }
                1.0
            }
            ServePrecision::Bf16 => {
                for (o, &w) in out.chunks_exact_mut(2).zip(row) {
                    let b = embedding::RowPrecision::Bf16.round_nearest(w).to_bits() >> 16;
                    o.copy_from_slice(&(b as u16).to_le_bytes());
                }
                1.0
            }
            ServePrecision::Int8 => {
                let max = row.iter().fold(0.0f32, |m, w| m.max(w.abs()));
                let scale = max / 127.0;
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                for (o, &w) in out.iter_mut().zip(row) {
                    *o = (w * inv).round().clamp(-127.0, 127.0) as i8 as u8;
                }
                scale
            }
        }
    }

    /// Decodes `bytes` (a row encoded by [`ServePrecision::encode`] with `scale`) into `out`.
    #[inline]
    pub fn decode(self, bytes: &[u8], scale: f32, out: &mut [f32]) {
        match self {
            ServePrecision::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            ServePrecision::Bf16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
            }
            ServePrecision::Int8 => {
                for (o, &b) in out.iter_mut().zip(bytes) {
                    *o = f32::from(b as i8) * scale;
                }
            }
        }
    }
}

type IdIndex = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

/// The rows of one table at a [`ServePrecision`].
#[derive(Debug)]
pub struct CompactTable {
    cfg: TableConfig,
    precision: ServePrecision,
    stride: usize,
    slots: RwLock<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    /// Id -> slot.
    index: IdIndex,
    /// Per slot, `stride` bytes of encoded weights.
    data: Vec<u8>,
    /// Per slot, the int8 scale (empty at other precisions).
    scales: Vec<f32>,
    /// Slots of deleted rows, reused first.
    free: Vec<u32>,
}

impl CompactTable {
    /// An empty table of `cfg`'s rows at `precision`.
    pub fn new(cfg: TableConfig, precision: ServePrecision) -> CompactTable {
        CompactTable {
            stride: precision.stride(cfg.dim),
            cfg,
            precision,
            slots: RwLock::default(),
        }
    }

    /// The table's config (its dim and initializer).
    pub fn config(&self) -> &TableConfig {
        &self.cfg
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.slots.read().index.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes of the rows: the index's buckets (an (id, slot) entry and a control byte each, at its load
    /// factor of at most 7/8), encoded weights, scales and the free list.
    pub fn memory_bytes(&self) -> usize {
        let s = self.slots.read();
        let buckets = (s.index.capacity() * 8 / 7).next_power_of_two();
        buckets * (std::mem::size_of::<(u64, u32)>() + 1)
            + s.data.capacity()
            + s.scales.capacity() * 4
            + s.free.capacity() * 4
    }

    /// Sets the rows of `ids` to `rows` (`ids.len() x dim`), encoded at the table's precision.
    pub fn insert(&self, ids: &[u64], rows: &[f32]) {
        let (dim, stride) = (self.cfg.dim, self.stride);
        debug_assert_eq!(rows.len(), ids.len() * dim);
        let int8 = self.precision == ServePrecision::Int8;
        let mut s = self.slots.write();
        s.index.reserve(ids.len());
        for (k, &id) in ids.iter().enumerate() {
            let slot = match s.index.get(&id) {
                Some(&slot) => slot as usize,
                None => {
                    let slot = match s.free.pop() {
                        Some(slot) => slot as usize,
                        None => {
                            let slot = s.data.len() / stride;
                            s.data.resize((slot + 1) * stride, 0);
                            if int8 {
                                s.scales.push(0.0);
                            }
                            slot
                        }
                    };
                    s.index.insert(id, slot as u32);
                    slot
                }
            };
            let row = &rows[k * dim..(k + 1) * dim];
            let scale = self
                .precision
                .encode(row, &mut s.data[slot * stride..(slot + 1) * stride]);
            if int8 {
                s.scales[slot] = scale;
            }
        }
    }

    /// Deletes the rows of `ids` (those held); returns how many.
    pub fn remove(&self, ids: &[u64]) -> usize {
        let mut s = self.slots.write();
        let mut removed = 0;
        for id in ids {
            if let Some(slot) = s.index.remove(id) {
                s.free.push(slot);
                removed += 1;
            }
        }
        removed
    }

    /// Copies the weights of `ids` into `out` (`ids.len() x dim`); an id without a row reads as its
    /// initializer.
    pub fn gather(&self, ids: &[u64], out: &mut [f32]) {
        let (dim, stride) = (self.cfg.dim, self.stride);
        let s = self.slots.read();
        for (k, id) in ids.iter().enumerate() {
            let row = &mut out[k * dim..(k + 1) * dim];
            match s.index.get(id) {
                Some(&slot) => {
                    let slot = slot as usize;
                    let scale = s.scales.get(slot).copied().unwrap_or(1.0);
                    self.precision
                        .decode(&s.data[slot * stride..(slot + 1) * stride], scale, row);
                }
                None => embedding::init::fill_weights(&self.cfg, *id, row),
            }
        }
    }

    /// Gives back the spare capacity of the arrays (after a load: they grew by doubling).
    pub fn shrink(&self) {
        let mut s = self.slots.write();
        s.index.shrink_to_fit();
        s.data.shrink_to_fit();
        s.scales.shrink_to_fit();
    }

    /// The ids held for which `pick(id)` holds, in no order.
    pub fn ids_where(&self, mut pick: impl FnMut(u64) -> bool) -> Vec<u64> {
        let s = self.slots.read();
        s.index.keys().copied().filter(|&id| pick(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rows_round_trip_within_their_precision_and_missing_ids_read_as_initializers() {
        let cfg = TableConfig {
            name: "t".into(),
            ..TableConfig::counter(1, 3)
        };
        let rows = [0.5f32, -1.25, 3.0, 1e-3, 2.0, -0.7];
        for p in [
            ServePrecision::F32,
            ServePrecision::Bf16,
            ServePrecision::Int8,
        ] {
            let t = CompactTable::new(cfg.clone(), p);
            t.insert(&[7, 9], &rows);
            let mut out = [0.0f32; 9];
            t.gather(&[9, 7, 11], &mut out);
            let back = [out[3], out[4], out[5], out[0], out[1], out[2]];
            for (row, got) in rows.chunks(3).zip(back.chunks(3)) {
                let max = row.iter().fold(0.0f32, |m, w| m.max(w.abs()));
                for (&w, &g) in row.iter().zip(got) {
                    let tol = match p {
                        ServePrecision::F32 => 0.0,
                        ServePrecision::Bf16 => w.abs() / 256.0,
                        ServePrecision::Int8 => max / 254.0 * 1.0001,
                    };
                    assert!((w - g).abs() <= tol, "{p}: {w} came back as {g}");
                }
            }
            let mut init = [0.0f32; 3];
            embedding::init::fill_weights(&cfg, 11, &mut init);
            assert_eq!(out[6..], init, "{p}: a missing id reads as its initializer");
            // Overwrite, delete, reuse the slot.
            t.insert(&[7], &[1.0, 1.0, 1.0]);
            assert_eq!(t.remove(&[9, 12]), 1);
            t.insert(&[12], &[0.0, 0.0, 0.0]);
            assert_eq!(t.len(), 2);
            t.gather(&[7, 12, 9], &mut out);
            let mut init9 = [0.0f32; 3];
            embedding::init::fill_weights(&cfg, 9, &mut init9);
            assert_eq!(out[..6], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
            assert_eq!(out[6..], init9);
            let mut ids = t.ids_where(|_| true);
            ids.sort();
            assert_eq!(ids, [7, 12]);
        }
        assert_eq!("int8".parse(), Ok(ServePrecision::Int8));
        let err = "f16".parse::<ServePrecision>().unwrap_err();
        assert!(err.contains("\"f16\""), "{err}");
    }

    proptest! {
        /// int8 rows come back within half a scale step of every weight; bf16 within its rounding.
        #[test]
        fn quantized_rows_stay_within_their_bound(row in proptest::collection::vec(-100.0f32..100.0, 1..40)) {
            let max = row.iter().fold(0.0f32, |m, w| m.max(w.abs()));
            for p in [ServePrecision::Bf16, ServePrecision::Int8] {
                let mut bytes = vec![0u8; p.stride(row.len())];
                let scale = p.encode(&row, &mut bytes);
                let mut back = vec![0.0f32; row.len()];
                p.decode(&bytes, scale, &mut back);
                for (&w, &g) in row.iter().zip(&back) {
                    let tol = match p {
                        ServePrecision::Int8 => max / 254.0 * 1.0001 + 1e-30,
                        _ => w.abs() / 256.0,
                    };
                    prop_assert!((w - g).abs() <= tol, "{} {} -> {}", p, w, g);
                }
            }
        }
    }
}
