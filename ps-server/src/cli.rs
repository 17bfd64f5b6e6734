//! Command line of the `ps-server` binary: serve (the default), manage certificates, restore a snapshot onto
//! any number of servers ([`crate::restore`]), or size a deployment ([`crate::plan`]).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Durability, FileConfig, ServerTransport};

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
    /// Build the data directory of shard I of M servers from a snapshot taken on any number of servers
    /// (`PsClient::checkpoint`); then start `ps-server --data-dir OUT --shard-index I --num-shards M`.
    Restore(RestoreArgs),
    /// Print bytes per row, memory and disk totals and the servers needed for a table.
    Plan(PlanArgs),
    /// Grow or shrink a running cluster: move virtual shards between servers while training goes on
    /// (add servers at the end of --to, started with --standby; or drop the last ones, then stop them).
    Reshard(ReshardArgs),
    /// Operator's cold start of a replicated shard: make a replica that is still starting (it cannot hear
    /// from enough of its peers to elect a primary) the primary from its own disk. Admin certificate.
    Promote(PromoteArgs),
}

#[derive(Debug, Args)]
struct PromoteArgs {
    /// The replica to promote (host:port).
    #[arg(long)]
    ps: String,
    /// TLS directory with ca.pem and admin.pem/admin.key (or client.pem/client.key).
    #[arg(long, env = "PS_TLS_DIR")]
    tls_dir: PathBuf,
    /// Name the server's certificate carries [default: the host of --ps].
    #[arg(long)]
    server_name: Option<String>,
    /// Required: promoting a replica that is not the most recent one loses what the others acknowledged
    /// since (docs/replication.md, "Roles").
    #[arg(long, required = true)]
    force: bool,
}

#[derive(Debug, Args)]
struct ReshardArgs {
    /// The cluster's servers now, in shard order (host:port,...).
    #[arg(long, value_delimiter = ',', required = true)]
    ps: Vec<String>,
    /// The servers after the reshard: --ps with servers appended, or its first ones.
    #[arg(long, value_delimiter = ',', required = true)]
    to: Vec<String>,
    /// TLS directory with ca.pem and admin.pem/admin.key (or client.pem/client.key).
    #[arg(long, env = "PS_TLS_DIR")]
    tls_dir: PathBuf,
    /// Name the servers' certificates carry [default: the host of each server's address].
    #[arg(long)]
    server_name: Option<String>,
    /// Milliseconds between progress polls.
    #[arg(long, default_value_t = 200)]
    poll_ms: u64,
}

#[derive(Debug, Args)]
struct RestoreArgs {
    /// Snapshot (or export `ps/`) directory holding shard-<k>-of-<N>/ for every k; with --tensors, or a
    /// `.safetensors` file, tables as SafeTensors (docs/serving.md).
    #[arg(long)]
    from: PathBuf,
    /// Read each shard's tables.safetensors instead of its RocksDB (implied when --from is a file).
    #[arg(long)]
    tensors: bool,
    /// Servers of the restored cluster (M; any number, N included).
    #[arg(long)]
    num_shards: u32,
    /// The shard to build (0..M).
    #[arg(long)]
    shard_index: u32,
    /// Data directory to create (missing or empty); the server's --data-dir.
    #[arg(long)]
    data_dir: PathBuf,
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// Rows of the table (e.g. 10M, 2500000).
    #[arg(long, value_parser = crate::plan::parse_count)]
    rows: u64,
    /// Weights per row.
    #[arg(long)]
    dim: usize,
    /// The table's optimizer.
    #[arg(long, value_enum, default_value = "row-adagrad")]
    optimizer: crate::plan::PlanOptimizer,
    /// How the table stores its weights: f32, bf16 or f16 (its `precision`; optimizer state is f32).
    #[arg(long, value_parser = crate::plan::parse_precision, default_value = "f32")]
    precision: embedding::RowPrecision,
    /// How the table stores its optimizer's moments: f32 or bf16 (its `state_precision`; adam and adagrad
    /// only).
    #[arg(long, value_parser = crate::plan::parse_precision, default_value = "f32")]
    state_precision: embedding::RowPrecision,
    /// Bytes of RAM for the table over the whole cluster (e.g. 64GiB); rows past it stay on disk
    /// [default: every row in memory].
    #[arg(long, value_parser = crate::plan::parse_bytes)]
    memory_budget: Option<u64>,
    /// RAM of one server (e.g. 16GiB); 80% of it goes to rows.
    #[arg(long, value_parser = crate::plan::parse_bytes, default_value = "16GiB")]
    server_memory: u64,
    /// MiB of RocksDB block cache each server runs with (as `ps-server --block-cache-mib`).
    #[arg(long, default_value_t = 64)]
    block_cache_mib: u64,
}

#[derive(Debug, Subcommand)]
enum CertsAction {
    /// Create a development CA, a server certificate (localhost, 127.0.0.1, ::1 and --name) and one client
    /// certificate per role (trainer.pem, serving.pem, peer.pem, admin.pem) in DIR, valid for --days; files
    /// that exist are kept unless they expire within a day (or the server's lacks a --name).
    Init {
        /// TLS directory.
        #[arg(long)]
        tls_dir: PathBuf,
        /// Extra DNS names (wildcards such as *.ps too) or IPs for the server certificate (repeatable).
        #[arg(long = "name")]
        names: Vec<String>,
        /// The server certificate names only --name, not localhost, 127.0.0.1 and ::1: certificates like
        /// production's (clients then dial with --server-name).
        #[arg(long, requires = "names")]
        only_names: bool,
    },
    /// Issue one certificate signed by the CA in DIR: a server certificate (server.pem/key) for --name, or a
    /// client certificate of a role (<role>.pem/key, carrying the URI pstrain:role/<role>). Overwrites.
    Issue {
        /// TLS directory holding ca.pem and ca.key.
        #[arg(long)]
        tls_dir: PathBuf,
        /// Which certificate: server, or the client role (trainer, serving, peer, admin).
        #[arg(long, value_enum)]
        role: LeafArg,
        /// DNS names or IPs of a server certificate (repeatable; the first is the common name); a client
        /// certificate's common name.
        #[arg(long = "name")]
        names: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 90)]
        days: u32,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LeafArg {
    Server,
    Trainer,
    Serving,
    Peer,
    Admin,
}

impl LeafArg {
    fn leaf(self) -> protocol::transport::tls::Leaf {
        use protocol::transport::tls::Leaf;
        use protocol::Role;
        match self {
            LeafArg::Server => Leaf::Server,
            LeafArg::Trainer => Leaf::Client(Role::Trainer),
            LeafArg::Serving => Leaf::Client(Role::Serving),
            LeafArg::Peer => Leaf::Client(Role::Peer),
            LeafArg::Admin => Leaf::Client(Role::Admin),
        }
    }
}

/// Flags of the serve command; each overrides the TOML file's field of the same name.
#[derive(Debug, Args)]
struct ServeArgs {
    /// TOML config file with the same fields as the flags (kebab-case). Repeatable: each file's fields
    /// override the ones before (a deployment's base file, then an overlay's patch of it).
    #[arg(long, env = "PS_CONFIG", value_delimiter = ',')]
    config: Vec<PathBuf>,
    /// Listen address, UDP for QUIC and TCP for the TCP transport [default: 127.0.0.1:7000].
    #[arg(long, env = "PS_LISTEN")]
    listen: Option<SocketAddr>,
    /// Transports to serve on --listen: quic, tcp or both [default: both].
    #[arg(long, env = "PS_TRANSPORT", value_enum)]
    transport: Option<ServerTransport>,
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
    /// This server's index among its shard's replicas [default: 0].
    #[arg(long, env = "PS_REPLICA_INDEX")]
    replica_index: Option<u32>,
    /// Take the replica index from the trailing `-<ordinal>` of the hostname (pod ps-0-1 is replica 1 of its
    /// shard); wins over the config file's replica-index.
    #[arg(
        long,
        env = "PS_REPLICA_INDEX_FROM_HOSTNAME",
        conflicts_with = "replica_index"
    )]
    replica_index_from_hostname: bool,
    /// host:port of every replica of this server's shard, its own included, comma separated, in replica order
    /// (docs/replication.md) [default: none, one replica].
    #[arg(long, value_delimiter = ',', env = "PS_REPLICAS")]
    replicas: Option<Vec<String>>,
    /// TLS server name of the other replicas' certificates [default: the host of each --replicas entry].
    #[arg(long, env = "PS_REPLICA_SERVER_NAME")]
    replica_server_name: Option<String>,
    /// Seconds a starting replica waits for every peer before a cold start with a majority of them
    /// [default: 30].
    #[arg(long, env = "PS_REPLICA_STARTUP_WAIT_SECS")]
    replica_startup_wait_secs: Option<f64>,
    /// Directory checkpoints are written under (requests name a folder in it) [default: `checkpoints`
    /// beside --data-dir].
    #[arg(long, env = "PS_CHECKPOINT_ROOT")]
    checkpoint_root: Option<PathBuf>,
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
    /// MiB of RocksDB block cache shared by every table [default: 64].
    #[arg(long, env = "PS_BLOCK_CACHE_MIB")]
    block_cache_mib: Option<u64>,
    /// MiB the data directory's filesystem keeps free: a write finding less is refused before RocksDB runs out
    /// of space (pushes refused with Storage until space is freed); 0 for none [default: 256].
    #[arg(long, env = "PS_DISK_RESERVE_MIB")]
    disk_reserve_mib: Option<u64>,
    /// RocksDB column family setup: point-lookup (blooms, block hash index) or defaults [default:
    /// point-lookup].
    #[arg(long, env = "PS_ROCKSDB_TUNING", value_enum)]
    rocksdb_tuning: Option<crate::config::RocksdbTuning>,
    /// Seconds a prefetch's pins last at most when its trainer does not release them [default: 60].
    #[arg(long, env = "PS_PREFETCH_PIN_SECS")]
    prefetch_pin_secs: Option<u64>,
    /// When pushed rows reach RocksDB: none (memory only), periodic (every flush interval and at shutdown),
    /// sync (before each push is acknowledged), replicated (periodic, and each push is held by every in-sync
    /// backup before it is acknowledged) [default: periodic].
    #[arg(long, env = "PS_DURABILITY", value_enum)]
    durability: Option<Durability>,
    /// With --durability replicated, what a primary does while no backup is in sync: degrade (go on without
    /// a copy, ps_durability_degraded = 1) or refuse (refuse pushes until one is) [default: degrade].
    #[arg(long, env = "PS_REPLICATED_WITHOUT_BACKUP", value_enum)]
    replicated_without_backup: Option<crate::config::ReplicatedWithoutBackup>,
    /// Frequency admission for every table: an id gets a row at its N-th push; earlier pushes are dropped and
    /// pulls return the initializer [default: 0 = off].
    #[arg(long, env = "PS_ADMISSION_MIN_COUNT")]
    admission_min_count: Option<u32>,
    /// Counters per row of each table's admission sketch (4 rows) [default: 262144].
    #[arg(long, env = "PS_ADMISSION_SKETCH_WIDTH")]
    admission_sketch_width: Option<usize>,
    /// Delete rows no push touched for this many seconds, from memory and RocksDB [default: 0 = off].
    #[arg(long, env = "PS_ROW_TTL_SECS")]
    row_ttl_secs: Option<u64>,
    /// Seconds between expiry passes when a TTL is set [default: 60].
    #[arg(long, env = "PS_EXPIRE_INTERVAL_SECS")]
    expire_interval_secs: Option<f64>,
    /// Create development certificates in --tls-dir if they are missing.
    #[arg(long)]
    dev_certs: bool,
    /// Development only: accept clients without a certificate signed by the cluster CA (logs a warning).
    #[arg(long)]
    insecure_dev: bool,
    /// Start owning no virtual shards until `ps-server reshard` moves some here (a server added to a running
    /// cluster; give it the index it will have: --shard-index N --num-shards N+1).
    #[arg(long, env = "PS_STANDBY")]
    standby: bool,
    /// Bytes of requests (and, separately, of pull responses) handled at once; more wait [default: 256 MiB].
    #[arg(long, env = "PS_MAX_INFLIGHT_BYTES")]
    max_inflight_bytes: Option<u64>,
    /// Open connections; more are refused [default: 1024].
    #[arg(long, env = "PS_MAX_CONNECTIONS")]
    max_connections: Option<u64>,
    /// Concurrent requests per QUIC connection; more wait in the client [default: 32].
    #[arg(long, env = "PS_MAX_STREAMS_PER_CONNECTION")]
    max_streams_per_connection: Option<u32>,
    /// Unread bytes buffered per QUIC connection (flow-control window) [default: 32 MiB].
    #[arg(long, env = "PS_CONNECTION_WINDOW_BYTES")]
    connection_window_bytes: Option<u64>,
    /// Seconds a client has to complete its TLS handshake [default: 10].
    #[arg(long, env = "PS_HANDSHAKE_TIMEOUT_SECS")]
    handshake_timeout_secs: Option<f64>,
    /// Handshakes under way at once; one more drops the oldest [default: 256].
    #[arg(long, env = "PS_MAX_HANDSHAKES")]
    max_handshakes: Option<u64>,
    /// What a push may leave in a row: refuse an update to a non-finite value, or clamp weights
    /// [default: refuse].
    #[arg(long, env = "PS_WEIGHT_GUARD")]
    weight_guard: Option<crate::config::WeightGuardMode>,
    /// With --weight-guard clamp: the largest magnitude a weight may have [default: 1e6].
    #[arg(long, env = "PS_WEIGHT_CLAMP_ABS")]
    weight_clamp_abs: Option<f32>,
    /// Tables this server may hold; an admin certificate may register more [default: 512].
    #[arg(long, env = "PS_MAX_TABLES")]
    max_tables: Option<u64>,
    /// Largest dimension a trainer may register a table with; an admin certificate up to 4096 [default: 1024].
    #[arg(long, env = "PS_MAX_TABLE_DIM")]
    max_table_dim: Option<u64>,
    /// Tables one registration request may name [default: 256].
    #[arg(long, env = "PS_MAX_TABLES_PER_REQUEST")]
    max_tables_per_request: Option<u64>,
    /// Reduce groups (hybrid dense mode) held at once [default: 64].
    #[arg(long, env = "PS_MAX_REDUCE_GROUPS")]
    max_reduce_groups: Option<u64>,
    /// Bytes of reduce sums held; finalized steps kept for retries are dropped first [default: 2 GiB].
    #[arg(long, env = "PS_MAX_REDUCE_BYTES")]
    max_reduce_bytes: Option<u64>,
    /// Clients whose push answers are remembered, so a retried push is applied once [default: 1024].
    #[arg(long, env = "PS_PUSH_WINDOW_CLIENTS")]
    push_window_clients: Option<u64>,
    /// Push answers remembered per client [default: 1024; at least 16].
    #[arg(long, env = "PS_PUSH_WINDOW_PER_CLIENT")]
    push_window_per_client: Option<u64>,
    /// Seconds a request stream may make no progress before it is dropped [default: 30; 0 = no bound].
    #[arg(long, env = "PS_STREAM_IDLE_TIMEOUT_SECS")]
    stream_idle_timeout_secs: Option<f64>,
    /// Seconds between cuts of the delta sync to serving [default: 2; 0 = no change tracking, sync refused].
    #[arg(long, alias = "sync-interval", env = "PS_SYNC_INTERVAL_SECS")]
    sync_interval_secs: Option<f64>,
    /// Ids the delta sync's retained deltas hold at most; a subscriber further behind scans [default:
    /// 16777216].
    #[arg(long, env = "PS_SYNC_RETAIN_ROWS")]
    sync_retain_rows: Option<u64>,
}

impl ServeArgs {
    fn to_file_config(&self) -> FileConfig {
        FileConfig {
            listen: self.listen,
            transport: self.transport,
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
            replicated_without_backup: self.replicated_without_backup,
            insecure_dev: self.insecure_dev.then_some(true),
            standby: self.standby.then_some(true),
            admission_min_count: self.admission_min_count,
            admission_sketch_width: self.admission_sketch_width,
            row_ttl_secs: self.row_ttl_secs,
            expire_interval_secs: self.expire_interval_secs,
            max_inflight_bytes: self.max_inflight_bytes,
            max_connections: self.max_connections,
            max_streams_per_connection: self.max_streams_per_connection,
            connection_window_bytes: self.connection_window_bytes,
            handshake_timeout_secs: self.handshake_timeout_secs,
            max_handshakes: self.max_handshakes,
            stream_idle_timeout_secs: self.stream_idle_timeout_secs,
            weight_guard: self.weight_guard,
            weight_clamp_abs: self.weight_clamp_abs,
            max_tables: self.max_tables,
            max_table_dim: self.max_table_dim,
            max_tables_per_request: self.max_tables_per_request,
            max_reduce_groups: self.max_reduce_groups,
            max_reduce_bytes: self.max_reduce_bytes,
            push_window_clients: self.push_window_clients,
            push_window_per_client: self.push_window_per_client,
            block_cache_mib: self.block_cache_mib,
            disk_reserve_mib: self.disk_reserve_mib,
            rocksdb_tuning: self.rocksdb_tuning,
            prefetch_pin_secs: self.prefetch_pin_secs,
            sync_interval_secs: self.sync_interval_secs,
            sync_retain_rows: self.sync_retain_rows,
            replica_index: self.replica_index,
            replicas: self.replicas.clone(),
            replica_server_name: self.replica_server_name.clone(),
            checkpoint_root: self.checkpoint_root.clone(),
            replica_startup_wait_secs: self.replica_startup_wait_secs,
        }
    }
}

fn run_restore(a: RestoreArgs) -> anyhow::Result<()> {
    let restore = if a.tensors || a.from.is_file() {
        crate::restore::restore_tensors
    } else {
        crate::restore::restore
    };
    let stats = restore(&a.from, a.num_shards, a.shard_index, &a.data_dir).with_context(|| {
        format!(
            "restore shard {} of {} from {}",
            a.shard_index,
            a.num_shards,
            a.from.display()
        )
    })?;
    println!(
        "restored shard {} of {} from a snapshot of {} servers (step {}): {} tables, {} of {} rows into {}",
        a.shard_index,
        a.num_shards,
        stats.from_shards,
        stats.step,
        stats.tables,
        stats.rows_written,
        stats.rows_read,
        stats.db.display()
    );
    println!(
        "start it with: ps-server --data-dir {} --shard-index {} --num-shards {} ...",
        a.data_dir.display(),
        a.shard_index,
        a.num_shards
    );
    Ok(())
}

fn run_reshard(a: ReshardArgs) -> anyhow::Result<()> {
    let settings = crate::shard::reshard::PeerSettings {
        tls_dir: a.tls_dir,
        server_name: a.server_name,
        max_frame: protocol::wire::frame::DEFAULT_MAX_FRAME,
        role: protocol::Role::Admin,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let report = rt.block_on(crate::shard::reshard::coordinator::run(
        &a.ps,
        &a.to,
        &settings,
        std::time::Duration::from_millis(a.poll_ms.max(10)),
        |line| println!("{line}"),
    ))?;
    println!("{report}");
    Ok(())
}

fn run_promote(a: PromoteArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let epoch = rt.block_on(crate::shard::replica::startup::force_promote(
        &a.ps,
        &a.tls_dir,
        a.server_name.as_deref(),
        a.force,
    ))?;
    println!(
        "{} is the primary of its shard at shard epoch {epoch}",
        a.ps
    );
    Ok(())
}

fn run_plan(a: PlanArgs) -> anyhow::Result<()> {
    let plan = crate::plan::plan(crate::plan::PlanInput {
        rows: a.rows,
        dim: a.dim,
        optimizer: a.optimizer,
        precision: a.precision,
        state_precision: a.state_precision,
        memory_budget: a.memory_budget,
        server_memory: a.server_memory,
        block_cache_bytes: a.block_cache_mib << 20,
    })?;
    println!("{plan}");
    Ok(())
}

fn run_cli(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Restore(a)) => return run_restore(a),
        Some(Command::Plan(a)) => return run_plan(a),
        Some(Command::Reshard(a)) => return run_reshard(a),
        Some(Command::Promote(a)) => return run_promote(a),
        _ => {}
    }
    if let Some(Command::Certs { action }) = cli.command {
        return match action {
            CertsAction::Init {
                tls_dir,
                names,
                only_names,
            } => {
                if only_names {
                    protocol::transport::tls::init_certs(&tls_dir, &names)
                } else {
                    protocol::transport::tls::init_dev_certs(&tls_dir, &names)
                }
                .with_context(|| format!("create certificates in {}", tls_dir.display()))?;
                println!("certificates in {}", tls_dir.display());
                Ok(())
            }
            CertsAction::Issue {
                tls_dir,
                role,
                names,
                days,
            } => {
                if matches!(role, LeafArg::Server) && names.is_empty() {
                    anyhow::bail!("a server certificate needs at least one --name");
                }
                let validity = std::time::Duration::from_secs(u64::from(days) * 24 * 3600);
                protocol::transport::tls::issue(&tls_dir, role.leaf(), &names, validity)
                    .with_context(|| format!("issue certificate in {}", tls_dir.display()))?;
                let (file, _) = role.leaf().files();
                println!(
                    "issued {} for {role:?} ({names:?}, {days} days) in {}",
                    file,
                    tls_dir.display()
                );
                Ok(())
            }
        };
    }
    let args = cli.serve;
    let mut file = FileConfig::default();
    for path in &args.config {
        file = file.overlay(FileConfig::load(path)?);
    }
    let mut flags = args.to_file_config();
    if args.shard_index_from_hostname {
        let host = crate::config::hostname()?;
        flags.shard_index = Some(crate::config::shard_index_from_hostname(&host)?);
        tracing::info!(hostname = %host, shard_index = flags.shard_index, "shard index from hostname");
    }
    if args.replica_index_from_hostname {
        let host = crate::config::hostname()?;
        flags.replica_index = Some(crate::config::shard_index_from_hostname(&host)?);
        tracing::info!(hostname = %host, replica_index = flags.replica_index, "replica index from hostname");
    }
    let cfg = file.overlay(flags).validate()?;
    if args.dev_certs {
        protocol::transport::tls::init_dev_certs(&cfg.tls_dir, &[])
            .with_context(|| format!("create dev certificates in {}", cfg.tls_dir.display()))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ps-worker")
        .build()
        .context("start tokio runtime")?;
    runtime.block_on(crate::server::run(cfg, ops::shutdown::signal(), |bound| {
        // One machine-readable line on stdout, so launchers using port 0 learn the ports.
        let addr = |key: &str, a: Option<std::net::SocketAddr>| {
            a.map(|a| format!(" {key}={a}")).unwrap_or_default()
        };
        println!(
            "ps-server ready{}{} metrics={} role={}",
            addr("quic", bound.quic),
            addr("tcp", bound.tcp),
            bound.metrics,
            bound.role.name()
        );
    }))
}

/// Entry point of the binary: parses `args`, runs, and returns the process exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    ops::logging::init();
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
