//! Process plumbing that every binary of the project shares, and nothing else: it holds no domain logic
//! (DESIGN.md, "Crates and their one job each": `ops`).
//!
//! # Layout
//! - [`http`]: `/metrics` (Prometheus text format), `/healthz` and `/readyz` on a port of their own
//!   ([`http::serve`], [`http::Health`], [`http::install_recorder`]).
//! - [`buckets`]: [`buckets::LATENCY_BUCKETS`], the latency histogram buckets of every binary.
//! - [`logging`]: the `tracing` subscriber every binary installs ([`logging::init`]): `RUST_LOG`, stderr,
//!   colour only on a terminal.
//! - [`shutdown`]: the future that resolves on SIGTERM or SIGINT ([`shutdown::signal`]), passed into each
//!   binary's `run`.
#![warn(missing_docs)]

pub mod buckets;
pub mod http;
pub mod logging;
pub mod shutdown;
