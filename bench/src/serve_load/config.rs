//! `serve-bench` flags ([`ServeArgs`]) and their validation into a [`ServeConfig`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure};
use serde::Serialize;

use super::body::Format;
use super::client::Endpoint;

/// Load generator for `ps-serve`: sends labelled Criteo test rows (labels stripped) to `POST /v1/predict`
/// from concurrent keep-alive connections and reports rows/s and latency percentiles; with `--auc`, predicts
/// every row once and scores the answers against the labels.
#[derive(Debug, Clone, clap::Parser)]
#[command(version)]
pub struct ServeArgs {
    /// Base URL of ps-serve.
    #[arg(long, default_value = "http://127.0.0.1:8500")]
    pub url: String,
    /// Labelled Criteo rows (`label \t I1..I13 \t C1..C26`, as `gen-criteo` and the trainer's test files;
    /// gzip if it ends in `.gz`).
    #[arg(long)]
    pub data: PathBuf,
    /// Read at most N rows of the file [default: all].
    #[arg(long)]
    pub limit_rows: Option<usize>,
    /// Body format: tsv (text/tab-separated-values) or json (application/json).
    #[arg(long, value_enum, default_value_t = Format::Tsv)]
    pub format: Format,
    /// Rows per request.
    #[arg(long, default_value_t = 64)]
    pub rows_per_request: usize,
    /// Concurrent clients, each one keep-alive connection with one request in flight.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Measured seconds (load mode).
    #[arg(long, conflicts_with = "requests")]
    pub duration: Option<f64>,
    /// Measured requests instead of a duration (load mode).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Seconds of load before measuring (not counted; load mode).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Seconds to wait for a connection or an answer.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Predict every row of the file exactly once (in order, --concurrency requests in flight) and print the
    /// AUC and logloss of the answers against the labels, with the model version that answered.
    #[arg(long, conflicts_with_all = ["duration", "requests"])]
    pub auc: bool,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// When a load run stops measuring.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// After this many measured seconds.
    Seconds(f64),
    /// After this many measured requests.
    Requests(u64),
}

/// What to run: a load test or one AUC pass.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Cycle through the file's rows for a duration or a number of requests.
    Load {
        /// When to stop.
        stop: Stop,
        /// Unmeasured seconds first.
        warmup_secs: f64,
    },
    /// Predict every row once and score the answers.
    Auc,
}

/// Validated settings of a run.
#[derive(Debug, Clone, Serialize)]
pub struct ServeConfig {
    /// ps-serve's base URL.
    pub url: String,
    /// The parsed URL.
    #[serde(skip)]
    pub endpoint: Endpoint,
    /// The test file.
    pub data: PathBuf,
    /// Row limit of the file.
    pub limit_rows: Option<usize>,
    /// Body format.
    pub format: Format,
    /// Rows per request.
    pub rows_per_request: usize,
    /// Concurrent connections.
    pub concurrency: usize,
    /// Load or AUC.
    pub mode: Mode,
    /// Connect and answer timeout.
    #[serde(skip)]
    pub timeout: Duration,
}

impl ServeArgs {
    /// Checks the flags.
    pub fn validate(&self) -> anyhow::Result<ServeConfig> {
        let endpoint = Endpoint::parse(&self.url)?;
        ensure!(
            self.rows_per_request > 0,
            "--rows-per-request must be at least 1"
        );
        ensure!(self.concurrency > 0, "--concurrency must be at least 1");
        ensure!(
            self.timeout.is_finite() && self.timeout > 0.0,
            "--timeout must be positive, got {}",
            self.timeout
        );
        ensure!(
            self.warmup.is_finite() && self.warmup >= 0.0,
            "--warmup must be 0 or more seconds, got {}",
            self.warmup
        );
        let mode = if self.auc {
            Mode::Auc
        } else {
            let stop = match (self.duration, self.requests) {
                (Some(s), None) if s.is_finite() && s > 0.0 => Stop::Seconds(s),
                (Some(s), None) => bail!("--duration must be positive, got {s}"),
                (None, Some(0)) => bail!("--requests must be at least 1"),
                (None, Some(n)) => Stop::Requests(n),
                (None, None) => Stop::Seconds(10.0),
                (Some(_), Some(_)) => bail!("--duration and --requests exclude each other"),
            };
            Mode::Load {
                stop,
                warmup_secs: self.warmup,
            }
        };
        Ok(ServeConfig {
            url: endpoint.url.clone(),
            endpoint,
            data: self.data.clone(),
            limit_rows: self.limit_rows,
            format: self.format,
            rows_per_request: self.rows_per_request,
            concurrency: self.concurrency,
            mode,
            timeout: Duration::from_secs_f64(self.timeout),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> anyhow::Result<ServeConfig> {
        let mut argv = vec!["serve-bench", "--data", "t.tsv"];
        argv.extend_from_slice(extra);
        ServeArgs::try_parse_from(argv)?.validate()
    }

    #[test]
    fn defaults_to_ten_seconds_of_load() {
        let c = args(&[]).unwrap();
        assert_eq!(
            c.mode,
            Mode::Load {
                stop: Stop::Seconds(10.0),
                warmup_secs: 1.0
            }
        );
        assert_eq!(c.endpoint.authority, "127.0.0.1:8500");
        assert_eq!(c.format, Format::Tsv);
    }

    #[test]
    fn modes_and_refusals() {
        let c = args(&["--requests", "5", "--format", "json"]).unwrap();
        assert!(matches!(
            c.mode,
            Mode::Load {
                stop: Stop::Requests(5),
                ..
            }
        ));
        assert_eq!(args(&["--auc"]).unwrap().mode, Mode::Auc);
        assert!(args(&["--auc", "--duration", "3"]).is_err());
        assert!(args(&["--duration", "3", "--requests", "3"]).is_err());
        assert!(args(&["--rows-per-request", "0"]).is_err());
        assert!(args(&["--concurrency", "0"]).is_err());
        assert!(args(&["--url", "https://x"]).is_err());
    }
}
