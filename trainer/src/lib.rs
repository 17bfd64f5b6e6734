//! The trainer: reads Criteo-format click logs, computes DLRM's dense layers on CPU, and pulls and pushes
//! embedding rows from the parameter servers. It stores no embeddings beyond a batch (DESIGN.md, "Crates").
//!
//! # Layout
//! - [`criteo`]: Criteo TSV/CSV parsing, columnar shards, feature-id hashing, batched reading on its own thread.
//! - [`plan`]: per-batch planning: dedup, routing, payloads, gather and gradient reduction (no I/O).
//! - [`model`]: the DLRM dense model (MLPs, dot interaction, loss) and its optimizers.
//! - [`train`]: the pipelined training and evaluation loops ([`train::Trainer`]).
//! - [`eval`]: exact AUC and logloss.
//! - [`run`]: one job end to end and its [`run::Summary`].
//! - [`demo`]: `trainer demo`: data, local servers, training, summary.
//! - [`cluster`]: local `ps-server` processes on loopback.
//! - [`config`]: model, optimizer and cluster flags.
//! - [`metrics`]: metric names and descriptions.
//! - [`preprocess`]: `trainer preprocess`: text input into columnar shards.
//! - [`cli`]: the binary's command line.

pub mod cli;
pub mod cluster;
pub mod config;
pub mod criteo;
pub mod demo;
pub mod eval;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod preprocess;
pub mod run;
pub mod train;
