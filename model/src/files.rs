//! Crash-safe file operations shared by exports ([`crate::export`]) and the trainer's checkpoints: a file is
//! replaced atomically (a temporary file, fsync, rename, fsync of the directory), so a crash leaves the old file
//! or the new one.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A file operation that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct FileError {
    /// The file or directory.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

/// Names `path` in an I/O error: `.map_err(at(path))`.
pub fn at(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError {
        path: path.to_path_buf(),
        source,
    }
}

/// Removes the directory `path` and everything in it; a missing directory is not an error.
pub fn remove_dir_if_present(path: &Path) -> Result<(), FileError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(at(path)(e)),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` in `dir` atomically: into `tmp`, fsync, rename, fsync of the directory (a crash
/// leaves the old file or the new one).
pub fn write_atomic(dir: &Path, path: &Path, tmp: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let mut f = std::fs::File::create(tmp).map_err(at(tmp))?;
    f.write_all(bytes).map_err(at(tmp))?;
    f.sync_all().map_err(at(tmp))?;
    drop(f);
    std::fs::rename(tmp, path).map_err(at(path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at(dir))
}
