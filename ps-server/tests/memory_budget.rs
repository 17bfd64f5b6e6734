//! Real processes on loopback: the memory budget (issue 3's capacity tier) evicts rows to RocksDB and reads
//! them back bit for bit.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::message::put_ids;
use protocol::{
    codec, Encoding, InitSpec, OptimizerSpec, ProtocolError, PsClient, PsClientConfig, TableCount,
    TableSpec,
};

struct Server {
    child: Child,
    quic: SocketAddr,
    metrics: SocketAddr,
}

fn start(data: &Path, tls: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data)
        .arg("--tls-dir")
        .arg(tls)
        .args(["--shard-index", "0", "--num-shards", "1"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn ps-server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let field = |k: &str| -> SocketAddr {
        let v = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {line:?}"));
        v.parse().unwrap()
    };
    Server {
        quic: field("quic="),
        metrics: field("metrics="),
        child,
    }
}

impl Drop for Server {
    // A failing test must not leave its server running (it would hold the test's output pipe open).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn sigterm_and_wait(mut s: Server) {
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            assert!(status.success(), "ps-server exited with {status}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ps-server did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn table() -> TableSpec {
    TableSpec {
        id: 3,
        name: "C3".into(),
        dim: 8,
        optimizer: OptimizerSpec::RowAdagrad {
            lr: 0.05,
            eps: 1e-8,
            initial_accumulator: 0.0,
        },
        init: InitSpec::Uniform { scale: 0.1 },
        seed: 42,
    }
}

async fn client(s: &Server, tls: &Path) -> PsClient {
    PsClient::connect(PsClientConfig::new(vec![s.quic], tls.to_owned()))
        .await
        .unwrap()
}

async fn pull(c: &PsClient, ids: &[u64]) -> Result<Bytes, ProtocolError> {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    let t = vec![TableCount {
        table: 3,
        count: ids.len() as u32,
        dim: 8,
    }];
    c.pull(0, Encoding::F32, t, payload.into()).await
}

/// The value of an unlabelled counter in a /metrics page (0 if absent).
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Issue 3 (capacity tier): with a budget of 100 rows, 1000 pushed rows are evicted to RocksDB and read back
/// bit for bit, before and after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue3_rows_past_the_memory_budget_are_evicted_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::tls::init_dev_certs(&tls, &[]).unwrap();
    let budget = [
        "--memory-budget-rows",
        "100",
        "--flush-interval-secs",
        "3600",
    ];
    let s = start(&data, &tls, &budget);
    let c = client(&s, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    let ids: Vec<u64> = (0..1000).map(|i| i * 7_919).collect();
    let mut payload = Vec::new();
    put_ids(&ids, &mut payload);
    let grads: Vec<f32> = (0..ids.len() * 8)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.29)
        .collect();
    codec::encode(&grads, Encoding::F32, &mut payload);
    let t = vec![TableCount {
        table: 3,
        count: ids.len() as u32,
        dim: 8,
    }];
    let (applied, _) = c
        .push(0, Encoding::F32, 1.0, t, payload.into())
        .await
        .unwrap();
    assert_eq!(applied, 1000);
    let before = pull(&c, &ids).await.unwrap();

    // The budget timer evicts within a few hundred milliseconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let m = http_get(s.metrics, "/metrics");
        if counter(&m, "ps_evictions_total") >= 900.0 {
            break m;
        }
        assert!(Instant::now() < deadline, "no evictions: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(metrics.contains("# HELP ps_evictions_total"), "{metrics}");
    let after = pull(&c, &ids).await.unwrap();
    assert_eq!(before, after, "rows differ after eviction and read-back");
    let metrics = http_get(s.metrics, "/metrics");
    assert!(
        counter(&metrics, "ps_readback_rows_total") >= 900.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("ps_readback_duration_seconds_bucket"),
        "{metrics}"
    );
    c.close().await;
    sigterm_and_wait(s);

    // Recovery loads at most the budget; the rest is read back on demand.
    let s = start(&data, &tls, &budget);
    let c = client(&s, &tls).await;
    let metrics = http_get(s.metrics, "/metrics");
    assert!(
        counter(&metrics, "ps_rows_recovered_total") <= 100.0,
        "{metrics}"
    );
    let restarted = pull(&c, &ids).await.unwrap();
    assert_eq!(before, restarted, "rows differ after restart");
    c.close().await;
    sigterm_and_wait(s);
}
