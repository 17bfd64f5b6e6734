//! Whether storage writes work, and the refusal of pushes while they do not.
//!
//! A failed RocksDB write (a full disk, an I/O error) anywhere the server writes rows (the write-back timer, a
//! flush request, a synced push, an eviction) marks the server *write-refusing*: pushes are answered with
//! [`protocol::ErrorCode::Storage`] naming the failed write (clients retry transient codes with backoff), pulls keep
//! being served from memory, `/readyz` answers 503 with the reason, and `ps_storage_writes_failing` is 1.
//!
//! Why refuse pushes rather than keep applying them in memory: every push applied while writes fail is an
//! update the server acknowledges but cannot make durable, so in `sync` it would break the durability promise
//! and in `periodic` it would grow the loss bound without limit. Refusing makes the fault visible to trainers.
//!
//! Recovery: while refusing, the write-back timer probes every [`PROBE_PERIOD`]
//! ([`crate::shard::Shard::probe_writes`]): it writes every dirty row back (not with `durability = "none"`) and
//! then a small synced metadata write ([`PROBE_KEY`]). The first probe that succeeds clears the state, and
//! pushes are accepted again. Any later successful write-back clears it too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::metrics as m;

/// How often a write-refusing server retries a write to find out whether storage works again.
pub const PROBE_PERIOD: Duration = Duration::from_secs(1);

/// The metadata key the recovery probe writes.
pub const PROBE_KEY: &str = "health/write-probe";

/// The server's storage write state, shared by the handler (refusing pushes), the write-back timer (probing)
/// and `/readyz` (reporting).
#[derive(Debug, Default)]
pub struct WriteHealth {
    failing: AtomicBool,
    reason: Mutex<String>,
    /// Wakes the write-back timer when writes start failing, so it probes without waiting a full period.
    failed: tokio::sync::Notify,
}

impl WriteHealth {
    /// Records a failed write: `what` names the operation (e.g. `"write-back"`), `error` the store's error.
    pub fn record_failure(&self, what: &str, error: &dyn std::fmt::Display) {
        let reason = format!("{what} failed: {error}");
        let was = self.failing.swap(true, Ordering::SeqCst);
        if !was {
            tracing::error!(%reason, "storage writes failing: refusing pushes until a write succeeds");
            self.failed.notify_one();
        }
        *self.reason.lock().expect("not poisoned") = reason;
        metrics::gauge!(m::STORAGE_WRITES_FAILING).set(1.0);
    }

    /// Records a successful write; clears a failing state.
    pub fn record_success(&self) {
        // A load first: the common case (writes work) stays a read of a shared cache line.
        if self.failing.load(Ordering::Relaxed) && self.failing.swap(false, Ordering::SeqCst) {
            tracing::warn!("storage writes work again: accepting pushes");
            metrics::gauge!(m::STORAGE_WRITES_FAILING).set(0.0);
            metrics::counter!(m::STORAGE_RECOVERIES_TOTAL).increment(1);
        }
    }

    /// Completes when writes start failing (at once if they started since the last call).
    pub async fn failed(&self) {
        self.failed.notified().await
    }

    /// Whether the server refuses writes.
    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::SeqCst)
    }

    /// The failure that makes the server refuse writes, if it does.
    pub fn failure(&self) -> Option<String> {
        self.is_failing()
            .then(|| self.reason.lock().expect("not poisoned").clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_then_recovers() {
        let h = WriteHealth::default();
        assert_eq!(h.failure(), None);
        h.record_failure("write-back", &"store write_rows table 3 failed: no space");
        assert!(h.is_failing());
        assert_eq!(
            h.failure().unwrap(),
            "write-back failed: store write_rows table 3 failed: no space"
        );
        h.record_success();
        assert_eq!(h.failure(), None);
    }
}
