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
    /// QUIC listen address (UDP). Default `127.0.0.1:7000`.
    pub listen: Option<SocketAddr>,
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
    /// Development only: accept clients without a certificate signed by the cluster CA (the server still
    /// presents its own). Logs a warning at start. Default false.
    pub insecure_dev: Option<bool>,
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
            insecure_dev
        );
        self
    }

    /// Applies defaults and checks every field.
    pub fn validate(self) -> Result<ServerConfig, ConfigError> {
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
        let secs = |name: &str, v: Option<f64>, default: f64| -> Result<Duration, ConfigError> {
            let v = v.unwrap_or(default);
            if !v.is_finite() || v < 0.0 {
                return Err(ConfigError::Invalid(format!(
                    "{name} = {v}, expected a number of seconds >= 0"
                )));
            }
            Ok(Duration::from_secs_f64(v))
        };
        let max_frame = self
            .max_frame_bytes
            .unwrap_or(protocol::frame::DEFAULT_MAX_FRAME);
        if max_frame < 1024 {
            return Err(ConfigError::Invalid(format!(
                "max-frame-bytes = {max_frame}, expected at least 1024"
            )));
        }
        if self.memory_budget_rows == Some(0) {
            return Err(ConfigError::Invalid(
                "memory-budget-rows = 0, expected at least 1 (omit it for no budget)".into(),
            ));
        }
        Ok(ServerConfig {
            memory_budget_rows: self.memory_budget_rows,
            durability: self.durability.unwrap_or_default(),
            insecure_dev: self.insecure_dev.unwrap_or(false),
            listen: self
                .listen
                .unwrap_or_else(|| "127.0.0.1:7000".parse().expect("valid")),
            metrics_listen: self
                .metrics_listen
                .unwrap_or_else(|| "127.0.0.1:9100".parse().expect("valid")),
            data_dir: self.data_dir.ok_or(ConfigError::Missing("data-dir"))?,
            shard_index,
            num_shards,
            epoch: self.epoch.unwrap_or(1),
            tls_dir: self.tls_dir.ok_or(ConfigError::Missing("tls-dir"))?,
            max_frame,
            flush_interval: secs("flush-interval-secs", self.flush_interval_secs, 30.0)?,
            drain_timeout: secs("drain-timeout-secs", self.drain_timeout_secs, 20.0)?,
        })
    }
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

/// Validated runtime settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// QUIC listen address.
    pub listen: SocketAddr,
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
    /// When pushed rows reach RocksDB.
    pub durability: Durability,
    /// Accept clients without a CA-signed certificate (development only).
    pub insecure_dev: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_then_flags() {
        let file: FileConfig = toml::from_str(
            "listen = \"127.0.0.1:7100\"\ndata-dir = \"/d\"\ntls-dir = \"/t\"\nnum-shards = 2\nshard-index = 1\n",
        )
        .unwrap();
        let flags = FileConfig {
            listen: Some("127.0.0.1:7200".parse().unwrap()),
            ..Default::default()
        };
        let cfg = file.overlay(flags).validate().unwrap();
        assert_eq!(cfg.listen.port(), 7200);
        assert_eq!((cfg.shard_index, cfg.num_shards), (1, 2));
        assert_eq!(cfg.flush_interval, Duration::from_secs(30));
    }

    #[test]
    fn bad_configs_name_the_field() {
        let err = toml::from_str::<FileConfig>("lisen = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lisen"), "{err}");
        let base = || FileConfig {
            data_dir: Some("/d".into()),
            tls_dir: Some("/t".into()),
            ..Default::default()
        };
        let err = FileConfig {
            shard_index: Some(2),
            num_shards: Some(2),
            ..base()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("shard-index = 2"), "{err}");
        let err = FileConfig {
            flush_interval_secs: Some(f64::NAN),
            ..base()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("flush-interval-secs"), "{err}");
        let err = FileConfig {
            memory_budget_rows: Some(0),
            ..base()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("memory-budget-rows = 0"), "{err}");
        let cfg: FileConfig = toml::from_str("memory-budget-rows = 100").unwrap();
        assert_eq!(
            base().overlay(cfg).validate().unwrap().memory_budget_rows,
            Some(100)
        );
        let err = FileConfig {
            tls_dir: None,
            ..base()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("tls-dir"), "{err}");
    }

    #[test]
    fn durability_parses_and_a_bad_value_names_the_field() {
        let base = || FileConfig {
            data_dir: Some("/d".into()),
            tls_dir: Some("/t".into()),
            ..Default::default()
        };
        assert_eq!(base().validate().unwrap().durability, Durability::Periodic);
        for (text, want) in [
            ("none", Durability::None),
            ("periodic", Durability::Periodic),
            ("sync", Durability::Sync),
        ] {
            let file: FileConfig = toml::from_str(&format!("durability = \"{text}\"")).unwrap();
            assert_eq!(base().overlay(file).validate().unwrap().durability, want);
        }
        let err = toml::from_str::<FileConfig>("durability = \"always\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("durability"), "{err}");
        assert!(err.contains("always"), "{err}");
    }

    #[test]
    fn shard_index_from_pod_names() {
        assert_eq!(shard_index_from_hostname("ps-0").unwrap(), 0);
        assert_eq!(shard_index_from_hostname("pstrain-ps-12").unwrap(), 12);
        assert_eq!(shard_index_from_hostname("ps-3.ps.ml.svc").unwrap(), 3);
        for bad in ["ps", "ps-", "ps-x1", "ps-1a", "", "ps-99999999999"] {
            let err = shard_index_from_hostname(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
