//! Micro-batching: requests hand their parsed rows to one predicting thread, which gathers the rows of the
//! requests arriving within `--batch-deadline-us` of the first (default 0: those already queued, which
//! arrived while the previous batch was predicted; up to `--max-batch-rows`) into one batch,
//! predicts it once and answers each request with its share. One thread owns the model, so a new dense
//! version ([`Batcher::set_dense`]) takes effect between two batches: no prediction mixes two versions.
//! The model's own work is parallel (rayon over chunks of rows).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criteo::Batch;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tokio::sync::oneshot;

use crate::metrics as m;
use crate::predict::{DenseModel, Predictor};
use crate::store::RowStore;

/// Micro-batching limits.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// How long the first request of a batch waits for others.
    pub deadline: Duration,
    /// Rows beyond which a batch is predicted at once (a single bigger request is predicted alone).
    pub max_rows: usize,
}

/// An answer to one request.
#[derive(Debug, Clone)]
pub struct Prediction {
    /// One click probability per row, in order.
    pub probabilities: Vec<f32>,
    /// The dense version that computed them.
    pub dense_version: u64,
}

/// A prediction that failed on the server's side.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// The model or the rows failed.
    #[error("{0}")]
    Failed(String),
    /// The predicting thread is gone (shutting down).
    #[error("the predictor is shutting down")]
    Closed,
}

struct Job {
    batch: Batch,
    reply: oneshot::Sender<Result<Prediction, BatchError>>,
}

enum Command {
    Predict(Job),
    SetDense(Box<DenseModel>),
}

/// The handle requests predict through; cloning shares the thread.
#[derive(Clone)]
pub struct Batcher {
    tx: Sender<Command>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    /// Starts the predicting thread; it ends when every handle is dropped, after the queued requests.
    pub fn spawn(
        predictor: Predictor,
        store: Arc<RowStore>,
        limits: BatchLimits,
    ) -> std::io::Result<(Batcher, std::thread::JoinHandle<()>)> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let handle = std::thread::Builder::new()
            .name("predict".into())
            .spawn(move || run(predictor, &store, limits, &rx))?;
        Ok((Batcher { tx }, handle))
    }

    /// Predicts `batch`'s rows (with those of concurrent requests).
    pub async fn predict(&self, batch: Batch) -> Result<Prediction, BatchError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Predict(Job { batch, reply }))
            .map_err(|_| BatchError::Closed)?;
        rx.await.map_err(|_| BatchError::Closed)?
    }

    /// Makes `dense` the model of every batch after the current one.
    pub fn set_dense(&self, dense: DenseModel) -> Result<(), BatchError> {
        self.tx
            .send(Command::SetDense(Box::new(dense)))
            .map_err(|_| BatchError::Closed)
    }
}

fn run(mut predictor: Predictor, store: &RowStore, limits: BatchLimits, rx: &Receiver<Command>) {
    let mut held: Option<Command> = None;
    let mut merged = Batch::default();
    let mut jobs: Vec<Job> = Vec::new();
    loop {
        let first = match held.take() {
            Some(c) => c,
            None => match rx.recv() {
                Ok(c) => c,
                Err(_) => return,
            },
        };
        let job = match first {
            Command::SetDense(d) => {
                set_dense(&mut predictor, *d);
                continue;
            }
            Command::Predict(job) => job,
        };
        let mut rows = job.batch.len;
        jobs.push(job);
        let deadline = Instant::now() + limits.deadline;
        while rows < limits.max_rows {
            match rx.recv_deadline(deadline) {
                Ok(Command::Predict(j)) if rows + j.batch.len > limits.max_rows => {
                    held = Some(Command::Predict(j));
                    break;
                }
                Ok(Command::Predict(j)) => {
                    rows += j.batch.len;
                    jobs.push(j);
                }
                Ok(c @ Command::SetDense(_)) => {
                    held = Some(c);
                    break;
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        let batch = if jobs.len() == 1 {
            &jobs[0].batch
        } else {
            merged.clone_from(&jobs[0].batch);
            for j in &jobs[1..] {
                merged.append(&j.batch);
            }
            &merged
        };
        metrics::histogram!(m::BATCH_ROWS).record(batch.len as f64);
        let dense_version = predictor.dense_version();
        match predictor.predict(store, batch) {
            Ok(probs) => {
                metrics::counter!(m::PREDICT_ROWS_TOTAL).increment(probs.len() as u64);
                let mut at = 0;
                for j in jobs.drain(..) {
                    let n = j.batch.len;
                    let _ = j.reply.send(Ok(Prediction {
                        probabilities: probs[at..at + n].to_vec(),
                        dense_version,
                    }));
                    at += n;
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "prediction failed");
                for j in jobs.drain(..) {
                    let _ = j.reply.send(Err(BatchError::Failed(e.to_string())));
                }
            }
        }
    }
}

fn set_dense(predictor: &mut Predictor, dense: DenseModel) {
    metrics::gauge!(m::DENSE_VERSION).set(dense.version as f64);
    tracing::info!(version = dense.version, "dense parameters replaced");
    predictor.set_dense(dense);
}
