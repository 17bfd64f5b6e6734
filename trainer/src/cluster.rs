//! Which parameter-server processes `trainer demo` starts: the `ps-server` binary next to this one, or this
//! binary's hidden `ps-server` subcommand when that is absent (see [`PS_SERVER_ENV`]). The processes themselves
//! are managed by [`ps_server::local::LocalCluster`].

use std::path::Path;
use std::process::Command;

use anyhow::Context;

pub use ps_server::local::LocalCluster;

/// Environment variable naming the ps-server binary to start, or `self` for this binary's `ps-server`
/// subcommand. Unset: the `ps-server` next to this binary if present, else `self`.
pub const PS_SERVER_ENV: &str = "TRAINER_PS_SERVER";

/// The command that starts a ps-server (see [`PS_SERVER_ENV`]).
pub fn ps_server_command() -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("locate the running binary")?;
    match std::env::var_os(PS_SERVER_ENV) {
        Some(v) if v == "self" => {}
        Some(path) => return Ok(Command::new(path)),
        None => {
            let sibling = exe.with_file_name("ps-server");
            if sibling.is_file() {
                return Ok(Command::new(sibling));
            }
        }
    }
    let mut cmd = Command::new(exe);
    cmd.arg("ps-server");
    Ok(cmd)
}

/// Starts `n` local servers under `run_dir` with [`ps_server_command`] (see [`LocalCluster::start_with`]).
pub fn start(n: usize, run_dir: &Path, extra: &[String]) -> anyhow::Result<LocalCluster> {
    LocalCluster::start_with(&ps_server_command, n, run_dir, extra)
}
