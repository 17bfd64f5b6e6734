//! `ps-bench`: a load generator for parameter servers.
//!
//! Batches of ids (per table, uniform or Zipf, deduplicated like the trainer) are generated before the run
//! ([`workload`]) and cycled through by `--concurrency` workers, each with one batch in flight: a pull, a push,
//! or a pull then a push (a training step without the compute). The load goes to a cluster over QUIC
//! ([`quic`], through `protocol::PsClient`; local `ps-server` processes from `local_cluster` or a running cluster)
//! or straight to an `embedding::Engine` over a `MemStore` ([`inproc`], the upper limit without network and
//! codec). Requests that start before the warm-up ends or finish after the measured window are not counted.
//!
//! # Layout
//! - [`config`]: flags and validation.
//! - [`workload`]: id sampling, batches, per-server payloads.
//! - [`populate`]: `--populate-rows`, every table filled to N rows before measuring.
//! - [`prefetch`]: `--prefetch-distance`, lookahead prefetch as a trainer would send it.
//! - [`stats`]: latency samples and percentiles.
//! - [`report`]: the JSON and text report.
//! - [`quic`], [`inproc`]: the two drivers.

pub mod config;
pub mod inproc;
pub mod populate;
pub mod prefetch;
pub mod quic;
pub mod report;
pub mod stats;
pub mod workload;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use local_cluster::LocalCluster;

pub use config::{LoadArgs, LoadConfig, Target};
pub use report::Report;

use prefetch::PrefetchTotals;
use report::Measured;
use stats::Latencies;

/// Runs the benchmark the config describes and returns its report.
pub fn run(cfg: &LoadConfig) -> anyhow::Result<Report> {
    match &cfg.where_to {
        Target::InProcess => inproc::run(cfg),
        Target::Cluster { shards, tls_dir } => quic::run(cfg, shards.clone(), tls_dir.clone()),
        Target::Local {
            shards,
            replicas,
            server_args,
        } => {
            let dir = tempfile::Builder::new()
                .prefix("ps-bench-")
                .tempdir()
                .context("create a temporary directory")?;
            let cluster = if *replicas > 1 {
                LocalCluster::start_replicated(*shards, *replicas, dir.path(), server_args)?
            } else {
                LocalCluster::start(*shards, dir.path(), server_args)?
            };
            let report = quic::run(cfg, cluster.replicas.clone(), cluster.tls_dir.clone());
            // Stop the servers whatever the run's outcome; report the run's error first.
            let stopped = cluster.shutdown(Duration::from_secs(60));
            let report = report?;
            stopped?;
            Ok(report)
        }
    }
}

/// The run's time window: warm-up from `start`, measurement from `measure_from` to `end`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// When load starts.
    pub start: Instant,
    /// When measurement starts.
    pub measure_from: Instant,
    /// When load stops.
    pub end: Instant,
}

impl Window {
    /// A window starting now.
    pub fn starting_now(cfg: &LoadConfig) -> Window {
        let start = Instant::now();
        let measure_from = start + Duration::from_secs_f64(cfg.warmup_seconds);
        Window {
            start,
            measure_from,
            end: measure_from + Duration::from_secs_f64(cfg.seconds),
        }
    }

    /// Whether a request from `t0` to `t1` counts.
    pub fn counts(&self, t0: Instant, t1: Instant) -> bool {
        t0 >= self.measure_from && t1 <= self.end
    }

    /// Measured seconds.
    pub fn seconds(&self) -> f64 {
        (self.end - self.measure_from).as_secs_f64()
    }
}

/// What one worker measured.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Pull latencies.
    pub pull: Latencies,
    /// Push latencies.
    pub push: Latencies,
    /// Distinct ids pulled.
    pub pull_rows: u64,
    /// Distinct ids pushed.
    pub push_rows: u64,
    /// Frame bytes.
    pub wire_bytes: u64,
    /// Batches whose every request counted.
    pub batches: u64,
    /// Prefetches sent and what the servers did (the whole run).
    pub prefetch: PrefetchTotals,
}

impl WorkerStats {
    /// Merges workers into the run's totals.
    pub fn total(workers: Vec<WorkerStats>, window: &Window) -> Measured {
        let mut pull = Latencies::new();
        let mut push = Latencies::new();
        let (mut pull_rows, mut push_rows, mut wire_bytes, mut batches) = (0, 0, 0, 0);
        let mut prefetch = PrefetchTotals::default();
        for w in workers {
            prefetch.add(w.prefetch);
            pull.merge(w.pull);
            push.merge(w.push);
            pull_rows += w.pull_rows;
            push_rows += w.push_rows;
            wire_bytes += w.wire_bytes;
            batches += w.batches;
        }
        Measured {
            seconds: window.seconds(),
            pull_rows,
            push_rows,
            wire_bytes,
            batches,
            pull: pull.summary(),
            push: push.summary(),
            prefetch,
        }
    }
}

/// Rows moved so far (warm-up included), for the progress line.
#[derive(Debug, Default)]
pub struct Progress {
    /// Rows pulled.
    pub pulled: AtomicU64,
    /// Rows pushed.
    pub pushed: AtomicU64,
    done: AtomicBool,
}

impl Progress {
    /// Starts a thread printing rows/s to stderr every second until [`Progress::stop`] (nothing if `!show`).
    pub fn start(
        show: bool,
        window: Window,
    ) -> (Arc<Progress>, Option<std::thread::JoinHandle<()>>) {
        let p = Arc::new(Progress::default());
        if !show {
            return (p, None);
        }
        let q = p.clone();
        let h = std::thread::spawn(move || {
            let (mut last_pull, mut last_push, mut last) = (0, 0, Instant::now());
            let mut next = window.start + Duration::from_secs(1);
            while !q.done.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(100)));
                    continue;
                }
                next += Duration::from_secs(1);
                let (pl, ps) = (
                    q.pulled.load(Ordering::Relaxed),
                    q.pushed.load(Ordering::Relaxed),
                );
                let dt = now.duration_since(last).as_secs_f64().max(1e-9);
                let phase = if now < window.measure_from {
                    " (warm-up)"
                } else {
                    ""
                };
                eprintln!(
                    "[{:>5.1} s] pull {:>10.0} rows/s  push {:>10.0} rows/s{phase}",
                    now.duration_since(window.start).as_secs_f64(),
                    (pl - last_pull) as f64 / dt,
                    (ps - last_push) as f64 / dt,
                );
                (last_pull, last_push, last) = (pl, ps, now);
            }
        });
        (p, Some(h))
    }

    /// Stops the progress thread.
    pub fn stop(&self, handle: Option<std::thread::JoinHandle<()>>) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}
