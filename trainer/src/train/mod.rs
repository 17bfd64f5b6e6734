//! The training and evaluation loops against the parameter servers.
//!
//! Stages (DESIGN.md, "One training step"), each behind a bounded queue: parse (reader thread) -> plan (dedup
//! ids per table, group by server; plan thread, [`crate::step::pipeline`]) -> pull (one request per server, in
//! parallel, up to `k` batches ahead of compute) -> compute (dense forward/backward and optimizer step) -> push
//! (gradients summed per unique id, one request per server, not awaited).
//!
//! The staleness bound `k` (`--max-in-flight`): the pull of a pass's batch `n` is sent only once at least
//! `n - k` of the earlier batches' pushes are acknowledged, so the rows it reads lack at most `k` batches of
//! updates (the `trainer_staleness_batches` histogram records the exact number). While batch `t` computes, the
//! pulls of batches `t+1 ..= t+k` are in flight. `k = 0` is synchronous and deterministic: every push is
//! acknowledged before the next pull is sent.
//!
//! With dense parameters on the servers (several trainers, [`crate::step::dense_sync`]), each batch's pull also
//! fetches the dense parameters and its push carries the step's dense parameter change, under the same gate.
//!
//! Gradients are pushed loss-scaled: the model returns `d(mean loss)/d row`, which is multiplied by the batch
//! size (making it the sum of per-sample gradients, of order 1e-3..1) before f16 encoding, and the scale travels
//! in the request so the server divides it out. Without it most row gradients of a 2048 batch would fall in
//! f16's subnormal range.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use protocol::transport::{Dialer, NetDialer};
use protocol::{Encoding, PsClient, ShardMap};

use crate::checkpoint::{self as ckpt, Checkpoint, CheckpointMeta};
use crate::config::ModelArgs;
use crate::criteo::{Batch, BatchReader, ReaderConfig};
use crate::metrics as m;
use crate::model::eval::{EvalReport, Evaluator};
use crate::model::Dlrm;
use crate::step::dense_reduce::{DenseReduce, StepOutcome};
use crate::step::dense_sync::DenseSync;
use crate::step::exchange::pull_all;
use crate::step::push::SharedResiduals;
use crate::step::replay::Replayer;
use protocol::plan::{Plan, SparseLayout, TableCodecs};

pub use error::{Result, TrainError};
pub use report::{Event, PassOptions, Progress, TrainReport};

mod error;
mod eta;
mod pass;
mod report;
mod stages;
#[cfg(test)]
mod tests;

use stages::Stage;

/// A DLRM trainer connected to a parameter-server cluster.
pub struct Trainer<D: Dialer = NetDialer> {
    client: Arc<PsClient<D>>,
    args: ModelArgs,
    model: Dlrm,
    map: ShardMap,
    dense: Option<DenseSync>,
    /// The hybrid dense mode's per-step gradient sum over the trainers ([`crate::step::dense_reduce`]).
    reduce: Option<DenseReduce<D>>,
    /// Hybrid mode, rank 0: publishes the dense parameters to the servers' dense table (for evaluation and
    /// checkpoints of the model the servers hold).
    publish: Option<DenseSync>,
    /// The next step of the dense reduce (batches, plus the zero steps of a trainer out of data).
    reduce_step: u64,
    rank: usize,
    world: usize,
    /// Batches trained so far, including those of the run a checkpoint resumed.
    step: u64,
    /// Samples trained so far, likewise.
    samples: u64,
    /// The epoch (pass over the data) this trainer is in, from 0.
    epoch: u64,
    /// The step at which this epoch began: the pass skips `step - epoch_start_step` batches of its data
    /// (a resumed run's position within the epoch).
    epoch_start_step: u64,
    free_plans: Vec<Plan>,
    unique_rows: Vec<Vec<f32>>,
    emb: Vec<f32>,
    emb_grad: Vec<f32>,
    /// Pull and push encodings per table.
    codecs: TableCodecs,
    /// Error-feedback residuals of lossy pushes (used by the push encoder thread during a pass).
    residuals: SharedResiduals,
    /// Replays this trainer's pushes in flight on stale pulled rows (`--replay-own-updates`).
    replayer: Option<Replayer>,
    /// Optimizer state of the pulled rows, per table (`[unique_t x state_len_t]`), when replaying.
    unique_state: Vec<Vec<f32>>,
    /// The model's sparse side as the plans see it (tables, dimensions, pooling).
    layout: SparseLayout,
    /// The model's sparse side as the readers see it (columns, id salts, caps, token limits).
    features: criteo::FeatureLayout,
    /// Embedding bytes on the wire so far: `[sent, received]`.
    wire: Arc<[std::sync::atomic::AtomicU64; 2]>,
}

impl<D: Dialer> Trainer<D> {
    /// Registers the embedding tables on every server and builds the dense model (rank 0 of 1, dense
    /// parameters on the trainer).
    pub async fn new(client: Arc<PsClient<D>>, args: ModelArgs) -> Result<Trainer<D>> {
        Self::with_ranks(client, args, 0, 1, false).await
    }

    /// Like [`new`](Self::new) for rank `rank` of `world`; with `dense_on_ps` the dense parameters live on the
    /// servers ([`crate::step::dense_sync`]), which several trainers need.
    pub async fn with_ranks(
        client: Arc<PsClient<D>>,
        args: ModelArgs,
        rank: usize,
        world: usize,
        dense_on_ps: bool,
    ) -> Result<Trainer<D>> {
        args.validate()?;
        let spec = args.spec()?;
        let args = args.with_spec(&spec);
        let dlrm = spec.dlrm_config();
        let mut model = Dlrm::new(dlrm.clone(), args.dense_optimizer(), args.seed)
            .map_err(TrainError::model("build DLRM"))?;
        let precision = args.dense_precision.resolve();
        model
            .set_precision(precision)
            .map_err(TrainError::model("--dense-precision"))?;
        let kernel = crate::model::bf16_kernel().map(|k| k.to_string());
        tracing::info!(?precision, ?kernel, "dense precision");
        // A short last batch counts for its samples; W trainers divide by W times this (dense_reduce).
        model.set_batch_divisor(args.batch_size);
        model.set_lr_decay(crate::model::optim::LrDecay {
            start: args.lr_decay_start,
            steps: args.lr_decay_steps,
        });
        let codecs = spec.codecs(args.no_feedback());
        // Error feedback keeps rows of one dimension (validate checked the tables that use it agree).
        let feedback_dim = (0..spec.tables.len())
            .find(|&t| codecs.feedback_for(codecs.push_of(t)))
            .map_or(args.emb_dim, |t| spec.tables[t].dim);
        let residuals = Arc::new(std::sync::Mutex::new(
            args.residual_store_of_dim(&codecs, feedback_dim),
        ));
        let mut tables = spec.table_configs(args.seed, args.emb_init_scale);
        let replayer = args.replay_own_updates.then(|| Replayer::new(&tables));
        let map = client.shard_map();
        let hybrid =
            dense_on_ps && world > 1 && args.dense_mode == crate::config::DenseMode::Hybrid;
        if dense_on_ps {
            tables.push(DenseSync::table_config());
        }
        let dense = (dense_on_ps && !hybrid).then(|| {
            DenseSync::new(&model, &map, rank).with_push_fraction(args.dense_push_fraction)
        });
        let reduce = hybrid.then(|| {
            let group = args
                .reduce_group
                .unwrap_or_else(|| default_group(&args, world));
            DenseReduce::new(
                client.clone(),
                &model,
                (group, rank, world),
                args.reduce_timeout_secs,
                args.on_missing_trainer,
                args.reduce_encoding,
            )
            .with_overlap(args.dense_staleness > 0)
        });
        let publish = (hybrid && rank == 0).then(|| DenseSync::new(&model, &map, rank));
        client
            .register_tables(&tables)
            .await
            .map_err(TrainError::servers("register embedding tables"))?;
        Ok(Trainer {
            map,
            client,
            args,
            model,
            dense,
            reduce,
            publish,
            reduce_step: 0,
            rank,
            world,
            step: 0,
            samples: 0,
            epoch: 0,
            epoch_start_step: 0,
            free_plans: Vec::new(),
            unique_rows: Vec::new(),
            emb: Vec::new(),
            emb_grad: Vec::new(),
            codecs,
            residuals,
            replayer,
            unique_state: Vec::new(),
            layout: spec.sparse_layout(),
            features: spec.feature_layout(),
            wire: Arc::default(),
        })
    }

    /// The dense model.
    pub fn model(&self) -> &Dlrm {
        &self.model
    }

    /// Batches trained so far (including a resumed run's).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The epoch this trainer is in (from 0; a resumed run's).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Starts epoch `epoch` at the current step: the next pass reads its data from the beginning.
    pub fn begin_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.epoch_start_step = self.step;
    }

    /// Restores the checkpoint of this rank from `dir`: dense parameters and optimizer state, step and data
    /// position. The servers must hold the matching state (still running, or restored from `dir/ps`).
    pub fn resume(&mut self, dir: &std::path::Path) -> Result<CheckpointMeta> {
        let ckpt = Checkpoint::read(dir, self.rank)?;
        ckpt.check_job(dir, self.rank, self.world, self.args.batch_size)?;
        ckpt.restore_into(&mut self.model, dir)?;
        let mut residuals = self.residuals.lock().unwrap_or_else(|p| p.into_inner());
        match (residuals.as_mut(), ckpt.residuals.is_empty()) {
            (Some(store), false) => store
                .import(&ckpt.residuals)
                .map_err(|source| TrainError::Residuals {
                    path: ckpt::file_path(dir, self.rank),
                    source,
                })?,
            (None, false) => tracing::warn!(
                "the checkpoint holds error-feedback residuals but error feedback is off: they are dropped"
            ),
            _ => {}
        }
        drop(residuals);
        if let Some(dense) = &mut self.dense {
            dense.set_residual(&ckpt.dense_residual)?;
        }
        self.step = ckpt.meta.step;
        self.reduce_step = ckpt.meta.step;
        if let Some(reduce) = &mut self.reduce {
            // Every rank resumes from the same step: a group of its own, so the steps the crashed run
            // finalized (kept by the servers for a while) cannot answer the resumed run's.
            let base =
                (self.args.reduce_group).unwrap_or_else(|| default_group(&self.args, self.world));
            reduce.set_group(base ^ resumed_salt(ckpt.meta.step));
        }
        self.samples = ckpt.meta.samples;
        self.epoch = ckpt.meta.epoch;
        self.epoch_start_step = ckpt.meta.epoch_start_step;
        Ok(ckpt.meta)
    }

    /// Pulls the dense parameters from the servers now (with dense parameters on the servers; else a no-op).
    pub async fn refresh_dense(&mut self) -> Result<()> {
        let Some(dense) = &mut self.dense else {
            return Ok(());
        };
        let replies = pull_all(&self.client, Encoding::F32, dense.pull_requests())
            .await
            .map_err(TrainError::servers("pull dense parameters"))?;
        dense.apply_pulled(&replies, &mut self.model)?;
        Ok(())
    }

    /// Hybrid mode, rank 0: makes the servers' dense table hold this trainer's dense parameters (every
    /// trainer's are the same); else a no-op.
    async fn publish_dense(&mut self) -> Result<()> {
        let Some(publish) = &mut self.publish else {
            return Ok(());
        };
        let replies = pull_all(&self.client, Encoding::F32, publish.pull_requests())
            .await
            .map_err(TrainError::servers("pull dense parameters to publish"))?;
        let requests = publish
            .publish(&replies, &self.model)?
            .into_iter()
            .map(|(s, counts, payload)| (s, Encoding::F32, 1.0, counts, payload))
            .collect();
        crate::step::exchange::push_all(&self.client, requests)
            .await
            .map_err(TrainError::servers("publish dense parameters"))?;
        Ok(())
    }

    /// One step of the hybrid mode's dense reduce: this trainer's gradients of `samples` samples (0 and
    /// `done` when it is out of data) summed with the other trainers', then the optimizer step.
    async fn reduce_dense(&mut self, samples: u64, done: bool) -> Result<Option<StepOutcome>> {
        let Some(reduce) = &mut self.reduce else {
            return Ok(None);
        };
        let started = Instant::now();
        let outcome = reduce
            .step(self.reduce_step, &mut self.model, samples, done)
            .await?;
        self.reduce_step += 1;
        metrics::histogram!(m::REDUCE_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(Some(outcome))
    }

    /// Hybrid mode with `--dense-staleness 1`: applies the dense reduce in flight (before an evaluation, a
    /// checkpoint or the end of a pass); else a no-op. Returns its outcome.
    async fn flush_dense(&mut self) -> Result<Option<StepOutcome>> {
        let Some(reduce) = &mut self.reduce else {
            return Ok(None);
        };
        let started = Instant::now();
        let outcome = reduce.flush(&mut self.model).await?;
        if outcome.is_some() {
            metrics::histogram!(m::REDUCE_SECONDS).record(started.elapsed().as_secs_f64());
        }
        Ok(outcome)
    }

    /// `--init-output-bias`: before the job's first step, shifts the output bias so that the mean prediction
    /// on the first batch equals its positive rate (in the hybrid mode, the shift averaged over the trainers'
    /// first batches, so every replica gets the same).
    async fn start_output_bias(&mut self, batch: &Batch) -> Result<()> {
        let b = batch.len;
        if b == 0 {
            return Ok(());
        }
        let rate = batch.labels.iter().sum::<f32>() / b as f32;
        let (model, emb) = (&mut self.model, &self.emb);
        let probs = tokio::task::block_in_place(|| model.predict(b, &batch.dense, emb))
            .map_err(TrainError::model("predict the first batch"))?;
        let mut shift = crate::model::loss::logit_shift_to_rate(probs, rate);
        if let Some(reduce) = &mut self.reduce {
            let (h, sums) = reduce
                .sum(self.reduce_step, vec![shift * b as f32], b as u64, false)
                .await?;
            self.reduce_step += 1;
            shift = sums[0] / h.samples.max(1) as f32;
        }
        self.model.shift_output_bias(shift);
        tracing::info!(
            shift,
            rate,
            "output bias started at the first batch's positive rate"
        );
        Ok(())
    }

    /// Forward, backward and the dense optimizer step (also with dense parameters on the servers, which
    /// receive the step's delta: [`crate::step::dense_sync`]); returns the loss.
    fn compute(&mut self, batch: &Batch) -> Result<f32> {
        let b = batch.len;
        self.emb_grad.resize(self.emb.len(), 0.0);
        let started = Instant::now();
        let (model, emb, emb_grad) = (&mut self.model, &self.emb, &mut self.emb_grad);
        // Hybrid mode: the optimizer step waits for the other trainers' gradients (train_batch).
        let hybrid = self.reduce.is_some();
        let loss = tokio::task::block_in_place(|| {
            if hybrid {
                model.forward_backward(b, &batch.dense, emb, &batch.labels, emb_grad)
            } else {
                model.train_step(b, &batch.dense, emb, &batch.labels, emb_grad)
            }
        })
        .map_err(TrainError::model("train step"))?;
        metrics::histogram!(m::COMPUTE_SECONDS).record(started.elapsed().as_secs_f64());
        if !loss.is_finite() {
            return Err(TrainError::NonFiniteLoss {
                loss,
                step: self.step,
            });
        }
        Ok(loss)
    }

    /// Sends the dense parameters to server 0 (serving's delta sync picks them up), versioned by the time of
    /// publication in Unix µs: newer is larger across jobs and restarts too (the servers keep the largest),
    /// and an export's dense parameters are versioned by its creation time on the same scale.
    async fn publish_for_serving(&mut self) -> Result<()> {
        self.flush_dense().await?;
        let values: Vec<f32> = self.model.params().concat();
        let version = crate::model::export::now_unix_ms()
            .saturating_mul(1000)
            .max(1);
        self.client
            .publish_dense(version, self.step, &values)
            .await
            .map_err(TrainError::servers(
                "publish the dense parameters for serving",
            ))?;
        metrics::counter!(m::DENSE_PUBLISHED_TOTAL).increment(1);
        Ok(())
    }

    /// Rank 0 with `opts.export_dir`: writes an export of the current model (every push must be acknowledged)
    /// and returns its event; other ranks and jobs without an export directory do nothing.
    async fn export(&mut self, opts: &PassOptions) -> Result<Option<Event>> {
        let Some(root) = opts.export_dir.as_deref().filter(|_| self.rank == 0) else {
            return Ok(None);
        };
        self.flush_dense().await?;
        let spec = self.args.spec()?;
        let manifest = crate::model::export::ExportManifest {
            format: crate::model::export::EXPORT_FORMAT_VERSION,
            version: self.step,
            samples: self.samples,
            created_unix_ms: crate::model::export::now_unix_ms(),
            tables: spec.table_configs(self.args.seed, self.args.emb_init_scale),
            spec,
            precision: self.model.precision(),
            param_sizes: Vec::new(),
            num_shards: 0,
        };
        let started = Instant::now();
        let path = crate::export::write(
            &self.client,
            root,
            manifest,
            &self.model,
            opts.export_keep,
            opts.export_prune,
        )
        .await?;
        metrics::counter!(m::EXPORTS_TOTAL).increment(1);
        metrics::histogram!(m::EXPORT_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(Some(Event::Export {
            step: self.step,
            path,
        }))
    }

    /// Writes this rank's checkpoint into `dir` (every push must be acknowledged); rank 0 also has the
    /// servers snapshot their tables into `dir/ps`.
    async fn checkpoint(&mut self, dir: &std::path::Path) -> Result<Event> {
        let started = Instant::now();
        self.flush_dense().await?;
        self.publish_dense().await?;
        // Rank 0 snapshots the servers (the cut is exact with one trainer in synchronous mode: every push
        // of this rank is acknowledged; other ranks' pushes may straddle it).
        let ps_snapshot = self.rank == 0;
        if ps_snapshot {
            ckpt::ps_snapshot(&self.client, dir, self.step).await?;
            tokio::task::block_in_place(|| ckpt::commit_ps_snapshot(dir))?;
        }
        let meta = CheckpointMeta {
            step: self.step,
            samples: self.samples,
            rank: self.rank,
            world: self.world,
            batch_size: self.args.batch_size,
            dense_on_ps: self.dense.is_some(),
            ps_snapshot,
            optimizer_step: 0,
            param_sizes: Vec::new(),
            optimizer_sizes: Vec::new(),
            residual_bytes: 0,
            dense_residual_len: 0,
            epoch: self.epoch,
            epoch_start_step: self.epoch_start_step,
        };
        // Every push is acknowledged, so the encoder thread is idle and the residuals are final.
        let residuals = (self.residuals.lock().unwrap_or_else(|p| p.into_inner()))
            .as_ref()
            .map(|r| r.export())
            .unwrap_or_default();
        let dense_residual = self
            .dense
            .as_ref()
            .map(|d| d.residual().to_vec())
            .unwrap_or_default();
        let ckpt = Checkpoint::capture(&self.model, meta, residuals, dense_residual);
        let dir2 = dir.to_path_buf();
        let path = tokio::task::block_in_place(|| {
            let path = ckpt.write(&dir2)?;
            if ps_snapshot {
                ckpt::finish_ps_snapshot(&dir2)?;
            }
            Ok::<_, TrainError>(path)
        })?;
        metrics::counter!(m::CHECKPOINTS_TOTAL).increment(1);
        metrics::histogram!(m::CHECKPOINT_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(Event::Checkpoint {
            step: self.step,
            path,
            ps_snapshot,
        })
    }

    /// Predicts every row of `reader_cfg`'s data (pulling rows, pushing nothing) and scores the predictions;
    /// exports AUC, logloss and calibration as metrics.
    pub async fn evaluate(&mut self, mut reader_cfg: ReaderConfig) -> Result<EvalReport> {
        reader_cfg.layout = self.features.clone();
        let mut reader =
            BatchReader::spawn(reader_cfg).map_err(TrainError::data("open test data"))?;
        let mut evaluator = Evaluator::new();
        let mut next = self.next_eval_stage(&mut reader)?;
        while let Some(mut stage) = next.take() {
            next = self.next_eval_stage(&mut reader)?;
            self.receive(&mut stage, &VecDeque::new(), None).await?;
            let b = stage.batch.len;
            let (model, emb, batch) = (&mut self.model, &self.emb, &stage.batch);
            let probs = tokio::task::block_in_place(|| model.predict(b, &batch.dense, emb))
                .map_err(TrainError::model("predict"))?;
            evaluator.push(probs, &batch.labels);
            self.free_plans.push(stage.plan);
        }
        let report = evaluator.report();
        crate::metrics::export_eval(&report);
        Ok(report)
    }

    fn next_eval_stage(&mut self, reader: &mut BatchReader) -> Result<Option<Stage>> {
        let batch = match tokio::task::block_in_place(|| reader.next()) {
            None => return Ok(None),
            Some(Ok(b)) if b.len == 0 => return Ok(None),
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(TrainError::data("read test data")(e)),
        };
        let mut plan = self.free_plans.pop().unwrap_or_default();
        plan.build_with(
            &self.layout,
            batch.len,
            &batch.sparse,
            &batch.offsets,
            &self.map,
        );
        Ok(Some(self.start(batch, plan, None)))
    }
}

/// Mixed into the default reduce group of a job resumed at `step`.
fn resumed_salt(step: u64) -> u64 {
    step.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The reduce group of a job that names none (`--reduce-group`): the same for every trainer of the job.
fn default_group(args: &ModelArgs, world: usize) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (args.seed, world, args.batch_size, args.emb_dim).hash(&mut h);
    h.finish()
}
