//! Helpers shared by the end-to-end process tests: generated Criteo data, the workspace's binaries, `trainer
//! demo` runs, local clusters of `ps-server` processes.
// Each test target uses its own subset.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use bench::gen::{Encoding, Generator, Sink};

/// Seed of the generator's planted click model in every test.
pub const TEACHER_SEED: u64 = 7;

/// Writes `rows` generated rows to `path` and the teacher's probabilities to `path.oracle`, which it returns.
pub fn generate(rows: u64, seed: u64, path: &Path) -> PathBuf {
    let oracle = path.with_extension("oracle");
    let mut data = Sink::new(File::create(path).unwrap(), Encoding::for_path(path)).unwrap();
    let mut probs = Sink::new(File::create(&oracle).unwrap(), Encoding::for_path(&oracle)).unwrap();
    Generator::new(seed, TEACHER_SEED)
        .write(rows, &mut data, Some(&mut probs))
        .unwrap();
    data.finish().unwrap();
    probs.finish().unwrap();
    oracle
}

/// The trainer binary, told to start the workspace's `ps-server` binary for its demo clusters.
pub fn trainer() -> Command {
    let mut cmd = bench::bins::command("trainer");
    cmd.env(local_cluster::PS_SERVER_ENV, bench::bins::path("ps-server"));
    cmd
}

/// Starts `n` real `ps-server` processes under `run_dir` with `extra` flags (data directories
/// `run_dir/ps-<i>`, which may hold a restored snapshot already). Their checkpoint root is the folder holding
/// `run_dir` (the test's temporary folder, where its checkpoints go).
pub fn start_servers(n: usize, run_dir: &Path, extra: &[String]) -> local_cluster::LocalCluster {
    let bin = bench::bins::path("ps-server");
    let mut flags = vec![
        "--checkpoint-root".to_owned(),
        run_dir.parent().unwrap_or(run_dir).display().to_string(),
    ];
    flags.extend(extra.iter().cloned());
    local_cluster::LocalCluster::start_with(&|| Ok(Command::new(&bin)), n, run_dir, &flags).unwrap()
}

/// Restores `n` servers' data directories `run_dir/ps-<i>` from the snapshot `snapshot` (a checkpoint's `ps/`)
/// with `ps-server restore`, for [`start_servers`].
pub fn restore_servers(snapshot: &Path, n: usize, run_dir: &Path) {
    for i in 0..n {
        let out = bench::bins::command("ps-server")
            .arg("restore")
            .arg("--from")
            .arg(snapshot)
            .args([
                "--num-shards",
                &n.to_string(),
                "--shard-index",
                &i.to_string(),
            ])
            .arg("--data-dir")
            .arg(run_dir.join(format!("ps-{i}")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ps-server restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Reads a summary JSON.
pub fn summary(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `trainer demo ARGS --train TRAIN --test TEST` with its servers and summary under `dir`, asserts that it
/// succeeded, and returns its summary and standard error.
pub fn run_demo(
    dir: &Path,
    train: &Path,
    test: &Path,
    args: &[&str],
) -> (serde_json::Value, String) {
    let (train, test) = (train.to_str().unwrap(), test.to_str().unwrap());
    demo(dir, &[args, &["--train", train, "--test", test]].concat())
}

/// Runs `trainer demo ARGS` with its data, servers and summary under `dir`, asserts that it succeeded, and returns
/// its summary and standard error.
pub fn demo(dir: &Path, args: &[&str]) -> (serde_json::Value, String) {
    let json = dir.join("summary.json");
    let out = trainer()
        .arg("demo")
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .arg("--summary-json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "trainer demo failed: {stderr}");
    (summary(&json), stderr)
}

/// Exact ROC AUC of `scores` against `labels` (ties count one half), by the trainer's evaluator
/// (`model::eval::auc`, the one AUC of the workspace); `None` if a class is absent.
pub fn auc(scores: &[f64], labels: &[bool]) -> Option<f64> {
    let scores: Vec<f32> = scores.iter().map(|&s| s as f32).collect();
    let labels: Vec<f32> = labels.iter().map(|&l| f32::from(u8::from(l))).collect();
    model::eval::auc(&scores, &labels)
}

/// A running `ps-serve` process, killed when dropped.
pub struct Serve {
    /// The process.
    pub child: std::process::Child,
    /// Its HTTP address.
    pub addr: std::net::SocketAddr,
}

impl Serve {
    /// Starts `ps-serve ARGS --listen 127.0.0.1:0` and waits until `/readyz` answers 200 (the export loaded).
    pub fn start(args: &[&str]) -> Serve {
        let serve = Serve::spawn(args);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while http(serve.addr, "GET", "/readyz", None, b"").0 != 200 {
            assert!(
                std::time::Instant::now() < deadline,
                "ps-serve not ready in 120 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        serve
    }

    /// Starts `ps-serve ARGS --listen 127.0.0.1:0` and returns once it listens (its HTTP endpoint answers
    /// before an export is loaded).
    pub fn spawn(args: &[&str]) -> Serve {
        use std::io::BufRead;
        let mut child = bench::bins::command("ps-serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("ps-serve printed nothing").unwrap();
        let addr = first
            .strip_prefix("ps-serve listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .parse()
            .unwrap();
        // Keep draining its standard output so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Serve { child, addr }
    }

    /// Sends SIGTERM and returns the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request (`Connection: close`) to `addr`: returns the status and the body. `content_type`
/// `None` sends no such header.
pub fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let header = content_type.map(|ct| format!("Content-Type: {ct}"));
    http_with(addr, method, path, header.as_slice(), body)
}

/// [`http`] with any extra header lines (`"Name: value"`); status 0 when the connection was closed first.
pub fn http_with(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[impl AsRef<str>],
    body: &[u8],
) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h.as_ref());
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    if s.write_all(head.as_bytes()).is_err() || s.write_all(body).is_err() {
        return (0, String::new());
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The probabilities `ps-serve` at `addr` answers for `lines` (Criteo TSV with labels, which are stripped),
/// `chunk` rows per request.
pub fn predict_lines(addr: std::net::SocketAddr, lines: &[String], chunk: usize) -> Vec<f64> {
    let mut probs = Vec::with_capacity(lines.len());
    for part in lines.chunks(chunk) {
        let body: Vec<&str> = part
            .iter()
            .map(|l| l.split_once('\t').map_or("", |(_, rest)| rest))
            .collect();
        let (status, answer) = http(
            addr,
            "POST",
            "/v1/predict",
            Some("text/tab-separated-values"),
            body.join("\n").as_bytes(),
        );
        assert_eq!(status, 200, "{answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        probs.extend(
            v["probabilities"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_f64().unwrap()),
        );
    }
    probs
}

/// The lines of a text file.
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The longest wait of the process tests' conditions: only a bound on a hung test, far above what any machine
/// needs.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(90);

/// Polls `cond` every 50 ms until it holds; past [`DEADLINE`] fails naming `what` and `why()`.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool, why: impl Fn() -> String) {
    let start = std::time::Instant::now();
    while !cond() {
        if start.elapsed() > DEADLINE {
            panic!("waited {DEADLINE:?} for {what}: {}", why());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Sends `req` to `addr` on a fresh QUIC connection presenting the certificate of `role` from `tls_dir`
/// (`protocol::transport::tls::init_certs` writes one per role), dialing `server_name`; the answer's header.
pub async fn call_as(
    addr: std::net::SocketAddr,
    tls_dir: &Path,
    server_name: &str,
    role: protocol::Role,
    req: &protocol::Request,
    payload: Vec<u8>,
) -> protocol::Response {
    use protocol::transport::{Connection, Dialer};
    let dialer = protocol::Transport::Quic
        .dialer(addr, tls_dir, role)
        .unwrap();
    let conn = dialer.connect(addr, server_name, 64 << 20).await.unwrap();
    let (resp, _) = conn
        .call(addr, req, &bytes::Bytes::from(payload))
        .await
        .unwrap();
    conn.close();
    resp
}

/// Writes into `dir` a model spec of the flags' DLRM (26 one-hot features, each on its own table `C<k>` of
/// dimension `bottom`'s last size) whose tables store their rows alternately as bf16 and f16 (issue 43), every
/// third one with Adam and its moments in bf16 (`state_precision`), and returns its path: one run covers every
/// half precision.
pub fn half_precision_spec(dir: &Path, bottom: &[usize], top: &[usize]) -> String {
    let list = |v: &[usize]| {
        v.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "name = \"half\"\nbottom_mlp = [{}]\ntop_mlp = [{}]\n[sparse]\ndim = {}\n",
        list(bottom),
        list(top),
        bottom.last().unwrap()
    );
    for k in 1..=26 {
        let precision = if k % 2 == 1 { "bf16" } else { "f16" };
        text += &format!(
            "[[feature]]\ncolumn = \"C{k}\"\ntable = \"C{k}\"\nprecision = \"{precision}\"\n"
        );
        // Every third table: Adam with its moments in bf16 too (`state_precision`).
        if k % 3 == 0 {
            text += "optimizer = \"adam\"\nlr = 0.01\nstate_precision = \"bf16\"\n";
        }
    }
    let path = dir.join("half-precision.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}
