//! Error feedback for lossy gradient pushes: the quantization residual of each row is kept by the sender and
//! added to that row's next push.
//!
//! A row pushed as `v = g + r` (its gradient plus its residual) goes on the wire as `Q(v)`; the sender decodes
//! its own bytes and keeps `r' = v - D(Q(v))`. Over any number of pushes, the decoded values the server applied
//! plus the residual still held equal the sum of the true gradients (up to f32 rounding), so quantization
//! delays part of a gradient instead of losing it (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019,
//! "Error feedback fixes SignSGD").
//!
//! Residuals are stored unscaled: pushes are loss-scaled by a per-batch factor (the trainer multiplies by the
//! batch size), so [`ResidualStore::encode_rows`] takes the scale of the push and converts.
//!
//! # Bounded memory
//! Rows are keyed by (table, id); a residual lives in a fixed-size slot of one arena (no allocation per row
//! once the arena has grown). Two limits, both in [`FeedbackConfig`]:
//! - **Age**: a residual whose row was not pushed for `max_age_steps` steps ([`ResidualStore::end_step`]) is
//!   dropped. Rows are pushed when they occur in a batch, so rare rows lose a residual of at most half a
//!   quantization step per element: a bounded, one-off error.
//! - **Count**: at most `max_rows` residuals are held. When the store is full, rows without a residual yet
//!   are pushed without feedback (their new residual is dropped and counted in
//!   [`FeedbackStats::dropped_full`]); rows already held keep theirs.
//!
//! The age sweep runs every `max_age_steps / 2` steps (at least every step), so it costs O(rows held) per
//! half-age, not per step.

use crate::compression::codec::{decode_rows, encode_rows, Encoding};
use crate::routing::mix64;

/// Limits of a [`ResidualStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedbackConfig {
    /// Residuals of rows not pushed for this many steps are dropped (at least 1).
    pub max_age_steps: u64,
    /// Most residuals held at once.
    pub max_rows: usize,
}

impl Default for FeedbackConfig {
    /// 100 steps and 4M rows (at dim 16 about 340 MB at the cap; the demo holds far fewer).
    fn default() -> Self {
        FeedbackConfig {
            max_age_steps: 100,
            max_rows: 4 << 20,
        }
    }
}

/// Counters of a [`ResidualStore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedbackStats {
    /// Residuals held now.
    pub rows: usize,
    /// Residuals dropped for age so far.
    pub dropped_age: u64,
    /// New residuals not stored because the store was full.
    pub dropped_full: u64,
}

/// Why [`ResidualStore::import`] refused a saved store.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImportError {
    /// The bytes do not start with the store's magic and format version.
    #[error("not a residual store (magic/version {found:?}, expected {expected:?})")]
    BadHeader {
        /// The first bytes found.
        found: Vec<u8>,
        /// What a store starts with.
        expected: Vec<u8>,
    },
    /// Saved with another row dimension.
    #[error("residuals saved with dim {saved}, this store has dim {expected}")]
    WrongDim {
        /// The saved dimension.
        saved: u32,
        /// The store's.
        expected: usize,
    },
    /// Shorter or longer than its row count says.
    #[error("residual store of {rows} rows needs {needed} bytes, found {found}")]
    WrongLength {
        /// Rows announced.
        rows: u64,
        /// Bytes they need.
        needed: u64,
        /// Bytes present.
        found: usize,
    },
    /// A row appears twice.
    #[error("residual of table {table} id {id} saved twice")]
    Duplicate {
        /// Its table.
        table: u32,
        /// Its id.
        id: u64,
    },
    /// A saved value is NaN or infinite.
    #[error("residual of table {table} id {id} holds a non-finite value")]
    NonFinite {
        /// Its table.
        table: u32,
        /// Its id.
        id: u64,
    },
}

const MAGIC: &[u8; 8] = b"PSRES\x00\x00\x01";
/// Magic, dim, step, last sweep, row count.
const HEADER: usize = 36;

/// Rows looked up ahead of the one being processed, so their cache misses overlap.
const AHEAD: usize = 8;
/// Rows encoded, decoded and stored per chunk (their scratch stays in L1/L2).
const CHUNK: usize = 256;
/// An empty index entry.
const EMPTY: u32 = u32::MAX;

/// One entry of the open-addressing index: a key and its slot ([`EMPTY`] if unused).
#[derive(Clone, Copy)]
struct Entry {
    id: u64,
    table: u32,
    slot: u32,
}

const VACANT: Entry = Entry {
    id: 0,
    table: 0,
    slot: EMPTY,
};

/// (table, id) -> slot, linear probing, load at most 1/2. Deletion rebuilds (the age sweep runs every
/// half-age and visits every slot anyway).
struct Index {
    entries: Vec<Entry>,
    len: usize,
}

#[inline]
fn key_hash(table: u32, id: u64) -> u64 {
    mix64(id ^ (table as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

impl Index {
    fn new() -> Index {
        Index {
            entries: vec![VACANT; 64],
            len: 0,
        }
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        h as usize & (self.entries.len() - 1)
    }

    #[inline]
    fn prefetch(&self, h: u64) {
        embedding::prefetch::read(self.entries.as_ptr().wrapping_add(self.home(h)));
    }

    #[inline]
    fn find(&self, h: u64, table: u32, id: u64) -> Option<u32> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(h);
        loop {
            let e = self.entries[i];
            if e.slot == EMPTY {
                return None;
            }
            if e.id == id && e.table == table {
                return Some(e.slot);
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts a key known to be absent.
    fn insert(&mut self, table: u32, id: u64, slot: u32) {
        if (self.len + 1) * 2 > self.entries.len() {
            let grown = vec![VACANT; self.entries.len() * 2];
            let old = std::mem::replace(&mut self.entries, grown);
            self.len = 0;
            for e in old.into_iter().filter(|e| e.slot != EMPTY) {
                self.insert(e.table, e.id, e.slot);
            }
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(key_hash(table, id));
        while self.entries[i].slot != EMPTY {
            i = (i + 1) & mask;
        }
        self.entries[i] = Entry { id, table, slot };
        self.len += 1;
    }

    fn clear(&mut self) {
        self.entries.fill(VACANT);
        self.len = 0;
    }
}

/// Residuals of lossy pushes, per (table, id). Call order: any number of [`ResidualStore::encode_rows`] per
/// step, then [`ResidualStore::end_step`].
///
/// A batch's rows are processed in bulk: index lookups with the next rows' entries prefetched, then chunks of
/// rows whose residuals are added, encoded in one call, decoded in one call and stored, so the cost per row is
/// about one overlapped cache miss in the index and one in the residual arena.
pub struct ResidualStore {
    dim: usize,
    cfg: FeedbackConfig,
    index: Index,
    /// `values[slot * dim..][..dim]`: the residual of a slot.
    values: Vec<f32>,
    /// Key of each slot; `None` when free.
    keys: Vec<Option<(u32, u64)>>,
    /// The step each slot was last pushed (for the age sweep).
    last_step: Vec<u64>,
    free: Vec<u32>,
    held: usize,
    step: u64,
    last_sweep: u64,
    stats: FeedbackStats,
    found: Vec<u32>,
    v: Vec<f32>,
    decoded: Vec<f32>,
}

impl ResidualStore {
    /// An empty store for rows of `dim` elements.
    pub fn new(dim: usize, cfg: FeedbackConfig) -> ResidualStore {
        ResidualStore {
            dim,
            cfg: FeedbackConfig {
                max_age_steps: cfg.max_age_steps.max(1),
                ..cfg
            },
            index: Index::new(),
            values: Vec::new(),
            keys: Vec::new(),
            last_step: Vec::new(),
            free: Vec::new(),
            held: 0,
            step: 0,
            last_sweep: 0,
            stats: FeedbackStats::default(),
            found: Vec::new(),
            v: Vec::new(),
            decoded: Vec::new(),
        }
    }

    /// Row dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Counters.
    pub fn stats(&self) -> FeedbackStats {
        FeedbackStats {
            rows: self.held,
            ..self.stats
        }
    }

    /// The residual held for a row (unscaled), if any.
    pub fn residual(&self, table: u32, id: u64) -> Option<&[f32]> {
        let s = self.index.find(key_hash(table, id), table, id)? as usize;
        Some(&self.values[s * self.dim..][..self.dim])
    }

    /// Appends the rows of `grads` (row `i` is the gradient of `ids[i]`, already multiplied by `scale`) to `out`
    /// encoded as `enc`, each with its residual added, and keeps the new residuals. Lossless encodings pass
    /// through without touching the store. `ids` must not repeat within a call.
    pub fn encode_rows(
        &mut self,
        table: u32,
        ids: &[u64],
        grads: &[f32],
        scale: f32,
        enc: Encoding,
        out: &mut Vec<u8>,
    ) {
        let dim = self.dim;
        debug_assert_eq!(ids.len() * dim, grads.len());
        if !enc.is_lossy() || dim == 0 {
            encode_rows(grads, dim, enc, out);
            return;
        }
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let n = ids.len();
        // Lookups, the entry of the row AHEAD rows on already on its way into the cache.
        self.found.clear();
        for (i, &id) in ids.iter().enumerate() {
            if let Some(&next) = ids.get(i + AHEAD) {
                self.index.prefetch(key_hash(table, next));
            }
            let slot = self.index.find(key_hash(table, id), table, id);
            self.found.push(slot.unwrap_or(EMPTY));
        }
        let width = enc.row_bytes(dim);
        let (mut v_all, mut decoded) = (
            std::mem::take(&mut self.v),
            std::mem::take(&mut self.decoded),
        );
        let mut start = 0;
        while start < n {
            let end = (start + CHUNK).min(n);
            let rows = end - start;
            // v = g + residual * scale.
            v_all.clear();
            v_all.extend_from_slice(&grads[start * dim..end * dim]);
            for i in start..end {
                if let Some(&s) = self.found.get(i + AHEAD).filter(|&&s| s != EMPTY) {
                    embedding::prefetch::read(self.values.as_ptr().wrapping_add(s as usize * dim));
                }
                let s = self.found[i];
                if s == EMPTY {
                    continue;
                }
                let r = &self.values[s as usize * dim..][..dim];
                let v = &mut v_all[(i - start) * dim..][..dim];
                for (v, r) in v.iter_mut().zip(r) {
                    *v += r * scale;
                }
            }
            let at = out.len();
            encode_rows(&v_all, dim, enc, out);
            decoded.resize(rows * dim, 0.0);
            decode_rows(&out[at..at + rows * width], dim, enc, &mut decoded)
                .expect("rows just encoded decode");
            for i in start..end {
                let v = &v_all[(i - start) * dim..][..dim];
                let d = &decoded[(i - start) * dim..][..dim];
                let s = match self.found[i] {
                    // Exact rows need no residual: keep the store to rows that carry one.
                    EMPTY if v == d => continue,
                    EMPTY => match self.allocate(table, ids[i]) {
                        Some(s) => s,
                        None => continue,
                    },
                    s => s,
                };
                self.last_step[s as usize] = self.step;
                let r = &mut self.values[s as usize * dim..][..dim];
                for ((r, v), d) in r.iter_mut().zip(v).zip(d) {
                    // A non-finite gradient is refused by the server; do not carry it forward.
                    let e = (v - d) * inv;
                    *r = if e.is_finite() { e } else { 0.0 };
                }
            }
            start = end;
        }
        (self.v, self.decoded) = (v_all, decoded);
    }

    fn allocate(&mut self, table: u32, id: u64) -> Option<u32> {
        if self.held >= self.cfg.max_rows {
            self.stats.dropped_full += 1;
            return None;
        }
        let s = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = self.keys.len() as u32;
                self.keys.push(None);
                self.last_step.push(0);
                self.values.resize(self.values.len() + self.dim, 0.0);
                s
            }
        };
        self.keys[s as usize] = Some((table, id));
        self.index.insert(table, id, s);
        self.held += 1;
        Some(s)
    }

    /// Ends a step: advances the step counter and, every half-age, drops residuals older than the age limit.
    pub fn end_step(&mut self) {
        self.step += 1;
        let half = (self.cfg.max_age_steps / 2).max(1);
        if self.step - self.last_sweep < half {
            return;
        }
        self.last_sweep = self.step;
        let (max_age, step, dim) = (self.cfg.max_age_steps, self.step, self.dim);
        let mut dropped = 0;
        for (s, key) in self.keys.iter_mut().enumerate() {
            if key.is_some() && step - self.last_step[s] >= max_age {
                *key = None;
                self.values[s * dim..][..dim].fill(0.0);
                self.free.push(s as u32);
                dropped += 1;
            }
        }
        if dropped > 0 {
            self.stats.dropped_age += dropped as u64;
            self.held -= dropped;
            self.rebuild_index();
        }
    }

    fn rebuild_index(&mut self) {
        self.index.clear();
        while self.index.entries.len() > 64 && self.held * 4 < self.index.entries.len() {
            self.index.entries.truncate(self.index.entries.len() / 2);
        }
        for (s, key) in self.keys.iter().enumerate() {
            if let Some((table, id)) = *key {
                self.index.insert(table, id, s as u32);
            }
        }
    }

    /// The store's state as bytes for a checkpoint ([`import`](Self::import) reads it back): a header with the
    /// dimension, step counter and last sweep, then per row its table, id, last step pushed and its values
    /// (little-endian). A store imported from them behaves exactly like this one from here on.
    pub fn export(&self) -> Vec<u8> {
        let dim = self.dim;
        let mut out = Vec::with_capacity(HEADER + self.held * (20 + dim * 4));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(dim as u32).to_le_bytes());
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&self.last_sweep.to_le_bytes());
        out.extend_from_slice(&(self.held as u64).to_le_bytes());
        for (s, key) in self.keys.iter().enumerate() {
            let Some((table, id)) = *key else { continue };
            out.extend_from_slice(&table.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&self.last_step[s].to_le_bytes());
            for v in &self.values[s * dim..][..dim] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// Replaces the store's residuals and step counter by those of [`export`](Self::export)'s bytes (limits and
    /// counters stay this store's; rows beyond `max_rows` are dropped and counted as
    /// [`FeedbackStats::dropped_full`]).
    pub fn import(&mut self, bytes: &[u8]) -> Result<(), ImportError> {
        let dim = self.dim;
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(ImportError::BadHeader {
                found: bytes[..bytes.len().min(8)].to_vec(),
                expected: MAGIC.to_vec(),
            });
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let saved = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if saved as usize != dim {
            return Err(ImportError::WrongDim {
                saved,
                expected: dim,
            });
        }
        let rows = u64_at(28);
        let row_len = 20 + dim as u64 * 4;
        let needed = rows
            .checked_mul(row_len)
            .and_then(|b| b.checked_add(HEADER as u64));
        if needed != Some(bytes.len() as u64) {
            return Err(ImportError::WrongLength {
                rows,
                needed: needed.unwrap_or(u64::MAX),
                found: bytes.len(),
            });
        }
        let mut fresh = ResidualStore::new(dim, self.cfg);
        fresh.stats = self.stats;
        fresh.step = u64_at(12);
        fresh.last_sweep = u64_at(20).min(fresh.step);
        for row in bytes[HEADER..].chunks_exact(row_len as usize) {
            let table = u32::from_le_bytes(row[..4].try_into().expect("4 bytes"));
            let id = u64::from_le_bytes(row[4..12].try_into().expect("8 bytes"));
            let last = u64::from_le_bytes(row[12..20].try_into().expect("8 bytes"));
            if fresh.residual(table, id).is_some() {
                return Err(ImportError::Duplicate { table, id });
            }
            let values = row[20..]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")));
            if values.clone().any(|v| !v.is_finite()) {
                return Err(ImportError::NonFinite { table, id });
            }
            let Some(s) = fresh.allocate(table, id) else {
                continue;
            };
            fresh.last_step[s as usize] = last.min(fresh.step);
            for (dst, v) in fresh.values[s as usize * dim..][..dim]
                .iter_mut()
                .zip(values)
            {
                *dst = v;
            }
        }
        *self = fresh;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
