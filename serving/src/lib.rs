//! `ps-serve`: serves click predictions from an export of a training job (docs/serving.md).
//!
//! # Layout (the data path of a request)
//! - [`http`]: the HTTP/1.1 endpoint: `POST /v1/predict`, `GET /v1/model`, `GET /v1/embedding`, and
//!   `/metrics`, `/healthz`, `/readyz`.
//! - [`request`]: a predict body's layout (TSV or JSON rows) into a columnar batch.
//! - [`batcher`]: micro-batching of concurrent requests on the predicting thread.
//! - [`predict`]: one prediction, computed as the trainer's evaluation computes it.
//! - [`store`]: the embedding rows, per shard of the export's snapshot, memory-bounded over RocksDB, or
//!   held at a serving precision by [`compact`] (`--row-precision`).
//! - [`sync`]: delta sync from the training servers (rows and dense versions).
//! - [`state`]: the loaded export and its freshness.
//! - [`config`]: the one typed config (TOML, flags, environment).
//! - [`run`]: the process end to end; [`metrics`]: metric names.
//!
//! It depends on the `trainer` library for the model, the plan and the export format (one home for the
//! computation the trainer evaluates with), never on `ps-server`.

#![warn(missing_docs)]

pub mod batcher;
pub mod compact;
pub mod config;
pub mod http;
pub mod metrics;
pub mod predict;
pub mod request;
pub mod run;
pub mod state;
pub mod store;
pub mod sync;
