//! `ps-audit`: counts acknowledged updates independently of any model. `run` pushes `+1` increments to counter
//! rows on every server and logs each acknowledged push; `verify` compares the log with the counters. See
//! `bench::audit`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bench::audit::{self, AckLog, AuditRows, LogHeader, PushConfig};
use clap::{Args, Parser, Subcommand};
use protocol::cluster::ShardAddrs;
use protocol::{PsClient, PsClientConfig};

/// Audit of acknowledged pushes against the parameter servers' counters.
#[derive(Debug, Parser)]
#[command(name = "ps-audit", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Push increments and log every acknowledged push, until SIGTERM/SIGINT or --duration-secs.
    Run {
        #[command(flatten)]
        common: Common,
        /// Milliseconds to pause between the pushes to one server.
        #[arg(long, default_value_t = 5)]
        pause_ms: u64,
        /// Seed of the incremented row subsets.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Stop after this many seconds (default: run until signalled).
        #[arg(long)]
        duration_secs: Option<f64>,
    },
    /// Pull the counters and compare them with the log; prints `lost_acked_updates=N duplicates=N
    /// max_pause_s=X` last (X: the longest gap between two acknowledged pushes of one shard, within one life
    /// of the auditor), then `unacked_pushes=N unacked_applied=N` (pushes sent and never acknowledged, and
    /// those of them applied: not duplicates).
    Verify {
        #[command(flatten)]
        common: Common,
        /// Also write the verdict (every row) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
struct Common {
    /// Shards in shard order, comma separated; the replicas of one shard separated by `/`, in replica order
    /// (`a0/a1,b0/b1`; docs/replication.md).
    #[arg(long, required = true, value_delimiter = ',')]
    ps: Vec<ShardAddrs>,
    /// TLS directory with ca.pem, client.pem and client.key.
    #[arg(long)]
    tls_dir: PathBuf,
    /// Name the servers' certificates carry.
    #[arg(long, default_value = protocol::transport::tls::DEFAULT_SERVER_NAME)]
    server_name: String,
    /// The acknowledgement log (appended to by `run`, read by `verify`).
    #[arg(long)]
    log: PathBuf,
    /// Counter rows per server (1..=64); must be the same for every run and the verify of one log.
    #[arg(long, default_value_t = 16)]
    rows_per_server: usize,
}

impl Common {
    async fn connect(&self) -> anyhow::Result<(PsClient, AuditRows, LogHeader)> {
        let rows = AuditRows::new(self.ps.len(), self.rows_per_server)?;
        let header = LogHeader {
            servers: self.ps.len(),
            rows_per_server: self.rows_per_server,
        };
        let mut cfg =
            PsClientConfig::replicated(protocol::cluster::shards(&self.ps), self.tls_dir.clone());
        cfg.server_name = self.server_name.clone();
        let client = PsClient::connect(cfg)
            .await
            .context("connect to the parameter servers")?;
        client
            .register_tables(&[audit::audit_table()])
            .await
            .context("register the audit table")?;
        Ok((client, rows, header))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start tokio runtime")
        .and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ps-audit: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            common,
            pause_ms,
            seed,
            duration_secs,
        } => {
            let (client, rows, header) = common.connect().await?;
            let log = AckLog::open(&common.log, header)?;
            let stop = Arc::new(AtomicBool::new(false));
            let stopper = stop.clone();
            tokio::spawn(async move {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("install SIGTERM handler");
                let limit = async {
                    match duration_secs {
                        Some(s) => tokio::time::sleep(Duration::from_secs_f64(s)).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                    _ = limit => {}
                }
                stopper.store(true, Ordering::Relaxed);
            });
            println!(
                "ps-audit running servers={} rows-per-server={} log={}",
                rows.num_servers(),
                rows.rows_per_server(),
                common.log.display()
            );
            let client = Arc::new(client);
            let cfg = PushConfig {
                pause: Duration::from_millis(pause_ms),
                seed,
            };
            let log = Arc::new(log);
            let totals =
                audit::pusher::run(client.clone(), Arc::new(rows), log.clone(), cfg, stop).await?;
            log.close()?;
            client.close().await;
            println!(
                "ps-audit pushed acked={} increments={} failed={}",
                totals.acked, totals.increments, totals.failed
            );
            Ok(())
        }
        Command::Verify { common, json } => {
            let (client, rows, header) = common.connect().await?;
            let (found_header, records) = audit::log::read_records(&common.log)?;
            let acks = audit::log::acks(&records);
            anyhow::ensure!(
                found_header == header,
                "{} was written for {found_header:?}, verify was asked for {header:?}",
                common.log.display()
            );
            let found = audit::verify::pull_counters(&client, &rows)
                .await
                .context("pull the audit counters")?;
            client.close().await;
            let unacked = audit::verify::unacknowledged(header.servers, &records);
            let mut verdict = audit::verify::compare(&rows, &acks, &unacked, &found);
            verdict.max_pause = audit::pause::max_pause(header.servers, &records);
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&verdict)?;
                std::fs::write(&path, text + "\n")
                    .with_context(|| format!("write {}", path.display()))?;
            }
            println!("{}", verdict.line());
            Ok(())
        }
    }
}
