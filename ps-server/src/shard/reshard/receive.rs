//! A destination storing a source's `MoveRows`, the map answered to `GetShardMap`, and every server's
//! answers to the coordinator's `Reshard` steps.

use std::sync::Arc;

use protocol::wire::message::reshard::{
    MapInfo, MoveHeader, ReshardPhase, ReshardStatus, ReshardStep,
};
use protocol::{ErrorCode, Response};

use super::mover::{self, Mover};
use crate::config::Durability;
use crate::metrics as m;
use crate::reply::{refuse, Refusal, Reply};
use crate::shard::replica::peer::Peers;
use crate::shard::Shard;

impl Shard {
    /// Answers `GetShardMap`.
    pub fn shard_map_info(&self) -> Result<Reply, Refusal> {
        Ok(Reply {
            header: Response::ShardMap {
                map: self.routing.info(),
            },
            payload: Vec::new(),
        })
    }

    /// Stores a source's `MoveRows` (a destination of a prepared reshard): checks that a reshard to the
    /// header's target epoch is prepared here, that the sender is another server of the current map, that
    /// every id belongs to this server under the target map (and to the sender under the current one, unless
    /// this is a standby that knows no map yet), and the sequence; then registers the tables, overwrites
    /// whole rows and marks them dirty, and writes them to the store synced before answering (not with
    /// `durability = "none"`); recorded for the delta sync at `now_us`.
    pub fn move_rows(
        &self,
        header: &MoveHeader,
        payload: &[u8],
        now_us: u64,
    ) -> Result<Reply, Refusal> {
        // Lock order: the routing state before `incoming` (as `reshard_status`).
        let current = self.routing.map();
        let mut incoming = self.routing.incoming.lock();
        let target = match &incoming.target {
            Some((map, _)) if map.epoch == header.target_epoch => map.clone(),
            Some((map, _)) => {
                return Err(refuse(
                    ErrorCode::WrongEpoch,
                    format!(
                        "rows moving to map epoch {}, this server is prepared for {} (at {})",
                        header.target_epoch, map.epoch, current.epoch
                    ),
                ))
            }
            None => {
                return Err(refuse(
                    ErrorCode::WrongEpoch,
                    format!(
                        "rows moving to map epoch {}, but no reshard is prepared on this server (at {}): \
                         moved rows are taken only between a reshard's prepare and its commit",
                        header.target_epoch, current.epoch
                    ),
                ))
            }
        };
        // The sender gives rows up: a server of the current map (a standby knows none: of either map).
        let servers = if current.epoch == 0 {
            target.num_servers
        } else {
            current.num_servers
        };
        if header.source == self.shard_index || header.source >= servers {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "moved rows from server {}: the map has servers 0..{servers} and this is server {}",
                    header.source, self.shard_index
                ),
            ));
        }
        let next = incoming.next_seq.get(&header.source).copied().unwrap_or(1);
        if header.seq == 0 || header.seq > next {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "moved rows from server {} start at message {}, expected 1..={next}: a gap",
                    header.source, header.seq
                ),
            ));
        }
        let end = header
            .seq
            .checked_add(u64::from(header.messages))
            .filter(|_| header.messages > 0)
            .ok_or_else(|| {
                refuse(
                    ErrorCode::BadRequest,
                    format!(
                        "moved rows: {} messages from message {}",
                        header.messages, header.seq
                    ),
                )
            })?;
        let (me, source) = (self.shard_index, header.source);
        let owned = |table: u32, ids: &[u64]| -> Result<(), Refusal> {
            let stray = ids.iter().find(|&&id| {
                target.server_of(id) != me
                    || (current.epoch != 0 && current.server_of(id) != source)
            });
            match stray {
                None => Ok(()),
                Some(&id) => Err(refuse(
                    ErrorCode::WrongShard,
                    format!(
                        "moved rows from server {source}: table {table} id {id} belongs to server {} now and \
                         to server {} after the move, not from {source} to {me}",
                        current.server_of(id),
                        target.server_of(id)
                    ),
                )),
            }
        };
        let now = now_us / 1_000_000;
        let (rows, parts) = self.store_whole_rows(
            "moved rows",
            (&header.new_tables, &header.tables),
            payload,
            now,
            owned,
        )?;
        // Durable before the answer: once every destination answered, the source commits and deletes the
        // rows it moved, so a destination that crashed with them only in memory would lose them for good
        // (tests/crash_points.rs). One synced write per `MoveRows`; dirty flags stay, as for a synced push.
        if self.durability != Durability::None {
            let written: Vec<(u32, &[u64])> = header
                .tables
                .iter()
                .zip(&parts)
                .map(|(t, (ids, _))| (t.table, &ids[..]))
                .collect();
            if let Err(e) = self.engine.persist(&written, true) {
                metrics::counter!(m::WRITEBACK_ERRORS_TOTAL).increment(1);
                self.writes.record_failure("synced write of moved rows", &e);
                return Err(refuse(
                    ErrorCode::Storage,
                    format!("moved rows stored in memory, not on disk: {e}"),
                ));
            }
        }
        let rows = rows as u64;
        self.sync.record(
            header
                .tables
                .iter()
                .zip(&parts)
                .map(|(t, (ids, _))| (t.table, &ids[..])),
            now_us,
        );
        incoming.next_seq.insert(header.source, end.max(next));
        incoming.rows += rows;
        metrics::counter!(m::RESHARD_ROWS_RECEIVED_TOTAL).increment(rows);
        Ok(Reply {
            header: Response::MovedRows { seq: end - 1 },
            payload: Vec::new(),
        })
    }

    /// Where this server is in a reshard.
    pub fn reshard_status(&self) -> ReshardStatus {
        let st = self.routing.read();
        let incoming = self.routing.incoming.lock();
        let (vshards_out, (rows_sent, rows_acked, _), ready) = match &st.mover {
            Some(m) => (m.vshards_out(), m.progress(), m.ready()),
            None => (0, (0, 0, true), true),
        };
        let target_epoch = st
            .mover
            .as_ref()
            .map_or(incoming.target_epoch, |m| m.target.epoch);
        ReshardStatus {
            epoch: st.map.epoch,
            phase: if target_epoch > st.map.epoch {
                ReshardPhase::Moving
            } else {
                ReshardPhase::Idle
            },
            target_epoch,
            vshards_out,
            rows_sent,
            rows_acked,
            rows_received: incoming.rows,
            ready,
        }
    }
}

/// Answers a `Reshard` step (the server loop calls this: a prepare starts tasks, a commit waits for the
/// streams).
pub async fn answer(shard: &Arc<Shard>, step: ReshardStep) -> Reply {
    let result = match step {
        ReshardStep::Prepare { target } => {
            // Rows the last reshard moved away are deleted first: this move may bring some back.
            shard.routing.cleaned().await;
            prepare(shard, &target)
        }
        ReshardStep::Status => Ok(()),
        ReshardStep::Commit { epoch } => commit(shard, epoch).await,
        ReshardStep::Abort => {
            abort(shard);
            Ok(())
        }
    };
    match result {
        Ok(()) => Reply {
            header: Response::Resharding {
                status: shard.reshard_status(),
            },
            payload: Vec::new(),
        },
        Err(r) => r.into_reply(),
    }
}

/// Prepares the move to `target`: checks it follows this server's map, expects the sources' streams, and
/// starts moving what this server loses. Preparing the same target again only answers the status.
fn prepare(shard: &Arc<Shard>, info: &MapInfo) -> Result<(), Refusal> {
    if shard.replica.replicated() {
        return Err(refuse(
            ErrorCode::Resharding,
            "this shard has replicas: live resharding of replicated shards is not supported",
        ));
    }
    let target = info
        .map()
        .map_err(|e| refuse(ErrorCode::BadRequest, e.to_string()))?;
    if info.servers.len() != target.num_servers as usize {
        return Err(refuse(
            ErrorCode::BadRequest,
            format!(
                "target map of {} servers lists {} addresses",
                target.num_servers,
                info.servers.len()
            ),
        ));
    }
    let routing = &shard.routing;
    let current = routing.map();
    let mut incoming = routing.incoming.lock();
    if incoming.target_epoch == target.epoch {
        return Ok(());
    }
    if incoming.target_epoch > current.epoch {
        return Err(refuse(
            ErrorCode::Resharding,
            format!(
                "a reshard to epoch {} is under way: commit or abort it first",
                incoming.target_epoch
            ),
        ));
    }
    // A standby (epoch 0) takes any target; others only the next epoch.
    if current.epoch != 0 && target.epoch != current.epoch + 1 {
        return Err(refuse(
            ErrorCode::WrongEpoch,
            format!(
                "target map epoch {}, this server is at {}: expected {}",
                target.epoch,
                current.epoch,
                current.epoch + 1
            ),
        ));
    }
    incoming.target_epoch = target.epoch;
    incoming.target = Some((target.clone(), info.servers.clone()));
    incoming.next_seq.clear();
    incoming.rows = 0;
    drop(incoming);
    if current.epoch == 0 {
        // A standby holds no rows to move.
        tracing::info!(epoch = target.epoch, "standby prepared: receiving rows");
        return Ok(());
    }
    let peers = Peers::new(&info.servers, shard.shard_index, routing.peers.clone());
    // Tables registered from here on are queued by the register handler; these go first.
    let tables = shard.engine.registered_tables();
    match Mover::new(
        &current,
        shard.shard_index,
        (target.clone(), info.servers.clone()),
        tables,
        peers,
    ) {
        Some(m) => {
            let m = Arc::new(m);
            tracing::info!(
                epoch = target.epoch,
                vshards = m.vshards_out(),
                "reshard prepared: moving rows out"
            );
            routing.set_mover(Some(m.clone()));
            // A table registered between the list above and now is queued here (registering twice is
            // harmless); from now on the register handler queues new ones.
            m.tables_registered(shard.engine.registered_tables());
            mover::start(shard, m);
        }
        None => tracing::info!(
            epoch = target.epoch,
            "reshard prepared: nothing leaves this server"
        ),
    }
    Ok(())
}

/// Commits the target of `epoch`: a source through [`mover::commit`], others by switching maps.
async fn commit(shard: &Arc<Shard>, epoch: u64) -> Result<(), Refusal> {
    let routing = &shard.routing;
    let mover = routing.read().mover.clone();
    if let Some(m) = mover {
        if m.target.epoch != epoch {
            return Err(refuse(
                ErrorCode::Resharding,
                format!(
                    "commit of epoch {epoch}, the move under way is to {}",
                    m.target.epoch
                ),
            ));
        }
        mover::commit(shard, m).await?;
    } else if routing.map().epoch != epoch {
        let target = {
            let incoming = routing.incoming.lock();
            match &incoming.target {
                Some((map, servers)) if map.epoch == epoch => (map.clone(), servers.clone()),
                _ => {
                    return Err(refuse(
                        ErrorCode::Resharding,
                        format!(
                            "commit of epoch {epoch}, but this server was prepared for {}",
                            incoming.target_epoch
                        ),
                    ))
                }
            }
        };
        routing
            .switch(&shard.engine, target.0, target.1)
            .map_err(|e| refuse(ErrorCode::Storage, e))?;
    }
    let mut incoming = routing.incoming.lock();
    incoming.target = None;
    Ok(())
}

/// Gives a prepared reshard up: stops the move (rows already copied stay on the destinations, which do
/// not own them) and forgets the target. A committed map stays.
fn abort(shard: &Arc<Shard>) {
    let routing = &shard.routing;
    let mover = routing.read().mover.clone();
    if let Some(m) = mover {
        if routing.map().epoch == m.target.epoch {
            // Already switched: the commit must finish, not be undone.
            return;
        }
        m.stop();
    }
    routing.set_mover(None);
    let current = routing.map().epoch;
    let mut incoming = routing.incoming.lock();
    if incoming.target_epoch > current {
        tracing::warn!(target = incoming.target_epoch, "reshard aborted");
        incoming.target_epoch = current;
    }
    incoming.target = None;
}
