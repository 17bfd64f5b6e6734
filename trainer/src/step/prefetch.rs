//! Lookahead prefetch (DESIGN.md, "Tier with lookahead prefetch"): as soon as the plan thread has planned a
//! batch, its ids go to every server that owns some of them as a `Prefetch` ([`protocol::wire::message::prefetch`]), so a
//! server whose tables spill to RocksDB reads the batch's evicted rows back while earlier batches compute, and
//! keeps them pinned until this trainer's pushes pass them. The distance is the plan queue's depth
//! (`--prefetch-distance` batches ahead of the pull).
//!
//! Leases: this pass draws an owner number; a batch's lease is its index in the pass; each prefetch releases
//! the leases of batches whose pushes are all acknowledged (the pass's [`crate::train`] acknowledgement
//! prefix). [`Prefetcher::finish`] waits for the prefetches in flight and releases the rest.
//!
//! A prefetch is a hint: a failed one is logged and counted, and the pull then reads the rows itself. A server
//! that answers that none of its tables has a memory budget, or refuses a prefetch (a batch larger than its
//! pin limit), is not asked again in this pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use protocol::transport::{Dialer, NetDialer};
use protocol::PsClient;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::metrics as m;
use protocol::plan::Plan;

/// Sends the prefetches of one pass.
pub struct Prefetcher<D: Dialer = NetDialer> {
    client: Arc<PsClient<D>>,
    runtime: Handle,
    owner: u64,
    /// Pushes `0..n` of the pass are acknowledged: their leases may go.
    acked: watch::Receiver<u64>,
    /// Per server: not asked again this pass (no table with a memory budget, or it refused a prefetch).
    untiered: Arc<Vec<AtomicBool>>,
    tasks: Mutex<JoinSet<()>>,
}

impl<D: Dialer> Prefetcher<D> {
    /// A prefetcher for one pass of a trainer on `client`'s servers, spawning its requests on `runtime`, with
    /// lease owner `owner` (unique among the cluster's trainers and passes) and the pass's acknowledgement
    /// prefix `acked`.
    pub fn new(
        client: Arc<PsClient<D>>,
        runtime: Handle,
        owner: u64,
        acked: watch::Receiver<u64>,
    ) -> Prefetcher<D> {
        let untiered = (0..client.num_servers())
            .map(|_| AtomicBool::new(false))
            .collect();
        Prefetcher {
            client,
            runtime,
            owner,
            acked,
            untiered: Arc::new(untiered),
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// A lease owner number for rank `rank`: the time and process id mixed, so trainers and passes differ.
    pub fn draw_owner(rank: usize) -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let seed = nanos ^ (u64::from(std::process::id()) << 32) ^ (rank as u64).rotate_left(48);
        base::rng::SplitMix64::new(seed).next_u64()
    }

    /// Whether server `s` is not asked again this pass (servers a live reshard added are asked).
    fn skips(&self, s: usize) -> bool {
        self.untiered
            .get(s)
            .is_some_and(|u| u.load(Ordering::Relaxed))
    }

    /// Sends the prefetch of the pass's batch `lease` (planned as `plan`) to every server with work for it,
    /// without waiting for the answers. Callable from any thread.
    pub fn send(&self, lease: u64, plan: &Plan) {
        let release_below = *self.acked.borrow();
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        while tasks.try_join_next().is_some() {}
        for s in 0..plan.servers() {
            if !plan.has_work(s) || self.skips(s) {
                continue;
            }
            let (counts, ids) = plan.pull_request(s);
            let sent: u64 = counts.iter().map(|c| u64::from(c.count)).sum();
            let (client, untiered, owner) =
                (self.client.clone(), self.untiered.clone(), self.owner);
            tasks.spawn_on(
                async move {
                    metrics::counter!(m::PREFETCH_REQUESTS_TOTAL).increment(1);
                    let reply = client
                        .prefetch(s, owner, lease, release_below, counts, Bytes::from(ids))
                        .await;
                    match reply {
                        Ok(stats) => {
                            metrics::counter!(m::PREFETCH_ROWS_READ_BACK_TOTAL)
                                .increment(stats.rows.read_back as u64);
                            if stats.rows.untiered as u64 == sent {
                                skip(&untiered, s);
                                tracing::debug!(server = s, "no memory budget on this server: prefetch off for it");
                            }
                        }
                        Err(e) => {
                            metrics::counter!(m::PREFETCH_ERRORS_TOTAL).increment(1);
                            // A refusal (say, more rows than the server's pin limit) would repeat for every
                            // batch: stop asking that server for this pass. A transient failure may not.
                            let refused = !e.is_transient();
                            if refused {
                                skip(&untiered, s);
                            }
                            tracing::warn!(server = s, lease, error = %e, stopped = refused, "prefetch failed; the pull reads its rows itself");
                        }
                    }
                },
                &self.runtime,
            );
        }
    }

    /// Waits for the prefetches in flight, then releases every lease of this pass on every server that has a
    /// budget. A failed release is logged: the servers end the leases at their deadline anyway.
    pub async fn finish(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        while tasks.join_next().await.is_some() {}
        for s in 0..self.client.num_servers() {
            if self.skips(s) {
                continue;
            }
            let released = self
                .client
                .prefetch(s, self.owner, u64::MAX, u64::MAX, Vec::new(), Bytes::new())
                .await;
            if let Err(e) = released {
                tracing::warn!(server = s, error = %e, "releasing the pass's prefetch leases failed; they end at the server's deadline");
            }
        }
    }
}

/// Stops asking server `s` this pass (a server a live reshard added has no flag: it stays asked).
fn skip(untiered: &[AtomicBool], s: usize) {
    if let Some(u) = untiered.get(s) {
        u.store(true, Ordering::Relaxed);
    }
}
