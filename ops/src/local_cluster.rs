//! Local parameter-server processes on loopback, for the demo, load generators, the Python helper and tests.
//!
//! Each server is a real `ps-server` process ([`ps_server_binary`], or whatever command the caller gives)
//! with its own RocksDB directory, free ports (port 0, read back from the server's
//! "ps-server ready quic=.. metrics=.." line) and logs in `<run-dir>/ps-<i>.log`; the dev CA and certificates
//! come from the binary's own `certs init`. [`LocalCluster::shutdown`] sends SIGTERM and checks that every
//! server exits cleanly; dropping the cluster kills what is left. This module starts the binary: it does not
//! link the server, so a trainer using it carries no server code and no RocksDB.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Environment variable naming the `ps-server` binary to start; unset, [`ps_server_binary`] looks beside
/// the running executable.
pub const PS_SERVER_ENV: &str = "PSTRAIN_PS_SERVER";

/// The `ps-server` binary: [`PS_SERVER_ENV`] if set, else `ps-server` in the running executable's directory
/// or its parent (a test binary runs from `target/<profile>/deps/`, the binaries sit in `target/<profile>/`).
pub fn ps_server_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(PS_SERVER_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{PS_SERVER_ENV}={} is not a file", path.display());
        }
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locate the running binary")?;
    let dir = exe
        .parent()
        .context("the running binary has no directory")?;
    let candidates = [Some(dir), dir.parent()];
    for dir in candidates.into_iter().flatten() {
        let path = dir.join("ps-server");
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "ps-server binary not found beside {}: build it with `cargo build --release -p ps-server` (or \
         `cargo build --release --workspace --bins`), or name it in {PS_SERVER_ENV}",
        exe.display()
    )
}

/// A running set of local servers.
pub struct LocalCluster {
    children: Vec<Child>,
    /// QUIC addresses, in shard order.
    pub quic: Vec<SocketAddr>,
    /// Metrics (HTTP) addresses, in shard order.
    pub metrics: Vec<SocketAddr>,
    /// TLS directory shared by servers and clients.
    pub tls_dir: PathBuf,
}

impl LocalCluster {
    /// Starts `n` [`ps_server_binary`] processes under `run_dir`: see [`LocalCluster::start_with`].
    pub fn start(n: usize, run_dir: &Path, extra: &[String]) -> anyhow::Result<LocalCluster> {
        let bin = ps_server_binary()?;
        LocalCluster::start_with(&|| Ok(Command::new(&bin)), n, run_dir, extra)
    }

    /// Starts `n` servers under `run_dir` (created; a dev CA and certificates in `run_dir/tls`, made by the
    /// command's `certs init`), with `extra` flags for every server, and waits until each reports ready.
    /// `command` builds the command that runs one server (the flags are appended to it).
    pub fn start_with(
        command: &dyn Fn() -> anyhow::Result<Command>,
        n: usize,
        run_dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<LocalCluster> {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("create run dir {}", run_dir.display()))?;
        let tls_dir = run_dir.join("tls");
        let mut certs = command()?;
        let out = certs
            .args([OsString::from("certs"), "init".into(), "--tls-dir".into()])
            .arg(&tls_dir)
            .output()
            .context("run ps-server certs init")?;
        if !out.status.success() {
            bail!(
                "ps-server certs init --tls-dir {} failed ({}): {}",
                tls_dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut cluster = LocalCluster {
            children: Vec::new(),
            quic: Vec::new(),
            metrics: Vec::new(),
            tls_dir: tls_dir.clone(),
        };
        for i in 0..n {
            let log_path = run_dir.join(format!("ps-{i}.log"));
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("create {}", log_path.display()))?;
            let mut cmd = command()?;
            cmd.args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
                .arg("--data-dir")
                .arg(run_dir.join(format!("ps-{i}")))
                .arg("--tls-dir")
                .arg(&tls_dir)
                .args([
                    "--shard-index",
                    &i.to_string(),
                    "--num-shards",
                    &n.to_string(),
                ])
                .args(extra)
                .stdout(Stdio::piped())
                .stderr(log);
            let mut child = cmd.spawn().context("spawn ps-server")?;
            let stdout = child.stdout.take().expect("piped");
            cluster.children.push(child);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = tx.send(line);
            });
            let line = rx.recv_timeout(Duration::from_secs(120)).map_err(|_| {
                anyhow::anyhow!(
                    "ps-server {i} did not report ready within 120 s; see {}",
                    log_path.display()
                )
            })?;
            let field = |key: &str| -> anyhow::Result<SocketAddr> {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .with_context(|| {
                        format!(
                            "ps-server {i} printed {line:?} instead of its ready line; see {}",
                            log_path.display()
                        )
                    })?
                    .parse()
                    .with_context(|| format!("address in {line:?}"))
            };
            cluster.quic.push(field("quic=")?);
            cluster.metrics.push(field("metrics=")?);
        }
        Ok(cluster)
    }

    /// Process ids, in shard order.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Sends SIGTERM to every server and waits (up to `timeout`) for each to exit; fails unless all exit 0.
    pub fn shutdown(mut self, timeout: Duration) -> anyhow::Result<()> {
        for c in &self.children {
            // SAFETY: kill(2) with a pid we spawned and have not reaped; no memory is touched.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + timeout;
        let mut failures = Vec::new();
        for (i, c) in self.children.iter_mut().enumerate() {
            loop {
                match c.try_wait().context("wait for ps-server")? {
                    Some(status) if status.success() => break,
                    Some(status) => {
                        failures.push(format!("ps-server {i} exited with {status}"));
                        break;
                    }
                    None if Instant::now() > deadline => {
                        let _ = c.kill();
                        failures.push(format!(
                            "ps-server {i} still running {timeout:?} after SIGTERM; killed"
                        ));
                        break;
                    }
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        self.children.clear();
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
        Ok(())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
