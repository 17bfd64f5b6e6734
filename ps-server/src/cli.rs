//! Command line of the `ps-server` binary: serve (the default), or manage certificates.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Durability, FileConfig};

/// A parameter server: serves a shard of the embedding tables over QUIC.
#[derive(Debug, Parser)]
#[command(name = "ps-server", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or issue TLS certificates.
    Certs {
        #[command(subcommand)]
        action: CertsAction,
    },
}

#[derive(Debug, Subcommand)]
enum CertsAction {
    /// Create a development CA plus a server certificate (localhost, 127.0.0.1, ::1 and --name) and a client
    /// certificate in DIR; existing files are kept.
    Init {
        /// TLS directory.
        #[arg(long)]
        tls_dir: PathBuf,
        /// Extra DNS names or IPs for the server certificate (repeatable).
        #[arg(long = "name")]
        names: Vec<String>,
    },
    /// Issue a certificate signed by the CA in DIR (overwrites server.pem/key or client.pem/key).
    Issue {
        /// TLS directory holding ca.pem and ca.key.
        #[arg(long)]
        tls_dir: PathBuf,
        /// Which certificate.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// DNS names or IPs (repeatable; the first is the common name).
        #[arg(long = "name", required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RoleArg {
    Server,
    Client,
}

/// Flags of the serve command; each overrides the TOML file's field of the same name.
#[derive(Debug, Args)]
struct ServeArgs {
    /// TOML config file with the same fields as the flags (kebab-case).
    #[arg(long, env = "PS_CONFIG")]
    config: Option<PathBuf>,
    /// QUIC listen address (UDP) [default: 127.0.0.1:7000].
    #[arg(long, env = "PS_LISTEN")]
    listen: Option<SocketAddr>,
    /// HTTP address for /metrics, /healthz, /readyz [default: 127.0.0.1:9100].
    #[arg(long, env = "PS_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// RocksDB data directory.
    #[arg(long, env = "PS_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// This server's shard index [default: 0].
    #[arg(long, env = "PS_SHARD_INDEX")]
    shard_index: Option<u32>,
    /// Take the shard index from the trailing `-<ordinal>` of the hostname ($HOSTNAME, the pod name in a
    /// StatefulSet: ps-2 serves shard 2); wins over the config file's shard-index.
    #[arg(
        long,
        env = "PS_SHARD_INDEX_FROM_HOSTNAME",
        conflicts_with = "shard_index"
    )]
    shard_index_from_hostname: bool,
    /// Number of servers [default: 1].
    #[arg(long, env = "PS_NUM_SHARDS")]
    num_shards: Option<u32>,
    /// Shard-map epoch [default: 1].
    #[arg(long, env = "PS_EPOCH")]
    epoch: Option<u64>,
    /// TLS directory (ca.pem, server.pem, server.key).
    #[arg(long, env = "PS_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// Cap on a request frame in bytes [default: 67108864].
    #[arg(long, env = "PS_MAX_FRAME_BYTES")]
    max_frame_bytes: Option<u64>,
    /// Seconds between write-backs of dirty rows [default: 30; 0 = only at shutdown and on request].
    #[arg(long, env = "PS_FLUSH_INTERVAL_SECS")]
    flush_interval_secs: Option<f64>,
    /// Seconds allowed to drain in-flight requests at shutdown [default: 20].
    #[arg(long, env = "PS_DRAIN_TIMEOUT_SECS")]
    drain_timeout_secs: Option<f64>,
    /// Rows each table keeps in memory; past it, cold rows are evicted to RocksDB and read back on a miss
    /// [default: no budget].
    #[arg(long, env = "PS_MEMORY_BUDGET_ROWS")]
    memory_budget_rows: Option<u64>,
    /// When pushed rows reach RocksDB: none (memory only), periodic (every flush interval and at shutdown),
    /// sync (before each push is acknowledged) [default: periodic].
    #[arg(long, env = "PS_DURABILITY", value_enum)]
    durability: Option<Durability>,
    /// Create development certificates in --tls-dir if they are missing.
    #[arg(long)]
    dev_certs: bool,
    /// Development only: accept clients without a certificate signed by the cluster CA (logs a warning).
    #[arg(long)]
    insecure_dev: bool,
}

impl ServeArgs {
    fn to_file_config(&self) -> FileConfig {
        FileConfig {
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            data_dir: self.data_dir.clone(),
            shard_index: self.shard_index,
            num_shards: self.num_shards,
            epoch: self.epoch,
            tls_dir: self.tls_dir.clone(),
            max_frame_bytes: self.max_frame_bytes,
            flush_interval_secs: self.flush_interval_secs,
            drain_timeout_secs: self.drain_timeout_secs,
            memory_budget_rows: self.memory_budget_rows,
            durability: self.durability,
            insecure_dev: self.insecure_dev.then_some(true),
        }
    }
}

/// Resolves when SIGTERM or SIGINT arrives.
pub async fn termination_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}

/// Installs the log subscriber (RUST_LOG, default `info`), writing to stderr.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run_cli(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::Certs { action }) = cli.command {
        return match action {
            CertsAction::Init { tls_dir, names } => {
                protocol::tls::init_dev_certs(&tls_dir, &names)
                    .with_context(|| format!("create certificates in {}", tls_dir.display()))?;
                println!("certificates in {}", tls_dir.display());
                Ok(())
            }
            CertsAction::Issue {
                tls_dir,
                role,
                names,
            } => {
                let role = match role {
                    RoleArg::Server => protocol::tls::Role::Server,
                    RoleArg::Client => protocol::tls::Role::Client,
                };
                protocol::tls::issue(&tls_dir, role, &names)
                    .with_context(|| format!("issue certificate in {}", tls_dir.display()))?;
                println!(
                    "issued {role:?} certificate for {names:?} in {}",
                    tls_dir.display()
                );
                Ok(())
            }
        };
    }
    let args = cli.serve;
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let mut flags = args.to_file_config();
    if args.shard_index_from_hostname {
        let host = crate::config::hostname()?;
        flags.shard_index = Some(crate::config::shard_index_from_hostname(&host)?);
        tracing::info!(hostname = %host, shard_index = flags.shard_index, "shard index from hostname");
    }
    let cfg = file.overlay(flags).validate()?;
    if args.dev_certs {
        protocol::tls::init_dev_certs(&cfg.tls_dir, &[])
            .with_context(|| format!("create dev certificates in {}", cfg.tls_dir.display()))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ps-worker")
        .build()
        .context("start tokio runtime")?;
    runtime.block_on(crate::server::run(cfg, termination_signal(), |bound| {
        // One machine-readable line on stdout, so launchers using port 0 learn the ports.
        println!(
            "ps-server ready quic={} metrics={}",
            bound.quic, bound.metrics
        );
    }))
}

/// Entry point of the binary: parses `args`, runs, and returns the process exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    init_logging();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match run_cli(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ps-server: error: {e:#}");
            1
        }
    }
}
