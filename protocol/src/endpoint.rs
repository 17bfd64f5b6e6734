//! QUIC endpoint set-up: UDP socket buffers and transport tuning.
//!
//! Default UDP socket buffers drop packets under bursts of 64 KiB replies (a 30 ms p99 measured on loopback,
//! DESIGN.md "QUIC"), so sockets get a few MiB each way. Flow-control windows are sized for data-centre
//! bandwidth-delay products and for many requests in flight on one connection.
//!
//! Packet size stays at quinn's defaults (1200 bytes, MTU discovery up to 1452): raising the initial MTU of a
//! loopback client to 16 KiB or 64 KiB, with endpoints accepting 65527-byte datagrams, made every connection
//! time out in the handshake on this machine's quinn 0.11 (no kernel UDP drops were counted), so it is left
//! for later (BENCHMARKS.md, "QUIC vs TCP").

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ProtocolError;

/// Socket send and receive buffer size requested from the kernel.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// Transport settings shared by servers and clients.
pub fn transport_config() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(4096u32.into())
        .max_concurrent_uni_streams(0u32.into())
        .stream_receive_window((32u32 << 20).into())
        .receive_window((256u32 << 20).into())
        .send_window(256 << 20)
        .keep_alive_interval(Some(Duration::from_secs(5)))
        .max_idle_timeout(Some(
            Duration::from_secs(30)
                .try_into()
                .expect("30 s is a valid idle timeout"),
        ));
    t
}

fn udp_socket(addr: SocketAddr) -> Result<std::net::UdpSocket, ProtocolError> {
    let io = |context: String| move |source| ProtocolError::Io { context, source };
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))
        .map_err(io(format!("create UDP socket for {addr}")))?;
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(false);
    }
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    socket
        .bind(&addr.into())
        .map_err(io(format!("bind UDP {addr}")))?;
    Ok(socket.into())
}

/// A server endpoint bound to `addr` (port 0 picks a free port), with a random stateless-reset key.
pub fn server(
    addr: SocketAddr,
    config: quinn::ServerConfig,
) -> Result<quinn::Endpoint, ProtocolError> {
    server_with_reset_secret(addr, config, None)
}

/// A server endpoint whose QUIC stateless-reset key is derived from `reset_secret` (random when `None`).
///
/// With a secret that survives a restart (the server's private key and address), a restarted server answers
/// packets of connections it had before the crash with a stateless reset, which the client recognizes at once
/// and reconnects; with a random key those packets are dropped and the client only notices at its idle timeout.
pub fn server_with_reset_secret(
    addr: SocketAddr,
    mut config: quinn::ServerConfig,
    reset_secret: Option<&[u8]>,
) -> Result<quinn::Endpoint, ProtocolError> {
    config.transport_config(Arc::new(transport_config()));
    let socket = udp_socket(addr)?;
    let endpoint_config = match reset_secret {
        Some(secret) => {
            // HMAC-SHA256 keyed with a digest of the secret, so the secret itself never becomes a key.
            let digest = ring::digest::digest(&ring::digest::SHA256, secret);
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, digest.as_ref());
            quinn::EndpointConfig::new(Arc::new(key))
        }
        None => quinn::EndpointConfig::default(),
    };
    quinn::Endpoint::new(
        endpoint_config,
        Some(config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|source| ProtocolError::Io {
        context: format!("start QUIC endpoint on {addr}"),
        source,
    })
}

/// A client endpoint on an ephemeral port of the family of `peer`.
pub fn client(
    peer: SocketAddr,
    mut config: quinn::ClientConfig,
) -> Result<quinn::Endpoint, ProtocolError> {
    config.transport_config(Arc::new(transport_config()));
    let bind: SocketAddr = if peer.is_ipv6() {
        "[::]:0".parse().expect("valid")
    } else {
        "0.0.0.0:0".parse().expect("valid")
    };
    let socket = udp_socket(bind)?;
    let mut endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|source| ProtocolError::Io {
        context: "start QUIC client endpoint".into(),
        source,
    })?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}
