//! The load run: `--concurrency` workers, each with one keep-alive connection and one request in flight,
//! cycling through the prebuilt bodies.
//!
//! Every worker connects before the clock starts, so an unreachable URL fails the run at once. During the run
//! a failed exchange is counted and the connection replaced (after a short pause, so that a server that went
//! away does not turn the loop into a busy one).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::answer;
use super::client::{Connection, Endpoint};
use super::config::{ServeConfig, Stop};
use super::report::{chain, ErrorTally, LoadReport};
use super::Batch;
use crate::load::stats::Latencies;

/// The predict route.
pub const PREDICT: &str = "/v1/predict";

/// Pause before reconnecting after a transport failure.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// What one worker measured.
#[derive(Default)]
struct Tally {
    latencies: Latencies,
    rows: u64,
    errors: ErrorTally,
    /// Newest (export version, dense version) answered.
    versions: Option<(u64, u64)>,
}

/// Shared by the workers.
struct Plan {
    endpoint: Endpoint,
    addr: SocketAddr,
    timeout: Duration,
    content_type: &'static str,
    batches: Vec<Batch>,
    next: AtomicUsize,
    /// Measured requests started (with `Stop::Requests`).
    tickets: AtomicU64,
    stop: Stop,
    warm_end: Instant,
    /// End of the measured window (with `Stop::Seconds`).
    end: Option<Instant>,
}

/// Runs the load and reports it. Fails when no connection can be made, or when no measured request
/// succeeded (with the first failure's message).
pub async fn run(
    cfg: &ServeConfig,
    batches: Vec<Batch>,
    stop: Stop,
    warmup_secs: f64,
) -> anyhow::Result<LoadReport> {
    if batches.is_empty() {
        bail!("no rows to send");
    }
    let addr = cfg.endpoint.resolve().await?;
    let mut conns = Vec::with_capacity(cfg.concurrency);
    for _ in 0..cfg.concurrency {
        conns.push(Connection::open(&cfg.endpoint, addr, cfg.timeout).await?);
    }
    let start = Instant::now();
    let warm_end = start + Duration::from_secs_f64(warmup_secs);
    let plan = Arc::new(Plan {
        endpoint: cfg.endpoint.clone(),
        addr,
        timeout: cfg.timeout,
        content_type: cfg.format.content_type(),
        batches,
        next: AtomicUsize::new(0),
        tickets: AtomicU64::new(0),
        stop,
        warm_end,
        end: match stop {
            Stop::Seconds(s) => Some(warm_end + Duration::from_secs_f64(s)),
            Stop::Requests(_) => None,
        },
    });
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|conn| tokio::spawn(work(plan.clone(), conn)))
        .collect();
    let mut total = Tally::default();
    for t in tasks {
        let t = t.await?;
        total.latencies.merge(t.latencies);
        total.rows += t.rows;
        total.errors.merge(t.errors);
        total.versions = total.versions.max(t.versions);
    }
    let seconds = match stop {
        Stop::Seconds(s) => s,
        Stop::Requests(_) => Instant::now()
            .saturating_duration_since(warm_end)
            .as_secs_f64(),
    };
    if total.latencies.is_empty() {
        match total.errors.first.iter().next() {
            Some((kind, msg)) => bail!(
                "no request succeeded ({} failed: {}); first {kind} failure: {msg}",
                total.errors.total(),
                total.errors.field()
            ),
            None => bail!("no request was measured: raise --duration or --requests"),
        }
    }
    let summary = total.latencies.summary();
    Ok(LoadReport::new(
        cfg,
        seconds,
        total.rows,
        &summary,
        total.errors,
        total.versions,
    ))
}

/// One worker: sends until the plan says stop.
async fn work(plan: Arc<Plan>, conn: Connection) -> Tally {
    let mut tally = Tally::default();
    let mut conn = Some(conn);
    loop {
        let now = Instant::now();
        if plan.end.is_some_and(|end| now >= end) {
            break;
        }
        let measured = now >= plan.warm_end;
        if let (true, Stop::Requests(n)) = (measured, plan.stop) {
            if plan.tickets.fetch_add(1, Ordering::Relaxed) >= n {
                break;
            }
        }
        let mut c = match conn.take().filter(|c| !c.is_closed()) {
            Some(c) => c,
            None => match Connection::open(&plan.endpoint, plan.addr, plan.timeout).await {
                Ok(c) => c,
                Err(e) => {
                    if measured {
                        tally.errors.record(e.kind(), || chain(&e));
                    }
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            },
        };
        let i = plan.next.fetch_add(1, Ordering::Relaxed) % plan.batches.len();
        let batch = &plan.batches[i];
        let sent = Instant::now();
        let result = c.post(PREDICT, plan.content_type, batch.body.clone()).await;
        let done = Instant::now();
        // In a timed run, what finishes after the window is not counted.
        let counted = measured && plan.end.is_none_or(|end| done <= end);
        match result {
            Ok((status, body)) => {
                conn = Some(c);
                match answer::parse(status, &body, batch.rows) {
                    Ok(p) if counted => {
                        tally.latencies.record(done - sent);
                        tally.rows += batch.rows as u64;
                        tally.versions = tally.versions.max(Some((p.version, p.dense_version)));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if counted {
                            tally.errors.record(&e.kind(), || e.to_string());
                        }
                    }
                }
            }
            Err(e) => {
                // The connection is dropped: the next request opens a new one.
                if counted {
                    tally.errors.record(e.kind(), || chain(&e));
                }
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
        }
    }
    tally
}
