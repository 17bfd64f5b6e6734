//! `ps-server plan`: memory, disk and server count for a table of R rows, from the engine's layout
//! ([`embedding::sizing`]), before anything is deployed.
//!
//! - Memory per row: arena row (weights + optimizer state as f32) + 8-byte id + chunk slack, index buckets and
//!   bitsets, exactly as [`embedding::Table::memory_bytes`] counts them (checked against real tables within
//!   3% by the sizing tests; against whole processes in BENCHMARKS.md).
//! - Disk per row: key, value and RocksDB's per-entry overhead after compaction.
//! - Servers: each server gives [`ROW_MEMORY_FRACTION`] of `--server-memory` to rows (the rest: RocksDB
//!   memtables and block cache, request buffers, the runtime); the plan is the fewest servers whose share of
//!   the in-memory rows fits. With `--memory-budget B` (bytes of RAM for the table over the whole cluster),
//!   only the rows that fit in B stay in memory (`--memory-budget-rows` per server), the rest live on disk and
//!   are read back on a miss.

use std::fmt;

use embedding::sizing::{disk_bytes_per_row, table_memory, DISK_PEAK_FACTOR};
use embedding::OptimizerConfig;
use thiserror::Error;

/// Share of a server's memory given to rows.
pub const ROW_MEMORY_FRACTION: f64 = 0.8;

/// Resident memory of an idle `ps-server` with no table (runtime, TLS, metrics): 21.6 MiB measured with glibc
/// (bench/figures/history.md, "Ninth round"), 23.7 MiB with jemalloc ("Tenth round"), rounded up.
pub const PROCESS_BASE_BYTES: u64 = 24 << 20;

/// Bytes per id of a table's negative cache (`embedding` table/budget.rs: a `HashSet<u64>` at most half full
/// of the budget): 8 bytes, a control byte, and load-factor slack.
pub const NEGATIVE_CACHE_BYTES_PER_ID: u64 = 16;

/// Bytes of memtables a server holds at its peak: [`embedding::WRITE_BUFFER_BYTES`] only triggers flushes (of
/// the largest memtable once the mutable ones pass 7/8 of it), and the memtables being flushed still count
/// while the next generation fills, so the peak is about twice the cap: 466 MiB against the 256 MiB cap on a
/// 47M-row budgeted run (bench/figures/history.md, "Fourteenth round").
pub const MEMTABLE_PEAK_BYTES: u64 = 2 * embedding::WRITE_BUFFER_BYTES as u64;

/// Bytes of RocksDB's table readers (index and filter blocks, held outside the block cache) for `rows` rows
/// on disk: every row is written back, so all of a server's rows count.
pub fn table_reader_bytes(rows: u64) -> u64 {
    (rows as f64 * embedding::TABLE_READER_BYTES_PER_ROW).ceil() as u64
}

/// Optimizers, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanOptimizer {
    /// SGD: no state.
    Sgd,
    /// Row-wise Adagrad: one accumulator per row.
    RowAdagrad,
    /// Element-wise Adagrad: one accumulator per weight.
    Adagrad,
    /// Adam: two moments per weight and a step count per row.
    Adam,
    /// FTRL-Proximal: two accumulators per weight.
    Ftrl,
}

impl PlanOptimizer {
    /// f32s of optimizer state per row for `dim` weights.
    pub fn state_len(self, dim: usize) -> usize {
        self.config().state_len(dim)
    }

    /// A config of this optimizer (its hyper-parameters do not change a row's size).
    pub fn config(self) -> OptimizerConfig {
        match self {
            PlanOptimizer::Sgd => OptimizerConfig::Sgd { lr: 0.01 },
            PlanOptimizer::RowAdagrad => OptimizerConfig::RowAdagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            PlanOptimizer::Adagrad => OptimizerConfig::Adagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            PlanOptimizer::Adam => OptimizerConfig::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            PlanOptimizer::Ftrl => OptimizerConfig::Ftrl {
                alpha: 0.05,
                beta: 1.0,
                l1: 0.0,
                l2: 0.0,
            },
        }
    }
}

/// What to size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInput {
    /// Rows of the table.
    pub rows: u64,
    /// Weights per row.
    pub dim: usize,
    /// The table's optimizer.
    pub optimizer: PlanOptimizer,
    /// How the table stores its weights.
    pub precision: embedding::RowPrecision,
    /// How it stores its optimizer's moments (bf16: Adam's and Adagrad's only).
    pub state_precision: embedding::RowPrecision,
    /// Bytes of RAM the table may use over the whole cluster; rows past it live on disk only.
    pub memory_budget: Option<u64>,
    /// RAM of one server, bytes.
    pub server_memory: u64,
    /// RocksDB block cache of one server, bytes (`ps-server --block-cache-mib`).
    pub block_cache_bytes: u64,
}

/// Why a plan cannot be made.
#[derive(Debug, Error, PartialEq)]
pub enum PlanError {
    /// A zero or absurd argument.
    #[error("{what} = {value}: {expected}")]
    Invalid {
        /// The flag.
        what: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// The table's settings together are refused by the table's own validation (e.g. bf16 state for row-wise
    /// Adagrad).
    #[error("{0}")]
    Table(String),
}

/// The numbers `ps-server plan` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The input.
    pub input: PlanInput,
    /// f32s per row (weights + optimizer state) as pulls and pushes see it.
    pub row_len: usize,
    /// Row payload bytes as stored (`row_len x 4` for f32 weights; half weights take 2 bytes each).
    pub payload_bytes: usize,
    /// Memory per row in memory, bytes (whole table in memory).
    pub memory_per_row: f64,
    /// Memory of the whole table in memory, bytes.
    pub memory_total: u64,
    /// Disk per row, bytes.
    pub disk_per_row: f64,
    /// Disk of the whole table, bytes (every row is written back).
    pub disk_total: u64,
    /// Rows kept in memory over the cluster (all, or what fits in the budget).
    pub rows_in_memory: u64,
    /// Servers needed.
    pub servers: u32,
    /// Memory of one server's share of the rows in memory, bytes.
    pub memory_per_server: u64,
    /// `--memory-budget-rows` to run each server with, if the budget keeps rows on disk.
    pub budget_rows_per_server: Option<u64>,
    /// Predicted resident memory of one server holding this table: its rows in memory, RocksDB's block cache,
    /// memtables and table readers, the negative cache (with a budget) and the process's base.
    pub resident_per_server: u64,
}

/// Computes a plan.
pub fn plan(input: PlanInput) -> Result<Plan, PlanError> {
    let invalid = |what, value: String, expected| PlanError::Invalid {
        what,
        value,
        expected,
    };
    if input.rows == 0 {
        return Err(invalid("--rows", "0".into(), "expected at least 1"));
    }
    if input.dim == 0 || input.dim > embedding::MAX_DIM {
        return Err(invalid(
            "--dim",
            input.dim.to_string(),
            "expected 1 to embedding::MAX_DIM",
        ));
    }
    let usable = (input.server_memory as f64 * ROW_MEMORY_FRACTION) as u64;
    if usable < (1 << 20) {
        return Err(invalid(
            "--server-memory",
            input.server_memory.to_string(),
            "expected at least 2 MiB",
        ));
    }
    let state_len = input.optimizer.state_len(input.dim);
    let row_len = input.dim + state_len;
    // The table's own validation says which optimizers store moments in bf16, naming the setting.
    let cfg = embedding::TableConfig {
        optimizer: input.optimizer.config(),
        precision: input.precision,
        state_precision: input.state_precision,
        ..embedding::TableConfig::new(1, "plan", input.dim)
    };
    cfg.validate()
        .map_err(|e| PlanError::Table(e.to_string()))?;
    let codec = cfg.row_codec();
    let words = codec.words();
    let whole = table_memory(input.rows, words, false);
    let memory_per_row = whole.bytes_per_row(input.rows);
    let rows_in_memory = match input.memory_budget {
        Some(b) => ((b as f64 / memory_per_row) as u64).min(input.rows),
        None => input.rows,
    };
    if rows_in_memory == 0 {
        return Err(invalid(
            "--memory-budget",
            input.memory_budget.unwrap_or(0).to_string(),
            "expected room for at least one row",
        ));
    }
    // The fewest servers whose share of the in-memory rows fits in their memory.
    let mut servers =
        (whole.total_bytes as f64 * rows_in_memory as f64 / input.rows as f64 / usable as f64)
            .ceil()
            .max(1.0) as u64;
    let share = |s: u64| table_memory(rows_in_memory.div_ceil(s), words, false).total_bytes;
    while share(servers) > usable {
        servers += 1;
    }
    let servers = u32::try_from(servers).map_err(|_| {
        invalid(
            "--rows",
            input.rows.to_string(),
            "needs more than 2^32 servers",
        )
    })?;
    let disk_per_row = disk_bytes_per_row(words);
    let budget_rows_per_server =
        (rows_in_memory < input.rows).then(|| rows_in_memory.div_ceil(servers as u64));
    let memory_per_server = share(servers as u64);
    let resident_per_server = memory_per_server
        + input.block_cache_bytes
        + MEMTABLE_PEAK_BYTES
        + table_reader_bytes(input.rows.div_ceil(servers as u64))
        + budget_rows_per_server.map_or(0, |b| b / 2 * NEGATIVE_CACHE_BYTES_PER_ID)
        + PROCESS_BASE_BYTES;
    Ok(Plan {
        input,
        row_len,
        payload_bytes: codec.bytes(),
        memory_per_row,
        memory_total: whole.total_bytes,
        disk_per_row,
        disk_total: (disk_per_row * input.rows as f64).ceil() as u64,
        rows_in_memory,
        servers,
        memory_per_server,
        budget_rows_per_server,
        resident_per_server,
    })
}

/// Bytes in binary units, e.g. `1.50 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Parses a byte count: a number with an optional unit, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (binary)
/// or `KB`, `MB`, `GB`, `TB` (decimal).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 16GiB, 512MB, 1048576)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    Ok((num * mult) as u64)
}

/// Parses a row precision: `f32`, `bf16` or `f16`.
pub fn parse_precision(s: &str) -> Result<embedding::RowPrecision, String> {
    s.parse()
}

/// Parses a row count: a number with an optional decimal suffix `K`, `M`, `G` (1e3, 1e6, 1e9).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('G') | Some('B') => (&t[..t.len() - 1], 1e9),
        _ => (t.as_str(), 1.0),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a row count (e.g. 10M, 2500000)"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("{s:?} is not a row count"));
    }
    Ok((n * mult) as u64)
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.input;
        let est = table_memory(i.rows, self.payload_bytes / 4, false);
        let per = |b: u64| b as f64 / i.rows as f64;
        writeln!(
            f,
            "table: {} rows, dim {}, {:?}, {} weights, {} state: {} values per row = {} bytes of payload",
            i.rows,
            i.dim,
            i.optimizer,
            i.precision.name(),
            i.state_precision.name(),
            self.row_len,
            self.payload_bytes
        )?;
        writeln!(
            f,
            "memory per row: {:.2} bytes ({:.3}x payload): arena {:.2} (row + 8-byte id + chunk slack), \
             index {:.2}, bitsets {:.2}",
            self.memory_per_row,
            self.memory_per_row / self.payload_bytes as f64,
            per(est.arena_bytes),
            per(est.index_bytes),
            per(est.bitset_bytes)
        )?;
        writeln!(
            f,
            "memory total (all rows in memory): {} ({} bytes)",
            human_bytes(self.memory_total),
            self.memory_total
        )?;
        writeln!(
            f,
            "disk per row: {:.1} bytes (RocksDB, uncompressed, after compaction); disk total: {} ({} bytes); \
             provision {} ({}x) for the write-ahead log after bulk writes",
            self.disk_per_row,
            human_bytes(self.disk_total),
            self.disk_total,
            human_bytes((self.disk_total as f64 * DISK_PEAK_FACTOR) as u64),
            DISK_PEAK_FACTOR
        )?;
        if let Some(b) = i.memory_budget {
            writeln!(
                f,
                "memory budget: {} over the cluster: {} rows in memory ({:.1}%), {} on disk only",
                human_bytes(b),
                self.rows_in_memory,
                100.0 * self.rows_in_memory as f64 / i.rows as f64,
                i.rows - self.rows_in_memory
            )?;
        }
        writeln!(
            f,
            "server memory: {} ({:.0}% for rows = {})",
            human_bytes(i.server_memory),
            ROW_MEMORY_FRACTION * 100.0,
            human_bytes((i.server_memory as f64 * ROW_MEMORY_FRACTION) as u64)
        )?;
        write!(
            f,
            "servers needed: {} (rows in memory per server: {}, {} each; disk per server: {})",
            self.servers,
            self.rows_in_memory.div_ceil(u64::from(self.servers)),
            human_bytes(self.memory_per_server),
            human_bytes(self.disk_total.div_ceil(u64::from(self.servers)))
        )?;
        if let Some(rows) = self.budget_rows_per_server {
            write!(f, "\nrun each server with --memory-budget-rows {rows}")?;
        }
        write!(
            f,
            "\npredicted resident memory per server: {} = rows {} + RocksDB block cache {} + memtables {} + \
             table readers {} + negative cache {} + process {}",
            human_bytes(self.resident_per_server),
            human_bytes(self.memory_per_server),
            human_bytes(i.block_cache_bytes),
            human_bytes(MEMTABLE_PEAK_BYTES),
            human_bytes(table_reader_bytes(i.rows.div_ceil(u64::from(self.servers)))),
            human_bytes(
                self.budget_rows_per_server
                    .map_or(0, |b| b / 2 * NEGATIVE_CACHE_BYTES_PER_ID)
            ),
            human_bytes(PROCESS_BASE_BYTES)
        )?;
        if self.budget_rows_per_server.is_some() {
            write!(
                f,
                " (plus the rows read back between two evictions, every 200 ms; prefetch pins stay within the budget)"
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(rows: u64) -> PlanInput {
        PlanInput {
            rows,
            dim: 16,
            optimizer: PlanOptimizer::RowAdagrad,
            precision: embedding::RowPrecision::F32,
            state_precision: embedding::RowPrecision::F32,
            memory_budget: None,
            server_memory: 16 << 30,
            block_cache_bytes: 64 << 20,
        }
    }

    /// Adam rows: bf16 weights alone leave the moments (f32) dominating; bf16 moments too bring the row to
    /// about half. bf16 state for row-wise Adagrad is refused by the table's own check, naming it.
    #[test]
    fn adam_rows_with_bf16_moments_take_about_half() {
        let of = |precision, state_precision| {
            plan(PlanInput {
                dim: 128,
                optimizer: PlanOptimizer::Adam,
                precision,
                state_precision,
                ..input(1_000_000)
            })
        };
        use embedding::RowPrecision::{Bf16, F32};
        let full = of(F32, F32).unwrap();
        let weights = of(Bf16, F32).unwrap();
        let both = of(Bf16, Bf16).unwrap();
        assert_eq!(
            (
                full.payload_bytes,
                weights.payload_bytes,
                both.payload_bytes
            ),
            (1540, 1284, 772)
        );
        let ratio = both.memory_per_row / full.memory_per_row;
        assert!((0.49..0.53).contains(&ratio), "{ratio}");
        assert!(
            both.to_string().contains("bf16 weights, bf16 state"),
            "{both}"
        );
        let err = plan(PlanInput {
            state_precision: Bf16,
            ..input(1_000)
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("state_precision"), "{err}");
    }

    #[test]
    fn half_precision_rows_of_dim_128_take_about_half() {
        let of = |precision| {
            plan(PlanInput {
                dim: 128,
                precision,
                ..input(10_000_000)
            })
            .unwrap()
        };
        let (f32_plan, bf16, f16) = (
            of(embedding::RowPrecision::F32),
            of(embedding::RowPrecision::Bf16),
            of(embedding::RowPrecision::F16),
        );
        assert_eq!((f32_plan.payload_bytes, bf16.payload_bytes), (516, 260));
        assert_eq!(f16.payload_bytes, 260);
        let ratio = bf16.memory_per_row / f32_plan.memory_per_row;
        assert!((0.50..0.56).contains(&ratio), "{ratio}");
        assert!(bf16.disk_per_row < 0.53 * f32_plan.disk_per_row);
        assert!(
            bf16.to_string()
                .contains("bf16 weights, f32 state: 129 values per row = 260 bytes"),
            "{bf16}"
        );
        assert_eq!(parse_precision("BF16"), Ok(embedding::RowPrecision::Bf16));
        assert!(parse_precision("int8")
            .unwrap_err()
            .contains("f32, bf16 or f16"));
    }

    #[test]
    fn ten_million_rows_of_dim_16() {
        let p = plan(input(10_000_000)).unwrap();
        assert_eq!((p.row_len, p.payload_bytes), (17, 68));
        assert!(
            (80.0..85.0).contains(&p.memory_per_row),
            "{}",
            p.memory_per_row
        );
        assert_eq!(p.servers, 1);
        assert_eq!(p.budget_rows_per_server, None);
        let text = p.to_string();
        assert!(text.contains("servers needed: 1"), "{text}");
        // Rows plus block cache, memtables, table readers (1.9 B per row on disk: 19 MB) and the process; no
        // negative cache without a budget.
        assert_eq!(
            p.resident_per_server,
            p.memory_per_server + (64 << 20) + (512 << 20) + 19_000_000 + PROCESS_BASE_BYTES
        );
        assert!(text.contains("table readers 18.12 MiB"), "{text}");
        assert!(
            text.contains("predicted resident memory per server"),
            "{text}"
        );
    }

    #[test]
    fn servers_grow_with_rows_and_budget_caps_memory() {
        let p = plan(input(1_000_000_000)).unwrap();
        // ~83 GB of rows over 12.8 GiB per server.
        assert!((6..=7).contains(&p.servers), "{}", p.servers);
        assert!(p.memory_per_server <= (16u64 << 30) * 4 / 5);
        let b = plan(PlanInput {
            memory_budget: Some(8 << 30),
            ..input(1_000_000_000)
        })
        .unwrap();
        assert_eq!(b.servers, 1);
        let rows = b.budget_rows_per_server.unwrap();
        assert!(rows < 110_000_000 && rows > 90_000_000, "{rows}");
        assert!(b.to_string().contains("--memory-budget-rows"), "{b}");
    }

    #[test]
    fn bad_input_names_the_flag() {
        assert_eq!(
            plan(input(0)).unwrap_err().to_string(),
            "--rows = 0: expected at least 1"
        );
        let e = plan(PlanInput {
            memory_budget: Some(10),
            ..input(5)
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("--memory-budget = 10"), "{e}");
    }

    #[test]
    fn units() {
        assert_eq!(parse_bytes("16GiB").unwrap(), 16 << 30);
        assert_eq!(parse_bytes("512 MB").unwrap(), 512_000_000);
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert!(parse_bytes("12 parsecs").is_err());
        assert_eq!(parse_count("10M").unwrap(), 10_000_000);
        assert_eq!(parse_count("2_500_000").unwrap(), 2_500_000);
        assert!(parse_count("x").is_err());
        assert_eq!(human_bytes(1536), "1.50 KiB");
    }
}
