//! Benchmarks and synthetic data for the parameter-server training system. Nothing here is needed at run
//! time (DESIGN.md).
//!
//! # Layout
//!
//! - [`gen`]: the synthetic Criteo-format generator behind `gen-criteo`: [`gen::Generator`] writes rows
//!   labelled by a planted [`gen::Teacher`], through [`gen::Sink`]s (plain or parallel gzip).
//!   - [`gen::schema`]: columns, vocabulary sizes, integer shapes and missingness; [`gen::Row`].
//!   - [`gen::teacher`]: the planted click model and its calibration (term scales, bias).
//!   - [`gen::zipf`]: O(1) Zipf sampling (alias table for small vocabularies, rejection-inversion above).
//!   - [`gen::format`]: hand-written line and probability formatting.
//!   - [`gen::sink`]: plain and single-member parallel gzip output.
//!   - [`gen::rng`]: hashes and the seeded generator.
//! - [`audit`]: `ps-audit`, counting acknowledged updates against the servers' counters (crash tests).
//! - [`bins`]: the workspace's binaries (`trainer`, `ps-server`, ...) for the end-to-end tests in `tests/`,
//!   which need several of them.
//! - [`load`]: `ps-bench`, the parameter-server load generator (QUIC against a cluster, or an in-process
//!   engine), with its workload, latency percentiles and report.
//! - [`serve_load`]: `serve-bench`, the `ps-serve` load generator (keep-alive HTTP/1.1 clients sending test rows
//!   to `POST /v1/predict`) and its `--auc` pass scoring the answers against the labels.
#![warn(missing_docs)]

pub mod audit;
pub mod bins;
pub mod freshness;
pub mod gen;
pub mod load;
pub mod serve_load;
