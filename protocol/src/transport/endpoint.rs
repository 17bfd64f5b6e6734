//! QUIC endpoint set-up: UDP socket buffers and transport tuning.
//!
//! Default UDP socket buffers drop packets under bursts of 64 KiB replies (a 30 ms p99 measured on loopback,
//! DESIGN.md "QUIC"), so sockets get a few MiB each way. Flow-control windows are sized for data-centre
//! bandwidth-delay products and for many requests in flight on one connection.
//!
//! Packet size ([`tune_path`]) depends on the path ([`PathKind`]): on loopback (interface MTU 65,536) packets of
//! [`LOOPBACK_MTU`] bytes from the first flight, which cuts quinn's per-packet work (crypto, framing, acks,
//! one buffer per received packet) by an order of magnitude against 1,452-byte packets; on other networks
//! quinn's safe 1,200 bytes at first, raised by MTU discovery up to [`NETWORK_MAX_MTU`] (jumbo frames), so a
//! path that carries less only loses probes. Two things made larger packets stall connections in quinn 0.11,
//! and both are handled here: the congestion window starts at 14,720 bytes whatever the MTU, so a first
//! packet of 16 KiB never fitted ([`tune_path`] scales the initial window with the MTU); and a GSO batch of
//! 10 such packets exceeds one UDP datagram and was dropped silently (`EMSGSIZE`), which [`crate::transport::gso`]
//! avoids by splitting batches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ProtocolError;
use crate::transport::gso::SplitGso;

/// Socket send and receive buffer size requested from the kernel.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// UDP payload bytes per packet on loopback, from the handshake on.
pub const LOOPBACK_MTU: u16 = 16_384;

/// Upper bound of MTU discovery on other paths: a 9,000-byte jumbo frame minus the IPv6 and UDP headers.
pub const NETWORK_MAX_MTU: u16 = 8_952;

/// Largest UDP payload an endpoint accepts (advertised to peers, who send no larger packets).
pub const MAX_UDP_PAYLOAD: u16 = if LOOPBACK_MTU > NETWORK_MAX_MTU {
    LOOPBACK_MTU
} else {
    NETWORK_MAX_MTU
};

// Endpoints accept every packet size used, and a packet fits one `sendmsg` (crate::transport::gso).
const _: () = assert!(LOOPBACK_MTU <= MAX_UDP_PAYLOAD && NETWORK_MAX_MTU <= MAX_UDP_PAYLOAD);
const _: () = assert!(MAX_UDP_PAYLOAD as usize <= crate::transport::gso::MAX_BATCH_BYTES);

/// Initial congestion window, in packets of the initial MTU (quinn's default is 14,720 bytes, about 10 packets
/// of 1,452 bytes, which is less than one loopback packet).
pub const INITIAL_WINDOW_PACKETS: u64 = 64;

/// Which kind of path a QUIC endpoint talks over; decides the packet size ([`tune_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// The loopback interface (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104): large packets from the start.
    Loopback,
    /// Any other network: 1,200-byte packets at first, raised by MTU discovery.
    Network,
}

impl PathKind {
    /// The kind of path to (client) or from (server bound to) `addr`. A server bound to a wildcard address
    /// is on a network: its clients may be anywhere.
    pub fn of(addr: SocketAddr) -> PathKind {
        if addr.ip().to_canonical().is_loopback() {
            PathKind::Loopback
        } else {
            PathKind::Network
        }
    }
}

/// Sets packet size, MTU discovery and the initial congestion window of `t` for a path of `kind`.
///
/// On loopback the packet size is fixed (minimum = initial = maximum): a loss burst under load cannot be taken
/// for a black hole and shrink packets to 1,200 bytes for the 60 s black-hole cool-down.
pub fn tune_path(t: &mut quinn::TransportConfig, kind: PathKind) {
    let (min_mtu, initial_mtu, max_mtu) = match kind {
        PathKind::Loopback => (LOOPBACK_MTU, LOOPBACK_MTU, LOOPBACK_MTU),
        PathKind::Network => (1200, 1200, NETWORK_MAX_MTU),
    };
    let mut discovery = quinn::MtuDiscoveryConfig::default();
    discovery.upper_bound(max_mtu);
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window(INITIAL_WINDOW_PACKETS * u64::from(initial_mtu));
    t.min_mtu(min_mtu)
        .initial_mtu(initial_mtu)
        .mtu_discovery_config(Some(discovery))
        .congestion_controller_factory(Arc::new(cubic));
}

/// Transport settings shared by servers and clients; [`tune_path`] adds the packet size of a path.
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

fn endpoint_config(mut config: quinn::EndpointConfig) -> quinn::EndpointConfig {
    config
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .expect("MAX_UDP_PAYLOAD is within QUIC's 1200..=65527");
    config
}

/// A quinn endpoint on `socket` whose oversized GSO batches are split ([`crate::transport::gso`]).
fn endpoint(
    config: quinn::EndpointConfig,
    server: Option<quinn::ServerConfig>,
    socket: std::net::UdpSocket,
) -> std::io::Result<quinn::Endpoint> {
    let runtime = Arc::new(quinn::TokioRuntime);
    let socket = quinn::Runtime::wrap_udp_socket(&*runtime, socket)?;
    quinn::Endpoint::new_with_abstract_socket(
        endpoint_config(config),
        server,
        Arc::new(SplitGso::new(socket)),
        runtime,
    )
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
    let mut transport = transport_config();
    tune_path(&mut transport, PathKind::of(addr));
    config.transport_config(Arc::new(transport));
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
    endpoint(endpoint_config, Some(config), socket).map_err(|source| ProtocolError::Io {
        context: format!("start QUIC endpoint on {addr}"),
        source,
    })
}

/// A client endpoint on an ephemeral port of the family of `peer`.
pub fn client(
    peer: SocketAddr,
    mut config: quinn::ClientConfig,
) -> Result<quinn::Endpoint, ProtocolError> {
    let mut transport = transport_config();
    tune_path(&mut transport, PathKind::of(peer));
    config.transport_config(Arc::new(transport));
    let bind: SocketAddr = if peer.is_ipv6() {
        "[::]:0".parse().expect("valid")
    } else {
        "0.0.0.0:0".parse().expect("valid")
    };
    let socket = udp_socket(bind)?;
    let mut endpoint =
        endpoint(quinn::EndpointConfig::default(), None, socket).map_err(|source| {
            ProtocolError::Io {
                context: "start QUIC client endpoint".into(),
                source,
            }
        })?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_recognized_in_every_spelling() {
        for a in [
            "127.0.0.1:1",
            "127.3.2.1:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert_eq!(PathKind::of(a.parse().unwrap()), PathKind::Loopback, "{a}");
        }
        for a in ["0.0.0.0:1", "10.0.0.7:1", "[::]:1", "[fd00::1]:1"] {
            assert_eq!(PathKind::of(a.parse().unwrap()), PathKind::Network, "{a}");
        }
    }
}
