/// jemalloc for every allocation of the process, RocksDB's included (`malloc` itself is jemalloc's): glibc's
/// per-thread arenas kept freed read-back, eviction and request buffers resident, past `ps-server plan`'s
/// prediction (bench/figures/history.md, "Tenth round"); jemalloc gives unused pages back after its decay time.
#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    // Test builds only (feature `failpoints`): failpoints from FAILPOINTS and the PS_FAILPOINTS_FILE watcher,
    // kept until the process exits.
    #[cfg(feature = "failpoints")]
    let _failpoints = ps_server::failpoints::setup();
    let code = ps_server::cli::main(std::env::args_os());
    // `cli::main` has returned: the runtime is dropped (its threads joined) and RocksDB closed, every row
    // written. What is left is C++'s static destructors, which `exit` runs while threads RocksDB started
    // (its environment's pools, its periodic-task timer) and the allocator's may still touch them: the race
    // behind RocksDB's "pthread lock: Invalid argument" aborts at exit (facebook/rocksdb#11349). `_exit` skips
    // them; stdout is flushed first (stderr is unbuffered).
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: _exit(2) ends the process; nothing of this process runs after it.
    unsafe { libc::_exit(code) }
}
