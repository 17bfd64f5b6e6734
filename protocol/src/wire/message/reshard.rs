//! Live resharding (`docs/replication.md`, "Live resharding"): the shard map as it travels
//! ([`MapInfo`], answered to [`Request::GetShardMap`]), the coordinator's steps ([`ReshardStep`] in
//! [`Request::Reshard`], answered with a [`ReshardStatus`]), and the rows a source server copies to a
//! destination ([`Request::MoveRows`], laid out as a `Replicate` payload: [`crate::wire::message::replicate`]).
//!
//! A reshard from map epoch `e` to `e + 1`: `Prepare` every server (destinations first: they accept
//! `MoveRows` of epoch `e + 1` from then on); each source copies the rows of the virtual shards it loses
//! (a scan) and every row a push changes in them afterwards (forwarding), in one ordered stream per
//! destination; `Status` until every source is `ready`; `Commit` every source (it switches to `e + 1`, so
//! requests of `e` are refused with `WrongEpoch`, then waits until each destination stored the whole
//! stream); then `Commit` every other server. A client told `WrongEpoch` asks for the map and re-routes.
//!
//! | side | call |
//! | --- | --- |
//! | coordinator | [`MapInfo::of`] for the target map, then [`Request::Reshard`] per server and step |
//! | source | [`crate::wire::message::replicate::put_rows`] per table, then [`Request::MoveRows`] |
//! | destination | [`crate::wire::message::replicate::decode`], then store |
//! | client | [`Request::GetShardMap`], then [`MapInfo::map`] |

use serde::{Deserialize, Serialize};

use crate::compression::codec::Encoding;
use crate::error::ProtocolError;
use crate::routing::ShardMap;
use crate::wire::ids::{get_ids, IdCoding, IdError};
use crate::wire::layout::TableCount;
use crate::wire::message::pull::IdSections;
use crate::wire::message::replicate::RowsTable;
use crate::wire::message::TableConfig;

#[cfg(doc)]
use crate::wire::message::Request;

/// A shard map as it travels: its epoch, the owner of every virtual shard, and the servers' addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapInfo {
    /// The map's epoch.
    pub epoch: u64,
    /// Servers in the map.
    pub num_servers: u32,
    /// The server of each virtual shard (empty: round-robin, the map a cluster starts with).
    pub owners: Vec<u16>,
    /// `host:port` of each server (replicas `a/b`), as clients dial them; empty when the map was never
    /// changed live (clients keep the addresses they were given).
    pub servers: Vec<String>,
}

impl MapInfo {
    /// The wire form of `map` with `servers`.
    pub fn of(map: &ShardMap, servers: Vec<String>) -> MapInfo {
        MapInfo {
            epoch: map.epoch,
            num_servers: map.num_servers,
            owners: map.owners(),
            servers,
        }
    }

    /// The map, checked: every owner names a server of the map, and the address list (if any) has one
    /// entry per server.
    pub fn map(&self) -> Result<ShardMap, ProtocolError> {
        if !self.servers.is_empty() && self.servers.len() != self.num_servers as usize {
            return Err(ProtocolError::BadPayload(format!(
                "shard map of {} servers lists {} addresses",
                self.num_servers,
                self.servers.len()
            )));
        }
        if self.owners.is_empty() {
            return Ok(ShardMap::new(self.num_servers).with_epoch(self.epoch));
        }
        ShardMap::with_owners(self.num_servers, self.epoch, &self.owners)
            .map_err(|e| ProtocolError::BadPayload(format!("shard map epoch {}: {e}", self.epoch)))
    }
}

/// One step of a reshard, sent by the coordinator to each server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReshardStep {
    /// Start moving to `target` (epoch = the server's + 1): a source starts copying what it loses, a
    /// destination starts accepting `MoveRows` of that epoch.
    Prepare {
        /// The map after the reshard.
        target: MapInfo,
    },
    /// How far the move is.
    Status,
    /// Switch to the target map of epoch `epoch` (a source first finishes its streams).
    Commit {
        /// The target's epoch (a guard against committing another reshard's map).
        epoch: u64,
    },
    /// Give the prepared move up: keep the current map, stop copying.
    Abort,
}

/// Where a server is in a reshard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReshardPhase {
    /// No reshard under way.
    Idle,
    /// Prepared: copying (a source) or receiving (a destination).
    Moving,
}

/// A server's answer to every [`ReshardStep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReshardStatus {
    /// The server's current map epoch.
    pub epoch: u64,
    /// The phase.
    pub phase: ReshardPhase,
    /// The prepared target's epoch (0 when idle).
    pub target_epoch: u64,
    /// Virtual shards this server is moving out.
    pub vshards_out: u32,
    /// Rows queued to destinations so far (scan and forwarded pushes).
    pub rows_sent: u64,
    /// Rows destinations acknowledged.
    pub rows_acked: u64,
    /// Rows stored from sources (as a destination).
    pub rows_received: u64,
    /// A source: the scan is through and the streams are nearly drained, so a commit is short. Others: true.
    pub ready: bool,
}

/// What a [`Request::MoveRows`] carries besides rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoveHeader {
    /// The target map's epoch: a destination that was not prepared for it refuses (`WrongEpoch`).
    pub target_epoch: u64,
    /// The source server's index.
    pub source: u32,
    /// Sequence number of the first message of this request in the source's stream to this destination
    /// (1, 2, ...). A retry may repeat messages already stored (stored again, in order: no value regresses);
    /// a gap is refused.
    pub seq: u64,
    /// Messages batched in this request (`seq .. seq + messages`).
    pub messages: u32,
    /// Tables to register before storing (the source's tables, in the first request).
    #[serde(with = "crate::wire::tables")]
    pub new_tables: Vec<TableConfig>,
    /// The rows' tables, in payload order.
    pub tables: Vec<RowsTable>,
}

/// Decodes the rows of a `MoveRows` payload: the same layout as a `Replicate` payload.
pub use crate::wire::message::replicate::decode as decode_rows;

/// One server's share of a request re-routed under a new map ([`split`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPart {
    /// The server.
    pub server: u32,
    /// Its id sections (a push's rows are appended by [`SplitPart::append_rows`]).
    pub sections: IdSections,
    /// For each section, in order: the request's table index and the indices of its ids within that table.
    pub origin: Vec<(usize, Vec<u32>)>,
}

/// Re-groups the id sections of a pull, push or prefetch (`tables`, `payload`) by the servers of `map`,
/// keeping each section's coding and order. Returns the parts (in server order, servers with ids only) and
/// the bytes the sections took (a push's rows follow).
pub fn split(
    tables: &[TableCount],
    payload: &[u8],
    map: &ShardMap,
) -> Result<(Vec<SplitPart>, usize), ProtocolError> {
    let n = map.num_servers as usize;
    let mut parts: Vec<SplitPart> = (0..n as u32)
        .map(|server| SplitPart {
            server,
            sections: IdSections::new(),
            origin: Vec::new(),
        })
        .collect();
    let mut at = 0;
    let mut ids = Vec::new();
    let mut by_server: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut subset = Vec::new();
    for (t, tc) in tables.iter().enumerate() {
        let bad =
            |e: IdError| ProtocolError::BadPayload(format!("re-routing table {}: {e}", tc.table));
        let coding = IdCoding::from_byte(*payload.get(at).unwrap_or(&u8::MAX)).map_err(bad)?;
        ids.clear();
        at += get_ids(&payload[at..], tc.count as usize, &mut ids).map_err(bad)?;
        by_server.iter_mut().for_each(Vec::clear);
        for (i, &id) in ids.iter().enumerate() {
            by_server[map.server_of(id) as usize].push(i as u32);
        }
        for (part, positions) in parts.iter_mut().zip(&by_server) {
            if positions.is_empty() {
                continue;
            }
            subset.clear();
            subset.extend(positions.iter().map(|&i| ids[i as usize]));
            part.sections.table(tc.table, tc.dim, coding, &subset);
            part.origin.push((t, positions.clone()));
        }
    }
    parts.retain(|p| !p.origin.is_empty());
    Ok((parts, at))
}

/// Byte offset of each table's rows in a rows section of `tables` in `encoding`.
pub fn row_offsets(tables: &[TableCount], encoding: Encoding) -> Vec<usize> {
    let mut out = Vec::with_capacity(tables.len());
    let mut at = 0;
    for t in tables {
        out.push(at);
        at += t.count as usize * encoding.row_bytes(t.dim as usize);
    }
    out
}

impl SplitPart {
    /// Appends this part's rows, taken from the request's `rows` (every table of `tables` in `encoding`).
    pub fn append_rows(&mut self, tables: &[TableCount], encoding: Encoding, rows: &[u8]) {
        let offsets = row_offsets(tables, encoding);
        for (t, positions) in &self.origin {
            let width = encoding.row_bytes(tables[*t].dim as usize);
            for &i in positions {
                let from = offsets[*t] + i as usize * width;
                self.sections
                    .payload
                    .extend_from_slice(&rows[from..from + width]);
            }
        }
    }

    /// Copies this part's answer `rows` (its sections' rows in `encoding`) into `out`, the request's rows
    /// laid out as one server would have answered them.
    pub fn scatter_rows(
        &self,
        tables: &[TableCount],
        encoding: Encoding,
        rows: &[u8],
        out: &mut [u8],
    ) -> Result<(), ProtocolError> {
        let offsets = row_offsets(tables, encoding);
        let mut at = 0;
        for (t, positions) in &self.origin {
            let width = encoding.row_bytes(tables[*t].dim as usize);
            for &i in positions {
                let src = rows.get(at..at + width).ok_or_else(|| {
                    ProtocolError::BadPayload(format!(
                        "re-routed reply of {} bytes from server {} is short",
                        rows.len(),
                        self.server
                    ))
                })?;
                let to = offsets[*t] + i as usize * width;
                out[to..to + width].copy_from_slice(src);
                at += width;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::codec::{decode_rows, encode_rows};

    #[test]
    fn split_then_scatter_is_the_identity() {
        let map = ShardMap::new(2).resized(3).unwrap();
        let mut s = IdSections::new();
        let a: Vec<u64> = (0..40u64).collect();
        let mut b: Vec<u64> = (100..130u64).collect();
        crate::wire::ids::sort_for_wire(IdCoding::Unmixed, &mut b);
        s.table(1, 2, IdCoding::Plain, &a);
        s.table(7, 3, IdCoding::Unmixed, &b);
        let tables = s.counts.clone();
        let values: Vec<f32> = (0..(40 * 2 + 30 * 3)).map(|i| i as f32).collect();
        let mut rows = Vec::new();
        encode_rows(&values[..80], 2, Encoding::Int8, &mut rows);
        encode_rows(&values[80..], 3, Encoding::Int8, &mut rows);
        let (mut parts, used) = split(&tables, &s.payload, &map).unwrap();
        assert_eq!(used, s.payload.len());
        assert!(parts.len() == 3, "ids of every server");
        let mut back = vec![0u8; rows.len()];
        let mut seen = 0;
        for p in &mut parts {
            // Every id of a part belongs to its server.
            let mut ids = Vec::new();
            crate::wire::message::pull::decode(&p.sections.counts, &p.sections.payload, &mut ids)
                .unwrap();
            assert!(ids.iter().all(|&id| map.server_of(id) == p.server));
            seen += ids.len();
            let ids_len = p.sections.payload.len();
            p.append_rows(&tables, Encoding::Int8, &rows);
            let part_rows = p.sections.payload[ids_len..].to_vec();
            p.scatter_rows(&tables, Encoding::Int8, &part_rows, &mut back)
                .unwrap();
        }
        assert_eq!(seen, 70);
        assert_eq!(back, rows, "every row back at its place, bit for bit");
        let mut decoded = vec![0f32; 80];
        decode_rows(&back[..80 + 40 * 4], 2, Encoding::Int8, &mut decoded).unwrap();
        assert!(split(&tables, &s.payload[..3], &map).is_err());
    }

    #[test]
    fn map_info_round_trip_and_checks() {
        let m = ShardMap::new(2).resized(3).unwrap();
        let info = MapInfo::of(&m, vec!["a:1".into(), "b:1".into(), "c:1".into()]);
        assert_eq!(info.map().unwrap(), m);
        let short = MapInfo {
            servers: vec!["a:1".into()],
            ..info.clone()
        };
        assert!(short.map().unwrap_err().to_string().contains("1 addresses"));
        let plain = MapInfo {
            owners: Vec::new(),
            servers: Vec::new(),
            epoch: 4,
            num_servers: 2,
        };
        assert_eq!(
            plain.map().unwrap().server_of(5),
            ShardMap::new(2).server_of(5)
        );
    }
}
