//! The training and evaluation loops against the parameter servers.
//!
//! Per batch (DESIGN.md, "One training step"): plan (dedup ids per table, group by server) -> one pull request
//! per server, all in parallel -> gather rows -> dense forward/backward and optimizer step -> sum gradients per
//! unique id -> one push request per server. With a staleness bound `k > 0`, the pull of batch `t+1` is sent
//! before batch `t` is computed, and up to `k` batch pushes may await acknowledgement while training goes on;
//! `k = 0` is synchronous (every push is acknowledged before the next pull).
//!
//! Gradients are pushed loss-scaled: the model returns `d(mean loss)/d row`, which is multiplied by the batch
//! size (making it the sum of per-sample gradients, of order 1e-3..1) before f16 encoding, and the scale travels
//! in the request so the server divides it out. Without it most row gradients of a 2048 batch would fall in
//! f16's subnormal range.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use bytes::Bytes;
use protocol::{ProtocolError, PsClient, ShardMap, TableCount};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::config::ModelArgs;
use crate::criteo::{Batch, BatchReader, ReadStats, ReaderConfig};
use crate::eval::{EvalReport, Evaluator};
use crate::metrics as m;
use crate::model::Dlrm;
use crate::plan::Plan;

/// What one pass over the training data did.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// Samples trained on.
    pub samples: u64,
    /// Batches trained on.
    pub batches: u64,
    /// Wall-clock seconds of the pass (reading, pulls, compute and pushes; the last pushes acknowledged).
    pub seconds: f64,
    /// Mean training loss over the last 10% of the samples (at least the last batch).
    pub final_loss: f64,
    /// Mean training loss over the whole pass.
    pub mean_loss: f64,
    /// Gradient rows the servers rejected as non-finite.
    pub rejected_nonfinite: u64,
    /// The reader's counts (bad lines, padded lines).
    pub read: ReadStats,
}

/// Progress of a running pass, reported every progress interval.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Samples so far.
    pub samples: u64,
    /// Seconds since the pass began.
    pub seconds: f64,
    /// Samples per second over the last interval.
    pub samples_per_sec: f64,
    /// Mean loss over the last interval.
    pub loss: f64,
}

type PullResult = Result<Vec<(usize, Bytes)>, ProtocolError>;

struct Stage {
    batch: Batch,
    plan: Plan,
    pull: JoinHandle<PullResult>,
}

/// A DLRM trainer connected to a parameter-server cluster.
pub struct Trainer {
    client: Arc<PsClient>,
    args: ModelArgs,
    model: Dlrm,
    map: ShardMap,
    free_plans: Vec<Plan>,
    unique_rows: Vec<Vec<f32>>,
    emb: Vec<f32>,
    emb_grad: Vec<f32>,
    grads: Vec<Vec<f32>>,
}

impl Trainer {
    /// Registers the embedding tables on every server and builds the dense model.
    pub async fn new(client: Arc<PsClient>, args: ModelArgs) -> anyhow::Result<Trainer> {
        args.validate()
            .map_err(anyhow::Error::msg)
            .context("invalid model config")?;
        let dlrm = args.dlrm();
        let num_sparse = dlrm.num_sparse;
        client
            .register_tables(&args.table_specs(num_sparse))
            .await
            .context("register embedding tables")?;
        let model = Dlrm::new(dlrm, args.dense_optimizer(), args.seed).context("build DLRM")?;
        Ok(Trainer {
            map: client.shard_map(),
            client,
            args,
            model,
            free_plans: Vec::new(),
            unique_rows: Vec::new(),
            emb: Vec::new(),
            emb_grad: Vec::new(),
            grads: Vec::new(),
        })
    }

    /// The dense model.
    pub fn model(&self) -> &Dlrm {
        &self.model
    }

    fn start(&mut self, batch: Batch) -> Stage {
        let mut plan = self.free_plans.pop().unwrap_or_default();
        plan.build(&batch.sparse, self.args.emb_dim, &self.map);
        let requests: Vec<(usize, Vec<TableCount>, Vec<u8>)> = (0..self.map.num_servers as usize)
            .filter(|&s| plan.has_work(s))
            .map(|s| {
                let (counts, ids) = plan.pull_request(s);
                (s, counts, ids)
            })
            .collect();
        let client = self.client.clone();
        let encoding = self.args.encoding;
        let started = Instant::now();
        let rows = plan.unique_ids() as u64;
        let pull = tokio::spawn(async move {
            let mut set = JoinSet::new();
            for (s, counts, ids) in requests {
                let client = client.clone();
                set.spawn(async move {
                    client
                        .pull(s, encoding, counts, Bytes::from(ids))
                        .await
                        .map(|b| (s, b))
                });
            }
            let mut out = Vec::with_capacity(set.len());
            while let Some(joined) = set.join_next().await {
                out.push(joined.expect("pull task panicked")?);
            }
            let received: usize = out.iter().map(|(_, b)| b.len()).sum();
            metrics::histogram!(m::PULL_SECONDS).record(started.elapsed().as_secs_f64());
            metrics::counter!(m::ROWS_PULLED_TOTAL).increment(rows);
            metrics::counter!(m::WIRE_BYTES_RECEIVED_TOTAL).increment(received as u64);
            metrics::counter!(m::RAW_BYTES_RECEIVED_TOTAL)
                .increment((received / encoding.bytes_per_element() * 4) as u64);
            Ok(out)
        });
        Stage { batch, plan, pull }
    }

    /// Waits for a stage's rows and lays them out as the model's input in `self.emb`.
    async fn receive(&mut self, stage: &mut Stage) -> anyhow::Result<()> {
        let replies = (&mut stage.pull)
            .await
            .context("pull task")?
            .context("pull embedding rows")?;
        for (s, bytes) in replies {
            stage
                .plan
                .scatter_pulled(s, &bytes, self.args.encoding, &mut self.unique_rows)
                .with_context(|| format!("rows from server {}", self.client.addr(s)))?;
        }
        stage
            .plan
            .gather_embeddings(&self.unique_rows, &mut self.emb);
        Ok(())
    }

    fn next_batch(reader: &mut BatchReader) -> anyhow::Result<Option<Batch>> {
        match tokio::task::block_in_place(|| reader.next()) {
            None => Ok(None),
            Some(Ok(b)) if b.len == 0 => Ok(None),
            Some(Ok(b)) => Ok(Some(b)),
            Some(Err(e)) => Err(e).context("read training data"),
        }
    }

    /// One pass over `reader`'s data. `progress` is called every progress interval.
    pub async fn train_pass(
        &mut self,
        reader_cfg: ReaderConfig,
        mut progress: impl FnMut(Progress),
    ) -> anyhow::Result<TrainReport> {
        let mut reader = BatchReader::spawn(reader_cfg).context("open training data")?;
        let k = self.args.max_in_flight;
        let in_flight = Arc::new(Semaphore::new(k.max(1)));
        let mut pushes: JoinSet<Result<(u64, u64), ProtocolError>> = JoinSet::new();
        let begin = Instant::now();
        let (mut samples, mut batches, mut rejected) = (0u64, 0u64, 0u64);
        let (mut window_loss, mut window_samples) = (0.0f64, 0u64);
        let mut last_report = Instant::now();
        let mut losses: Vec<(u64, f32)> = Vec::new();

        // Staleness of a batch: earlier batches whose pushes its pull cannot see (outstanding pushes, plus the
        // batch still being computed when the pull is a prefetch).
        let staleness = |sem: &Semaphore, computing: usize| {
            let outstanding = k.max(1) - sem.available_permits();
            metrics::histogram!(m::STALENESS_BATCHES).record((outstanding + computing) as f64);
        };
        let mut next = Self::next_batch(&mut reader)?.map(|b| {
            staleness(&in_flight, 0);
            self.start(b)
        });
        while let Some(mut stage) = next.take() {
            if k > 0 {
                // Prefetch: the pull of batch t+1 overlaps the compute of batch t.
                next = Self::next_batch(&mut reader)?.map(|b| {
                    staleness(&in_flight, 1);
                    self.start(b)
                });
            }
            self.receive(&mut stage).await?;
            let b = stage.batch.len;
            self.emb_grad.resize(self.emb.len(), 0.0);
            let compute_start = Instant::now();
            let (model, emb, emb_grad, batch) =
                (&mut self.model, &self.emb, &mut self.emb_grad, &stage.batch);
            let loss = tokio::task::block_in_place(|| {
                model.train_step(b, &batch.dense, emb, &batch.labels, emb_grad)
            })
            .context("train step")?;
            metrics::histogram!(m::COMPUTE_SECONDS).record(compute_start.elapsed().as_secs_f64());
            if !loss.is_finite() {
                bail!("training loss became {loss} at batch {batches}: lower --lr");
            }
            let scale = b as f32;
            stage
                .plan
                .reduce_gradients(&self.emb_grad, 1.0, &mut self.grads);
            for g in &mut self.grads {
                g.iter_mut().for_each(|x| *x *= scale);
            }
            let push = self.send_push(&mut stage.plan, scale);
            self.free_plans.push(stage.plan);
            let permit = in_flight
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore open");
            metrics::gauge!(m::PUSHES_IN_FLIGHT).increment(1.0);
            pushes.spawn(async move {
                let r = push.await;
                drop(permit);
                metrics::gauge!(m::PUSHES_IN_FLIGHT).decrement(1.0);
                r
            });
            if k == 0 {
                while let Some(r) = pushes.join_next().await {
                    rejected += r.expect("push task panicked").context("push gradients")?.1;
                }
                next = Self::next_batch(&mut reader)?.map(|b| {
                    staleness(&in_flight, 0);
                    self.start(b)
                });
            } else {
                while let Some(r) = pushes.try_join_next() {
                    rejected += r.expect("push task panicked").context("push gradients")?.1;
                }
            }
            samples += b as u64;
            batches += 1;
            losses.push((b as u64, loss));
            window_loss += loss as f64 * b as f64;
            window_samples += b as u64;
            metrics::counter!(m::SAMPLES_TOTAL).increment(b as u64);
            metrics::counter!(m::BATCHES_TOTAL).increment(1);
            if last_report.elapsed() >= self.args.progress_interval() {
                let secs = last_report.elapsed().as_secs_f64();
                let p = Progress {
                    samples,
                    seconds: begin.elapsed().as_secs_f64(),
                    samples_per_sec: window_samples as f64 / secs,
                    loss: window_loss / window_samples.max(1) as f64,
                };
                metrics::gauge!(m::SAMPLES_PER_SECOND).set(p.samples_per_sec);
                metrics::gauge!(m::LOSS).set(p.loss);
                progress(p);
                last_report = Instant::now();
                (window_loss, window_samples) = (0.0, 0);
            }
        }
        while let Some(r) = pushes.join_next().await {
            rejected += r.expect("push task panicked").context("push gradients")?.1;
        }
        let seconds = begin.elapsed().as_secs_f64();
        let read = reader.stats();
        metrics::counter!(m::BAD_LINES_TOTAL).increment(read.bad_lines);
        Ok(TrainReport {
            samples,
            batches,
            seconds,
            final_loss: tail_mean(&losses, samples / 10),
            mean_loss: tail_mean(&losses, samples),
            rejected_nonfinite: rejected,
            read,
        })
    }

    fn send_push(
        &mut self,
        plan: &mut Plan,
        scale: f32,
    ) -> impl std::future::Future<Output = Result<(u64, u64), ProtocolError>> {
        let encoding = self.args.encoding;
        let mut requests = Vec::new();
        let mut rows = 0u64;
        let mut bytes = 0usize;
        for s in 0..self.map.num_servers as usize {
            if !plan.has_work(s) {
                continue;
            }
            let (counts, payload) = plan.push_request(s, &self.grads, encoding);
            rows += counts.iter().map(|c| c.count as u64).sum::<u64>();
            bytes += payload.len();
            requests.push((s, counts, Bytes::from(payload)));
        }
        metrics::counter!(m::ROWS_PUSHED_TOTAL).increment(rows);
        metrics::counter!(m::WIRE_BYTES_SENT_TOTAL).increment(bytes as u64);
        let raw = rows as usize * 8 + rows as usize * self.args.emb_dim * 4;
        metrics::counter!(m::RAW_BYTES_SENT_TOTAL).increment(raw as u64);
        let client = self.client.clone();
        async move {
            let started = Instant::now();
            let mut set = JoinSet::new();
            for (s, counts, payload) in requests {
                let client = client.clone();
                set.spawn(async move { client.push(s, encoding, scale, counts, payload).await });
            }
            let (mut applied, mut rejected) = (0, 0);
            while let Some(r) = set.join_next().await {
                let (a, r) = r.expect("push task panicked")?;
                applied += a;
                rejected += r;
            }
            metrics::histogram!(m::PUSH_SECONDS).record(started.elapsed().as_secs_f64());
            Ok((applied, rejected))
        }
    }

    /// Predicts every row of `reader_cfg`'s data (pulling rows, pushing nothing) and scores the predictions.
    pub async fn evaluate(&mut self, reader_cfg: ReaderConfig) -> anyhow::Result<EvalReport> {
        let mut reader = BatchReader::spawn(reader_cfg).context("open test data")?;
        let mut evaluator = Evaluator::new();
        let mut next = Self::next_batch(&mut reader)?.map(|b| self.start(b));
        while let Some(mut stage) = next.take() {
            next = Self::next_batch(&mut reader)?.map(|b| self.start(b));
            self.receive(&mut stage).await?;
            let b = stage.batch.len;
            let (model, emb, batch) = (&mut self.model, &self.emb, &stage.batch);
            let probs = tokio::task::block_in_place(|| model.predict(b, &batch.dense, emb))
                .context("predict")?;
            evaluator.push(probs, &batch.labels);
            self.free_plans.push(stage.plan);
        }
        let report = evaluator.report();
        if let Some(auc) = report.auc {
            metrics::gauge!(m::EVAL_AUC).set(auc);
        }
        metrics::gauge!(m::EVAL_LOGLOSS).set(report.logloss);
        if report.positive_rate > 0.0 {
            metrics::gauge!(m::EVAL_CALIBRATION).set(report.mean_prediction / report.positive_rate);
        }
        Ok(report)
    }
}

/// Sample-weighted mean loss over the last `tail` samples (at least the last batch).
fn tail_mean(losses: &[(u64, f32)], tail: u64) -> f64 {
    let (mut n, mut sum) = (0u64, 0.0f64);
    for &(b, l) in losses.iter().rev() {
        n += b;
        sum += l as f64 * b as f64;
        if n >= tail {
            break;
        }
    }
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_mean_weights_by_samples() {
        let l = [(10, 1.0), (10, 3.0), (5, 5.0)];
        assert_eq!(tail_mean(&l, 5), 5.0);
        assert!((tail_mean(&l, 15) - (30.0 + 25.0) / 15.0).abs() < 1e-9);
        assert!(tail_mean(&[], 3).is_nan());
    }
}
