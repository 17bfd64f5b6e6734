//! End-to-end tests of the workspace (`tests/`), in a crate named for what they are: each starts the real
//! binaries (`ps-server`, `trainer`, `ps-serve`, found beside the test executable and built first by
//! `bench::bins`) on loopback with TLS, on data from the `gen-criteo` generator, and checks what a user would:
//! training results, failover, resharding, serving, limits, security, crash recovery. `tests/support` holds
//! their shared helpers. The crate has no code of its own; the benchmarks' binaries keep their own tests in
//! `bench/tests`.
