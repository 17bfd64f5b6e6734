//! The wire protocol between trainers and parameter servers.
//!
//! This crate knows how requests look on the wire and how they travel; it knows nothing about how rows are stored
//! or what model is trained (DESIGN.md, "Crates and their one job each").
//!
//! # Layout
//! - [`frame`]: sans-IO framing: a fixed 12-byte prefix, a bincode header, then raw bulk bytes.
//! - [`message`]: request and response headers ([`Request`], [`Response`]) and table specs.
//! - [`codec`]: row encodings (f32, f16, bf16) as raw little-endian bytes.
//! - [`routing`]: stable id -> virtual shard -> server mapping ([`ShardMap`]).
//! - [`tls`]: a development CA and certificates (rcgen), rustls configs with mutual authentication.
//! - [`endpoint`]: QUIC endpoint set-up (socket buffers, transport tuning).
//! - [`stream`]: reading and writing one frame on a QUIC stream.
//! - [`client`]: [`PsClient`], the trainer's connection to every parameter server.
//! - [`error`]: [`ProtocolError`] and the typed [`ErrorCode`]s servers answer with.
#![warn(missing_docs)]

pub mod client;
pub mod codec;
pub mod endpoint;
pub mod error;
pub mod frame;
pub mod message;
pub mod routing;
pub mod stream;
pub mod tls;

pub use client::{PsClient, PsClientConfig};
pub use codec::Encoding;
pub use error::{ErrorCode, ProtocolError};
pub use message::{InitSpec, OptimizerSpec, Request, Response, TableCount, TableSpec};
pub use routing::ShardMap;

/// ALPN protocol name; bumped when the wire format changes incompatibly.
pub const ALPN: &[u8] = b"ps/1";
/// Protocol version carried in [`Request::Hello`].
pub const PROTOCOL_VERSION: u32 = 1;
