//! The wire protocol between trainers and parameter servers.
//!
//! This crate knows how requests look on the wire and how they travel; it knows nothing about how rows are stored
//! or what model is trained (DESIGN.md, "Crates and their one job each").
//!
//! # Layout
//! - [`wire`]: what travels: framing, headers, id sections, and one file per request type
//!   ([`wire::message::pull`], [`wire::message::pull_with_state`], [`wire::message::push`], [`wire::message::sync`] for serving's delta sync) with
//!   its layout, encode and decode.
//! - [`compression`]: row encodings ([`compression::codec`]: f32, f16, bf16, int8 with a per-row scale),
//!   top-k sparsification, and the sender's error feedback ([`compression::feedback`]).
//! - [`plan`]: [`plan::Plan`], the batch planner of the trainer and of serving: per table the unique ids and
//!   the inverse index, grouped by server in wire order, the pull and push payloads, scatter of replies,
//!   gather and pooling into the model's layout, and the reduction of gradients per unique id.
//! - [`transport`]: how it travels: the [`transport::Dialer`] and [`transport::Connection`] traits the client
//!   is written against; [`Transport`] (QUIC or TCP, picked in configs) and the [`transport::NetDialer`] it
//!   builds; TLS, QUIC endpoints, framing on streams; [`transport::memory`], an in-memory transport with
//!   injected faults for tests under simulated time.
//! - [`cluster`]: how a cluster's shards and their replicas are written in `--ps` flags.
//! - [`routing`]: stable id -> virtual shard -> server mapping ([`ShardMap`]).
//! - [`client`]: [`PsClient`], the trainer's connection to every parameter server: retries with backoff,
//!   liveness probes of overdue requests; also serving's sync client ([`PsClient::sync_deltas`],
//!   [`PsClient::publish_dense`]), which registers no table.
//! - [`keyed`]: pulls and pushes of one table's ids in the caller's order (dedup, route, scatter), for
//!   callers without a batch plan of their own (the Python package).
//! - [`error`]: [`ProtocolError`] and the typed [`ErrorCode`]s servers answer with.
//! - [`auth`]: the [`Role`] a client certificate names and what each role may send ([`Access`]).
//!
//! A table travels as its [`TableConfig`] (with [`OptimizerConfig`], [`InitConfig`] and [`AdmissionConfig`]),
//! the plain type defined beside the tables it describes (`embedding::config`) and re-exported here: the same
//! type as in config files and the store's metadata, carried as its JSON text ([`wire::tables`]). Nothing else of the
//! storage crate is visible from the wire.
#![warn(missing_docs)]

pub mod auth;
pub mod client;
pub mod cluster;
pub mod compression;
pub mod error;
pub mod keyed;
pub mod metrics;
pub mod plan;
pub mod routing;
pub mod transport;
pub mod wire;

pub use auth::{Access, Role};
pub use client::{PsClient, PsClientConfig, PulledState};
pub use compression::codec::Encoding;
pub use error::{ErrorCode, ProtocolError};
pub use routing::{MapError, ShardMap};
pub use transport::Transport;
pub use wire::layout::TableCount;
pub use wire::message::prefetch::LeaseStats;
pub use wire::message::{
    AdmissionConfig, EvictionConfig, EvictionPolicy, InitConfig, InitKind, OptimizerConfig,
    Request, RequestKind, Response, RowPrecision, ScoreMode, TableConfig,
};

/// ALPN protocol name; bumped when the wire format changes incompatibly.
pub const ALPN: &[u8] = b"ps/1";
/// Protocol version carried in [`Request::Hello`].
/// Version 2: id sections delta + varint coded, [`Encoding::Int8`]. Version 3: replicas (`Hello` says which,
/// `Replicate`, `Join`, `Promote`). Version 4: live resharding (`GetShardMap`, `Reshard`, `MoveRows`; a
/// standby server answers `Hello` with 0 shards). Version 5: roles (`ErrorCode::Forbidden`), `PublishDense`
/// names its job, `Promote` may force a cold start, checkpoints go under the server's checkpoint root.
/// Version 6: tables travel as [`TableConfig`] (every optimizer, weight decay and clipping as fields,
/// admission and TTL), each as its JSON text ([`wire::tables`]), instead of the wire-only `TableSpec`.
/// Version 7: pushes carry a [`wire::message::push::PushId`] and are applied once per id; `Replicate` carries
/// the answers of the pushes whose rows it streams; `ErrorCode::InProgress`. Version 8: `Push` carries an
/// `lr_scale` (a trainer's learning-rate schedule on tables whose optimizer keeps state). Version 9:
/// `Checkpoint` says whether the snapshot also gets its tables as a SafeTensors file (`tensors`, for exports).
/// Version 10: a `Deltas` answer carries deletions (ids whose rows are gone: expired, capped, never admitted)
/// beside its rows ([`wire::message::sync::DeltasHeader::deleted`]); `Checkpoint` may prune the snapshot
/// (`prune`: rows an export leaves out). Version 11: `Score` (scores of ids in tables that evict by score),
/// and a prune's `min_score`.
pub const PROTOCOL_VERSION: u32 = 11;
