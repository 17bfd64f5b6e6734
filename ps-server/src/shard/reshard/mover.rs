//! A source's side of a reshard: copying the rows of the virtual shards it loses to their new servers.
//!
//! One [`MoveLink`] per destination carries an ordered stream of messages ([`Msg`], as replication's):
//! first the tables to register, then the scan of every row of the moving virtual shards (memory one stripe
//! at a time, plus the store for tables that evicted rows), interleaved with the rows each push changes in
//! them (forwarding). Every message is gathered (the rows' current values read) and queued under one lock
//! ([`Mover::order`]), so a later message always holds a value at least as new, and a destination storing
//! them in order ends with the source's values. A sender task per link batches the queue into `MoveRows`
//! requests and retries a failed one (with the same first message) until it is stored.
//!
//! The commit ([`commit`]) switches the map under the routing write lock (every push before it was
//! forwarded, every push after it is refused with `WrongEpoch`), waits until every destination stored its
//! whole stream, and answers; the moved rows are deleted here afterwards, before the next prepare.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use embedding::Engine;
use parking_lot::Mutex;
use protocol::wire::message::replicate::ReplicateKind;
use protocol::wire::message::reshard::MoveHeader;
use protocol::{Request, Response, ShardMap, TableConfig};
use tokio::sync::{watch, Notify};

use crate::metrics as m;
use crate::reply::{refuse, Refusal};
use crate::shard::replica::peer::Peers;
use crate::shard::replica::primary::{joined, take_batch, Msg};
use crate::shard::Shard;

/// Rows per scan message.
const SCAN_ROWS: usize = 4096;
/// The scan waits while this many messages are queued for a destination.
const SCAN_QUEUE: usize = 16;
/// Time allowed for one `MoveRows` request.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a commit waits for the streams to drain before answering (the coordinator commits again).
pub const COMMIT_DRAIN: Duration = Duration::from_secs(60);
/// Not a destination.
const STAYS: u32 = u32::MAX;

/// The stream to one destination.
pub struct MoveLink {
    dest: u32,
    queue: Mutex<LinkQueue>,
    wake: Notify,
    /// Highest sequence number the destination stored.
    acked: watch::Sender<u64>,
}

struct LinkQueue {
    msgs: VecDeque<(u64, Arc<Msg>)>,
    next_seq: u64,
}

impl MoveLink {
    fn push(&self, msg: Msg) {
        let mut q = self.queue.lock();
        let seq = q.next_seq;
        q.next_seq += 1;
        q.msgs.push_back((seq, Arc::new(msg)));
        drop(q);
        self.wake.notify_one();
    }

    fn queued(&self) -> usize {
        self.queue.lock().msgs.len()
    }

    fn last_queued(&self) -> u64 {
        self.queue.lock().next_seq - 1
    }
}

/// A source's move: the target map, which virtual shards leave for which server, the streams.
pub struct Mover {
    /// The map after the reshard.
    pub target: ShardMap,
    /// Its servers' addresses.
    pub servers: Vec<String>,
    own: u32,
    /// Destination server of each virtual shard leaving this server ([`STAYS`] for the others).
    dest_of: Vec<u32>,
    vshards_out: u32,
    /// One per destination.
    links: Vec<Arc<MoveLink>>,
    /// Held while a message is gathered and queued.
    order: Mutex<()>,
    peers: Peers,
    scan_done: AtomicBool,
    stopped: AtomicBool,
    rows_sent: AtomicU64,
    rows_acked: AtomicU64,
    /// The last send failure, for the status.
    pub last_error: Mutex<Option<String>>,
}

impl Mover {
    /// The move of server `own` from `current` to `target`; `None` when it loses no virtual shard. Each
    /// stream starts with the tables `tables` (the destination registers them before any row arrives).
    pub fn new(
        current: &ShardMap,
        own: u32,
        (target, servers): (ShardMap, Vec<String>),
        tables: Vec<TableConfig>,
        peers: Peers,
    ) -> Option<Mover> {
        let mut dest_of = vec![STAYS; current.num_virtual as usize];
        let mut dests = Vec::new();
        let mut out = 0;
        for (v, from, to) in current.moves_to(&target) {
            if from == own {
                dest_of[v as usize] = to;
                out += 1;
                if !dests.contains(&to) {
                    dests.push(to);
                }
            }
        }
        if out == 0 {
            return None;
        }
        dests.sort_unstable();
        let links = dests
            .into_iter()
            .map(|dest| {
                let link = MoveLink {
                    dest,
                    queue: Mutex::new(LinkQueue {
                        msgs: VecDeque::new(),
                        next_seq: 1,
                    }),
                    wake: Notify::new(),
                    acked: watch::Sender::new(0),
                };
                link.push(tables_msg(tables.clone()));
                Arc::new(link)
            })
            .collect();
        Some(Mover {
            target,
            servers,
            own,
            dest_of,
            vshards_out: out,
            links,
            order: Mutex::new(()),
            peers,
            scan_done: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            rows_sent: AtomicU64::new(0),
            rows_acked: AtomicU64::new(0),
            last_error: Mutex::new(None),
        })
    }

    /// Virtual shards leaving this server.
    pub fn vshards_out(&self) -> u32 {
        self.vshards_out
    }

    /// (rows queued, rows stored by destinations, scan through).
    pub fn progress(&self) -> (u64, u64, bool) {
        (
            self.rows_sent.load(Ordering::Relaxed),
            self.rows_acked.load(Ordering::Relaxed),
            self.scan_done.load(Ordering::Acquire),
        )
    }

    /// Whether the scan is through and every stream has at most a few messages queued.
    pub fn ready(&self) -> bool {
        self.scan_done.load(Ordering::Acquire) && self.links.iter().all(|l| l.queued() <= 2)
    }

    /// Stops the scan and the senders.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        for l in &self.links {
            l.wake.notify_one();
            l.acked.send_modify(|_| {});
        }
        self.peers.close();
    }

    /// Splits `ids` of `table` by destination: `out[k]` gets the moving ids of link `k`.
    fn by_link(&self, ids: &[u64], out: &mut [Vec<u64>]) {
        for v in out.iter_mut() {
            v.clear();
        }
        for &id in ids {
            let d = self.dest_of[self.target.vshard_of(id) as usize];
            if d != STAYS {
                let k = self.links.iter().position(|l| l.dest == d).expect("link");
                out[k].push(id);
            }
        }
    }

    /// Queues tables registered here during the move to every destination (before any of their rows).
    pub fn tables_registered(&self, tables: Vec<TableConfig>) {
        if tables.is_empty() {
            return;
        }
        let _order = self.order.lock();
        for l in &self.links {
            l.push(tables_msg(tables.clone()));
        }
    }

    /// Queues the rows a push just changed in moving virtual shards to their destinations. Called under the
    /// routing read lock, after the push applied.
    pub fn forward(&self, engine: &Engine, parts: &[(u32, &[u64])]) {
        let mut per_link: Vec<Vec<(u32, Vec<u64>)>> = vec![Vec::new(); self.links.len()];
        let mut split = vec![Vec::new(); self.links.len()];
        for &(table, ids) in parts {
            self.by_link(ids, &mut split);
            for (k, moving) in split.iter_mut().enumerate() {
                if !moving.is_empty() {
                    per_link[k].push((table, std::mem::take(moving)));
                }
            }
        }
        if per_link.iter().all(Vec::is_empty) {
            return;
        }
        let _order = self.order.lock();
        for (k, tables) in per_link.iter().enumerate() {
            if tables.is_empty() {
                continue;
            }
            let parts: Vec<(u32, &[u64])> = tables.iter().map(|(t, ids)| (*t, &ids[..])).collect();
            let msg = Msg::gather(engine, ReplicateKind::Stream, &parts);
            let rows = msg.rows();
            self.rows_sent.fetch_add(rows, Ordering::Relaxed);
            metrics::counter!(m::RESHARD_ROWS_SENT_TOTAL, "phase" => "forward").increment(rows);
            self.links[k].push(msg);
        }
    }
}

/// A message registering `tables` on the destination.
fn tables_msg(tables: Vec<TableConfig>) -> Msg {
    Msg {
        pushes: Vec::new(),
        kind: ReplicateKind::Stream,
        new_tables: tables,
        tables: Vec::new(),
        payload: Vec::new(),
        queued: std::time::Instant::now(),
    }
}

/// Starts `mover` on `shard`: the scan and one sender per destination, as tasks.
pub fn start(shard: &Arc<Shard>, mover: Arc<Mover>) {
    let tasks = &shard.routing.tasks;
    for link in &mover.links {
        let (m, l) = (mover.clone(), link.clone());
        tasks.spawn(async move { sender(&m, &l).await });
    }
    let (s, m) = (shard.clone(), mover);
    tasks.spawn(async move { scan(&s, &m).await });
}

/// The scan: the tables, then every row of the moving virtual shards, in messages of [`SCAN_ROWS`].
async fn scan(shard: &Arc<Shard>, mover: &Arc<Mover>) {
    let engine = &shard.engine;
    let began = Instant::now();
    let mut ids = Vec::new();
    let mut split = vec![Vec::new(); mover.links.len()];
    let mut rows = 0u64;
    for cfg in engine.tables() {
        let Ok(t) = engine.table(cfg.id) else {
            continue;
        };
        for stripe in 0..t.stripe_count() {
            t.stripe_ids(stripe, &mut ids);
            mover.by_link(&ids, &mut split);
            if !send_pages(shard, mover, cfg.id, &mut split, &mut rows).await {
                return;
            }
        }
        if t.spilled() {
            let mut after = None;
            loop {
                ids.clear();
                if let Err(e) = engine.store().scan_ids(cfg.id, after, SCAN_ROWS, &mut ids) {
                    tracing::error!(table = cfg.id, error = %e, "reshard scan of the store failed");
                    *mover.last_error.lock() = Some(format!("scan of table {}: {e}", cfg.id));
                    return;
                }
                let Some(&last) = ids.last() else { break };
                after = Some(last);
                mover.by_link(&ids, &mut split);
                if !send_pages(shard, mover, cfg.id, &mut split, &mut rows).await {
                    return;
                }
            }
        }
    }
    mover.scan_done.store(true, Ordering::Release);
    tracing::info!(
        rows,
        vshards = mover.vshards_out,
        secs = began.elapsed().as_secs_f64(),
        "reshard scan queued"
    );
}

/// Queues `split[k]` (ids of `table` for link `k`, drained) in pages, waiting while a link's queue is
/// long; false once the move stopped.
async fn send_pages(
    shard: &Arc<Shard>,
    mover: &Mover,
    table: u32,
    split: &mut [Vec<u64>],
    rows: &mut u64,
) -> bool {
    for (k, ids) in split.iter_mut().enumerate() {
        let link = &mover.links[k];
        for page in ids.chunks(SCAN_ROWS) {
            while link.queued() >= SCAN_QUEUE {
                if mover.stopped.load(Ordering::Acquire) {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if mover.stopped.load(Ordering::Acquire) {
                return false;
            }
            let _order = mover.order.lock();
            let msg = Msg::gather(&shard.engine, ReplicateKind::CatchUp, &[(table, page)]);
            *rows += msg.rows();
            mover.rows_sent.fetch_add(msg.rows(), Ordering::Relaxed);
            metrics::counter!(m::RESHARD_ROWS_SENT_TOTAL, "phase" => "scan").increment(msg.rows());
            link.push(msg);
        }
        ids.clear();
    }
    true
}

/// Sends `link`'s queue to its destination, batched, until the move stops; a failed request is sent again
/// (with backoff) from the same first message.
async fn sender(mover: &Mover, link: &MoveLink) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if mover.stopped.load(Ordering::Acquire) {
            return;
        }
        let batch = take_batch(&link.queue.lock().msgs);
        let Some(&(first, _)) = batch.first() else {
            let notified = link.wake.notified();
            if link.queued() == 0 {
                let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
            }
            continue;
        };
        let last = batch.last().map_or(first, |(s, _)| *s);
        let rows: u64 = batch.iter().map(|(_, m)| m.rows()).sum();
        let (new_tables, tables, payload) = joined(&batch);
        let header = MoveHeader {
            target_epoch: mover.target.epoch,
            source: mover.own,
            seq: first,
            messages: batch.len() as u32,
            new_tables,
            tables,
        };
        let answer = mover
            .peers
            .call(
                link.dest,
                &Request::MoveRows { header },
                Bytes::from(payload),
                SEND_TIMEOUT,
            )
            .await;
        match answer {
            Ok(Response::MovedRows { .. }) => {
                let mut q = link.queue.lock();
                while q.msgs.front().is_some_and(|(s, _)| *s <= last) {
                    q.msgs.pop_front();
                }
                drop(q);
                mover.rows_acked.fetch_add(rows, Ordering::Relaxed);
                link.acked.send_replace(last);
                backoff = Duration::from_millis(50);
            }
            other => {
                let why = match other {
                    Ok(resp) => format!("{resp:?}"),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(dest = link.dest, %why, "moving rows failed; retrying");
                *mover.last_error.lock() = Some(format!(
                    "server {} ({}): {why}",
                    link.dest,
                    mover.peers.name(link.dest)
                ));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// A source's commit of the target of epoch `epoch`: switches the map (pushes of the old epoch are refused
/// from then on), waits until every destination stored its stream (up to [`COMMIT_DRAIN`]; the coordinator
/// commits again after a timeout) and ends the move; the moved rows are deleted here in the background.
pub async fn commit(shard: &Arc<Shard>, mover: Arc<Mover>) -> Result<(), Refusal> {
    let began = Instant::now();
    let routing = &shard.routing;
    if routing.map().epoch != mover.target.epoch {
        if !mover.scan_done.load(Ordering::Acquire) {
            return Err(refuse(
                protocol::ErrorCode::Resharding,
                "commit before the scan is through: ask Status until ready",
            ));
        }
        routing
            .switch(&shard.engine, mover.target.clone(), mover.servers.clone())
            .map_err(|e| refuse(protocol::ErrorCode::Storage, e))?;
    }
    let drained = async {
        for link in &mover.links {
            let last = link.last_queued();
            let mut rx = link.acked.subscribe();
            let _ = rx
                .wait_for(|&a| a >= last || mover.stopped.load(Ordering::Acquire))
                .await;
        }
    };
    if tokio::time::timeout(COMMIT_DRAIN, drained).await.is_err() {
        let why = mover.last_error.lock().clone().unwrap_or_default();
        return Err(refuse(
            protocol::ErrorCode::Resharding,
            format!(
                "the map is switched but a destination has not stored every moved row after {} s ({why}): commit again",
                COMMIT_DRAIN.as_secs()
            ),
        ));
    }
    mover.stop();
    routing.set_mover(None);
    let secs = began.elapsed().as_secs_f64();
    metrics::histogram!(m::RESHARD_COMMIT_SECONDS).record(secs);
    let (sent, acked, _) = mover.progress();
    tracing::info!(
        epoch = mover.target.epoch,
        rows_sent = sent,
        rows_acked = acked,
        secs,
        "reshard committed: deleting the moved rows here"
    );
    // The moved rows are deleted after the answer (the destinations commit meanwhile); the next prepare
    // waits for it (`Routing::cleaned`), so a later move back cannot race with the deletion.
    routing.cleaning.send_replace(true);
    let (s, m) = (shard.clone(), mover);
    routing.tasks.spawn_blocking(move || {
        match delete_moved(&s, &m) {
            Ok(rows) => tracing::info!(rows, "rows moved away deleted"),
            Err(e) => {
                tracing::error!(error = %e, "deleting rows moved away failed; they stay (unowned)")
            }
        }
        s.routing.cleaning.send_replace(false);
    });
    Ok(())
}

/// Deletes this server's rows of the virtual shards it gave away (memory and store).
fn delete_moved(shard: &Shard, mover: &Mover) -> Result<u64, String> {
    let engine = &shard.engine;
    let mut deleted = 0u64;
    let mut ids = Vec::new();
    let mut gone = Vec::new();
    for cfg in engine.tables() {
        let Ok(t) = engine.table(cfg.id) else {
            continue;
        };
        gone.clear();
        for stripe in 0..t.stripe_count() {
            t.stripe_ids(stripe, &mut ids);
            gone.extend(
                ids.iter()
                    .filter(|&&id| mover.dest_of[mover.target.vshard_of(id) as usize] != STAYS),
            );
        }
        let mut after = None;
        loop {
            ids.clear();
            engine
                .store()
                .scan_ids(cfg.id, after, SCAN_ROWS, &mut ids)
                .map_err(|e| format!("scan table {} for moved rows: {e}", cfg.id))?;
            let Some(&last) = ids.last() else { break };
            after = Some(last);
            gone.extend(
                ids.iter()
                    .filter(|&&id| mover.dest_of[mover.target.vshard_of(id) as usize] != STAYS),
            );
        }
        gone.sort_unstable();
        gone.dedup();
        for chunk in gone.chunks(SCAN_ROWS) {
            engine
                .remove_rows(cfg.id, chunk)
                .map_err(|e| format!("delete moved rows of table {}: {e}", cfg.id))?;
        }
        deleted += gone.len() as u64;
    }
    metrics::counter!(m::RESHARD_ROWS_DELETED_TOTAL).increment(deleted);
    Ok(deleted)
}
