//! The role a replica takes when it starts. It serves `Hello` meanwhile (as `Starting`, with its persisted
//! epoch), and asks the other replicas who they are:
//!
//! 1. a primary answers: become its backup (the follower task joins it and catches up);
//! 2. an in-sync backup answers (its primary is gone, possibly this process's previous life): ask it to
//!    promote itself, then become its backup — this replica's own disk may miss acknowledged pushes the
//!    backup holds;
//! 3. otherwise a **cold start** of the shard: the starting replica with the highest persisted epoch (ties:
//!    the lowest index) becomes the primary from its own disk, at one more than every epoch it has heard of.
//!    A cold start needs **every** other replica to answer, or, once `replica-startup-wait-secs` passed, a
//!    **majority** of the shard's replicas (this one included) to: with 2 replicas that is both. A replica
//!    that cannot reach its peers (a partition, a certificate that does not carry the name it verifies)
//!    never makes itself primary by a timer; it says so (error log, [`m::REPLICA_STARTUP_BLOCKED`]) until
//!    the peers answer or an operator forces a cold start (`ps-server promote --force`, a `Promote` with
//!    `force` from the admin role: [`Shard::promote`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use protocol::wire::message::replicate::Role;
use protocol::{Request, Response};
use tokio::time::Instant;

use crate::metrics as m;
use crate::shard::Shard;

/// How often a blocked start is logged again at error level.
const BLOCKED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Whether the replicas that answered (`answered` others, of `replicas` in all) may elect a cold-start
/// primary, `waited_out` once the startup wait passed: all of them, or a strict majority after the wait.
pub fn may_cold_start(answered: usize, replicas: usize, waited_out: bool) -> bool {
    let present = answered + 1;
    present >= replicas || (waited_out && 2 * present > replicas)
}

/// Settles this replica's role; returns it. Without replicas, the primary at once.
pub async fn settle(shard: &Arc<Shard>, wait: Duration) -> Role {
    let rep = &shard.replica;
    if !rep.replicated() {
        return rep.role();
    }
    let began = Instant::now();
    let mut logged: Option<Instant> = None;
    loop {
        // An operator's forced promotion (or a peer's join) may have settled it meanwhile.
        if rep.role() != Role::Starting {
            metrics::gauge!(m::REPLICA_STARTUP_BLOCKED).set(0.0);
            return rep.role();
        }
        let census = rep.peers.census().await;
        metrics::gauge!(m::REPLICA_PEERS_ANSWERING).set(census.len() as f64);
        for (_, info) in &census {
            rep.heard_of_epoch(info.shard_epoch);
        }
        let epoch = rep.epoch();
        if let Some(&(p, info)) = census
            .iter()
            // A primary at an older epoch than this replica's was deposed while cut off and not told yet
            // (it steps down once it sees a newer primary, `backup::follow`): following it would replace
            // this replica's newer rows with its stale ones.
            .filter(|(_, i)| i.role == Role::Primary && i.shard_epoch >= epoch)
            .max_by_key(|(_, i)| i.shard_epoch)
        {
            tracing::info!(
                primary = rep.peers.name(p),
                epoch = info.shard_epoch,
                "found the shard's primary: joining as a backup"
            );
            rep.epoch
                .fetch_max(info.shard_epoch.max(epoch), Ordering::AcqRel);
            rep.step_down(None);
            metrics::gauge!(m::REPLICA_STARTUP_BLOCKED).set(0.0);
            return Role::Backup;
        }
        for &(b, _) in census
            .iter()
            .filter(|(_, i)| i.role == Role::Backup && i.in_sync)
        {
            let req = Request::Promote {
                shard_epoch: epoch,
                force: false,
            };
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
                    metrics::gauge!(m::REPLICA_STARTUP_BLOCKED).set(0.0);
                    return Role::Backup;
                }
                other => {
                    tracing::debug!(replica = b, answer = ?other, "backup did not take over yet")
                }
            }
        }
        let waited_out = began.elapsed() >= wait;
        if may_cold_start(census.len(), rep.peers.len(), waited_out) {
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
                match rep.cold_start(&shard.engine) {
                    Ok(epoch) => {
                        tracing::warn!(
                            epoch,
                            answered = census.len(),
                            of = rep.peers.len() - 1,
                            "no primary and no in-sync backup: cold start of the shard from this replica's disk"
                        );
                        metrics::gauge!(m::REPLICA_STARTUP_BLOCKED).set(0.0);
                        return Role::Primary;
                    }
                    Err(e) => tracing::error!(error = %e.message(), "cold start refused"),
                }
            }
        } else if waited_out {
            metrics::gauge!(m::REPLICA_STARTUP_BLOCKED).set(1.0);
            if logged.is_none_or(|t| t.elapsed() >= BLOCKED_LOG_EVERY) {
                logged = Some(Instant::now());
                let silent: Vec<&str> = rep
                    .peers
                    .others()
                    .filter(|r| census.iter().all(|(a, _)| a != r))
                    .map(|r| rep.peers.name(r))
                    .collect();
                tracing::error!(
                    answered = census.len(),
                    of = rep.peers.len() - 1,
                    silent = ?silent,
                    "no primary found and too few replicas answer to elect one: this replica stays \
                     starting (it refuses pushes) instead of becoming a second primary; check that the \
                     silent replicas run and that TLS with them works (errors above), or, if they are \
                     lost for good, force a cold start here with `ps-server promote --force`"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `ps-server promote --force`: asks the replica at `addr` (admin certificate of `tls_dir`) to cold-start
/// as its shard's primary; returns its new shard epoch.
pub async fn force_promote(
    addr: &str,
    tls_dir: &std::path::Path,
    server_name: Option<&str>,
    force: bool,
) -> anyhow::Result<u64> {
    let settings = super::peer::PeerSettings {
        tls_dir: tls_dir.to_owned(),
        server_name: server_name.map(str::to_owned),
        role: protocol::Role::Admin,
        ..Default::default()
    };
    let peers = super::peer::Peers::new(&[addr.to_owned()], u32::MAX, settings);
    let req = Request::Promote {
        shard_epoch: 0,
        force,
    };
    match peers
        .call(0, &req, Bytes::new(), Duration::from_secs(10))
        .await
    {
        Ok(Response::Promoted { shard_epoch }) => Ok(shard_epoch),
        Ok(Response::Error { code, message }) => {
            anyhow::bail!("{addr} refused the promotion ({code:?}): {message}")
        }
        Ok(other) => anyhow::bail!("{addr} answered {} to Promote", other.kind()),
        Err(e) => Err(anyhow::anyhow!(e).context(format!("promote {addr}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::may_cold_start;

    #[test]
    fn a_cold_start_needs_every_replica_or_a_majority_after_the_wait() {
        // Two replicas: both, always (a replica alone never starts a second primary).
        assert!(!may_cold_start(0, 2, false));
        assert!(!may_cold_start(0, 2, true));
        assert!(may_cold_start(1, 2, false));
        // Three: all at once, two after the wait, never one.
        assert!(may_cold_start(2, 3, false));
        assert!(!may_cold_start(1, 3, false));
        assert!(may_cold_start(1, 3, true));
        assert!(!may_cold_start(0, 3, true));
        // Four: three after the wait (two is not a majority).
        assert!(!may_cold_start(1, 4, true));
        assert!(may_cold_start(2, 4, true));
    }
}
