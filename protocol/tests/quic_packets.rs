//! Packet sizes of the QUIC endpoints (`protocol::transport::endpoint`): loopback connections use large packets from the
//! handshake on, other paths discover them, and multi-MB frames cross either intact. Real quinn endpoints and
//! TLS on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use protocol::transport::endpoint::{self, PathKind, LOOPBACK_MTU, NETWORK_MAX_MTU};
use protocol::transport::{stream, tls};

const MAX_FRAME: u64 = 64 << 20;

/// Serves every bidirectional stream of every connection by echoing its frame (header and payload) back.
async fn echo(endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    let (header, payload) = stream::read_frame::<u64>(&mut recv, MAX_FRAME)
                        .await
                        .expect("request frame");
                    stream::write_frame(&mut send, &header, payload)
                        .await
                        .expect("reply frame");
                    let _ = send.stopped().await;
                });
            }
        });
    }
}

/// `len` bytes that differ from those of every other `seed`.
fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Sends `frames` frames of `len` bytes at once on `conn` and checks every echo byte for byte.
async fn round_trips(conn: &quinn::Connection, frames: u64, len: usize) {
    let calls = (0..frames).map(|seed| {
        let conn = conn.clone();
        tokio::spawn(async move {
            let payload = pattern(len, seed);
            let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
            stream::write_frame(&mut send, &seed, payload.clone())
                .await
                .expect("write");
            let (header, echoed) = stream::read_frame::<u64>(&mut recv, MAX_FRAME)
                .await
                .expect("read echo");
            assert_eq!(header, seed);
            assert!(echoed == payload, "frame {seed}: echoed bytes differ");
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.expect("round trip");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A server on 127.0.0.1 and a client endpoint for it, both with transport settings for `kind`.
fn endpoints(tls_dir: &Path, kind: PathKind) -> (quinn::Endpoint, quinn::Endpoint, SocketAddr) {
    tls::init_dev_certs(tls_dir, &[]).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = endpoint::server(loopback, tls::server_config(tls_dir).unwrap()).unwrap();
    let mut transport = endpoint::transport_config();
    endpoint::tune_path(&mut transport, kind);
    let transport = Arc::new(transport);
    let mut server_config = tls::server_config(tls_dir).unwrap();
    server_config.transport_config(transport.clone());
    server.set_server_config(Some(server_config));
    let addr = server.local_addr().unwrap();
    let mut client = endpoint::client(
        addr,
        tls::client_config(tls_dir, protocol::Role::Trainer).unwrap(),
    )
    .unwrap();
    let mut client_config = tls::client_config(tls_dir, protocol::Role::Trainer).unwrap();
    client_config.transport_config(transport);
    client.set_default_client_config(client_config);
    (server, client, addr)
}

#[test]
fn loopback_uses_large_packets_from_the_handshake_and_multi_mb_frames_arrive_intact() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (server, client, addr) = endpoints(dir.path(), PathKind::Loopback);
        assert_eq!(PathKind::of(addr), PathKind::Loopback);
        tokio::spawn(echo(server.clone()));
        let conn = client
            .connect(addr, tls::DEFAULT_SERVER_NAME)
            .unwrap()
            .await
            .unwrap();
        assert_eq!(conn.stats().path.current_mtu, LOOPBACK_MTU);
        // 4 frames of 6 MB at once: full GSO batches of 16 KiB packets, which only pass when split.
        round_trips(&conn, 4, 6 << 20).await;
        let path = conn.stats().path;
        eprintln!("loopback path after 48 MB: {path:?}");
        assert_eq!(path.current_mtu, LOOPBACK_MTU);
        // A full batch the kernel refuses is lost every time it is sent: the connection stalls, or loses packets
        // in hundreds of congestion events (measured: 3,200 of 5,500 packets, 755 events, 44 s). A busy machine
        // loses packets too, when the receiver falls behind and its socket buffer fills: up to 16% of them here
        // with one core kept busy, so the share of lost packets depends on the machine's load. Each such burst
        // is one congestion event that cuts the window by 30%, so a few of them bring it under the socket
        // buffer (a dozen even for a 24 MB window and Linux's default 208 KiB buffer cap): count events.
        assert!(
            path.congestion_events < 50,
            "{} congestion events, lost {} of {} packets: {path:?}",
            path.congestion_events,
            path.lost_packets,
            path.sent_packets
        );
        conn.close(0u32.into(), b"done");
        client.wait_idle().await;
    });
}

#[test]
fn network_paths_start_small_and_discover_larger_packets() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (server, client, addr) = endpoints(dir.path(), PathKind::Network);
        tokio::spawn(echo(server.clone()));
        let conn = client
            .connect(addr, tls::DEFAULT_SERVER_NAME)
            .unwrap()
            .await
            .unwrap();
        // MTU discovery starts with the handshake (1,200 bytes) and runs alongside the traffic; on loopback
        // every probe passes and it ends at its upper bound within a few round trips.
        let mut rounds = 0;
        while conn.stats().path.current_mtu < NETWORK_MAX_MTU && rounds < 200 {
            round_trips(&conn, 2, 1 << 20).await;
            rounds += 1;
        }
        let path = conn.stats().path;
        eprintln!("network path after {rounds} rounds: {path:?}");
        assert_eq!(path.current_mtu, NETWORK_MAX_MTU, "after {rounds} rounds");
        // Full GSO batches of discovered packets (10 x 8,952 bytes exceed one UDP datagram) must get through:
        // otherwise black-hole detection takes the MTU back down to 1,200.
        round_trips(&conn, 3, 4 << 20).await;
        let path = conn.stats().path;
        assert_eq!(path.current_mtu, NETWORK_MAX_MTU, "{path:?}");
        assert_eq!(path.black_holes_detected, 0, "{path:?}");
        conn.close(0u32.into(), b"done");
        client.wait_idle().await;
    });
}
