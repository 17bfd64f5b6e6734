//! Storage of embedding tables for the parameter server: in-memory rows in lock-striped arenas, per-table
//! optimizers and deterministic initializers, and write-back to a durable [`Store`] (RocksDB in production).
//!
//! This crate knows nothing about networks, QUIC or wire formats (DESIGN.md, "Crates and their one job each"):
//! a row is an id plus `&[f32]`. The parameter server calls [`Engine`]:
//! [`Engine::gather`] for pulls, [`Engine::apply`] for pushes, [`Engine::flush_dirty`] on a timer and at
//! shutdown, and [`Engine::open`] at start to recover tables from the store.
//!
//! # Layout
//! - [`config`](TableConfig): [`TableConfig`], [`OptimizerConfig`], [`InitConfig`]; validation.
//! - [`init`]: the counter-based initializer, a pure function of (seed, id, element).
//! - [`optimizer`]: sans-IO row updates (SGD, row-wise and element-wise Adagrad).
//! - `arena`: chunked row storage of one stripe (private).
//! - [`table`](Table): [`Table`], lock-striped rows with a compact index and dirty bits.
//! - [`batch`](DirtyBatch): [`DirtyBatch`], rows encoded for the store.
//! - [`store`](Store): the [`Store`] trait; [`MemStore`] and [`RocksStore`] implement it.
//! - [`engine`](Engine): [`Engine`], the tables of one server: registration, recovery, flushing.
//! - [`error`](EmbeddingError): [`EmbeddingError`], [`StoreError`].
//!
//! # Not here yet
//! Adam and FTRL, frequency admission, TTL and memory-budget eviction (the store already has the batched
//! [`Store::get_rows`] read-back they need) and checkpoints are later steps of DESIGN.md.

#![warn(missing_docs)]

mod arena;
mod batch;
mod config;
mod engine;
mod error;
pub mod init;
mod mem_store;
pub mod optimizer;
mod rocks_store;
mod store;
mod table;

#[cfg(test)]
mod prop_test;
#[cfg(test)]
mod store_conformance;

pub use batch::DirtyBatch;
pub use config::{InitConfig, InitKind, OptimizerConfig, TableConfig, MAX_DIM};
pub use engine::{Engine, FlushStats, FLUSH_BATCH_ROWS, TABLE_META_PREFIX};
pub use error::{EmbeddingError, StoreError};
pub use mem_store::MemStore;
pub use rocks_store::RocksStore;
pub use store::{GetFn, ScanFn, Store};
pub use table::{ApplyStats, Table, STRIPES};
