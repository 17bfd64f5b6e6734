//! The trainer: reads Criteo-format click logs, computes DLRM's dense layers on CPU, and pulls and pushes
//! embedding rows from the parameter servers. It stores no embeddings beyond a batch (DESIGN.md, "Crates").
//!
//! # Layout
//! - [`criteo`]: Criteo TSV/CSV parsing, columnar shards, feature-id hashing, batched reading on its own thread.
//! - [`plan`]: per-batch planning: dedup, routing, payloads, gather and gradient reduction (no I/O).
//! - [`model`]: the DLRM dense model (MLPs, dot interaction, loss) and its optimizers.
//! - [`pipeline`]: the parse and plan stages, each on its own thread behind a bounded queue.
//! - [`train`]: the pipelined training and evaluation loops ([`train::Trainer`]): pull ahead, compute, push.
//! - [`dense_sync`]: dense parameters on the parameter servers, for several trainers.
//! - [`feedback`]: error feedback for lossy gradient pushes ([`feedback::ResidualStore`]): sender state.
//! - [`checkpoint`]: trainer checkpoints (dense parameters, optimizer state, data position, step).
//! - [`eval`]: exact AUC and logloss.
//! - [`run`]: one job end to end and its [`run::Summary`].
//! - [`demo`]: `trainer demo`: data, local servers, training, summary.
//! - [`config`]: model, optimizer and cluster flags.
//! - [`metrics`]: metric names and descriptions.
//! - [`preprocess`]: `trainer preprocess`: text input into columnar shards.
//! - [`cli`]: the binary's command line.

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod criteo;
pub mod demo;
pub mod dense_sync;
pub mod eval;
pub mod exchange;
pub mod feedback;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod plan;
pub mod preprocess;
pub mod push;
pub mod replay;
pub mod run;
pub mod train;
