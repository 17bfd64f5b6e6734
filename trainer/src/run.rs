//! One training job end to end, shared by `trainer train` and `trainer demo`: connect, train one pass per
//! epoch with progress lines (evaluating after each epoch but the last), evaluate, and summarize.
//!
//! A streaming job (`--follow` on a growing file, or `--train -` for standard input) is one pass that ends
//! on the shutdown signal (or at the end of standard input): the reader stops taking lines and hands out
//! the rows it holds, the pass trains them, drains its pushes and writes its checkpoint, and the job
//! evaluates and summarizes as any other.

use std::future::Future;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use protocol::{PsClient, PsClientConfig};
use serde::Serialize;

use crate::config::{ClusterArgs, ModelArgs};
use crate::criteo::{ReaderConfig, StreamEnd};
use crate::model::eval::EvalReport;
use crate::progressive::ProgressiveReport;
use crate::tensorboard::TrainLog;
use crate::timing::TimeReport;

mod inputs;
use crate::train::{Event, PassOptions, TrainReport, Trainer};
pub use inputs::Inputs;

/// Job flags beyond the model: periodic evaluation, checkpoints and resume, dense placement, an early stop.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct JobArgs {
    /// Evaluate on the test set every N training steps as well as at the end (rank 0 only; 0 = at the end).
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Write checkpoints (dense parameters, optimizer state, data position, step; rank 0 adds the servers'
    /// snapshot in DIR/ps when they support it) into DIR, every --checkpoint-every steps and at the end.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0 = only at the end).
    #[arg(long, default_value_t = 0, requires = "checkpoint_dir")]
    pub checkpoint_every: u64,
    /// Continue from this rank's checkpoint in DIR (the servers must hold the matching state).
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Stop once this many steps are done (counting a resumed run's; 0 = every epoch's pass).
    #[arg(long, default_value_t = 0)]
    pub max_steps: u64,
    /// Passes over the training data. With more than one, each epoch reads the data in its own seeded order
    /// (columnar shards: files and rows permuted; text: files permuted, lines in order) and rank 0
    /// evaluates on the test set after each epoch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub epochs: u64,
    /// Seed of the epochs' orders (epoch e reads with a seed mixed from this and e).
    #[arg(long, default_value_t = 0)]
    pub shuffle_seed: u64,
    /// Keep the dense parameters on the parameter servers (implied by --world > 1).
    #[arg(long)]
    pub dense_on_ps: bool,
    /// Scheduling policy of the trainer's helper threads (I/O, plan, push encoder, reader): `batch` (Linux
    /// SCHED_BATCH) lets a helper that wakes wait for a free core or the next scheduler tick instead of
    /// preempting the training loop or a compute worker in the middle of a parallel step; `normal` is the
    /// system's default. Batch was 12-17% faster on two shared cores (issue-44.md section 10).
    #[arg(long, default_value_t = base::sched::Policy::Batch, env = "TRAINER_HELPER_THREADS")]
    pub helper_threads: base::sched::Policy,
    /// Write a servable model (dense parameters, the servers' snapshot, the resolved model spec:
    /// docs/serving.md) into DIR/v<step> at every checkpoint, every --export-every steps and at the end
    /// (rank 0); DIR/LATEST names the newest.
    #[arg(long, value_name = "DIR")]
    pub export_dir: Option<PathBuf>,
    /// Steps between exports besides the checkpoints (0 = at checkpoints and the end only).
    #[arg(long, default_value_t = 0, requires = "export_dir")]
    pub export_every: u64,
    /// Exports kept in --export-dir (older ones are removed).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub export_keep: u64,
    /// Leave out of each export the rows untouched for this many seconds (publish-time pruning: in tables
    /// that keep last-update stamps, those with a TTL; the servers keep the rows).
    #[arg(long, value_name = "SECS", requires = "export_dir", value_parser = clap::value_parser!(u64).range(1..))]
    pub export_prune_age_secs: Option<u64>,
    /// Leave out of each export the rows counted fewer than N updates (in tables that keep counts: those with
    /// an LFU row cap; the counts decay with its `decay_secs`).
    #[arg(long, value_name = "N", requires = "export_dir", value_parser = clap::value_parser!(u32).range(1..))]
    pub export_prune_min_count: Option<u32>,
    /// Leave out of each export the rows scored below S (in tables that evict by a score the trainer gives:
    /// eviction policy `score`; the scores decay with its `decay_secs`).
    #[arg(long, value_name = "S", requires = "export_dir", value_parser = positive_score)]
    pub export_prune_min_score: Option<f32>,
    /// Publish the dense parameters to server 0 every N steps (rank 0; 0 = never), versioned by the step:
    /// serving processes following the servers (`ps-serve --subscribe`) swap them in (docs/serving.md).
    #[arg(long, default_value_t = 0)]
    pub publish_dense_every: u64,
    /// Use the test set only for periodic evaluations (the demo evaluates once every trainer is done).
    #[arg(long, hide = true)]
    pub skip_final_eval: bool,
    /// Rows of progressive validation's sliding window: the AUC and logloss of the predictions each
    /// training batch gets before training on its rows, over the last N rows, on the progress lines, the
    /// `trainer_progressive_*` gauges and the summary (0 = off).
    #[arg(long, default_value_t = 100_000)]
    pub progressive_window: usize,
    /// Write TensorBoard event files into DIR (created if missing; with several trainers, rank r writes
    /// DIR/rank<r>): at every progress line the training loss, calibration, progressive AUC and logloss,
    /// samples/s, the step's time by phase, the CPU per process and the rows pulled and pushed per table;
    /// every evaluation's AUC, logloss and calibration; the run's summary at its end.
    #[arg(long, value_name = "DIR")]
    pub tensorboard_dir: Option<PathBuf>,
    /// Process ids of local parameter servers whose CPU seconds the summary reports (`trainer demo` sets it).
    #[arg(long, value_delimiter = ',', hide = true)]
    pub local_server_pids: Vec<u32>,
}

impl JobArgs {
    /// The number of epochs (at least 1: a `Default` job has one).
    pub fn epochs(&self) -> u64 {
        self.epochs.max(1)
    }
}

/// One evaluation in the summary.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct EvalPoint {
    /// The trainer's step when it ran.
    pub step: u64,
    /// The epochs completed when it ran, for the evaluations at the end of an epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Test AUC.
    pub auc: Option<f64>,
    /// Test logloss.
    pub logloss: f64,
    /// Mean prediction over positive rate.
    pub calibration: Option<f64>,
}

impl EvalPoint {
    fn new(step: u64, r: &EvalReport) -> EvalPoint {
        EvalPoint {
            step,
            epoch: None,
            auc: r.auc,
            logloss: r.logloss,
            calibration: r.calibration(),
        }
    }
}

/// The end-of-run summary, printed and written as JSON by `--summary-json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Training samples.
    pub samples: u64,
    /// Seconds of the training pass.
    pub seconds: f64,
    /// Training samples per second.
    pub samples_per_sec: f64,
    /// Mean training loss over the last 10% of the samples.
    pub train_loss: f64,
    /// Test AUC (absent without test data, or with a single class).
    pub auc: Option<f64>,
    /// Test logloss.
    pub logloss: Option<f64>,
    /// AUC of the generator's true click probabilities on the same test rows (generated data only).
    pub oracle_auc: Option<f64>,
    /// Test samples.
    pub test_samples: u64,
    /// Mean prediction over positive rate on the test rows.
    pub calibration: Option<f64>,
    /// Malformed training lines skipped.
    pub bad_lines: u64,
    /// Gradient rows the servers rejected as non-finite.
    pub rejected_nonfinite: u64,
    /// The trainer's final step (batches, including a resumed run's).
    pub step: u64,
    /// Trainers that trained (the demo's combined summary adds them up).
    pub trainers: usize,
    /// Every evaluation: the periodic ones, then the final one.
    pub evals: Vec<EvalPoint>,
    /// Embedding rows and gradients on the wire during training, both directions (bytes).
    #[serde(default)]
    pub wire_bytes: u64,
    /// Progressive validation over the last `--progressive-window` training rows at the end (rank 0's in
    /// the demo's combined summary).
    #[serde(default)]
    pub progressive: Option<ProgressiveReport>,
    /// Times the client moved a replicated shard to another replica (docs/replication.md).
    #[serde(default)]
    pub failovers: u64,
    /// Times the client followed a new shard map (a live reshard, docs/replication.md).
    #[serde(default)]
    pub map_changes: u64,
    /// Where the training time went: the loop's phases, the stage threads, CPU seconds of the trainer and
    /// of the local servers ([`crate::timing`]; rank 0's in the demo's combined summary).
    #[serde(default)]
    pub time: TimeReport,
    /// Unique rows pulled and pushed per table during training.
    #[serde(default)]
    pub table_rows: Vec<TableRows>,
}

/// One table's rows in the summary.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TableRows {
    /// The table's name.
    pub table: String,
    /// Unique rows pulled by training batches.
    pub pulled: u64,
    /// Unique gradient rows pushed.
    pub pushed: u64,
}

impl Summary {
    /// Human-readable lines.
    pub fn render(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.4}"));
        format!(
            "samples         {}\nseconds         {:.2}\nsamples/s       {:.0}\nfinal train loss {:.4}\nprogressive AUC {}\ntest AUC        {}\ntest logloss    {}\noracle AUC      {}\ntest samples    {}\ncalibration     {}\nbad lines       {}\nwire bytes/sample {:.0}\n",
            self.samples,
            self.seconds,
            self.samples_per_sec,
            self.train_loss,
            match &self.progressive {
                Some(p) => format!(
                    "{} (logloss {:.4}, last {} training rows)",
                    opt(p.auc),
                    p.logloss,
                    p.rows
                ),
                None => "n/a".to_string(),
            },
            opt(self.auc),
            opt(self.logloss),
            opt(self.oracle_auc),
            self.test_samples,
            opt(self.calibration),
            self.bad_lines,
            self.wire_bytes as f64 / self.samples.max(1) as f64,
        ) + &if self.time.steps > 0 {
            self.time.render(self.samples)
        } else {
            String::new()
        }
    }

    /// Writes the summary as JSON.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("write summary {}", path.display()))
    }
}

/// Connects to the cluster (flags checked, names resolved).
pub async fn connect(cluster: &ClusterArgs) -> anyhow::Result<Arc<PsClient>> {
    anyhow::ensure!(
        cluster.resolve_timeout_secs.is_finite() && cluster.resolve_timeout_secs >= 0.0,
        "resolve-timeout-secs = {}, expected a number of seconds >= 0",
        cluster.resolve_timeout_secs
    );
    let servers = protocol::cluster::resolve_servers(
        &cluster.ps,
        std::time::Duration::from_secs_f64(cluster.resolve_timeout_secs),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    let mut cfg = PsClientConfig::replicated(servers, cluster.tls_dir.clone());
    cfg.read_from_backups = cluster.read_from_backups;
    cfg.server_name = cluster.server_name.clone();
    cfg.transport = cluster.transport;
    Ok(Arc::new(
        PsClient::connect(cfg)
            .await
            .context("connect to the parameter servers")?,
    ))
}

/// Connects to the cluster, trains `job.epochs()` passes (resuming a checkpoint if asked, within its epoch)
/// and evaluates. A streaming job's pass ends when `shutdown` resolves (or standard input closes); other
/// jobs ignore `shutdown`.
pub async fn train_and_evaluate(
    cluster: &ClusterArgs,
    model: &ModelArgs,
    inputs: &Inputs,
    job: &JobArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Summary> {
    let streaming = inputs.is_stream();
    if streaming {
        inputs.check_stream(model, job)?;
    }
    let stream_end = StreamEnd::new();
    let watcher = streaming.then(|| {
        let end = stream_end.clone();
        tokio::spawn(async move {
            shutdown.await;
            eprintln!("stopping: training the rows read, then the checkpoint and the summary");
            end.end();
        })
    });
    let tables: Vec<String> = model
        .spec()?
        .tables
        .iter()
        .map(|t| t.name.clone())
        .collect();
    // Created before connecting: an unwritable directory fails the job at once, naming it.
    let mut tb = match &job.tensorboard_dir {
        Some(dir) => {
            let dir = if inputs.world > 1 {
                dir.join(format!("rank{}", inputs.rank))
            } else {
                dir.clone()
            };
            Some(TrainLog::create(&dir, tables.clone())?)
        }
        None => None,
    };
    let client = connect(cluster).await?;
    let dense_on_ps = job.dense_on_ps || inputs.world > 1;
    let mut trainer = Trainer::with_ranks(
        client.clone(),
        model.clone(),
        inputs.rank,
        inputs.world,
        dense_on_ps,
    )
    .await?;
    let epochs = job.epochs();
    if let Some(dir) = &job.resume {
        let meta = trainer.resume(dir)?;
        anyhow::ensure!(
            meta.epoch < epochs,
            "the checkpoint in {} was taken in epoch {} but the job has --epochs {epochs}: resume with more \
             epochs",
            dir.display(),
            meta.epoch + 1
        );
        eprintln!(
            "resumed from {}: step {}, {} samples done, epoch {}{}",
            dir.display(),
            meta.step,
            meta.samples,
            meta.epoch + 1,
            if meta.ps_snapshot {
                ", servers' snapshot in ps/"
            } else {
                ""
            }
        );
    }
    let reader = |epoch: u64| ReaderConfig {
        max_bad_lines: model.max_bad_lines,
        rank: inputs.rank,
        world: inputs.world,
        shuffle_seed: (epochs > 1).then(|| epoch_seed(job.shuffle_seed, epoch)),
        follow: inputs.follow,
        stream_end: stream_end.clone(),
        ..ReaderConfig::new(inputs.train.iter().cloned(), model.batch_size)
    };
    let eval_cfg = (!inputs.test.is_empty()).then(|| ReaderConfig {
        max_bad_lines: model.max_bad_lines,
        ..ReaderConfig::new(inputs.test.iter().cloned(), model.eval_batch_size)
    });
    print_job(&client, model, inputs, dense_on_ps);
    let opts = PassOptions {
        eval_every: if inputs.rank == 0 { job.eval_every } else { 0 },
        eval_data: eval_cfg.clone(),
        checkpoint_dir: job.checkpoint_dir.clone(),
        checkpoint_every: job.checkpoint_every,
        max_steps: job.max_steps,
        export_dir: job.export_dir.clone(),
        export_every: job.export_every,
        export_keep: job.export_keep as usize,
        export_prune: (job.export_prune_age_secs.is_some()
            || job.export_prune_min_count.is_some()
            || job.export_prune_min_score.is_some())
        .then_some(embedding::ExportPrune {
            max_age_secs: job.export_prune_age_secs,
            min_count: job.export_prune_min_count,
            min_score: job.export_prune_min_score,
        }),
        publish_dense_every: job.publish_dense_every,
        progressive_window: job.progressive_window,
        watch_pids: job.local_server_pids.clone(),
    };
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut summary: Option<Summary> = None;
    for epoch in trainer.epoch()..epochs {
        if epoch > trainer.epoch() {
            trainer.begin_epoch(epoch);
        }
        if epochs > 1 {
            eprintln!("epoch {} of {epochs}", epoch + 1);
        }
        let report = trainer
            .train_pass(reader(epoch), &opts, |e| {
                print_event(&e, terminal);
                if let Some(tb) = &mut tb {
                    tb.event(&e);
                }
            })
            .await?;
        if report.read.bad_lines > 0 {
            eprintln!(
                "skipped {} malformed lines; first: {:?}",
                report.read.bad_lines, report.read.first_errors
            );
        }
        let pass = Summary::of_pass(&report, trainer.step(), &tables);
        let summary = match summary.take() {
            Some(mut s) => {
                s.add_pass(pass);
                summary.insert(s)
            }
            None => summary.insert(pass),
        };
        let stopped = job.max_steps > 0 && trainer.step() >= job.max_steps;
        if stopped || epoch + 1 == epochs {
            break;
        }
        if let (Some(cfg), 0) = (&eval_cfg, inputs.rank) {
            trainer.refresh_dense().await?;
            let eval = trainer.evaluate(cfg.clone()).await?;
            eprintln!(
                "eval after epoch {} (step {}): {}",
                epoch + 1,
                trainer.step(),
                eval.render()
            );
            if let Some(tb) = &mut tb {
                tb.eval(trainer.step(), &eval);
            }
            let mut point = EvalPoint::new(trainer.step(), &eval);
            point.epoch = Some(epoch + 1);
            summary.evals.push(point);
        }
    }
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    let mut summary = summary.expect("at least one epoch runs");
    if let (Some(cfg), 0, false) = (eval_cfg, inputs.rank, job.skip_final_eval) {
        eprintln!("evaluating on {:?}", inputs.test);
        trainer.refresh_dense().await?;
        let eval = trainer.evaluate(cfg).await?;
        eprintln!("eval at step {} (final): {}", trainer.step(), eval.render());
        summary.apply_eval(trainer.step(), &eval);
        if let Some(tb) = &mut tb {
            tb.eval(trainer.step(), &eval);
        }
    }
    if let Some(tb) = &mut tb {
        tb.summary(
            summary.step,
            summary.samples_per_sec,
            summary.train_loss,
            &summary.time,
        );
    }
    summary.failovers = client.failovers();
    summary.map_changes = client.map_changes();
    if summary.map_changes > 0 {
        tracing::info!(
            map_changes = summary.map_changes,
            epoch = client.shard_map().epoch,
            servers = client.num_servers(),
            "the cluster was resharded during the job"
        );
    }
    if summary.failovers > 0 {
        tracing::warn!(
            failovers = summary.failovers,
            "shards moved to another replica during the job"
        );
    }
    client.close().await;
    Ok(summary)
}

/// Prints a job's settings, once at its start.
fn print_job(client: &PsClient, model: &ModelArgs, inputs: &Inputs, dense_on_ps: bool) {
    let spec = model.model_spec.as_ref().and_then(|_| model.spec().ok());
    let with_spec;
    let (model, embeddings) = match &spec {
        Some(spec) => {
            eprintln!("model: {}", spec.describe());
            with_spec = model.with_spec(spec);
            (&with_spec, spec.describe_tables())
        }
        None => (
            model,
            format!(
                "{:?} lr {}, {} on the wire",
                model.optimizer,
                model.emb_lr(),
                model.encoding
            ),
        ),
    };
    eprintln!(
        "training: rank {} of {}, {} servers, batch {}, dense {:?} lr {} ({}, {} products), embeddings {}, staleness bound {}",
        inputs.rank,
        inputs.world,
        client.num_servers(),
        model.batch_size,
        model.dense_kind(),
        model.dense_lr(),
        match (dense_on_ps, inputs.world > 1, model.dense_mode) {
            (true, true, crate::config::DenseMode::Hybrid) => "hybrid: gradients summed over the trainers",
            (true, _, _) => "on the servers",
            (false, _, _) => "on the trainer",
        },
        match (model.dense_precision.resolve(), crate::model::bf16_kernel()) {
            (crate::model::Precision::Bf16, Some(kernel)) => format!("bf16 on {kernel}"),
            (precision, _) => precision.to_string(),
        },
        embeddings,
        model.staleness_bound(inputs.world)
    );
}

/// Prints a pass's progress lines, evaluations and checkpoints; on a terminal, progress lines show the
/// pass's percentage and the time left when the pass's rows are known.
fn print_event(e: &Event, terminal: bool) {
    match e {
        Event::Progress(p) => eprintln!(
            "[{:>6.1}s]{} rows {:>9}  samples/s {:>8.0}  loss {:.4}  calibration {:.3}{}",
            p.seconds,
            match (terminal, p.fraction, p.eta_secs) {
                (true, Some(f), Some(eta)) =>
                    format!(" {:>5.1}%  ETA {:<7}", f * 100.0, clock(eta)),
                (true, Some(f), None) => format!(" {:>5.1}%", f * 100.0),
                _ => String::new(),
            },
            p.samples,
            p.samples_per_sec,
            p.loss,
            p.calibration,
            match p.progressive {
                Some(r) => format!(
                    "  progressive AUC {} logloss {:.4} ({} rows)",
                    r.auc.map_or("n/a".to_string(), |a| format!("{a:.4}")),
                    r.logloss,
                    r.rows
                ),
                None => String::new(),
            }
        ),
        Event::Eval { step, report } => eprintln!("eval at step {step}: {}", report.render()),
        Event::Checkpoint {
            step,
            path,
            ps_snapshot,
        } => eprintln!(
            "checkpoint at step {step}: {}{}",
            path.display(),
            if *ps_snapshot {
                " (with the servers' snapshot)"
            } else {
                ""
            }
        ),
        Event::CheckpointSkipped { step, error } => {
            eprintln!(
                "checkpoint at step {step} skipped (the previous one stays the latest): {error}"
            )
        }
        Event::Export { step, path } => eprintln!("export at step {step}: {}", path.display()),
    }
}

/// `seconds` as `1h02m03s`, `2m03s` or `3s`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// The shuffle seed of `epoch` (splitmix64 of the job's seed and the epoch).
fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    base::hash::splitmix64(seed ^ base::hash::splitmix64(epoch))
}

impl Summary {
    /// Adds the pass of a later epoch (ended at `pass.step`): samples, seconds and counts add up, the train
    /// loss is the later pass's.
    fn add_pass(&mut self, pass: Summary) {
        self.samples += pass.samples;
        self.seconds += pass.seconds;
        self.samples_per_sec = self.samples as f64 / self.seconds.max(1e-9);
        self.train_loss = pass.train_loss;
        self.bad_lines += pass.bad_lines;
        self.rejected_nonfinite += pass.rejected_nonfinite;
        self.step = pass.step;
        self.evals.extend(pass.evals);
        self.wire_bytes += pass.wire_bytes;
        self.progressive = pass.progressive.or(self.progressive);
        self.failovers += pass.failovers;
        self.map_changes += pass.map_changes;
        self.time.add(&pass.time);
        for (a, b) in self.table_rows.iter_mut().zip(&pass.table_rows) {
            a.pulled += b.pulled;
            a.pushed += b.pushed;
        }
    }

    /// The summary of one trainer's pass that ended at `step` (with the model's `tables`), before the final
    /// evaluation.
    fn of_pass(report: &TrainReport, step: u64, tables: &[String]) -> Summary {
        Summary {
            samples: report.samples,
            seconds: report.seconds,
            samples_per_sec: report.samples as f64 / report.seconds.max(1e-9),
            train_loss: report.final_loss,
            auc: None,
            logloss: None,
            oracle_auc: None,
            test_samples: 0,
            calibration: None,
            bad_lines: report.read.bad_lines,
            rejected_nonfinite: report.rejected_nonfinite,
            step,
            trainers: 1,
            evals: report
                .evals
                .iter()
                .map(|(step, r)| EvalPoint::new(*step, r))
                .collect(),
            wire_bytes: report.wire_bytes,
            progressive: report.progressive,
            failovers: 0,
            map_changes: 0,
            time: report.time.clone(),
            table_rows: tables
                .iter()
                .zip(report.rows_pulled.iter().zip(&report.rows_pushed))
                .map(|(t, (&pulled, &pushed))| TableRows {
                    table: t.clone(),
                    pulled,
                    pushed,
                })
                .collect(),
        }
    }
}

/// Evaluates the model the servers hold (dense parameters on the servers, as several trainers leave them) on
/// `test`: the demo's final evaluation once every trainer has finished.
pub async fn evaluate_on_servers(
    cluster: &ClusterArgs,
    model: &ModelArgs,
    test: &[PathBuf],
) -> anyhow::Result<EvalReport> {
    let client = connect(cluster).await?;
    let mut trainer = Trainer::with_ranks(client.clone(), model.clone(), 0, 1, true).await?;
    trainer.refresh_dense().await?;
    let cfg = ReaderConfig {
        max_bad_lines: model.max_bad_lines,
        ..ReaderConfig::new(test.iter().cloned(), model.eval_batch_size)
    };
    let eval = trainer.evaluate(cfg).await?;
    client.close().await;
    Ok(eval)
}

impl Summary {
    /// Records the final evaluation.
    pub fn apply_eval(&mut self, step: u64, eval: &EvalReport) {
        self.auc = eval.auc;
        self.logloss = Some(eval.logloss);
        self.test_samples = eval.count;
        self.calibration = eval.calibration();
        self.evals.push(EvalPoint::new(step, eval));
    }
}

/// AUC of the probabilities in `oracle` (one per line) against the labels of the Criteo file `data`.
pub fn oracle_auc(data: &Path, oracle: &Path) -> anyhow::Result<Option<f64>> {
    use std::io::BufRead;
    let labels: Vec<f32> = std::io::BufReader::new(
        std::fs::File::open(data).with_context(|| format!("open {}", data.display()))?,
    )
    .split(b'\n')
    .map(|line| line.map(|l| if l.first() == Some(&b'1') { 1.0 } else { 0.0 }))
    .collect::<Result<_, _>>()
    .with_context(|| format!("read {}", data.display()))?;
    let probs: Vec<f32> = std::fs::read_to_string(oracle)
        .with_context(|| format!("read {}", oracle.display()))?
        .lines()
        .map(|l| {
            l.trim()
                .parse::<f32>()
                .with_context(|| format!("{}: bad probability {l:?}", oracle.display()))
        })
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(
        labels.len() == probs.len(),
        "{} has {} rows but {} has {} probabilities",
        data.display(),
        labels.len(),
        oracle.display(),
        probs.len()
    );
    Ok(crate::model::eval::auc(&probs, &labels))
}

/// Loads model settings from a TOML file.
pub fn load_model(path: &Path) -> anyhow::Result<ModelArgs> {
    Ok(crate::config::load_model_file(path)?)
}

/// Makes the calling thread worker 0 of the global rayon pool (the pool's other workers are spawned here, so
/// call it after pinning the process to its CPUs); a no-op once the pool exists or with fewer than 2
/// threads (`RAYON_NUM_THREADS`, else the CPUs available).
///
/// The training loop runs on this thread (inside the runtime's `block_on`) and hands its compute to the pool
/// several times a step (decoding the pulled rows, the replay, pooling, the dense step, the gradients'
/// reduction). From a thread outside the pool each hand-off sleeps until a worker wakes to take it, which
/// on a small machine whose cores the servers and the I/O threads share took 0.3 ms per call (issue 44).
/// As worker 0 the loop's thread starts the work itself at once and the other workers steal parts of it;
/// with one thread it would be the only worker and jobs queued from the plan and encoder threads would
/// wait for the loop, so the pool is then left to rayon.
pub fn compute_pool() {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Some(threads) = pool_threads(
        std::env::var("RAYON_NUM_THREADS").ok().as_deref(),
        available,
    ) else {
        // Built here all the same rather than on first use: a pool first used by a helper thread would be
        // spawned by it and inherit its batch policy (base::sched), and its worker computes.
        if let Err(e) = rayon::ThreadPoolBuilder::new().build_global() {
            tracing::debug!(error = %e, "global rayon pool already set up");
        }
        return;
    };
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .use_current_thread()
        .build_global();
    if let Err(e) = built {
        tracing::debug!(error = %e, "global rayon pool already set up");
    }
}

/// The threads of [`compute_pool`]: `RAYON_NUM_THREADS` when it is a positive number (as rayon reads it),
/// else the CPUs `available`; `None` below 2 (the pool is then left to rayon).
fn pool_threads(env: Option<&str>, available: usize) -> Option<usize> {
    let threads = env
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(available);
    (threads >= 2).then_some(threads)
}

/// The tokio runtime the trainer runs on. Its threads are helpers ([`crate::helpers`]); the training loop
/// runs on the thread that calls `block_on`, which keeps its policy.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("trainer-io")
        .on_thread_start(crate::helpers::helper_thread)
        .build()
        .context("start tokio runtime")
}

/// Installs the metrics recorder and serves /metrics on `addr`; returns the bound address.
pub async fn serve_metrics(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let handle = ops::http::install_recorder(crate::metrics::LATENCY_BUCKETS);
    crate::metrics::describe();
    let (listener, bound) = ops::http::bind(addr)
        .await
        .with_context(|| format!("bind trainer metrics listener {addr}"))?;
    let health = std::sync::Arc::new(ops::http::Health::default());
    health.set_ready(true);
    tokio::spawn(ops::http::serve(
        listener,
        handle,
        health,
        std::future::pending(),
    ));
    Ok(bound)
}

/// Parses `--export-prune-min-score`: a finite score above 0.
fn positive_score(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(v) => Err(format!("score {v}, expected a finite score above 0")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::pool_threads;

    /// The loop's thread joins the pool only beside another worker, which takes what the other threads queue.
    #[test]
    fn the_loop_thread_joins_the_pool_only_beside_another_worker() {
        assert_eq!(pool_threads(None, 2), Some(2));
        assert_eq!(pool_threads(None, 1), None);
        assert_eq!(pool_threads(Some("1"), 8), None);
        assert_eq!(pool_threads(Some(" 3 "), 2), Some(3));
        // Rayon reads 0 or a non-number as "the default".
        assert_eq!(pool_threads(Some("0"), 4), Some(4));
        assert_eq!(pool_threads(Some("lots"), 4), Some(4));
    }

    /// The runtime's threads are helpers: they take the helpers' policy (batch unless `--helper-threads`
    /// says otherwise; no test of this crate sets another), while the thread that runs the loop in
    /// `block_on` keeps its own.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_runtime_threads_are_helpers_and_the_loop_thread_is_not() {
        use base::sched::{current, Policy};
        std::thread::spawn(|| {
            let rt = super::runtime().unwrap();
            let (worker, caller) = rt.block_on(async {
                let worker = tokio::spawn(async { current() }).await.unwrap();
                (worker, current())
            });
            assert_eq!(worker, Policy::Batch);
            assert_eq!(caller, Policy::Normal);
        })
        .join()
        .unwrap();
    }

    /// What `compute_pool` relies on: in a pool built with the current thread, that thread is worker 0 and
    /// runs part of a parallel loop it starts itself (no hand-off to a sleeping worker).
    #[test]
    fn a_parallel_loop_starts_on_the_thread_that_joined_the_pool() {
        use rayon::prelude::*;
        std::thread::spawn(|| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .use_current_thread()
                .build()
                .unwrap();
            assert_eq!(pool.current_thread_index(), Some(0));
            let me = std::thread::current().id();
            let ran_here = (0..64)
                .into_par_iter()
                .with_max_len(1)
                .filter(|_| std::thread::current().id() == me)
                .count();
            assert!(
                ran_here > 0,
                "no item of the loop ran on the thread that started it"
            );
        })
        .join()
        .unwrap();
    }
}
