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
    std::process::exit(ps_server::cli::main(std::env::args_os()));
}
