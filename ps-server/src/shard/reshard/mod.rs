//! Live resharding (`docs/replication.md`, "Live resharding"): this server's shard map, which can change
//! while it runs, and its part in a reshard.
//!
//! - [`Routing`] (here): the current map and the addresses of its servers, persisted in the store's
//!   metadata (a restart keeps a map changed live), a source's [`mover::Mover`] and a destination's
//!   expected stream. Every pull and push checks its epoch and ids against the map under the read lock; a
//!   push also queues its changed rows of moving virtual shards to their destination under it, so the
//!   switch (the write lock) sees every push either refused or forwarded.
//! - [`mover`]: a source's copy of the rows it loses: a scan, forwarded pushes, one ordered stream per
//!   destination, then the commit that switches the map and drains the streams.
//! - [`receive`]: a destination storing `MoveRows`, and the answers to `Reshard` steps.
//! - [`coordinator`]: `ps-server reshard`, which drives every server through prepare, status and commit.

pub mod coordinator;
pub mod mover;
pub mod receive;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use embedding::Engine;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use protocol::wire::message::reshard::MapInfo;
use protocol::ShardMap;

use crate::config::ServerConfig;
use crate::metrics as m;

/// Metadata key of the persisted map ([`MapInfo`], bincode).
pub const MAP_KEY: &str = "reshard/map";

/// The map and what moves under it.
pub struct RouteState {
    /// The current map.
    pub map: ShardMap,
    /// Its servers' addresses (empty until a reshard named them).
    pub servers: Vec<String>,
    /// A source's move under way.
    pub mover: Option<Arc<mover::Mover>>,
}

/// What a destination expects: `MoveRows` of the prepared target epoch, in order per source.
#[derive(Debug, Default)]
pub struct Incoming {
    /// The prepared target's epoch (0: none).
    pub target_epoch: u64,
    /// The target map and its servers, to switch to at commit.
    pub target: Option<(ShardMap, Vec<String>)>,
    /// Next expected sequence number per source.
    pub next_seq: HashMap<u32, u64>,
    /// Rows stored so far.
    pub rows: u64,
}

pub use crate::shard::replica::peer::PeerSettings;

/// This server's shard map and its part in a reshard.
pub struct Routing {
    state: RwLock<RouteState>,
    /// A destination's expected streams.
    pub incoming: Mutex<Incoming>,
    /// How to reach other servers.
    pub peers: PeerSettings,
    /// The mover's tasks, waited for at shutdown.
    pub(crate) tasks: tokio_util::task::TaskTracker,
    /// True while rows a committed reshard moved away are being deleted here.
    pub(crate) cleaning: tokio::sync::watch::Sender<bool>,
}

impl Routing {
    /// A server under `map` that cannot dial other servers (tests).
    pub fn new(map: ShardMap) -> Routing {
        Routing::build(map, Vec::new(), PeerSettings::default())
    }

    fn build(map: ShardMap, servers: Vec<String>, peers: PeerSettings) -> Routing {
        metrics::gauge!(m::SHARD_MAP_EPOCH).set(map.epoch as f64);
        Routing {
            state: RwLock::new(RouteState {
                map,
                servers,
                mover: None,
            }),
            incoming: Mutex::new(Incoming::default()),
            peers,
            tasks: Default::default(),
            cleaning: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Waits until the rows the last reshard moved away are deleted here.
    pub async fn cleaned(&self) {
        let mut rx = self.cleaning.subscribe();
        let _ = rx.wait_for(|cleaning| !cleaning).await;
    }

    /// The map of a server with `cfg`: the one persisted in `engine`'s store by a reshard if any, else
    /// `cfg.num_shards` round-robin at `cfg.epoch`; a standby server (`cfg.standby`, nothing persisted)
    /// owns nothing, at epoch 0, until a reshard moves virtual shards to it.
    pub fn open(cfg: &ServerConfig, engine: &Engine) -> anyhow::Result<Routing> {
        let peers = PeerSettings {
            tls_dir: cfg.tls_dir.clone(),
            server_name: cfg.replica_server_name.clone(),
            max_frame: cfg.max_frame,
            role: protocol::Role::Peer,
        };
        let persisted = engine
            .store()
            .get_meta(MAP_KEY)
            .map_err(|e| anyhow::anyhow!("read the persisted shard map: {e}"))?;
        if let Some(bytes) = persisted {
            let info: MapInfo =
                bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
                    .map(|(info, _)| info)
                    .map_err(|e| anyhow::anyhow!("decode the persisted shard map: {e}"))?;
            let map = info
                .map()
                .map_err(|e| anyhow::anyhow!("persisted shard map: {e}"))?;
            if map.num_servers != cfg.num_shards || cfg.standby {
                tracing::warn!(
                    epoch = map.epoch,
                    servers = map.num_servers,
                    configured = cfg.num_shards,
                    standby = cfg.standby,
                    "using the shard map a live reshard persisted, not the configured one"
                );
            }
            return Ok(Routing::build(map, info.servers, peers));
        }
        let map = if cfg.standby {
            ShardMap::new(1).with_epoch(0)
        } else {
            ShardMap::new(cfg.num_shards).with_epoch(cfg.epoch)
        };
        Ok(Routing::build(map, Vec::new(), peers))
    }

    /// The map and the move under way, read-locked: a reshard's switch waits until the guard is dropped.
    pub fn read(&self) -> RwLockReadGuard<'_, RouteState> {
        self.state.read()
    }

    /// The current map.
    pub fn map(&self) -> ShardMap {
        self.state.read().map.clone()
    }

    /// The current map in its wire form.
    pub fn info(&self) -> MapInfo {
        let st = self.state.read();
        MapInfo::of(&st.map, st.servers.clone())
    }

    /// The target epoch of a reshard prepared here and not committed yet.
    pub fn moving_to(&self) -> Option<u64> {
        let current = self.state.read().map.epoch;
        let target = self.incoming.lock().target_epoch;
        (target > current).then_some(target)
    }

    /// Whether this server is a standby that never had a map (epoch 0).
    pub fn standby(&self) -> bool {
        self.state.read().map.epoch == 0
    }

    /// Switches to `map` with `servers`, persisting it first (synced) so a restart keeps it.
    pub(crate) fn switch(
        &self,
        engine: &Engine,
        map: ShardMap,
        servers: Vec<String>,
    ) -> Result<(), String> {
        let info = MapInfo::of(&map, servers.clone());
        let bytes = bincode::serde::encode_to_vec(&info, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        let store = engine.store();
        // Persisted before the switch, outside the lock: requests go on meanwhile (a crash in between
        // restarts on the new map, like a crash just after the switch).
        store
            .put_meta(MAP_KEY, &bytes)
            .and_then(|()| store.flush())
            .map_err(|e| format!("persist the shard map of epoch {}: {e}", map.epoch))?;
        #[cfg(feature = "failpoints")]
        embedding::failpoints::crash_point(crate::failpoints::RESHARD_MAP_PERSISTED);
        let mut st = self.state.write();
        tracing::info!(
            from_epoch = st.map.epoch,
            epoch = map.epoch,
            servers = map.num_servers,
            "switched to a new shard map"
        );
        metrics::gauge!(m::SHARD_MAP_EPOCH).set(map.epoch as f64);
        st.map = map;
        st.servers = servers;
        Ok(())
    }

    /// Sets or clears the move under way.
    pub(crate) fn set_mover(&self, mover: Option<Arc<mover::Mover>>) {
        metrics::gauge!(m::RESHARD_VSHARDS_MOVING)
            .set(mover.as_ref().map_or(0, |m| m.vshards_out()) as f64);
        self.state.write().mover = mover;
    }

    /// Stops a move under way and waits for its tasks (at shutdown, before the engine closes).
    pub async fn shut_down(&self) {
        if let Some(m) = self.state.read().mover.clone() {
            m.stop();
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}
