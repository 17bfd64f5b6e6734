//! What travels: framing, request and response headers, id sections, and one file per request type holding
//! its payload layout, encode and decode together, used alike by the client, the server, the trainer and the
//! load generators.
//!
//! - [`frame`]: sans-IO framing: a fixed 12-byte prefix, a bincode header, then raw bulk bytes.
//! - [`message`]: request and response headers ([`message::Request`], [`message::Response`]), payload sizes.
//! - [`hello`]: `Hello`, the handshake ([`hello::request`], the one builder of it).
//! - [`ids`]: id sections: ascending ids, delta + varint coded.
//! - [`pull`]: `Pull` (and the id sections every pull and push starts with, [`pull::IdSections`]).
//! - [`pull_with_state`]: `PullWithState`, rows followed by their optimizer state.
//! - [`push`]: `Push`, id sections followed by gradient rows.
//! - [`prefetch`]: `Prefetch`, id sections of a batch ahead, pinned in the server's memory under a lease.
//! - [`reduce`]: `Reduce`, a vector summed over the trainers of a job, step by step (hybrid dense mode).
//! - [`dense`]: the dense table: a model's dense parameters as rows of one reserved table, pulled and pushed
//!   with `Pull` and `Push`.
//! - [`reshard`]: `GetShardMap`, `Reshard` and `MoveRows`, moving virtual shards between servers live.
//! - [`sync`]: `SyncDeltas` and `PublishDense`, the delta sync from training servers to serving, and the
//!   snapshot's `sync.json` ([`sync::SyncPoint`]).

pub mod dense;
pub mod frame;
pub mod hello;
pub mod ids;
pub mod message;
pub mod prefetch;
pub mod pull;
pub mod pull_with_state;
pub mod push;
pub mod reduce;
pub mod replicate;
pub mod reshard;
pub mod sync;
