//! The primary's side of replication: one [`Link`] per joined backup, a queue of row messages in one order
//! per backup, a sender task that batches the queue into `Replicate` requests, and the catch-up scan of a
//! joining backup.
//!
//! **Order.** Every message is gathered (the rows' current values read) and queued to every link under one
//! lock ([`Links::order`]), so each backup receives values in the order they were read: a later message holds
//! a value at least as new for every row it names, and a backup that stores messages in order converges to
//! the primary. Pushes apply before taking the lock (concurrently, under stripe locks); only the copy of their
//! rows is serialized. The catch-up scan reads its pages under the same lock, so a page can never overwrite a
//! newer streamed value.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use embedding::Engine;
use parking_lot::Mutex;
use protocol::wire::message::push::PushAnswer;
use protocol::wire::message::replicate::{self, ReplicateHeader, ReplicateKind, RowsTable};
use protocol::{ErrorCode, Request, Response, TableConfig};
use tokio::sync::{watch, Notify};

use super::Replica;
use crate::metrics as m;
use crate::shard::Shard;

/// An idle stream sends a heartbeat this often, so a backup knows its primary is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(250);
/// Most bytes of rows in one `Replicate` request.
const MAX_BATCH_BYTES: usize = 16 << 20;
/// Rows per catch-up message.
const CATCHUP_ROWS: usize = 4096;
/// The catch-up scan waits while this many messages are queued for its backup.
const CATCHUP_QUEUE: usize = 16;

/// One message of the stream: rows of one or more tables, or tables to register (also the unit of a
/// reshard's stream, [`crate::shard::reshard`]).
pub struct Msg {
    pub(crate) kind: ReplicateKind,
    pub(crate) new_tables: Vec<TableConfig>,
    pub(crate) tables: Vec<RowsTable>,
    pub(crate) payload: Vec<u8>,
    /// The answers of the pushes whose rows these are (a backup remembers them for retries).
    pub(crate) pushes: Vec<PushAnswer>,
    pub(crate) queued: Instant,
}

impl Msg {
    /// Reads the current full rows of `parts` ((table, ids)) into a message. Unknown tables are skipped
    /// (a push naming one was refused before anything was applied).
    pub(crate) fn gather(engine: &Engine, kind: ReplicateKind, parts: &[(u32, &[u64])]) -> Msg {
        let mut tables = Vec::with_capacity(parts.len());
        let mut payload = Vec::new();
        let mut rows = Vec::new();
        for &(table, ids) in parts {
            let Ok(t) = engine.table(table) else { continue };
            if ids.is_empty() {
                continue;
            }
            let row_len = t.row_len();
            rows.clear();
            rows.resize(ids.len() * row_len, 0.0);
            if let Err(e) = engine.gather_with_state(table, ids, &mut rows) {
                tracing::warn!(table, error = %e, "gather for replication failed; rows not streamed");
                continue;
            }
            tables.push(RowsTable {
                table,
                count: ids.len() as u32,
                row_len: row_len as u32,
            });
            replicate::put_rows(ids, &rows, &mut payload);
        }
        Msg {
            kind,
            new_tables: Vec::new(),
            tables,
            payload,
            pushes: Vec::new(),
            queued: Instant::now(),
        }
    }

    pub(crate) fn rows(&self) -> u64 {
        self.tables.iter().map(|t| u64::from(t.count)).sum()
    }
}

/// The stream to one backup.
pub struct Link {
    /// The backup's replica index.
    pub replica: u32,
    /// Its join session.
    pub session: u64,
    queue: Mutex<Queue>,
    wake: Notify,
    /// Highest sequence number the backup stored.
    acked: watch::Sender<u64>,
    /// Whether the backup holds every row (its catch-up is through).
    pub in_sync: AtomicBool,
    /// Set when the stream ended (the backup failed or was replaced); waiters stop waiting for it.
    pub dead: AtomicBool,
}

struct Queue {
    msgs: VecDeque<(u64, Arc<Msg>)>,
    next_seq: u64,
}

impl Link {
    fn new(replica: u32, session: u64) -> Link {
        Link {
            replica,
            session,
            queue: Mutex::new(Queue {
                msgs: VecDeque::new(),
                next_seq: 1,
            }),
            wake: Notify::new(),
            acked: watch::Sender::new(0),
            in_sync: AtomicBool::new(false),
            dead: AtomicBool::new(false),
        }
    }

    /// Queues `msg`; returns its sequence number.
    fn push(&self, msg: Arc<Msg>) -> u64 {
        let mut q = self.queue.lock();
        let seq = q.next_seq;
        q.next_seq += 1;
        q.msgs.push_back((seq, msg));
        drop(q);
        self.wake.notify_one();
        seq
    }

    fn queued(&self) -> usize {
        self.queue.lock().msgs.len()
    }

    /// Seconds the oldest queued message has waited.
    fn oldest_secs(&self) -> f64 {
        self.queue
            .lock()
            .msgs
            .front()
            .map_or(0.0, |(_, m)| m.queued.elapsed().as_secs_f64())
    }

    fn kill(&self) {
        self.dead.store(true, Ordering::Release);
        self.acked.send_modify(|_| {});
        self.wake.notify_one();
    }
}

/// Every backup's link, and the lock that orders their messages.
#[derive(Default)]
pub struct Links {
    links: Mutex<Vec<Arc<Link>>>,
    /// Held while a message is gathered and queued to every link.
    order: Mutex<()>,
}

/// What a push waits for in `replicated` durability: its message stored by every backup in sync when it
/// was queued.
pub struct AckWait {
    waits: Vec<(Arc<Link>, u64)>,
    started: Instant,
}

impl AckWait {
    /// Waits until every link has stored its message or ended.
    pub async fn wait(self) {
        for (link, seq) in &self.waits {
            let mut rx = link.acked.subscribe();
            let _ = rx
                .wait_for(|&acked| acked >= *seq || link.dead.load(Ordering::Acquire))
                .await;
        }
        metrics::histogram!(m::REPLICATION_WAIT_SECONDS)
            .record(self.started.elapsed().as_secs_f64());
    }
}

impl Links {
    /// Current links.
    pub fn all(&self) -> Vec<Arc<Link>> {
        self.links.lock().clone()
    }

    /// Bit `r` set for every in-sync backup `r`.
    pub fn in_sync_bits(&self) -> u64 {
        self.links
            .lock()
            .iter()
            .filter(|l| l.in_sync.load(Ordering::Acquire))
            .fold(0, |bits, l| bits | 1u64 << l.replica)
    }

    /// Copies the rows of a push just applied to every backup; returns what the push waits for when
    /// `wait_for_backups` (the in-sync ones), or `None` when there is nothing to wait for.
    pub fn after_push(
        &self,
        engine: &Engine,
        parts: &[(u32, &[u64])],
        answer: Option<PushAnswer>,
        wait_for_backups: bool,
    ) -> Option<AckWait> {
        if self.links.lock().is_empty() {
            return None;
        }
        let _order = self.order.lock();
        let links = self.all();
        let mut msg = Msg::gather(engine, ReplicateKind::Stream, parts);
        msg.pushes.extend(answer);
        let msg = Arc::new(msg);
        let rows = msg.rows();
        let mut waits = Vec::new();
        for link in links {
            let seq = link.push(msg.clone());
            if wait_for_backups && link.in_sync.load(Ordering::Acquire) {
                waits.push((link, seq));
            }
        }
        metrics::counter!(m::REPLICATION_ROWS_TOTAL, "phase" => "stream").increment(rows);
        (!waits.is_empty()).then(|| AckWait {
            waits,
            started: Instant::now(),
        })
    }

    /// Queues newly registered tables to every backup.
    pub fn tables_registered(&self, tables: Vec<TableConfig>) {
        if self.links.lock().is_empty() || tables.is_empty() {
            return;
        }
        let _order = self.order.lock();
        let msg = Arc::new(Msg {
            kind: ReplicateKind::Stream,
            new_tables: tables,
            tables: Vec::new(),
            payload: Vec::new(),
            pushes: Vec::new(),
            queued: Instant::now(),
        });
        for link in self.all() {
            link.push(msg.clone());
        }
    }

    /// Ends every link (this replica stopped being the primary).
    pub fn clear(&self) {
        for link in std::mem::take(&mut *self.links.lock()) {
            link.kill();
        }
    }

    fn remove(&self, link: &Arc<Link>) {
        let mut links = self.links.lock();
        if let Some(at) = links.iter().position(|l| Arc::ptr_eq(l, link)) {
            links.remove(at);
        }
        drop(links);
        link.kill();
    }

    /// Sets the lag gauges from the current queues.
    pub fn record_lag(&self) {
        let links = self.all();
        let pushes = links.iter().map(|l| l.queued()).max().unwrap_or(0);
        let secs = links.iter().map(|l| l.oldest_secs()).fold(0.0, f64::max);
        metrics::gauge!(m::REPLICATION_LAG_PUSHES).set(pushes as f64);
        metrics::gauge!(m::REPLICATION_LAG_SECONDS).set(secs);
        metrics::gauge!(m::REPLICATION_BACKUPS_IN_SYNC).set(
            links
                .iter()
                .filter(|l| l.in_sync.load(Ordering::Acquire))
                .count() as f64,
        );
    }
}

/// Starts streaming to backup `replica` under `session`: replaces its previous link, then a catch-up scan
/// and the sender run as tasks.
pub fn join(shard: &Arc<Shard>, replica: u32, session: u64) {
    let rep = &shard.replica;
    let link = Arc::new(Link::new(replica, session));
    // A join comes from a (re)started backup: a connection to its previous process would only time out.
    rep.peers.forget(replica);
    {
        let mut links = rep.links.links.lock();
        if let Some(at) = links.iter().position(|l| l.replica == replica) {
            links.remove(at).kill();
        }
        // Registered before the scan reads anything: every push from now on is queued to it too.
        links.push(link.clone());
    }
    tracing::info!(
        replica,
        session,
        backup = rep.peers.name(replica),
        "backup joined: catching up"
    );
    let scan = (shard.clone(), link.clone());
    rep.tasks
        .spawn(async move { catch_up(&scan.0, &scan.1).await });
    let send = shard.clone();
    rep.tasks.spawn(async move { sender(&send, link).await });
}

/// The catch-up scan: every table, then every row of every table (memory one stripe at a time, and the
/// store for tables that evicted rows), in messages of [`CATCHUP_ROWS`], then `CaughtUp`.
async fn catch_up(shard: &Arc<Shard>, link: &Arc<Link>) {
    let engine = &shard.engine;
    let links = &shard.replica.links;
    let configs = engine.registered_tables();
    let tables: Vec<u32> = configs.iter().map(|c| c.id).collect();
    {
        let _order = links.order.lock();
        link.push(Arc::new(Msg {
            kind: ReplicateKind::CatchUp,
            new_tables: configs,
            tables: Vec::new(),
            payload: Vec::new(),
            pushes: Vec::new(),
            queued: Instant::now(),
        }));
    }
    let began = Instant::now();
    let mut rows = 0u64;
    let mut ids = Vec::new();
    for table in tables {
        let Ok(t) = engine.table(table) else { continue };
        let mut pages: Vec<Vec<u64>> = Vec::new();
        for stripe in 0..t.stripe_count() {
            t.stripe_ids(stripe, &mut ids);
            pages.extend(ids.chunks(CATCHUP_ROWS).map(<[u64]>::to_vec));
            if !send_pages(shard, link, table, &mut pages, &mut rows).await {
                return;
            }
        }
        if t.spilled() {
            let mut after = None;
            loop {
                ids.clear();
                if let Err(e) = engine
                    .store()
                    .scan_ids(table, after, CATCHUP_ROWS, &mut ids)
                {
                    tracing::error!(table, error = %e, "catch-up scan of the store failed; backup dropped");
                    links.remove(link);
                    return;
                }
                let Some(&last) = ids.last() else { break };
                after = Some(last);
                pages.push(std::mem::take(&mut ids));
                if !send_pages(shard, link, table, &mut pages, &mut rows).await {
                    return;
                }
            }
        }
    }
    {
        let _order = links.order.lock();
        link.push(Arc::new(Msg {
            kind: ReplicateKind::CaughtUp,
            new_tables: Vec::new(),
            tables: Vec::new(),
            payload: Vec::new(),
            pushes: Vec::new(),
            queued: Instant::now(),
        }));
    }
    tracing::info!(
        replica = link.replica,
        rows,
        secs = began.elapsed().as_secs_f64(),
        "catch-up scan queued"
    );
}

/// Queues `pages` of `table` (drained), waiting while the link's queue is long; false if the link died.
async fn send_pages(
    shard: &Arc<Shard>,
    link: &Arc<Link>,
    table: u32,
    pages: &mut Vec<Vec<u64>>,
    rows: &mut u64,
) -> bool {
    for page in pages.drain(..) {
        while link.queued() >= CATCHUP_QUEUE {
            if link.dead.load(Ordering::Acquire) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if link.dead.load(Ordering::Acquire) {
            return false;
        }
        let _order = shard.replica.links.order.lock();
        let msg = Msg::gather(&shard.engine, ReplicateKind::CatchUp, &[(table, &page)]);
        *rows += msg.rows();
        metrics::counter!(m::REPLICATION_ROWS_TOTAL, "phase" => "catchup").increment(msg.rows());
        link.push(Arc::new(msg));
    }
    true
}

/// Sends the link's queue to its backup, batched, until the link dies, the backup fails, or this replica
/// stops being the primary. A heartbeat goes out when nothing was queued for [`HEARTBEAT`].
async fn sender(shard: &Arc<Shard>, link: Arc<Link>) {
    let rep: &Replica = &shard.replica;
    let mut next_seq = 1u64;
    loop {
        if link.dead.load(Ordering::Acquire) {
            break;
        }
        let batch = take_batch(&link.queue.lock().msgs);
        if batch.is_empty() {
            let notified = link.wake.notified();
            if link.queued() == 0 {
                if tokio::time::timeout(HEARTBEAT, notified).await.is_ok() {
                    continue;
                }
            } else {
                continue;
            }
        }
        let (new_tables, tables, payload) = joined(&batch);
        let header = ReplicateHeader {
            shard_epoch: rep.epoch(),
            session: link.session,
            seq: next_seq,
            messages: batch.len() as u32,
            kind: batch
                .last()
                .map_or(ReplicateKind::Heartbeat, |(_, m)| m.kind),
            new_tables,
            tables,
            pushes: batch
                .iter()
                .flat_map(|(_, m)| m.pushes.iter().copied())
                .collect(),
        };
        let req = Request::Replicate { header };
        let answer = rep
            .peers
            .call(
                link.replica,
                &req,
                Bytes::from(payload),
                super::peer::PEER_TIMEOUT,
            )
            .await;
        match answer {
            Ok(Response::Replicated { .. }) => {
                if let Some(&(last, ref msg)) = batch.last() {
                    next_seq = last + 1;
                    {
                        let mut q = link.queue.lock();
                        while q.msgs.front().is_some_and(|(s, _)| *s <= last) {
                            q.msgs.pop_front();
                        }
                    }
                    if msg.kind == ReplicateKind::CaughtUp {
                        link.in_sync.store(true, Ordering::Release);
                        tracing::info!(replica = link.replica, "backup in sync");
                    }
                    link.acked.send_replace(last);
                }
            }
            Ok(Response::Error {
                code: ErrorCode::StaleEpoch,
                message,
            }) => {
                tracing::warn!(replica = link.replica, %message, "a backup holds a newer shard epoch: stepping down");
                links_drop(rep, &link, "newer epoch");
                rep.step_down(None);
                return;
            }
            Ok(other) => {
                tracing::warn!(replica = link.replica, answer = ?other, "backup refused the stream; dropped");
                links_drop(rep, &link, "refused");
                return;
            }
            Err(e) => {
                tracing::warn!(replica = link.replica, error = %e, "backup unreachable; dropped from the stream");
                links_drop(rep, &link, "unreachable");
                return;
            }
        }
    }
    rep.links.remove(&link);
}

/// The queued messages one request carries: from the front, up to [`MAX_BATCH_BYTES`] of rows (at least
/// one message), ending at a `CaughtUp`.
pub(crate) fn take_batch(msgs: &VecDeque<(u64, Arc<Msg>)>) -> Vec<(u64, Arc<Msg>)> {
    let mut bytes = 0;
    let mut out = Vec::new();
    for (seq, msg) in msgs {
        if !out.is_empty() && bytes + msg.payload.len() > MAX_BATCH_BYTES {
            break;
        }
        bytes += msg.payload.len();
        out.push((*seq, msg.clone()));
        if msg.kind == ReplicateKind::CaughtUp {
            break;
        }
    }
    out
}

/// A batch's tables to register, row tables and rows, in order: one request's header fields and payload.
pub(crate) fn joined(batch: &[(u64, Arc<Msg>)]) -> (Vec<TableConfig>, Vec<RowsTable>, Vec<u8>) {
    let new_tables = batch
        .iter()
        .flat_map(|(_, m)| m.new_tables.iter().cloned())
        .collect();
    let tables = batch
        .iter()
        .flat_map(|(_, m)| m.tables.iter().copied())
        .collect();
    let mut payload = Vec::with_capacity(batch.iter().map(|(_, m)| m.payload.len()).sum());
    for (_, m) in batch {
        payload.extend_from_slice(&m.payload);
    }
    (new_tables, tables, payload)
}

fn links_drop(rep: &Replica, link: &Arc<Link>, why: &'static str) {
    let was_in_sync = link.in_sync.load(Ordering::Acquire);
    rep.links.remove(link);
    metrics::counter!(m::REPLICATION_DROPPED_TOTAL, "why" => why).increment(1);
    if was_in_sync {
        tracing::warn!(replica = link.replica, why, "in-sync backup dropped");
    }
}
