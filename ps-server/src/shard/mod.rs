//! One server's shard: its storage engine, its place in the shard map and among its replicas, its durability
//! and whether storage writes work; the state every request and every timer shares.
//!
//! The fields are private. Each mechanism that acts on a shard is a child module owning its `impl Shard`:
//! [`storage`] (write-back, synced writes, checkpoints, eviction, the write probe), [`handler`] (requests),
//! [`replica`] (replication and failover) and [`reshard`] (live resharding). Everything else (the server's
//! timers and connection loop, the CLI, tests) builds a shard with [`Shard::open`] (or, in tests,
//! `Shard::builder`) and reads it through the accessors below. The answers the mechanisms build live in
//! [`crate::reply`], beneath them all.

use std::path::PathBuf;
use std::sync::Arc;

use embedding::Engine;

use crate::config::{Durability, RegistrationLimits, ServerConfig};
use crate::reduce::Reducer;
use crate::sync::SyncState;
use crate::write_health::WriteHealth;
use replica::Replica;
use reshard::Routing;

pub mod handler;
pub mod push_window;
pub mod replica;
pub mod reshard;
pub mod storage;
pub mod unsynced;

/// One server's shard: its storage engine and its place in the shard map.
pub struct Shard {
    /// The tables.
    engine: Engine,
    /// The cluster's shard map, which a live reshard changes ([`crate::shard::reshard`]).
    routing: Routing,
    /// This server's index in the map.
    shard_index: u32,
    /// When pushed rows reach the store; with [`Durability::Sync`], a push is persisted before its reply.
    durability: Durability,
    /// Whether storage writes work; while they fail, pushes are refused ([`crate::write_health`]).
    writes: WriteHealth,
    /// Seconds a prefetch's pins last at most ([`crate::config::TierConfig::pin_secs`]).
    pin_secs: u64,
    /// Sums of the trainers' reduce contributions (hybrid dense mode, [`crate::reduce`]).
    reducer: Reducer,
    /// Changed rows and published dense parameters for serving's delta sync ([`crate::sync`]).
    sync: SyncState,
    /// This server's place among its shard's replicas ([`crate::shard::replica`]).
    replica: Replica,
    /// Checkpoints are written under this directory only ([`crate::config::ServerConfig::checkpoint_root`]).
    checkpoint_root: PathBuf,
    /// The largest frame this server sends or takes ([`crate::config::ServerConfig::max_frame`]): a delta-sync
    /// answer fits it.
    max_frame: u64,
    /// Bounds on the tables trainers register ([`Shard::register_as`]).
    registration: RegistrationLimits,
    /// The answers of recent pushes, so that each is applied once ([`push_window`]).
    pushes: Arc<push_window::PushWindow>,
    /// With [`Durability::Sync`], rows applied and not yet durable, which reads wait for ([`unsynced`]).
    unsynced: Option<Arc<unsynced::Unsynced>>,
}

impl Shard {
    /// The shard a server runs: `engine` recovered from its store, the rest from `cfg` (its replica place, its
    /// shard map as persisted by a reshard, durability, limits, delta-sync tracking).
    pub fn open(cfg: &ServerConfig, engine: Engine) -> anyhow::Result<Shard> {
        let replica = Replica::new(cfg, &engine);
        let routing = Routing::open(cfg, &engine)?;
        let pushes = if cfg.durability == Durability::Sync {
            push_window::PushWindow::durable(cfg.push_window, &**engine.store())?
        } else {
            push_window::PushWindow::new(cfg.push_window)
        };
        Ok(Shard {
            engine,
            routing,
            shard_index: cfg.shard_index,
            durability: cfg.durability,
            writes: WriteHealth::default(),
            pin_secs: cfg.tier.pin_secs,
            reducer: Reducer::new(cfg.reduce_limits),
            replica,
            checkpoint_root: cfg.checkpoint_root.clone(),
            registration: cfg.registration_limits,
            max_frame: cfg.max_frame,
            pushes: Arc::new(pushes),
            unsynced: (cfg.durability == Durability::Sync).then(Default::default),
            sync: SyncState::new(
                !cfg.sync_interval.is_zero(),
                cfg.sync_retain_rows,
                crate::sync::draw_incarnation(),
            ),
        })
    }

    /// A shard for tests: server `index` of `map` on `engine`, periodic durability, one replica, checkpoints
    /// under the temporary directory, default limits; the builder's setters change what a test needs.
    #[cfg(any(test, feature = "testing"))]
    pub fn builder(engine: Engine, map: protocol::ShardMap, index: u32) -> ShardBuilder {
        ShardBuilder(Shard {
            engine,
            routing: Routing::new(map),
            shard_index: index,
            durability: Durability::Periodic,
            writes: WriteHealth::default(),
            pin_secs: crate::config::DEFAULT_PIN_SECS,
            reducer: Reducer::default(),
            replica: Replica::single(),
            checkpoint_root: std::env::temp_dir(),
            registration: RegistrationLimits::default(),
            max_frame: protocol::wire::frame::DEFAULT_MAX_FRAME,
            sync: SyncState::default(),
            pushes: Default::default(),
            unsynced: None,
        })
    }

    /// The tables.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The cluster's shard map, which a live reshard changes.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// This server's index in the map.
    pub fn shard_index(&self) -> u32 {
        self.shard_index
    }

    /// When pushed rows reach the store.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Whether storage writes work.
    pub fn writes(&self) -> &WriteHealth {
        &self.writes
    }

    /// Sums of the trainers' reduce contributions.
    pub fn reducer(&self) -> &Reducer {
        &self.reducer
    }

    /// Changed rows and published dense parameters for serving's delta sync.
    pub fn sync(&self) -> &SyncState {
        &self.sync
    }

    /// This server's place among its shard's replicas.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The directory checkpoints are written under.
    pub fn checkpoint_root(&self) -> &std::path::Path {
        &self.checkpoint_root
    }
}

/// A test's [`Shard`] ([`Shard::builder`]), changed setting by setting.
#[cfg(any(test, feature = "testing"))]
pub struct ShardBuilder(Shard);

#[cfg(any(test, feature = "testing"))]
impl ShardBuilder {
    /// When pushed rows reach the store; `sync` reads the push answers the store holds
    /// ([`push_window::PushWindow::durable`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.0.durability = durability;
        self.0.unsynced = (durability == Durability::Sync).then(Default::default);
        if durability == Durability::Sync {
            self.0.pushes = Arc::new(
                push_window::PushWindow::durable(Default::default(), &**self.0.engine.store())
                    .expect("stored push answers readable"),
            );
        }
        self
    }

    /// The directory checkpoints are written under.
    pub fn checkpoint_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.0.checkpoint_root = root.into();
        self
    }

    /// Bounds on the tables trainers register.
    pub fn registration(mut self, limits: RegistrationLimits) -> Self {
        self.0.registration = limits;
        self
    }

    /// The replica state (default [`Replica::single`]).
    pub fn replica(mut self, replica: Replica) -> Self {
        self.0.replica = replica;
        self
    }

    /// Delta-sync tracking.
    pub fn sync(mut self, sync: SyncState) -> Self {
        self.0.sync = sync;
        self
    }

    /// The shard.
    pub fn build(self) -> Shard {
        self.0
    }
}
