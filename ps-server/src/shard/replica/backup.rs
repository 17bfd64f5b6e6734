//! A backup's side of replication: storing its primary's `Replicate` messages in order, and the follower task
//! that finds the primary, joins it, and joins again when the stream stops while the primary lives on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use protocol::wire::message::replicate::{self, ReplicateHeader, ReplicateKind, Role};
use protocol::{ErrorCode, Request, Response};

use super::Replica;
use crate::metrics as m;
use crate::reply::{refuse, Refusal, Reply};
use crate::shard::Shard;

/// A backup that heard nothing from its primary for this long looks for the primary again.
pub const SILENCE: Duration = Duration::from_millis(1500);

/// Where a backup's current stream stands.
#[derive(Debug, Default)]
pub struct StreamState {
    /// The join session the stream must carry.
    pub session: u64,
    /// Sequence number of the next message.
    pub next_seq: u64,
}

impl Shard {
    /// Stores a `Replicate` request's rows (a backup): checks role, epoch, session and sequence, registers the
    /// new tables, stores every table's rows, and marks the backup in sync at the end of its catch-up.
    pub fn replicate(
        &self,
        header: &ReplicateHeader,
        payload: &[u8],
        now: u64,
    ) -> Result<Reply, Refusal> {
        let rep = &self.replica;
        let epoch = rep.epoch();
        if header.shard_epoch < epoch {
            return Err(refuse(
                ErrorCode::StaleEpoch,
                format!(
                    "replicate from shard epoch {}, this replica holds epoch {epoch}: the sender was deposed",
                    header.shard_epoch
                ),
            ));
        }
        if rep.role() != Role::Backup {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("replicate sent to a {} replica", rep.role().name()),
            ));
        }
        let mut stream = rep.stream.lock();
        if stream.session == 0 {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "replicate of session {:#x}: this backup has not joined a primary",
                    header.session
                ),
            ));
        }
        super::check_epoch_lead("a replicate stream", header.shard_epoch, epoch)?;
        if header.session != stream.session {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "replicate of session {:#x}, this backup joined under session {:#x}",
                    header.session, stream.session
                ),
            ));
        }
        if header.seq != stream.next_seq {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "replicate message {}, expected {}: a gap in the stream",
                    header.seq, stream.next_seq
                ),
            ));
        }
        let (rows, _) = self.store_whole_rows(
            "replicate",
            (&header.new_tables, &header.tables),
            payload,
            now,
            |_, _| Ok(()),
        )?;
        // The answers of the pushes whose rows these are: a client's retry of one of them, after a failover
        // to this replica, gets its answer instead of a second application.
        self.pushes.remember(&header.pushes);
        stream.next_seq += u64::from(header.messages);
        rep.heard();
        if header.shard_epoch > epoch {
            rep.adopt_epoch(&self.engine, header.shard_epoch);
        }
        if header.kind == ReplicateKind::CaughtUp && !rep.in_sync.swap(true, Ordering::AcqRel) {
            tracing::info!(
                epoch = header.shard_epoch,
                "caught up with the primary: in sync"
            );
            metrics::gauge!(m::REPLICA_IN_SYNC).set(1.0);
        }
        metrics::counter!(m::REPLICATION_ROWS_STORED_TOTAL).increment(rows as u64);
        Ok(Reply {
            header: Response::Replicated {
                seq: stream.next_seq - 1,
            },
            payload: Vec::new(),
        })
    }
}

/// The follower task of a backup: while this replica is a backup, make sure it is joined to the primary.
/// Runs until `stop`.
pub async fn follow(shard: Arc<Shard>, stop: tokio_util::sync::CancellationToken) {
    let rep = &shard.replica;
    let mut wait = Duration::from_millis(100);
    loop {
        let pause = match rep.role() {
            Role::Primary => {
                rep.links.record_lag();
                rep.record_durability();
                if rep.links.in_sync_bits() == 0 {
                    step_down_if_deposed(rep).await;
                }
                Duration::from_millis(500)
            }
            Role::Starting => Duration::from_millis(200),
            Role::Backup => match follow_once(rep).await {
                Ok(()) => {
                    wait = Duration::from_millis(100);
                    Duration::from_millis(250)
                }
                Err(why) => {
                    tracing::debug!(why, "backup not joined yet");
                    wait = (wait * 2).min(Duration::from_secs(1));
                    wait
                }
            },
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = rep.changed.notified() => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// A primary without an in-sync backup (it may have been cut off while the others promoted one) asks the
/// other replicas: if one is primary at a newer shard epoch, this one was deposed and never told (its backups
/// dropped as unreachable, nobody streams to it), so it steps down and, as a backup, joins the newer primary,
/// whose catch-up replaces its rows. Found by `scripts/bench/chaos.sh --partition-faults`: such a stale
/// primary was later followed by a restarted replica, and the pushes the newer primary had acknowledged were
/// lost.
async fn step_down_if_deposed(rep: &Replica) {
    let epoch = rep.epoch();
    let census = rep.peers.census().await;
    let newer = census
        .iter()
        .filter(|(_, i)| i.role == Role::Primary && i.shard_epoch > epoch)
        .max_by_key(|(_, i)| i.shard_epoch);
    if let Some(&(p, info)) = newer {
        if rep.role() != Role::Primary || rep.epoch() != epoch {
            return;
        }
        tracing::warn!(
            primary = rep.peers.name(p),
            their_epoch = info.shard_epoch,
            our_epoch = epoch,
            "another replica is primary at a newer shard epoch: stepping down"
        );
        rep.heard_of_epoch(info.shard_epoch);
        rep.step_down(None);
    }
}

/// One look at the stream: nothing to do while it flows; otherwise find the primary and join it (a
/// primary that no longer lists this backup as in sync after a silence means the stream was dropped).
async fn follow_once(rep: &Replica) -> Result<(), String> {
    let joined = rep.stream.lock().session != 0;
    if joined && rep.heard_within(SILENCE) {
        return Ok(());
    }
    let census = rep.peers.census().await;
    let epoch = rep.epoch();
    let primary = census
        .iter()
        .filter(|(_, i)| i.role == Role::Primary && i.shard_epoch >= epoch)
        .max_by_key(|(_, i)| i.shard_epoch);
    let Some(&(p, info)) = primary else {
        // The primary is gone (or not known yet): stay as we are; an in-sync backup waits to be promoted.
        return Err(format!("no primary among {} answers", census.len()));
    };
    if joined && rep.in_sync.load(Ordering::Acquire) && info.in_sync_backups & (1 << rep.index) != 0
    {
        // Quiet, but the primary still counts us in sync.
        return Ok(());
    }
    let session = crate::sync::draw_incarnation();
    {
        let mut stream = rep.stream.lock();
        stream.session = session;
        stream.next_seq = 1;
    }
    rep.set_out_of_sync();
    let req = Request::Join {
        shard_epoch: epoch,
        replica_index: rep.index,
        session,
    };
    match rep
        .peers
        .call(p, &req, Bytes::new(), super::peer::PEER_TIMEOUT)
        .await
    {
        Ok(Response::Joined { shard_epoch }) => {
            tracing::info!(
                primary = rep.peers.name(p),
                shard_epoch,
                session,
                "joined the primary"
            );
            rep.heard();
            Ok(())
        }
        Ok(other) => Err(format!("join answered {other:?}")),
        Err(e) => Err(format!("join failed: {e}")),
    }
}

impl Shard {
    /// Decodes a payload of whole rows ([`replicate::decode`]: a `Replicate` or a `MoveRows`), registers
    /// `new_tables`, checks each table's row length and stores every row as it is, dirty. Returns the rows
    /// stored and the decoded (ids, rows) of each table. `what` names the request in errors; `check` sees
    /// every table's ids before anything is registered or stored, and may refuse the whole request.
    pub(crate) fn store_whole_rows(
        &self,
        what: &str,
        (new_tables, tables): (&[protocol::TableConfig], &[replicate::RowsTable]),
        payload: &[u8],
        now: u64,
        check: impl Fn(u32, &[u64]) -> Result<(), Refusal>,
    ) -> Result<(usize, Vec<replicate::TableRows>), Refusal> {
        let parts = replicate::decode(tables, payload)?;
        for (t, (ids, _)) in tables.iter().zip(&parts) {
            check(t.table, ids)?;
        }
        for cfg in new_tables {
            self.engine.register_table(cfg.clone())?;
        }
        let mut rows = 0;
        for (t, (ids, values)) in tables.iter().zip(&parts) {
            let table = self.engine.table(t.table)?;
            if table.row_len() != t.row_len as usize {
                return Err(refuse(
                    ErrorCode::WrongDimension,
                    format!(
                        "{what}: table {} rows of {} f32s, this server's rows have {}",
                        t.table,
                        t.row_len,
                        table.row_len()
                    ),
                ));
            }
            self.engine.store_rows(t.table, ids, values, now)?;
            rows += ids.len();
        }
        Ok((rows, parts))
    }
}
