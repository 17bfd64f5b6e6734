//! [`ClusterArgs`]: which parameter servers a trainer connects to, and resolving their names.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// Connection flags: which servers, which TLS material.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Parameter servers as `host:port` (IP or DNS name, e.g. the pods of a headless Service), comma separated,
    /// in shard order; a shard with replicas lists them separated by `/` (`a0/a1,b0/b1`,
    /// docs/replication.md). Names are resolved when connecting.
    #[arg(long, value_delimiter = ',', required = true, env = "TRAINER_PS")]
    pub ps: Vec<String>,
    /// Send pulls to an in-sync backup of each replicated shard (pushes always go to the primary).
    #[arg(long, env = "TRAINER_READ_FROM_BACKUPS")]
    pub read_from_backups: bool,
    /// TLS directory with ca.pem, client.pem and client.key.
    #[arg(long, env = "TRAINER_TLS_DIR")]
    pub tls_dir: PathBuf,
    /// Name the servers' certificates carry (the TLS server name sent to every server).
    #[arg(long, default_value = protocol::transport::tls::DEFAULT_SERVER_NAME, env = "TRAINER_SERVER_NAME")]
    pub server_name: String,
    /// Seconds to keep retrying `--ps` names that do not resolve yet (DNS records of pods appear as they
    /// start) [default: 0 = one attempt].
    #[arg(long, default_value_t = 0.0, env = "TRAINER_RESOLVE_TIMEOUT_SECS")]
    pub resolve_timeout_secs: f64,
    /// Transport to the servers: quic, or tcp (TLS over TCP on the same port, for networks that block UDP;
    /// servers serve both by default).
    #[arg(long, default_value = "quic", env = "TRAINER_TRANSPORT")]
    pub transport: protocol::Transport,
}

/// Resolves each `--ps` entry (a shard: `host:port`, or its replicas `host:port/host:port...`) to the first
/// address of each replica, in order. Retries names that do not resolve for up to `timeout` (1 s apart); the
/// error names the entry that failed.
pub async fn resolve_servers(
    entries: &[String],
    timeout: Duration,
) -> Result<Vec<Vec<SocketAddr>>, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut shards = Vec::with_capacity(entries.len());
    for shard in entries {
        let replicas =
            protocol::cluster::split_replicas(shard.trim()).map_err(|e| e.to_string())?;
        let addrs = resolve_all(&replicas, deadline).await;
        shards.push(addrs.map_err(|e| match replicas.len() {
            1 => e,
            _ => format!("--ps entry {:?}: {e}", shard.trim()),
        })?);
    }
    Ok(shards)
}

async fn resolve_all(
    entries: &[&str],
    deadline: tokio::time::Instant,
) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let entry = entry.trim();
        if let Ok(addr) = entry.parse::<SocketAddr>() {
            out.push(addr);
            continue;
        }
        loop {
            let why = match tokio::net::lookup_host(entry).await {
                Ok(mut addrs) => match addrs.next() {
                    Some(addr) => {
                        out.push(addr);
                        break;
                    }
                    None => "no addresses".to_string(),
                },
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "parameter server {entry:?} does not resolve (expected host:port): {why}"
                ));
            }
            tracing::info!(
                entry,
                why,
                "parameter server name does not resolve yet, retrying"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(out)
}
