//! Sizing: the memory and disk a table of a given row count costs, computed from the engine's layout (for
//! `ps-server plan`), without building the table.
//!
//! # Memory (what [`crate::Table::memory_bytes`] counts)
//! Rows hash onto [`STRIPES`] stripes; each stripe holds, for its `r` rows:
//! - the arena (`arena.rs`): chunks of `2^k` rows (the largest power of two with `2^k x row bytes <= 64 KiB`),
//!   each row `row_words x 4` bytes ([`crate::TableConfig::row_bytes`]: f32 or packed half weights, then f32
//!   state) plus its 8-byte id (plus a 4-byte stamp with a TTL); the last chunk
//!   grows by doubling from 16 rows; the chunk list itself (72 bytes a chunk) by doubling;
//! - the index (`table/index.rs`): 4-byte buckets, grown to `max(1.5 x, (len + 1) / 0.85 + 1)` buckets, at
//!   least 16, whenever an insert would pass a load of 0.85;
//! - two bitsets (dirty, CLOCK reference): one `u64` word per 64 slots each, grown by doubling.
//!
//! [`table_memory_bytes`] replays those growth rules for `rows / STRIPES` rows per stripe. It is an estimate:
//! real stripes differ by about the square root of their row count, and a stripe just past a growth point
//! costs more than one just before it. The unit tests hold it within 3% of a real table, so a change of the
//! layout that this module does not follow fails them.
//!
//! # Disk
//! RocksDB stores each row once after compaction: the 8-byte key, the 8-byte sequence number and type RocksDB
//! appends to it, the value (`row_len x 4` bytes, uncompressed), entry varints, restart points and per-block
//! index entries ([`DISK_OVERHEAD_PER_ROW`], measured).

use crate::table::STRIPES;

/// Target bytes of row data per arena chunk (`arena.rs`).
const CHUNK_BYTES: usize = 64 * 1024;
/// Smallest capacity of a chunk's first allocation, in rows (`arena.rs`).
const MIN_CHUNK_ROWS: usize = 16;
/// Size of an arena chunk header (three `Vec`s).
const CHUNK_HEADER: usize = 72;
/// Index load limit, `LOAD_NUM / LOAD_DEN` (`table/index.rs`).
const LOAD_NUM: usize = 17;
const LOAD_DEN: usize = 20;
/// Smallest index allocation, in buckets.
const MIN_BUCKETS: usize = 16;
/// Bytes of a table independent of its rows (the `Table`, 64 cache-padded stripe headers), rounded up.
const TABLE_FIXED: usize = 16 * 1024;

/// Bytes RocksDB spends per row beyond the key and value, after compaction into SST files (no compression):
/// the internal key suffix (8) and entry varints (3), less the key prefix shared with the previous entry,
/// plus restart points and index blocks. Measured with 1M and 4M rows of dim 16 and 64: 10.0 to 12.5 bytes
/// (`ps-server/examples/plan_measure.rs`; bench/figures/history.md, "ps-server plan").
pub const DISK_OVERHEAD_PER_ROW: f64 = 11.0;

/// Disk used right after a write-back of freshly written rows, relative to the compacted size: the
/// write-ahead log still holds rows already flushed into SST files. Measured 1.6x to 2.3x; provision for it.
pub const DISK_PEAK_FACTOR: f64 = 2.3;

/// Per-row memory of a table with a given row layout, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryEstimate {
    /// Heap bytes of the whole table.
    pub total_bytes: u64,
    /// Of which arena bytes (rows, ids, stamps, chunk slack).
    pub arena_bytes: u64,
    /// Of which index bytes.
    pub index_bytes: u64,
    /// Of which dirty and reference bitsets.
    pub bitset_bytes: u64,
}

impl MemoryEstimate {
    /// Total bytes per row (0 for no rows).
    pub fn bytes_per_row(&self, rows: u64) -> f64 {
        if rows == 0 {
            0.0
        } else {
            self.total_bytes as f64 / rows as f64
        }
    }
}

/// Arena bytes of one stripe holding `r` rows of `row_words` words (+ id, + stamp) each.
fn arena_bytes(r: usize, row_words: usize, stamps: bool) -> usize {
    let per_row = row_words * 4 + 8 + if stamps { 4 } else { 0 };
    let fit = (CHUNK_BYTES / (row_words * 4)).max(1);
    let chunk_rows = 1usize << (usize::BITS - 1 - fit.leading_zeros());
    let (full, rem) = (r / chunk_rows, r % chunk_rows);
    let mut last = 0;
    if rem > 0 {
        last = MIN_CHUNK_ROWS.min(chunk_rows);
        while last < rem {
            last = (last * 2).min(chunk_rows);
        }
    }
    let chunks = full + usize::from(rem > 0);
    let chunk_list = if chunks == 0 {
        0
    } else {
        chunks.next_power_of_two().max(4)
    };
    (full * chunk_rows + last) * per_row + chunk_list * CHUNK_HEADER
}

/// Index bytes of one stripe after `r` inserts.
fn index_bytes(r: usize) -> usize {
    let mut cap = 0usize;
    // The insert that finds `(len + 1) * LOAD_DEN > cap * LOAD_NUM` grows the index: replay the growth points.
    while r * LOAD_DEN > cap * LOAD_NUM {
        let len = cap * LOAD_NUM / LOAD_DEN;
        cap = ((len + 1) * LOAD_DEN / LOAD_NUM + 1)
            .max(cap + cap / 2)
            .max(MIN_BUCKETS);
    }
    cap * 4
}

/// Bitset bytes (dirty + reference) of one stripe with `r` slots.
fn bitset_bytes(r: usize) -> usize {
    let words = r.div_ceil(64);
    let cap = if words == 0 {
        0
    } else {
        words.next_power_of_two().max(4)
    };
    2 * cap * 8
}

/// Estimated heap bytes of a table of `rows` rows of `row_words` 4-byte words each (weights and optimizer
/// state as stored: [`crate::RowCodec::words`], which is `row_len` for f32 weights) held in memory, with a
/// 4-byte stamp per row if `stamps` (tables with a TTL); what [`crate::Table::memory_bytes`] would report
/// after loading them.
pub fn table_memory(rows: u64, row_words: usize, stamps: bool) -> MemoryEstimate {
    let row_words = row_words.max(1);
    let stripes = STRIPES as u64;
    let mut est = MemoryEstimate {
        total_bytes: TABLE_FIXED as u64,
        arena_bytes: 0,
        index_bytes: 0,
        bitset_bytes: 0,
    };
    // Rows hash onto the stripes, so a stripe's count is binomial (mean `rows / STRIPES`) rather than the
    // mean itself, and the growth rules are steps: near a step, stripes just over it cost a doubling that the
    // mean misses. Each piece is the expectation over that count (5-point Gauss-Hermite rule on the normal
    // approximation), times the stripes.
    let mean = rows as f64 / stripes as f64;
    let sd = (mean * (1.0 - 1.0 / stripes as f64)).sqrt();
    let expect = |f: &dyn Fn(usize) -> usize| -> u64 {
        const RULE: [(f64, f64); 5] = [
            (0.0, 8.0 / 15.0),
            (-1.355_626_179_974_266, 0.222_075_922_005_612_8),
            (1.355_626_179_974_266, 0.222_075_922_005_612_8),
            (-2.856_970_013_872_806, 0.011_257_411_327_720_69),
            (2.856_970_013_872_806, 0.011_257_411_327_720_69),
        ];
        let e: f64 = RULE
            .iter()
            .map(|&(z, w)| w * f((mean + z * sd).round().max(0.0) as usize) as f64)
            .sum();
        (e * stripes as f64).round() as u64
    };
    est.arena_bytes = expect(&|r| arena_bytes(r, row_words, stamps));
    est.index_bytes = expect(&index_bytes);
    est.bitset_bytes = expect(&bitset_bytes);
    est.total_bytes += est.arena_bytes + est.index_bytes + est.bitset_bytes;
    est
}

/// Estimated bytes on disk (RocksDB SST files after compaction) of `rows` rows of `row_words` words.
pub fn table_disk_bytes(rows: u64, row_words: usize) -> u64 {
    (rows as f64 * disk_bytes_per_row(row_words)).ceil() as u64
}

/// Estimated bytes on disk per row of `row_words` words: key, value and [`DISK_OVERHEAD_PER_ROW`].
pub fn disk_bytes_per_row(row_words: usize) -> f64 {
    8.0 + (row_words * 4) as f64 + DISK_OVERHEAD_PER_ROW
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OptimizerConfig, TableConfig};
    use crate::table::Table;

    fn loaded(
        rows: u64,
        dim: usize,
        optimizer: OptimizerConfig,
        precision: crate::RowPrecision,
    ) -> (Table, usize) {
        let mut cfg = TableConfig::new(1, "t", dim);
        cfg.optimizer = optimizer;
        cfg.precision = precision;
        let words = cfg.row_codec().words();
        let row = vec![0.5f32; cfg.row_len()];
        let t = Table::new(cfg).unwrap();
        for id in 0..rows {
            t.load_row(id.wrapping_mul(0x9e37_79b9_7f4a_7c15), &row)
                .unwrap();
        }
        (t, words)
    }

    /// The estimate follows the real table's accounting within 3% at sizes before, after and between growth
    /// points.
    #[test]
    fn estimate_matches_a_real_table() {
        let adagrad = OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        use crate::RowPrecision::{Bf16, F16, F32};
        for (rows, dim, opt, p) in [
            (20_000u64, 16, adagrad, F32),
            (77_777, 16, adagrad, F32),
            (150_000, 64, adagrad, F32),
            (60_000, 8, OptimizerConfig::Sgd { lr: 0.1 }, F32),
            (150_000, 128, adagrad, Bf16),
            (77_777, 17, adagrad, F16),
        ] {
            let (t, words) = loaded(rows, dim, opt, p);
            let real = t.memory_bytes() as f64;
            let est = table_memory(rows, words, false).total_bytes as f64;
            assert!(
                (est / real - 1.0).abs() < 0.03,
                "rows {rows} dim {dim}: estimate {est} bytes, table {real} bytes ({:.2}%)",
                (est / real - 1.0) * 100.0
            );
        }
    }

    #[test]
    fn pieces_add_up_and_grow_with_rows() {
        let a = table_memory(1_000_000, 17, false);
        assert_eq!(
            a.total_bytes,
            TABLE_FIXED as u64 + a.arena_bytes + a.index_bytes + a.bitset_bytes
        );
        // Payload 68 + id 8 = 76 bytes a row; the index adds 4.7 to 7.1.
        let per_row = a.bytes_per_row(1_000_000);
        assert!((80.0..86.0).contains(&per_row), "{per_row}");
        assert!(table_memory(1_000_000, 17, true).total_bytes > a.total_bytes + 3_900_000);
        assert_eq!(table_memory(0, 17, false).total_bytes, TABLE_FIXED as u64);
        assert_eq!(disk_bytes_per_row(17), 8.0 + 68.0 + DISK_OVERHEAD_PER_ROW);
    }
}
