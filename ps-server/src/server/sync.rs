//! Answers a `SyncDeltas` ([`crate::sync`]): at once when there is something to send; otherwise, after the
//! next cut or dense publication, or at the end of the subscriber's wait (cut to
//! [`protocol::wire::message::sync::MAX_WAIT_MS`]), or at shutdown, whichever comes first. The wait holds no lock and
//! no thread: it awaits the sync state's generation counter.

use std::time::Duration;

use protocol::wire::message::sync::MAX_WAIT_MS;

use crate::metrics as m;
use crate::reply::{Refusal, Reply};
use crate::shard::handler::{SyncAsk, SyncOutcome};
use crate::shard::Shard;

/// The reply to a sync request `ask` that may wait `wait_ms` for news.
pub(super) async fn answer(shard: &Shard, ask: SyncAsk, wait_ms: u32) -> Reply {
    let wait = Duration::from_millis(u64::from(wait_ms.min(MAX_WAIT_MS)));
    // Subscribed before planning: a cut between the plan and the wait still wakes the wait.
    let mut news = shard.sync().subscribe();
    let may_wait = !wait.is_zero() && !shard.sync().closing();
    match plan(shard, ask, may_wait) {
        Ok(SyncOutcome::Reply(r)) => return r,
        Ok(SyncOutcome::UpToDate) => {}
        Err(refusal) => return refusal.into_reply(),
    }
    {
        let _waiting = Waiting::new();
        let _ = tokio::time::timeout(wait, news.changed()).await;
    }
    match plan(shard, ask, false) {
        Ok(SyncOutcome::Reply(r)) => r,
        Ok(SyncOutcome::UpToDate) => unreachable!("may_wait is false"),
        Err(refusal) => refusal.into_reply(),
    }
}

/// [`Shard::sync_deltas`], off the async workers when rows may be read back from RocksDB.
fn plan(shard: &Shard, ask: SyncAsk, may_wait: bool) -> Result<SyncOutcome, Refusal> {
    if shard.engine().spilled() {
        tokio::task::block_in_place(|| shard.sync_deltas(ask, may_wait))
    } else {
        shard.sync_deltas(ask, may_wait)
    }
}

/// Counts a waiting long-poll in [`m::SYNC_SUBSCRIBERS_WAITING`] while it lives.
struct Waiting;
impl Waiting {
    fn new() -> Waiting {
        metrics::gauge!(m::SYNC_SUBSCRIBERS_WAITING).increment(1.0);
        Waiting
    }
}
impl Drop for Waiting {
    fn drop(&mut self) {
        metrics::gauge!(m::SYNC_SUBSCRIBERS_WAITING).decrement(1.0);
    }
}
