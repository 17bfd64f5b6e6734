//! How requests travel: the [`Dialer`] and [`Connection`] traits [`crate::PsClient`] is written against, and
//! their implementations.
//!
//! [`Transport`] is what users pick in configs and flags: QUIC (one stream per request) or TLS over TCP (requests
//! multiplexed by id on one connection, [`crate::transport::tcp`]). Both carry the same frames
//! ([`crate::wire::frame`]) under the same mutual-TLS certificates; [`Transport::dialer`] builds a [`NetDialer`]
//! for either. [`memory`] is a third implementation for tests: servers that are closures, with faults on
//! command, so the client's retries and liveness probes run under tokio's paused time.
//!
//! The client is generic over its dialer (`PsClient<D: Dialer = NetDialer>`) rather than holding a
//! `Box<dyn Dialer>`: a boxed trait object would have to box every request's future (an allocation per pull and
//! per push on the hot path), while a type parameter keeps the call monomorphic. Between QUIC and TCP,
//! [`NetDialer`] dispatches on an enum as before.
//!
//! - [`tls`]: a development CA and certificates (rcgen), rustls configs with mutual authentication.
//! - [`endpoint`]: QUIC endpoint set-up (socket buffers, transport tuning).
//! - [`gso`]: a quinn UDP socket that splits GSO batches larger than one UDP datagram.
//! - [`stream`]: reading and writing one frame on a QUIC stream.
//! - [`mux`]: sans-IO chunking of many frames over one byte stream (the TCP transport).
//! - [`tcp`]: TLS over TCP: client connections and the server's listener, requests multiplexed by id.
//! - [`net`]: [`NetDialer`] and [`NetConn`], the QUIC and TCP client sides behind the traits.
//! - [`memory`]: the in-memory transport for tests.

pub mod endpoint;
pub mod gso;
pub mod memory;
pub mod mux;
pub mod net;
pub mod stream;
pub mod tcp;
pub mod tls;

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;
use crate::wire::message::{Request, Response};

pub use net::{NetConn, NetDialer};

/// Which transport a client uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// QUIC over UDP (the default).
    #[default]
    Quic,
    /// TLS 1.3 over TCP, for networks that block UDP. Servers listen on the same port number over TCP.
    Tcp,
}

impl Transport {
    /// A dialer for the server at `peer` over this transport, presenting the client certificate of `role`
    /// from `tls_dir` (`ca.pem` and `<role>.pem`/`<role>.key`, or `client.pem`/`client.key`). QUIC binds one
    /// UDP endpoint per server, tuned for the path to `peer` ([`endpoint::PathKind`]).
    pub fn dialer(
        self,
        peer: SocketAddr,
        tls_dir: &Path,
        role: crate::auth::Role,
    ) -> Result<NetDialer, ProtocolError> {
        NetDialer::new(self, peer, tls_dir, role)
    }

    /// The transport's name as written in configs and flags.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Quic => "quic",
            Transport::Tcp => "tcp",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A transport name that is neither `quic` nor `tcp`.
#[derive(Debug, thiserror::Error)]
#[error("unknown transport {0:?}, expected quic or tcp")]
pub struct UnknownTransport(pub String);

impl FromStr for Transport {
    type Err = UnknownTransport;

    fn from_str(s: &str) -> Result<Transport, UnknownTransport> {
        match s {
            "quic" => Ok(Transport::Quic),
            "tcp" => Ok(Transport::Tcp),
            other => Err(UnknownTransport(other.to_owned())),
        }
    }
}

/// Opens connections to one server: what [`crate::PsClient`] needs from a transport besides the
/// [`Connection`]s themselves. Implemented by [`NetDialer`] (QUIC, TCP) and [`memory::MemoryDialer`].
///
/// The client keeps at most one connection per server open: it dials when it has none, or when the one it has
/// reports a [`Connection::close_reason`] or failed a request with a transient error.
pub trait Dialer: Send + Sync + 'static {
    /// An open connection to the server.
    type Conn: Connection;

    /// Connects to `addr` and completes the handshake, checking that the server's certificate names
    /// `server_name`; the connection refuses response frames over `max_frame` bytes. A failure is a transient
    /// [`ProtocolError`] (the client retries it) unless the server can never be reached this way.
    fn connect(
        &self,
        addr: SocketAddr,
        server_name: &str,
        max_frame: u64,
    ) -> impl Future<Output = Result<Self::Conn, ProtocolError>> + Send;

    /// Waits until every connection this dialer opened has finished closing (QUIC: the close handshake), so a
    /// process can exit without the server seeing a timeout instead of a close.
    fn wait_idle(&self) -> impl Future<Output = ()> + Send;
}

/// One open connection to a server; cloning it is cheap and shares the connection. Any number of requests may
/// be in flight on it at once.
pub trait Connection: Clone + Send + Sync + 'static {
    /// Sends one request frame (`req` then `payload`) and waits for its reply. `server` names the peer in
    /// errors. Dropping the future abandons the request (the client does so on timeouts).
    fn call(
        &self,
        server: SocketAddr,
        req: &Request,
        payload: &Bytes,
    ) -> impl Future<Output = Result<(Response, Bytes), ProtocolError>> + Send;

    /// Why the connection is closed (named for `server`), or `None` while it is open.
    fn close_reason(&self, server: SocketAddr) -> Option<ProtocolError>;

    /// Packets of any kind (acknowledgements included) received from the peer so far, or `None` if the
    /// transport has no such count. The client's liveness probe (see [`crate::client::PROBE_TIMEOUT`]) treats a
    /// count that moved while a probe went unanswered as a live but busy peer, and an unchanged or absent count
    /// as a dead connection.
    fn packets_received(&self) -> Option<u64>;

    /// Closes the connection; requests still in flight on it fail.
    fn close(&self);
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_a_bad_name_is_named() {
        for t in [Transport::Quic, Transport::Tcp] {
            assert_eq!(t.name().parse::<Transport>().unwrap(), t);
        }
        let err = "udp".parse::<Transport>().unwrap_err().to_string();
        assert!(err.contains("\"udp\""), "{err}");
    }
}
