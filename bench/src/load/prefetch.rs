//! `--prefetch-distance P`: each worker emulates a trainer that plans its batches ahead. Before it pulls its
//! batch `j` it makes sure the prefetch of its batch `j + P` has been sent (`protocol::wire::message::prefetch`: the
//! same id sections a pull of that batch sends), to every server with ids in it. Prefetches run as their own
//! tasks, never awaited on the worker's critical path, and a pull that overtakes its prefetch is the server's
//! business (it waits for the read in flight). Before the run's clock starts, [`Prefetcher::prime`] sends and
//! awaits the prefetches of batches `0..=P`, so a short run measures the steady state, not its first pulls.
//!
//! Leases: the owner is drawn per run and worker ([`owner`]), the lease is the worker's batch number `j`, and
//! `release_below` is the number of the worker's batches whose last request (the push, or the pull without
//! pushes) completed. After its last batch a worker sends every server a pure release (no tables,
//! `release_below = u64::MAX`), so nothing stays pinned until the server's deadline. A failed prefetch fails
//! the run.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use protocol::{LeaseStats, ProtocolError, PsClient};
use tokio::task::JoinHandle;

use super::workload::ServerRequests;
use crate::gen::rng::mix64;

/// What a run's prefetches did, summed over servers and workers (warm-up included; the final releases are
/// not counted as requests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchTotals {
    /// Prefetch requests sent (one per server with ids, per batch).
    pub requests: u64,
    /// The servers' counts, summed.
    pub counts: LeaseStats,
}

impl PrefetchTotals {
    /// Adds another worker's totals.
    pub fn add(&mut self, o: PrefetchTotals) {
        self.requests += o.requests;
        self.counts += o.counts;
    }
}

/// The lease owner of worker `w` in a run whose random base is `run` (distinct workers, distinct owners:
/// the mixer is a bijection).
pub fn owner(run: u64, w: usize) -> u64 {
    mix64(run ^ mix64(w as u64))
}

/// A random base for [`owner`], different for every run (clock and process id), so that two runs against
/// the same servers never share leases.
pub fn run_base() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    mix64(nanos ^ (u64::from(std::process::id()) << 32))
}

type Pending = JoinHandle<Result<LeaseStats, ProtocolError>>;

/// One worker's prefetches. Call [`Prefetcher::ahead_of`] before each pull, then [`Prefetcher::finish`] once.
pub struct Prefetcher {
    client: Arc<PsClient>,
    owner: u64,
    distance: u64,
    /// The next batch number to prefetch.
    next: u64,
    pending: VecDeque<Pending>,
    totals: PrefetchTotals,
}

impl Prefetcher {
    /// Prefetches `distance` batches ahead under `owner`.
    pub fn new(client: Arc<PsClient>, owner: u64, distance: u64) -> Prefetcher {
        Prefetcher {
            client,
            owner,
            distance,
            next: 0,
            pending: VecDeque::new(),
            totals: PrefetchTotals::default(),
        }
    }

    /// Before pulling batch `j`: sends the prefetches of batches up to `j + distance` not sent yet (all of
    /// `0..=distance` at the first call), with `release_below = completed`. `batch(k)` gives batch `k`'s
    /// per-server requests, in shard order. Also collects the prefetches that have finished; the first error
    /// among them is returned.
    pub async fn ahead_of<'a, I>(
        &mut self,
        j: u64,
        completed: u64,
        batch: impl Fn(u64) -> I,
    ) -> anyhow::Result<()>
    where
        I: IntoIterator<Item = &'a ServerRequests>,
    {
        while self.next <= j + self.distance {
            let lease = self.next;
            for (s, r) in batch(lease).into_iter().enumerate() {
                if r.rows == 0 {
                    continue;
                }
                let (client, owner) = (self.client.clone(), self.owner);
                let (counts, ids) = (r.counts.clone(), r.pull_ids.clone());
                self.pending.push_back(tokio::spawn(async move {
                    client
                        .prefetch(s, owner, lease, completed, counts, ids)
                        .await
                }));
                self.totals.requests += 1;
            }
            self.next += 1;
        }
        while self.pending.front().is_some_and(JoinHandle::is_finished) {
            let h = self.pending.pop_front().expect("front exists");
            self.collect(h).await?;
        }
        Ok(())
    }

    /// Before the run's clock starts: sends the prefetches of batches `0..=distance` and waits for them, as a
    /// trainer's plan stage in its steady state is that far ahead of its pulls (without it, a short run's
    /// first pulls, which no prefetch preceded, are its worst latencies).
    pub async fn prime<'a, I>(&mut self, batch: impl Fn(u64) -> I) -> anyhow::Result<()>
    where
        I: IntoIterator<Item = &'a ServerRequests>,
    {
        self.ahead_of(0, 0, batch).await?;
        while let Some(h) = self.pending.pop_front() {
            self.collect(h).await?;
        }
        Ok(())
    }

    async fn collect(&mut self, h: Pending) -> anyhow::Result<()> {
        let counts = h
            .await
            .context("prefetch task")?
            .with_context(|| format!("prefetch (owner {:#x})", self.owner))?;
        self.totals.counts += counts;
        Ok(())
    }

    /// After the last batch: waits for every prefetch still in flight, then releases every lease of the
    /// owner on each of `servers` servers. Returns the totals.
    pub async fn finish(mut self, servers: usize) -> anyhow::Result<PrefetchTotals> {
        while let Some(h) = self.pending.pop_front() {
            self.collect(h).await?;
        }
        for s in 0..servers {
            self.client
                .prefetch(s, self.owner, u64::MAX, u64::MAX, Vec::new(), Bytes::new())
                .await
                .with_context(|| format!("release the prefetch leases on server {s}"))?;
        }
        Ok(self.totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::wire::message::prefetch::PrefetchStats;

    #[test]
    fn owners_differ_by_worker_and_run() {
        let base = run_base();
        let owners: std::collections::HashSet<u64> = (0..64).map(|w| owner(base, w)).collect();
        assert_eq!(owners.len(), 64);
        assert_ne!(owner(1, 0), owner(2, 0));
    }

    #[test]
    fn totals_add_up() {
        let mut a = PrefetchTotals {
            requests: 2,
            counts: LeaseStats {
                rows: PrefetchStats {
                    resident: 5,
                    read_back: 1,
                    ..PrefetchStats::default()
                },
                released: 0,
            },
        };
        a.add(PrefetchTotals {
            requests: 1,
            counts: LeaseStats {
                rows: PrefetchStats {
                    resident: 1,
                    waited: 3,
                    ..PrefetchStats::default()
                },
                released: 0,
            },
        });
        assert_eq!(a.requests, 3);
        assert_eq!(
            (
                a.counts.rows.resident,
                a.counts.rows.read_back,
                a.counts.rows.waited
            ),
            (6, 1, 3)
        );
    }
}
