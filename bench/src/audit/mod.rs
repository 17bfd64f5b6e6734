//! An audit of acknowledged updates, independent of any model: `ps-audit run` pushes `+1` increments to the
//! counter rows of a dedicated table spread over every shard and appends each *acknowledged* push to a log file
//! before sending the next one to that server; `ps-audit verify` pulls the counters and compares them with the
//! log. A counter below its acknowledged count is a lost acknowledged update; one above it is a duplicate (an
//! at-least-once retry of a push whose acknowledgement was lost, or a push acknowledged just before the
//! auditor itself was killed, so never logged).
//!
//! The counters are rows of dimension 1 in table [`AUDIT_TABLE_ID`], initialized to zero, with SGD at learning
//! rate 1 on the servers; a push sends gradient `-1` (f32, `grad_scale` 1), so each acknowledged push adds
//! exactly 1 to each row it names (exact in f32 up to 2^24 per row). Every process must register the table with
//! the same [`audit_table`] spec (a different spec is refused as a conflict).
//!
//! # Layout
//! - [`log`]: the append-only acknowledgement log (survives the auditor's SIGKILL: one `write` per record).
//! - [`pusher`]: the push loop, one task per server.
//! - [`verify`]: tallies the log, pulls the counters, and compares.
//! - [`pause`]: the longest gap between two acknowledged pushes of one shard (failover or restart time).

pub mod log;
pub mod pause;
pub mod pusher;
pub mod verify;

use protocol::routing::{mix64, ShardMap};
use protocol::TableConfig;

pub use log::{Ack, AckLog, AuditError, LogHeader, Record};
pub use pause::Pause;
pub use pusher::{PushConfig, PushTotals};
pub use verify::Verdict;

/// Id of the audit table: far above the trainer's feature tables (0..26).
pub const AUDIT_TABLE_ID: u32 = 1000;

/// Largest number of counter rows per server (a push names a subset of them as a 64-bit mask).
pub const MAX_ROWS_PER_SERVER: usize = 64;

/// The audit table's config, the same in every process: dimension 1, zero-initialized, SGD with learning
/// rate 1.
pub fn audit_table() -> TableConfig {
    // Seed 0 as before `TableConfig::counter` existed: a server holding the table checks the config matches.
    TableConfig {
        name: "audit".into(),
        seed: 0,
        ..TableConfig::counter(AUDIT_TABLE_ID, 1)
    }
}

/// The counter rows: `rows_per_server` ids owned by each server, a deterministic function of the server count
/// and the row count (so every auditor process and the verifier derive the same ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRows {
    /// `per_server[s]`: the ids of the counters server `s` owns, ascending, in mask-bit order.
    pub per_server: Vec<Vec<u64>>,
}

impl AuditRows {
    /// Picks `rows_per_server` (1..=64) ids for each of `num_servers` servers.
    pub fn new(num_servers: usize, rows_per_server: usize) -> Result<AuditRows, AuditError> {
        if num_servers == 0 || !(1..=MAX_ROWS_PER_SERVER).contains(&rows_per_server) {
            return Err(AuditError::Shape {
                servers: num_servers,
                rows: rows_per_server,
            });
        }
        let map = ShardMap::new(num_servers as u32);
        let mut per_server = vec![Vec::with_capacity(rows_per_server); num_servers];
        let mut filled = 0;
        let mut k = 0u64;
        while filled < num_servers {
            let id = mix64(0xa0d1_7000_0000_0000 ^ k);
            k += 1;
            let rows = &mut per_server[map.server_of(id) as usize];
            if rows.len() < rows_per_server {
                rows.push(id);
                if rows.len() == rows_per_server {
                    filled += 1;
                }
            }
        }
        // Requests carry ids in ascending order (protocol::wire::ids).
        per_server.iter_mut().for_each(|ids| ids.sort_unstable());
        Ok(AuditRows { per_server })
    }

    /// Number of servers.
    pub fn num_servers(&self) -> usize {
        self.per_server.len()
    }

    /// Counter rows per server.
    pub fn rows_per_server(&self) -> usize {
        self.per_server[0].len()
    }

    /// The ids of server `server` selected by the bits of `mask`, in bit order.
    pub fn select(&self, server: usize, mask: u64, out: &mut Vec<u64>) {
        out.clear();
        out.extend(
            self.per_server[server]
                .iter()
                .enumerate()
                .filter(|(i, _)| mask >> i & 1 == 1)
                .map(|(_, &id)| id),
        );
    }

    /// The mask of all of server `server`'s rows.
    pub fn full_mask(&self) -> u64 {
        match self.rows_per_server() {
            64 => u64::MAX,
            n => (1u64 << n) - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_owned_by_their_server_and_deterministic() {
        let rows = AuditRows::new(3, 16).unwrap();
        let map = ShardMap::new(3);
        for (s, ids) in rows.per_server.iter().enumerate() {
            assert_eq!(ids.len(), 16);
            assert!(ids.iter().all(|&id| map.server_of(id) as usize == s));
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
        }
        assert_eq!(rows, AuditRows::new(3, 16).unwrap());
        let mut out = Vec::new();
        rows.select(1, 0b101, &mut out);
        assert_eq!(out, vec![rows.per_server[1][0], rows.per_server[1][2]]);
        assert_eq!(AuditRows::new(1, 64).unwrap().full_mask(), u64::MAX);
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(AuditRows::new(0, 4).is_err());
        assert!(AuditRows::new(2, 0).is_err());
        assert!(AuditRows::new(2, 65).is_err());
    }
}
