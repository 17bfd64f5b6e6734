//! The trainer: reads Criteo-format click logs, computes DLRM's dense layers on CPU, and pulls and pushes
//! embedding rows from the parameter servers.
//!
//! # Layout
//! - [`criteo`]: Criteo TSV parsing, feature-id hashing, batched reading on its own thread.
//! - [`model`]: the DLRM dense model (MLPs, dot interaction, loss) and its optimizers.
//! - [`eval`]: exact AUC and logloss.

pub mod criteo;
pub mod eval;
pub mod model;
