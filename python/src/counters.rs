//! [`Counters`]: what one client's requests did (calls, rows, nanoseconds), for its `stats()`.

use std::sync::atomic::AtomicU64;

/// Counters of one client (nanoseconds and counts), shared with its in-flight requests.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) pull_calls: AtomicU64,
    pub(crate) pull_rows: AtomicU64,
    pub(crate) pull_ns: AtomicU64,
    pub(crate) push_calls: AtomicU64,
    pub(crate) push_rows: AtomicU64,
    pub(crate) push_ns: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
}
