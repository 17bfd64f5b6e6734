//! The workspace's binaries, for end-to-end tests and runners that need several of them (a test can name
//! only its own package's binaries through `CARGO_BIN_EXE_*`; the end-to-end tests, crate `e2e`, need
//! `trainer`, `ps-server`, `ps-serve` and this crate's together).
//!
//! [`path`] finds `target/<profile>/<name>` from the running executable (a test binary runs from
//! `target/<profile>/deps/`). Under cargo (`CARGO` is set), the first call also runs
//! `cargo build --bins -p ps-server -p trainer -p serving -p bench --features ps-server/failpoints` in the same profile, so
//! that `cargo test -p bench` never runs a binary older than its sources; `cargo test --workspace` has built
//! them already, and the call is a no-op check. The ps-server binary is built with its failpoints (inactive
//! unless configured), as `cargo test` builds it for ps-server's own tests: they share
//! `target/<profile>/ps-server`, and a build without failpoints would replace the binary that ps-server's
//! failpoint tests (`ps-server/tests/disk_errors.rs`) run.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The directory holding the workspace's binaries of the running profile.
fn bin_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locate the running binary: {e}"))?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Builds the binaries once per process when running under cargo; the error names the failed command.
fn ensure_built() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = bin_dir()?;
            let Some(cargo) = std::env::var_os("CARGO") else {
                return Ok(dir); // not under cargo: use what is there
            };
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--quiet", "--bins"]);
            cmd.args([
                "-p",
                "ps-server",
                "-p",
                "trainer",
                "-p",
                "serving",
                "-p",
                "bench",
            ]);
            cmd.args(["--features", "ps-server/failpoints"]);
            match dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => {}
                Some("release") => {
                    cmd.arg("--release");
                }
                Some(other) => {
                    cmd.args(["--profile", other]);
                }
                None => return Err(format!("no profile in {}", dir.display())),
            }
            if let Some(target) = dir.parent() {
                cmd.env("CARGO_TARGET_DIR", target);
            }
            let out = cmd.output().map_err(|e| format!("run {cmd:?}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "{cmd:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(dir)
        })
        .clone()
}

/// The path of the workspace binary `name` (`trainer`, `ps-server`, `gen-criteo`, ...), built and up to date.
///
/// # Panics
/// If it cannot be built or found: this is for tests and runners, where that is the failure to report.
pub fn path(name: &str) -> PathBuf {
    let dir = ensure_built().unwrap_or_else(|e| panic!("cannot build the binaries: {e}"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --bins -p ps-server -p trainer -p serving -p bench`",
        path.display()
    );
    path
}

/// A command running the workspace binary `name` ([`path`]).
pub fn command(name: &str) -> Command {
    Command::new(path(name))
}
