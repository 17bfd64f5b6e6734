//! Helpers shared by the tests that run the real `ps-server` binary on loopback.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::compression::codec;
use protocol::wire::layout::put_ids;
use protocol::{
    Encoding, InitConfig, OptimizerConfig, ProtocolError, PsClient, PsClientConfig, TableConfig,
    TableCount,
};

/// A running server process; killed on drop if a test fails before stopping it.
pub struct Server {
    pub child: Child,
    pub quic: SocketAddr,
    pub metrics: SocketAddr,
}

/// Starts `ps-server` (shard 0 of 1, free ports) on `data` with the TLS material in `tls` and `extra` flags,
/// and waits for its ready line.
pub fn start(data: &Path, tls: &Path, extra: &[&str]) -> Server {
    start_shard(data, tls, 0, 1, extra)
}

/// Like [`start`] as shard `index` of `num`.
pub fn start_shard(data: &Path, tls: &Path, index: u32, num: u32, extra: &[&str]) -> Server {
    spawn(data, tls, index, num, extra, &[])
}

/// [`start_shard`] with extra environment variables for the server process.
fn spawn(
    data: &Path,
    tls: &Path,
    index: u32,
    num: u32,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> Server {
    spawn_at("127.0.0.1:0", data, tls, (index, num), extra, env)
}

/// [`start_shard`] (`shard` = (index, num)) listening on `listen`, with extra environment variables: a
/// server restarted where its peers and the persisted shard map expect it.
pub fn spawn_at(
    listen: &str,
    data: &Path,
    tls: &Path,
    (index, num): (u32, u32),
    extra: &[&str],
    env: &[(&str, &Path)],
) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args([
            "--listen",
            listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data)
        .arg("--tls-dir")
        .arg(tls)
        .args(["--shard-index", &index.to_string()])
        .args(["--num-shards", &num.to_string()])
        .args(extra)
        .envs(env.iter().copied())
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

/// SIGTERM, then waits up to 30 s for a clean exit (status 0).
pub fn sigterm_and_wait(mut s: Server) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
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

/// SIGKILL: no drain, no shutdown write-back.
pub fn sigkill_and_wait(mut s: Server) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "ps-server survived SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to 30 s for the server to exit by itself, and returns its exit code (`None`: killed by a signal).
pub fn wait_for_exit(mut s: Server) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "ps-server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `f` every 50 ms until it holds, failing the test after 15 s.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `text` as the failpoint file `fail` a server watches (`ps_server::failpoints`), and waits until
/// the server acknowledges that it applied it. Written beside and renamed, so the server never reads half.
pub fn set_failpoints(fail: &Path, text: &str) {
    let tmp = fail.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, fail).unwrap();
    wait_for_ack(fail, text);
}

/// Waits until the server acknowledges that it applied `text` from its failpoint file `fail`.
pub fn wait_for_ack(fail: &Path, text: &str) {
    let ack = ps_server::failpoints::applied_path(fail);
    wait_for("the server to apply its failpoint file", || {
        let got = std::fs::read_to_string(&ack).unwrap_or_default();
        assert!(!got.starts_with("error:"), "{got}");
        got == text
    });
}

/// One HTTP/1.0 GET; the whole response, headers included.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The table every test uses: id 3, dim 8, row-wise Adagrad.
pub fn table() -> TableConfig {
    TableConfig {
        optimizer: OptimizerConfig::RowAdagrad {
            lr: 0.05,
            eps: 1e-8,
            initial_accumulator: 0.0,
        },
        init: InitConfig::uniform(0.1),
        seed: 42,
        ..TableConfig::new(3, "C3", 8)
    }
}

/// A client of the one server.
pub async fn client(s: &Server, tls: &Path) -> PsClient {
    PsClient::connect(PsClientConfig::new(vec![s.quic], tls.to_owned()))
        .await
        .unwrap()
}

/// Header counts for `n` ids of table 3.
pub fn counts(n: usize) -> Vec<TableCount> {
    vec![TableCount {
        table: 3,
        count: n as u32,
        dim: 8,
    }]
}

/// Pulls rows of table 3 as f32.
pub async fn pull(c: &PsClient, ids: &[u64]) -> Result<Bytes, ProtocolError> {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    c.pull(0, Encoding::F32, counts(ids.len()), payload.into())
        .await
}

/// Pushes f32 gradient rows of table 3 (grad_scale 1); returns (rows applied, rows rejected).
pub async fn push(c: &PsClient, ids: &[u64], grads: &[f32]) -> (u64, u64) {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    codec::encode(grads, Encoding::F32, &mut payload);
    c.push(0, Encoding::F32, 1.0, counts(ids.len()), payload.into())
        .await
        .unwrap()
}

/// Directories under `dir`: server data, the cluster's TLS material, and a "foreign" TLS directory that trusts
/// the cluster CA but whose client certificate another CA signed.
pub fn dirs_with_foreign_client(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (data, tls, foreign) = (dir.join("data"), dir.join("tls"), dir.join("foreign"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    protocol::transport::tls::init_dev_certs(&foreign, &[]).unwrap();
    std::fs::copy(tls.join("ca.pem"), foreign.join("ca.pem")).unwrap();
    (data, tls, foreign)
}

/// [`start`] with extra environment variables for the server process (e.g. fault injection). Set on the
/// command only: a server that another test starts meanwhile does not inherit them.
pub fn start_with_env(data: &Path, tls: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Server {
    spawn(data, tls, 0, 1, extra, env)
}

/// A client of the one server that gives up on transient failures after `retry_for` (zero: no retries).
pub async fn client_retrying_for(s: &Server, tls: &Path, retry_for: Duration) -> PsClient {
    let mut cfg = PsClientConfig::new(vec![s.quic], tls.to_owned());
    cfg.retry_for = retry_for;
    PsClient::connect(cfg).await.unwrap()
}

/// A bare QUIC connection to the server with the cluster's client certificate, for writing raw bytes.
pub async fn raw_connection(s: &Server, tls: &Path) -> (quinn::Endpoint, quinn::Connection) {
    let cfg = protocol::transport::tls::client_config(tls, protocol::Role::Trainer).unwrap();
    let endpoint = protocol::transport::endpoint::client(s.quic, cfg).unwrap();
    let conn = endpoint
        .connect(s.quic, protocol::transport::tls::DEFAULT_SERVER_NAME)
        .unwrap()
        .await
        .unwrap();
    (endpoint, conn)
}

/// Writes `bytes` on a new stream, finishes it, and reads the server's one-frame answer.
pub async fn raw_request(
    conn: &quinn::Connection,
    bytes: &[u8],
) -> Result<(protocol::Response, Bytes), ProtocolError> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    // The server may refuse early and stop reading: a failed write still leaves its answer to read.
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    protocol::transport::stream::read_frame(&mut recv, protocol::wire::frame::DEFAULT_MAX_FRAME)
        .await
}

/// The typed error of a raw answer (panics on anything else).
pub fn error_code(
    answer: Result<(protocol::Response, Bytes), ProtocolError>,
) -> (protocol::ErrorCode, String) {
    match answer {
        Ok((protocol::Response::Error { code, message }, _)) => (code, message),
        other => panic!("expected a typed error, got {other:?}"),
    }
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM` = peak RSS).
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The value of an unlabelled metric in a `/metrics` page (0 if absent).
pub fn metric(s: &Server, name: &str) -> f64 {
    let page = http_get(s.metrics, "/metrics");
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A table `id` of dimension `dim` with SGD at learning rate 1 and zero rows: every pushed gradient is
/// subtracted exactly (sums of small integers are exact in f32), so rows count what was applied.
pub fn counter_table(id: u32, dim: u32) -> TableConfig {
    TableConfig {
        name: format!("counter{id}"),
        ..TableConfig::counter(id, dim as usize)
    }
}
