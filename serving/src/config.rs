//! The serving process's one typed config: a TOML file (`--config`), command-line flags and environment
//! variables (`PS_SERVE_*`), merged (flag or environment > file > default) and then checked.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::compact::ServePrecision;

/// Every setting, as a flag, an environment variable and a TOML key (kebab-case); all optional here.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeOptions {
    /// The export to serve: an export root (its LATEST version is loaded) or one version directory. Required.
    #[arg(long, env = "PS_SERVE_EXPORT")]
    pub export: Option<PathBuf>,
    /// HTTP listen address for predictions, /metrics, /healthz and /readyz. Default `127.0.0.1:8500` (loopback:
    /// reachable from other machines only when asked, as the Kubernetes manifests do with `0.0.0.0:8500`).
    #[arg(long, env = "PS_SERVE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Directory for serving's copy of the embedding rows (RocksDB; replaced at start). Default: a
    /// directory under the system's temporary directory, removed at exit.
    #[arg(long, env = "PS_SERVE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Rows each table keeps in memory per shard; the rest stay on disk and are read back on a miss.
    /// Default: none (every row the export holds is loaded).
    #[arg(long, env = "PS_SERVE_MEMORY_BUDGET_ROWS")]
    pub memory_budget_rows: Option<u64>,
    /// Hold every row in memory at this precision, without optimizer state or a RocksDB copy: `f32` (the
    /// weights as trained), `bf16` (rounded to nearest) or `int8` (a scale per row, each weight within
    /// `max|w| / 254` of its value). Default: none (rows as the export stores them, in RocksDB with the
    /// memory budget). Not with `--memory-budget-rows`.
    #[arg(long, env = "PS_SERVE_ROW_PRECISION")]
    pub row_precision: Option<String>,
    /// Microseconds the first request of a micro-batch waits for others. Default 0: a batch is every request
    /// that queued while the previous one was predicted (lowest latency; BENCHMARKS.md).
    #[arg(long, env = "PS_SERVE_BATCH_DEADLINE_US")]
    pub batch_deadline_us: Option<u64>,
    /// Rows that close a micro-batch at once. Default 2048.
    #[arg(long, env = "PS_SERVE_MAX_BATCH_ROWS")]
    pub max_batch_rows: Option<usize>,
    /// Rows of requests waiting for the predicting thread at most; past it a request is answered 503 with
    /// `Retry-After: 1` at once (`serving_queue_full_total`). Default 65536.
    #[arg(long, env = "PS_SERVE_MAX_QUEUED_ROWS")]
    pub max_queued_rows: Option<usize>,
    /// Largest request body, bytes. Default 8 MiB.
    #[arg(long, env = "PS_SERVE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Most rows in one request. Default 8192.
    #[arg(long, env = "PS_SERVE_MAX_ROWS")]
    pub max_rows: Option<usize>,
    /// Threads of the model's arithmetic. Default: the machine's cores.
    #[arg(long, env = "PS_SERVE_THREADS")]
    pub threads: Option<usize>,
    /// Seconds open connections get to finish after SIGTERM. Default 10.
    #[arg(long, env = "PS_SERVE_DRAIN_TIMEOUT_SECS")]
    pub drain_timeout_secs: Option<f64>,
    /// Training servers to follow by delta sync, `host:port` in shard order, comma separated (the
    /// trainers' `--ps`). Default: none (serve the export as it is).
    #[arg(long, value_delimiter = ',', env = "PS_SERVE_SUBSCRIBE")]
    pub subscribe: Option<Vec<String>>,
    /// TLS directory with ca.pem, client.pem and client.key, for `subscribe`.
    #[arg(long, env = "PS_SERVE_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Name the servers' certificates carry. Default the cluster's.
    #[arg(long, env = "PS_SERVE_SERVER_NAME")]
    pub server_name: Option<String>,
    /// Transport to the training servers: quic or tcp. Default quic.
    #[arg(long, env = "PS_SERVE_TRANSPORT")]
    pub transport: Option<protocol::Transport>,
    /// Seconds to keep retrying `subscribe` names that do not resolve yet (pods' DNS records appear as they
    /// start); past it, the connection attempt fails and is retried with backoff. Default 0: one attempt.
    #[arg(long, env = "PS_SERVE_RESOLVE_TIMEOUT_SECS")]
    pub resolve_timeout_secs: Option<f64>,
    /// Encoding of synced rows: f32 or f16. Default f32.
    #[arg(long, env = "PS_SERVE_SYNC_ENCODING")]
    pub sync_encoding: Option<String>,
    /// Milliseconds a sync request waits on a training server for the next delta. Default 10000.
    #[arg(long, env = "PS_SERVE_SYNC_WAIT_MS")]
    pub sync_wait_ms: Option<u32>,
    /// Most HTTP connections open at once; one more is closed at accept (counted in
    /// `serving_connections_refused_total`). Default 1024.
    #[arg(long, env = "PS_SERVE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most HTTP connections open at once from one client address; one more is closed at accept
    /// (`serving_connections_refused_per_client_total`). Default: a quarter of --max-connections, so one
    /// client cannot hold every slot. Behind a proxy every request comes from its address: raise it to
    /// --max-connections there.
    #[arg(long, env = "PS_SERVE_MAX_CONNECTIONS_PER_CLIENT")]
    pub max_connections_per_client: Option<usize>,
    /// Seconds a connection gets to send a request's headers (from its first byte, or from the connection's
    /// start); past it the connection is closed. Default 10.
    #[arg(long, env = "PS_SERVE_HEADER_TIMEOUT_SECS")]
    pub header_timeout_secs: Option<f64>,
    /// Seconds a request gets to send its whole body; past it the answer is 408. Default 30.
    #[arg(long, env = "PS_SERVE_BODY_TIMEOUT_SECS")]
    pub body_timeout_secs: Option<f64>,
    /// A file holding a bearer token: every `/v1/` request must then send `Authorization: Bearer <token>`
    /// (401 otherwise). `/healthz`, `/readyz` and `/metrics` stay open for probes and scrapers. Default: no token.
    #[arg(long, env = "PS_SERVE_API_TOKEN_FILE")]
    pub api_token_file: Option<PathBuf>,
    /// Answer `GET /v1/embedding` (a served row by table and id: a read of the model's parameters, for
    /// debugging and freshness probes). Default false (404 naming this setting).
    #[arg(long, env = "PS_SERVE_ENABLE_EMBEDDING_API", num_args = 0..=1, default_missing_value = "true")]
    pub enable_embedding_api: Option<bool>,
}

/// Why the configuration was refused; messages name the setting and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file did not read.
    #[error("config file {}: {message}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A setting is out of range or missing.
    #[error("{0}")]
    Invalid(String),
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// See [`ServeOptions::export`].
    pub export: PathBuf,
    /// See [`ServeOptions::listen`].
    pub listen: SocketAddr,
    /// See [`ServeOptions::data_dir`]; `None`: a temporary directory.
    pub data_dir: Option<PathBuf>,
    /// See [`ServeOptions::memory_budget_rows`].
    pub memory_budget_rows: Option<u64>,
    /// See [`ServeOptions::row_precision`].
    pub row_precision: Option<ServePrecision>,
    /// See [`ServeOptions::batch_deadline_us`].
    pub batch_deadline: Duration,
    /// See [`ServeOptions::max_batch_rows`].
    pub max_batch_rows: usize,
    /// See [`ServeOptions::max_queued_rows`].
    pub max_queued_rows: usize,
    /// See [`ServeOptions::max_body_bytes`].
    pub max_body_bytes: usize,
    /// See [`ServeOptions::max_rows`].
    pub max_rows: usize,
    /// See [`ServeOptions::threads`].
    pub threads: usize,
    /// See [`ServeOptions::drain_timeout_secs`].
    pub drain_timeout: Duration,
    /// Delta sync, when `subscribe` is set.
    pub sync: Option<SyncConfig>,
    /// See [`ServeOptions::max_connections`].
    pub max_connections: usize,
    /// See [`ServeOptions::max_connections_per_client`].
    pub max_connections_per_client: usize,
    /// See [`ServeOptions::header_timeout_secs`].
    pub header_timeout: Duration,
    /// See [`ServeOptions::body_timeout_secs`].
    pub body_timeout: Duration,
    /// The token read from [`ServeOptions::api_token_file`].
    pub api_token: Option<String>,
    /// See [`ServeOptions::enable_embedding_api`].
    pub enable_embedding_api: bool,
}

/// Delta sync settings.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// The training servers, in shard order.
    pub servers: Vec<String>,
    /// TLS directory.
    pub tls_dir: PathBuf,
    /// TLS server name.
    pub server_name: String,
    /// Transport.
    pub transport: protocol::Transport,
    /// Row encoding.
    pub encoding: protocol::Encoding,
    /// Long-poll wait.
    pub wait_ms: u32,
    /// How long names are retried when they do not resolve.
    pub resolve_timeout: Duration,
}

impl ServeOptions {
    /// Reads a TOML file of these settings.
    pub fn load(path: &Path) -> Result<ServeOptions, ConfigError> {
        let read = |message: String| ConfigError::Read {
            path: path.to_owned(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        toml::from_str(&text).map_err(|e| read(e.to_string()))
    }

    /// `self` (flags and environment) over `file`.
    pub fn over(self, file: ServeOptions) -> ServeOptions {
        macro_rules! pick {
            ($($f:ident),*) => { ServeOptions { $( $f: self.$f.or(file.$f), )* } };
        }
        pick!(
            export,
            listen,
            data_dir,
            memory_budget_rows,
            row_precision,
            batch_deadline_us,
            max_batch_rows,
            max_queued_rows,
            max_body_bytes,
            max_rows,
            threads,
            drain_timeout_secs,
            subscribe,
            tls_dir,
            server_name,
            transport,
            resolve_timeout_secs,
            sync_encoding,
            sync_wait_ms,
            max_connections,
            max_connections_per_client,
            header_timeout_secs,
            body_timeout_secs,
            api_token_file,
            enable_embedding_api
        )
    }

    /// Applies defaults and checks every setting.
    pub fn validate(self) -> Result<ServeConfig, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let Some(export) = self.export else {
            return bad(
                "--export is required (an export directory written by `trainer --export-dir`)"
                    .into(),
            );
        };
        let positive = |name: &str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(ConfigError::Invalid(format!(
                "--{name} 0, expected at least 1"
            ))),
            v => Ok(v.unwrap_or(default)),
        };
        if self.memory_budget_rows == Some(0) {
            return bad(
                "--memory-budget-rows 0, expected at least 1 (omit it for no budget)".into(),
            );
        }
        let row_precision = self
            .row_precision
            .as_deref()
            .map(str::parse::<ServePrecision>)
            .transpose()
            .map_err(ConfigError::Invalid)?;
        if let (Some(p), Some(rows)) = (row_precision, self.memory_budget_rows) {
            return bad(format!(
                "--row-precision {p} with --memory-budget-rows {rows}: rows held at a serving precision are \
                 all in memory; give one or the other"
            ));
        }
        let deadline_us = self.batch_deadline_us.unwrap_or(0);
        if deadline_us > 1_000_000 {
            return bad(format!(
                "--batch-deadline-us {deadline_us}, expected at most 1000000 (one second)"
            ));
        }
        let drain = self.drain_timeout_secs.unwrap_or(10.0);
        if !(drain.is_finite() && (0.0..=3600.0).contains(&drain)) {
            return bad(format!("--drain-timeout-secs {drain}, expected 0..=3600"));
        }
        let seconds = |name: &str, v: Option<f64>, default: f64| {
            let v = v.unwrap_or(default);
            if v.is_finite() && v > 0.0 && v <= 3600.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(ConfigError::Invalid(format!(
                    "--{name} {v}, expected more than 0 and at most 3600"
                )))
            }
        };
        let header_timeout = seconds("header-timeout-secs", self.header_timeout_secs, 10.0)?;
        let body_timeout = seconds("body-timeout-secs", self.body_timeout_secs, 30.0)?;
        let api_token = match &self.api_token_file {
            None => None,
            Some(path) => Some(read_token(path)?),
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let sync = match self.subscribe.filter(|s| !s.is_empty()) {
            None => None,
            Some(servers) => {
                let Some(tls_dir) = self.tls_dir else {
                    return bad(
                        "--subscribe needs --tls-dir (the cluster's client certificate)".into(),
                    );
                };
                let encoding = match self.sync_encoding.as_deref().unwrap_or("f32") {
                    "f32" => protocol::Encoding::F32,
                    "f16" => protocol::Encoding::F16,
                    other => return bad(format!("--sync-encoding {other:?}, expected f32 or f16")),
                };
                let wait_ms = self.sync_wait_ms.unwrap_or(10_000);
                if !(1..=30_000).contains(&wait_ms) {
                    return bad(format!("--sync-wait-ms {wait_ms}, expected 1..=30000"));
                }
                let resolve = self.resolve_timeout_secs.unwrap_or(0.0);
                if !(resolve.is_finite() && (0.0..=86_400.0).contains(&resolve)) {
                    return bad(format!(
                        "--resolve-timeout-secs {resolve}, expected 0..=86400"
                    ));
                }
                Some(SyncConfig {
                    resolve_timeout: Duration::from_secs_f64(resolve),
                    servers,
                    tls_dir,
                    server_name: self
                        .server_name
                        .unwrap_or_else(|| protocol::transport::tls::DEFAULT_SERVER_NAME.into()),
                    transport: self.transport.unwrap_or_default(),
                    encoding,
                    wait_ms,
                })
            }
        };
        let max_connections = positive("max-connections", self.max_connections, 1024)?;
        Ok(ServeConfig {
            export,
            listen: self
                .listen
                .unwrap_or_else(|| "127.0.0.1:8500".parse().expect("valid address")),
            data_dir: self.data_dir,
            memory_budget_rows: self.memory_budget_rows,
            row_precision,
            batch_deadline: Duration::from_micros(deadline_us),
            max_batch_rows: positive("max-batch-rows", self.max_batch_rows, 2048)?,
            max_queued_rows: positive("max-queued-rows", self.max_queued_rows, 65536)?,
            max_body_bytes: positive("max-body-bytes", self.max_body_bytes, 8 << 20)?,
            max_rows: positive("max-rows", self.max_rows, 8192)?,
            threads: positive("threads", self.threads, cores)?,
            drain_timeout: Duration::from_secs_f64(drain),
            sync,
            max_connections,
            max_connections_per_client: positive(
                "max-connections-per-client",
                self.max_connections_per_client,
                (max_connections / 4).max(1),
            )?,
            header_timeout,
            body_timeout,
            api_token,
            enable_embedding_api: self.enable_embedding_api.unwrap_or(false),
        })
    }
}

/// The bearer token in `path`: its text without surrounding white space; refused when unreadable, empty,
/// or holding characters a header value cannot carry.
fn read_token(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Invalid(format!("--api-token-file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ConfigError::Invalid(format!(
            "--api-token-file {}: the file is empty",
            path.display()
        )));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::Invalid(format!(
            "--api-token-file {}: the token must be printable ASCII without spaces",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(export: &str) -> ServeOptions {
        ServeOptions {
            export: Some(export.into()),
            ..ServeOptions::default()
        }
    }

    #[test]
    fn defaults_and_precedence() {
        let c = opts("/e").validate().unwrap();
        assert_eq!(c.listen.port(), 8500);
        assert!(c.listen.ip().is_loopback(), "{}", c.listen);
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.max_connections_per_client, 256);
        assert_eq!(
            (c.header_timeout, c.body_timeout),
            (Duration::from_secs(10), Duration::from_secs(30))
        );
        assert!(c.api_token.is_none() && !c.enable_embedding_api);
        assert_eq!(c.batch_deadline, Duration::ZERO);
        assert_eq!((c.max_batch_rows, c.max_rows), (2048, 8192));
        assert_eq!(c.max_queued_rows, 65536);
        assert!(c.sync.is_none());
        let file: ServeOptions =
            toml::from_str("export = \"/file\"\nmax-rows = 5\nlisten = \"127.0.0.1:1\"").unwrap();
        let flags = ServeOptions {
            max_rows: Some(7),
            ..ServeOptions::default()
        };
        let c = flags.over(file).validate().unwrap();
        assert_eq!(c.export, PathBuf::from("/file"));
        assert_eq!(c.max_rows, 7);
        assert_eq!(c.listen.port(), 1);
    }

    #[test]
    fn refusals_name_the_setting() {
        let e = |o: ServeOptions| o.validate().unwrap_err().to_string();
        assert!(e(ServeOptions::default()).contains("--export is required"));
        let mut o = opts("/e");
        o.max_rows = Some(0);
        assert!(e(o).contains("--max-rows 0"));
        let mut o = opts("/e");
        o.subscribe = Some(vec!["127.0.0.1:7000".into()]);
        assert!(e(o.clone()).contains("--subscribe needs --tls-dir"));
        o.tls_dir = Some("/tls".into());
        o.sync_encoding = Some("int8".into());
        assert!(e(o).contains("--sync-encoding \"int8\""));
        let mut o = opts("/e");
        o.row_precision = Some("int4".into());
        assert!(e(o.clone()).contains("--row-precision \"int4\""));
        o.row_precision = Some("int8".into());
        assert_eq!(
            o.clone().validate().unwrap().row_precision,
            Some(ServePrecision::Int8)
        );
        o.memory_budget_rows = Some(10);
        assert!(e(o).contains("--row-precision int8 with --memory-budget-rows 10"));
        let mut o = opts("/e");
        o.header_timeout_secs = Some(0.0);
        assert!(e(o).contains("--header-timeout-secs 0"));
        let mut o = opts("/e");
        o.max_connections = Some(0);
        assert!(e(o).contains("--max-connections 0"));
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        let mut o = opts("/e");
        o.api_token_file = Some(token.clone());
        assert!(e(o.clone()).contains("--api-token-file"), "missing file");
        std::fs::write(&token, "  \n").unwrap();
        assert!(e(o.clone()).contains("the file is empty"));
        std::fs::write(&token, "two words\n").unwrap();
        assert!(e(o.clone()).contains("printable ASCII without spaces"));
        std::fs::write(&token, "s3cret\n").unwrap();
        assert_eq!(o.validate().unwrap().api_token.as_deref(), Some("s3cret"));
        let bad: Result<ServeOptions, _> = toml::from_str("exprt = \"/x\"");
        assert!(bad.unwrap_err().to_string().contains("exprt"));
    }
}
