//! Storage of embedding tables for the parameter server: in-memory rows in lock-striped arenas, per-table
//! optimizers and deterministic initializers, and write-back to a durable [`Store`] (RocksDB in production).
//!
//! This crate knows nothing about networks, QUIC or wire formats (DESIGN.md, "Crates and their one job each"):
//! a row is an id plus `&[f32]`. The parameter server calls [`Engine`]:
//! [`Engine::gather`] for pulls, [`Engine::apply`] (or [`Engine::apply_at`]) for pushes, [`Engine::flush_dirty`]
//! on a timer and at shutdown, [`Engine::expire`] on a timer for tables with a TTL, and [`Engine::open`] at start
//! to recover tables from the store, and [`Engine::enforce_budget`] on a timer with a memory budget. Calls
//! return counts ([`ApplyStats`], [`GatherStats`], [`FlushStats`], [`ExpireStats`], [`EvictStats`]) for the
//! caller's metrics; this crate has no metrics dependency.
//!
//! # Layout
//! - [`config`](TableConfig): [`TableConfig`], [`OptimizerConfig`], [`InitConfig`], [`AdmissionConfig`];
//!   validation. The one description of a table, in config files, in the store's metadata and on the wire
//!   (as its JSON text there: protocol's `wire::tables`).
//! - [`init`]: the counter-based initializer, a pure function of (seed, id, element), drawn from the
//!   splitmix64 hash of the `base` crate (which also holds the seeded generator).
//! - [`optimizer`]: sans-IO row updates (SGD, row-wise and element-wise Adagrad, Adam with per-row steps,
//!   FTRL-Proximal) after per-table clipping and weight decay ([`optimizer::Regularizer`]).
//! - [`admission`]: the count-min sketch of frequency admission.
//! - [`precision`]: [`RowPrecision`] (f32, bf16 or f16 weights; f32 state) and [`RowCodec`], a row packed into
//!   `u32` words, which are also its bytes in the store.
//! - `arena`: chunked row storage of one stripe (private).
//! - [`prefetch`]: the cache prefetch hint ([`prefetch::read`]) of the table's lookups and the trainer's
//!   residual store.
//! - [`table`](Table): [`Table`], lock-striped rows with a compact index, dirty bits, admission and TTL.
//!   `table/budget.rs`: the capacity tier (memory budget, CLOCK eviction, batched read-back).
//! - [`batch`](DirtyBatch): [`DirtyBatch`], rows encoded for the store.
//! - [`store`](Store): the [`Store`] trait; [`MemStore`] and `RocksStore` implement it.
//! - [`engine`](Engine): [`Engine`], the tables of one server: registration, recovery, flushing, expiry.
//! - [`error`](EmbeddingError): [`EmbeddingError`], [`StoreError`].
//! - `snapshot`: `Engine::checkpoint` (a consistent RocksDB checkpoint plus `manifest.json`),
//!   `Snapshot` to read one back, `PushGuard` to keep a multi-table push out of half a checkpoint.
//! - [`weight_guard`]: [`WeightGuard`], what an optimizer step may leave in a row (never a non-finite weight).
//! - [`sizing`]: memory and disk of a table of R rows from the layout above, without building it.
//! - [`tensors`]: SafeTensors files, the open format of an export's tables (`snapshot::tensors`, a shard's
//!   tables as one file) and dense parameters.
//!
//! With a memory budget ([`Engine::open_with_budget`]), [`Engine::enforce_budget`] evicts cold rows (CLOCK) to
//! the store and misses read them back with one batched [`Store::get_rows`] per call (`table/budget.rs`).
//!
//! # Not here yet
//! Last-touched times and admission
//! counts are not persisted: recovered rows restart their TTL, and the sketch restarts empty.

//!
//! # Features
//! - `rocksdb` (default): `RocksStore`, snapshots (`Engine::checkpoint`, `Snapshot`) and `MemStore`
//!   checkpoints, which write a RocksDB. A trainer replaying its own pushes needs only the optimizers and
//!   leaves it off, so it links no RocksDB (`cargo tree -p trainer -e normal`).
//! - `failpoints` (tests only): the `fail` crate's failpoints in the store's write paths, for tests that
//!   inject disk errors, and crash points mid-checkpoint and mid-eviction (`failpoints` module lists them).
//!   Production builds leave it off and contain none.

#![warn(missing_docs)]

pub mod admission;
mod arena;
mod batch;
mod config;
mod engine;
mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod init;
mod lease;
mod mem_store;
pub mod optimizer;
pub mod precision;
pub mod prefetch;
#[cfg(feature = "rocksdb")]
mod rocks_store;
pub mod sizing;
#[cfg(feature = "rocksdb")]
pub mod snapshot;
mod store;
mod table;
pub mod tensors;
pub mod weight_guard;

#[cfg(all(test, feature = "rocksdb"))]
mod precision_test;
#[cfg(test)]
mod prop_budget_test;
#[cfg(all(test, feature = "rocksdb"))]
mod prop_cap_test;
#[cfg(test)]
mod prop_model;
#[cfg(test)]
mod prop_test;
#[cfg(test)]
mod store_conformance;
#[cfg(test)]
mod tier_race_test;

pub use batch::DirtyBatch;
pub use config::{
    AdmissionConfig, EvictionConfig, EvictionPolicy, ExportPrune, InitConfig, InitKind,
    OptimizerConfig, ScoreMode, TableConfig, MAX_DIM, MAX_NAME_BYTES, MAX_SKETCH_DEPTH,
    MAX_SKETCH_WIDTH,
};
pub use engine::{
    Engine, EvictStats, ExpireStats, FlushStats, FLUSH_BATCH_ROWS, TABLE_META_PREFIX,
};
pub use error::{EmbeddingError, StoreError};
pub use lease::LeaseStats;
pub use mem_store::MemStore;
pub use precision::{RowCodec, RowPrecision};
#[cfg(feature = "rocksdb")]
pub use rocks_store::{
    free_bytes, RocksStore, RocksTuning, DEFAULT_BLOCK_CACHE_BYTES, DEFAULT_RESERVE_BYTES,
    TABLE_READER_BYTES_PER_ROW, WRITE_BUFFER_BYTES,
};
#[cfg(feature = "rocksdb")]
pub use snapshot::{PushGuard, Snapshot, SnapshotError};
pub use store::{
    write_sorted_in_batches, GetFn, MetaWrite, PutFn, ScanFn, SortedRowsFn, Store, StoreMemory,
};
pub use table::{ApplyStats, GatherStats, PrefetchStats, Table, STRIPES};
pub use weight_guard::{Guarded, WeightGuard};
