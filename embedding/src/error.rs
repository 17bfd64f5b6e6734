//! Errors of this crate: [`EmbeddingError`] for table and engine calls, [`StoreError`] for the storage tier.
//!
//! Messages are lowercase and name the values involved (STYLE.md, "Errors"), so a log line or an error reply to a
//! trainer says what was wrong without a debugger.

use thiserror::Error;

/// An error from the storage tier ([`crate::Store`] implementations).
///
/// Corrupt stored data is reported here, never by a panic: a restarted server that finds a damaged value must be
/// able to say which table and id it was.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The backend (RocksDB) failed an operation.
    #[error("store {op} failed: {detail}")]
    Backend {
        /// What was being done, e.g. `"write_rows table 3"`.
        op: String,
        /// The backend's own message.
        detail: String,
    },
    /// Rows were written to or read from a table that [`crate::Store::ensure_table`] never created.
    #[error("store has no table {0}")]
    UnknownTable(u32),
    /// A stored key is not an 8-byte big-endian id.
    #[error("table {table}: corrupt key of {len} bytes, expected 8")]
    CorruptKey {
        /// Table whose column family holds the key.
        table: u32,
        /// Length of the key found.
        len: usize,
    },
    /// A stored row value has the wrong length for its table.
    #[error("table {table} id {id}: corrupt row value of {len} bytes, expected {expected}")]
    CorruptValue {
        /// Table of the row.
        table: u32,
        /// Id of the row.
        id: u64,
        /// Length of the value found, in bytes.
        len: usize,
        /// Length a row of this table has, in bytes ([`crate::TableConfig::row_bytes`]).
        expected: usize,
    },
    /// A metadata entry could not be read back (bad UTF-8 key, unparsable value, ...).
    #[error("meta {key}: {detail}")]
    CorruptMeta {
        /// The metadata key (lossily decoded if it was not UTF-8).
        key: String,
        /// What was wrong with it.
        detail: String,
    },
}

/// An error from a [`crate::Table`] or [`crate::Engine`] call.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EmbeddingError {
    /// A table configuration field is out of range.
    #[error("table {table}: invalid {field} = {value}, expected {expected}")]
    InvalidConfig {
        /// Id of the table being configured.
        table: u32,
        /// The field, as a path (e.g. `"optimizer.lr"`).
        field: &'static str,
        /// The rejected value, formatted.
        value: String,
        /// What the field accepts.
        expected: &'static str,
    },
    /// A gather output or gradient buffer does not hold exactly `ids x dim` values.
    #[error("table {table}: {what} length {len}, expected {expected} ({ids} ids x dim {dim})")]
    WrongLength {
        /// The table called.
        table: u32,
        /// Which buffer: `"output"` or `"gradient"`.
        what: &'static str,
        /// Length passed, in f32s.
        len: usize,
        /// Length required, in f32s (`ids x dim`).
        expected: usize,
        /// Number of ids passed.
        ids: usize,
        /// The table's dim.
        dim: usize,
    },
    /// A full row (weights + optimizer state) passed to [`crate::Table::load_row`] has the wrong length.
    #[error("table {table} id {id}: row length {len}, expected {expected} (dim {dim} + optimizer state)")]
    RowLength {
        /// The table called.
        table: u32,
        /// Id of the row.
        id: u64,
        /// Length passed, in f32s.
        len: usize,
        /// The table's row length in f32s.
        expected: usize,
        /// The table's dim.
        dim: usize,
    },
    /// A row loaded into a bf16 or f16 table (from a replica, a restore, a snapshot's SafeTensors) has a weight
    /// that precision cannot hold exactly: rows of a wider precision are refused rather than rounded unseen.
    #[error(
        "table {table} id {id}: element {element} (of the weights, then the optimizer state) = {value:e} is not \
         exact in the table's {precision} rows (rows of f32 precision cannot be loaded into a {precision} table \
         without rounding)"
    )]
    InexactRow {
        /// The table.
        table: u32,
        /// Id of the row.
        id: u64,
        /// Index of the weight.
        element: usize,
        /// The weight.
        value: f32,
        /// The table's precision (`bf16`, `f16`).
        precision: &'static str,
    },
    /// Scores were given to a table that does not evict by score ([`crate::EvictionPolicy::Score`]).
    #[error(
        "table {table}: scores given, but the table keeps none (its eviction is {policy}; give it \
         eviction = {{policy = \"score\", max_rows = ...}})"
    )]
    NotScored {
        /// The table.
        table: u32,
        /// Its eviction policy (`none`, `lfu`).
        policy: &'static str,
    },
    /// A score is negative or not finite.
    #[error("table {table} id {id}: score {score} is not a finite value >= 0")]
    BadScore {
        /// The table.
        table: u32,
        /// The id it was given for.
        id: u64,
        /// The score.
        score: f32,
    },
    /// A stripe of a table reached `u32::MAX` rows (slot indices are 32-bit to keep the index small).
    #[error("table {table}: stripe {stripe} is full ({rows} rows)")]
    TableFull {
        /// The table.
        table: u32,
        /// The full stripe.
        stripe: usize,
        /// Rows it holds.
        rows: usize,
    },
    /// A prefetch asked for more distinct rows of a table than it may pin at once (half its memory budget).
    #[error("prefetch of {ids} distinct ids for table {table} exceeds its pin limit of {limit} rows (half the memory budget); prefetch fewer batches ahead or raise the budget")]
    PrefetchTooLarge {
        /// The table.
        table: u32,
        /// Distinct ids asked for.
        ids: usize,
        /// The table's pin limit.
        limit: usize,
    },
    /// No table with this id is registered.
    #[error("unknown table {0}")]
    UnknownTable(u32),
    /// A table with this id is registered with a different configuration.
    #[error("table {table}: already registered with a different config ({differences})")]
    TableConflict {
        /// The table id.
        table: u32,
        /// The differing fields, e.g. `"dim: registered 16, requested 32"`.
        differences: String,
    },
    /// Registering one more table would pass the number of tables the caller may have.
    #[error("table {table}: not registered, the server holds {tables} tables and this caller may register at most {max}")]
    TooManyTables {
        /// The table that was not registered.
        table: u32,
        /// Tables the server holds.
        tables: usize,
        /// The caller's limit.
        max: usize,
    },
    /// The storage tier failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_values() {
        let e = EmbeddingError::WrongLength {
            table: 3,
            what: "gradient",
            len: 100,
            expected: 96,
            ids: 6,
            dim: 16,
        };
        assert_eq!(
            e.to_string(),
            "table 3: gradient length 100, expected 96 (6 ids x dim 16)"
        );
        assert_eq!(
            EmbeddingError::UnknownTable(42).to_string(),
            "unknown table 42"
        );
        let e = StoreError::CorruptValue {
            table: 3,
            id: 7,
            len: 10,
            expected: 68,
        };
        assert_eq!(
            e.to_string(),
            "table 3 id 7: corrupt row value of 10 bytes, expected 68"
        );
        let e: EmbeddingError = e.into();
        assert!(e.to_string().contains("id 7"));
    }
}
