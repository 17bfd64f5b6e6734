//! The server's background tasks besides serving requests: the write-back timer (which probes storage while
//! writes fail, [`crate::write_health`]), the expiry of rows past their TTL, eviction under a memory
//! budget, and the delta sync's cuts ([`crate::sync`]). Each runs the shard's blocking storage operations on a blocking thread, with the time read here and
//! passed in, until [`Background::stop`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Durability, ServerConfig};
use crate::metrics as m;
use crate::shard::Shard;
use crate::write_health::PROBE_PERIOD;
use crate::writeback;

/// Background tasks sharing one stop signal. Call order: [`Background::new`], [`Background::spawn`] any
/// number of times, [`Background::stop`] once.
pub(super) struct Background {
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Background {
    /// No tasks yet.
    pub(super) fn new() -> Background {
        Background {
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    /// Spawns the task `task` makes from the stop signal (it must return once the token is cancelled).
    pub(super) fn spawn<F>(&self, task: impl FnOnce(CancellationToken) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task(self.stop.clone()));
    }

    /// Signals every task to stop and waits until they have.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Spawns the timers `cfg` asks for: write-back (gauges only with `durability = "none"`), expiry (always: a
/// table registered later may carry its own TTL; a pass over tables without one visits no row), eviction with a
/// memory budget.
pub(super) fn spawn_timers(cfg: &ServerConfig, shard: &Arc<Shard>, background: &Background) {
    // Durability `none`: the timer only refreshes gauges (a zero interval), and shutdown writes nothing.
    let interval = if cfg.durability != Durability::None {
        cfg.flush_interval
    } else {
        Duration::ZERO
    };
    tracing::info!(durability = ?cfg.durability, flush_interval = ?cfg.flush_interval, "durability");
    background.spawn(|stop| run_write_back_timer(shard.clone(), interval, stop));
    tracing::info!(
        ttl_secs = ?cfg.row_ttl_secs,
        interval = ?cfg.expire_interval,
        admission = ?cfg.admission,
        "row expiry"
    );
    let interval = cfg.expire_interval;
    background.spawn(|stop| run_expiry_timer(shard.clone(), interval, stop));
    if !cfg.sync_interval.is_zero() {
        tracing::info!(interval = ?cfg.sync_interval, retain_rows = cfg.sync_retain_rows, incarnation = shard.sync().incarnation, "delta sync");
        let interval = cfg.sync_interval;
        background.spawn(|stop| run_sync_timer(shard.clone(), interval, stop));
    }
    if let Some(rows) = cfg.memory_budget_rows {
        tracing::info!(rows, "memory budget per table");
        background.spawn(|stop| run_budget_timer(shard.clone(), stop));
    }
}

/// Runs [`writeback::expire`] every `interval` (and once at the start, which starts the TTL of recovered rows)
/// until `stop` is cancelled.
async fn run_expiry_timer(shard: Arc<Shard>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let shard = shard.clone();
        let _ = tokio::task::spawn_blocking(move || {
            // Deleted rows reach serving as deletions: the delta sync sends each recorded id whose row is
            // gone as one (crate::sync, "What counts as a change").
            let sync = shard.sync();
            writeback::expire(shard.engine(), super::unix_secs(), &mut |table, ids| {
                sync.record([(table, ids)], super::unix_us())
            })
        })
        .await;
    }
}

/// Cuts a delta of the rows changed since the last cut ([`crate::sync::SyncState::cut`]) every `interval`
/// until `stop` is cancelled; the sort runs on a blocking thread.
async fn run_sync_timer(shard: Arc<Shard>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let shard = shard.clone();
        let _ = tokio::task::spawn_blocking(move || shard.sync().cut(super::unix_us())).await;
    }
}

/// Period of the memory-budget check when the server has a budget: a check under budget costs a few atomic
/// loads, and a short period bounds how far pushes grow a table past its budget.
const BUDGET_CHECK_PERIOD: Duration = Duration::from_millis(200);

/// Every [`BUDGET_CHECK_PERIOD`] until `stop` is cancelled: releases prefetch leases past their deadline,
/// refreshes the pin gauges, and evicts rows over the memory budget ([`Shard::enforce_budget`]).
async fn run_budget_timer(shard: Arc<Shard>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(BUDGET_CHECK_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let expired = shard.engine().expire_leases(super::unix_secs());
        if expired > 0 {
            metrics::counter!(m::PREFETCH_LEASES_EXPIRED_TOTAL).increment(expired as u64);
            tracing::debug!(leases = expired, "prefetch leases expired unreleased");
        }
        metrics::gauge!(m::PINNED_ROWS).set(shard.engine().pinned_rows() as f64);
        metrics::gauge!(m::PREFETCH_LEASES).set(shard.engine().leases() as f64);
        let over = shard.engine().rows_over_budget();
        metrics::gauge!(m::ROWS_OVER_BUDGET).set(over as f64);
        if over == 0 {
            continue;
        }
        let shard = shard.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let _ = shard.enforce_budget();
            metrics::gauge!(m::ROWS_OVER_BUDGET).set(shard.engine().rows_over_budget() as f64);
        })
        .await;
    }
}

/// Writes dirty rows back every `interval` until `stop` is cancelled; while storage writes fail, probes
/// instead, every [`PROBE_PERIOD`]. A zero interval only refreshes gauges.
async fn run_write_back_timer(shard: Arc<Shard>, interval: Duration, stop: CancellationToken) {
    let period = if interval.is_zero() {
        Duration::from_secs(5)
    } else {
        interval
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            // While storage writes fail, probe sooner than the write-back period (crate::write_health).
            _ = shard.writes().failed() => {}
            _ = tokio::time::sleep(PROBE_PERIOD), if shard.writes().is_failing() => {}
        }
        let shard = shard.clone();
        let flush_now = !interval.is_zero();
        let _ = tokio::task::spawn_blocking(move || {
            if shard.writes().is_failing() {
                shard.probe_writes(super::unix_secs());
            } else if flush_now {
                let _ = shard.write_back("write-back");
            } else {
                writeback::update_gauges(shard.engine());
            }
        })
        .await;
    }
}
