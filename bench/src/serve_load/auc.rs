//! The `--auc` pass: every request exactly once, in order, `--concurrency` at a time; the probabilities are
//! put back in row order and scored against the labels with `model::eval` (exact AUC, clamped logloss).
//!
//! Any failure ends the pass with the failing request's rows and the server's message: an AUC over part of
//! the rows would not be the file's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context};
use tokio::task::JoinSet;

use super::answer::{self, Prediction};
use super::client::Connection;
use super::config::ServeConfig;
use super::report::AucReport;
use super::worker::PREDICT;
use super::Batch;

/// Predicts every batch once and scores the answers against `labels` (one per row, in batch order).
pub async fn run(
    cfg: &ServeConfig,
    batches: Vec<Batch>,
    labels: &[f32],
) -> anyhow::Result<AucReport> {
    let rows: usize = batches.iter().map(|b| b.rows).sum();
    ensure!(
        rows == labels.len(),
        "{rows} rows in the requests, {} labels",
        labels.len()
    );
    ensure!(rows > 0, "no rows to predict");
    let addr = cfg.endpoint.resolve().await?;
    let mut conns = Vec::with_capacity(cfg.concurrency);
    for _ in 0..cfg.concurrency.min(batches.len()) {
        conns.push(Connection::open(&cfg.endpoint, addr, cfg.timeout).await?);
    }
    // First row of each batch, for messages.
    let firsts: Vec<usize> = batches
        .iter()
        .scan(0, |row, b| {
            let first = *row;
            *row += b.rows;
            Some(first)
        })
        .collect();
    let batches = Arc::new(batches);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut set = JoinSet::new();
    for mut conn in conns {
        let (batches, next, endpoint, ct, timeout) = (
            batches.clone(),
            next.clone(),
            cfg.endpoint.clone(),
            cfg.format.content_type(),
            cfg.timeout,
        );
        let firsts = firsts.clone();
        set.spawn(async move {
            let mut answers: Vec<(usize, Prediction)> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(batch) = batches.get(i) else {
                    return Ok(answers);
                };
                let what = || {
                    format!(
                        "request {i} (rows {}..{})",
                        firsts[i] + 1,
                        firsts[i] + batch.rows
                    )
                };
                if conn.is_closed() {
                    conn = Connection::open(&endpoint, addr, timeout)
                        .await
                        .with_context(what)?;
                }
                let (status, body) = conn
                    .post(PREDICT, ct, batch.body.clone())
                    .await
                    .with_context(what)?;
                let p = answer::parse(status, &body, batch.rows).with_context(what)?;
                answers.push((i, p));
            }
        });
    }
    let mut by_batch: Vec<Option<Prediction>> = vec![None; batches.len()];
    while let Some(joined) = set.join_next().await {
        let answers: anyhow::Result<Vec<(usize, Prediction)>> =
            joined.map_err(|e| anyhow!("a request task failed: {e}"))?;
        match answers {
            Ok(answers) => {
                for (i, p) in answers {
                    by_batch[i] = Some(p);
                }
            }
            Err(e) => {
                set.abort_all();
                return Err(e);
            }
        }
    }
    let seconds = start.elapsed().max(Duration::from_nanos(1)).as_secs_f64();
    let answers: Vec<Prediction> = by_batch
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.ok_or_else(|| anyhow!("request {i} has no answer")))
        .collect::<anyhow::Result<_>>()?;
    let probs: Vec<f32> = answers
        .iter()
        .flat_map(|p| p.probabilities.iter().copied())
        .collect();
    let mut eval = model::eval::Evaluator::new();
    eval.push(&probs, labels);
    let scored = eval.report();
    Ok(AucReport {
        rows: rows as u64,
        requests: answers.len() as u64,
        seconds,
        rows_per_sec: rows as f64 / seconds,
        auc: scored.auc,
        logloss: scored.logloss,
        mean_prediction: scored.mean_prediction,
        positive_rate: scored.positive_rate,
        version: answers.iter().map(|p| p.version).max().unwrap_or(0),
        min_version: answers.iter().map(|p| p.version).min().unwrap_or(0),
        dense_version: answers.iter().map(|p| p.dense_version).max().unwrap_or(0),
        config: cfg.clone(),
    })
}
