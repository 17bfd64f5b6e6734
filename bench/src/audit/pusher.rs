//! The push loop: one task per server, each with one push in flight. A push increments a random, non-empty
//! subset of that server's counters; it is logged as sent before it goes out, and its acknowledgement is
//! logged before the next push to the server starts.
//! A push that still fails after the client's retries is counted and not logged (it may or may not have been
//! applied: the verifier sees an applied one as a duplicate), and the task goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use protocol::compression::codec;
use protocol::wire::ids::IdCoding;
use protocol::wire::message::pull::IdSections;
use protocol::{Encoding, PsClient};

use super::{Ack, AckLog, AuditError, AuditRows, AUDIT_TABLE_ID};

/// How the auditor pushes.
#[derive(Debug, Clone, Copy)]
pub struct PushConfig {
    /// Pause between the pushes to one server, so the auditor leaves the CPU to the job it audits.
    pub pause: Duration,
    /// Seed of the row subsets (mixed with the server index and the process id).
    pub seed: u64,
}

/// What the push tasks did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushTotals {
    /// Pushes acknowledged (and logged).
    pub acked: u64,
    /// Counter increments acknowledged (rows of acknowledged pushes).
    pub increments: u64,
    /// Pushes that failed after the client's retries.
    pub failed: u64,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Pushes to every server until `stop` is set, then waits for the pushes in flight (their acknowledgements are
/// logged). Fails only if the log cannot be written.
pub async fn run(
    client: Arc<PsClient>,
    rows: Arc<AuditRows>,
    log: Arc<AckLog>,
    cfg: PushConfig,
    stop: Arc<AtomicBool>,
) -> Result<PushTotals, AuditError> {
    let mut tasks = tokio::task::JoinSet::new();
    for server in 0..rows.num_servers() {
        let (client, rows, log, stop) = (client.clone(), rows.clone(), log.clone(), stop.clone());
        tasks.spawn(push_to(client, rows, log, cfg, stop, server));
    }
    let mut totals = PushTotals::default();
    while let Some(joined) = tasks.join_next().await {
        let t = joined.expect("audit push task panicked")?;
        totals.acked += t.acked;
        totals.increments += t.increments;
        totals.failed += t.failed;
    }
    Ok(totals)
}

async fn push_to(
    client: Arc<PsClient>,
    rows: Arc<AuditRows>,
    log: Arc<AckLog>,
    cfg: PushConfig,
    stop: Arc<AtomicBool>,
    server: usize,
) -> Result<PushTotals, AuditError> {
    let mut state = protocol::routing::mix64(
        cfg.seed ^ ((server as u64) << 32) ^ (u64::from(std::process::id()) << 40),
    ) | 1;
    let mut ids = Vec::with_capacity(rows.rows_per_server());
    let mut totals = PushTotals::default();
    while !stop.load(Ordering::Relaxed) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mask = match state & rows.full_mask() {
            0 => rows.full_mask(),
            m => m,
        };
        rows.select(server, mask, &mut ids);
        let mut push = IdSections::new();
        push.table(AUDIT_TABLE_ID, 1, IdCoding::Plain, &ids);
        codec::encode(&vec![-1.0f32; ids.len()], Encoding::F32, &mut push.payload);
        log.sent(Ack {
            t_ms: now_ms(),
            server,
            mask,
        })?;
        match client
            .push(
                server,
                Encoding::F32,
                1.0,
                push.counts,
                Bytes::from(push.payload),
            )
            .await
        {
            Ok((applied, _)) if applied == ids.len() as u64 => {
                log.append(Ack {
                    t_ms: now_ms(),
                    server,
                    mask,
                })?;
                totals.acked += 1;
                totals.increments += applied;
            }
            Ok((applied, rejected)) => {
                // Not an acknowledgement of every row: not logged, counted as failed.
                eprintln!(
                    "ps-audit: server {server} applied {applied} of {} rows ({rejected} rejected)",
                    ids.len()
                );
                totals.failed += 1;
            }
            Err(e) => {
                eprintln!("ps-audit: push to server {server} failed after retries: {e}");
                totals.failed += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if !cfg.pause.is_zero() {
            tokio::time::sleep(cfg.pause).await;
        }
    }
    Ok(totals)
}
