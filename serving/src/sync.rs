//! Delta sync from the training servers (docs/serving.md, "Delta sync"): one standing long-poll per server
//! (`SyncDeltas`), answered the moment the server cuts a delta, so training's changes reach serving about
//! one `--sync-interval` after they were made.
//!
//! - Each server's cursor starts at the export's `sync.json` for its shard: the snapshot holds everything
//!   up to there. A server that restarted since (another incarnation), or dropped the deltas the cursor
//!   needs, answers with a scan of every row it holds instead, in pages.
//! - Deletions and rows are applied as they arrive (a row's newest state wins: deltas carry current values
//!   or deletions); a scan page also deletes the rows it leaves out of its range ([`RowStore::sweep`]); dense
//!   parameters published by the trainer (`--publish-dense-every`) replace the model between two batches
//!   ([`Batcher::set_dense`]), so no prediction mixes two dense versions.
//! - When a server is down, its loop retries with backoff and serving keeps answering from what it has;
//!   the cursor is kept, so it catches up when the server is back.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use protocol::wire::message::sync::{DeltaBatch, DeltasHeader, SyncCursor, SyncPoint, SyncResume};
use protocol::{PsClient, PsClientConfig};

use crate::batcher::Batcher;
use crate::config::{ServeConfig, SyncConfig};
use crate::metrics as m;
use crate::predict::DenseTemplate;
use crate::state::{now_unix_us, Loaded};
use crate::store::{RowStore, ScanKey};

/// Rows per sync answer.
const MAX_ROWS: u32 = 65_536;
/// Longest pause between retries of a failing server.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Starts following the training servers when `cfg` subscribes to any (and the gauges' updater always);
/// returns the tasks, for the caller to abort at shutdown.
pub async fn start(
    cfg: &ServeConfig,
    loaded: &Loaded,
    batcher: &Batcher,
    dense: DenseTemplate,
    stopping: Arc<tokio::sync::Notify>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let store = loaded.store.clone();
    let fresh = loaded.fresh.clone();
    let mut tasks = vec![tokio::spawn(gauges(
        store.clone(),
        fresh.clone(),
        stopping.clone(),
    ))];
    let Some(sync) = cfg.sync.clone() else {
        return Ok(tasks);
    };
    let snapshot = loaded.export_dir.join(model::export::SNAPSHOT_DIR);
    let n = store.shards();
    if sync.servers.len() != n {
        anyhow::bail!(
            "--subscribe lists {} training servers but the export was taken on {n}: list every server of \
             the training cluster, in shard order",
            sync.servers.len()
        );
    }
    let mut cursors = Vec::with_capacity(n);
    for i in 0..n {
        let shard = embedding::snapshot::shard_dir(&snapshot, i as u32, n as u32);
        let cursor = match SyncPoint::read(&shard) {
            Ok(point) => SyncCursor::at(point),
            Err(e) => {
                tracing::warn!(shard = i, error = %e, "no sync point in the export: the first sync is a scan");
                SyncCursor::START
            }
        };
        cursors.push(cursor);
    }
    let follower = Follower {
        store,
        fresh,
        batcher: batcher.clone(),
        dense,
        sync,
    };
    tasks.push(tokio::spawn(follower.run(cursors, stopping)));
    Ok(tasks)
}

struct Follower {
    store: Arc<RowStore>,
    fresh: Arc<crate::state::Freshness>,
    batcher: Batcher,
    dense: DenseTemplate,
    sync: SyncConfig,
}

impl Follower {
    /// Connects (retrying while the servers are down), then runs one long-poll loop per server.
    async fn run(self, cursors: Vec<SyncCursor>, stopping: Arc<tokio::sync::Notify>) {
        let this = Arc::new(self);
        let client = tokio::select! {
            _ = stopping.notified() => return,
            c = this.connect() => Arc::new(c),
        };
        let mut tasks = tokio::task::JoinSet::new();
        for (i, cursor) in cursors.into_iter().enumerate() {
            let (this, client) = (this.clone(), client.clone());
            tasks.spawn(async move { this.follow(&client, i, cursor).await });
        }
        tokio::select! {
            _ = stopping.notified() => tasks.abort_all(),
            _ = async { while tasks.join_next().await.is_some() {} } => {}
        }
    }

    async fn connect(&self) -> PsClient {
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.try_connect().await {
                Ok(c) => {
                    tracing::info!(servers = ?self.sync.servers, "connected to the training servers");
                    return c;
                }
                Err(e) => {
                    metrics::counter!(m::SYNC_ERRORS_TOTAL, "server" => "connect").increment(1);
                    tracing::warn!(error = %format!("{e:#}"), "cannot reach the training servers yet; serving the export");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    async fn try_connect(&self) -> anyhow::Result<PsClient> {
        let addrs =
            protocol::cluster::resolve_servers(&self.sync.servers, self.sync.resolve_timeout)
                .await
                .map_err(anyhow::Error::msg)?;
        let mut cfg = PsClientConfig::replicated(addrs, self.sync.tls_dir.clone());
        // serving.pem: the delta sync and reads, nothing that writes (protocol::auth).
        cfg.role = protocol::Role::Serving;
        cfg.server_name = self.sync.server_name.clone();
        cfg.transport = self.sync.transport;
        cfg.retry_for = Duration::from_secs(2);
        PsClient::connect(cfg).await.context("connect")
    }

    /// Follows server `i` from `cursor` until the task is aborted.
    async fn follow(&self, client: &PsClient, i: usize, mut cursor: SyncCursor) {
        let server = self.sync.servers[i].clone();
        let mut backoff = Duration::from_millis(100);
        loop {
            let dense_version = self.fresh.dense_version.load(Ordering::Relaxed);
            let answer = client
                .sync_deltas(
                    i,
                    cursor,
                    self.sync.encoding,
                    MAX_ROWS,
                    self.sync.wait_ms,
                    dense_version,
                )
                .await;
            let batch = match answer {
                Ok(b) => b,
                Err(e) => {
                    metrics::counter!(m::SYNC_ERRORS_TOTAL, "server" => server.clone())
                        .increment(1);
                    tracing::warn!(%server, error = %e, "delta sync failed; serving the last synced state");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            let applied = tokio::task::block_in_place(|| self.apply(i, &cursor, &batch));
            if let Err(e) = applied {
                metrics::counter!(m::SYNC_ERRORS_TOTAL, "server" => server.clone()).increment(1);
                tracing::error!(%server, error = %e, "a delta did not apply; asking again");
                tokio::time::sleep(backoff).await;
                continue;
            }
            let h = &batch.header;
            if h.scan && h.complete {
                tracing::info!(%server, incarnation = h.incarnation, "caught up by a scan");
            }
            cursor = h.cursor;
        }
    }

    /// Applies server `shard`'s answer to a request at `asked`: deletions, rows (and for a scan page, the
    /// deletion of the rows it does not list in its range), then the dense version (if newer), then freshness.
    fn apply(&self, shard: usize, asked: &SyncCursor, batch: &DeltaBatch) -> anyhow::Result<()> {
        let h = &batch.header;
        // A table the export does not have (registered on the servers after it): nothing predicts with its
        // rows, so they are skipped (counted), rather than failing the answer and asking for it forever.
        let known = |table: u32, rows: usize| {
            let known = self.store.dim(table).is_some();
            if !known {
                metrics::counter!(m::SYNC_ROWS_SKIPPED_TOTAL).increment(rows as u64);
                tracing::debug!(
                    shard,
                    table,
                    rows,
                    "rows of a table the export does not have; skipped"
                );
            }
            known
        };
        let mut deleted = 0;
        for d in batch.deleted.iter().filter(|d| known(d.table, d.ids.len())) {
            self.store
                .delete_rows(d.table, &d.ids)
                .with_context(|| format!("delete {} rows of table {}", d.ids.len(), d.table))?;
            deleted += d.ids.len();
        }
        for t in batch.tables.iter().filter(|t| known(t.table, t.ids.len())) {
            self.store
                .apply_rows(t.table, &t.ids, &t.rows)
                .with_context(|| format!("apply {} rows of table {}", t.ids.len(), t.table))?;
        }
        if h.scan {
            let (from, to) = scan_range(asked, h);
            deleted += self
                .store
                .sweep(shard, from, to, &batch.tables)
                .with_context(|| {
                    format!("delete the rows a scan page of server {shard} leaves out")
                })?;
        }
        if deleted > 0 {
            metrics::counter!(m::ROWS_DELETED_TOTAL).increment(deleted as u64);
            tracing::debug!(shard, deleted, "rows deleted by the delta sync");
        }
        self.store
            .enforce_budget()
            .context("enforce the memory budget")?;
        let rows = batch.rows() as u64;
        metrics::counter!(m::DELTA_ROWS_TOTAL).increment(rows);
        self.fresh.delta_rows.fetch_add(rows, Ordering::Relaxed);
        if let (Some(info), Some(values)) = (&h.dense, &batch.dense) {
            let current = self.fresh.dense_version.load(Ordering::Relaxed);
            if info.version > current {
                let model = self
                    .dense
                    .build(values, info.version)
                    .with_context(|| format!("dense version {}", info.version))?;
                self.batcher
                    .set_dense(model)
                    .context("hand the dense model to the predictor")?;
                self.fresh
                    .dense_version
                    .store(info.version, Ordering::Relaxed);
                self.fresh.dense_step.store(info.step, Ordering::Relaxed);
                self.fresh.saw(info.published_unix_us);
            }
        }
        if h.cut_unix_us > 0 && h.complete {
            let now = now_unix_us();
            self.fresh.saw(h.cut_unix_us);
            self.fresh.deltas.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(m::DELTAS_APPLIED_TOTAL).increment(1);
            if h.oldest_change_unix_us > 0 {
                let age = now.saturating_sub(h.oldest_change_unix_us) as f64 / 1e6;
                metrics::histogram!(m::DELTA_FRESHNESS_SECONDS).record(age);
            }
            tracing::debug!(rows, cut_unix_us = h.cut_unix_us, "delta applied");
        }
        Ok(())
    }
}

/// The (table, id) range a scan page answering a request at `asked` covers: after the first key, up to and
/// including the second (`None`: to the end). A page continues the scan of the cursor's `Scan` resume when
/// the server is the same incarnation; otherwise it is a scan's first page, from the start.
fn scan_range(asked: &SyncCursor, h: &DeltasHeader) -> (ScanKey, Option<ScanKey>) {
    let from = match asked.resume {
        Some(SyncResume::Scan { table, after }) if asked.incarnation == h.incarnation => {
            (table, after)
        }
        _ => (0, None),
    };
    let to = match h.cursor.resume {
        Some(SyncResume::Scan { table, after }) if !h.complete => Some((table, after)),
        _ => None,
    };
    (from, to)
}

/// Updates the model-age and rows gauges every second until stopping.
async fn gauges(
    store: Arc<RowStore>,
    fresh: Arc<crate::state::Freshness>,
    stopping: Arc<tokio::sync::Notify>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stopping.notified() => return,
            _ = tick.tick() => {}
        }
        metrics::gauge!(m::MODEL_AGE_SECONDS).set(fresh.age_seconds(now_unix_us()));
        metrics::gauge!(m::ROWS_IN_MEMORY).set(store.rows_in_memory() as f64);
        metrics::gauge!(m::ROWS_MEMORY_BYTES).set(store.memory_bytes() as f64);
    }
}
