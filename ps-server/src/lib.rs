//! One parameter-server process: serves a shard of every embedding table over QUIC, with metrics and health
//! over HTTP. It does not compute models (DESIGN.md, "Crates").
//!
//! # Layout
//! Listed bottom-up: each module uses only modules listed above it (`use crate::X` never goes both ways).
//! - [`metrics`]: metric names and descriptions.
//! - [`config`]: the typed config (TOML + flags + env) and its validation.
//! - [`load_limits`]: admission control of connections and in-flight bytes (overload).
//! - [`write_health`]: whether storage writes work; pushes are refused while they fail.
//! - [`writeback`]: dirty-row write-back to RocksDB, memory-budget eviction and TTL expiry, each an engine call
//!   with its metrics.
//! - [`sync`]: the delta sync to serving: changed rows recorded by pushes, cut into deltas, the dense
//!   parameters published (answered by `handler`, waited for by `server`).
//! - [`reduce`]: the hybrid dense mode's sums of the trainers' contributions ([`reduce::Reducer`]), bounded.
//! - [`checkpoint`]: the server side of a checkpoint request (a snapshot of every table).
//! - [`restore`]: `ps-server restore`, re-routing the snapshots of N servers onto shard I of M.
//! - [`plan`]: `ps-server plan`, memory, disk and servers for a table from the engine's row layout.
//! - [`reply`]: what a request is answered with ([`reply::Reply`]) or refused with ([`reply::Refusal`]).
//! - [`shard`]: [`shard::Shard`], one server's shard (engine, place in the shard map and among its replicas,
//!   durability, write health) with private fields; each mechanism acting on it is a child module owning its
//!   `impl Shard`: [`shard::storage`] (write-back, synced writes, checkpoints, eviction), [`shard::handler`]
//!   (request handling without sockets or clock, [`shard::Shard::handle`], given `now`), [`shard::replica`]
//!   (replication and failover) and [`shard::reshard`] (live resharding).
//! - [`server`]: the QUIC/TCP loop, the background timers and graceful shutdown ([`server::run`]); the one
//!   reader of the wall clock for the handler and the timers ([`server::unix_secs`]).
//! - [`cli`]: the binary's command line (uses `server`, `restore`, `plan`).
//! - `testing` (feature `testing`, tests only): [`shard::Shard`]s behind the in-memory transport, for tests
//!   of clients and of the trainer's loop without sockets.
//! - `failpoints` (feature `failpoints`, test builds only): failpoints from `FAILPOINTS` and from a file a
//!   test rewrites while the server runs.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod cli;
pub mod config;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod load_limits;
pub mod metrics;
pub mod plan;
pub mod reduce;
pub mod reply;
pub mod restore;
pub mod server;
pub mod shard;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod write_health;
pub mod writeback;
