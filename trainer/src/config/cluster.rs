//! [`ClusterArgs`]: which parameter servers a trainer connects to (their names are resolved by
//! [`protocol::cluster::resolve_servers`]).

use std::path::PathBuf;

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
