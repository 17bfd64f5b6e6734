//! Both transports (QUIC and TLS over TCP) against a real `ps-server` process on loopback: a multi-MB push and
//! pull arrive intact (frames split across many packets, chunks and TLS records), 1,000 concurrent small
//! requests on one connection complete, and a server killed mid-request gives every waiting request a clear
//! error within the request timeout instead of a hang.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::compression::codec;
use protocol::wire::layout::put_ids;
use protocol::{
    Encoding, InitConfig, OptimizerConfig, ProtocolError, PsClient, PsClientConfig, TableConfig,
    TableCount, Transport,
};

const DIM: usize = 16;
const LR: f32 = 0.5;

fn sgd_table() -> TableConfig {
    TableConfig {
        optimizer: OptimizerConfig::Sgd { lr: LR },
        init: InitConfig::uniform(0.1),
        seed: 9,
        ..TableConfig::new(5, "C5", DIM)
    }
}

fn counts(n: usize) -> Vec<TableCount> {
    vec![TableCount {
        table: 5,
        count: n as u32,
        dim: DIM as u32,
    }]
}

fn ids_payload(ids: &[u64]) -> Bytes {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    payload.into()
}

async fn connect(
    s: &common::Server,
    tls: &Path,
    transport: Transport,
    timeout: Duration,
) -> PsClient {
    let mut cfg = PsClientConfig::new(vec![s.quic], tls.to_owned());
    cfg.transport = transport;
    cfg.request_timeout = timeout;
    cfg.retry_for = Duration::ZERO;
    let c = PsClient::connect(cfg).await.unwrap();
    c.register_tables(&[sgd_table()]).await.unwrap();
    c
}

async fn pull_f32(c: &PsClient, ids: &[u64]) -> Result<Vec<f32>, ProtocolError> {
    let rows = c
        .pull(0, Encoding::F32, counts(ids.len()), ids_payload(ids))
        .await?;
    let mut out = vec![0f32; ids.len() * DIM];
    codec::decode(&rows, Encoding::F32, &mut out)?;
    Ok(out)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn start(dir: &Path) -> (common::Server, std::path::PathBuf) {
    let (data, tls) = (dir.join("data"), dir.join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let s = common::start(
        &data,
        &tls,
        &["--transport", "both", "--durability", "none"],
    );
    (s, tls)
}

/// 100,000 rows of dim 16 as f32: a 6.4 MB pull response and a push of over 6 MB, then the pull again; every row must
/// have moved by exactly `-lr * gradient`.
fn large_frames_arrive_intact(transport: Transport) {
    let dir = tempfile::tempdir().unwrap();
    let (s, tls) = start(dir.path());
    runtime().block_on(async {
        let c = connect(&s, &tls, transport, Duration::from_secs(60)).await;
        let ids: Vec<u64> = (0..100_000u64).map(|i| i * 7919 + 1).collect();
        let before = pull_f32(&c, &ids).await.unwrap();
        let grads: Vec<f32> = (0..ids.len() * DIM)
            .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
            .collect();
        let mut payload = Vec::new();
        put_ids(&ids, &mut payload);
        codec::encode(&grads, Encoding::F32, &mut payload);
        assert!(payload.len() > 6_000_000, "{}", payload.len());
        let (applied, rejected) = c
            .push(0, Encoding::F32, 1.0, counts(ids.len()), payload.into())
            .await
            .unwrap();
        assert_eq!((applied, rejected), (ids.len() as u64, 0));
        let after = pull_f32(&c, &ids).await.unwrap();
        for (i, ((b, a), g)) in before.iter().zip(&after).zip(&grads).enumerate() {
            let want = b - LR * g;
            assert!(
                (a - want).abs() <= 1e-5,
                "{transport}: element {i} (row {}): {a}, expected {want}",
                i / DIM
            );
        }
        c.close().await;
    });
    common::sigterm_and_wait(s);
}

#[test]
fn quic_multi_mb_frames_arrive_intact() {
    large_frames_arrive_intact(Transport::Quic);
}

#[test]
fn tcp_multi_mb_frames_arrive_intact() {
    large_frames_arrive_intact(Transport::Tcp);
}

/// 1,000 single-row pulls at once on the client's one connection; each answers with its own row.
fn thousand_concurrent_requests(transport: Transport) {
    let dir = tempfile::tempdir().unwrap();
    let (s, tls) = start(dir.path());
    runtime().block_on(async {
        let c = Arc::new(connect(&s, &tls, transport, Duration::from_secs(60)).await);
        let ids: Vec<u64> = (1..=1000u64).collect();
        let all = pull_f32(&c, &ids).await.unwrap();
        let tasks: Vec<_> = ids
            .iter()
            .map(|&id| {
                let c = c.clone();
                tokio::spawn(async move { pull_f32(&c, &[id]).await })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            let row = t.await.unwrap().unwrap();
            assert_eq!(
                row,
                all[i * DIM..(i + 1) * DIM],
                "{transport}: id {}",
                i + 1
            );
        }
        let metrics = common::http_get(s.metrics, "/metrics");
        assert!(
            metrics.lines().any(|l| l == "ps_connections 1"),
            "{transport}: expected one open connection:\n{metrics}"
        );
        c.close().await;
    });
    common::sigterm_and_wait(s);
}

#[test]
fn quic_thousand_concurrent_requests_on_one_connection() {
    thousand_concurrent_requests(Transport::Quic);
}

#[test]
fn tcp_thousand_concurrent_requests_on_one_connection() {
    thousand_concurrent_requests(Transport::Tcp);
}

/// Eight tasks keep large pulls in flight; the server gets SIGKILL; every task must end with a transport error
/// naming the server (TCP: the connection was lost; QUIC: no answer within the request timeout), not hang.
fn server_killed_mid_request(transport: Transport) {
    let dir = tempfile::tempdir().unwrap();
    let (s, tls) = start(dir.path());
    let timeout = Duration::from_secs(3);
    let server = s.quic.to_string();
    runtime().block_on(async {
        let c = Arc::new(connect(&s, &tls, transport, timeout).await);
        let ids: Arc<Vec<u64>> = Arc::new((0..50_000u64).collect());
        pull_f32(&c, &ids).await.unwrap();
        let answered = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (c, ids, answered) = (c.clone(), ids.clone(), answered.clone());
                tokio::spawn(async move {
                    loop {
                        if let Err(e) = pull_f32(&c, &ids).await {
                            return e;
                        }
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Pulls are under way (as many answered as there are tasks) before the kill; a task that already
        // failed (its pull timed out on a slow machine) is checked like the others below.
        let deadline = Instant::now() + Duration::from_secs(60);
        while answered.load(Ordering::Relaxed) < 8 && !tasks.iter().any(|t| t.is_finished()) {
            assert!(
                Instant::now() < deadline,
                "{transport}: pulls not under way"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        common::sigkill_and_wait(s);
        for t in tasks {
            // The request timeout bounds each request; far past it means a hang.
            let err = tokio::time::timeout(timeout * 5, t)
                .await
                .unwrap_or_else(|_| {
                    panic!("{transport}: a request still hangs after the server died")
                })
                .unwrap();
            assert!(
                matches!(
                    err,
                    ProtocolError::ConnectionLost { .. }
                        | ProtocolError::Connect { .. }
                        | ProtocolError::Connection { .. }
                        | ProtocolError::Timeout { .. }
                ),
                "{transport}: unexpected error {err:?}"
            );
            assert!(err.to_string().contains(&server), "{transport}: {err}");
        }
    });
}

#[test]
fn quic_server_killed_mid_request_gives_an_error_not_a_hang() {
    server_killed_mid_request(Transport::Quic);
}

#[test]
fn tcp_server_killed_mid_request_gives_an_error_not_a_hang() {
    server_killed_mid_request(Transport::Tcp);
}

/// TCP uses the same mutual TLS as QUIC: a client whose certificate another CA signed gets an error (the
/// server's TLS alert), and a client of the cluster CA in the same run is served.
#[test]
fn tcp_refuses_a_client_certificate_from_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls, foreign) = common::dirs_with_foreign_client(dir.path());
    let s = common::start(&data, &tls, &["--transport", "both"]);
    runtime().block_on(async {
        let mut cfg = PsClientConfig::new(vec![s.quic], foreign.clone());
        cfg.transport = Transport::Tcp;
        cfg.retry_for = Duration::ZERO;
        cfg.request_timeout = Duration::from_secs(10);
        let err = match PsClient::connect(cfg).await {
            Ok(_) => panic!("a client of another CA was served over tcp"),
            Err(e) => e,
        };
        assert!(
            matches!(
                err,
                ProtocolError::ConnectionLost { .. } | ProtocolError::Connect { .. }
            ),
            "{err:?}"
        );
        let c = connect(&s, &tls, Transport::Tcp, Duration::from_secs(10)).await;
        pull_f32(&c, &[1, 2, 3]).await.unwrap();
        c.close().await;
    });
    common::sigterm_and_wait(s);
}
