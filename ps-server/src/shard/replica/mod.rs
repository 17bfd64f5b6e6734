//! Replication of a shard across R servers: a primary that takes pushes and streams the resulting rows to its
//! backups, failover by promotion under a new shard epoch, fencing of a deposed primary (`docs/replication.md`).
//!
//! - [`Replica`] (here): this server's role, shard epoch and sync state, shared by requests and tasks;
//!   promotion, stepping down, and the answers to `Join` and `Promote`.
//! - [`primary`]: the stream to each backup (ordering, batching, catch-up scan, `replicated` acknowledgements).
//! - [`backup`]: storing the stream, and the follower task that keeps a backup joined.
//! - [`startup`]: the role a replica takes when it starts (join the primary, have an in-sync backup take over
//!   from this replica's previous life, or a cold start).
//! - [`peer`]: connections to the other replicas.

pub mod backup;
pub mod peer;
pub mod primary;
pub mod startup;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use embedding::Engine;
use parking_lot::Mutex;
use protocol::wire::message::replicate::{ReplicaInfo, Role};
use protocol::{ErrorCode, Response};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{Durability, ReplicatedWithoutBackup, ServerConfig};
use crate::metrics as m;
use crate::reply::{refuse, Refusal, Reply};
use crate::shard::Shard;

pub use primary::AckWait;

/// Metadata key of the persisted shard epoch.
const EPOCH_KEY: &str = "replica/epoch";
/// The most a peer's shard epoch may lead this replica's: epochs grow by one per promotion or cold start, so
/// a claim further ahead is not a replica that followed newer primaries but a broken or hostile peer (a join
/// or stream claiming it is refused, and the epoch space cannot be exhausted by one message).
pub const MAX_EPOCH_LEAD: u64 = 1 << 32;

/// Refuses a peer's shard epoch `claimed` that leads `held` by more than [`MAX_EPOCH_LEAD`]; `what` names the
/// request.
pub(crate) fn check_epoch_lead(what: &str, claimed: u64, held: u64) -> Result<(), Refusal> {
    if claimed > held && claimed - held > MAX_EPOCH_LEAD {
        return Err(refuse(
            ErrorCode::BadRequest,
            format!(
                "{what} claims shard epoch {claimed}, more than {MAX_EPOCH_LEAD} ahead of this replica's {held}: \
                 epochs grow by one per failover"
            ),
        ));
    }
    Ok(())
}

/// A backup refuses to be promoted while it heard from its primary this recently.
pub const PROMOTE_QUIET: Duration = Duration::from_millis(500);

/// This server's place among its shard's replicas.
pub struct Replica {
    /// This replica's index.
    pub index: u32,
    /// The other replicas.
    pub peers: peer::Peers,
    /// Whether pushes wait for the in-sync backups (`durability = "replicated"`).
    wait_for_backups: bool,
    /// With `wait_for_backups`, what a primary does while no backup is in sync.
    without_backup: ReplicatedWithoutBackup,
    role: AtomicU8,
    epoch: AtomicU64,
    /// The highest shard epoch any peer reported (census answers), for a cold start above all of them.
    heard_epoch: AtomicU64,
    /// A backup: it holds every row its primary acknowledged.
    pub(crate) in_sync: AtomicBool,
    /// Milliseconds since `born` when the primary was last heard from (a backup).
    last_heard_ms: AtomicU64,
    born: Instant,
    /// A primary's streams to its backups.
    pub links: primary::Links,
    /// A backup's current stream.
    pub(crate) stream: Mutex<backup::StreamState>,
    /// Wakes the follower task on role changes.
    pub(crate) changed: Notify,
    /// The stream tasks (catch-up scans, senders), waited for at shutdown ([`Replica::shut_down`]).
    pub(crate) tasks: tokio_util::task::TaskTracker,
}

fn role_code(role: Role) -> u8 {
    match role {
        Role::Primary => 0,
        Role::Backup => 1,
        Role::Starting => 2,
    }
}

impl Replica {
    /// The replica state of a server with `cfg`, its shard epoch read from `engine`'s store (the configured
    /// epoch when none was persisted). Without a replicas list, the primary of its shard; with one, starting.
    pub fn new(cfg: &ServerConfig, engine: &Engine) -> Replica {
        let persisted = engine
            .store()
            .get_meta(EPOCH_KEY)
            .ok()
            .flatten()
            .and_then(|v| v.try_into().ok().map(u64::from_le_bytes));
        let role = if cfg.replicas.is_empty() {
            Role::Primary
        } else {
            Role::Starting
        };
        let peers = peer::Peers::new(
            &cfg.replicas,
            cfg.replica_index,
            peer::PeerSettings {
                tls_dir: cfg.tls_dir.clone(),
                server_name: cfg.replica_server_name.clone(),
                max_frame: cfg.max_frame,
                role: protocol::Role::Peer,
            },
        );
        let wait = cfg.durability == Durability::Replicated;
        let mut r = Replica::build(
            cfg.replica_index,
            peers,
            wait,
            role,
            persisted.unwrap_or(1).max(1),
        );
        r.without_backup = cfg.replicated_without_backup;
        r.record_gauges();
        metrics::gauge!(m::REPLICATION_BACKUPS_CONFIGURED)
            .set(cfg.replicas.len().saturating_sub(1) as f64);
        r
    }

    /// A single replica at epoch 1 (tests).
    pub fn single() -> Replica {
        let peers = peer::Peers::new(&[], 0, Default::default());
        Replica::build(0, peers, false, Role::Primary, 1)
    }

    /// Replica `index` of a shard whose replicas are `peers` (several), starting at epoch 1: what
    /// [`Replica::new`] makes of a `--replicas` list, for in-memory clusters. `wait_for_backups`:
    /// `durability = "replicated"`.
    #[cfg(feature = "testing")]
    pub fn starting(index: u32, peers: peer::Peers, wait_for_backups: bool) -> Replica {
        assert!(peers.len() > 1, "a replicated shard has several replicas");
        Replica::build(index, peers, wait_for_backups, Role::Starting, 1)
    }

    fn build(
        index: u32,
        peers: peer::Peers,
        wait_for_backups: bool,
        role: Role,
        epoch: u64,
    ) -> Replica {
        Replica {
            index,
            peers,
            wait_for_backups,
            without_backup: ReplicatedWithoutBackup::Degrade,
            role: AtomicU8::new(role_code(role)),
            epoch: AtomicU64::new(epoch),
            heard_epoch: AtomicU64::new(0),
            in_sync: AtomicBool::new(role == Role::Primary),
            last_heard_ms: AtomicU64::new(0),
            born: Instant::now(),
            links: Default::default(),
            stream: Mutex::new(backup::StreamState::default()),
            changed: Notify::new(),
            tasks: Default::default(),
        }
    }

    /// Ends the streams to the backups and waits for their tasks (at shutdown, before the engine closes).
    pub async fn shut_down(&self) {
        self.stop_streams();
        self.tasks.wait().await;
    }

    /// Ends the streams to the backups and closes the connections to the peers at once, as a crash would
    /// (in-memory clusters: `crate::testing::Killer`).
    #[cfg(feature = "testing")]
    pub fn crash(&self) {
        self.stop_streams();
    }

    fn stop_streams(&self) {
        self.links.clear();
        self.peers.close();
        self.tasks.close();
    }

    /// Whether the shard has more than one replica.
    pub fn replicated(&self) -> bool {
        self.peers.len() > 1
    }

    /// The current role.
    pub fn role(&self) -> Role {
        match self.role.load(Ordering::Acquire) {
            0 => Role::Primary,
            1 => Role::Backup,
            _ => Role::Starting,
        }
    }

    fn set_role(&self, role: Role) {
        self.role.store(role_code(role), Ordering::Release);
        self.record_gauges();
        self.changed.notify_one();
    }

    /// The shard epoch held.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// What `Hello` says about this replica.
    pub fn info(&self) -> ReplicaInfo {
        let role = self.role();
        ReplicaInfo {
            replica_index: self.index,
            replicas: self.peers.len().max(1) as u32,
            role,
            shard_epoch: self.epoch(),
            in_sync: role == Role::Primary || self.in_sync.load(Ordering::Acquire),
            in_sync_backups: if role == Role::Primary {
                self.links.in_sync_bits()
            } else {
                0
            },
        }
    }

    /// Records that the primary was heard from now.
    pub(crate) fn heard(&self) {
        self.last_heard_ms.store(
            self.born.elapsed().as_millis() as u64 + 1,
            Ordering::Release,
        );
    }

    /// Whether the primary was heard from within `d`.
    pub(crate) fn heard_within(&self, d: Duration) -> bool {
        let last = self.last_heard_ms.load(Ordering::Acquire);
        last != 0 && self.born.elapsed().as_millis() as u64 + 1 - last < d.as_millis() as u64
    }

    pub(crate) fn set_out_of_sync(&self) {
        self.in_sync.store(false, Ordering::Release);
        metrics::gauge!(m::REPLICA_IN_SYNC).set(0.0);
    }

    /// Takes `epoch` (newer, from the primary) and persists it.
    pub(crate) fn adopt_epoch(&self, engine: &Engine, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
        persist_epoch(engine, epoch);
        metrics::gauge!(m::SHARD_EPOCH).set(epoch as f64);
    }

    /// Becomes a backup (a newer primary exists): ends the streams, forgets the join session, and takes
    /// `epoch` if given. The follower task joins the new primary.
    pub fn step_down(&self, epoch: Option<u64>) {
        if let Some(e) = epoch {
            self.epoch.fetch_max(e, Ordering::AcqRel);
        }
        self.links.clear();
        self.stream.lock().session = 0;
        self.set_out_of_sync();
        self.set_role(Role::Backup);
        tracing::warn!(epoch = self.epoch(), "stepped down to backup");
    }

    /// Records a shard epoch a peer reported.
    pub(crate) fn heard_of_epoch(&self, epoch: u64) {
        self.heard_epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    /// The epoch after every one this replica holds or heard of; refused at `u64::MAX` (never wraps).
    fn next_epoch(&self) -> Result<u64, Refusal> {
        let newest = self.epoch().max(self.heard_epoch.load(Ordering::Acquire));
        newest.checked_add(1).ok_or_else(|| {
            refuse(
                ErrorCode::BadRequest,
                format!("shard epoch {newest} cannot grow: refusing to wrap it"),
            )
        })
    }

    /// A cold start (a starting replica without a primary or an in-sync backup to follow): becomes the
    /// primary from its own disk at the epoch after every one it knows; returns it.
    pub(crate) fn cold_start(&self, engine: &Engine) -> Result<u64, Refusal> {
        let _one = self.stream.lock();
        if self.role() != Role::Starting {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("a cold start of a {} replica", self.role().name()),
            ));
        }
        let epoch = self.next_epoch()?;
        drop(_one);
        self.become_primary(engine, epoch);
        Ok(epoch)
    }

    /// Becomes the primary at `epoch` (persisted first, synced).
    pub(crate) fn become_primary(&self, engine: &Engine, epoch: u64) {
        persist_epoch(engine, epoch);
        self.epoch.store(epoch, Ordering::Release);
        self.stream.lock().session = 0;
        self.in_sync.store(true, Ordering::Release);
        self.set_role(Role::Primary);
        tracing::warn!(
            epoch,
            replica = self.index,
            "this replica is the shard's primary"
        );
    }

    fn record_gauges(&self) {
        let role = self.role();
        metrics::gauge!(m::REPLICA_PRIMARY).set(if role == Role::Primary { 1.0 } else { 0.0 });
        metrics::gauge!(m::REPLICA_IN_SYNC).set(
            if role == Role::Primary || self.in_sync.load(Ordering::Acquire) {
                1.0
            } else {
                0.0
            },
        );
        metrics::gauge!(m::SHARD_EPOCH).set(self.epoch() as f64);
    }

    /// Refuses a request only the primary takes.
    pub fn require_primary(&self, what: &str) -> Result<(), Refusal> {
        match self.role() {
            Role::Primary => Ok(()),
            role => Err(refuse(
                ErrorCode::NotPrimary,
                format!(
                    "{what} sent to a {} replica (replica {}, shard epoch {}): send it to the shard's primary",
                    role.name(),
                    self.index,
                    self.epoch()
                ),
            )),
        }
    }

    /// Refuses a read on a replica that does not hold every acknowledged row.
    pub fn require_readable(&self, what: &str) -> Result<(), Refusal> {
        match self.role() {
            Role::Backup if self.in_sync.load(Ordering::Acquire) => Ok(()),
            Role::Primary => Ok(()),
            _ => self.require_primary(what),
        }
    }

    /// Whether pushes wait for the in-sync backups.
    pub fn waits_for_backups(&self) -> bool {
        self.wait_for_backups
    }

    /// Whether this primary acknowledges pushes with no copy although its durability is `replicated`: no
    /// backup is in sync (or none is configured).
    pub fn durability_degraded(&self) -> bool {
        self.wait_for_backups && self.role() == Role::Primary && self.links.in_sync_bits() == 0
    }

    /// Refuses a push while [`Replica::durability_degraded`] under `replicated-without-backup = "refuse"`
    /// (`NoBackup`, transient), counted in [`m::PUSHES_REFUSED_NO_BACKUP_TOTAL`].
    pub fn require_backup_for_push(&self) -> Result<(), Refusal> {
        if self.without_backup == ReplicatedWithoutBackup::Refuse && self.durability_degraded() {
            metrics::counter!(m::PUSHES_REFUSED_NO_BACKUP_TOTAL).increment(1);
            return Err(refuse(
                ErrorCode::NoBackup,
                "durability replicated: no backup of this shard is in sync, and \
                 replicated-without-backup = \"refuse\": pushes are refused until one catches up",
            ));
        }
        Ok(())
    }

    /// Sets [`m::DURABILITY_DEGRADED`] (called with the lag gauges, every half second on a primary).
    pub fn record_durability(&self) {
        metrics::gauge!(m::DURABILITY_DEGRADED).set(if self.durability_degraded() {
            1.0
        } else {
            0.0
        });
    }
}

/// Writes `epoch` under [`EPOCH_KEY`] and flushes the store, so a restart knows it.
fn persist_epoch(engine: &Engine, epoch: u64) {
    let store = engine.store();
    if let Err(e) = store
        .put_meta(EPOCH_KEY, &epoch.to_le_bytes())
        .and_then(|()| store.flush())
    {
        tracing::error!(epoch, error = %e, "could not persist the shard epoch");
    }
}

impl Shard {
    /// Answers `Promote`: an in-sync backup that has not heard from its primary for [`PROMOTE_QUIET`]
    /// becomes the primary at epoch + 1 (a client or a peer finding the primary gone); a primary answers
    /// with its epoch. With `force` (an operator, the admin role: checked at dispatch), a replica still
    /// starting cold-starts as the primary ([`startup`]).
    pub fn promote(&self, client_epoch: u64, force: bool) -> Result<Reply, Refusal> {
        let rep = &self.replica;
        let reply = |epoch| Reply {
            header: Response::Promoted { shard_epoch: epoch },
            payload: Vec::new(),
        };
        if !rep.replicated() {
            return match rep.role() {
                Role::Primary => Ok(reply(rep.epoch())),
                _ => Err(refuse(
                    ErrorCode::BadRequest,
                    "this shard is not replicated",
                )),
            };
        }
        if force {
            return match rep.role() {
                Role::Primary => Ok(reply(rep.epoch())),
                Role::Starting => {
                    let epoch = rep.cold_start(&self.engine)?;
                    tracing::warn!(
                        epoch,
                        "an operator forced a cold start: this replica is the primary from its own disk"
                    );
                    metrics::counter!(m::FAILOVERS_TOTAL).increment(1);
                    Ok(reply(epoch))
                }
                Role::Backup => Err(refuse(
                    ErrorCode::BadRequest,
                    "a forced promotion is for a replica still starting; this one follows a primary",
                )),
            };
        }
        let _one = rep.stream.lock();
        match rep.role() {
            Role::Primary => return Ok(reply(rep.epoch())),
            Role::Starting => {
                return Err(refuse(
                    ErrorCode::NotInSync,
                    "this replica is still starting",
                ));
            }
            Role::Backup => {}
        }
        if !rep.in_sync.load(Ordering::Acquire) {
            return Err(refuse(
                ErrorCode::NotInSync,
                format!(
                    "replica {} is catching up with its primary: it cannot take over",
                    rep.index
                ),
            ));
        }
        if client_epoch > rep.epoch() {
            return Err(refuse(
                ErrorCode::NotInSync,
                format!(
                    "the client has seen shard epoch {client_epoch}, this backup holds {}: a newer primary exists",
                    rep.epoch()
                ),
            ));
        }
        if rep.heard_within(PROMOTE_QUIET) {
            return Err(refuse(
                ErrorCode::NotInSync,
                "this backup heard from its primary less than 0.5 s ago: retry the primary",
            ));
        }
        let epoch = rep.epoch().checked_add(1).ok_or_else(|| {
            refuse(
                ErrorCode::BadRequest,
                format!(
                    "shard epoch {} cannot grow: refusing to wrap it",
                    rep.epoch()
                ),
            )
        })?;
        drop(_one);
        rep.become_primary(&self.engine, epoch);
        metrics::counter!(m::FAILOVERS_TOTAL).increment(1);
        Ok(reply(epoch))
    }

    /// Answers `Join` (a primary): starts streaming to the backup; a primary holding an older epoch than the
    /// backup steps down instead ([`Shard::join_checked`]).
    pub fn join(
        self: &Arc<Self>,
        shard_epoch: u64,
        replica: u32,
        session: u64,
    ) -> Result<Reply, Refusal> {
        let reply = self.join_checked(shard_epoch, replica, session)?;
        primary::join(self, replica, session);
        Ok(reply)
    }

    /// The checks of a `Join` and the answer, without starting the stream: the whole request is checked
    /// (a replicated shard, another replica's index, a session) before a primary holding an older epoch
    /// than the backup steps down.
    pub fn join_checked(
        &self,
        shard_epoch: u64,
        replica: u32,
        session: u64,
    ) -> Result<Reply, Refusal> {
        let rep = &self.replica;
        // The request is checked whole before it may change anything (a primary stepping down).
        if !rep.replicated() {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("join from replica {replica}: this shard is not replicated"),
            ));
        }
        if replica == rep.index || replica as usize >= rep.peers.len() {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "join from replica {replica}: this shard has replicas 0..{} and this is replica {}",
                    rep.peers.len(),
                    rep.index
                ),
            ));
        }
        if session == 0 {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("join from replica {replica} under session 0: a session is non-zero"),
            ));
        }
        rep.require_primary("join")?;
        check_epoch_lead("a join", shard_epoch, rep.epoch())?;
        if shard_epoch > rep.epoch() {
            // A backup that followed a newer primary (this one was deposed while away): step down. Only
            // peers may send a join (the role check at dispatch).
            rep.step_down(Some(shard_epoch));
            return Err(refuse(
                ErrorCode::NotPrimary,
                format!("a backup holds shard epoch {shard_epoch}, newer than this primary's: stepped down"),
            ));
        }
        Ok(Reply {
            header: Response::Joined {
                shard_epoch: rep.epoch(),
            },
            payload: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests;
