//! The transports' endpoints: TLS material, the QUIC endpoint (with its per-connection load limits) and the TCP
//! listener on the same port, bound once at start and closed in steps at shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use protocol::transport::tcp;

use crate::config::{ServerConfig, ServerTransport};
use crate::load_limits;

/// The bound QUIC endpoint and TCP listener (either may be off, [`ServerTransport`]).
///
/// Call order: [`Endpoints::bind`], accept ([`accept_quic`], [`accept_tcp`]) until shutdown, then
/// [`Endpoints::stop_accepting`], drain, [`Endpoints::close`], [`Endpoints::wait_idle`].
pub(super) struct Endpoints {
    /// The QUIC endpoint, if QUIC is served.
    pub(super) quic: Option<quinn::Endpoint>,
    /// The TCP listener, if TCP is served.
    pub(super) tcp: Option<tcp::Listener>,
    /// The QUIC (UDP) address.
    pub(super) quic_addr: Option<SocketAddr>,
    /// The TCP address.
    pub(super) tcp_addr: Option<SocketAddr>,
}

impl Endpoints {
    /// Loads the TLS material and binds the transports of `cfg`, with the per-connection limits of admission
    /// control ([`crate::load_limits`]) on the QUIC endpoint.
    pub(super) fn bind(cfg: &ServerConfig) -> anyhow::Result<Endpoints> {
        if cfg.insecure_dev {
            tracing::warn!(
                "--insecure-dev: clients are NOT authenticated (any client may read and write every table); \
                 never use this outside development"
            );
        }
        let tls = protocol::transport::tls::rustls_server_config(&cfg.tls_dir, !cfg.insecure_dev)
            .context("load TLS material")?;
        let mut limited =
            protocol::transport::tls::quic_server_config(tls.clone()).context("QUIC TLS config")?;
        let secret = reset_secret(cfg);
        let (quic, tcp) = bind(cfg.listen, cfg.transport, tls, secret.as_deref())?;
        // Per-connection limits of admission control (crate::load_limits) on top of the shared transport
        // tuning.
        let mut transport = load_limits::server_transport(
            cfg.max_streams_per_connection,
            cfg.connection_window_bytes,
        );
        protocol::transport::endpoint::tune_path(
            &mut transport,
            protocol::transport::endpoint::PathKind::of(cfg.listen),
        );
        limited.transport_config(Arc::new(transport));
        if let Some(e) = &quic {
            e.set_server_config(Some(limited));
        }
        let quic_addr = quic
            .as_ref()
            .map(|e| e.local_addr().context("QUIC local address"))
            .transpose()?;
        let tcp_addr = tcp
            .as_ref()
            .map(|l| l.local_addr().context("TCP local address"))
            .transpose()?;
        Ok(Endpoints {
            quic,
            tcp,
            quic_addr,
            tcp_addr,
        })
    }

    /// Refuses new connections: closes the TCP listener and takes the QUIC endpoint's server config away
    /// (connections already open keep working).
    pub(super) fn stop_accepting(&mut self) {
        self.tcp = None;
        if let Some(endpoint) = &self.quic {
            endpoint.set_server_config(None);
        }
    }

    /// Closes every QUIC connection (after the drain).
    pub(super) fn close(&self) {
        if let Some(endpoint) = &self.quic {
            endpoint.close(0u32.into(), b"server shutting down");
        }
    }

    /// Waits (at most a second) until the QUIC endpoint has told its peers that it closed.
    pub(super) async fn wait_idle(&self) {
        if let Some(endpoint) = &self.quic {
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
    }
}

/// The stateless-reset secret: stable across restarts of this server (same key, same address, same shard), so
/// clients of the previous process get a stateless reset instead of waiting for their idle timeout
/// (protocol::transport::endpoint). `None` without a readable server key.
fn reset_secret(cfg: &ServerConfig) -> Option<Vec<u8>> {
    std::fs::read(
        cfg.tls_dir
            .join(protocol::transport::tls::files::SERVER_KEY),
    )
    .ok()
    .map(|mut key| {
        key.extend_from_slice(format!("{} {}", cfg.listen, cfg.shard_index).as_bytes());
        key
    })
}

/// A connection accepted on either transport.
pub(super) enum Accepted {
    /// A QUIC connection attempt, not yet handshaken.
    Quic(Box<quinn::Incoming>),
    /// A TCP connection whose TLS handshake is still to finish.
    Tcp(tcp::Handshake),
}

/// The next QUIC connection attempt; never completes without a QUIC endpoint. `None` once the endpoint is
/// closed.
pub(super) async fn accept_quic(endpoint: Option<&quinn::Endpoint>) -> Option<quinn::Incoming> {
    match endpoint {
        Some(e) => e.accept().await,
        None => std::future::pending().await,
    }
}

/// The next TCP connection; never completes without a TCP listener.
pub(super) async fn accept_tcp(
    listener: Option<&tcp::Listener>,
) -> std::io::Result<tcp::Handshake> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Binds the transports `transport` asks for on `addr`: QUIC on UDP, TCP on the same port number. With port 0,
/// the TCP port is the one the kernel gave QUIC, retried with a fresh port if TCP has it taken.
fn bind(
    addr: SocketAddr,
    transport: ServerTransport,
    tls: quinn::rustls::ServerConfig,
    reset_secret: Option<&[u8]>,
) -> anyhow::Result<(Option<quinn::Endpoint>, Option<tcp::Listener>)> {
    let quic_tls =
        protocol::transport::tls::quic_server_config(tls.clone()).context("QUIC TLS config")?;
    for attempt in 0.. {
        let endpoint = if transport.quic() {
            Some(
                protocol::transport::endpoint::server_with_reset_secret(
                    addr,
                    quic_tls.clone(),
                    reset_secret,
                )
                .context("start QUIC endpoint")?,
            )
        } else {
            None
        };
        if !transport.tcp() {
            return Ok((endpoint, None));
        }
        let tcp_addr = match &endpoint {
            Some(e) => e.local_addr().context("QUIC local address")?,
            None => addr,
        };
        match std::net::TcpListener::bind(tcp_addr) {
            Ok(l) => return Ok((endpoint, Some(tcp::Listener::from_std(l, tls)?))),
            Err(e) if addr.port() == 0 && endpoint.is_some() && attempt < 20 => {
                tracing::debug!(%tcp_addr, error = %e, "tcp port of the quic port taken, trying another");
            }
            Err(e) => {
                return Err(e).with_context(|| format!("bind TCP {tcp_addr}"));
            }
        }
    }
    unreachable!("the loop returns")
}
