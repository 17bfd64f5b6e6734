//! `serve-bench`: a load generator for `ps-serve` (docs/serving.md).
//!
//! The rows of a labelled Criteo test file are read once ([`rows`]) and cut into request bodies of
//! `--rows-per-request` rows before the run ([`body`]), so building bodies takes no client CPU while
//! measuring. `--concurrency` workers each own one keep-alive HTTP/1.1 connection ([`client`]) with one
//! request in flight. A load run ([`worker`]) cycles through the bodies for `--duration` seconds or
//! `--requests` requests after a `--warmup`, and reports rows/s, requests/s, latency percentiles and failures by
//! kind ([`report`]); requests that start in the warm-up or finish after the measured window are not counted.
//! An `--auc` pass ([`auc`]) sends every row exactly once, in order, and scores the probabilities against the
//! labels with the trainer's exact AUC and logloss (`model::eval`, the model crate's). Answers are checked ([`answer`]): a
//! non-200 status with the server's `error` message, malformed JSON, a wrong number of probabilities.
//!
//! # Layout
//! - [`config`]: flags and validation.
//! - [`rows`]: reading the labelled test file.
//! - [`body`]: TSV and JSON request bodies.
//! - [`client`]: the URL and one HTTP/1.1 connection.
//! - [`answer`]: parsing and checking answers.
//! - [`worker`]: the load run.
//! - [`auc`]: the AUC pass.
//! - [`report`]: the summary line and JSON.

pub mod answer;
pub mod auc;
pub mod body;
pub mod client;
pub mod config;
pub mod report;
pub mod rows;
pub mod worker;

#[cfg(test)]
mod fake_server;
#[cfg(test)]
mod tests;

use anyhow::Context;
use bytes::Bytes;
use serde::Serialize;

pub use config::{Mode, ServeArgs, ServeConfig, Stop};
pub use report::{AucReport, LoadReport};

use body::Format;
use rows::LabelledRows;

/// One prebuilt request.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The body.
    pub body: Bytes,
    /// Rows in it.
    pub rows: usize,
}

/// Cuts `rows` into requests of at most `per_request` rows, in order.
pub fn batches(rows: &LabelledRows, per_request: usize, format: Format) -> Vec<Batch> {
    rows.features
        .chunks(per_request)
        .map(|chunk| Batch {
            body: format.body(chunk),
            rows: chunk.len(),
        })
        .collect()
}

/// What a run reports.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Report {
    /// A load run.
    Load(LoadReport),
    /// An AUC pass.
    Auc(AucReport),
}

impl Report {
    /// The summary line.
    pub fn line(&self) -> String {
        match self {
            Report::Load(r) => r.line(),
            Report::Auc(r) => r.line(),
        }
    }
}

/// Reads the file, then runs the load or the AUC pass the config describes on a tokio runtime of its own.
pub fn run(cfg: &ServeConfig) -> anyhow::Result<Report> {
    let rows = LabelledRows::read(&cfg.data, cfg.limit_rows)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    rt.block_on(run_rows(cfg, rows))
}

/// [`run`] on rows already read, inside a runtime.
pub async fn run_rows(cfg: &ServeConfig, rows: LabelledRows) -> anyhow::Result<Report> {
    let batches = batches(&rows, cfg.rows_per_request, cfg.format);
    match cfg.mode {
        Mode::Load { stop, warmup_secs } => {
            drop(rows);
            worker::run(cfg, batches, stop, warmup_secs)
                .await
                .map(Report::Load)
        }
        Mode::Auc => auc::run(cfg, batches, &rows.labels).await.map(Report::Auc),
    }
}
