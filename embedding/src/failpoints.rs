//! The failpoints of this crate, for tests that inject faults (feature `failpoints`, which production builds
//! leave off: without it the crate has no failpoint and does not link the `fail` crate).
//!
//! A failpoint does nothing until a test configures it, with `fail::cfg(name, actions)` in-process or with
//! `FAILPOINTS=name=actions` for a process that calls `fail::FailScenario::setup` (ps-server does, in builds
//! with its own `failpoints` feature). Tests that configure failpoints run in their own test target
//! (`tests/failpoints.rs`), since the configuration is global to the process.
//!
//! Two kinds:
//! - [`STORE_WRITE`] injects an error (a full disk).
//! - Crash points ([`CHECKPOINT_BEFORE_MANIFEST`], [`EVICT_BEFORE_RELEASE`], and ps-server's in
//!   `ps_server::failpoints`) sit where a crash matters: configured `return` (or `return(exit)`), they end
//!   the process at once ([`crash_point`]), as a `kill -9` would, and a test restarts it to check what
//!   recovery finds (ps-server's `tests/crash_points.rs`).

/// Evaluated by every write of a `RocksStore` (rows, deletes, metadata, the WAL sync) before it reaches
/// RocksDB. Configured `return`, the write fails with [`StoreError::Backend`](crate::StoreError::Backend)
/// and the I/O error RocksDB gives on a full disk, "IO error: No space left on device"; `return(TEXT)` puts
/// TEXT in its place. Reads, scans and checkpoints are not affected, as on a full disk.
pub const STORE_WRITE: &str = "embedding::rocks_store::write";

/// Crash point of [`Engine::checkpoint`](crate::Engine::checkpoint): after the snapshot's database and its
/// extra files (ps-server's `sync.json`) are written, before its manifest, which is written last. A crash
/// here leaves a shard directory without a manifest: an incomplete snapshot, which
/// [`Snapshot::open`](crate::snapshot::Snapshot::open) refuses and the next checkpoint into the same directory
/// replaces.
pub const CHECKPOINT_BEFORE_MANIFEST: &str = "embedding::snapshot::before_manifest";

/// Crash point of [`Engine::enforce_budget`](crate::Engine::enforce_budget): after a batch of evicted rows
/// was written to the store, before the victims leave memory (`Table::remove_evicted`). A crash here leaves
/// the store with the evicted rows' current values and, for the rest, what it had before.
pub const EVICT_BEFORE_RELEASE: &str = "embedding::engine::evict_before_release";

/// Exit status of a process ended by a crash point ([`crash_point`]), so a test tells it from other deaths.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Evaluates the crash point `name`: configured `return` or `return(exit)`, ends the process at once with
/// `_exit(CRASH_EXIT_CODE)`, from whichever thread: no unwinding, no destructors, no `atexit` handlers, no
/// flush of RocksDB's memtables or of any buffer. Writes RocksDB already handed to the kernel (its WAL)
/// survive, as after a `kill -9`. A `panic` action would not do: a panic inside a tokio task kills the task,
/// not the process. Other actions behave as the `fail` crate defines them (`off`, `pause`, ...).
pub fn crash_point(name: &str) {
    fail::eval(name, |arg| {
        // stderr is unbuffered: the line is out before the process ends.
        eprintln!(
            "crash point {name} ({}): exiting with status {CRASH_EXIT_CODE}",
            arg.as_deref().unwrap_or("exit")
        );
        // SAFETY: `_exit` ends the process without running any Rust or C code first; nothing is left
        // half-done in this process that could observe it.
        unsafe { libc::_exit(CRASH_EXIT_CODE) }
    });
}

/// The detail of the error an injected write fault returns: `arg` (the failpoint's `return(arg)`), or the
/// full-disk error, marked as injected so a log never passes it off as a real one.
pub(crate) fn injected_detail(arg: Option<String>) -> String {
    let cause = arg.unwrap_or_else(|| "IO error: No space left on device".to_owned());
    format!("{cause} (injected by failpoint {STORE_WRITE})")
}
