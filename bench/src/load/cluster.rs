//! Local `ps-server` processes on loopback for `ps-bench --local-cluster N`: the `ps-server` binary next to
//! `ps-bench`, dev certificates and RocksDB directories in a temporary directory, free ports read back from each
//! server's "ps-server ready quic=.. metrics=.." line. [`LocalCluster::shutdown`] sends SIGTERM and checks that
//! every server exits 0; dropping the cluster kills what is left.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Running local servers.
pub struct LocalCluster {
    children: Vec<Child>,
    /// QUIC addresses in shard order.
    pub quic: Vec<SocketAddr>,
    dir: tempfile::TempDir,
}

/// The `ps-server` binary next to the running executable.
pub fn ps_server_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locate the running binary")?;
    let path = exe.with_file_name("ps-server");
    if !path.is_file() {
        bail!(
            "ps-server binary not found at {}: --local-cluster starts the ps-server next to ps-bench; build it \
             with `cargo build --release -p ps-server` (or `--workspace --bins`)",
            path.display()
        );
    }
    Ok(path)
}

impl LocalCluster {
    /// Starts `n` servers and waits until each reports ready.
    pub fn start(n: usize) -> anyhow::Result<LocalCluster> {
        let bin = ps_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("ps-bench-")
            .tempdir()
            .context("create a temporary directory")?;
        let tls_dir = dir.path().join("tls");
        protocol::tls::init_dev_certs(&tls_dir, &[]).context("create dev certificates")?;
        let mut cluster = LocalCluster {
            children: Vec::new(),
            quic: Vec::new(),
            dir,
        };
        for i in 0..n {
            let log_path = cluster.dir.path().join(format!("ps-{i}.log"));
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("create {}", log_path.display()))?;
            let mut child = Command::new(&bin)
                .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
                .arg("--data-dir")
                .arg(cluster.dir.path().join(format!("ps-{i}")))
                .arg("--tls-dir")
                .arg(&tls_dir)
                .args([
                    "--shard-index",
                    &i.to_string(),
                    "--num-shards",
                    &n.to_string(),
                ])
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .with_context(|| format!("spawn {}", bin.display()))?;
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
            let addr = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("quic="))
                .with_context(|| {
                    format!("ps-server {i} printed {line:?} instead of its ready line")
                })?;
            cluster.quic.push(
                addr.parse()
                    .with_context(|| format!("address in {line:?}"))?,
            );
        }
        Ok(cluster)
    }

    /// The TLS directory servers and client share.
    pub fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// The temporary directory (logs `ps-<i>.log`, data, TLS).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Sends SIGTERM to every server and waits up to `timeout` for each; fails unless all exit 0.
    pub fn shutdown(mut self, timeout: Duration) -> anyhow::Result<()> {
        for c in &self.children {
            // SAFETY: kill(2) on a pid we spawned and have not reaped; no memory is touched.
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
                        let _ = c.wait();
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
