//! Failpoints of a test build (feature `failpoints`; production builds contain none of this, nor any
//! failpoint): the binary calls [`setup`] first thing, which configures the failpoints named in the
//! `FAILPOINTS` environment variable (`name=actions;...`, read by the `fail` crate's [`fail::FailScenario`])
//! and, if [`FILE_ENV`] names a file, starts a thread that applies that file while the server runs. A test
//! driving a real process turns a fault on and off through the file (`tests/disk_errors.rs`).
//!
//! # The file
//! One `name=actions` per line, `actions` as [`fail::cfg`] takes them (the failpoints are listed in
//! `embedding::failpoints`), e.g. `embedding::rocks_store::write=return`. Blank lines are skipped. The
//! watcher reads the file every [`POLL`]; when its contents change, it configures every line and removes
//! the failpoints that earlier contents configured and these do not. An absent or empty file removes them
//! all. Then it writes the contents it applied to [`applied_path`] (or `error: ...` if a line was refused),
//! so a test waits for that acknowledgement instead of sleeping.
//!
//! # The failpoints
//! The store's, in `embedding::failpoints`: [`STORE_WRITE`](embedding::failpoints::STORE_WRITE) (a write
//! error), and the crash points [`CHECKPOINT_BEFORE_MANIFEST`](embedding::failpoints::CHECKPOINT_BEFORE_MANIFEST)
//! and [`EVICT_BEFORE_RELEASE`](embedding::failpoints::EVICT_BEFORE_RELEASE). This crate's crash points are
//! [`PUSH_BEFORE_ACK`] and [`RESHARD_MAP_PERSISTED`]. A crash point configured `return` (or `return(exit)`)
//! ends the process at once with status [`CRASH_EXIT_CODE`](embedding::failpoints::CRASH_EXIT_CODE)
//! ([`embedding::failpoints::crash_point`]); `tests/crash_points.rs` restarts the server and checks what it
//! recovered.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Crash point of a push with `durability = "sync"`: after its rows' synced store write, before the
/// `Pushed` answer is sent. A crash here leaves the push durable but unacknowledged: the client sees an
/// error, and a restart recovers the push's rows, applied once.
pub const PUSH_BEFORE_ACK: &str = "ps_server::push::before_ack";

/// Crash point of a reshard's commit on any server ([`crate::shard::reshard::Routing`]'s switch): after the new
/// shard map is persisted (synced), before the server switches to it in memory and answers the commit. A
/// crash here restarts the server on the new map.
pub const RESHARD_MAP_PERSISTED: &str = "ps_server::shard::reshard::map_persisted";

/// Environment variable naming the failpoint file the watcher applies.
pub const FILE_ENV: &str = "PS_FAILPOINTS_FILE";

/// How often the watcher reads the failpoint file.
pub const POLL: Duration = Duration::from_millis(10);

/// Where the watcher acknowledges the contents of `file` it applied: `file` with `.applied` appended.
pub fn applied_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".applied");
    PathBuf::from(name)
}

/// Configures the failpoints of `FAILPOINTS` and starts the file watcher if [`FILE_ENV`] is set. Keep the
/// returned scenario for the life of the process.
///
/// # Panics
/// If `FAILPOINTS` is malformed (as [`fail::FailScenario::setup`]) or the watcher thread cannot start: a test
/// build asked for faults it cannot inject.
pub fn setup() -> fail::FailScenario<'static> {
    let scenario = fail::FailScenario::setup();
    if let Some(file) = std::env::var_os(FILE_ENV) {
        let file = PathBuf::from(file);
        std::thread::Builder::new()
            .name("ps-failpoints".into())
            .spawn(move || watch(&file))
            .expect("start the failpoint file watcher");
    }
    scenario
}

/// Applies `file` whenever its contents change, forever.
fn watch(file: &Path) {
    let mut applied = String::new();
    let mut names: Vec<String> = Vec::new();
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text != applied {
            let ack = match apply(&text, &mut names) {
                Ok(()) => {
                    tracing::warn!(file = %file.display(), failpoints = ?names, "failpoints applied");
                    text.clone()
                }
                Err(e) => {
                    tracing::error!(file = %file.display(), error = %e, "failpoint file refused");
                    format!("error: {e}")
                }
            };
            acknowledge(file, &ack);
            applied = text;
        }
        std::thread::sleep(POLL);
    }
}

/// Configures each `name=actions` line of `text` and removes the failpoints in `names` (configured by earlier
/// contents) that `text` does not name; `names` becomes the names of `text`.
fn apply(text: &str, names: &mut Vec<String>) -> Result<(), String> {
    let mut now = Vec::new();
    let mut result = Ok(());
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((name, actions)) = line.split_once('=') else {
            result = Err(format!("{line:?}: expected name=actions"));
            continue;
        };
        let name = name.trim();
        match fail::cfg(name, actions.trim()) {
            Ok(()) => now.push(name.to_owned()),
            Err(e) => result = Err(format!("{line:?}: {e}")),
        }
    }
    for old in names.iter().filter(|n| !now.contains(n)) {
        fail::remove(old);
    }
    *names = now;
    result
}

/// Writes `ack` to [`applied_path`] of `file` atomically (a temporary file, then a rename), so a reader never
/// sees half of it.
fn acknowledge(file: &Path, ack: &str) {
    let path = applied_path(file);
    let mut tmp = path.clone().into_os_string();
    tmp.push(".tmp");
    let written = std::fs::write(&tmp, ack).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing::error!(path = %path.display(), error = %e, "cannot acknowledge the failpoint file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_path_appends_to_the_file_name() {
        assert_eq!(
            applied_path(Path::new("/tmp/x/fail")),
            Path::new("/tmp/x/fail.applied")
        );
    }

    #[test]
    fn lines_configure_and_later_contents_remove() {
        // Names no code evaluates, so the other unit tests of this process are not affected.
        let mut names = Vec::new();
        apply("test::a=return\n\n test::b = off \n", &mut names).unwrap();
        assert_eq!(names, ["test::a", "test::b"]);
        let listed = |name: &str| fail::list().into_iter().any(|(n, _)| n == name);
        assert!(listed("test::a") && listed("test::b"));
        apply("test::b=return", &mut names).unwrap();
        assert!(!listed("test::a") && listed("test::b"));
        let e = apply("test::c\ntest::d=nonsense(", &mut names).unwrap_err();
        assert!(e.contains("test::d"), "{e}");
        assert!(!listed("test::b"));
        apply("", &mut names).unwrap();
        assert!(names.is_empty());
    }
}
