//! Overload against a real `ps-server` process: 64 clients, each with 16 pushes of 256 KiB in flight (256 MiB
//! offered at once), against a server limited to 4 streams and a 1 MiB flow-control window per connection and
//! 4 MiB of requests in flight (`crate::load_limits`). The server's peak RSS stays under a bound well below
//! what is offered, latency grows against an idle server, every push is acknowledged and applied exactly once
//! (SGD counters), and a connection past `max-connections` is refused while the others are served.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{counter_table, metric, proc_status_kib, sigterm_and_wait, start};
use protocol::compression::codec;
use protocol::wire::layout::put_ids;
use protocol::{Encoding, PsClient, PsClientConfig, TableCount};

const TABLE: u32 = 8;
const DIM: u32 = 64;
/// Ids per push: 1000 rows x 64 f32 = 256 KB of gradients.
const ROWS: u64 = 1000;
const CLIENTS: usize = 64;
const IN_FLIGHT: usize = 16;

fn counts() -> Vec<TableCount> {
    vec![TableCount {
        table: TABLE,
        count: ROWS as u32,
        dim: DIM,
    }]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_are_throttled_with_bounded_memory_and_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let max_connections = (CLIENTS + 1).to_string();
    let s = start(&data, &tls, &server_flags(&max_connections));
    let pid = s.child.id();
    let setup = common::client(&s, &tls).await;
    setup
        .register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();

    let ids: Vec<u64> = (0..ROWS).collect();
    let payload = push_payload(&ids);
    // Latency on an idle server.
    let setup = Arc::new(setup);
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(push(setup.clone(), payload.clone()).await);
    }
    idle.sort();
    let rss_before = proc_status_kib(pid, "VmRSS");

    // Overload: 64 clients x 16 pushes in flight.
    let clients = connect_clients(&s, &tls).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in &clients {
        for _ in 0..IN_FLIGHT {
            tasks.push(tokio::spawn(push(c.clone(), payload.clone())));
        }
    }
    let mut loaded = Vec::new();
    for t in tasks {
        loaded.push(t.await.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    loaded.sort();
    let peak_kib = proc_status_kib(pid, "VmHWM");
    let offered_mib = (CLIENTS * IN_FLIGHT * payload.len()) >> 20;
    eprintln!(
        "overload: {} pushes of {} KiB from {CLIENTS} clients ({offered_mib} MiB offered at once) in {secs:.2}s; \
         latency idle p50 {:?} p99 {:?}, loaded p50 {:?} p99 {:?} max {:?}; server RSS before {} MiB, peak {} MiB; \
         admission waits {:.2}s total",
        loaded.len(),
        payload.len() >> 10,
        percentile(&idle, 0.5),
        percentile(&idle, 0.99),
        percentile(&loaded, 0.5),
        percentile(&loaded, 0.99),
        loaded.last().unwrap(),
        rss_before >> 10,
        peak_kib >> 10,
        metric(&s, "ps_inflight_wait_seconds_sum"),
    );

    // Nothing lost, nothing applied twice: every row is minus the number of acknowledged pushes.
    let acked = (8 + CLIENTS * IN_FLIGHT) as f32;
    let values = pull_rows(&setup, &ids).await;
    assert!(values.iter().all(|&v| v == -acked), "rows are not -{acked}");

    // Memory bound: the limits allow 64 x 1 MiB of unread window plus 2 x 4 MiB being handled; the 256 MiB
    // offered would not fit. 160 MiB over the idle RSS leaves room for allocator slack and connection state.
    assert!(
        peak_kib < rss_before + (160 << 10),
        "server peak RSS {} MiB exceeds the bound (RSS before the load {} MiB, {offered_mib} MiB offered)",
        peak_kib >> 10,
        rss_before >> 10
    );
    let closing: Vec<_> = clients
        .into_iter()
        .chain([setup])
        .map(|c| tokio::spawn(async move { c.close().await }))
        .collect();
    for c in closing {
        c.await.unwrap();
    }
    sigterm_and_wait(s);
}

/// The server's load limits, minus the flags named in `OVERLOAD_DROP` (comma-separated parts of flag names),
/// for finding out which limit bounds the memory.
fn server_flags(max_connections: &str) -> Vec<&str> {
    let flags = [
        "--max-inflight-bytes",
        "4194304",
        "--max-streams-per-connection",
        "4",
        "--connection-window-bytes",
        "1048576",
        "--max-connections",
        max_connections,
    ];
    let debug_drop = std::env::var("OVERLOAD_DROP").unwrap_or_default();
    flags
        .chunks(2)
        .filter(|p| {
            !debug_drop
                .split(',')
                .any(|d| !d.is_empty() && p[0].contains(d))
        })
        .flatten()
        .copied()
        .collect()
}

/// A push of gradient 1 to every row of `ids`.
fn push_payload(ids: &[u64]) -> bytes::Bytes {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    codec::encode(
        &vec![1.0; ids.len() * DIM as usize],
        Encoding::F32,
        &mut payload,
    );
    bytes::Bytes::from(payload)
}

/// Pushes `payload`, which must be acknowledged with every row applied; returns the latency.
async fn push(c: Arc<PsClient>, payload: bytes::Bytes) -> Duration {
    let start = Instant::now();
    let r = c.push(0, Encoding::F32, 1.0, counts(), payload).await;
    assert_eq!(r.unwrap(), (ROWS, 0), "push not acknowledged");
    start.elapsed()
}

/// Connects [`CLIENTS`] clients at once, then checks that one connection past the cap is refused while they
/// are open.
async fn connect_clients(s: &common::Server, tls: &std::path::Path) -> Vec<Arc<PsClient>> {
    let connecting: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut cfg = PsClientConfig::new(vec![s.quic], tls.to_path_buf());
            cfg.retry_for = Duration::ZERO; // a retry could apply a push twice; none is needed
            cfg.request_timeout = Duration::from_secs(60);
            tokio::spawn(PsClient::connect(cfg))
        })
        .collect();
    let mut clients = Vec::new();
    for c in connecting {
        clients.push(Arc::new(c.await.unwrap().unwrap()));
    }
    let mut extra = PsClientConfig::new(vec![s.quic], tls.to_path_buf());
    extra.retry_for = Duration::ZERO;
    let refused = PsClient::connect(extra).await;
    assert!(refused.is_err(), "connection past max-connections accepted");
    clients
}

/// The rows of `ids`, flattened.
async fn pull_rows(c: &PsClient, ids: &[u64]) -> Vec<f32> {
    let mut pull = Vec::new();
    put_ids(ids, &mut pull);
    let rows = c
        .pull(0, Encoding::F32, counts(), pull.into())
        .await
        .unwrap();
    let mut values = vec![0.0f32; rows.len() / 4];
    codec::decode(&rows, Encoding::F32, &mut values).unwrap();
    values
}
