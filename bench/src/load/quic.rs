//! The network driver, QUIC or TCP (`--transport`; the transport is `protocol::PsClient`'s business):
//! `--concurrency` tokio tasks sharing one `PsClient`, each sending its batch's requests to every server at once
//! and waiting for all answers before the next phase (pull, then push).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use protocol::wire::frame::encode_head;
use protocol::wire::message::{pull, push};
use protocol::{PsClient, PsClientConfig, Response};
use rayon::prelude::*;

use super::config::LoadConfig;
use super::populate;
use super::prefetch::{self, Prefetcher};
use super::workload::{gradient_block, plan, Batch, IdSampler, ServerRequests};
use super::{Progress, Report, Window, WorkerStats};

/// One pre-built request pair for one server, with its frame sizes.
struct Prepared {
    req: ServerRequests,
    pull_wire: u64,
    push_wire: u64,
}

fn head_len<H: serde::Serialize>(h: &H, payload: usize) -> anyhow::Result<u64> {
    let mut out = Vec::new();
    encode_head(h, payload, &mut out)?;
    Ok(out.len() as u64)
}

/// Exact frame bytes of a pull and of a push (both directions) for `r`.
fn wire_sizes(r: &ServerRequests, cfg: &LoadConfig, epoch: u64) -> anyhow::Result<(u64, u64)> {
    let rows_bytes = r.rows * cfg.codec.row_bytes(cfg.dim as usize);
    let pull_req = pull::request(epoch, cfg.codec, r.counts.clone());
    let pull_resp = Response::Pulled {
        encoding: cfg.codec,
        tables: r.counts.clone(),
    };
    let push_req = push::request(
        epoch,
        cfg.codec,
        (1.0, 1.0),
        r.counts.clone(),
        push::PushId::NONE,
    )?;
    let push_resp = Response::Pushed {
        rows: r.rows as u64,
        rejected_nonfinite: 0,
    };
    let pull = head_len(&pull_req, r.pull_ids.len())?
        + r.pull_ids.len() as u64
        + head_len(&pull_resp, rows_bytes)?
        + rows_bytes as u64;
    let push = head_len(&push_req, r.push_payload.len())?
        + r.push_payload.len() as u64
        + head_len(&push_resp, 0)?;
    Ok((pull, push))
}

/// Runs the workload against the cluster whose shard `i` runs on the replicas `shards[i]` (one address per
/// shard without replication).
pub fn run(
    cfg: &LoadConfig,
    shards: Vec<Vec<SocketAddr>>,
    tls_dir: PathBuf,
) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    rt.block_on(run_async(cfg, shards, tls_dir))
}

async fn run_async(
    cfg: &LoadConfig,
    addrs: Vec<Vec<SocketAddr>>,
    tls_dir: PathBuf,
) -> anyhow::Result<Report> {
    let mut client_cfg = PsClientConfig::replicated(addrs.clone(), tls_dir);
    client_cfg.transport = cfg.transport;
    let client = PsClient::connect(client_cfg)
        .await
        .with_context(|| format!("connect to {addrs:?} over {}", cfg.transport))?;
    client
        .register_tables(&cfg.table_configs())
        .await
        .context("register tables")?;
    let map = client.shard_map();
    let sampler = IdSampler::new(cfg.distribution, cfg.vocab, cfg.zipf_s)?;
    let grads = gradient_block(cfg.ids_per_table, cfg.dim as usize, cfg.seed);
    let pool: Vec<Vec<Prepared>> = (0..cfg.pool_batches as u64)
        .into_par_iter()
        .map(|i| {
            let batch = Batch::generate(&sampler, cfg.tables, cfg.ids_per_table, cfg.seed, i);
            plan(&batch, &map, cfg.dim as usize, cfg.codec, &grads)
                .into_iter()
                .map(|req| {
                    let (pull_wire, push_wire) = wire_sizes(&req, cfg, map.epoch)?;
                    Ok(Prepared {
                        req,
                        pull_wire,
                        push_wire,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .collect::<anyhow::Result<_>>()?;
    let pool = Arc::new(pool);
    let client = Arc::new(client);
    if cfg.populate_rows > 0 {
        populate_rows(&client, cfg, &map).await?;
    }
    if cfg.populate {
        for reqs in pool.iter() {
            phase(&client, cfg, reqs, true)
                .await
                .context("populate: push the pooled batches")?;
        }
    }

    let run_base = prefetch::run_base();
    let mut prefetchers = Vec::new();
    for w in 0..cfg.concurrency {
        let mut prefetcher = (cfg.prefetch_distance > 0).then(|| {
            Prefetcher::new(
                client.clone(),
                prefetch::owner(run_base, w),
                cfg.prefetch_distance,
            )
        });
        if let Some(p) = &mut prefetcher {
            let batch = |k: u64| &pool[(w + k as usize * cfg.concurrency) % pool.len()];
            p.prime(|k| batch(k).iter().map(|p| &p.req))
                .await
                .context("prime the prefetch window")?;
        }
        prefetchers.push(prefetcher);
    }
    let window = Window::starting_now(cfg);
    let (progress, ticker) = Progress::start(cfg.progress, window);
    let mut workers = Vec::new();
    for (w, prefetcher) in prefetchers.into_iter().enumerate() {
        let (client, pool, progress, cfg) =
            (client.clone(), pool.clone(), progress.clone(), cfg.clone());
        let servers = addrs.len();
        workers.push(tokio::spawn(async move {
            worker(w, &cfg, client, pool, window, progress, prefetcher, servers).await
        }));
    }
    let mut stats = Vec::new();
    let mut first_err = None;
    for h in workers {
        match h.await.context("worker task")? {
            Ok(s) => stats.push(s),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    progress.stop(ticker);
    client.close().await;
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(Report::new(
        cfg.transport.name(),
        cfg,
        WorkerStats::total(stats, &window),
    ))
}

/// `--populate-rows`: pushes ranks `1..=N` of every table ([`populate::chunk`]), `--concurrency` requests in
/// flight, and prints how long it took.
async fn populate_rows(
    client: &Arc<PsClient>,
    cfg: &LoadConfig,
    map: &protocol::ShardMap,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let grads = Arc::new(gradient_block(
        populate::CHUNK_RANKS as usize,
        cfg.dim as usize,
        cfg.seed,
    ));
    let mut tasks = tokio::task::JoinSet::new();
    let chunks = populate::chunks(cfg.populate_rows);
    let mut next = 0;
    loop {
        while next < chunks && tasks.len() < cfg.concurrency {
            let (client, cfg, map, grads) =
                (client.clone(), cfg.clone(), map.clone(), grads.clone());
            let index = next;
            tasks.spawn(async move {
                let batch = populate::chunk(cfg.tables, cfg.populate_rows, index);
                let reqs = plan(&batch, &map, cfg.dim as usize, cfg.codec, &grads);
                for (s, r) in reqs.into_iter().enumerate() {
                    if r.rows > 0 {
                        client
                            .push(s, cfg.codec, 1.0, r.counts, r.push_payload)
                            .await
                            .with_context(|| {
                                format!("populate: push chunk {index} to server {s}")
                            })?;
                    }
                }
                Ok::<_, anyhow::Error>(())
            });
            next += 1;
        }
        match tasks.join_next().await {
            Some(done) => done.context("populate task")??,
            None => break,
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let rows = cfg.populate_rows * u64::from(cfg.tables);
    eprintln!(
        "ps-bench: populated {} rows per table ({rows} rows) in {secs:.1} s ({:.0} rows/s)",
        cfg.populate_rows,
        rows as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Sends one phase (every server's pull, or every server's push) and waits for all of it. Returns per-request
/// (start, end, rows, wire bytes).
async fn phase(
    client: &Arc<PsClient>,
    cfg: &LoadConfig,
    reqs: &[Prepared],
    push: bool,
) -> anyhow::Result<Vec<(Instant, Instant, usize, u64)>> {
    let mut handles = Vec::with_capacity(reqs.len());
    for (s, p) in reqs.iter().enumerate() {
        if p.req.rows == 0 {
            continue;
        }
        let client = client.clone();
        let (counts, codec) = (p.req.counts.clone(), cfg.codec);
        let (rows, wire) = (p.req.rows, if push { p.push_wire } else { p.pull_wire });
        let payload = if push {
            p.req.push_payload.clone()
        } else {
            p.req.pull_ids.clone()
        };
        handles.push(tokio::spawn(async move {
            let t0 = Instant::now();
            if push {
                client.push(s, codec, 1.0, counts, payload).await?;
            } else {
                client.pull(s, codec, counts, payload).await?;
            }
            Ok::<_, protocol::ProtocolError>((t0, Instant::now(), rows, wire))
        }));
    }
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        let what = if push { "push" } else { "pull" };
        out.push(h.await.context("request task")?.context(what)?);
    }
    Ok(out)
}

/// With `--rate R`, when worker `w`'s batch `j` (the run's batch `w + j * C`) is due: `start + (w + j * C) / R`.
fn schedule(cfg: &LoadConfig, window: Window, w: usize, j: u64) -> Option<Instant> {
    (cfg.rate > 0.0).then(|| {
        let i = w as u64 + j * cfg.concurrency as u64;
        window.start + Duration::from_secs_f64(i as f64 / cfg.rate)
    })
}

/// Worker `w`: its batches are pool batches `w`, `w + C`, `w + 2C`, ... (`C` = `--concurrency`), each
/// pulled and pushed in turn (open loop: each at its [`schedule`]d time); with a prefetcher, batch `j + P` is
/// prefetched before batch `j` is pulled.
#[allow(clippy::too_many_arguments)]
async fn worker(
    w: usize,
    cfg: &LoadConfig,
    client: Arc<PsClient>,
    pool: Arc<Vec<Vec<Prepared>>>,
    window: Window,
    progress: Arc<Progress>,
    mut prefetcher: Option<Prefetcher>,
    servers: usize,
) -> anyhow::Result<WorkerStats> {
    let mut st = WorkerStats::default();
    let batch = |j: u64| &pool[(w + j as usize * cfg.concurrency) % pool.len()];
    let mut j = 0u64;
    while Instant::now() < window.end {
        // Open loop: this batch's scheduled start; the pull's latency runs from it.
        let scheduled = schedule(cfg, window, w, j);
        if let Some(at) = scheduled {
            if at >= window.end {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
        }
        if let Some(p) = &mut prefetcher {
            // Batches run one after another: the `j` before this one have completed.
            p.ahead_of(j, j, |k| batch(k).iter().map(|p| &p.req))
                .await?;
        }
        let reqs = batch(j);
        j += 1;
        let mut whole = true;
        for push in [false, true] {
            if (push && !cfg.mix.pushes()) || (!push && !cfg.mix.pulls()) {
                continue;
            }
            for (t0, t1, rows, wire) in phase(&client, cfg, reqs, push).await? {
                // Behind schedule, the pull also waited for its turn: count that wait.
                let t0 = match scheduled {
                    Some(at) if !push => t0.min(at),
                    _ => t0,
                };
                let counter = if push {
                    &progress.pushed
                } else {
                    &progress.pulled
                };
                counter.fetch_add(rows as u64, Ordering::Relaxed);
                if !window.counts(t0, t1) {
                    whole = false;
                    continue;
                }
                st.wire_bytes += wire;
                if push {
                    st.push.record(t1 - t0);
                    st.push_rows += rows as u64;
                } else {
                    st.pull.record(t1 - t0);
                    st.pull_rows += rows as u64;
                }
            }
        }
        if whole {
            st.batches += 1;
        }
    }
    if let Some(p) = prefetcher {
        st.prefetch = p.finish(servers).await?;
    }
    Ok(st)
}
