//! The role a replica takes when it starts. It serves `Hello` meanwhile (as `Starting`, with its persisted
//! epoch), and asks the other replicas who they are:
//!
//! 1. a primary answers: become its backup (the follower task joins it and catches up);
//! 2. an in-sync backup answers (its primary is gone, possibly this process's previous life): ask it to
//!    promote itself, then become its backup — this replica's own disk may miss acknowledged pushes the
//!    backup holds;
//! 3. otherwise, once every replica answered (or [`STARTUP_WAIT`] passed with some silent), the starting
//!    replica with the highest persisted epoch (ties: the lowest index) becomes the primary from its own disk,
//!    at one more than every epoch it has heard of: a cold start of the shard. The wait for silent replicas is
//!    long on purpose: a peer that is only slow to answer may be the primary, and starting a second one would
//!    split the shard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::wire::replicate::Role;
use protocol::{Request, Response};

use crate::shard::Shard;

/// How long a starting replica waits for silent peers before a cold start without them.
pub const STARTUP_WAIT: Duration = Duration::from_secs(30);

/// Settles this replica's role; returns it. Without replicas, the primary at once.
pub async fn settle(shard: &Arc<Shard>) -> Role {
    let rep = &shard.replica;
    if !rep.replicated() {
        return rep.role();
    }
    let began = Instant::now();
    loop {
        let census = rep.peers.census().await;
        let epoch = rep.epoch();
        if let Some(&(p, info)) = census
            .iter()
            .filter(|(_, i)| i.role == Role::Primary)
            .max_by_key(|(_, i)| i.shard_epoch)
        {
            tracing::info!(
                primary = rep.peers.name(p),
                epoch = info.shard_epoch,
                "found the shard's primary: joining as a backup"
            );
            rep.epoch.store(
                info.shard_epoch.max(epoch),
                std::sync::atomic::Ordering::Release,
            );
            rep.step_down(None);
            return Role::Backup;
        }
        for &(b, _) in census
            .iter()
            .filter(|(_, i)| i.role == Role::Backup && i.in_sync)
        {
            let req = Request::Promote { shard_epoch: epoch };
            match rep
                .peers
                .call(b, &req, Bytes::new(), super::peer::PEER_TIMEOUT)
                .await
            {
                Ok(Response::Promoted { shard_epoch }) => {
                    tracing::info!(
                        primary = rep.peers.name(b),
                        shard_epoch,
                        "an in-sync backup took over: joining it"
                    );
                    rep.step_down(Some(shard_epoch));
                    return Role::Backup;
                }
                other => {
                    tracing::debug!(replica = b, answer = ?other, "backup did not take over yet")
                }
            }
        }
        let all_answered = census.len() + 1 == rep.peers.len();
        let out_of_time = began.elapsed() >= STARTUP_WAIT;
        if all_answered || out_of_time {
            let waiting_for_catch_up = census
                .iter()
                .any(|(_, i)| i.role == Role::Backup && i.in_sync);
            let best = census
                .iter()
                .filter(|(_, i)| i.role == Role::Starting)
                .all(|(r, i)| {
                    (epoch, std::cmp::Reverse(rep.index)) > (i.shard_epoch, std::cmp::Reverse(*r))
                });
            if best && !waiting_for_catch_up {
                let newest = census
                    .iter()
                    .map(|(_, i)| i.shard_epoch)
                    .fold(epoch, u64::max);
                tracing::warn!(
                    epoch = newest + 1,
                    answered = census.len(),
                    of = rep.peers.len() - 1,
                    "no primary and no in-sync backup: cold start of the shard from this replica's disk"
                );
                rep.become_primary(&shard.engine, newest + 1);
                return Role::Primary;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
