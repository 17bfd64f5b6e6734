//! The failpoints of this crate, for tests that inject faults (feature `failpoints`, which production builds
//! leave off: without it the crate has no failpoint and does not link the `fail` crate).
//!
//! A failpoint does nothing until a test configures it, with `fail::cfg(name, actions)` in-process or with
//! `FAILPOINTS=name=actions` for a process that calls `fail::FailScenario::setup` (ps-server does, in builds
//! with its own `failpoints` feature). Tests that configure failpoints run in their own test target
//! (`tests/failpoints.rs`), since the configuration is global to the process.

/// Evaluated by every write of a `RocksStore` (rows, deletes, metadata, the WAL sync) before it reaches
/// RocksDB. Configured `return`, the write fails with [`StoreError::Backend`](crate::StoreError::Backend)
/// and the I/O error RocksDB gives on a full disk, "IO error: No space left on device"; `return(TEXT)` puts
/// TEXT in its place. Reads, scans and checkpoints are not affected, as on a full disk.
pub const STORE_WRITE: &str = "embedding::rocks_store::write";

/// The detail of the error an injected write fault returns: `arg` (the failpoint's `return(arg)`), or the
/// full-disk error, marked as injected so a log never passes it off as a real one.
pub(crate) fn injected_detail(arg: Option<String>) -> String {
    let cause = arg.unwrap_or_else(|| "IO error: No space left on device".to_owned());
    format!("{cause} (injected by failpoint {STORE_WRITE})")
}
