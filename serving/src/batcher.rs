//! Micro-batching: requests hand their parsed rows to one predicting thread, which gathers the rows of the
//! requests arriving within `--batch-deadline-us` of the first (default 0: those already queued, which
//! arrived while the previous batch was predicted; up to `--max-batch-rows`) into one batch,
//! predicts it once and answers each request with its share. One thread owns the model, so a new dense
//! version ([`Batcher::set_dense`]) takes effect between two batches: no prediction mixes two versions.
//! The model's own work is parallel (rayon over chunks of rows).

use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Rows of requests waiting for the predicting thread at most; a request past it is refused at once
    /// ([`BatchError::Full`]: 503 with `Retry-After`). A request alone in the queue is always taken.
    pub max_queued_rows: usize,
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
    /// The queue holds `queued` rows: this request's `rows` would pass `max`.
    #[error("the prediction queue holds {queued} rows; {rows} more would pass --max-queued-rows {max}: retry later")]
    Full {
        /// Rows queued.
        queued: usize,
        /// This request's rows.
        rows: usize,
        /// The limit.
        max: usize,
    },
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
    /// Rows of requests sent and not yet answered (or given up).
    queued: Arc<AtomicUsize>,
    max_queued: usize,
}

/// A request's rows counted in the queue until it is answered or its caller gives up.
struct Queued<'a> {
    queued: &'a AtomicUsize,
    rows: usize,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let left = self.queued.fetch_sub(self.rows, Ordering::AcqRel) - self.rows;
        metrics::gauge!(m::QUEUED_ROWS).set(left as f64);
    }
}

/// Counts `rows` more in `queued` unless that passes `max` while other rows are queued (a request alone is
/// always taken: `max-rows` bounds it).
fn admit(queued: &AtomicUsize, rows: usize, max: usize) -> Result<Queued<'_>, BatchError> {
    let before = queued.fetch_add(rows, Ordering::AcqRel);
    let counted = Queued { queued, rows };
    if before > 0 && before + rows > max {
        metrics::counter!(m::QUEUE_FULL_TOTAL).increment(1);
        return Err(BatchError::Full {
            queued: before,
            rows,
            max,
        });
    }
    metrics::gauge!(m::QUEUED_ROWS).set((before + rows) as f64);
    Ok(counted)
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
        let batcher = Batcher {
            tx,
            queued: Arc::default(),
            max_queued: limits.max_queued_rows,
        };
        Ok((batcher, handle))
    }

    /// Predicts `batch`'s rows (with those of concurrent requests).
    pub async fn predict(&self, batch: Batch) -> Result<Prediction, BatchError> {
        let _queued = admit(&self.queued, batch.len, self.max_queued)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_takes_a_lone_request_and_refuses_past_its_rows() {
        let queued = AtomicUsize::new(0);
        let big = admit(&queued, 100, 10).expect("alone, a request is always taken");
        let err = admit(&queued, 1, 10).err().expect("past the limit");
        assert!(matches!(
            err,
            BatchError::Full {
                queued: 100,
                rows: 1,
                max: 10
            }
        ));
        assert!(err.to_string().contains("--max-queued-rows 10"), "{err}");
        assert_eq!(
            queued.load(Ordering::Acquire),
            100,
            "a refusal counts nothing"
        );
        drop(big);
        let a = admit(&queued, 6, 10).unwrap();
        let b = admit(&queued, 4, 10).unwrap();
        assert!(admit(&queued, 1, 10).is_err());
        drop(a);
        let _c = admit(&queued, 6, 10).unwrap();
        drop(b);
        assert_eq!(queued.load(Ordering::Acquire), 6);
    }
}
