fn main() {
    // Test builds only (feature `failpoints`): failpoints from FAILPOINTS and the PS_FAILPOINTS_FILE watcher,
    // kept until the process exits.
    #[cfg(feature = "failpoints")]
    let _failpoints = ps_server::failpoints::setup();
    std::process::exit(ps_server::cli::main(std::env::args_os()));
}
