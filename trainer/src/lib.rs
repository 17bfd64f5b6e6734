//! The trainer: reads Criteo-format click logs, computes DLRM's dense layers on CPU, and pulls and pushes
//! embedding rows from the parameter servers. It stores no embeddings beyond a batch (DESIGN.md, "Crates").
//!
//! # Layout
//! - [`criteo`] (the `criteo` crate, re-exported): Criteo TSV/CSV parsing, columnar shards, feature-id hashing, batched reading on its own thread.
//! - [`model`] (the `model` crate, re-exported): the DLRM dense model (MLPs, dot and DCNv2 interactions,
//!   loss) and its optimizers, the model spec format ([`model::spec`]), exact AUC and logloss
//!   ([`model::eval`]) and the export format ([`model::export`]), shared with serving.
//! - [`step`]: the stages of one training step in data-path order: pipeline (parse, plan threads), plan,
//!   exchange (pull), replay, push (with error feedback), dense sync.
//! - [`train`]: the pipelined training and evaluation loops ([`train::Trainer`]) driving the step's stages:
//!   pull ahead under the staleness gate, compute, push.
//! - [`checkpoint`]: trainer checkpoints (dense parameters, optimizer state, data position, step).
//! - [`export`]: writing exports, the servable models a job writes (docs/serving.md; the format is
//!   [`model::export`]).
//! - [`progressive`]: progressive validation, the training predictions' AUC and logloss over a sliding window.
//! - [`run`]: one job end to end and its [`run::Summary`].
//! - [`demo`]: `trainer demo`: data, local servers, training, summary.
//! - [`config`]: model, optimizer and cluster flags.
//! - [`metrics`]: metric names and descriptions.
//! - [`preprocess`]: `trainer preprocess`: text input into columnar shards.
//! - [`timing`]: where a pass's time goes (the loop's phases, the stage threads, CPU per process).
//! - [`helpers`]: the scheduling policy the helper threads take (`--helper-threads`).
//! - [`tensorboard`]: TensorBoard event files (`--tensorboard-dir`).
//! - [`cli`]: the binary's command line.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod cli;
pub mod config;
/// The Criteo reader, a crate of its own (the Python package reads Criteo rows too) re-exported under its old
/// path.
pub use ::criteo;
/// The dense model, its spec format, evaluation metrics and the export format: a crate of its own (serving
/// uses it without the trainer), re-exported under its old path.
pub use ::model;
pub mod demo;
pub mod export;
pub mod helpers;
pub mod metrics;
pub mod preprocess;
pub mod progressive;
pub mod run;
pub mod step;
pub mod tensorboard;
pub mod timing;
pub mod train;
