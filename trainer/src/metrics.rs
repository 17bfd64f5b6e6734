//! Every metric the trainer exports: names in one place, described once.
//!
//! Latency histograms use [`LATENCY_BUCKETS`] (50 µs .. 10 s): a loopback pull of one batch up to a pull retried
//! across a server restart.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Training samples processed.
pub const SAMPLES_TOTAL: &str = "trainer_samples_total";
/// Seconds per step spent in the hybrid mode's dense reduce (waiting for the other trainers included).
pub const REDUCE_SECONDS: &str = "trainer_dense_reduce_duration_seconds";
/// Trainer ranks missing from hybrid dense reduce steps (finalized without them).
pub const REDUCE_MISSING_TOTAL: &str = "trainer_dense_reduce_missing_total";
/// Training batches processed.
pub const BATCHES_TOTAL: &str = "trainer_batches_total";
/// Training throughput over the last progress interval.
pub const SAMPLES_PER_SECOND: &str = "trainer_samples_per_second";
/// Mean training loss over the last progress interval.
pub const LOSS: &str = "trainer_loss";
/// Latency of one batch's pull (all servers in parallel).
pub const PULL_SECONDS: &str = "trainer_pull_duration_seconds";
/// Latency of one batch's push, from send to acknowledgement by every server.
pub const PUSH_SECONDS: &str = "trainer_push_duration_seconds";
/// Dense compute (forward + backward + dense optimizer) of one batch.
pub const COMPUTE_SECONDS: &str = "trainer_compute_duration_seconds";
/// Staleness seen by each training batch: earlier batches of the pass whose pushes were not acknowledged when
/// its pull was sent, i.e. how many batches' updates its rows may lack (at most `--max-in-flight`).
pub const STALENESS_BATCHES: &str = "trainer_staleness_batches";
/// Embedding rows updated by replaying this trainer's own unacknowledged pushes (`--replay-own-updates`).
pub const ROWS_REPLAYED_TOTAL: &str = "trainer_rows_replayed_total";
/// Time to replay the pushes in flight on one batch's pulled rows.
pub const REPLAY_SECONDS: &str = "trainer_replay_duration_seconds";
/// Pushes sent and not yet acknowledged.
pub const PUSHES_IN_FLIGHT: &str = "trainer_pushes_in_flight";
/// Prefetch requests sent (lookahead into the servers' capacity tier, `--prefetch-distance`).
pub const PREFETCH_REQUESTS_TOTAL: &str = "trainer_prefetch_requests_total";
/// Rows the servers read back from RocksDB for this trainer's prefetches.
pub const PREFETCH_ROWS_READ_BACK_TOTAL: &str = "trainer_prefetch_rows_read_back_total";
/// Prefetch requests that failed (the pull then reads its rows itself).
pub const PREFETCH_ERRORS_TOTAL: &str = "trainer_prefetch_errors_total";
/// Embedding rows pulled (unique per batch).
pub const ROWS_PULLED_TOTAL: &str = "trainer_rows_pulled_total";
/// Embedding gradient rows pushed (unique per batch).
pub const ROWS_PUSHED_TOTAL: &str = "trainer_rows_pushed_total";
/// Payload bytes sent, after compression (encoding).
pub const WIRE_BYTES_SENT_TOTAL: &str = "trainer_wire_bytes_sent_total";
/// Payload bytes received, after compression (encoding).
pub const WIRE_BYTES_RECEIVED_TOTAL: &str = "trainer_wire_bytes_received_total";
/// Dense-parameter push payload bytes (dense parameters on the servers; after top-k).
pub const DENSE_BYTES_SENT_TOTAL: &str = "trainer_dense_bytes_sent_total";
/// Dense-parameter pull payload bytes (dense parameters on the servers).
pub const DENSE_BYTES_RECEIVED_TOTAL: &str = "trainer_dense_bytes_received_total";
/// Row bytes the same payloads would take as f32 (before compression), sent.
pub const RAW_BYTES_SENT_TOTAL: &str = "trainer_raw_bytes_sent_total";
/// Row bytes the same payloads would take as f32 (before compression), received.
pub const RAW_BYTES_RECEIVED_TOTAL: &str = "trainer_raw_bytes_received_total";
/// Malformed input lines skipped.
pub const BAD_LINES_TOTAL: &str = "trainer_bad_lines_total";
/// Tokens of multi-hot fields dropped past their feature's `tokens` limit (docs/model-spec.md).
pub const TOKENS_TRUNCATED_TOTAL: &str = "trainer_tokens_truncated_total";
/// Test AUC of the last evaluation.
pub const EVAL_AUC: &str = "trainer_eval_auc";
/// Test logloss of the last evaluation.
pub const EVAL_LOGLOSS: &str = "trainer_eval_logloss";
/// Mean prediction over positive rate on the last evaluation (1 = calibrated).
pub const EVAL_CALIBRATION: &str = "trainer_eval_calibration";

/// Mean predicted click probability on the last evaluation.
pub const EVAL_MEAN_PREDICTION: &str = "trainer_eval_mean_prediction";
/// Click rate (mean label) of the last evaluation's rows.
pub const EVAL_POSITIVE_RATE: &str = "trainer_eval_positive_rate";
/// Rows of the last evaluation.
pub const EVAL_SAMPLES: &str = "trainer_eval_samples";
/// Evaluations run (periodic and final).
pub const EVALS_TOTAL: &str = "trainer_evals_total";
/// Checkpoints written.
pub const CHECKPOINTS_TOTAL: &str = "trainer_checkpoints_total";
/// Counter: periodic checkpoints skipped because they could not be written (a full disk on the trainer or a
/// server, after the client's retries); training goes on and the previous checkpoint stays the latest.
pub const CHECKPOINTS_SKIPPED_TOTAL: &str = "trainer_checkpoints_skipped_total";
/// Time to write one checkpoint (waiting for pushes, the servers' snapshot, the file).
pub const CHECKPOINT_SECONDS: &str = "trainer_checkpoint_duration_seconds";
/// Exports written (`--export-dir`).
pub const EXPORTS_TOTAL: &str = "trainer_exports_total";
/// Time to write one export (the servers' snapshot, the dense parameters, the manifest).
pub const EXPORT_SECONDS: &str = "trainer_export_duration_seconds";
/// Dense parameter versions published for serving (`--publish-dense-every`).
pub const DENSE_PUBLISHED_TOTAL: &str = "trainer_dense_published_total";
/// The trainer's step (batches trained, including a resumed run's).
pub const STEP: &str = "trainer_step";
/// Progressive validation ([`crate::progressive`]): AUC of the training rows' predictions, made before the
/// model trained on them, over the last `--progressive-window` rows; set at each progress line.
pub const PROGRESSIVE_AUC: &str = "trainer_progressive_auc";
/// Progressive validation: logloss of the same predictions over the same window.
pub const PROGRESSIVE_LOGLOSS: &str = "trainer_progressive_logloss";

/// Wall seconds of one training step in one phase of the training loop (label `phase`: input, plan,
/// pull_wait, ack_wait, gather, forward, backward, optimizer, push, reduce, other; [`crate::timing`]). The
/// phases of a step add up to its wall time. Buckets: [`LATENCY_BUCKETS`].
pub const STEP_PHASE_SECONDS: &str = "trainer_step_phase_seconds";
/// Seconds the pass's stage threads have worked beside the training loop (label `thread`: parse, plan,
/// encode), since the pass began.
pub const THREAD_BUSY_SECONDS: &str = "trainer_thread_busy_seconds";
/// CPU seconds (user + system) of the trainer process since the pass began.
pub const CPU_SECONDS: &str = "trainer_cpu_seconds";
/// CPU seconds of each local parameter server (label `server`) since the pass began (`trainer demo`).
pub const LOCAL_SERVER_CPU_SECONDS: &str = "trainer_local_server_cpu_seconds";

/// Histogram buckets for every `_seconds` metric (the workspace's one set, shared with the servers).
pub use ops::buckets::LATENCY_BUCKETS;

/// Registers HELP text and units for every metric. Call after the recorder is installed: a `describe_*` call
/// made before goes to the no-op recorder and is lost (no `# HELP` lines; `promtool check metrics` refuses).
pub fn describe() {
    // TLS certificate reloads (protocol::transport::tls::reload).
    protocol::metrics::describe();
    describe_counter!(SAMPLES_TOTAL, "Training samples processed.");
    describe_histogram!(
        REDUCE_SECONDS,
        Unit::Seconds,
        "Seconds per step in the hybrid mode's dense reduce."
    );
    describe_counter!(
        REDUCE_MISSING_TOTAL,
        "Trainer ranks missing from hybrid dense reduce steps."
    );
    describe_counter!(BATCHES_TOTAL, "Training batches processed.");
    describe_gauge!(
        SAMPLES_PER_SECOND,
        "Training samples per second over the last progress interval."
    );
    describe_gauge!(LOSS, "Mean training loss over the last progress interval.");
    describe_gauge!(
        PROGRESSIVE_AUC,
        "AUC of training predictions made before training on their rows, over the last --progressive-window rows."
    );
    describe_gauge!(
        PROGRESSIVE_LOGLOSS,
        "Logloss of training predictions made before training on their rows, over the last --progressive-window rows."
    );
    describe_histogram!(
        PULL_SECONDS,
        Unit::Seconds,
        "Latency of one batch's pull from all servers."
    );
    describe_histogram!(
        PUSH_SECONDS,
        Unit::Seconds,
        "Latency of one batch's push until acknowledged."
    );
    describe_histogram!(
        STALENESS_BATCHES,
        "Earlier batches whose pushes were not acknowledged when a training batch's pull was sent."
    );
    describe_histogram!(
        COMPUTE_SECONDS,
        Unit::Seconds,
        "Dense compute time of one batch."
    );
    describe_counter!(
        ROWS_REPLAYED_TOTAL,
        "Embedding rows updated by replaying this trainer's own unacknowledged pushes."
    );
    describe_histogram!(
        REPLAY_SECONDS,
        Unit::Seconds,
        "Time to replay the pushes in flight on one batch's pulled rows."
    );
    describe_gauge!(
        PUSHES_IN_FLIGHT,
        "Pushes sent and not yet acknowledged (staleness)."
    );
    describe_counter!(
        ROWS_PULLED_TOTAL,
        "Embedding rows pulled (unique per batch)."
    );
    describe_counter!(
        PREFETCH_REQUESTS_TOTAL,
        "Prefetch requests sent ahead of pulls (--prefetch-distance)."
    );
    describe_counter!(
        PREFETCH_ROWS_READ_BACK_TOTAL,
        "Rows the servers read back from RocksDB for this trainer's prefetches."
    );
    describe_counter!(
        PREFETCH_ERRORS_TOTAL,
        "Prefetch requests that failed (the pull then reads its rows itself)."
    );
    describe_counter!(
        ROWS_PUSHED_TOTAL,
        "Embedding gradient rows pushed (unique per batch)."
    );
    describe_counter!(
        WIRE_BYTES_SENT_TOTAL,
        Unit::Bytes,
        "Payload bytes sent after compression."
    );
    describe_counter!(
        WIRE_BYTES_RECEIVED_TOTAL,
        Unit::Bytes,
        "Payload bytes received after compression."
    );
    describe_counter!(
        DENSE_BYTES_SENT_TOTAL,
        Unit::Bytes,
        "Dense-parameter push payload bytes (dense parameters on the servers)."
    );
    describe_counter!(
        DENSE_BYTES_RECEIVED_TOTAL,
        Unit::Bytes,
        "Dense-parameter pull payload bytes (dense parameters on the servers)."
    );
    describe_counter!(
        RAW_BYTES_SENT_TOTAL,
        Unit::Bytes,
        "Payload bytes sent, counted as uncompressed f32."
    );
    describe_counter!(
        RAW_BYTES_RECEIVED_TOTAL,
        Unit::Bytes,
        "Payload bytes received, counted as uncompressed f32."
    );
    describe_counter!(BAD_LINES_TOTAL, "Malformed input lines skipped.");
    describe_counter!(
        TOKENS_TRUNCATED_TOTAL,
        "Tokens of multi-hot fields dropped past their feature's token limit."
    );
    describe_gauge!(EVAL_AUC, "Test AUC of the last evaluation.");
    describe_gauge!(EVAL_LOGLOSS, "Test logloss of the last evaluation.");
    describe_gauge!(
        EVAL_CALIBRATION,
        "Mean prediction over positive rate on the last evaluation."
    );
    describe_gauge!(
        EVAL_MEAN_PREDICTION,
        "Mean predicted click probability on the last evaluation."
    );
    describe_gauge!(
        EVAL_POSITIVE_RATE,
        "Click rate of the last evaluation's rows."
    );
    describe_gauge!(EVAL_SAMPLES, "Rows of the last evaluation.");
    describe_counter!(EVALS_TOTAL, "Evaluations run (periodic and final).");
    describe_counter!(CHECKPOINTS_TOTAL, "Checkpoints written.");
    describe_counter!(
        CHECKPOINTS_SKIPPED_TOTAL,
        "Periodic checkpoints skipped because they could not be written (full disk)."
    );
    describe_histogram!(
        CHECKPOINT_SECONDS,
        Unit::Seconds,
        "Time to write one checkpoint, servers' snapshot included."
    );
    describe_counter!(EXPORTS_TOTAL, "Exports (servable models) written.");
    describe_counter!(
        DENSE_PUBLISHED_TOTAL,
        "Dense parameter versions published to server 0 for serving."
    );
    describe_histogram!(
        EXPORT_SECONDS,
        Unit::Seconds,
        "Time to write one export, servers' snapshot included."
    );
    describe_gauge!(STEP, "Batches trained, including a resumed run's.");
    describe_histogram!(
        STEP_PHASE_SECONDS,
        Unit::Seconds,
        "Wall seconds of one training step in one phase of the training loop (phases add up to the step)."
    );
    describe_gauge!(
        THREAD_BUSY_SECONDS,
        Unit::Seconds,
        "Seconds the reader, plan and push-encoder threads worked beside the training loop this pass."
    );
    describe_gauge!(
        CPU_SECONDS,
        Unit::Seconds,
        "CPU seconds (user + system) of the trainer process this pass."
    );
    describe_gauge!(
        LOCAL_SERVER_CPU_SECONDS,
        Unit::Seconds,
        "CPU seconds of each local parameter server this pass (trainer demo)."
    );
}

/// Sets the evaluation gauges to `report`'s values.
pub fn export_eval(report: &model::eval::EvalReport) {
    if let Some(auc) = report.auc {
        metrics::gauge!(EVAL_AUC).set(auc);
    }
    metrics::gauge!(EVAL_LOGLOSS).set(report.logloss);
    if let Some(c) = report.calibration() {
        metrics::gauge!(EVAL_CALIBRATION).set(c);
    }
    metrics::gauge!(EVAL_MEAN_PREDICTION).set(report.mean_prediction);
    metrics::gauge!(EVAL_POSITIVE_RATE).set(report.positive_rate);
    metrics::gauge!(EVAL_SAMPLES).set(report.count as f64);
    metrics::counter!(EVALS_TOTAL).increment(1);
}
