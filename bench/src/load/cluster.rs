//! Local `ps-server` processes on loopback for `ps-bench --local-cluster N`: the `ps-server` binary next to
//! `ps-bench`, with dev certificates, RocksDB directories and logs in a temporary directory. The processes are
//! managed by [`ps_server::local::LocalCluster`] (SIGTERM and a clean-exit check on shutdown, kill on drop).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};

/// Running local servers and the temporary directory they live in.
pub struct LocalCluster {
    servers: ps_server::local::LocalCluster,
    /// QUIC addresses in shard order.
    pub quic: Vec<SocketAddr>,
    // Dropped after `servers` (fields drop in order), so no server outlives its directory.
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
        let command = || Ok(Command::new(&bin));
        let servers = ps_server::local::LocalCluster::start_with(&command, n, dir.path(), &[])?;
        Ok(LocalCluster {
            quic: servers.quic.clone(),
            servers,
            dir,
        })
    }

    /// The TLS directory servers and client share.
    pub fn tls_dir(&self) -> PathBuf {
        self.servers.tls_dir.clone()
    }

    /// The temporary directory (logs `ps-<i>.log`, data, TLS).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Sends SIGTERM to every server and waits up to `timeout` for each; fails unless all exit 0.
    pub fn shutdown(self, timeout: Duration) -> anyhow::Result<()> {
        self.servers.shutdown(timeout)
    }
}
