//! The server's one typed config: TOML file, command-line flags and environment, merged then validated.
//!
//! Precedence: flag or environment variable > TOML file (`--config`) > default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Fields of the TOML config file; every field is optional and named as the flag it mirrors.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// Listen address: UDP for QUIC and TCP for the TCP transport, on the same port. Default `127.0.0.1:7000`.
    pub listen: Option<SocketAddr>,
    /// Transports served on `listen`: `quic`, `tcp` or `both`. Default `both`.
    pub transport: Option<ServerTransport>,
    /// HTTP listen address for `/metrics`, `/healthz`, `/readyz` (TCP). Default `127.0.0.1:9100`.
    pub metrics_listen: Option<SocketAddr>,
    /// Directory of the RocksDB database. Required.
    pub data_dir: Option<PathBuf>,
    /// This server's shard index, `0..num-shards`. Default 0.
    pub shard_index: Option<u32>,
    /// Number of servers in the cluster. Default 1.
    pub num_shards: Option<u32>,
    /// Shard-map epoch every request must carry. Default 1.
    pub epoch: Option<u64>,
    /// TLS directory (`ca.pem`, `server.pem`, `server.key`). Required.
    pub tls_dir: Option<PathBuf>,
    /// Cap on a request frame, bytes. Default 64 MiB.
    pub max_frame_bytes: Option<u64>,
    /// Seconds between write-backs of dirty rows to RocksDB (the bound on updates lost in a crash).
    /// Default 30: each write-back costs a RocksDB memtable insert per row dirtied since the last one
    /// (BENCHMARKS.md). 0 disables the timer (rows are still written at shutdown and on a flush request).
    pub flush_interval_secs: Option<f64>,
    /// Seconds allowed for in-flight requests to finish after SIGTERM. Default 20.
    pub drain_timeout_secs: Option<f64>,
    /// Rows each table keeps in memory, at least 1; past it, cold rows are evicted to RocksDB and read back on
    /// a miss (DESIGN.md, "RocksDB"). Applies to every table. Default: none (all rows stay in memory).
    pub memory_budget_rows: Option<u64>,
    /// When pushed rows reach RocksDB: `none`, `periodic` or `sync` (see [`Durability`]). Default `periodic`.
    pub durability: Option<Durability>,
    /// With `durability = "replicated"`: what a primary does while no backup is in sync, `degrade` (go on,
    /// `ps_durability_degraded` = 1) or `refuse` (refuse pushes until one is; needs `replicas`). Default
    /// `degrade`.
    pub replicated_without_backup: Option<ReplicatedWithoutBackup>,
    /// Development only: accept clients without a certificate signed by the cluster CA (the server still
    /// presents its own). Logs a warning at start. Default false.
    pub insecure_dev: Option<bool>,
    /// Start owning no virtual shards, at shard-map epoch 0, until `ps-server reshard` moves some here (a
    /// server added to a running cluster). Ignored once a reshard persisted a map. Default false.
    pub standby: Option<bool>,
    /// Frequency admission of every table this server registers: an id gets a row at its
    /// `admission-min-count`-th push; earlier pushes are dropped (counted in `ps_rows_rejected_admission_total`)
    /// and pulls return the initializer. Default 0: off.
    pub admission_min_count: Option<u32>,
    /// Counters per row of each table's count-min sketch (4 rows of 4 bytes each: 16 bytes per counter column),
    /// `1..=67108864`. Default 262144 (4 MiB per table).
    pub admission_sketch_width: Option<usize>,
    /// Rows of every table this server registers that no push touched for this many seconds are deleted from
    /// memory and RocksDB (counted in `ps_rows_expired_total`). Default 0: rows live forever.
    pub row_ttl_secs: Option<u64>,
    /// Seconds between expiry passes over tables with a TTL (each pass visits every row of those tables), > 0.
    /// Rows go between `row-ttl-secs` and `row-ttl-secs` + this after their last push. Default 60.
    pub expire_interval_secs: Option<f64>,
    /// Load limits (`crate::load_limits`): bytes of request bodies, and separately of pull responses,
    /// being handled at once; more waits. Default 256 MiB.
    pub max_inflight_bytes: Option<u64>,
    /// Open connections (QUIC and TCP); more are refused. Default 1024.
    pub max_connections: Option<u64>,
    /// Concurrent requests (QUIC streams) one connection may have open; more wait in the client. Default 32
    /// (a trainer keeps about 2 (k + 1) requests open per server). Each stream may buffer the connection
    /// window divided by this: with 256 a 0.9 MB push had 128 KiB of credit and waited for ~7 window updates
    /// from a busy server, which halved QUIC push throughput against TCP on one server core.
    pub max_streams_per_connection: Option<u32>,
    /// Unread bytes the server buffers per QUIC connection (flow-control window). Default 32 MiB.
    pub connection_window_bytes: Option<u64>,
    /// Seconds a client has to complete its TLS handshake (QUIC or TCP) after connecting; past it, the
    /// connection is dropped (`ps_handshakes_total{outcome="timeout"}`). > 0. Default 10.
    pub handshake_timeout_secs: Option<f64>,
    /// Handshakes under way at once (connections not yet authenticated, which hold no connection slot); when
    /// one more arrives, the oldest is dropped (`ps_handshakes_total{outcome="evicted"}`), so idle sockets
    /// cannot lock clients out. >= 1. Default 256.
    pub max_handshakes: Option<u64>,
    /// Seconds a request stream may make no progress (no byte of a request body arrives, or the client takes
    /// no byte of its reply) before it is dropped, releasing its in-flight bytes (`ps_stream_idle_timeouts_total`).
    /// QUIC resets the stream; TCP closes the connection. 0 = no bound. Default 30.
    pub stream_idle_timeout_secs: Option<f64>,
    /// What a push may leave in a row: `refuse` (an update that would leave a non-finite weight or optimizer
    /// state is undone, counted in `ps_rows_refused_nonfinite_weights_total`) or `clamp` (weights are kept
    /// within `weight-clamp-abs`, counted in `ps_rows_clamped_weights_total`; non-finite state is refused).
    /// Default `refuse`.
    pub weight_guard: Option<WeightGuardMode>,
    /// With `weight-guard = "clamp"`: the largest magnitude a weight may have, finite and > 0. Default 1e6.
    pub weight_clamp_abs: Option<f32>,
    /// Tables this server may hold; a trainer's registration that would pass it is refused whole
    /// (`ps_table_registrations_refused_total{reason="tables"}`); an admin certificate may pass it. >= 1.
    /// Default 512.
    pub max_tables: Option<u64>,
    /// Largest dimension a trainer may register a table with (`reason="dim"`); an admin certificate may go up
    /// to 4096. 1..=4096. Default 1024.
    pub max_table_dim: Option<u64>,
    /// Tables one registration request may name, whoever sends it (`reason="per_request"`). >= 1. Default 256.
    pub max_tables_per_request: Option<u64>,
    /// Reduce groups (hybrid dense mode) a server holds at once; a contribution to one more is refused
    /// (`ps_reduce_refused_total{reason="groups"}`). >= 1. Default 64.
    pub max_reduce_groups: Option<u64>,
    /// Bytes of reduce sums a server holds (open steps, and finalized ones kept for retries, which are dropped
    /// first); a new step past it is refused (`reason="bytes"`). >= 1 MiB. Default 2 GiB.
    pub max_reduce_bytes: Option<u64>,
    /// Clients whose push answers a server remembers (exactly-once pushes, `crate::shard::push_window`); the
    /// one idle longest is forgotten first (`ps_push_window_clients_evicted_total`). >= 1. Default 1024.
    pub push_window_clients: Option<u64>,
    /// Push answers remembered per client; a retry older than them is refused, never applied again
    /// (`ps_push_window_refused_total{reason="too_old"}`). >= 16. Default 1024.
    pub push_window_per_client: Option<u64>,
    /// MiB of RocksDB block cache, shared by every table (`crate::config::tier`). Default 64.
    pub block_cache_mib: Option<u64>,
    /// MiB the data directory's filesystem keeps free: a store write finding less is refused (a `Storage`
    /// error, pushes refused until space is freed) before RocksDB runs out of space; 0 for none. Default 256.
    pub disk_reserve_mib: Option<u64>,
    /// RocksDB column family setup: `point-lookup` (blooms, block hash index, memtable bloom: the capacity
    /// tier's reads) or `defaults` (RocksDB's own, for comparisons). Default `point-lookup`.
    pub rocksdb_tuning: Option<tier::RocksdbTuning>,
    /// Seconds a prefetch's pins last at most when no later prefetch of its trainer releases them, >= 1.
    /// Default 60.
    pub prefetch_pin_secs: Option<u64>,
    /// Seconds between cuts of the delta sync to serving (`crate::sync`): the changed rows are tracked and
    /// a delta is cut this often. Default 2; 0 turns tracking off (sync requests are refused).
    pub sync_interval_secs: Option<f64>,
    /// Ids the retained deltas of the delta sync hold at most (oldest dropped first; a subscriber further
    /// behind gets a full scan), >= 1. Default 16777216 (16 Mi ids, 128 MiB).
    pub sync_retain_rows: Option<u64>,
    /// This server's index among its shard's replicas, `0..replicas.len()`. Default 0.
    pub replica_index: Option<u32>,
    /// `host:port` of every replica of this server's shard, its own included, in replica order
    /// (`docs/replication.md`). Default none: one replica.
    pub replicas: Option<Vec<String>>,
    /// Name the other replicas' certificates carry (TLS server name when this server dials them). Default:
    /// the host of each replica's `replicas` entry (`ps-0-1.ps` of `ps-0-1.ps:7000`), as any TLS client
    /// verifies the name it dialed.
    pub replica_server_name: Option<String>,
    /// Directory checkpoints are written under: a `Checkpoint` request names a folder relative to it (or an
    /// absolute path inside it); anything else is refused. Default: `checkpoints` beside the data directory
    /// (`/var/lib/pstrain/checkpoints` for `data-dir = "/var/lib/pstrain/db"`), on the same file system so
    /// that a checkpoint's hard links work.
    pub checkpoint_root: Option<PathBuf>,
    /// Seconds a starting replica waits for every other replica of its shard to answer before a cold start
    /// with only a majority of them (`docs/replication.md`, "Roles"). With 2 replicas a majority is both, so
    /// a replica that cannot reach its peer never becomes primary by itself. Default 30.
    pub replica_startup_wait_secs: Option<f64>,
}

/// Which transports a server listens on; both use the `listen` address (UDP and TCP port of the same number).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ServerTransport {
    /// QUIC over UDP only.
    Quic,
    /// TLS over TCP only (networks that block UDP).
    Tcp,
    /// Both: clients choose.
    #[default]
    Both,
}

impl ServerTransport {
    /// Whether QUIC is served.
    pub fn quic(self) -> bool {
        self != ServerTransport::Tcp
    }

    /// Whether TCP is served.
    pub fn tcp(self) -> bool {
        self != ServerTransport::Quic
    }
}

/// When pushed rows reach RocksDB, and so what a crash (SIGKILL, power loss) can lose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// No write-back on the timer nor at shutdown: rows live in memory only, and a restart finds only what
    /// was written before (by a flush request, or eviction under a memory budget). Loss bound: everything.
    None,
    /// Dirty rows are written back every flush interval and at shutdown. Loss bound: the updates of the last
    /// flush interval (all of them if the timer is off).
    #[default]
    Periodic,
    /// Every acknowledged push is durable before its acknowledgement: the pushed rows (weights and optimizer
    /// state) are written with a synced RocksDB write before `Pushed` is sent. A failed write answers the push
    /// with a `Storage` error, but the rows were applied in memory and stay dirty, so the timer's write-back
    /// retries them. Loss bound: nothing acknowledged. Costs one WAL fsync per push.
    Sync,
    /// Every acknowledged push is held in memory by every in-sync backup of the shard before its
    /// acknowledgement (`docs/replication.md`); each replica writes back periodically as with `periodic`.
    /// Loss bound: nothing acknowledged unless every replica of the shard crashes within a flush interval.
    /// Without in-sync backups, as `periodic`, said by `ps_durability_degraded` (or pushes are refused:
    /// [`ReplicatedWithoutBackup`]).
    Replicated,
}

/// What a primary with `durability = "replicated"` does while no backup of its shard is in sync (all down, or
/// catching up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ReplicatedWithoutBackup {
    /// Go on acknowledging pushes with no copy (as `periodic`), with `ps_durability_degraded` at 1 and the
    /// `PstrainReplicatedDurabilityDegraded` alert: training goes on, a crash of the primary now loses what it
    /// has not written back.
    #[default]
    Degrade,
    /// Refuse pushes (`NoBackup`, transient: clients retry) until a backup is in sync again, counted in
    /// `ps_pushes_refused_no_backup_total`: nothing is acknowledged without a copy, and training waits.
    Refuse,
}

impl FileConfig {
    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    /// Overlays `other`'s set fields onto `self`.
    pub fn overlay(mut self, other: FileConfig) -> FileConfig {
        macro_rules! take {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f; } )* };
        }
        take!(
            listen,
            transport,
            metrics_listen,
            data_dir,
            shard_index,
            num_shards,
            epoch,
            tls_dir,
            max_frame_bytes,
            flush_interval_secs,
            drain_timeout_secs,
            memory_budget_rows,
            durability,
            replicated_without_backup,
            insecure_dev,
            standby,
            admission_min_count,
            admission_sketch_width,
            row_ttl_secs,
            expire_interval_secs,
            max_inflight_bytes,
            max_connections,
            max_streams_per_connection,
            connection_window_bytes,
            handshake_timeout_secs,
            max_handshakes,
            stream_idle_timeout_secs,
            weight_guard,
            weight_clamp_abs,
            max_tables,
            max_table_dim,
            max_tables_per_request,
            max_reduce_groups,
            max_reduce_bytes,
            push_window_clients,
            push_window_per_client,
            block_cache_mib,
            disk_reserve_mib,
            rocksdb_tuning,
            prefetch_pin_secs,
            sync_interval_secs,
            sync_retain_rows,
            replica_index,
            replicas,
            replica_server_name,
            checkpoint_root,
            replica_startup_wait_secs
        );
        self
    }

    /// Applies defaults and checks every field (the first invalid field, in the order below, is reported).
    pub fn validate(self) -> Result<ServerConfig, ConfigError> {
        let (shard_index, num_shards) = self.shard_position()?;
        let max_frame = self
            .max_frame_bytes
            .unwrap_or(protocol::wire::frame::DEFAULT_MAX_FRAME);
        if max_frame < 1024 {
            return Err(ConfigError::Invalid(format!(
                "max-frame-bytes = {max_frame}, expected at least 1024"
            )));
        }
        let admission = self.admission()?;
        let row_ttl_secs = self.row_ttl()?;
        let expire_interval = secs("expire-interval-secs", self.expire_interval_secs, 60.0)?;
        if expire_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "expire-interval-secs = 0, expected a number of seconds > 0".into(),
            ));
        }
        if self.memory_budget_rows == Some(0) {
            return Err(ConfigError::Invalid(
                "memory-budget-rows = 0, expected at least 1 (omit it for no budget)".into(),
            ));
        }
        let limits = self.load_limits()?;
        let connection_limits = self.connection_limits()?;
        let weight_guard = self.weight_guard()?;
        let registration_limits = self.registration_limits()?;
        let reduce_limits = self.reduce_limits()?;
        let push_window = self.push_window_limits()?;
        let tier = self.tier()?;
        let sync_interval = secs("sync-interval-secs", self.sync_interval_secs, 2.0)?;
        let sync_retain_rows = at_least(
            "sync-retain-rows",
            self.sync_retain_rows,
            crate::sync::DEFAULT_RETAIN_ROWS as u64,
            1,
        )? as usize;
        let (replica_index, replicas) = self.replica_position()?;
        let replicated_without_backup = self.replicated_without_backup.unwrap_or_default();
        if replicated_without_backup == ReplicatedWithoutBackup::Refuse && replicas.is_empty() {
            return Err(ConfigError::Invalid(
                "replicated-without-backup = \"refuse\" without replicas: every push would be refused; \
                 give --replicas, or leave it at \"degrade\""
                    .into(),
            ));
        }
        let replica_startup_wait = secs(
            "replica-startup-wait-secs",
            self.replica_startup_wait_secs,
            30.0,
        )?;
        let data_dir = self.data_dir.ok_or(ConfigError::Missing("data-dir"))?;
        let checkpoint_root = match self.checkpoint_root {
            Some(root) if root.as_os_str().is_empty() => {
                return Err(ConfigError::Invalid(
                    "checkpoint-root is empty, expected a directory".into(),
                ))
            }
            Some(root) => root,
            None => default_checkpoint_root(&data_dir),
        };
        if let Some(name) = self.replica_server_name.as_deref() {
            if rustls_pki_name(name).is_err() {
                return Err(ConfigError::Invalid(format!(
                    "replica-server-name = {name:?} is not a DNS name or IP address"
                )));
            }
        }
        Ok(ServerConfig {
            replica_index,
            replicas,
            replica_server_name: self.replica_server_name,
            replica_startup_wait,
            checkpoint_root,
            tier,
            sync_interval,
            sync_retain_rows,
            max_inflight_bytes: limits.max_inflight_bytes,
            max_connections: limits.max_connections,
            max_streams_per_connection: limits.max_streams_per_connection,
            connection_window_bytes: limits.connection_window_bytes,
            connection_limits,
            weight_guard,
            registration_limits,
            reduce_limits,
            push_window,
            memory_budget_rows: self.memory_budget_rows,
            durability: self.durability.unwrap_or_default(),
            replicated_without_backup,
            insecure_dev: self.insecure_dev.unwrap_or(false),
            standby: self.standby.unwrap_or(false),
            admission,
            row_ttl_secs,
            expire_interval,
            transport: self.transport.unwrap_or_default(),
            listen: self
                .listen
                .unwrap_or_else(|| "127.0.0.1:7000".parse().expect("valid")),
            metrics_listen: self
                .metrics_listen
                .unwrap_or_else(|| "127.0.0.1:9100".parse().expect("valid")),
            data_dir,
            shard_index,
            num_shards,
            epoch: self.epoch.unwrap_or(1),
            tls_dir: self.tls_dir.ok_or(ConfigError::Missing("tls-dir"))?,
            max_frame,
            flush_interval: secs("flush-interval-secs", self.flush_interval_secs, 30.0)?,
            drain_timeout: secs("drain-timeout-secs", self.drain_timeout_secs, 20.0)?,
        })
    }

    /// `(shard_index, num_shards)` with defaults `(0, 1)`; the index must lie below the count.
    fn shard_position(&self) -> Result<(u32, u32), ConfigError> {
        let num_shards = self.num_shards.unwrap_or(1);
        let shard_index = self.shard_index.unwrap_or(0);
        if num_shards == 0 {
            return Err(ConfigError::Invalid(
                "num-shards = 0, expected at least 1".into(),
            ));
        }
        if shard_index >= num_shards {
            return Err(ConfigError::Invalid(format!(
                "shard-index = {shard_index}, expected less than num-shards = {num_shards}"
            )));
        }
        Ok((shard_index, num_shards))
    }

    /// `(replica_index, replicas)`: no replicas by default; with a list, the index must lie in it and no
    /// address may repeat.
    fn replica_position(&self) -> Result<(u32, Vec<String>), ConfigError> {
        let index = self.replica_index.unwrap_or(0);
        let replicas: Vec<String> = self
            .replicas
            .iter()
            .flatten()
            .map(|r| r.trim().to_owned())
            .collect();
        if replicas.is_empty() {
            if index != 0 {
                return Err(ConfigError::Invalid(format!(
                    "replica-index = {index} without a replicas list: give every replica's address"
                )));
            }
            return Ok((0, replicas));
        }
        if replicas.len() > 64 {
            return Err(ConfigError::Invalid(format!(
                "replicas: {} addresses, expected at most 64",
                replicas.len()
            )));
        }
        if index as usize >= replicas.len() {
            return Err(ConfigError::Invalid(format!(
                "replica-index = {index}, expected less than the {} replicas listed",
                replicas.len()
            )));
        }
        for (i, r) in replicas.iter().enumerate() {
            if r.is_empty() || !r.contains(':') {
                return Err(ConfigError::Invalid(format!(
                    "replicas: entry {i} {r:?} is not host:port"
                )));
            }
            if replicas[..i].contains(r) {
                return Err(ConfigError::Invalid(format!("replicas: {r} listed twice")));
            }
        }
        Ok((index, replicas))
    }

    /// The admission filter: none with `admission-min-count` 0 (the default), else a sketch of the configured
    /// width.
    fn admission(&self) -> Result<Option<embedding::AdmissionConfig>, ConfigError> {
        let min_count = self.admission_min_count.unwrap_or(0);
        if min_count == 0 {
            return Ok(None);
        }
        let width = self.admission_sketch_width.unwrap_or(DEFAULT_SKETCH_WIDTH);
        if !(1..=embedding::MAX_SKETCH_WIDTH).contains(&width) {
            return Err(ConfigError::Invalid(format!(
                "admission-sketch-width = {width}, expected 1..={}",
                embedding::MAX_SKETCH_WIDTH
            )));
        }
        Ok(Some(embedding::AdmissionConfig {
            min_count,
            width,
            depth: SKETCH_DEPTH,
        }))
    }

    /// The row TTL in seconds: none with 0 (the default); at most `u32::MAX` (the width of a row's stamp).
    fn row_ttl(&self) -> Result<Option<u64>, ConfigError> {
        match self.row_ttl_secs.unwrap_or(0) {
            0 => Ok(None),
            t if t > u64::from(u32::MAX) => Err(ConfigError::Invalid(format!(
                "row-ttl-secs = {t}, expected at most {} (0 = off)",
                u32::MAX
            ))),
            t => Ok(Some(t)),
        }
    }

    /// The load limits ([`crate::load_limits`]) with their defaults and lower bounds; the connection window
    /// must hold 4 KiB per stream.
    fn load_limits(&self) -> Result<LoadLimitSettings, ConfigError> {
        let max_inflight_bytes = at_least(
            "max-inflight-bytes",
            self.max_inflight_bytes,
            256 << 20,
            1024,
        )?;
        let max_connections = at_least("max-connections", self.max_connections, 1024, 1)? as usize;
        let max_streams_per_connection = at_least(
            "max-streams-per-connection",
            self.max_streams_per_connection.map(u64::from),
            32,
            1,
        )? as u32;
        let connection_window_bytes = at_least(
            "connection-window-bytes",
            self.connection_window_bytes,
            32 << 20,
            64 << 10,
        )?;
        if connection_window_bytes < max_streams_per_connection as u64 * 4096 {
            return Err(ConfigError::Invalid(format!(
                "connection-window-bytes = {connection_window_bytes}, expected at least 4096 per stream \
                 (max-streams-per-connection = {max_streams_per_connection})"
            )));
        }
        Ok(LoadLimitSettings {
            max_inflight_bytes,
            max_connections,
            max_streams_per_connection,
            connection_window_bytes,
        })
    }
}

/// The validated load limits, as [`ServerConfig`] holds them.
struct LoadLimitSettings {
    max_inflight_bytes: u64,
    max_connections: usize,
    max_streams_per_connection: u32,
    connection_window_bytes: u64,
}

/// `v` seconds (default `default`) as a duration; refuses negative and non-finite values, naming `name`.
fn secs(name: &str, v: Option<f64>, default: f64) -> Result<Duration, ConfigError> {
    let v = v.unwrap_or(default);
    if !v.is_finite() || v < 0.0 {
        return Err(ConfigError::Invalid(format!(
            "{name} = {v}, expected a number of seconds >= 0"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// `v` (default `default`); refuses values below `min`, naming `name`.
fn at_least(name: &str, v: Option<u64>, default: u64, min: u64) -> Result<u64, ConfigError> {
    let v = v.unwrap_or(default);
    if v < min {
        return Err(ConfigError::Invalid(format!(
            "{name} = {v}, expected at least {min}"
        )));
    }
    Ok(v)
}

/// The shard index a StatefulSet pod carries in its name: the trailing `-<ordinal>` of `hostname`
/// (`ps-2` -> 2, `ps-2.ps.ns.svc` -> 2, the first label counts).
pub fn shard_index_from_hostname(hostname: &str) -> Result<u32, ConfigError> {
    let label = hostname.trim().split('.').next().unwrap_or("");
    label
        .rsplit_once('-')
        .and_then(|(_, ordinal)| {
            if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                ordinal.parse::<u32>().ok()
            }
        })
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "hostname {hostname:?} does not end in -<ordinal>, so it gives no shard index \
                 (expected a StatefulSet pod name such as ps-0)"
            ))
        })
}

/// This machine's hostname: `$HOSTNAME` (Kubernetes sets it to the pod name), else the kernel's.
pub fn hostname() -> Result<String, ConfigError> {
    if let Ok(h) = std::env::var("HOSTNAME") {
        if !h.trim().is_empty() {
            return Ok(h.trim().to_owned());
        }
    }
    let path = Path::new("/proc/sys/kernel/hostname");
    std::fs::read_to_string(path)
        .map(|h| h.trim().to_owned())
        .map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// `checkpoints` beside `data_dir` (`checkpoints` in the working directory for a data directory without a
/// parent).
pub fn default_checkpoint_root(data_dir: &Path) -> PathBuf {
    data_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("checkpoints")
}

/// Whether `name` is a TLS server name a client can verify (a DNS name or an IP address).
fn rustls_pki_name(name: &str) -> Result<(), ()> {
    protocol::transport::tls::server_name(name)
        .map(|_| ())
        .map_err(|_| ())
}

/// Default [`FileConfig::admission_sketch_width`].
pub const DEFAULT_SKETCH_WIDTH: usize = 1 << 18;
/// Rows (independent hashes) of each table's admission sketch.
pub const SKETCH_DEPTH: usize = 4;

/// Validated runtime settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// This server's index among its shard's replicas.
    pub replica_index: u32,
    /// `host:port` of every replica of the shard, in replica order (empty: one replica).
    pub replicas: Vec<String>,
    /// TLS server name of the other replicas; `None`: the host of each one's `replicas` entry.
    pub replica_server_name: Option<String>,
    /// How long a starting replica waits for every peer before a cold start with a majority.
    pub replica_startup_wait: Duration,
    /// Checkpoints are written under this directory only.
    pub checkpoint_root: PathBuf,
    /// Listen address (QUIC on UDP, TCP transport on TCP, same port).
    pub listen: SocketAddr,
    /// Transports served.
    pub transport: ServerTransport,
    /// HTTP listen address.
    pub metrics_listen: SocketAddr,
    /// RocksDB directory.
    pub data_dir: PathBuf,
    /// This server's shard.
    pub shard_index: u32,
    /// Servers in the cluster.
    pub num_shards: u32,
    /// Shard-map epoch.
    pub epoch: u64,
    /// TLS directory.
    pub tls_dir: PathBuf,
    /// Frame cap, bytes.
    pub max_frame: u64,
    /// Write-back period; zero disables the timer.
    pub flush_interval: Duration,
    /// Time allowed for draining at shutdown.
    pub drain_timeout: Duration,
    /// Rows each table keeps in memory, if bounded.
    pub memory_budget_rows: Option<u64>,
    /// RocksDB setup and prefetch pins: the capacity tier's settings.
    pub tier: tier::TierConfig,
    /// When pushed rows reach RocksDB.
    pub durability: Durability,
    /// With `replicated` durability, what a primary does while no backup is in sync.
    pub replicated_without_backup: ReplicatedWithoutBackup,
    /// Accept clients without a CA-signed certificate (development only).
    pub insecure_dev: bool,
    /// Start owning nothing until a reshard moves virtual shards here.
    pub standby: bool,
    /// Frequency admission given to every registered table, if on.
    pub admission: Option<embedding::AdmissionConfig>,
    /// TTL in seconds given to every registered table, if on.
    pub row_ttl_secs: Option<u64>,
    /// Period of the expiry pass.
    pub expire_interval: Duration,
    /// Cap on request (and, separately, pull response) bytes being handled at once.
    pub max_inflight_bytes: u64,
    /// Cap on open connections.
    pub max_connections: usize,
    /// Cap on concurrent requests per QUIC connection.
    pub max_streams_per_connection: u32,
    /// QUIC flow-control window per connection, bytes.
    pub connection_window_bytes: u64,
    /// Bounds on connections before authentication and on stalled streams.
    pub connection_limits: ConnectionLimits,
    /// What a push may leave in a row.
    pub weight_guard: embedding::WeightGuard,
    /// Bounds on table registration.
    pub registration_limits: RegistrationLimits,
    /// Bounds on the reduce groups' state.
    pub reduce_limits: crate::reduce::ReduceLimits,
    /// Bounds on the push answers remembered for retries.
    pub push_window: PushWindowLimits,
    /// Period of the delta sync's cuts; zero turns change tracking off.
    pub sync_interval: Duration,
    /// Ids the retained deltas hold at most.
    pub sync_retain_rows: usize,
}

/// A config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("read config {}: {message}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The file is not valid TOML for this config.
    #[error("parse config {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why (names the line and the field).
        message: String,
    },
    /// A required field is absent.
    #[error("missing {0}: give --{0} or set it in the config file")]
    Missing(&'static str),
    /// A field is out of range.
    #[error("invalid config: {0}")]
    Invalid(String),
}

mod limits;
mod tier;

pub use limits::{
    ConnectionLimits, PushWindowLimits, RegistrationLimits, WeightGuardMode, DEFAULT_MAX_TABLES,
    DEFAULT_MAX_TABLES_PER_REQUEST, DEFAULT_MAX_TABLE_DIM, DEFAULT_PUSH_WINDOW_CLIENTS,
    DEFAULT_PUSH_WINDOW_PER_CLIENT, DEFAULT_WEIGHT_CLAMP_ABS,
};
pub use tier::{RocksdbTuning, TierConfig, DEFAULT_PIN_SECS};

#[cfg(test)]
mod tests;
