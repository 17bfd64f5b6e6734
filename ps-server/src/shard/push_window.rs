//! Pushes applied exactly once: the window of push answers a server remembers per client
//! ([`protocol::wire::message::push`], "Exactly once").
//!
//! A push carrying a [`PushId`] is admitted once: the first copy is applied and its answer remembered; a copy
//! arriving while the first is still being applied (or waiting for its backups) is refused with the
//! transient `InProgress`; a later copy gets the remembered answer and changes nothing. A push refused before
//! it changed anything (wrong epoch, not the primary, bad request) is forgotten, so its retry is applied. A
//! backup remembers the answers its primary streams with the rows ([`PushWindow::remember`]), so a retry
//! reaching it after a promotion is answered too; and a server that lost the rows of a push to a reshard
//! still answers its retry from the window (the window is asked before the epoch).
//!
//! Bounded: `push-window-per-client` answers per client (the oldest go first; a copy older than what a client
//! still has is refused with a message, never applied again) and `push-window-clients` clients (the one idle
//! longest goes first, counted in [`m::PUSH_WINDOW_CLIENTS_EVICTED_TOTAL`]: its later retries would be applied
//! again). A client retries for seconds (`retry_for`) with at most a few pushes in flight per server, so the
//! defaults keep every retry's answer with room to spare.
//!
//! Durable in `sync` durability ([`PushWindow::durable`]): each push's answer is stored in the same atomic
//! store write as its rows ([`PushWindow::durable_writes`]), under `push/<client>/<slot>` with slot = seq mod
//! `push-window-per-client`, so a server killed after that write and restarted answers the retry rather than
//! applying the push again; a push whose write did not happen is applied by its retry, as nothing of it
//! survived. A client forgotten to make room has its stored answers deleted with the next push's write. In
//! the other modes a restarted server lost the rows of unflushed pushes too, and the window starts empty.

use std::collections::{BTreeMap, HashMap};

use embedding::{MetaWrite, Store, StoreError};
use parking_lot::Mutex;
use protocol::wire::message::push::{PushAnswer, PushId};
use protocol::{ErrorCode, Response};

use crate::config::PushWindowLimits;
use crate::metrics as m;
use crate::reply::{refuse, Refusal};

/// What to do with a push.
#[derive(Debug)]
pub enum Admission {
    /// Apply it, then [`PushWindow::finish`] it.
    Apply,
    /// A copy already applied: answer this, change nothing.
    Answer(Response),
    /// A copy already applied whose synced write failed: write its rows now (with its answer), then
    /// [`PushWindow::finish`] it with the answer, or give it back with [`PushWindow::keep_unwritten`].
    Write(Box<Unwritten>),
}

/// A push applied in memory whose synced write failed (`sync` durability): what its retry writes.
#[derive(Debug, Clone)]
pub struct Unwritten {
    /// The answer it gets once written.
    pub answer: Response,
    /// Its tables, in push order.
    pub tables: Vec<protocol::TableCount>,
    /// Its ids, the tables' one after another.
    pub ids: Vec<u64>,
    /// Its rows, held from reads until written ([`crate::shard::unsynced`]); released when this is dropped
    /// (written, or forgotten by the window).
    pub held: Option<std::sync::Arc<crate::shard::unsynced::Held>>,
}

/// Ids of unwritten pushes a window holds at most (32 MiB); a push past it keeps its storage error as its
/// answer.
pub const MAX_UNWRITTEN_IDS: usize = 1 << 22;

#[derive(Debug, Clone)]
enum Entry {
    /// The first copy is being applied; its shape ([`push_shape`]).
    Running(u64),
    /// Its answer and shape.
    Done(Response, u64),
    /// Applied, its synced write failed: a retry writes it; and its shape.
    Unwritten(Box<Unwritten>, u64),
}

impl Entry {
    fn shape(&self) -> u64 {
        match *self {
            Entry::Running(s) | Entry::Done(_, s) | Entry::Unwritten(_, s) => s,
        }
    }

    /// Ids held for a retry's write.
    fn unwritten_ids(&self) -> usize {
        match self {
            Entry::Unwritten(u, _) => u.ids.len(),
            _ => 0,
        }
    }
}

/// The shape of a push, compared between copies of one id: its encoding, tables (id, row count, dim) and
/// payload length, mixed into a nonzero number (0 stands for unknown: answers a backup learnt from its
/// primary's stream carry none). A copy whose shape differs is not a retry of the same push.
pub fn push_shape(
    encoding: protocol::Encoding,
    tables: &[protocol::TableCount],
    payload: usize,
) -> u64 {
    let mut h = protocol::routing::mix64(encoding as u64 ^ ((payload as u64) << 8));
    for t in tables {
        h = protocol::routing::mix64(
            h ^ u64::from(t.table) ^ (u64::from(t.count) << 32) ^ (u64::from(t.dim) << 20),
        );
    }
    h | 1
}

#[derive(Debug, Default)]
struct Client {
    entries: BTreeMap<u64, Entry>,
    /// Pushes numbered below this were forgotten (the window moved past them).
    floor: u64,
    /// When the client was last heard of (the window's own count of admissions).
    last_use: u64,
}

#[derive(Debug, Default)]
struct Inner {
    clients: HashMap<u64, Client>,
    tick: u64,
    /// Answers are stored with their pushes' rows ([`PushWindow::durable`]).
    durable: bool,
    /// Ids held by [`Entry::Unwritten`] entries, at most [`MAX_UNWRITTEN_IDS`].
    unwritten_ids: usize,
    /// Stored answers to delete with the next push's write (clients forgotten, stale keys).
    deletes: Vec<String>,
}

/// Where the stored answers live in the store's metadata.
pub const DURABLE_PREFIX: &str = "push/";

/// The metadata key of the stored answer of push `seq` of `client`.
fn durable_key(client: u64, seq: u64, per_client: usize) -> String {
    format!(
        "{DURABLE_PREFIX}{client:016x}/{:08x}",
        seq % per_client as u64
    )
}

/// A stored answer: its client and (seq, rows, rejected_nonfinite, shape), from a key and value as
/// [`PushWindow::durable_writes`] writes them.
fn parse_durable(key: &str, value: &[u8]) -> Option<(u64, [u64; 4])> {
    let rest = key.strip_prefix(DURABLE_PREFIX)?;
    let (client, slot) = rest.split_once('/')?;
    let client = u64::from_str_radix(client, 16).ok()?;
    u64::from_str_radix(slot, 16).ok()?;
    if value.len() != 32 {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(value[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    Some((client, [word(0), word(1), word(2), word(3)]))
}

/// The answers of recent pushes, per client.
#[derive(Debug, Default)]
pub struct PushWindow {
    inner: Mutex<Inner>,
    limits: PushWindowLimits,
}

impl PushWindow {
    /// An empty window within `limits` (each at least 1).
    pub fn new(limits: PushWindowLimits) -> PushWindow {
        PushWindow {
            inner: Mutex::default(),
            limits: PushWindowLimits {
                clients: limits.clients.max(1),
                per_client: limits.per_client.max(1),
            },
        }
    }

    /// The window of a server in `sync` durability: the answers `store` holds (written with their pushes'
    /// rows by an earlier run) are read back, within `limits`; unreadable entries are deleted with the next
    /// write, with a warning.
    pub fn durable(limits: PushWindowLimits, store: &dyn Store) -> Result<PushWindow, StoreError> {
        let w = PushWindow::new(limits);
        let stored = store.list_meta(DURABLE_PREFIX)?;
        let mut inner = w.inner.lock();
        inner.durable = true;
        let mut restored = 0u64;
        for (key, value) in stored {
            let Some((client_id, [seq, rows, rejected_nonfinite, shape])) =
                parse_durable(&key, &value)
            else {
                tracing::warn!(
                    key,
                    bytes = value.len(),
                    "unreadable stored push answer deleted"
                );
                inner.deletes.push(key);
                continue;
            };
            if key != durable_key(client_id, seq, w.limits.per_client) {
                // Written under another push-window-per-client: kept in memory, its old key deleted.
                inner.deletes.push(key);
            }
            let answer = Response::Pushed {
                rows,
                rejected_nonfinite,
            };
            let limits = w.limits;
            let client = inner.client(client_id, limits);
            client.entries.insert(seq, Entry::Done(answer, shape));
            client.trim(limits.per_client);
            restored += 1;
        }
        drop(inner);
        metrics::counter!(m::PUSH_WINDOW_RESTORED_TOTAL).increment(restored);
        if restored > 0 {
            tracing::info!(
                answers = restored,
                clients = w.clients(),
                "push answers restored from the store"
            );
        }
        Ok(w)
    }

    /// The metadata writes that store push `id`'s answer with its rows in one atomic write (a durable window
    /// only; nothing otherwise, nor for a push without id), with the deletions the window owes the store.
    pub fn durable_writes(
        &self,
        id: PushId,
        shape: u64,
        rows: u64,
        rejected_nonfinite: u64,
    ) -> Vec<MetaWrite> {
        let mut inner = self.inner.lock();
        if !inner.durable {
            return Vec::new();
        }
        let mut out: Vec<MetaWrite> = inner
            .deletes
            .drain(..)
            .map(|key| MetaWrite { key, value: None })
            .collect();
        if id.is_some() {
            let mut value = Vec::with_capacity(32);
            for w in [id.seq, rows, rejected_nonfinite, shape] {
                value.extend_from_slice(&w.to_le_bytes());
            }
            out.push(MetaWrite {
                key: durable_key(id.client, id.seq, self.limits.per_client),
                value: Some(value),
            });
        }
        out
    }

    /// Admits push `id` of `shape` ([`push_shape`]): apply it (its entry now says so), answer it from the
    /// window, or refuse it (a copy still being applied: transient; a copy the window moved past, or one
    /// whose shape differs from the first copy's: not applied). A push without id is always applied.
    pub fn admit(&self, id: PushId, shape: u64) -> Result<Admission, Refusal> {
        if !id.is_some() {
            return Ok(Admission::Apply);
        }
        let mut inner = self.inner.lock();
        let client = inner.client(id.client, self.limits);
        if id.seq < client.floor && !client.entries.contains_key(&id.seq) {
            metrics::counter!(m::PUSH_WINDOW_REFUSED_TOTAL, "reason" => "too_old").increment(1);
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "push {} of client {:#x} is older than this server remembers (its oldest: {}): it may \
                     have been applied, so it is not applied again",
                    id.seq, id.client, client.floor
                ),
            ));
        }
        if let Some(e) = client.entries.get(&id.seq) {
            if e.shape() != 0 && e.shape() != shape {
                metrics::counter!(m::PUSH_WINDOW_REFUSED_TOTAL, "reason" => "mismatch")
                    .increment(1);
                return Err(refuse(
                    ErrorCode::BadRequest,
                    format!(
                        "push {} of client {:#x} reuses the id of an earlier push with other tables, encoding \
                         or length: not applied (a retry must resend the same push)",
                        id.seq, id.client
                    ),
                ));
            }
        }
        match client.entries.get(&id.seq) {
            Some(Entry::Running(_)) => {
                metrics::counter!(m::PUSH_WINDOW_REFUSED_TOTAL, "reason" => "in_progress")
                    .increment(1);
                Err(refuse(
                    ErrorCode::InProgress,
                    format!(
                        "push {} of client {:#x} is still being applied (a retry overtook it)",
                        id.seq, id.client
                    ),
                ))
            }
            Some(Entry::Done(answer, _)) => {
                metrics::counter!(m::PUSH_RETRIES_ANSWERED_TOTAL).increment(1);
                Ok(Admission::Answer(answer.clone()))
            }
            Some(Entry::Unwritten(..)) => {
                let Some(Entry::Unwritten(u, _)) =
                    client.entries.insert(id.seq, Entry::Running(shape))
                else {
                    unreachable!("matched above")
                };
                inner.unwritten_ids -= u.ids.len();
                metrics::gauge!(m::PUSH_WINDOW_UNWRITTEN_IDS).set(inner.unwritten_ids as f64);
                Ok(Admission::Write(u))
            }
            None => {
                client.entries.insert(id.seq, Entry::Running(shape));
                let dropped = client.trim(self.limits.per_client);
                inner.unwritten_ids -= dropped;
                Ok(Admission::Apply)
            }
        }
    }

    /// Ends push `id` (admitted with [`Admission::Apply`] or [`Admission::Write`]) whose synced write failed
    /// after it was applied: its retry writes `unwritten` and then gets its answer. Past
    /// [`MAX_UNWRITTEN_IDS`], `otherwise` (the storage refusal) is kept as its answer instead.
    pub fn keep_unwritten(&self, id: PushId, unwritten: Box<Unwritten>, otherwise: &Response) {
        if !id.is_some() {
            return;
        }
        let mut inner = self.inner.lock();
        let fits = inner.unwritten_ids + unwritten.ids.len() <= MAX_UNWRITTEN_IDS;
        let Some(client) = inner.clients.get_mut(&id.client) else {
            return;
        };
        let Some(e) = client.entries.get_mut(&id.seq) else {
            return;
        };
        let shape = e.shape();
        let n = unwritten.ids.len();
        *e = if fits {
            Entry::Unwritten(unwritten, shape)
        } else {
            Entry::Done(otherwise.clone(), shape)
        };
        if fits {
            inner.unwritten_ids += n;
            metrics::gauge!(m::PUSH_WINDOW_UNWRITTEN_IDS).set(inner.unwritten_ids as f64);
        }
    }

    /// Every unwritten push, each admitted again as if retried ([`Admission::Write`]): the caller writes it and
    /// ends it with [`PushWindow::finish`] or [`PushWindow::keep_unwritten`]. Its shape comes with it.
    pub fn take_unwritten(&self) -> Vec<(PushId, u64, Box<Unwritten>)> {
        let mut inner = self.inner.lock();
        if inner.unwritten_ids == 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (&client, c) in inner.clients.iter_mut() {
            for (&seq, e) in c.entries.iter_mut() {
                if let Entry::Unwritten(..) = e {
                    let shape = e.shape();
                    let Entry::Unwritten(u, _) = std::mem::replace(e, Entry::Running(shape)) else {
                        unreachable!("matched above")
                    };
                    out.push((PushId { client, seq }, shape, u));
                }
            }
        }
        inner.unwritten_ids = 0;
        metrics::gauge!(m::PUSH_WINDOW_UNWRITTEN_IDS).set(0.0);
        out
    }

    /// Ends push `id` admitted with [`Admission::Apply`]: `Some(answer)` once it changed rows (a retry gets
    /// this answer), `None` when it was refused before changing anything (a retry is applied).
    pub fn finish(&self, id: PushId, answer: Option<&Response>) {
        if !id.is_some() {
            return;
        }
        let mut inner = self.inner.lock();
        let Some(client) = inner.clients.get_mut(&id.client) else {
            return;
        };
        match answer {
            Some(a) => {
                if let Some(e) = client.entries.get_mut(&id.seq) {
                    *e = Entry::Done(a.clone(), e.shape());
                }
            }
            None => {
                if matches!(client.entries.get(&id.seq), Some(Entry::Running(_))) {
                    client.entries.remove(&id.seq);
                }
            }
        }
    }

    /// Remembers answers a primary gave (a backup, from its stream).
    pub fn remember(&self, answers: &[PushAnswer]) {
        if answers.is_empty() {
            return;
        }
        let mut inner = self.inner.lock();
        for a in answers.iter().filter(|a| a.id.is_some()) {
            let client = inner.client(a.id.client, self.limits);
            if a.id.seq < client.floor {
                continue;
            }
            let answer = Response::Pushed {
                rows: a.rows,
                rejected_nonfinite: a.rejected_nonfinite,
            };
            if let Some(old) = client.entries.insert(a.id.seq, Entry::Done(answer, 0)) {
                inner.unwritten_ids -= old.unwritten_ids();
            }
            let client = inner.clients.get_mut(&a.id.client).expect("made above");
            let dropped = client.trim(self.limits.per_client);
            inner.unwritten_ids -= dropped;
        }
    }

    /// Clients remembered.
    pub fn clients(&self) -> usize {
        self.inner.lock().clients.len()
    }
}

impl Inner {
    /// Client `id`'s window, made (forgetting the client idle longest when `limits.clients` are held) if
    /// new. A durable window deletes every stored answer of a forgotten client.
    fn client(&mut self, id: u64, limits: PushWindowLimits) -> &mut Client {
        self.tick += 1;
        if !self.clients.contains_key(&id) {
            if self.clients.len() >= limits.clients {
                let idle = self
                    .clients
                    .iter()
                    .min_by_key(|(_, c)| c.last_use)
                    .map(|(&k, _)| k);
                if let Some(k) = idle {
                    if let Some(gone) = self.clients.remove(&k) {
                        self.unwritten_ids -= gone
                            .entries
                            .values()
                            .map(Entry::unwritten_ids)
                            .sum::<usize>();
                    }
                    if self.durable {
                        self.deletes.extend(
                            (0..limits.per_client as u64)
                                .map(|slot| durable_key(k, slot, limits.per_client)),
                        );
                    }
                    metrics::counter!(m::PUSH_WINDOW_CLIENTS_EVICTED_TOTAL).increment(1);
                }
            }
            self.clients.insert(id, Client::default());
            metrics::gauge!(m::PUSH_WINDOW_CLIENTS).set(self.clients.len() as f64);
        }
        let tick = self.tick;
        let client = self.clients.get_mut(&id).expect("inserted above");
        client.last_use = tick;
        client
    }
}

impl Client {
    /// Forgets the oldest answers past `max` (entries still running stay: their pushes are under way); copies
    /// numbered below a forgotten answer and not held are then refused. Returns the unwritten ids dropped.
    fn trim(&mut self, max: usize) -> usize {
        let mut dropped = 0;
        while self.entries.len() > max {
            let oldest_done = self
                .entries
                .iter()
                .find(|(_, e)| !matches!(e, Entry::Running(_)))
                .map(|(&s, _)| s);
            let Some(seq) = oldest_done else { break };
            if let Some(e) = self.entries.remove(&seq) {
                dropped += e.unwritten_ids();
            }
            self.floor = self.floor.max(seq + 1);
        }
        dropped
    }
}

#[cfg(test)]
mod tests;
