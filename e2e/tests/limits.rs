//! Issue 40 regression tests ("every listener bounded"), against real `ps-server` processes on loopback with
//! certificates like production's (a server certificate naming `ps` only, a client certificate per role).
//!
//! 1. `idle_sockets_never_lock_clients_out`: raw TCP sockets that never start a TLS handshake held every
//!    connection slot (`max-connections 4`: four of them locked out every QUIC and TCP client). Now a slot is
//!    held only after the handshake, and past `max-handshakes` the oldest handshake is dropped.
//! 2. `a_handshake_not_done_in_time_is_dropped`: `handshake-timeout-secs`.
//! 3. `a_stalled_request_releases_its_bytes`: a QUIC request whose body stalls held its in-flight bytes for
//!    ever, so one stalled stream could stop every other request; a TCP connection stalled mid-frame stayed
//!    open. Now both are dropped after `stream-idle-timeout-secs`.
//! 4. `tcp_replies_queued_behind_a_slow_reader_are_counted`: with a 1 MiB in-flight cap, replies queued for
//!    a TCP client that never reads grew the server by hundreds of MiB while `ps_inflight_bytes` read 0. Now
//!    every queued reply byte holds in-flight bytes until it is written, and the idle timeout closes a
//!    connection whose replies are never taken.
//! 5. `pushes_never_store_a_non_finite_weight`: two pushes of `-3e38` to an SGD table left the row at `+inf`,
//!    which pulls served. Now the second update is refused (`weight-guard = "refuse"`, the default) and
//!    counted.
//! 6. `table_registration_is_bounded`: 500 tables in one 11 KB request took 40 s and +943 MiB, and came back
//!    after a restart. Now one request names at most `max-tables-per-request` tables, a trainer may not pass
//!    `max-tables` or `max-table-dim`, each refusal is whole and counted, and an admin certificate may
//!    register more.
//! 7. `certificates_are_reloaded_when_their_files_change`: TLS files were read once, so a server older than
//!    its renewed certificate presented the expired one. Now a new connection gets the renewed one, a
//!    connection opened before keeps working, and files that do not load are refused (counted) while the last
//!    good certificate stays.
//!
//! No test sleeps in place of a condition: every wait polls a metric or an answer, or blocks on a socket,
//! until a deadline far above what any machine needs, and fails naming what it waited for.

mod support;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use local_cluster::{free_ports, http_get, metric};
use protocol::transport::tls;
use protocol::wire::layout::put_ids;
use protocol::{
    Encoding, ErrorCode, PsClient, PsClientConfig, Request, Response, Role, TableConfig,
    TableCount, Transport,
};
use support::{wait_for, DEADLINE};

/// The TLS name clients dial; the server's certificate carries no other (no `localhost`).
const SERVER_NAME: &str = "ps";

fn prod_like_tls(dir: &Path) {
    tls::init_certs(dir, &[SERVER_NAME.to_owned()]).unwrap();
}

/// One `ps-server` process, killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Server {
    /// Starts `ps-server` with `args` on free ports, its TLS material in `dir/tls`; waits until it is ready.
    fn start(dir: &Path, args: &[&str]) -> Server {
        let tls_dir = dir.join("tls");
        if !tls_dir.join(tls::files::SERVER_CERT).exists() {
            prod_like_tls(&tls_dir);
        }
        let ports = free_ports(2).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", ports[0]).parse().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", ports[1]).parse().unwrap();
        let log = dir.join("ps.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bench::bins::path("ps-server"))
            .args(args)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--tls-dir")
            .arg(&tls_dir)
            .env("RUST_LOG", "info")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            addr,
            metrics,
            log,
        };
        wait_for(
            "the ready line",
            || server.log_text().contains("ps-server ready"),
            || server.log_text(),
        );
        server
    }

    fn tls_dir(&self) -> PathBuf {
        self.log.parent().unwrap().join("tls")
    }

    /// The value of sample `name` (labels included) on its metrics page.
    fn metric(&self, name: &str) -> f64 {
        http_get(self.metrics, "/metrics")
            .ok()
            .and_then(|page| metric(&page, name))
            .unwrap_or(0.0)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A trainer-role client over `transport` that registered the test table.
    async fn client(&self, transport: Transport) -> PsClient {
        let mut cfg = PsClientConfig::new(vec![self.addr], self.tls_dir());
        cfg.server_name = SERVER_NAME.into();
        cfg.transport = transport;
        cfg.retry_for = Duration::from_secs(30);
        let client = PsClient::connect(cfg).await.unwrap();
        client
            .register_tables(&[TableConfig::counter(1, 2)])
            .await
            .unwrap();
        client
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pulls two rows through `client`: the proof that it was served.
async fn pull(client: &PsClient) -> Vec<u8> {
    let mut payload = Vec::new();
    put_ids(&[1, 2], &mut payload);
    let counts = vec![TableCount {
        table: 1,
        count: 2,
        dim: 2,
    }];
    client
        .pull(0, Encoding::F32, counts, payload.into())
        .await
        .unwrap()
        .to_vec()
}

/// Blocks until the server closes `socket` (end of stream or reset), at most [`DEADLINE`].
fn closed_by_server(socket: &mut TcpStream) -> bool {
    socket.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn idle_sockets_never_lock_clients_out() {
    let dir = tempfile::tempdir().unwrap();
    // The handshake timeout is far away: clients must get in because idle sockets hold no slot, not
    // because the sockets timed out.
    let server = Server::start(
        dir.path(),
        &[
            "--max-connections",
            "4",
            "--max-handshakes",
            "4",
            "--handshake-timeout-secs",
            "600",
        ],
    );
    let tcp_addr = server.addr;
    let mut idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(tcp_addr).unwrap())
        .collect();
    wait_for(
        "the server to drop the oldest idle sockets",
        || server.metric("ps_handshakes_total{outcome=\"evicted\"}") >= 4.0,
        || format!("metrics: {:?}", http_get(server.metrics, "/metrics")),
    );
    // The first socket was the oldest handshake: the server closed it to make room.
    assert!(
        closed_by_server(&mut idle[0]),
        "the oldest idle socket is still open"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for transport in [Transport::Quic, Transport::Tcp] {
            let client = server.client(transport).await;
            assert_eq!(pull(&client).await.len(), 2 * 2 * 4, "{transport}");
            client.close().await;
        }
    });
    assert!(server.metric("ps_handshakes_total{outcome=\"ok\"}") >= 2.0);
    assert_eq!(server.metric("ps_connections_refused_total"), 0.0);
    drop(idle);
}

#[test]
fn a_handshake_not_done_in_time_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--handshake-timeout-secs", "1"]);
    let mut socket = TcpStream::connect(server.addr).unwrap();
    assert!(
        closed_by_server(&mut socket),
        "a socket that never handshakes is still open after {DEADLINE:?}"
    );
    wait_for(
        "the timed-out handshake to be counted",
        || server.metric("ps_handshakes_total{outcome=\"timeout\"}") >= 1.0,
        || server.log_text(),
    );
    assert_eq!(server.metric("ps_handshakes_in_progress"), 0.0);
}

/// The prefix and header of a frame announcing a `payload_len`-byte payload.
fn frame_head(payload_len: usize) -> Vec<u8> {
    let mut head = Vec::new();
    protocol::wire::frame::encode_head(&Request::Flush, payload_len, &mut head).unwrap();
    head
}

#[test]
fn a_stalled_request_releases_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // A pool of 64 KiB: one stalled request announcing 1 MiB takes all of it.
    let server = Server::start(
        dir.path(),
        &[
            "--max-inflight-bytes",
            "65536",
            "--stream-idle-timeout-secs",
            "1",
        ],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let tls_dir = server.tls_dir();
        // QUIC: a stream announcing 1 MiB that sends 100 KiB of it, then nothing.
        let endpoint = protocol::transport::endpoint::client(
            server.addr,
            tls::client_config(&tls_dir, Role::Trainer).unwrap(),
        )
        .unwrap();
        let conn = endpoint
            .connect(server.addr, SERVER_NAME)
            .unwrap()
            .await
            .unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&frame_head(1 << 20)).await.unwrap();
        send.write_all(&vec![0u8; 100 << 10]).await.unwrap();
        // An honest client's request waits for the pool until the stalled one is dropped.
        let client = server.client(Transport::Quic).await;
        assert_eq!(pull(&client).await.len(), 16);
        assert!(
            server.metric("ps_stream_idle_timeouts_total{transport=\"quic\",direction=\"read\"}")
                >= 1.0
        );
        // The stalled stream was reset, not answered.
        let mut buf = [0u8; 16];
        assert!(
            recv.read(&mut buf).await.is_err(),
            "the stalled stream got an answer"
        );
        client.close().await;

        // TCP: one chunk of a frame (not its last), then nothing: the connection is closed.
        let connector = tokio_rustls::TlsConnector::from(Arc::new(
            tls::rustls_client_config(&tls_dir, Role::Trainer).unwrap(),
        ));
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        let mut stream = connector.connect(name, tcp).await.unwrap();
        let mut chunk = frame_head(1 << 20);
        chunk.extend_from_slice(&[0u8; 1000]);
        let mut wire = Vec::new();
        wire.extend_from_slice(&7u32.to_le_bytes());
        wire.extend_from_slice(&(chunk.len() as u32).to_le_bytes()); // bit 31 clear: more chunks follow
        wire.extend_from_slice(&chunk);
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream.write_all(&wire).await.unwrap();
        stream.flush().await.unwrap();
        let read = tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "a tcp connection stalled mid-frame is still open: {read:?}"
        );
        wait_for(
            "the stalled tcp frame to be counted",
            || {
                server.metric("ps_stream_idle_timeouts_total{transport=\"tcp\",direction=\"read\"}")
                    >= 1.0
            },
            || server.log_text(),
        );
    });
}

#[test]
fn pushes_never_store_a_non_finite_weight() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = server.client(Transport::Quic).await;
        let mut payload = Vec::new();
        put_ids(&[1], &mut payload);
        protocol::compression::codec::encode(&[-3e38, -1.0], Encoding::F32, &mut payload);
        let payload = Bytes::from(payload);
        let counts = || {
            vec![TableCount {
                table: 1,
                count: 1,
                dim: 2,
            }]
        };
        for _ in 0..2 {
            client
                .push(0, Encoding::F32, 1.0, counts(), payload.clone())
                .await
                .unwrap();
        }
        let mut ids = Vec::new();
        put_ids(&[1], &mut ids);
        let row: Vec<f32> = client
            .pull(0, Encoding::F32, counts(), ids.into())
            .await
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // The whole update of the row is undone, its second element too.
        assert_eq!(
            row,
            vec![3e38, 1.0],
            "the second update would have left +inf"
        );
        client.close().await;
    });
    assert_eq!(
        server.metric("ps_rows_refused_nonfinite_weights_total"),
        1.0
    );
}

/// `frame` cut into TCP transport chunks of stream `id` (`protocol::transport::mux`: id, length with bit 31 on
/// the last chunk, bytes).
fn tcp_chunks(id: u32, frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let pieces: Vec<&[u8]> = frame.chunks(protocol::transport::mux::CHUNK_MAX).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let last = if i + 1 == pieces.len() { 1u32 << 31 } else { 0 };
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&(piece.len() as u32 | last).to_le_bytes());
        out.extend_from_slice(piece);
    }
    out
}

#[test]
fn tcp_replies_queued_behind_a_slow_reader_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 1u64 << 20;
    let server = Server::start(
        dir.path(),
        &[
            "--max-inflight-bytes",
            &cap.to_string(),
            "--stream-idle-timeout-secs",
            "2",
        ],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Registers the table.
        let client = server.client(Transport::Quic).await;
        client.close().await;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(
            tls::rustls_client_config(&server.tls_dir(), Role::Trainer).unwrap(),
        ));
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        let stream = connector.connect(name, tcp).await.unwrap();
        // Pulls of 4096 rows (32 KiB of reply each), 64 MiB of replies in all; the replies are never read.
        let ids: Vec<u64> = (0..4096).collect();
        let mut payload = Vec::new();
        put_ids(&ids, &mut payload);
        let req = Request::Pull {
            epoch: 1,
            encoding: Encoding::F32,
            tables: vec![TableCount {
                table: 1,
                count: 4096,
                dim: 2,
            }],
        };
        let mut frame = Vec::new();
        protocol::wire::frame::encode_head(&req, payload.len(), &mut frame).unwrap();
        frame.extend_from_slice(&payload);
        let (_unread, mut write) = tokio::io::split(stream);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for id in 1..=2048u32 {
                if write.write_all(&tcp_chunks(id, &frame)).await.is_err() {
                    return;
                }
            }
            // Kept open: the server must close it.
            std::future::pending::<()>().await;
        });
        let inflight = || server.metric("ps_inflight_bytes");
        wait_for(
            "queued replies to be counted in ps_inflight_bytes",
            || inflight() >= (cap / 2) as f64,
            || format!("ps_inflight_bytes = {}", inflight()),
        );
        // Two pools (requests, responses) of `cap` each: never more than that is held.
        assert!(inflight() <= (2 * cap) as f64, "{}", inflight());
        wait_for(
            "the server to close the connection whose replies are never read",
            || {
                server
                    .metric("ps_stream_idle_timeouts_total{transport=\"tcp\",direction=\"write\"}")
                    >= 1.0
            },
            || server.log_text(),
        );
        wait_for(
            "the unread replies' bytes to be released",
            || inflight() == 0.0,
            || format!("ps_inflight_bytes = {}", inflight()),
        );
        writer.abort();
    });
}

/// Resident memory of process `pid`, bytes (Linux `/proc`).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/pid/status");
    kib << 10
}

/// A TCP client starting 2048 frames of 8 MiB each and finishing none grew the server by hundreds of MiB
/// while `ps_inflight_bytes` read 0 (frames still arriving were not counted). Now the bytes a TCP connection
/// buffers take in-flight bytes before it reads more: with a 1 MiB cap the server stops reading that client
/// (its memory stays put, the gauge shows what is held, at most the cap), drops it after the idle bound, and
/// releases every byte; other clients are served meanwhile... once the bytes are back.
#[test]
fn tcp_frames_still_arriving_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 1u64 << 20;
    let server = Server::start(
        dir.path(),
        &[
            "--max-inflight-bytes",
            &cap.to_string(),
            "--stream-idle-timeout-secs",
            "3",
        ],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = server.client(Transport::Quic).await;
        let rss_before = rss_bytes(server.child.id());
        let connector = tokio_rustls::TlsConnector::from(Arc::new(
            tls::rustls_client_config(&server.tls_dir(), Role::Trainer).unwrap(),
        ));
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        let mut stream = connector.connect(name, tcp).await.unwrap();
        // The first chunk (64 KiB) of 2048 pushes that announce 8 MiB each: 128 MiB the server would hold.
        let body = 8usize << 20;
        let req = Request::Push {
            lr_scale: 1.0,
            epoch: 1,
            encoding: Encoding::F32,
            grad_scale: 1.0,
            tables: vec![TableCount {
                table: 1,
                count: (body / 16) as u32,
                dim: 2,
            }],
            id: protocol::wire::message::push::PushId::NONE,
        };
        let mut first = Vec::new();
        protocol::wire::frame::encode_head(&req, body, &mut first).unwrap();
        first.resize(protocol::transport::mux::CHUNK_MAX, 7);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for id in 1..=2048u32 {
                let mut chunk = Vec::with_capacity(first.len() + 8);
                chunk.extend_from_slice(&id.to_le_bytes());
                chunk.extend_from_slice(&(first.len() as u32).to_le_bytes());
                chunk.extend_from_slice(&first);
                if stream.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            std::future::pending::<()>().await;
        });
        let inflight = || server.metric("ps_inflight_bytes");
        wait_for(
            "the frames still arriving to be counted in ps_inflight_bytes",
            || inflight() >= (cap / 2) as f64,
            || format!("ps_inflight_bytes = {}", inflight()),
        );
        assert!(inflight() <= cap as f64, "{}", inflight());
        let grown = rss_bytes(server.child.id()).saturating_sub(rss_before);
        assert!(
            grown < 64 << 20,
            "the server grew by {} MiB holding partial frames",
            grown >> 20
        );
        wait_for(
            "the server to drop the connection that cannot get in-flight bytes",
            || {
                server.metric("ps_stream_idle_timeouts_total{transport=\"tcp\",direction=\"read\"}")
                    >= 1.0
            },
            || server.log_text(),
        );
        wait_for(
            "the partial frames' bytes to be released",
            || inflight() == 0.0,
            || format!("ps_inflight_bytes = {}", inflight()),
        );
        assert_eq!(pull(&client).await.len(), 16, "other clients are served");
        writer.abort();
    });
}

#[test]
fn table_registration_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let specs = |ids: std::ops::Range<u32>| -> Vec<TableConfig> {
        ids.map(|id| TableConfig::counter(id, 8)).collect()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The reproduction, with the defaults: 500 tables in one request are refused whole, at once.
    {
        let server = Server::start(dir.path(), &[]);
        let register = Request::RegisterTables {
            tables: specs(1..501),
        };
        let tls_dir = server.tls_dir();
        let resp = rt.block_on(support::call_as(
            server.addr,
            &tls_dir,
            SERVER_NAME,
            Role::Trainer,
            &register,
            Vec::new(),
        ));
        let Response::Error { code, message } = resp else {
            panic!("500 tables in one request: {resp:?}")
        };
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(message.contains("500 tables"), "{message}");
        assert_eq!(
            server.metric("ps_table_registrations_refused_total{reason=\"per_request\"}"),
            1.0
        );
        assert_eq!(server.metric("ps_tables"), 0.0);
    }
    // A trainer up to --max-tables, not past it; an admin past it; what was refused never comes back.
    let dir = tempfile::tempdir().unwrap();
    let args = ["--max-tables", "4", "--max-table-dim", "16"];
    let server = Server::start(dir.path(), &args);
    let tls_dir = server.tls_dir();
    let call = |role, tables| {
        rt.block_on(support::call_as(
            server.addr,
            &tls_dir,
            SERVER_NAME,
            role,
            &Request::RegisterTables { tables },
            Vec::new(),
        ))
    };
    assert!(matches!(
        call(Role::Trainer, specs(1..5)),
        Response::Registered { tables: 4 }
    ));
    let resp = call(Role::Trainer, specs(5..6));
    assert!(
        matches!(&resp, Response::Error { code: ErrorCode::BadRequest, message } if message.contains("max-tables")),
        "{resp:?}"
    );
    let resp = call(Role::Trainer, vec![TableConfig::counter(1, 32)]);
    assert!(
        matches!(&resp, Response::Error { code: ErrorCode::BadRequest, message } if message.contains("max-table-dim")),
        "{resp:?}"
    );
    assert!(matches!(
        call(
            Role::Admin,
            vec![TableConfig::counter(5, 8), TableConfig::counter(6, 64)]
        ),
        Response::Registered { tables: 6 }
    ));
    assert_eq!(server.metric("ps_tables"), 6.0);
    assert_eq!(
        server.metric("ps_table_registrations_refused_total{reason=\"tables\"}"),
        1.0
    );
    assert_eq!(
        server.metric("ps_table_registrations_refused_total{reason=\"dim\"}"),
        1.0
    );
    drop(server);
    let server = Server::start(dir.path(), &args);
    assert_eq!(
        server.metric("ps_tables"),
        6.0,
        "the registered tables, no more"
    );
}

/// The leaf certificate `addr` presents to a new QUIC connection (DER).
async fn presented(addr: SocketAddr, tls_dir: &Path) -> Vec<u8> {
    let endpoint = protocol::transport::endpoint::client(
        addr,
        tls::client_config(tls_dir, Role::Trainer).unwrap(),
    )
    .unwrap();
    let conn = endpoint.connect(addr, SERVER_NAME).unwrap().await.unwrap();
    let certs = conn
        .peer_identity()
        .expect("the server presents a certificate")
        .downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
        .unwrap();
    let der = certs[0].to_vec();
    conn.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
    der
}

#[test]
fn certificates_are_reloaded_when_their_files_change() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let tls_dir = server.tls_dir();
    let loaded = "tls_certificate_reloads_total{file=\"server.pem\",outcome=\"loaded\"}";
    let refused = "tls_certificate_reloads_total{file=\"server.pem\",outcome=\"refused\"}";
    let not_after = "tls_certificate_not_after_seconds{file=\"server.pem\"}";
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = server.client(Transport::Quic).await;
        let first = presented(server.addr, &tls_dir).await;
        let expiry = server.metric(not_after);
        assert!(expiry > 0.0, "the expiry of the certificate presented");
        // cert-manager's renewal: a new certificate and key for the same name, written over the old files.
        tls::issue(
            &tls_dir,
            tls::Leaf::Server,
            &[SERVER_NAME.to_owned()],
            Duration::from_secs(400 * 86_400),
        )
        .unwrap();
        let deadline = std::time::Instant::now() + DEADLINE;
        let second = loop {
            let now = presented(server.addr, &tls_dir).await;
            if now != first {
                break now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "new connections still get the old certificate: {}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(server.metric(loaded), 1.0);
        assert_ne!(server.metric(not_after), expiry);
        // The connection opened before the renewal is still served.
        assert_eq!(pull(&client).await.len(), 16);
        // Files that do not load are refused; the renewed certificate stays.
        std::fs::write(tls_dir.join(tls::files::SERVER_CERT), "not a certificate").unwrap();
        let deadline = std::time::Instant::now() + DEADLINE;
        while server.metric(refused) < 1.0 {
            assert_eq!(presented(server.addr, &tls_dir).await, second);
            assert!(
                std::time::Instant::now() < deadline,
                "the broken files were never tried: {}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(presented(server.addr, &tls_dir).await, second);
        assert_eq!(pull(&client).await.len(), 16);
        client.close().await;
    });
    assert!(server
        .log_text()
        .contains("still presenting the previous certificate"));
}
