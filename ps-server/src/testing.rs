//! Test support (feature `testing`): a cluster of real [`Shard`]s behind protocol's in-memory transport
//! ([`protocol::transport::memory`]), in one process, so a real [`PsClient`] (and whatever drives one, such as
//! the trainer's loop) talks to the server's request handling without sockets, TLS or threads. The quinn
//! `Pair` idea (STYLE.md, "Tests"): both ends in memory, time simulated.
//!
//! Each request is answered by the server's own dispatch (`crate::server::dispatch`: authorized by the
//! connection's role, then run as its kind needs, long polls and reduces awaited), at a time read from
//! tokio's clock, so a test under `#[tokio::test(start_paused = true)]` controls it. Shards keep their rows
//! in [`embedding::MemStore`], with periodic durability and one replica each (no peers: a `Join` or a
//! reshard step is refused as a lone server refuses it).
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
use protocol::transport::memory::{MemoryDialer, MemoryServer};
use protocol::{ProtocolError, PsClient, PsClientConfig, ShardMap};

use crate::shard::Shard;

/// The Unix time (microseconds) a [`MemoryCluster`]'s clock starts at.
pub const START_US: u64 = 1_700_000_000_000_000;

/// `n` real shards, each behind a [`MemoryServer`].
pub struct MemoryCluster {
    shards: Vec<Arc<Shard>>,
    servers: Vec<MemoryServer>,
    addrs: Vec<SocketAddr>,
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
        let access = Arc::new(Access::Role(role));
        let mut shards = Vec::new();
        let mut servers = Vec::new();
        for index in 0..num_servers {
            let shard = Arc::new(shard(num_servers, index));
            let (s, access) = (shard.clone(), access.clone());
            servers.push(MemoryServer::new_async(move |req, payload| {
                let now_us = START_US + began.elapsed().as_micros() as u64;
                let (s, access, req) = (s.clone(), access.clone(), req.clone());
                Box::pin(async move {
                    crate::server::dispatch::answer(&s, &access, req, payload, now_us).await
                })
            }));
            shards.push(shard);
        }
        let addrs = (0..num_servers)
            .map(|i| SocketAddr::from(([10, 0, 0, 1], 7000 + i as u16)))
            .collect();
        MemoryCluster {
            shards,
            servers,
            addrs,
        }
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

    /// A client config for this cluster: short timeouts (in simulated time under a paused clock).
    pub fn config(&self) -> PsClientConfig {
        let mut cfg = PsClientConfig::new(self.addrs.clone(), Default::default());
        cfg.request_timeout = Duration::from_secs(5);
        cfg.retry_for = Duration::from_secs(2);
        cfg
    }

    /// A dialer per server, in server order, for [`PsClient::connect_with`] (to wrap them, say).
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
    use protocol::{Encoding, TableConfig, TableCount};

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
}
