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

use std::collections::{BTreeMap, HashMap};

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
}

#[derive(Debug, Clone)]
enum Entry {
    /// The first copy is being applied.
    Running,
    /// Its answer.
    Done(Response),
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

    /// Admits push `id`: apply it (its entry now says so), answer it from the window, or refuse it (a copy
    /// still being applied: transient; a copy the window moved past: not applied again). A push without id
    /// is always applied.
    pub fn admit(&self, id: PushId) -> Result<Admission, Refusal> {
        if !id.is_some() {
            return Ok(Admission::Apply);
        }
        let mut inner = self.inner.lock();
        let client = inner.client(id.client, self.limits.clients);
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
        match client.entries.get(&id.seq) {
            Some(Entry::Running) => {
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
            Some(Entry::Done(answer)) => {
                metrics::counter!(m::PUSH_RETRIES_ANSWERED_TOTAL).increment(1);
                Ok(Admission::Answer(answer.clone()))
            }
            None => {
                client.entries.insert(id.seq, Entry::Running);
                client.trim(self.limits.per_client);
                Ok(Admission::Apply)
            }
        }
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
                    *e = Entry::Done(a.clone());
                }
            }
            None => {
                if matches!(client.entries.get(&id.seq), Some(Entry::Running)) {
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
            let client = inner.client(a.id.client, self.limits.clients);
            if a.id.seq < client.floor {
                continue;
            }
            let answer = Response::Pushed {
                rows: a.rows,
                rejected_nonfinite: a.rejected_nonfinite,
            };
            client.entries.insert(a.id.seq, Entry::Done(answer));
            client.trim(self.limits.per_client);
        }
    }

    /// Clients remembered.
    pub fn clients(&self) -> usize {
        self.inner.lock().clients.len()
    }
}

impl Inner {
    /// Client `id`'s window, made (forgetting the client idle longest when `max` are held) if new.
    fn client(&mut self, id: u64, max: usize) -> &mut Client {
        self.tick += 1;
        if !self.clients.contains_key(&id) {
            if self.clients.len() >= max {
                let idle = self
                    .clients
                    .iter()
                    .min_by_key(|(_, c)| c.last_use)
                    .map(|(&k, _)| k);
                if let Some(k) = idle {
                    self.clients.remove(&k);
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
    /// numbered below a forgotten answer and not held are then refused.
    fn trim(&mut self, max: usize) {
        while self.entries.len() > max {
            let oldest_done = self
                .entries
                .iter()
                .find(|(_, e)| matches!(e, Entry::Done(_)))
                .map(|(&s, _)| s);
            let Some(seq) = oldest_done else { return };
            self.entries.remove(&seq);
            self.floor = self.floor.max(seq + 1);
        }
    }
}

#[cfg(test)]
mod tests;
