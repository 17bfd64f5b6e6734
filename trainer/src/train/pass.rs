//! One training pass ([`Trainer::train_pass`]), in the steps of its loop: fill the pull window, receive a
//! batch's rows and compute it, send its push, count it, and the periodic work (progress lines, evaluations,
//! checkpoints).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::transport::Dialer;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::report::tail_mean;
use super::stages::{drain, AckPrefix, PushResult, Stage};
use super::{Event, PassOptions, Progress, Result, TrainError, TrainReport, Trainer};
use crate::criteo::{BatchReader, ReaderConfig};
use crate::metrics as m;
use crate::model::eval::EvalReport;
use crate::progressive::Window as Progressive;
use crate::step::pipeline::PlanStage;
use crate::step::prefetch::Prefetcher;
use crate::step::push::{PushEncoder, PushRecord};
use crate::timing::{
    BusyCounters, CpuSeconds, CpuWatch, Phase, PhaseSeconds, Stopwatch, TimeReport, PHASES,
};

/// The batches of a pass on their way: the stage threads, the pull window and the pushes in flight.
struct Window<D: Dialer> {
    stage_in: PlanStage,
    /// Sends each planned batch ahead to the servers (`--prefetch-distance`).
    prefetch: Option<Arc<Prefetcher<D>>>,
    encoder: PushEncoder,
    acks: Arc<AckPrefix>,
    acked_rx: watch::Receiver<u64>,
    pushes: JoinSet<PushResult>,
    /// Batches whose pulls are in flight, the next to compute first.
    ahead: VecDeque<Stage>,
    /// The last `k` pushes, for replay on the rows of batches pulled before them.
    in_flight: VecDeque<(u64, Arc<PushRecord>)>,
    /// Batches of the pass whose pulls were sent.
    issued: u64,
    /// The data ran out.
    exhausted: bool,
    /// The data is a stream (a followed file, standard input): batches are computed as they come, without
    /// waiting for the pull window to fill.
    streaming: bool,
    /// The staleness bound.
    k: u64,
}

impl<D: Dialer> Window<D> {
    /// Collects the pushes that finished; returns how many gradient values the servers rejected.
    fn reap(&mut self) -> Result<u64> {
        let mut rejected = 0;
        while let Some(r) = self.pushes.try_join_next() {
            rejected += r.map_err(|_| TrainError::Stopped("push task"))??.1;
        }
        Ok(rejected)
    }
}

/// A trained batch: its size, loss, and sums of predictions and labels.
struct Trained {
    samples: usize,
    loss: f32,
    pred_sum: f64,
    label_sum: f64,
}

/// What a pass has done so far, for its progress lines and its report.
struct Tally {
    begin: Instant,
    /// Time spent in evaluations and checkpoints, left out of the pass's seconds.
    paused: Duration,
    samples: u64,
    batches: u64,
    rejected: u64,
    /// Loss sum, samples, prediction sum and label sum since the last progress line.
    window_loss: f64,
    window_samples: u64,
    window_pred: f64,
    window_labels: f64,
    last_report: Instant,
    losses: Vec<(u64, f32)>,
    evals: Vec<(u64, EvalReport)>,
    /// [`Trainer::wire_total`] when the pass began.
    wire_at_start: u64,
    /// Progressive validation's window of predictions made before training on their rows.
    progressive: Progressive,
    /// The loop's wall time by phase ([`crate::timing`]).
    watch: Stopwatch,
    /// The stage threads' busy counters.
    busy: BusyCounters,
    /// CPU seconds of this process and of the watched servers, and their values when the pass began.
    cpu: CpuWatch,
    cpu_at_start: CpuSeconds,
    /// The time report at the last progress line (each line reports the interval since).
    at_report: TimeReport,
    /// The loop's phases at the end of the last step (the per-step histograms record the difference).
    at_step: PhaseSeconds,
    /// The per-step phase histograms, registered once per pass.
    phase_histograms: Vec<(Phase, metrics::Histogram)>,
    /// Unique rows pulled and pushed per table in the pass, and at the last progress line.
    pulled: Vec<u64>,
    pushed: Vec<u64>,
    rows_at_report: (Vec<u64>, Vec<u64>),
    /// Rows the pass is expected to train (for the progress lines' percentage and ETA), when known.
    expected: Option<u64>,
}

impl Tally {
    fn new(
        wire_at_start: u64,
        progressive_window: usize,
        busy: BusyCounters,
        cpu: CpuWatch,
        tables: usize,
        expected: Option<u64>,
    ) -> Tally {
        let cpu_at_start = cpu.read();
        let phase_histograms = PHASES
            .into_iter()
            .map(|p| {
                (
                    p,
                    metrics::histogram!(m::STEP_PHASE_SECONDS, "phase" => p.name()),
                )
            })
            .collect();
        Tally {
            watch: Stopwatch::start(),
            busy,
            cpu,
            cpu_at_start,
            at_report: TimeReport::default(),
            at_step: PhaseSeconds::default(),
            phase_histograms,
            pulled: vec![0; tables],
            pushed: vec![0; tables],
            rows_at_report: (vec![0; tables], vec![0; tables]),
            expected,
            progressive: Progressive::new(progressive_window),
            wire_at_start,
            begin: Instant::now(),
            paused: Duration::ZERO,
            samples: 0,
            batches: 0,
            rejected: 0,
            window_loss: 0.0,
            window_samples: 0,
            window_pred: 0.0,
            window_labels: 0.0,
            last_report: Instant::now(),
            losses: Vec::new(),
            evals: Vec::new(),
        }
    }

    /// Where the pass's time went so far: the loop's phases, the stage threads, the processes' CPU.
    fn time(&self) -> TimeReport {
        let critical = self.watch.spent();
        TimeReport {
            steps: self.batches,
            seconds: critical.total(),
            critical,
            background: self.busy.read(),
            cpu: self.cpu.read().since(&self.cpu_at_start),
        }
    }

    /// Records the last step's phases in the per-step histograms.
    fn record_step(&mut self) {
        let now = self.watch.spent();
        let step = now.since(&self.at_step);
        self.at_step = now;
        for (phase, h) in &self.phase_histograms {
            let s = step.get(*phase);
            // A phase this job never enters (the reduce of one trainer) stays out of its histogram.
            if s != 0.0 {
                h.record(s);
            }
        }
    }
}

impl<D: Dialer> Trainer<D> {
    /// One pass over `reader_cfg`'s data (from the data position of a resumed checkpoint), with the periodic
    /// work of `opts`; `on_event` hears progress, evaluations and checkpoints.
    pub async fn train_pass(
        &mut self,
        reader_cfg: ReaderConfig,
        opts: &PassOptions,
        mut on_event: impl FnMut(Event),
    ) -> Result<TrainReport> {
        let expected = super::eta::expected_rows(
            &reader_cfg,
            self.step - self.epoch_start_step,
            opts.max_steps.saturating_sub(self.step),
            self.args.batch_size,
        );
        let mut w = self.open_window(reader_cfg)?;
        let (plan_busy, parse_busy) = w.stage_in.busy_nanos();
        let busy = BusyCounters {
            parse: parse_busy,
            plan: plan_busy,
            encode: w.encoder.busy_nanos(),
        };
        let cpu = CpuWatch::new(opts.watch_pids.clone());
        let mut tally = Tally::new(
            self.wire_total(),
            opts.progressive_window,
            busy,
            cpu,
            self.layout.tables(),
            expected,
        );
        loop {
            self.fill(&mut w, opts, &mut tally.watch)?;
            let Some(stage) = w.ahead.pop_front() else {
                break;
            };
            let trained = self.train_batch(&mut w, stage, &mut tally).await?;
            tally.rejected += w.reap()?;
            self.count(&mut tally, trained, &mut on_event);
            self.periodic(&mut w, &mut tally, opts, &mut on_event)
                .await?;
        }
        // Hybrid mode: take the steps the other trainers still have, contributing nothing.
        while let Some(o) = self.reduce_dense(0, true).await? {
            if o.all_done {
                break;
            }
        }
        self.flush_dense().await?;
        tally.watch.lap(if self.reduce.is_some() {
            Phase::Reduce
        } else {
            Phase::Other
        });
        self.finish_pass(w, tally, opts, &mut on_event).await
    }

    /// Starts the pass's parse, plan and push-encoder threads.
    fn open_window(&mut self, mut reader_cfg: ReaderConfig) -> Result<Window<D>> {
        let k = self.args.staleness_bound(self.world) as u64;
        // A resumed run skips the batches it trained; a followed file's batches have no fixed size (short
        // ones go out while the writer is idle), so it skips the rows instead. Standard input skips nothing:
        // a pipe brings new data.
        let streaming = reader_cfg.is_stream();
        let skip_batches = if streaming {
            if reader_cfg.follow {
                reader_cfg.skip_rows = self.samples;
            }
            0
        } else {
            self.step - self.epoch_start_step
        };
        // The reader makes the model's features (columns, tables, caps, bags), whatever the caller set.
        reader_cfg.layout = self.features.clone();
        let reader =
            BatchReader::spawn(reader_cfg).map_err(TrainError::data("open training data"))?;
        let (acks, acked_rx) = AckPrefix::new();
        let distance = self.args.prefetch_distance;
        let prefetch = (distance > 0).then(|| {
            Arc::new(Prefetcher::new(
                self.client.clone(),
                tokio::runtime::Handle::current(),
                Prefetcher::<D>::draw_owner(self.rank),
                acked_rx.clone(),
            ))
        });
        // The plan queue holds the batches between their prefetch and their pull.
        let depth = (k as usize + 1).max(distance);
        let client = self.client.clone();
        let stage_in = PlanStage::spawn(
            reader,
            self.layout.clone(),
            move || client.shard_map(),
            depth,
            skip_batches,
            prefetch.clone(),
        )
        .map_err(TrainError::thread("plan"))?;
        let encoder = PushEncoder::spawn(
            self.codecs.clone(),
            self.residuals.clone(),
            stage_in.recycler(),
        )
        .map_err(TrainError::thread("push"))?;
        Ok(Window {
            stage_in,
            prefetch,
            encoder,
            acks,
            acked_rx,
            pushes: JoinSet::new(),
            ahead: VecDeque::new(),
            in_flight: VecDeque::new(),
            issued: 0,
            exhausted: false,
            streaming,
            k,
        })
    }

    /// The pull stage: keeps the batch to compute next plus `k` more in flight (fewer at the end of the data
    /// or at `opts.max_steps`).
    fn fill(&mut self, w: &mut Window<D>, opts: &PassOptions, watch: &mut Stopwatch) -> Result<()> {
        let at_limit = |step: u64| opts.max_steps > 0 && step >= opts.max_steps;
        while !w.exhausted
            && (w.ahead.len() as u64) <= w.k
            && !at_limit(self.step + w.ahead.len() as u64)
        {
            let next = if w.streaming && !w.ahead.is_empty() {
                match w.stage_in.poll_planned() {
                    std::task::Poll::Ready(next) => next,
                    std::task::Poll::Pending => break,
                }
            } else {
                tokio::task::block_in_place(|| w.stage_in.next_planned())
            };
            watch.lap(Phase::Input);
            match next {
                None => w.exhausted = true,
                Some(planned) => {
                    let p = planned.map_err(TrainError::data("read training data"))?;
                    // The batch's step in the job decides whether it is still in the warm-up.
                    let warm =
                        self.step + w.ahead.len() as u64 >= self.args.staleness_warmup(self.world);
                    let gate = Some((w.acked_rx.clone(), w.issued, if warm { w.k } else { 0 }));
                    let stage = self.start(p.batch, p.plan, gate);
                    w.ahead.push_back(stage);
                    w.issued += 1;
                    watch.lap(Phase::Plan);
                }
            }
        }
        Ok(())
    }

    /// Receives a batch's rows, computes it and sends its push (not awaited); returns its size, loss and sums.
    /// Its predictions, made before its update, go to `progressive`.
    async fn train_batch(
        &mut self,
        w: &mut Window<D>,
        mut stage: Stage,
        tally: &mut Tally,
    ) -> Result<Trained> {
        tally.watch.lap(Phase::Other);
        self.receive(&mut stage, &w.in_flight, Some(&mut tally.watch))
            .await?;
        for (t, n) in tally.pulled.iter_mut().enumerate() {
            *n += stage.plan.unique(t).len() as u64;
        }
        if self.step == 0 && self.args.init_output_bias && self.dense.is_none() {
            self.start_output_bias(&stage.batch).await?;
            tally.watch.lap(Phase::Other);
        }
        let loss = self.compute(&stage.batch)?;
        let timing = self.model.last_timing();
        tally.watch.lap_split(
            &[
                (Phase::Forward, timing.forward),
                (Phase::Backward, timing.backward),
                (Phase::Optimizer, timing.optimizer),
            ],
            Phase::Other,
        );
        let progressive = &mut tally.progressive;
        let trained = Trained {
            samples: stage.batch.len,
            loss,
            pred_sum: self.model.last_probs()[..stage.batch.len]
                .iter()
                .map(|&p| p as f64)
                .sum(),
            label_sum: stage.batch.labels.iter().map(|&y| y as f64).sum(),
        };
        progressive.push(
            &self.model.last_probs()[..stage.batch.len],
            &stage.batch.labels[..stage.batch.len],
        );
        let Stage {
            batch, plan, index, ..
        } = stage;
        tally.watch.lap(Phase::Other);
        for (t, n) in tally.pushed.iter_mut().enumerate() {
            *n += plan.unique(t).len() as u64;
        }
        let b = batch.len;
        if batch.truncated > 0 {
            metrics::counter!(m::TOKENS_TRUNCATED_TOTAL).increment(batch.truncated);
        }
        if let Some(reduce) = &self.reduce {
            // W trainers at batch B/W push what one trainer at batch B would (step::dense_reduce).
            let s = reduce.embedding_scale();
            self.emb_grad.iter_mut().for_each(|g| *g *= s);
        }
        let record = w.encoder.record(plan, &self.emb_grad, b as f32);
        // With replay, the rows of a batch pulled before this push must not hold it: the push waits
        // until every such pull is answered (crate::step::replay).
        let waits: Vec<_> = match self.replayer {
            Some(_) => w
                .ahead
                .iter()
                .filter(|s| s.replay && s.needed.is_some_and(|n| n <= index))
                .map(|s| s.replied.clone())
                .collect(),
            None => Vec::new(),
        };
        let push = self.send_push(&w.encoder, record.clone(), waits);
        if self.replayer.is_some() && w.k > 0 {
            w.in_flight.push_back((index, record));
            if w.in_flight.len() as u64 > w.k {
                w.in_flight.pop_front();
            }
        }
        metrics::gauge!(m::PUSHES_IN_FLIGHT).increment(1.0);
        let acks = w.acks.clone();
        w.pushes.spawn(async move {
            let r = push.await;
            metrics::gauge!(m::PUSHES_IN_FLIGHT).decrement(1.0);
            // Counted even when it failed, so no pull waits forever; the loop reports the failure.
            acks.ack(index);
            r
        });
        tally.watch.lap(Phase::Push);
        if self.reduce.is_some() {
            if w.k == 0 && self.args.dense_staleness == 0 {
                // Synchronous: once the reduce completes, every trainer's push of this step is applied, so the
                // next pull sees all of them (as one trainer at the global batch would).
                let mut acked = w.acked_rx.clone();
                let _ = acked.wait_for(|&n| n > index).await;
                tally.watch.lap(Phase::AckWait);
            }
            self.reduce_dense(b as u64, false).await?;
            tally.watch.lap(Phase::Reduce);
        }
        Ok(trained)
    }

    /// Counts a trained batch, and reports progress once per `--progress-secs`.
    fn count(&mut self, t: &mut Tally, trained: Trained, on_event: &mut impl FnMut(Event)) {
        let (b, loss) = (trained.samples, trained.loss);
        t.window_pred += trained.pred_sum;
        t.window_labels += trained.label_sum;
        self.step += 1;
        self.samples += b as u64;
        t.samples += b as u64;
        t.batches += 1;
        t.losses.push((b as u64, loss));
        t.window_loss += loss as f64 * b as f64;
        t.window_samples += b as u64;
        metrics::counter!(m::SAMPLES_TOTAL).increment(b as u64);
        metrics::gauge!(m::STEP).set(self.step as f64);
        metrics::counter!(m::BATCHES_TOTAL).increment(1);
        t.watch.lap(Phase::Other);
        t.record_step();
        if t.last_report.elapsed() >= self.args.progress_interval() {
            let secs = t.last_report.elapsed().as_secs_f64();
            let seconds = (t.begin.elapsed() - t.paused).as_secs_f64();
            let time = t.time();
            let interval = time.since(&t.at_report);
            t.at_report = time;
            crate::timing::export_metrics(&t.at_report);
            let rows_pulled = diff(&t.pulled, &t.rows_at_report.0);
            let rows_pushed = diff(&t.pushed, &t.rows_at_report.1);
            t.rows_at_report = (t.pulled.clone(), t.pushed.clone());
            let fraction = t
                .expected
                .map(|n| (t.samples as f64 / n.max(1) as f64).min(1.0));
            let p = Progress {
                step: self.step,
                samples: t.samples,
                seconds,
                fraction,
                eta_secs: fraction
                    .filter(|&f| f > 0.0)
                    .map(|f| seconds * (1.0 - f) / f),
                time: interval,
                rows_pulled,
                rows_pushed,
                samples_per_sec: t.window_samples as f64 / secs,
                loss: t.window_loss / t.window_samples.max(1) as f64,
                calibration: if t.window_labels > 0.0 {
                    t.window_pred / t.window_labels
                } else {
                    f64::NAN
                },
                progressive: t.progressive.export(),
            };
            metrics::gauge!(m::SAMPLES_PER_SECOND).set(p.samples_per_sec);
            metrics::gauge!(m::LOSS).set(p.loss);
            on_event(Event::Progress(Box::new(p)));
            t.last_report = Instant::now();
            (t.window_loss, t.window_samples) = (0.0, 0);
            (t.window_pred, t.window_labels) = (0.0, 0.0);
        }
    }

    /// The evaluation and checkpoint due at this step, if any (their time is left out of the pass's and
    /// of its phases').
    async fn periodic(
        &mut self,
        w: &mut Window<D>,
        t: &mut Tally,
        opts: &PassOptions,
        on_event: &mut impl FnMut(Event),
    ) -> Result<()> {
        let eval_now = opts.eval_every > 0 && self.step.is_multiple_of(opts.eval_every);
        let ckpt_now = opts.checkpoint_every > 0 && self.step.is_multiple_of(opts.checkpoint_every);
        if let (true, Some(cfg)) = (eval_now, &opts.eval_data) {
            t.watch.lap(Phase::Other);
            let started = Instant::now();
            self.flush_dense().await?;
            let report = self.evaluate(cfg.clone()).await?;
            t.evals.push((self.step, report));
            on_event(Event::Eval {
                step: self.step,
                report,
            });
            t.paused += started.elapsed();
            t.watch.skip();
            t.last_report = Instant::now();
        }
        if let (true, Some(dir)) = (ckpt_now, &opts.checkpoint_dir) {
            t.watch.lap(Phase::Other);
            let started = Instant::now();
            t.rejected += drain(&mut w.pushes).await?;
            match self.checkpoint(dir).await {
                Ok(event) => on_event(event),
                Err(TrainError::Checkpoint(e)) if e.is_write_failure() => {
                    tracing::error!(step = self.step, error = %e, "periodic checkpoint skipped");
                    metrics::counter!(m::CHECKPOINTS_SKIPPED_TOTAL).increment(1);
                    on_event(Event::CheckpointSkipped {
                        step: self.step,
                        error: e.to_string(),
                    });
                }
                Err(e) => return Err(e),
            }
            t.paused += started.elapsed();
            t.watch.skip();
            t.last_report = Instant::now();
        }
        if opts.publish_dense_every > 0
            && self.rank == 0
            && self.step.is_multiple_of(opts.publish_dense_every)
        {
            self.publish_for_serving().await?;
        }
        if export_due(self.step, opts) {
            t.watch.lap(Phase::Other);
            let started = Instant::now();
            t.rejected += drain(&mut w.pushes).await?;
            if let Some(e) = self.export(opts).await? {
                on_event(e);
            }
            t.paused += started.elapsed();
            t.watch.skip();
            t.last_report = Instant::now();
        }
        Ok(())
    }

    /// Waits for the last pushes, stops the stage threads, writes the final checkpoint (unless this step's
    /// periodic one was just written) and reports the pass.
    /// Embedding bytes sent and received so far.
    fn wire_total(&self) -> u64 {
        self.wire
            .iter()
            .map(|b| b.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    async fn finish_pass(
        &mut self,
        w: Window<D>,
        mut t: Tally,
        opts: &PassOptions,
        on_event: &mut impl FnMut(Event),
    ) -> Result<TrainReport> {
        let Window {
            stage_in,
            prefetch,
            encoder,
            mut pushes,
            ahead,
            in_flight,
            ..
        } = w;
        t.watch.lap(Phase::Other);
        let rejected = t.rejected + drain(&mut pushes).await?;
        t.watch.lap(Phase::AckWait);
        // Hybrid mode: the servers' dense table gets the final model (rank 0; the demo evaluates it).
        self.publish_dense().await?;
        let seconds = (t.begin.elapsed() - t.paused).as_secs_f64();
        t.watch.lap(Phase::Other);
        let time = t.time();
        crate::timing::export_metrics(&time);
        drop(ahead);
        drop(in_flight);
        let read = stage_in.finish();
        if let Some(p) = prefetch {
            p.finish().await;
        }
        metrics::counter!(m::BAD_LINES_TOTAL).increment(read.bad_lines);
        let just_written =
            opts.checkpoint_every > 0 && self.step.is_multiple_of(opts.checkpoint_every);
        if let (Some(dir), false) = (&opts.checkpoint_dir, just_written && t.batches > 0) {
            on_event(self.checkpoint(dir).await?);
        }
        let published =
            opts.publish_dense_every > 0 && self.step.is_multiple_of(opts.publish_dense_every);
        if opts.publish_dense_every > 0 && self.rank == 0 && !(published && t.batches > 0) {
            self.publish_for_serving().await?;
        }
        if !(export_due(self.step, opts) && t.batches > 0) {
            if let Some(e) = self.export(opts).await? {
                on_event(e);
            }
        }
        drop(encoder);
        Ok(TrainReport {
            samples: t.samples,
            batches: t.batches,
            seconds,
            final_loss: tail_mean(&t.losses, t.samples / 10),
            mean_loss: tail_mean(&t.losses, t.samples),
            rejected_nonfinite: rejected,
            read,
            evals: t.evals,
            wire_bytes: self.wire_total() - t.wire_at_start,
            progressive: t.progressive.export(),
            time,
            rows_pulled: t.pulled,
            rows_pushed: t.pushed,
        })
    }
}

/// `now - then`, element by element.
fn diff(now: &[u64], then: &[u64]) -> Vec<u64> {
    now.iter().zip(then).map(|(a, b)| a - b).collect()
}

/// Whether `opts` asks for an export at `step` during a pass: with every checkpoint, and every
/// `export_every` steps.
fn export_due(step: u64, opts: &PassOptions) -> bool {
    let every = |n: u64| n > 0 && step.is_multiple_of(n);
    opts.export_dir.is_some()
        && ((opts.checkpoint_dir.is_some() && every(opts.checkpoint_every))
            || every(opts.export_every))
}
