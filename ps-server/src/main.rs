/// jemalloc for every allocation of the process, RocksDB's included (`malloc` itself is jemalloc's): glibc's
/// per-thread arenas kept freed read-back, eviction and request buffers resident, past `ps-server plan`'s
/// prediction (bench/figures/history.md, "Tenth round"); jemalloc gives unused pages back after its decay time.
#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start (`MALLOC_CONF` in the environment still overrides them):
/// `oversize_threshold:0` keeps allocations above 8 MiB in the ordinary arenas, whose freed pages are reused
/// until their decay time. jemalloc's default gave those a dedicated arena that returns freed pages at once,
/// so every pull reply of a wide table (DLRM-v2: 57 MB of rows and optimizer state per server and step)
/// faulted in fresh zeroed pages and unmapped them again: page faults, zeroing and TLB shootdowns were a
/// third of a server's CPU, and it spent 20% less per sample without them (issue-44.md section 5).
#[cfg(target_os = "linux")]
#[allow(non_upper_case_globals)]
#[export_name = "malloc_conf"]
pub static malloc_conf: &[u8; 21] = b"oversize_threshold:0\0";

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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// jemalloc took the options of `malloc_conf` (a misspelt option or symbol would leave its default, 8 MiB,
    /// and only a warning on stderr).
    #[test]
    fn jemalloc_keeps_large_allocations_in_the_ordinary_arenas() {
        if std::env::var_os("MALLOC_CONF").is_some() {
            eprintln!("skipped: MALLOC_CONF overrides the built-in options");
            return;
        }
        // SAFETY: the name is a NUL-terminated mallctl name of a `size_t` option.
        let threshold: usize = unsafe { tikv_jemalloc_ctl::raw::read(b"opt.oversize_threshold\0") }
            .expect("jemalloc's opt.oversize_threshold");
        assert_eq!(threshold, 0);
    }
}
