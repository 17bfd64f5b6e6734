//! The wire protocol between trainers and parameter servers.
//!
//! This crate knows how requests look on the wire and how they travel; it knows nothing about how rows are stored
//! or what model is trained (DESIGN.md, "Crates and their one job each").
//!
//! # Layout
//! - [`frame`]: sans-IO framing: a fixed 12-byte prefix, a bincode header, then raw bulk bytes.
//! - [`message`]: request and response headers ([`Request`], [`Response`]) and table specs.
//! - [`codec`]: row encodings (f32, f16, bf16, int8 with a per-row scale).
//! - [`ids`]: id sections: ascending ids, delta + varint coded.
//! - [`feedback`]: error feedback for lossy gradient pushes ([`feedback::ResidualStore`]).
//! - [`topk`]: top-k sparsification with error feedback for dense gradients.
//! - [`routing`]: stable id -> virtual shard -> server mapping ([`ShardMap`]).
//! - [`tls`]: a development CA and certificates (rcgen), rustls configs with mutual authentication.
//! - [`endpoint`]: QUIC endpoint set-up (socket buffers, transport tuning).
//! - [`gso`]: a quinn UDP socket that splits GSO batches larger than one UDP datagram.
//! - [`stream`]: reading and writing one frame on a QUIC stream.
//! - [`mux`]: sans-IO chunking of many frames over one byte stream (the TCP transport).
//! - [`tcp`]: TLS over TCP: client connections and the server's listener, requests multiplexed by id.
//! - [`transport`]: [`Transport`] (QUIC or TCP) and the connection type the client uses for either.
//! - [`client`]: [`PsClient`], the trainer's connection to every parameter server.
//! - [`error`]: [`ProtocolError`] and the typed [`ErrorCode`]s servers answer with.
#![warn(missing_docs)]

pub mod client;
pub mod codec;
pub mod endpoint;
pub mod error;
pub mod feedback;
pub mod frame;
pub mod gso;
pub mod ids;
pub mod message;
pub mod mux;
pub mod routing;
pub mod stream;
pub mod tcp;
pub mod tls;
pub mod topk;
pub mod transport;

pub use client::{PsClient, PsClientConfig, PulledState};
pub use codec::Encoding;
pub use error::{ErrorCode, ProtocolError};
pub use message::{InitSpec, OptimizerSpec, Request, Response, TableCount, TableSpec};
pub use routing::ShardMap;
pub use transport::Transport;

/// ALPN protocol name; bumped when the wire format changes incompatibly.
pub const ALPN: &[u8] = b"ps/1";
/// Protocol version carried in [`Request::Hello`].
/// Version 2: id sections delta + varint coded, [`Encoding::Int8`].
pub const PROTOCOL_VERSION: u32 = 2;
