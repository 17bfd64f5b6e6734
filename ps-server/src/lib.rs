//! One parameter-server process: serves a shard of every embedding table over QUIC, with metrics and health
//! over HTTP. It does not compute models (DESIGN.md, "Crates").
//!
//! # Layout
//! - [`config`]: the typed config (TOML + flags + env) and its validation.
//! - [`handler`]: request handling without sockets ([`handler::Shard::handle`]).
//! - [`server`]: the QUIC loop and graceful shutdown ([`server::run`]).
//! - [`checkpoint`]: the server side of a checkpoint request (a snapshot of every table).
//! - [`restore`]: `ps-server restore`, re-routing the snapshots of N servers onto shard I of M.
//! - [`plan`]: `ps-server plan`, memory, disk and servers for a table from the engine's row layout.
//! - [`writeback`]: dirty-row write-back to RocksDB on a timer, on request and at shutdown; memory-budget
//!   eviction.
//! - [`write_health`]: whether storage writes work; pushes are refused while they fail.
//! - [`load_limits`]: admission control of connections and in-flight bytes (overload).
//! - [`metrics`]: metric names and descriptions.
//! - [`cli`]: the binary's command line.
//! - `failpoints` (feature `failpoints`, test builds only): failpoints from `FAILPOINTS` and from a file a
//!   test rewrites while the server runs.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod cli;
pub mod config;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod handler;
pub mod load_limits;
pub mod metrics;
pub mod plan;
pub mod restore;
pub mod server;
pub mod write_health;
pub mod writeback;
