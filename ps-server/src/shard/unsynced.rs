//! Rows whose update is not durable yet, with `sync` durability: a push applies its rows in memory, then
//! writes them with one synced store write before it is acknowledged ([`crate::shard::storage`]). Between the
//! two, and for as long as that write fails, its rows are *held* here; a pull or a delta-sync answer that read
//! a held row waits until the write is done and reads again, so nothing reads an update that a crash could
//! still lose (read committed). A held row that stays held past [`WAIT`] (its write failed: a full disk) is
//! refused as the transient `Storage` naming it, which clients retry.
//!
//! Held rows are counted in a fixed array of buckets (a counting Bloom filter keyed by table and id): a push
//! holds with one atomic add per row and no allocation besides its bucket list, a read checks one atomic load
//! per row and only while something is held. Two rows in one bucket make a read wait for the other's write
//! too, never return an undurable row.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::metrics as m;

/// Buckets of the filter (256 KiB of counters).
const BUCKETS: usize = 1 << 16;

/// How long a read waits for held rows to become durable before it is refused (`Storage`).
pub const WAIT: Duration = Duration::from_secs(2);

/// The rows of `sync` pushes between their apply and their synced write. See the module documentation.
pub struct Unsynced {
    buckets: Box<[AtomicU32]>,
    /// Rows held now (over all buckets): reads skip the check while it is 0.
    held: AtomicU64,
    /// Signalled whenever a hold ends.
    released: Condvar,
    lock: Mutex<()>,
}

/// Rows held until this is dropped (the push's write done, or given up).
pub struct Held {
    unsynced: Arc<Unsynced>,
    buckets: Vec<u32>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({} rows)", self.buckets.len())
    }
}

fn bucket(table: u32, id: u64) -> u32 {
    (base::hash::mix64(id ^ (u64::from(table) << 48 | u64::from(table))) as usize & (BUCKETS - 1))
        as u32
}

impl Default for Unsynced {
    fn default() -> Self {
        Unsynced {
            buckets: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            held: AtomicU64::new(0),
            released: Condvar::new(),
            lock: Mutex::new(()),
        }
    }
}

impl Unsynced {
    /// Holds the rows of `parts` (`(table, ids)`), before they are applied.
    pub fn hold(self: &Arc<Self>, parts: &[(u32, &[u64])]) -> Held {
        let n: usize = parts.iter().map(|(_, ids)| ids.len()).sum();
        let mut buckets = Vec::with_capacity(n);
        for (table, ids) in parts {
            for &id in *ids {
                let b = bucket(*table, id);
                self.buckets[b as usize].fetch_add(1, Ordering::SeqCst);
                buckets.push(b);
            }
        }
        self.held.fetch_add(n as u64, Ordering::SeqCst);
        metrics::gauge!(m::UNSYNCED_ROWS).increment(n as f64);
        Held {
            unsynced: self.clone(),
            buckets,
        }
    }

    /// The first of `ids` of `table` that may be held (`None`: none is).
    pub fn first_held(&self, table: u32, ids: &[u64]) -> Option<u64> {
        if self.held.load(Ordering::SeqCst) == 0 {
            return None;
        }
        ids.iter()
            .copied()
            .find(|&id| self.buckets[bucket(table, id) as usize].load(Ordering::SeqCst) != 0)
    }

    /// Waits until none of `ids` of `table` is held or `deadline` passes; whether none is.
    pub fn wait(&self, table: u32, ids: &[u64], deadline: Instant) -> bool {
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.first_held(table, ids).is_none() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            guard = self
                .released
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Rows held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let u = &self.unsynced;
        for &b in &self.buckets {
            u.buckets[b as usize].fetch_sub(1, Ordering::SeqCst);
        }
        u.held
            .fetch_sub(self.buckets.len() as u64, Ordering::SeqCst);
        metrics::gauge!(m::UNSYNCED_ROWS).decrement(self.buckets.len() as f64);
        // Under the lock: a reader between its check and its wait cannot miss this.
        let _g = u.lock.lock().unwrap_or_else(|p| p.into_inner());
        u.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_sees_a_row_held_until_its_hold_ends() {
        let u = Arc::new(Unsynced::default());
        assert_eq!(u.first_held(1, &[5, 6]), None);
        let held = u.hold(&[(1, &[5, 7][..]), (2, &[5][..])]);
        assert_eq!(u.held(), 3);
        assert_eq!(u.first_held(1, &[6, 5]), Some(5));
        assert_eq!(u.first_held(2, &[5]), Some(5));
        let soon = Instant::now() + Duration::from_millis(1);
        assert!(!u.wait(1, &[7], soon), "held rows do not wait through");
        let waiter = {
            let u = u.clone();
            std::thread::spawn(move || u.wait(1, &[5, 7], Instant::now() + Duration::from_secs(60)))
        };
        drop(held);
        assert!(waiter.join().unwrap(), "the hold's end wakes the reader");
        assert_eq!(u.held(), 0);
        assert_eq!(u.first_held(1, &[5, 7]), None);
    }

    #[test]
    fn holds_of_one_row_count_up_and_down() {
        let u = Arc::new(Unsynced::default());
        let a = u.hold(&[(3, &[9][..])]);
        let b = u.hold(&[(3, &[9][..])]);
        drop(a);
        assert_eq!(
            u.first_held(3, &[9]),
            Some(9),
            "still held by the second push"
        );
        drop(b);
        assert_eq!(u.first_held(3, &[9]), None);
    }
}
