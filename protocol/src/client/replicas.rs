//! The replicas of one shard as a client sees them, and failover (`docs/replication.md`).
//!
//! A client sends a shard's pushes to the replica it believes is the primary. When a request to it fails with
//! a transient error, or the replica answers `NotPrimary`, [`PsClient::failover`] asks every replica of the
//! shard who it is (`Hello`): a primary of at least the shard epoch the client has seen is taken; otherwise
//! the first in-sync backup is asked to `Promote`. The client never takes a replica reporting an older epoch
//! than it has seen (fencing a deposed primary that came back), and it checks a freshly dialed connection to
//! the replica it uses with a `Hello` for the same reason.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::{PsClient, ServerConn};
use crate::error::ProtocolError;
use crate::transport::Dialer;
use crate::wire::message::replicate::{ReplicaInfo, Role};
use crate::wire::message::{Request, Response};

/// How long a failover waits for one replica's `Hello` or `Promote` answer.
pub const FAILOVER_CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// One shard's replicas: connections and which one is the primary.
pub(super) struct ShardReplicas<D: Dialer> {
    /// One per replica, in replica order.
    pub(super) conns: Vec<ServerConn<D>>,
    /// Index of the replica taken as primary.
    primary: AtomicUsize,
    /// Index of the replica pulls go to with `read_from_backups` (the primary when no backup is in sync).
    reader: AtomicUsize,
    /// The highest shard epoch seen.
    epoch: AtomicU64,
    /// One failover at a time per shard.
    failover: tokio::sync::Mutex<()>,
    /// Set when the client followed a shard map without this server: requests still holding it stop (and
    /// are re-routed) instead of dialing a server that is leaving.
    pub(super) retired: std::sync::atomic::AtomicBool,
}

impl<D: Dialer> ShardReplicas<D> {
    pub(super) fn new(conns: Vec<ServerConn<D>>) -> ShardReplicas<D> {
        ShardReplicas {
            conns,
            primary: AtomicUsize::new(0),
            reader: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            failover: tokio::sync::Mutex::new(()),
            retired: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The replica taken as primary.
    pub(super) fn primary(&self) -> usize {
        self.primary.load(Ordering::Acquire)
    }

    /// The replica pulls go to with `read_from_backups`.
    pub(super) fn reader(&self) -> usize {
        self.reader.load(Ordering::Acquire)
    }

    /// The highest shard epoch seen.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the shard has more than one replica.
    pub(super) fn replicated(&self) -> bool {
        self.conns.len() > 1
    }

    /// Takes replica `r` as primary at `epoch` (and as reader until a backup is picked).
    pub(super) fn take(&self, r: usize, epoch: u64) {
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        self.primary.store(r, Ordering::Release);
        self.reader.store(r, Ordering::Release);
    }

    /// Sends pulls to replica `r` (an in-sync backup), or back to the primary.
    pub(super) fn read_from(&self, r: usize) {
        self.reader.store(r, Ordering::Release);
    }

    /// Whether `info`, from replica `r`, is acceptable for what the client uses `r` for: the primary must say
    /// it is one, of at least the epoch seen; a reader may be an in-sync backup of that epoch.
    pub(super) fn check(
        &self,
        r: usize,
        info: &ReplicaInfo,
        as_reader: bool,
    ) -> Result<(), String> {
        let known = self.epoch();
        if info.shard_epoch < known {
            return Err(format!(
                "replica {r} holds shard epoch {}, the client has seen {known} (a deposed primary)",
                info.shard_epoch
            ));
        }
        match info.role {
            Role::Primary => Ok(()),
            Role::Backup if as_reader && info.in_sync => Ok(()),
            role => Err(format!(
                "replica {r} is {}{} at shard epoch {}",
                role.name(),
                if role == Role::Backup && !info.in_sync {
                    " (catching up)"
                } else {
                    ""
                },
                info.shard_epoch
            )),
        }
    }
}

/// What the replicas of a shard said to `Hello`: `(replica, info)` of those that answered.
type Census = Vec<(usize, ReplicaInfo)>;

/// The primary to take from a census: the one with the highest epoch not below `known` (ties: lowest index).
fn best_primary(census: &Census, known: u64) -> Option<(usize, u64)> {
    census
        .iter()
        .filter(|(_, i)| i.role == Role::Primary && i.shard_epoch >= known)
        .max_by_key(|(r, i)| (i.shard_epoch, std::cmp::Reverse(*r)))
        .map(|(r, i)| (*r, i.shard_epoch))
}

impl<D: Dialer> PsClient<D> {
    /// Asks replica `r` of shard `shard` who it is, once, within [`FAILOVER_CALL_TIMEOUT`].
    pub(super) async fn replica_info(
        &self,
        shard: usize,
        r: usize,
    ) -> Result<ReplicaInfo, ProtocolError> {
        let hello = crate::wire::message::hello::request();
        let (resp, _) = self
            .call_replica(shard, r, &hello, &Bytes::new(), FAILOVER_CALL_TIMEOUT)
            .await?;
        match resp {
            Response::Hello { replica, .. } => Ok(replica),
            other => Err(self.unexpected_at(shard, r, &other, "Hello")),
        }
    }

    /// Every replica's answer to `Hello`, asked concurrently.
    async fn census(&self, shard: usize) -> Census {
        let n = self.shard(shard).map_or(0, |s| s.conns.len());
        let answers =
            futures_util::future::join_all((0..n).map(|r| self.replica_info(shard, r))).await;
        answers
            .into_iter()
            .enumerate()
            .filter_map(|(r, a)| a.ok().map(|i| (r, i)))
            .collect()
    }

    /// Finds shard `shard`'s primary after replica `failed` failed a request: takes a primary of at least the
    /// known epoch, or promotes the first in-sync backup. Does nothing if another task already moved the shard
    /// away from `failed`; leaves the shard as it was when no replica can be primary now (the caller retries
    /// later). Returns whether the shard now has another primary.
    pub(super) async fn failover(&self, shard: usize, failed: usize) -> bool {
        let Ok(s) = self.shard(shard) else {
            return false;
        };
        let _one = s.failover.lock().await;
        if s.primary() != failed {
            return true;
        }
        let census = self.census(shard).await;
        let known = s.epoch();
        if let Some((r, epoch)) = best_primary(&census, known) {
            if r != failed || epoch > known {
                self.moved(shard, failed, r, epoch, "found");
                return true;
            }
            // The failed replica still says it is the primary (it answered `Hello`): retry it.
            return false;
        }
        let promote = Request::Promote {
            shard_epoch: known,
            force: false,
        };
        let mut backups: Vec<&(usize, ReplicaInfo)> = census
            .iter()
            .filter(|(_, i)| i.role == Role::Backup && i.in_sync && i.shard_epoch >= known)
            .collect();
        backups.sort_by_key(|(r, _)| *r);
        for &&(r, _) in &backups {
            match self
                .call_replica(shard, r, &promote, &Bytes::new(), FAILOVER_CALL_TIMEOUT)
                .await
            {
                Ok((Response::Promoted { shard_epoch }, _)) => {
                    self.moved(shard, failed, r, shard_epoch, "promoted");
                    return true;
                }
                Ok((other, _)) => {
                    let e = self.unexpected_at(shard, r, &other, "Promoted");
                    tracing::info!(shard, replica = r, error = %e, "backup refused to take over");
                }
                Err(e) => tracing::info!(shard, replica = r, error = %e, "promote failed"),
            }
        }
        tracing::debug!(shard, ?census, "no primary for the shard yet");
        false
    }

    fn moved(&self, shard: usize, from: usize, to: usize, epoch: u64, how: &str) {
        let Ok(s) = self.shard(shard) else { return };
        s.take(to, epoch);
        self.failovers.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            shard,
            from = %s.conns[from].addr,
            to = %s.conns[to].addr,
            epoch,
            how,
            "shard moved to another replica"
        );
    }

    /// Takes each shard's primary at connect time: every replica is asked, until one is the primary (servers
    /// may be starting and settling their roles), for up to the configured `retry_for`. With
    /// `read_from_backups`, an in-sync backup of the primary becomes the shard's reader.
    pub(super) async fn find_primaries(&self) -> Result<(), ProtocolError> {
        let start = tokio::time::Instant::now();
        for shard in 0..self.num_servers() {
            let s = self.shard(shard)?;
            let mut wait = Duration::from_millis(50);
            loop {
                let census = self.census(shard).await;
                if let Some((r, epoch)) = best_primary(&census, 0) {
                    s.take(r, epoch);
                    if self.cfg.read_from_backups {
                        let bits = census
                            .iter()
                            .find(|(c, _)| *c == r)
                            .map_or(0, |(_, i)| i.in_sync_backups);
                        if let Some(b) = (0..s.conns.len()).find(|&b| bits & (1 << b) != 0) {
                            s.read_from(b);
                        }
                    }
                    break;
                }
                if start.elapsed() + wait > self.cfg.retry_for {
                    let seen: Vec<String> = census
                        .iter()
                        .map(|(r, i)| {
                            format!("replica {r}: {} epoch {}", i.role.name(), i.shard_epoch)
                        })
                        .collect();
                    return Err(ProtocolError::Connect {
                        server: s.conns[0].addr.to_string(),
                        message: format!(
                            "shard {shard}: no replica is primary after {:.1} s ({})",
                            start.elapsed().as_secs_f64(),
                            if seen.is_empty() {
                                "none answered".to_string()
                            } else {
                                seen.join(", ")
                            }
                        ),
                    });
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(role: Role, epoch: u64) -> ReplicaInfo {
        ReplicaInfo {
            role,
            shard_epoch: epoch,
            in_sync: true,
            ..ReplicaInfo::SINGLE
        }
    }

    #[test]
    fn the_newest_primary_wins_and_older_ones_are_fenced() {
        let census = vec![
            (0, info(Role::Primary, 3)),
            (1, info(Role::Primary, 4)),
            (2, info(Role::Backup, 4)),
        ];
        assert_eq!(best_primary(&census, 0), Some((1, 4)));
        assert_eq!(best_primary(&census, 5), None);
        let only_old = vec![(0, info(Role::Primary, 3)), (1, info(Role::Backup, 4))];
        assert_eq!(best_primary(&only_old, 4), None);
    }
}
