//! `ps-bench` flags ([`LoadArgs`]) and their validation into a [`LoadConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use protocol::cluster::ShardAddrs;
use protocol::{Encoding, InitConfig, OptimizerConfig, TableConfig, Transport};
use serde::Serialize;

/// How ids are drawn within a table's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Zipf over ranks `1..=vocab` with exponent `--zipf-s` (rank 1 most frequent).
    Zipf,
    /// Uniform over `1..=vocab`.
    Uniform,
}

/// Which requests each batch sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mix {
    /// Pulls only.
    Pull,
    /// Pushes only.
    Push,
    /// A pull then a push of the same batch, like a training step.
    Both,
}

impl Mix {
    /// Whether batches are pulled.
    pub fn pulls(self) -> bool {
        matches!(self, Mix::Pull | Mix::Both)
    }

    /// Whether batches are pushed.
    pub fn pushes(self) -> bool {
        matches!(self, Mix::Push | Mix::Both)
    }
}

/// Server-side optimizer of the benchmark's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    /// Plain SGD (what the Redis baseline does).
    Sgd,
    /// Row-wise Adagrad (the trainer's default).
    RowAdagrad,
}

/// Load generator for parameter servers: pulls and pushes embedding rows at a running cluster, a local one it
/// starts, or an in-process engine, and reports rows/s and latency percentiles.
#[derive(Debug, Clone, clap::Parser)]
#[command(version, about)]
pub struct LoadArgs {
    /// QUIC addresses of a running cluster, in shard order (comma-separated); the replicas of one shard
    /// separated by `/`, in replica order (`a0/a1,b0/b1`; docs/replication.md).
    #[arg(long, value_delimiter = ',', requires = "tls_dir")]
    pub ps: Vec<ShardAddrs>,
    /// TLS directory with `ca.pem`, `client.pem`, `client.key` (with `--ps`).
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// Start N `ps-server` processes on loopback (the binary next to `ps-bench`), and stop them at the end.
    /// With `--replicas R`: N shards of R replicas each (N x R processes).
    #[arg(long, conflicts_with = "ps")]
    pub local_cluster: Option<usize>,
    /// Replicas per shard of the local cluster (`--local-cluster`); 2 or more start each replica with
    /// `--replica-index r --replicas <its shard's addresses>` on pre-picked ports (docs/replication.md).
    #[arg(long, default_value_t = 1, requires = "local_cluster")]
    pub replicas: usize,
    /// `--durability` of the local cluster's servers: none, periodic, sync or replicated (default: the
    /// server's own default, periodic).
    #[arg(long, requires = "local_cluster")]
    pub durability: Option<String>,
    /// One more flag for every local server, as one argument (repeatable), e.g.
    /// `--server-arg=--flush-interval-secs=2`.
    #[arg(long, requires = "local_cluster", allow_hyphen_values = true)]
    pub server_arg: Vec<String>,
    /// Run against an in-process engine over an in-memory store: no network, no codec (the upper limit).
    #[arg(long, conflicts_with_all = ["ps", "local_cluster"])]
    pub in_process: bool,
    /// Transport to the servers: quic, or tcp (TLS over TCP on the same port).
    #[arg(long, default_value = "quic")]
    pub transport: Transport,
    /// Number of tables.
    #[arg(long, default_value_t = 26)]
    pub tables: u32,
    /// Row dimension.
    #[arg(long, default_value_t = 16)]
    pub dim: u32,
    /// Ids drawn per table per batch, before deduplication.
    #[arg(long, default_value_t = 2048)]
    pub ids_per_table: usize,
    /// Id distribution.
    #[arg(long, value_enum, default_value_t = Distribution::Zipf)]
    pub distribution: Distribution,
    /// Zipf exponent.
    #[arg(long, default_value_t = 1.1)]
    pub zipf_s: f64,
    /// Vocabulary per table.
    #[arg(long, default_value_t = 10_000_000)]
    pub vocab: u64,
    /// Batches in flight at once (each one its own task).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Requests per batch.
    #[arg(long, value_enum, default_value_t = Mix::Both)]
    pub mix: Mix,
    /// Row and gradient encoding on the wire: f32, f16, bf16 or int8 (one f32 scale per row).
    #[arg(long, default_value = "f16")]
    pub codec: Encoding,
    /// Optimizer of the tables the benchmark registers.
    #[arg(long, value_enum, default_value_t = Optimizer::RowAdagrad)]
    pub optimizer: Optimizer,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Seconds run before measuring (not counted).
    #[arg(long, default_value_t = 1.0)]
    pub warmup_seconds: f64,
    /// Seed of the id draws and gradients.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Distinct batches generated before the run and cycled through, so that generating ids does not take
    /// the client's CPU during the measurement.
    #[arg(long, default_value_t = 32)]
    pub pool_batches: usize,
    /// Push every pooled batch once before the run, so that pulls read stored rows (as a trainer's pulls
    /// mostly do) instead of initializing rows never pushed (a pull does not create rows).
    #[arg(long)]
    pub populate: bool,
    /// Before measuring, push ranks `1..=N` of every table once (the ids the sampler draws from, see
    /// `workload::table_id`), 4096 per table per request, so that every table holds exactly N rows (most of
    /// them in RocksDB when N is above a server's `--memory-budget-rows`). At most `--vocab`.
    #[arg(long)]
    pub populate_rows: Option<u64>,
    /// Send each worker's batch `j + P` as a prefetch (`protocol::wire::message::prefetch`) before pulling batch `j`,
    /// off the worker's critical path, as a trainer planning ahead would; 0 = no prefetch. Before the clock
    /// starts each worker prefetches its batches `0..=P` and waits for them (the steady state of a trainer's
    /// plan stage), so the figures are not the cold start of the first pulls. Network targets only.
    #[arg(long, default_value_t = 0)]
    pub prefetch_distance: u64,
    /// Open loop: start batches on a fixed schedule of R batches per second over all workers (batch `i` of
    /// the run at `i / R` seconds, worker `w` taking `w, w + C, ...`) instead of as soon as the previous one
    /// finished, and measure each pull from its batch's scheduled start, so time spent behind schedule counts
    /// (no coordinated omission). Latency at a fixed offered load, below the closed loop's maximum. 0 = closed
    /// loop. Network targets only.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress line every second.
    #[arg(long)]
    pub quiet: bool,
}

/// Where the load goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// A running cluster.
    Cluster {
        /// QUIC addresses in shard order, each shard's replicas in replica order.
        shards: Vec<Vec<SocketAddr>>,
        /// TLS directory.
        tls_dir: PathBuf,
    },
    /// Local `ps-server` processes started by the benchmark.
    Local {
        /// Shards.
        shards: usize,
        /// Replicas per shard.
        replicas: usize,
        /// Flags for every server (`--durability` and `--server-arg`).
        server_args: Vec<String>,
    },
    /// An in-process engine.
    InProcess,
}

/// Validated settings.
#[derive(Debug, Clone, Serialize)]
pub struct LoadConfig {
    /// Target, for the report ("cluster", "local-cluster", "in-process").
    pub target: String,
    /// Servers (0 in process): shards.
    pub servers: usize,
    /// Replicas per shard (1 without replication; of a running cluster, the most any shard lists).
    pub replicas: usize,
    /// `--durability` of the local cluster's servers (`None`: their default, or a cluster not started here).
    pub durability: Option<String>,
    /// Transport to the servers (unused in process).
    #[serde(serialize_with = "display")]
    pub transport: Transport,
    /// Tables.
    pub tables: u32,
    /// Row dimension.
    pub dim: u32,
    /// Ids drawn per table per batch.
    pub ids_per_table: usize,
    /// Id distribution.
    pub distribution: Distribution,
    /// Zipf exponent (ignored for uniform).
    pub zipf_s: f64,
    /// Vocabulary per table.
    pub vocab: u64,
    /// Batches in flight.
    pub concurrency: usize,
    /// Requests per batch.
    pub mix: Mix,
    /// Wire encoding.
    #[serde(serialize_with = "display")]
    pub codec: Encoding,
    /// Table optimizer.
    pub optimizer: Optimizer,
    /// Measured seconds.
    pub seconds: f64,
    /// Warm-up seconds.
    pub warmup_seconds: f64,
    /// Seed.
    pub seed: u64,
    /// Pre-generated batches.
    pub pool_batches: usize,
    /// Every pooled batch pushed once before the run.
    pub populate: bool,
    /// Ranks `1..=N` of every table pushed once before the run (0 = none).
    pub populate_rows: u64,
    /// Prefetch distance in batches (0 = no prefetch).
    pub prefetch_distance: u64,
    /// Offered batches per second, open loop (0 = closed loop).
    pub rate: f64,
    /// Progress line.
    #[serde(skip)]
    pub progress: bool,
    /// Where the load goes.
    #[serde(skip)]
    pub where_to: Target,
}

impl LoadConfig {
    /// The tables both drivers use: ids `0..tables`, named `C1..`.
    pub fn table_configs(&self) -> Vec<TableConfig> {
        (0..self.tables)
            .map(|t| TableConfig {
                optimizer: match self.optimizer {
                    Optimizer::Sgd => OptimizerConfig::Sgd { lr: 0.01 },
                    Optimizer::RowAdagrad => OptimizerConfig::RowAdagrad {
                        lr: 0.05,
                        eps: 1e-8,
                        initial_accumulator: 0.0,
                    },
                },
                init: InitConfig::uniform((1.0 / self.dim as f32).sqrt()),
                seed: t as u64,
                ..TableConfig::new(t, format!("C{}", t + 1), self.dim as usize)
            })
            .collect()
    }
}

fn display<S: serde::Serializer>(e: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(e)
}

impl LoadArgs {
    /// Checks the flags.
    pub fn validate(&self) -> anyhow::Result<LoadConfig> {
        if self.local_cluster.is_none()
            && (self.replicas != 1 || self.durability.is_some() || !self.server_arg.is_empty())
        {
            bail!("--replicas, --durability and --server-arg configure the servers of --local-cluster N");
        }
        let where_to = if self.in_process {
            Target::InProcess
        } else if let Some(n) = self.local_cluster {
            if n == 0 {
                bail!("--local-cluster must be at least 1");
            }
            if self.replicas == 0 {
                bail!("--replicas must be at least 1");
            }
            if let Some(d) = &self.durability {
                if !["none", "periodic", "sync", "replicated"].contains(&d.as_str()) {
                    bail!("--durability {d}: expected none, periodic, sync or replicated");
                }
            }
            let mut server_args = Vec::new();
            if let Some(d) = &self.durability {
                server_args.extend(["--durability".to_owned(), d.clone()]);
            }
            server_args.extend(self.server_arg.iter().cloned());
            Target::Local {
                shards: n,
                replicas: self.replicas,
                server_args,
            }
        } else if !self.ps.is_empty() {
            Target::Cluster {
                shards: protocol::cluster::shards(&self.ps),
                tls_dir: self.tls_dir.clone().context("--ps needs --tls-dir")?,
            }
        } else {
            bail!("say where to send load: --ps ADDR,.. --tls-dir DIR, --local-cluster N or --in-process");
        };
        if self.tables == 0 || self.dim == 0 || self.ids_per_table == 0 {
            bail!("--tables, --dim and --ids-per-table must be at least 1");
        }
        if self.dim as usize > embedding::MAX_DIM {
            bail!(
                "--dim {} is above the maximum {}",
                self.dim,
                embedding::MAX_DIM
            );
        }
        if self.vocab == 0 {
            bail!("--vocab must be at least 1");
        }
        if self.concurrency == 0 || self.pool_batches == 0 {
            bail!("--concurrency and --pool-batches must be at least 1");
        }
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            bail!("--seconds must be positive, got {}", self.seconds);
        }
        if !(self.warmup_seconds >= 0.0 && self.warmup_seconds.is_finite()) {
            bail!("--warmup-seconds must be >= 0, got {}", self.warmup_seconds);
        }
        if self.distribution == Distribution::Zipf
            && !(self.zipf_s > 0.0 && self.zipf_s.is_finite())
        {
            bail!("--zipf-s must be positive, got {}", self.zipf_s);
        }
        let populate_rows = self.populate_rows.unwrap_or(0);
        if populate_rows > self.vocab {
            bail!(
                "--populate-rows {populate_rows} is above --vocab {}: the sampler never draws those ids",
                self.vocab
            );
        }
        if self.in_process && self.prefetch_distance > 0 {
            bail!(
                "--prefetch-distance needs servers: the in-process engine keeps every row in memory (a \
                 MemStore, no capacity tier), so there is nothing to prefetch"
            );
        }
        if !(self.rate >= 0.0 && self.rate.is_finite()) {
            bail!("--rate must be >= 0 batches per second, got {}", self.rate);
        }
        if self.in_process && self.rate > 0.0 {
            bail!(
                "--rate (open loop) needs servers: the in-process driver runs a closed loop only"
            );
        }
        let (target, servers, replicas) = match &where_to {
            Target::Cluster { shards, .. } => (
                "cluster",
                shards.len(),
                shards.iter().map(Vec::len).max().unwrap_or(1),
            ),
            Target::Local {
                shards, replicas, ..
            } => ("local-cluster", *shards, *replicas),
            Target::InProcess => ("in-process", 0, 1),
        };
        Ok(LoadConfig {
            target: target.into(),
            servers,
            replicas,
            durability: self.durability.clone(),
            transport: self.transport,
            tables: self.tables,
            dim: self.dim,
            ids_per_table: self.ids_per_table,
            distribution: self.distribution,
            zipf_s: self.zipf_s,
            vocab: self.vocab,
            concurrency: self.concurrency,
            mix: self.mix,
            codec: self.codec,
            optimizer: self.optimizer,
            seconds: self.seconds,
            warmup_seconds: self.warmup_seconds,
            seed: self.seed,
            pool_batches: self.pool_batches,
            populate: self.populate,
            populate_rows,
            prefetch_distance: self.prefetch_distance,
            rate: self.rate,
            progress: !self.quiet,
            where_to,
        })
    }
}
