//! Shard routing: id -> virtual shard -> server.
//!
//! Ids map to one of `num_virtual` virtual shards by multiply-shift range reduction of a mixed id
//! (`(mix64(id) * num_virtual) >> 64`), and virtual shards map to servers round-robin (`vshard % num_servers`)
//! until a live reshard ([`ShardMap::resized`]) gives the map an explicit owner table: growing or shrinking
//! the cluster then moves only the virtual shards that must move (about `1/(n+1)` of them to add a server).
//! The virtual shard count is fixed for the life of a cluster's data, so the id -> vshard map never changes and
//! a snapshot taken on N servers can be re-routed onto M servers vshard by vshard; that is why a consistent
//! hash (jump hash, grouping 17.6M ids/s here against 435M for multiply-shift) buys
//! nothing at this layer. The map's `epoch` travels with every request; a server with another epoch refuses it
//! (DESIGN.md, "Sharding").

use std::sync::Arc;

/// Default number of virtual shards.
pub const DEFAULT_VIRTUAL_SHARDS: u32 = 4096;

/// The cluster's shard map (on the wire as [`crate::wire::message::reshard::MapInfo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    /// Number of server processes.
    pub num_servers: u32,
    /// Number of virtual shards (fixed for the life of a cluster's data).
    pub num_virtual: u32,
    /// Version of this map; bumped on every change.
    pub epoch: u64,
    /// The server of each virtual shard, after a live reshard; `None`: round-robin (`vshard % num_servers`).
    owners: Option<Arc<[u16]>>,
}

/// Why an owner table does not make a shard map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The table's length is not the virtual shard count.
    #[error("owner table of {got} virtual shards, expected {expected}")]
    Length {
        /// Entries given.
        got: usize,
        /// The virtual shard count.
        expected: u32,
    },
    /// A virtual shard names a server outside the map.
    #[error(
        "virtual shard {vshard} is owned by server {owner}, but the map has {num_servers} servers"
    )]
    Owner {
        /// The virtual shard.
        vshard: u32,
        /// The server it names.
        owner: u16,
        /// Servers in the map.
        num_servers: u32,
    },
    /// A server count the owner table cannot express (0, or more than 65535).
    #[error("{0} servers: a shard map has 1 to 65535")]
    Servers(u32),
}

impl ShardMap {
    /// A map over `num_servers` servers with the default virtual shard count and epoch 1.
    pub fn new(num_servers: u32) -> ShardMap {
        ShardMap {
            num_servers: num_servers.max(1),
            num_virtual: DEFAULT_VIRTUAL_SHARDS,
            epoch: 1,
            owners: None,
        }
    }

    /// This map at another epoch.
    pub fn with_epoch(mut self, epoch: u64) -> ShardMap {
        self.epoch = epoch;
        self
    }

    /// A map of `num_servers` servers at `epoch` whose virtual shard `v` lives on `owners[v]`; every server
    /// index must be below `num_servers`.
    pub fn with_owners(num_servers: u32, epoch: u64, owners: &[u16]) -> Result<ShardMap, MapError> {
        if num_servers == 0 || num_servers > u16::MAX as u32 {
            return Err(MapError::Servers(num_servers));
        }
        if owners.len() != DEFAULT_VIRTUAL_SHARDS as usize {
            return Err(MapError::Length {
                got: owners.len(),
                expected: DEFAULT_VIRTUAL_SHARDS,
            });
        }
        if let Some((vshard, &owner)) = owners
            .iter()
            .enumerate()
            .find(|(_, &o)| u32::from(o) >= num_servers)
        {
            return Err(MapError::Owner {
                vshard: vshard as u32,
                owner,
                num_servers,
            });
        }
        Ok(ShardMap {
            num_servers,
            num_virtual: DEFAULT_VIRTUAL_SHARDS,
            epoch,
            owners: Some(owners.into()),
        })
    }

    /// The server of every virtual shard, in vshard order.
    pub fn owners(&self) -> Vec<u16> {
        (0..self.num_virtual)
            .map(|v| self.owner_of_vshard(v) as u16)
            .collect()
    }

    /// The server of virtual shard `vshard`.
    #[inline]
    pub fn owner_of_vshard(&self, vshard: u32) -> u32 {
        match &self.owners {
            Some(o) => u32::from(o[vshard as usize]),
            None => vshard % self.num_servers,
        }
    }

    /// The map over `num_servers` servers (servers `0..num_servers` keep their indices; to shrink, the last
    /// ones leave) at epoch + 1 that moves the fewest virtual shards while balancing them: each server ends
    /// with `num_virtual / num_servers` or one more. Deterministic: every caller computes the same map.
    pub fn resized(&self, num_servers: u32) -> Result<ShardMap, MapError> {
        if num_servers == 0 || num_servers > u16::MAX as u32 {
            return Err(MapError::Servers(num_servers));
        }
        let n = num_servers as usize;
        let mut owners = self.owners();
        let mut held: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut free = Vec::new();
        for (v, &o) in owners.iter().enumerate() {
            match held.get_mut(o as usize) {
                Some(h) => h.push(v as u32),
                None => free.push(v as u32),
            }
        }
        let base = self.num_virtual as usize / n;
        let extra = self.num_virtual as usize % n;
        let quota = |s: usize| base + usize::from(s < extra);
        // Servers over their quota give up their highest virtual shards.
        for (s, h) in held.iter_mut().enumerate() {
            while h.len() > quota(s) {
                free.push(h.pop().expect("over quota"));
            }
        }
        free.sort_unstable();
        let mut free = free.into_iter();
        for (s, h) in held.iter_mut().enumerate() {
            while h.len() < quota(s) {
                let v = free.next().expect("quotas add up to num_virtual");
                owners[v as usize] = s as u16;
                h.push(v);
            }
        }
        ShardMap::with_owners(num_servers, self.epoch + 1, &owners)
    }

    /// The virtual shards whose server differs between this map and `to`: (vshard, from, to).
    pub fn moves_to(&self, to: &ShardMap) -> Vec<(u32, u32, u32)> {
        (0..self.num_virtual)
            .filter_map(|v| {
                let (a, b) = (self.owner_of_vshard(v), to.owner_of_vshard(v));
                (a != b).then_some((v, a, b))
            })
            .collect()
    }

    /// The virtual shard of an id.
    #[inline]
    pub fn vshard_of(&self, id: u64) -> u32 {
        ((mix64(id ^ ROUTING_SALT) as u128 * self.num_virtual as u128) >> 64) as u32
    }

    /// The server of an id.
    #[inline]
    pub fn server_of(&self, id: u64) -> u32 {
        self.owner_of_vshard(self.vshard_of(id))
    }

    /// A fingerprint of the id -> virtual shard function and the virtual shard count. Servers report it in
    /// their handshake, so a client built with another routing function (version skew) is refused at connect
    /// time instead of being told `WrongShard` on its first pull.
    pub fn routing_fingerprint(&self) -> u64 {
        (0..64u64).fold(mix64(self.num_virtual as u64), |acc, i| {
            mix64(acc ^ self.vshard_of(mix64(i)) as u64)
        })
    }

    /// Groups positions of `ids` by server: `out[s]` receives the indices `i` with `server_of(ids[i]) == s`,
    /// in increasing order. `out` is resized to `num_servers` and its vectors reused.
    pub fn group(&self, ids: &[u64], out: &mut Vec<Vec<u32>>) {
        out.resize_with(self.num_servers as usize, Vec::new);
        for v in out.iter_mut() {
            v.clear();
        }
        for (i, &id) in ids.iter().enumerate() {
            out[self.server_of(id) as usize].push(i as u32);
        }
    }
}

/// Salt so that routing is independent of any other use of `mix64` on the same ids (e.g. lock striping).
const ROUTING_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// The splitmix64 finalizer, a bijection on u64 with good avalanche (defined once, in `base::hash`).
pub use base::hash::mix64;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pinned_values() {
        // Routing must never change silently: data on disk is placed by it.
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
        let m = ShardMap::new(2);
        let ids: Vec<u32> = (0..8u64).map(|i| m.vshard_of(i)).collect();
        assert_eq!(ids, PINNED_VSHARDS);
    }
    const PINNED_VSHARDS: [u32; 8] = [3618, 3661, 2421, 2320, 3094, 363, 3890, 3957];

    #[test]
    fn fingerprint_tracks_the_vshard_function() {
        let a = ShardMap::new(2);
        assert_eq!(
            a.routing_fingerprint(),
            ShardMap::new(5).routing_fingerprint()
        );
        let b = ShardMap {
            num_virtual: 1024,
            ..a.clone()
        };
        assert_ne!(a.routing_fingerprint(), b.routing_fingerprint());
    }

    #[test]
    fn balanced_over_servers() {
        let m = ShardMap::new(3);
        let mut counts = [0u32; 3];
        for id in 0..30_000u64 {
            counts[m.server_of(id) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn group_partitions_positions() {
        let m = ShardMap::new(4);
        let ids: Vec<u64> = (0..1000).map(|i| i * 7919).collect();
        let mut out = Vec::new();
        m.group(&ids, &mut out);
        assert_eq!(out.len(), 4);
        let mut all: Vec<u32> = out.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..1000).collect::<Vec<u32>>());
        for (s, positions) in out.iter().enumerate() {
            assert!(positions.windows(2).all(|w| w[0] < w[1]));
            assert!(positions
                .iter()
                .all(|&p| m.server_of(ids[p as usize]) == s as u32));
        }
    }

    #[test]
    fn resizing_moves_the_fewest_and_balances() {
        let two = ShardMap::new(2);
        let three = two.resized(3).unwrap();
        assert_eq!((three.num_servers, three.epoch), (3, 2));
        let moves = two.moves_to(&three);
        // Exactly the new server's share moves, and only to it.
        assert_eq!(moves.len(), 4096 / 3);
        assert!(moves.iter().all(|&(_, _, to)| to == 2));
        let mut counts = [0usize; 3];
        for v in 0..4096 {
            counts[three.owner_of_vshard(v) as usize] += 1;
        }
        assert_eq!(counts, [1366, 1365, 1365]);
        // Back to two: only the leaving server's shards move, and the map routes like a balanced one.
        let back = three.resized(2).unwrap();
        let moves = three.moves_to(&back);
        assert_eq!(moves.len(), 1365);
        assert!(moves.iter().all(|&(_, from, _)| from == 2));
        assert_eq!(back.epoch, 3);
        for id in 0..1000u64 {
            assert!(back.server_of(id) < 2);
        }
        // Deterministic, and refusals name the bad value.
        assert_eq!(two.resized(3).unwrap(), three);
        assert_eq!(two.resized(0).unwrap_err(), MapError::Servers(0));
        let bad = ShardMap::with_owners(2, 5, &vec![2u16; 4096]).unwrap_err();
        assert!(bad.to_string().contains("server 2"), "{bad}");
        assert!(ShardMap::with_owners(2, 5, &[0u16; 3]).is_err());
        // An explicit table equal to round-robin routes like the round-robin map.
        let explicit = ShardMap::with_owners(2, 1, &two.owners()).unwrap();
        assert!((0..1000u64).all(|id| explicit.server_of(id) == two.server_of(id)));
    }

    proptest! {
        #[test]
        fn resized_maps_route_in_range(from in 1u32..8, to in 1u32..8) {
            let a = ShardMap::new(from);
            let b = a.resized(to).unwrap();
            let moved = a.moves_to(&b).len() as i64;
            // Growing moves the new servers' quota; shrinking moves the leaving servers' shards.
            let bound = 4096 / i64::from(from.min(to)) * i64::from(from.abs_diff(to)) + i64::from(to);
            prop_assert!(moved <= bound, "{} moved from {} to {}", moved, from, to);
            for id in 0..200u64 {
                prop_assert!(b.server_of(id) < to);
            }
        }

        #[test]
        fn vshard_in_range_and_stable(id in any::<u64>(), servers in 1u32..64) {
            let m = ShardMap::new(servers);
            let v = m.vshard_of(id);
            prop_assert!(v < m.num_virtual);
            prop_assert_eq!(v, m.vshard_of(id));
            prop_assert!(m.server_of(id) < servers);
        }

        #[test]
        fn mix_is_injective_on_samples(a in any::<u64>(), b in any::<u64>()) {
            prop_assume!(a != b);
            prop_assert_ne!(mix64(a), mix64(b));
        }
    }
}
