//! Leases on prefetched rows ([`crate::Engine::prefetch`]): who pinned which rows of which tables, until when.
//!
//! A lease is `(owner, number)`: an owner is one client's pass (a number it draws), the number a batch index.
//! A prefetch first releases its owner's leases numbered below its `release_below` (the trainer sends the
//! count of its acknowledged pushes: those batches' pulls and pushes have passed), then pins its rows under
//! its own lease with a deadline. [`crate::Engine::expire_leases`] (the server's budget timer) releases leases past
//! their deadline, so a prefetch whose batch is never pulled, or whose trainer died, cannot pin memory
//! forever. A second prefetch under the same lease (a retried request) replaces the first.
//!
//! Nothing here reads a clock: callers pass `now` in seconds (STYLE.md, "Sans-IO cores").

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::EmbeddingError;
use crate::table::{PrefetchStats, Table};

/// The rows one lease pinned, per table, and when it ends.
struct Lease {
    deadline: u64,
    parts: Vec<(Arc<Table>, Vec<u64>)>,
}

impl Lease {
    fn release(self) {
        for (table, ids) in self.parts {
            table.unpin(&ids);
        }
    }
}

/// The leases of one engine, by owner then number.
#[derive(Default)]
pub(crate) struct Leases {
    by_owner: Mutex<HashMap<u64, BTreeMap<u64, Lease>>>,
}

/// What [`crate::Engine::prefetch`] did: also the answer to a prefetch request on the wire (protocol's
/// `Response::Prefetched`, summed over servers by the client), bincode writing the fields by position.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStats {
    /// Rows, summed over tables.
    pub rows: PrefetchStats,
    /// Leases released by `release_below` (and a replaced lease of the same number).
    pub released: usize,
}

impl std::ops::AddAssign for LeaseStats {
    fn add_assign(&mut self, o: LeaseStats) {
        self.rows += o.rows;
        self.released += o.released;
    }
}

impl Leases {
    /// Releases `owner`'s leases numbered below `below`; returns how many.
    fn release_below(&self, owner: u64, below: u64) -> usize {
        let released: Vec<Lease> = {
            let mut map = self.by_owner.lock();
            let Some(leases) = map.get_mut(&owner) else {
                return 0;
            };
            let kept = leases.split_off(&below);
            let released = std::mem::replace(leases, kept);
            if leases.is_empty() {
                map.remove(&owner);
            }
            released.into_values().collect()
        };
        let n = released.len();
        released.into_iter().for_each(Lease::release);
        n
    }

    /// Stores a lease, returning the one it replaces.
    fn insert(&self, owner: u64, number: u64, lease: Lease) -> Option<Lease> {
        self.by_owner
            .lock()
            .entry(owner)
            .or_default()
            .insert(number, lease)
    }

    /// Removes and releases every lease whose deadline is at or before `now`; returns how many.
    pub(crate) fn expire(&self, now: u64) -> usize {
        let expired: Vec<Lease> = {
            let mut map = self.by_owner.lock();
            let mut expired = Vec::new();
            map.retain(|_, leases| {
                let due: Vec<u64> = leases
                    .iter()
                    .filter(|(_, l)| l.deadline <= now)
                    .map(|(&n, _)| n)
                    .collect();
                for n in due {
                    expired.extend(leases.remove(&n));
                }
                !leases.is_empty()
            });
            expired
        };
        let n = expired.len();
        expired.into_iter().for_each(Lease::release);
        n
    }

    /// Leases held now.
    pub(crate) fn len(&self) -> usize {
        self.by_owner.lock().values().map(BTreeMap::len).sum()
    }
}

impl Leases {
    /// The lease part of [`Engine::prefetch`]: `tables` are resolved and checked. Releases `owner`'s leases
    /// numbered below `release_below`, reads back the rows of each table that live only in the store and pins
    /// them under lease `(owner, lease)` until Unix time `now + pin_secs` at the latest. A failure releases
    /// what this call pinned.
    pub(crate) fn prefetch(
        &self,
        tables: Vec<(Arc<Table>, &[u64])>,
        owner: u64,
        lease: u64,
        release_below: u64,
        now: u64,
        pin_secs: u64,
    ) -> Result<LeaseStats, EmbeddingError> {
        let mut stats = LeaseStats {
            released: self.release_below(owner, release_below),
            ..LeaseStats::default()
        };
        let mut parts = Vec::new();
        let mut failure = None;
        for (table, ids) in tables {
            let mut pinned = Vec::new();
            match table.prefetch(ids, &mut pinned) {
                Ok(s) => stats.rows += s,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            if !pinned.is_empty() {
                parts.push((table, pinned));
            }
        }
        let lease_rows = Lease {
            deadline: now.saturating_add(pin_secs),
            parts,
        };
        if let Some(e) = failure {
            // Nothing stays pinned by a failed prefetch.
            lease_rows.release();
            return Err(e);
        }
        if !lease_rows.parts.is_empty() {
            if let Some(old) = self.insert(owner, lease, lease_rows) {
                old.release();
                stats.released += 1;
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests;
