//! What travels: framing, id sections, payload layouts, and the messages (one file per request type holding
//! its header, payload layout, builder and decoder together), used alike by the client, the server, the trainer
//! and the load generators. Dependencies point down this list: a message knows layouts, ids and frames, never
//! the other way.
//!
//! - [`message`]: the request and response enums ([`message::Request`], [`message::Response`],
//!   [`message::RequestKind`]) and, beneath them, one module per request: [`message::hello`],
//!   [`message::pull`], [`message::pull_with_state`], [`message::push`], [`message::prefetch`],
//!   [`message::reduce`], [`message::replicate`], [`message::reshard`], [`message::sync`].
//! - [`dense`]: the dense table: a model's dense parameters as rows of one reserved table, pulled and pushed
//!   with `Pull` and `Push`.
//! - [`layout`]: a table's share of a payload ([`layout::TableCount`]) and the sizes it implies.
//! - [`tables`]: table configs in headers, as their JSON text.
//! - [`ids`]: id sections: ascending ids, delta + varint coded.
//! - [`frame`]: sans-IO framing: a fixed 12-byte prefix, a bincode header, then raw bulk bytes.

pub mod dense;
pub mod frame;
pub mod ids;
pub mod layout;
pub mod message;
pub mod tables;
