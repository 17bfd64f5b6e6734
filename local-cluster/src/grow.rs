//! Growing a local cluster live: one more server started as a standby (`--standby`), which owns nothing until
//! `ps-server reshard` moves virtual shards to it.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Instant;

use anyhow::Context;

use super::{LocalCluster, Server, READY_TIMEOUT};

impl LocalCluster {
    /// Starts server `n` (the next index) as a standby under the cluster's run directory, with the flags
    /// `extra`, and waits until it is ready; returns its QUIC address (also appended to
    /// [`LocalCluster::quic`]). Clusters of one replica per shard only.
    pub fn add_standby(&mut self, extra: &[String]) -> anyhow::Result<SocketAddr> {
        anyhow::ensure!(
            self.replicas_per_shard() <= 1,
            "standby servers join clusters of one replica per shard"
        );
        let i = self.quic.len();
        let run_dir = self
            .tls_dir
            .parent()
            .context("the TLS directory lies in the run directory")?
            .to_owned();
        let name = format!("ps-{i}");
        let mut args: Vec<OsString> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            run_dir.join(&name).into(),
            "--tls-dir".into(),
            self.tls_dir.clone().into(),
            "--shard-index".into(),
            i.to_string().into(),
            "--num-shards".into(),
            (i + 1).to_string().into(),
            "--standby".into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        let mut server = Server {
            child: None,
            args,
            log_path: run_dir.join(format!("{name}.log")),
            name,
            role: None,
        };
        let rx = server.spawn(&self.template)?;
        let ready = server.await_ready(&rx, Instant::now() + READY_TIMEOUT)?;
        self.servers.push(server);
        self.quic.push(ready.quic);
        self.metrics.push(ready.metrics);
        self.replicas.push(vec![ready.quic]);
        self.replica_metrics.push(vec![ready.metrics]);
        Ok(ready.quic)
    }
}
