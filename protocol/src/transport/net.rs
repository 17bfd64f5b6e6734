//! The client side of the real transports behind [`Dialer`] and [`Connection`]: [`NetDialer`] and [`NetConn`],
//! each an enum over QUIC and TCP, so one client type serves both and a request dispatches with a `match`
//! (no boxed future per request).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::ProtocolError;
use crate::transport::{endpoint, stream, tcp, tls, Connection, Dialer, Transport};
use crate::wire::message::{Request, Response};

/// Opens QUIC or TCP connections to one server; built by [`Transport::dialer`].
pub struct NetDialer(DialerKind);

enum DialerKind {
    Quic(quinn::Endpoint),
    Tcp(tcp::Dialer),
}

impl NetDialer {
    /// A dialer for `peer` over `transport`, presenting the client certificate of `role` from `tls_dir`
    /// ([`tls::client_files`]).
    pub fn new(
        transport: Transport,
        peer: SocketAddr,
        tls_dir: &Path,
        role: crate::auth::Role,
    ) -> Result<NetDialer, ProtocolError> {
        Ok(NetDialer(match transport {
            Transport::Quic => {
                DialerKind::Quic(endpoint::client(peer, tls::client_config(tls_dir, role)?)?)
            }
            Transport::Tcp => {
                DialerKind::Tcp(tcp::Dialer::new(tls::rustls_client_config(tls_dir, role)?))
            }
        }))
    }
}

impl Dialer for NetDialer {
    type Conn = NetConn;

    async fn connect(
        &self,
        addr: SocketAddr,
        server_name: &str,
        max_frame: u64,
    ) -> Result<NetConn, ProtocolError> {
        match &self.0 {
            DialerKind::Quic(endpoint) => {
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
                Ok(NetConn(ConnKind::Quic { conn, max_frame }))
            }
            DialerKind::Tcp(d) => Ok(NetConn(ConnKind::Tcp(Arc::new(
                d.connect(addr, server_name, max_frame).await?,
            )))),
        }
    }

    /// QUIC: waits for the close handshakes; TCP: nothing to wait for.
    async fn wait_idle(&self) {
        if let DialerKind::Quic(endpoint) = &self.0 {
            endpoint.wait_idle().await;
        }
    }
}

/// One open QUIC or TCP connection to a server; cheap to clone.
#[derive(Clone)]
pub struct NetConn(ConnKind);

#[derive(Clone)]
enum ConnKind {
    Quic {
        conn: quinn::Connection,
        max_frame: u64,
    },
    Tcp(Arc<tcp::ClientConn>),
}

impl Connection for NetConn {
    /// QUIC: one bidirectional stream per request; TCP: one multiplexed stream id ([`tcp::ClientConn::call`]).
    async fn call(
        &self,
        server: SocketAddr,
        req: &Request,
        payload: &Bytes,
    ) -> Result<(Response, Bytes), ProtocolError> {
        match &self.0 {
            ConnKind::Quic { conn, max_frame } => {
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
            ConnKind::Tcp(c) => c.call(req, payload.clone()).await,
        }
    }

    fn close_reason(&self, server: SocketAddr) -> Option<ProtocolError> {
        match &self.0 {
            ConnKind::Quic { conn, .. } => {
                conn.close_reason().map(|source| ProtocolError::Connection {
                    server: server.to_string(),
                    source,
                })
            }
            ConnKind::Tcp(c) => c.close_reason(),
        }
    }

    /// QUIC: UDP datagrams received on the connection (an overloaded but live server still acknowledges
    /// packets). TCP: `None`; a killed server's kernel resets the connection at once, so there is nothing to
    /// tell apart.
    fn packets_received(&self) -> Option<u64> {
        match &self.0 {
            ConnKind::Quic { conn, .. } => Some(conn.stats().udp_rx.datagrams),
            ConnKind::Tcp(_) => None,
        }
    }

    fn close(&self) {
        match &self.0 {
            ConnKind::Quic { conn, .. } => conn.close(0u32.into(), b"bye"),
            ConnKind::Tcp(c) => c.close(),
        }
    }
}
