//! The in-process driver: `--concurrency` threads calling `embedding::Engine::gather` and `apply` on an engine
//! over a `MemStore`, table by table, with the same batches as the QUIC driver. No network and no codec: the
//! rows stay f32. A batch's pull (all tables) is one "request", and so is its push.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use embedding::{Engine, MemStore};
use rayon::prelude::*;

use super::config::LoadConfig;
use super::populate;
use super::workload::{gradient_block, Batch, IdSampler};
use super::{Progress, Report, Window, WorkerStats};

/// Runs the workload in process.
pub fn run(cfg: &LoadConfig) -> anyhow::Result<Report> {
    let engine = Engine::open(Arc::new(MemStore::new())).context("open the engine")?;
    for t in cfg.table_configs() {
        engine.register_table(t).context("register table")?;
    }
    let engine = Arc::new(engine);
    let sampler = IdSampler::new(cfg.distribution, cfg.vocab, cfg.zipf_s)?;
    let pool: Vec<Batch> = (0..cfg.pool_batches as u64)
        .into_par_iter()
        .map(|i| Batch::generate(&sampler, cfg.tables, cfg.ids_per_table, cfg.seed, i))
        .collect();
    let pool = Arc::new(pool);
    let grads = Arc::new(gradient_block(
        cfg.ids_per_table,
        cfg.dim as usize,
        cfg.seed,
    ));
    if cfg.populate_rows > 0 {
        let t0 = Instant::now();
        let dim = cfg.dim as usize;
        let block = gradient_block(populate::CHUNK_RANKS as usize, dim, cfg.seed);
        for i in 0..populate::chunks(cfg.populate_rows) {
            let batch = populate::chunk(cfg.tables, cfg.populate_rows, i);
            for (t, ids) in batch.unique.iter().enumerate() {
                engine
                    .apply(t as u32, ids, &block[..ids.len() * dim])
                    .context("populate: apply ranks 1..=N")?;
            }
        }
        eprintln!(
            "ps-bench: populated {} rows per table in {:.1} s",
            cfg.populate_rows,
            t0.elapsed().as_secs_f64()
        );
    }
    if cfg.populate {
        let dim = cfg.dim as usize;
        for batch in pool.iter() {
            for (t, ids) in batch.unique.iter().enumerate() {
                engine
                    .apply(t as u32, ids, &grads[..ids.len() * dim])
                    .context("populate: apply the pooled batches")?;
            }
        }
    }

    let window = Window::starting_now(cfg);
    let (progress, ticker) = Progress::start(cfg.progress, window);
    let handles: Vec<_> = (0..cfg.concurrency)
        .map(|w| {
            let (engine, pool, grads, progress, cfg) = (
                engine.clone(),
                pool.clone(),
                grads.clone(),
                progress.clone(),
                cfg.clone(),
            );
            std::thread::spawn(move || worker(w, &cfg, &engine, &pool, &grads, window, &progress))
        })
        .collect();
    let mut stats = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(s)) => stats.push(s),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(anyhow::anyhow!("a worker thread panicked"));
            }
        }
    }
    progress.stop(ticker);
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(Report::new(
        "in-process",
        cfg,
        WorkerStats::total(stats, &window),
    ))
}

fn worker(
    w: usize,
    cfg: &LoadConfig,
    engine: &Engine,
    pool: &[Batch],
    grads: &[f32],
    window: Window,
    progress: &Progress,
) -> anyhow::Result<WorkerStats> {
    let dim = cfg.dim as usize;
    let mut st = WorkerStats::default();
    let mut out = vec![0f32; cfg.ids_per_table * dim];
    let mut k = w;
    while Instant::now() < window.end {
        let batch = &pool[k % pool.len()];
        k += cfg.concurrency;
        let rows = batch.rows() as u64;
        let mut whole = true;
        if cfg.mix.pulls() {
            let t0 = Instant::now();
            for (t, ids) in batch.unique.iter().enumerate() {
                engine
                    .gather(t as u32, ids, &mut out[..ids.len() * dim])
                    .context("gather")?;
            }
            let t1 = Instant::now();
            progress.pulled.fetch_add(rows, Ordering::Relaxed);
            if window.counts(t0, t1) {
                st.pull.record(t1 - t0);
                st.pull_rows += rows;
            } else {
                whole = false;
            }
        }
        if cfg.mix.pushes() {
            let t0 = Instant::now();
            for (t, ids) in batch.unique.iter().enumerate() {
                engine
                    .apply(t as u32, ids, &grads[..ids.len() * dim])
                    .context("apply")?;
            }
            let t1 = Instant::now();
            progress.pushed.fetch_add(rows, Ordering::Relaxed);
            if window.counts(t0, t1) {
                st.push.record(t1 - t0);
                st.push_rows += rows;
            } else {
                whole = false;
            }
        }
        if whole {
            st.batches += 1;
        }
    }
    Ok(st)
}
