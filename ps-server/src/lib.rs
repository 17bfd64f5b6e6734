//! One parameter-server process: serves a shard of every embedding table over QUIC, with metrics and health
//! over HTTP. It does not compute models (DESIGN.md, "Crates").
//!
//! # Layout
//! - [`config`]: the typed config (TOML + flags + env) and its validation.
//! - [`handler`]: request handling without sockets ([`handler::Shard::handle`]).
//! - [`server`]: the QUIC loop and graceful shutdown ([`server::run`]).
//! - [`writeback`]: dirty-row write-back to RocksDB on a timer, on request and at shutdown; memory-budget
//!   eviction.
//! - [`local`]: local server processes on loopback ([`local::LocalCluster`]) for demos, benches and tests.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz` (also used by the trainer).
//! - [`metrics`]: metric names and descriptions.
//! - [`cli`]: the binary's command line.
#![warn(missing_docs)]

pub mod cli;
pub mod config;
pub mod handler;
pub mod http;
pub mod local;
pub mod metrics;
pub mod server;
pub mod writeback;
