//! The transport a client reaches servers over, behind one interface: QUIC (one stream per request) or TLS over
//! TCP (requests multiplexed by id on one connection, [`crate::transport::tcp`]). Both carry the same frames
//! ([`crate::wire::frame`]) under the same mutual-TLS certificates; [`crate::PsClient`] does not care which.
//!
//! - [`tls`]: a development CA and certificates (rcgen), rustls configs with mutual authentication.
//! - [`endpoint`]: QUIC endpoint set-up (socket buffers, transport tuning).
//! - [`gso`]: a quinn UDP socket that splits GSO batches larger than one UDP datagram.
//! - [`stream`]: reading and writing one frame on a QUIC stream.
//! - [`mux`]: sans-IO chunking of many frames over one byte stream (the TCP transport).
//! - [`tcp`]: TLS over TCP: client connections and the server's listener, requests multiplexed by id.

pub mod endpoint;
pub mod gso;
pub mod mux;
pub mod stream;
pub mod tcp;
pub mod tls;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;
use crate::wire::message::{Request, Response};

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

/// Opens connections to one server.
pub(crate) enum Dialer {
    Quic(quinn::Endpoint),
    Tcp(tcp::Dialer),
}

impl Dialer {
    /// A dialer for `peer` over `transport` with the client certificate in `tls_dir`.
    pub(crate) fn new(
        transport: Transport,
        peer: SocketAddr,
        tls_dir: &Path,
    ) -> Result<Dialer, ProtocolError> {
        Ok(match transport {
            Transport::Quic => Dialer::Quic(crate::transport::endpoint::client(
                peer,
                tls::client_config(tls_dir)?,
            )?),
            Transport::Tcp => Dialer::Tcp(tcp::Dialer::new(tls::rustls_client_config(tls_dir)?)),
        })
    }

    /// Connects and completes the handshake.
    pub(crate) async fn connect(
        &self,
        addr: SocketAddr,
        server_name: &str,
        max_frame: u64,
    ) -> Result<Conn, ProtocolError> {
        match self {
            Dialer::Quic(endpoint) => {
                let connecting =
                    endpoint
                        .connect(addr, server_name)
                        .map_err(|e| ProtocolError::Connect {
                            server: addr.to_string(),
                            message: e.to_string(),
                        })?;
                let conn = connecting
                    .await
                    .map_err(|source| ProtocolError::Connection {
                        server: addr.to_string(),
                        source,
                    })?;
                Ok(Conn::Quic { conn, max_frame })
            }
            Dialer::Tcp(d) => Ok(Conn::Tcp(Arc::new(
                d.connect(addr, server_name, max_frame).await?,
            ))),
        }
    }

    /// Waits until every connection is closed (QUIC: the close handshake; TCP: nothing to wait for).
    pub(crate) async fn wait_idle(&self) {
        if let Dialer::Quic(endpoint) = self {
            endpoint.wait_idle().await;
        }
    }
}

/// One open connection to a server; cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Quic {
        conn: quinn::Connection,
        max_frame: u64,
    },
    Tcp(Arc<tcp::ClientConn>),
}

impl Conn {
    /// Why the connection is closed, if it is.
    pub(crate) fn close_reason(&self, server: SocketAddr) -> Option<ProtocolError> {
        match self {
            Conn::Quic { conn, .. } => {
                conn.close_reason().map(|source| ProtocolError::Connection {
                    server: server.to_string(),
                    source,
                })
            }
            Conn::Tcp(c) => c.close_reason(),
        }
    }

    /// Sends one request and reads its response.
    pub(crate) async fn call(
        &self,
        server: SocketAddr,
        req: &Request,
        payload: &Bytes,
    ) -> Result<(Response, Bytes), ProtocolError> {
        match self {
            Conn::Quic { conn, max_frame } => {
                let (mut send, mut recv) =
                    conn.open_bi()
                        .await
                        .map_err(|source| ProtocolError::Connection {
                            server: server.to_string(),
                            source,
                        })?;
                let written = stream::write_frame(&mut send, req, payload.clone()).await;
                // A server that refuses a request early (e.g. an oversized frame) answers and stops reading,
                // so a failed write may still have a response waiting.
                match stream::read_frame::<Response>(&mut recv, *max_frame).await {
                    Ok(reply) => Ok(reply),
                    Err(read_err) => Err(written.err().unwrap_or(read_err)),
                }
            }
            Conn::Tcp(c) => c.call(req, payload.clone()).await,
        }
    }

    /// Closes the connection.
    pub(crate) fn close(&self) {
        match self {
            Conn::Quic { conn, .. } => conn.close(0u32.into(), b"bye"),
            Conn::Tcp(c) => c.close(),
        }
    }
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
