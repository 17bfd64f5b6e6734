//! Write-back of dirty rows to RocksDB: on a timer, on a flush request, and at shutdown.
//!
//! Rows are written in WriteBatches by [`embedding::Engine::flush_dirty`]; losses after a crash are bounded by
//! the timer's interval (DESIGN.md, "RocksDB").

use std::sync::Arc;
use std::time::{Duration, Instant};

use embedding::{EmbeddingError, Engine, FlushStats};
use tokio_util::sync::CancellationToken;

use crate::handler::Shard;
use crate::metrics as m;

/// Writes every dirty row now, recording metrics, and refreshes the memory gauges.
pub fn flush(engine: &Engine) -> Result<FlushStats, EmbeddingError> {
    let start = Instant::now();
    let result = engine.flush_dirty();
    match &result {
        Ok(stats) => {
            metrics::histogram!(m::WRITEBACK_SECONDS).record(start.elapsed().as_secs_f64());
            metrics::counter!(m::WRITEBACK_ROWS_TOTAL).increment(stats.rows as u64);
            metrics::counter!(m::WRITEBACK_BATCHES_TOTAL).increment(stats.batches as u64);
            if stats.rows > 0 {
                tracing::debug!(
                    rows = stats.rows,
                    batches = stats.batches,
                    bytes = stats.bytes,
                    "wrote back dirty rows"
                );
            }
        }
        Err(e) => {
            metrics::counter!(m::WRITEBACK_ERRORS_TOTAL).increment(1);
            tracing::error!(error = %e, "write-back of dirty rows failed");
        }
    }
    update_gauges(engine);
    result
}

/// Sets the rows-in-memory and memory-bytes gauges.
pub fn update_gauges(engine: &Engine) {
    for cfg in engine.tables() {
        if let Ok(t) = engine.table(cfg.id) {
            metrics::gauge!(m::ROWS_IN_MEMORY, "table" => cfg.name.clone()).set(t.len() as f64);
        }
        if let Ok(rows) = engine.store().estimate_rows(cfg.id) {
            metrics::gauge!(m::ROWS_ON_DISK, "table" => cfg.name.clone()).set(rows as f64);
        }
    }
    metrics::gauge!(m::MEMORY_BYTES).set(engine.memory_bytes() as f64);
}

/// Flushes every `interval` until `stop` is cancelled. A zero interval only refreshes gauges.
pub async fn run_timer(shard: Arc<Shard>, interval: Duration, stop: CancellationToken) {
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
        }
        let shard = shard.clone();
        let flush_now = !interval.is_zero();
        let _ = tokio::task::spawn_blocking(move || {
            if flush_now {
                let _ = flush(&shard.engine);
            } else {
                update_gauges(&shard.engine);
            }
        })
        .await;
    }
}
