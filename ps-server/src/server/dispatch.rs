//! The one dispatch of a decoded request: authorize it by the connection's role, then run it the way its kind
//! needs. Every transport answers through [`answer`]: the QUIC and TCP connection loops
//! ([`super::connection`]) and the in-memory cluster of tests (`crate::testing`).
//!
//! What a request *does* is decided by the shard's handler ([`Shard::handle_us`] and the methods it calls);
//! what is decided here is only *how it runs*: inline on an async worker, off the workers (it may block on
//! RocksDB or an fsync), or awaited (it waits for other parties: the delta sync's long poll, the trainers of
//! a reduce step, a push's backups, a reshard's streams).

use std::sync::Arc;

use bytes::Bytes;
use protocol::{Access, Request, Response};
use tokio::runtime::{Handle, RuntimeFlavor};

use crate::config::Durability;
use crate::reply::Refusal;
use crate::shard::handler::{authorize, SyncAsk};
use crate::shard::Shard;

/// Answers `req` (with its `payload`) for a connection with `access`, at Unix time `now_us`.
pub(crate) async fn answer(
    shard: &Arc<Shard>,
    access: &Access,
    req: Request,
    payload: Bytes,
    now_us: u64,
) -> (Response, Bytes) {
    if let Err(refusal) = authorize(access, &req) {
        let reply = refusal.into_reply();
        return (reply.header, Bytes::new());
    }
    let reply = match req {
        // A sync long-poll waits for the next cut.
        Request::SyncDeltas {
            cursor,
            encoding,
            max_rows,
            wait_ms,
            dense_version,
        } => {
            let ask = SyncAsk {
                cursor,
                encoding,
                max_rows,
                dense_version,
            };
            super::sync::answer(shard, ask, wait_ms).await
        }
        // A reduce waits for the other trainers of its step.
        Request::Reduce { header } => return super::reduce::answer(shard, header, &payload).await,
        // A join starts the stream tasks, which hold the shard.
        Request::Join {
            shard_epoch,
            replica_index,
            session,
        } => shard
            .join(shard_epoch, replica_index, session)
            .unwrap_or_else(Refusal::into_reply),
        // A reshard step may start tasks (prepare) or wait for streams (commit).
        Request::Reshard { step } => crate::shard::reshard::receive::answer(shard, step).await,
        // A push (and a write of rows) waits for its backups in `replicated` durability (and for an fsync in `sync`, or for
        // read-backs once a table has evicted rows).
        req @ (Request::Push { .. } | Request::WriteRows { .. }) => {
            let blocking = shard.durability() == Durability::Sync || shard.engine().spilled();
            let (reply, pending) =
                off_workers(blocking, || shard.handle_replicated(req, &payload, now_us));
            if let Some(pending) = pending {
                pending.settle().await;
            }
            reply
        }
        // A new table creates a column family on disk; the role decides the limits.
        Request::RegisterTables { tables } => {
            off_workers(true, || shard.register_as(access, &tables))
        }
        req => {
            let blocking = may_block(&req, shard);
            off_workers(blocking, || shard.handle_us(req, &payload, now_us))
        }
    };
    (reply.header, Bytes::from(reply.payload))
}

/// Whether a request answered by [`Shard::handle_us`] may block: flushes, checkpoints and moved rows touch
/// the disk; a prefetch reads RocksDB, and so may pulls once a table has evicted rows (read-backs, or waits
/// for a prefetch's; DESIGN.md, "Tier with lookahead prefetch").
fn may_block(req: &Request, shard: &Shard) -> bool {
    match req {
        Request::Flush
        | Request::Checkpoint { .. }
        | Request::MoveRows { .. }
        | Request::Prefetch { .. } => true,
        // With `sync` durability a pull may wait for a push's synced write (`crate::shard::unsynced`).
        Request::Pull { .. } | Request::PullWithState { .. } => {
            shard.engine().spilled() || shard.durability() == crate::config::Durability::Sync
        }
        _ => false,
    }
}

/// Runs `f` off the async workers when it may block (`tokio::task::block_in_place`), inline otherwise. A
/// current-thread runtime (the in-memory cluster of tests, under a paused clock) has no other worker to hand
/// its tasks to, so there `f` runs inline.
fn off_workers<R>(blocking: bool, f: impl FnOnce() -> R) -> R {
    if blocking && Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}
