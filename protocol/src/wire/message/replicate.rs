//! Replication between the replicas of one shard (`docs/replication.md`): what a replica says about itself in
//! `Hello` ([`ReplicaInfo`]), the primary's stream of whole rows to a backup ([`Request::Replicate`]), a
//! backup joining its primary ([`Request::Join`]) and a client asking a backup to take over
//! ([`Request::Promote`]).
//!
//! A `Replicate` payload holds, for each table of the header in order, `count` ids (u64 LE) then `count` full
//! rows (weights then optimizer state, `row_len` f32 LE each): the rows as the primary holds them after
//! applying pushes, which the backup stores as they are (no optimizer runs on a backup, so replicas cannot
//! drift by applying concurrent pushes in different orders).
//!
//! | side | call |
//! | --- | --- |
//! | primary | [`put_rows`] per table, then [`Request::Replicate`] with a [`ReplicateHeader`] |
//! | backup | [`decode`]: every table's ids and rows, checked for length, before anything is stored |

use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;
use crate::wire::message::TableConfig;

/// A replica's role in its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Takes pushes and streams rows to the backups.
    Primary,
    /// Takes its primary's rows; answers pulls when asked.
    Backup,
    /// Just started, looking for its shard's primary: answers `Hello` only.
    Starting,
}

impl Role {
    /// The role's name, as printed in the ready line and logs.
    pub fn name(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Backup => "backup",
            Role::Starting => "starting",
        }
    }
}

/// What a replica says about itself in [`crate::Response::Hello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    /// This replica's index in its shard's replica list.
    pub replica_index: u32,
    /// Replicas of the shard (1 without replication).
    pub replicas: u32,
    /// Its role.
    pub role: Role,
    /// The shard epoch it holds: bumped by every promotion, so a returning old primary is recognized.
    pub shard_epoch: u64,
    /// A backup: whether it holds every row its primary acknowledged (caught up, stream unbroken). A
    /// primary: true.
    pub in_sync: bool,
    /// A primary: bit `r` set when replica `r` is an in-sync backup. A backup: 0.
    pub in_sync_backups: u64,
}

impl ReplicaInfo {
    /// A server without replicas: the primary of its shard at epoch 1.
    pub const SINGLE: ReplicaInfo = ReplicaInfo {
        replica_index: 0,
        replicas: 1,
        role: Role::Primary,
        shard_epoch: 1,
        in_sync: true,
        in_sync_backups: 0,
    };
}

/// What a `Replicate` request carries besides rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicateKind {
    /// Rows of acknowledged (or about to be acknowledged) pushes.
    Stream,
    /// Rows of the catch-up scan of a joining backup.
    CatchUp,
    /// The catch-up scan is through: the backup is in sync from this message on (it may carry rows too).
    CaughtUp,
    /// Nothing happened: the primary is alive (sent when the stream is idle).
    Heartbeat,
}

/// One table's share of a `Replicate` payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowsTable {
    /// Table id.
    pub table: u32,
    /// Rows of this table in the payload.
    pub count: u32,
    /// f32s per row (weights then optimizer state); the backup checks it against the table.
    pub row_len: u32,
}

/// Header of [`crate::Request::Replicate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicateHeader {
    /// The primary's shard epoch: a backup holding a newer one refuses (`StaleEpoch`), fencing an old primary.
    pub shard_epoch: u64,
    /// The backup's join session this stream belongs to ([`crate::Request::Join`]): a message of another
    /// session (a stream the primary dropped) is refused.
    pub session: u64,
    /// Sequence number of the first message in this request within the session (1, 2, ...); the backup
    /// refuses a gap.
    pub seq: u64,
    /// Messages batched in this request (`seq .. seq + messages`).
    pub messages: u32,
    /// What the last message of the batch is (a batch ending the catch-up is `CaughtUp`).
    pub kind: ReplicateKind,
    /// Tables to register before storing rows (the catch-up starts with every table; a table registered on
    /// the primary later comes in the stream).
    #[serde(with = "crate::wire::tables")]
    pub new_tables: Vec<TableConfig>,
    /// Tables of the payload, in order (a table may appear more than once).
    pub tables: Vec<RowsTable>,
    /// The answers of the pushes whose rows these are (stream messages): a backup remembers them, so a
    /// client retrying one of them after a failover gets its answer, not a second application.
    pub pushes: Vec<super::push::PushAnswer>,
}

/// Appends one table's ids and full rows to a `Replicate` payload. `rows.len()` must be `ids.len() x
/// row_len` (checked by [`decode`] on the other side).
pub fn put_rows(ids: &[u64], rows: &[f32], out: &mut Vec<u8>) {
    out.reserve(ids.len() * 8 + rows.len() * 4);
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    for v in rows {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// One table's ids and full rows, as decoded from a `Replicate` payload.
pub type TableRows = (Vec<u64>, Vec<f32>);

/// Splits a `Replicate` payload into each table's (ids, rows), in header order; refuses a payload whose
/// length differs from what the header announces, naming both.
pub fn decode(tables: &[RowsTable], payload: &[u8]) -> Result<Vec<TableRows>, ProtocolError> {
    let expected = tables.iter().try_fold(0u64, |acc, t| {
        let per_row = 8 + 4 * u64::from(t.row_len);
        acc.checked_add(u64::from(t.count).checked_mul(per_row)?)
    });
    if expected != Some(payload.len() as u64) {
        return Err(ProtocolError::BadPayload(format!(
            "replicate payload of {} bytes, header announces {}",
            payload.len(),
            expected.map_or("more than 2^64".into(), |e| e.to_string())
        )));
    }
    let mut at = 0;
    let mut out = Vec::with_capacity(tables.len());
    for t in tables {
        let n = t.count as usize;
        let ids = payload[at..at + 8 * n]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        at += 8 * n;
        let len = n * t.row_len as usize;
        let rows = payload[at..at + 4 * len]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        at += 4 * len;
        out.push((ids, rows));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_bad_lengths_are_named() {
        let tables = [
            RowsTable {
                table: 1,
                count: 2,
                row_len: 3,
            },
            RowsTable {
                table: 4,
                count: 1,
                row_len: 1,
            },
        ];
        let mut p = Vec::new();
        put_rows(&[7, 9], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &mut p);
        put_rows(&[u64::MAX], &[-0.5], &mut p);
        let got = decode(&tables, &p).unwrap();
        assert_eq!(got[0].0, vec![7, 9]);
        assert_eq!(got[0].1, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(got[1], (vec![u64::MAX], vec![-0.5]));
        let e = decode(&tables, &p[1..]).unwrap_err().to_string();
        assert!(e.contains(&format!("{} bytes", p.len() - 1)), "{e}");
        let huge = [RowsTable {
            table: 0,
            count: u32::MAX,
            row_len: u32::MAX,
        }];
        assert!(decode(&huge, &p).is_err());
    }
}
