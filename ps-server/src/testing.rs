//! Test support (feature `testing`): a cluster of real [`Shard`]s behind protocol's in-memory transport
//! ([`protocol::transport::memory`]), in one process, so a real [`PsClient`] (and whatever drives one, such as
//! the trainer's loop) talks to the server's request handling without sockets, TLS or threads. The quinn
//! `Pair` idea (STYLE.md, "Tests"): both ends in memory, time simulated.
//!
//! Each request is answered by the server's own dispatch (`crate::server::dispatch`: authorized by the
//! connection's role, then run as its kind needs, long polls and reduces awaited), at a time read from
//! tokio's clock, so a test under `#[tokio::test(start_paused = true)]` controls it. Shards keep their rows
//! in [`embedding::MemStore`]. [`MemoryCluster::new`] gives periodic durability and one replica each (no
//! peers: a `Join` or a reshard step is refused as a lone server refuses it); [`MemoryCluster::replicated`]
//! gives shards of several replicas that elect their primary, join and stream rows to each other as
//! `ps-server` processes do, over the memory transport, and [`MemoryCluster::kill`] crashes one.
//!
//! Faults are the memory transport's ([`MemoryServer`]: refused dials, lost connections, error answers,
//! dropped replies, delays, hung connections), per server through [`MemoryCluster::server`];
//! [`MemoryServer::log`] tells which requests reached a server, in order.
//!
//! The test at the end of this file shows the use: a client registers a table, pushes and pulls.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use embedding::{Engine, MemStore};
use protocol::auth::{Access, Role};
use protocol::transport::memory::{Fault, MemoryDialer, MemoryServer};
use protocol::wire::message::replicate::Role as ReplicaRole;
use protocol::{ProtocolError, PsClient, PsClientConfig, ShardMap};
use tokio_util::sync::CancellationToken;

use crate::config::Durability;
use crate::shard::replica::{peer::Peers, Replica};
use crate::shard::Shard;

/// The Unix time (microseconds) a [`MemoryCluster`]'s clock starts at.
pub const START_US: u64 = 1_700_000_000_000_000;

/// `n` shards of `r` replicas each, every replica a real [`Shard`] behind a [`MemoryServer`] (and, replicated,
/// a second one its peers reach it through, answering as the `peer` role). Replica `r` of shard `s` is server
/// `s * replicas + r` of the accessors.
pub struct MemoryCluster {
    replicas: usize,
    shards: Vec<Arc<Shard>>,
    /// The clients' ends.
    servers: Vec<MemoryServer>,
    /// The peers' ends (replicated clusters only).
    peer_servers: Vec<MemoryServer>,
    addrs: Vec<SocketAddr>,
    /// Each replica's background tasks (the follower).
    stops: Vec<CancellationToken>,
}

impl MemoryCluster {
    /// A cluster of `num_servers` empty shards (no tables) of a shard map of that many servers, answering
    /// clients of the trainer role.
    pub fn new(num_servers: u32) -> MemoryCluster {
        Self::with_role(num_servers, Role::Trainer)
    }

    /// [`MemoryCluster::new`], each connection authenticated as `role`.
    pub fn with_role(num_servers: u32, role: Role) -> MemoryCluster {
        let began = tokio::time::Instant::now();
        let mut cluster = MemoryCluster::empty(1);
        for index in 0..num_servers {
            let shard = Arc::new(shard(num_servers, index));
            cluster.add(
                shard,
                role,
                began,
                SocketAddr::from(([10, 0, 0, 1], 7000 + index as u16)),
            );
        }
        cluster
    }

    /// `num_shards` shards of `replicas` replicas each, with `durability` (`Replicated`: pushes wait for the
    /// in-sync backups), every replica started as `ps-server` starts one (its role settled by the census of
    /// its peers, then its follower task running) over the memory transport; returns once every replica has
    /// settled (replica 0 of each shard the primary, the others its backups, joined).
    pub async fn replicated(
        num_shards: u32,
        replicas: u32,
        durability: Durability,
    ) -> MemoryCluster {
        assert!(replicas > 1, "a replicated shard has several replicas");
        let began = tokio::time::Instant::now();
        let mut cluster = MemoryCluster::empty(replicas as usize);
        for s in 0..num_shards {
            let first = cluster.shards.len();
            let peer_addr = |r: u32| SocketAddr::from(([10, 0, s as u8, r as u8 + 1], 7001));
            let names: Vec<String> = (0..replicas).map(|r| peer_addr(r).to_string()).collect();
            // The peers' ends exist before the shards: each shard's `Peers` dials them.
            let slots: Vec<Arc<std::sync::OnceLock<Arc<Shard>>>> =
                (0..replicas).map(|_| Default::default()).collect();
            let peer_ends: Vec<MemoryServer> = slots
                .iter()
                .map(|slot| answering(slot.clone(), Role::Peer, began))
                .collect();
            for r in 0..replicas {
                let peers = Peers::in_memory(
                    &names,
                    r,
                    peer_ends.iter().map(MemoryServer::dialer).collect(),
                );
                let replica = Replica::starting(r, peers, durability == Durability::Replicated);
                let engine =
                    Engine::open(Arc::new(MemStore::new())).expect("an empty memory store opens");
                let shard = Shard::builder(engine, ShardMap::new(num_shards), s)
                    .durability(durability)
                    .replica(replica)
                    .build();
                let shard = Arc::new(shard);
                let _ = slots[r as usize].set(shard.clone());
                let addr = SocketAddr::from(([10, 0, s as u8, r as u8 + 1], 7000));
                cluster.add(shard, Role::Trainer, began, addr);
            }
            cluster.peer_servers.extend(peer_ends);
            let settling = cluster.shards[first..].iter().map(|shard| {
                crate::shard::replica::startup::settle(shard, Duration::from_secs(30))
            });
            let roles = futures_util::future::join_all(settling).await;
            assert_eq!(
                roles[0],
                ReplicaRole::Primary,
                "replica 0 of shard {s} cold-starts the shard"
            );
            for (i, shard) in cluster.shards[first..].iter().enumerate() {
                let (shard, stop) = (shard.clone(), cluster.stops[first + i].clone());
                tokio::spawn(crate::shard::replica::backup::follow(shard, stop));
            }
        }
        // Every backup joined and caught up (the follower's first round), within a minute of simulated time.
        let joined = async {
            for (i, shard) in cluster.shards.iter().enumerate() {
                while i % cluster.replicas != 0 && !shard.replica().info().in_sync {
                    tokio::select! {
                        _ = shard.replica().changed.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), joined)
            .await
            .expect("every backup joins its primary");
        cluster
    }

    fn empty(replicas: usize) -> MemoryCluster {
        MemoryCluster {
            replicas,
            shards: Vec::new(),
            servers: Vec::new(),
            peer_servers: Vec::new(),
            addrs: Vec::new(),
            stops: Vec::new(),
        }
    }

    /// Puts `shard` behind a server answering `role` at `addr`.
    fn add(
        &mut self,
        shard: Arc<Shard>,
        role: Role,
        began: tokio::time::Instant,
        addr: SocketAddr,
    ) {
        let slot = Arc::new(std::sync::OnceLock::new());
        let _ = slot.set(shard.clone());
        self.servers.push(answering(slot, role, began));
        self.shards.push(shard);
        self.addrs.push(addr);
        self.stops.push(CancellationToken::new());
    }

    /// Server `i`'s shard, to read its rows directly.
    pub fn shard(&self, i: usize) -> &Arc<Shard> {
        &self.shards[i]
    }

    /// Server `i`'s transport end: its faults and its log.
    pub fn server(&self, i: usize) -> &MemoryServer {
        &self.servers[i]
    }

    /// The servers' (made-up) addresses, which name them in the client's errors.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Kills server `i` as a crash would: every connection to it (clients' and peers') is lost and no new
    /// one is accepted, its follower stops and its streams to backups end. Its rows stay readable through
    /// [`MemoryCluster::shard`].
    pub fn kill(&self, i: usize) {
        self.killer(i).kill()
    }

    /// What kills server `i` ([`MemoryCluster::kill`]), to be called from elsewhere (a dialer wrapper that
    /// crashes a server at a chosen request, say).
    pub fn killer(&self, i: usize) -> Killer {
        let mut ends = vec![self.servers[i].clone()];
        ends.extend(self.peer_servers.get(i).cloned());
        Killer {
            ends,
            stop: self.stops[i].clone(),
            shard: self.shards[i].clone(),
        }
    }

    /// A client config for this cluster: short timeouts (in simulated time under a paused clock); with
    /// replicas, replica 0 of each shard as its server and the others as its backups.
    pub fn config(&self) -> PsClientConfig {
        let by_shard: Vec<&[SocketAddr]> = self.addrs.chunks(self.replicas).collect();
        let mut cfg =
            PsClientConfig::new(by_shard.iter().map(|a| a[0]).collect(), Default::default());
        if self.replicas > 1 {
            cfg.backups = by_shard.iter().map(|a| a[1..].to_vec()).collect();
        }
        cfg.request_timeout = Duration::from_secs(5);
        cfg.retry_for = Duration::from_secs(2);
        cfg
    }

    /// A dialer per server, in server order (what [`PsClient::connect_with`] expects), to wrap them, say.
    pub fn dialers(&self) -> Vec<MemoryDialer> {
        self.servers.iter().map(MemoryServer::dialer).collect()
    }

    /// A client connected to every server with [`MemoryCluster::config`].
    pub async fn connect(&self) -> Result<PsClient<MemoryDialer>, ProtocolError> {
        self.connect_with(self.config()).await
    }

    /// A client connected to every server with `cfg` (its servers must be [`MemoryCluster::addrs`]).
    pub async fn connect_with(
        &self,
        cfg: PsClientConfig,
    ) -> Result<PsClient<MemoryDialer>, ProtocolError> {
        PsClient::connect_with(cfg, self.dialers()).await
    }
}

/// Kills one server of a [`MemoryCluster`] ([`MemoryCluster::killer`]).
#[derive(Clone)]
pub struct Killer {
    ends: Vec<MemoryServer>,
    stop: CancellationToken,
    shard: Arc<Shard>,
}

impl Killer {
    /// The crash: see [`MemoryCluster::kill`]. Requests the server is handling finish (a crash after the
    /// store write and before the reply is `ps-server`'s crash point `PUSH_BEFORE_ACK`, tested with processes).
    pub fn kill(&self) {
        for end in &self.ends {
            end.refuse_connections(u64::MAX);
            end.fail_next(u64::MAX, Fault::Lost);
        }
        self.stop.cancel();
        self.shard.replica().crash();
    }
}

impl Drop for MemoryCluster {
    fn drop(&mut self) {
        for stop in &self.stops {
            stop.cancel();
        }
    }
}

/// A memory server answering with the shard `slot` holds (set before the first request), connections
/// authenticated as `role`, at a time read from tokio's clock.
fn answering(
    slot: Arc<std::sync::OnceLock<Arc<Shard>>>,
    role: Role,
    began: tokio::time::Instant,
) -> MemoryServer {
    let access = Arc::new(Access::Role(role));
    MemoryServer::new_async(move |req, payload| {
        let now_us = START_US + began.elapsed().as_micros() as u64;
        let shard = slot
            .get()
            .expect("the shard exists before it is dialed")
            .clone();
        let (access, req) = (access.clone(), req.clone());
        Box::pin(async move {
            crate::server::dispatch::answer(&shard, &access, req, payload, now_us).await
        })
    })
}

fn shard(num_servers: u32, index: u32) -> Shard {
    memory_shard(ShardMap::new(num_servers), index)
}

/// Server `index` of `map` on an empty [`MemStore`]: periodic durability, one replica, no tables; tests change
/// what they need through [`Shard::builder`] (tests inside `crate::shard` may use struct update syntax).
pub fn memory_shard(map: ShardMap, index: u32) -> Shard {
    let engine = Engine::open(Arc::new(MemStore::new())).expect("an empty memory store opens");
    Shard::builder(engine, map, index).build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use protocol::{Encoding, Request, TableConfig, TableCount};

    use crate::config::Durability;

    fn ids(ids: &[u64]) -> Bytes {
        let mut b = Vec::new();
        protocol::wire::layout::put_ids(ids, &mut b);
        Bytes::from(b)
    }

    /// A real client registers a table, pushes and pulls through two real shards: the pulled row moved by the
    /// pushed gradient, and each request reached the one server that owns its ids.
    #[tokio::test(start_paused = true)]
    async fn a_client_pushes_and_pulls_through_real_shards() {
        let cluster = MemoryCluster::new(2);
        let client = cluster.connect().await.unwrap();
        client
            .register_tables(&[TableConfig::counter(1, 2)])
            .await
            .unwrap();
        let map = client.shard_map();
        let id = 42u64;
        let s = map.server_of(id) as usize;
        let counts = vec![TableCount {
            table: 1,
            count: 1,
            dim: 2,
        }];
        let before = client
            .pull(s, Encoding::F32, counts.clone(), ids(&[id]))
            .await
            .unwrap();
        let mut payload = ids(&[id]).to_vec();
        protocol::compression::codec::encode(&[1.0, 2.0], Encoding::F32, &mut payload);
        let (applied, rejected) = client
            .push(s, Encoding::F32, 1.0, counts.clone(), Bytes::from(payload))
            .await
            .unwrap();
        assert_eq!((applied, rejected), (1, 0));
        let after = client
            .pull(s, Encoding::F32, counts, ids(&[id]))
            .await
            .unwrap();
        let row = |b: &Bytes| -> Vec<f32> {
            b.chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        assert_eq!(row(&before), [0.0, 0.0]);
        assert_eq!(
            row(&after),
            [-1.0, -2.0],
            "a counter table subtracts the gradient"
        );
        assert_eq!(
            cluster.server(1 - s).log().work().len(),
            1,
            "only the table"
        );
    }

    /// Two shards of two replicas with replicated durability: the backups join at start; a pushed row is on
    /// the backup before the push is acknowledged; after the primary crashes, the client promotes the backup
    /// and reads the row from it; a push then reaches the new primary.
    #[tokio::test(start_paused = true)]
    async fn a_crashed_primary_fails_over_to_its_backup_with_every_acknowledged_push() {
        let cluster = MemoryCluster::replicated(2, 2, Durability::Replicated).await;
        for (i, role) in [(0, "primary"), (1, "backup"), (2, "primary"), (3, "backup")] {
            assert_eq!(cluster.shard(i).replica().role().name(), role, "server {i}");
        }
        let client = cluster.connect().await.unwrap();
        client
            .register_tables(&[TableConfig::counter(1, 2)])
            .await
            .unwrap();
        let id = 42u64;
        let s = client.shard_map().server_of(id) as usize;
        let counts = vec![TableCount {
            table: 1,
            count: 1,
            dim: 2,
        }];
        let push = |g: [f32; 2]| {
            let mut payload = ids(&[id]).to_vec();
            protocol::compression::codec::encode(&g, Encoding::F32, &mut payload);
            Bytes::from(payload)
        };
        let row = |b: &Bytes| -> Vec<f32> {
            b.chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let (applied, _) = client
            .push(s, Encoding::F32, 1.0, counts.clone(), push([1.0, 2.0]))
            .await
            .unwrap();
        assert_eq!(applied, 1);
        let (primary, backup) = (2 * s, 2 * s + 1);
        let mut stored = vec![0.0; 2];
        cluster
            .shard(backup)
            .engine()
            .gather(1, &[id], &mut stored)
            .unwrap();
        assert_eq!(
            stored,
            [-1.0, -2.0],
            "the acknowledged push is on the backup"
        );

        cluster.kill(primary);
        let pulled = client
            .pull(s, Encoding::F32, counts.clone(), ids(&[id]))
            .await
            .unwrap();
        assert_eq!(row(&pulled), [-1.0, -2.0], "read from the promoted backup");
        assert_eq!(cluster.shard(backup).replica().role().name(), "primary");
        assert!(
            cluster.shard(backup).replica().epoch() > 1,
            "a new shard epoch"
        );
        client
            .push(s, Encoding::F32, 1.0, counts.clone(), push([1.0, 1.0]))
            .await
            .unwrap();
        let pulled = client
            .pull(s, Encoding::F32, counts, ids(&[id]))
            .await
            .unwrap();
        assert_eq!(row(&pulled), [-2.0, -3.0]);
        cluster
            .shard(primary)
            .engine()
            .gather(1, &[id], &mut stored)
            .unwrap();
        assert_eq!(stored, [-1.0, -2.0], "the dead primary took nothing more");
    }

    /// The stored weights of `id` in table 1 of server `i` (empty while it has no table 1).
    fn stored(cluster: &MemoryCluster, i: usize, id: u64) -> Vec<f32> {
        let mut row = vec![0.0; 2];
        match cluster.shard(i).engine().gather(1, &[id], &mut row) {
            Ok(()) => row,
            Err(_) => Vec::new(),
        }
    }

    /// A client of `cluster` that retries for longer than a request's timeout (a lost reply is retried).
    async fn patient_client(cluster: &MemoryCluster) -> PsClient<MemoryDialer> {
        let mut cfg = cluster.config();
        cfg.retry_for = Duration::from_secs(30);
        cluster.connect_with(cfg).await.unwrap()
    }

    fn one_row(id: u64, g: [f32; 2]) -> (Vec<TableCount>, Bytes) {
        let mut payload = ids(&[id]).to_vec();
        protocol::compression::codec::encode(&g, Encoding::F32, &mut payload);
        let counts = vec![TableCount {
            table: 1,
            count: 1,
            dim: 2,
        }];
        (counts, Bytes::from(payload))
    }

    /// A push whose reply is lost is retried by the client, and the server answers the retry from its push
    /// window: the row moved once.
    #[tokio::test(start_paused = true)]
    async fn a_retried_push_is_applied_once() {
        let cluster = MemoryCluster::new(1);
        let client = patient_client(&cluster).await;
        client
            .register_tables(&[TableConfig::counter(1, 2)])
            .await
            .unwrap();
        cluster.server(0).drop_replies(1);
        let (counts, payload) = one_row(5, [1.0, 2.0]);
        let (applied, _) = client
            .push(0, Encoding::F32, 1.0, counts, payload)
            .await
            .unwrap();
        assert_eq!(applied, 1, "the retry gets the first copy's answer");
        let pushes = cluster
            .server(0)
            .log()
            .work()
            .iter()
            .filter(|(_, _, r)| matches!(r, Request::Push { .. }))
            .count();
        assert_eq!(pushes, 2, "the push reached the server twice");
        assert_eq!(
            stored(&cluster, 0, 5),
            [-1.0, -2.0],
            "and moved the row once"
        );
    }

    /// A primary applies a push and streams it to its backup, then crashes before answering: the client's
    /// retry reaches the promoted backup, which answers it from the answers its primary streamed: the row
    /// moved once.
    #[tokio::test(start_paused = true)]
    async fn a_push_retried_after_a_failover_is_applied_once() {
        let cluster = Arc::new(MemoryCluster::replicated(1, 2, Durability::Replicated).await);
        let client = Arc::new(patient_client(&cluster).await);
        client
            .register_tables(&[TableConfig::counter(1, 2)])
            .await
            .unwrap();
        cluster.server(0).drop_replies(1);
        let (counts, payload) = one_row(5, [1.0, 2.0]);
        let c = client.clone();
        let push =
            tokio::spawn(async move { c.push(0, Encoding::F32, 1.0, counts, payload).await });
        // The backup holds the push's rows (the primary waited for that before its lost answer).
        while stored(&cluster, 1, 5) != [-1.0, -2.0] {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        cluster.kill(0);
        let (applied, _) = push.await.unwrap().unwrap();
        assert_eq!(applied, 1);
        assert_eq!(cluster.shard(1).replica().role().name(), "primary");
        let pushes = cluster
            .server(1)
            .log()
            .work()
            .iter()
            .filter(|(_, _, r)| matches!(r, Request::Push { .. }))
            .count();
        assert_eq!(pushes, 1, "the retry reached the promoted backup");
        assert_eq!(stored(&cluster, 1, 5), [-1.0, -2.0], "and moved nothing");
    }

    /// A client's write of rows' weights reaches the owning shards' primaries and, with replicated durability,
    /// their backups before it is answered.
    #[tokio::test(start_paused = true)]
    async fn written_rows_reach_the_backups() {
        let cluster = MemoryCluster::replicated(2, 2, Durability::Replicated).await;
        let client = Arc::new(cluster.connect().await.unwrap());
        client
            .register_tables(&[TableConfig::counter(1, 2)])
            .await
            .unwrap();
        let ids: Vec<u64> = (0..16).collect();
        let weights: Vec<f32> = (0..32).map(|i| i as f32 / 4.0).collect();
        let parts = [protocol::keyed::TableIds {
            table: 1,
            dim: 2,
            ids: &ids,
        }];
        let written = protocol::keyed::write_tables(&client, &parts, &[&weights])
            .await
            .unwrap();
        assert_eq!(written, 16);
        let map = client.shard_map();
        for (i, &id) in ids.iter().enumerate() {
            let s = map.server_of(id) as usize;
            for replica in [2 * s, 2 * s + 1] {
                assert_eq!(
                    stored(&cluster, replica, id),
                    weights[2 * i..2 * i + 2],
                    "id {id} on {replica}"
                );
            }
        }
    }
}
