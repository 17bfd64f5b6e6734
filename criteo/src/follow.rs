//! [`Follow`]: the lines of a file that keeps growing (`trainer train --follow`), like `tail -F`.
//!
//! At the end of the file it checks the file's size every poll interval (a stat and a read of nothing: no
//! inotify, so it works the same on every filesystem, network ones included), answering [`Next::Idle`]
//! after each wait that brought no complete line. A last line without its `\n` is not handed out until the
//! `\n` arrives: a writer appending a line in two writes is read correctly.
//!
//! Rotation:
//! - **Replaced** (the path now names another file: a log rotated by renaming, then a new file created):
//!   the old file is read to its end, a partial line at its end is dropped with a warning, and the new
//!   file is followed from its start. Line indices go on counting, so the rank split stays disjoint when
//!   every rank follows the same path.
//! - **Truncated in place** (the file is shorter than what was read: `copytruncate`, or a writer that
//!   rewrites it): refused with an error. What was written between the last read and the truncation is
//!   lost, and a resumed run's position would point into other data; rotate by renaming instead.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::lines::{check_text, Next, Pieces, Source};

/// A growing file, read as it grows.
#[derive(Debug)]
pub struct Follow {
    path: PathBuf,
    name: String,
    file: File,
    /// `(device, inode)` of `file`, to notice the path naming another file.
    id: (u64, u64),
    /// Bytes read from `file`.
    offset: u64,
    pieces: Pieces,
    poll: Duration,
}

impl Follow {
    /// Opens `path` (which must exist and be a regular file; it may be empty) to follow it, checking its
    /// size every `poll` at its end.
    pub fn open(path: &Path, poll: Duration) -> io::Result<Follow> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file: --follow follows one file",
            ));
        }
        Ok(Follow {
            name: path.display().to_string(),
            path: path.to_path_buf(),
            file,
            id: (meta.dev(), meta.ino()),
            offset: 0,
            pieces: Pieces::default(),
            poll,
        })
    }

    /// Reads what the file holds past `offset`; returns the bytes read (0 at its end).
    fn read_more(&mut self) -> io::Result<usize> {
        let (file, fresh) = (&mut self.file, self.offset == 0);
        let n = self.pieces.read_with(|room| file.read(room))?;
        if fresh && n > 0 {
            // Nothing is pending at a file's start: the pending bytes are its first ones.
            check_text(&self.name, self.pieces.pending_bytes())?;
        }
        self.offset += n as u64;
        Ok(n)
    }

    /// At the end of the file: refuses a truncation, switches to the new file when the path was replaced;
    /// returns whether there may be more to read now.
    fn check_rotation(&mut self) -> io::Result<bool> {
        let len = self.file.metadata()?.len();
        if len < self.offset {
            return Err(io::Error::other(format!(
                "truncated while followed: {len} bytes, {} already read (truncating in place loses lines; \
                 rotate by renaming the file instead)",
                self.offset
            )));
        }
        // The path may be missing for a moment between a rename and the new file's creation.
        let Ok(meta) = fs::metadata(&self.path) else {
            return Ok(false);
        };
        if (meta.dev(), meta.ino()) == self.id || !meta.is_file() {
            return Ok(false);
        }
        // Whatever the old file got before the rename is read first (the switch happens at its end).
        if self.read_more()? > 0 {
            return Ok(true);
        }
        let dropped = self.pieces.take_rest().map_or(0, |r| r.len());
        let file = File::open(&self.path)?;
        let meta = file.metadata()?;
        tracing::warn!(
            path = %self.path.display(),
            read = self.offset,
            dropped_partial_line_bytes = dropped,
            "the followed file was replaced: following the new file from its start"
        );
        (self.file, self.id, self.offset) = (file, (meta.dev(), meta.ino()), 0);
        Ok(true)
    }
}

impl Source for Follow {
    fn name(&self) -> &str {
        &self.name
    }

    fn next_line(&mut self) -> io::Result<Next<'_>> {
        let mut waited = false;
        loop {
            if let Some((range, cut)) = self.pieces.find() {
                return Ok(Next::Line(self.pieces.line(range), cut));
            }
            if self.read_more()? > 0 || self.check_rotation()? {
                continue;
            }
            if waited {
                return Ok(Next::Idle);
            }
            std::thread::sleep(self.poll);
            waited = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Instant;

    use super::*;

    /// Lines until the source answers `Idle`, which it must within `deadline` (a timeout, not a condition).
    fn until_idle(f: &mut Follow) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        loop {
            assert!(Instant::now() < deadline, "no idle answer: {out:?}");
            match f.next_line().unwrap() {
                Next::Line(l, false) => out.push(String::from_utf8(l.to_vec()).unwrap()),
                Next::Line(_, true) => panic!("cut"),
                Next::Idle => return out,
                Next::End => panic!("a followed file does not end"),
            }
        }
    }

    fn append(path: &Path, bytes: &[u8]) {
        let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(bytes).unwrap();
    }

    #[test]
    fn reads_appended_pieces_and_holds_back_a_partial_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grow.tsv");
        fs::write(&path, b"").unwrap();
        let mut f = Follow::open(&path, Duration::from_millis(1)).unwrap();
        assert_eq!(f.name(), path.display().to_string());
        assert_eq!(until_idle(&mut f), Vec::<String>::new());
        append(&path, b"a1\na2\npart");
        assert_eq!(until_idle(&mut f), ["a1", "a2"]);
        // Still incomplete: idle again, the partial line is not handed out.
        assert_eq!(until_idle(&mut f), Vec::<String>::new());
        append(&path, b"ial\n");
        assert_eq!(until_idle(&mut f), ["partial"]);
        append(&path, b"b1\r\nb2\n\n");
        assert_eq!(until_idle(&mut f), ["b1\r", "b2", ""]);
    }

    #[test]
    fn follows_a_replaced_file_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grow.tsv");
        fs::write(&path, b"old1\n").unwrap();
        let mut f = Follow::open(&path, Duration::from_millis(1)).unwrap();
        assert_eq!(until_idle(&mut f), ["old1"]);
        // Written to the old file after the last read, then the rename and a new file.
        append(&path, b"old2\nlost-partial");
        fs::rename(&path, dir.path().join("grow.tsv.1")).unwrap();
        fs::write(&path, b"new1\nnew2\n").unwrap();
        assert_eq!(until_idle(&mut f), ["old2", "new1", "new2"]);
        append(&path, b"new3\n");
        assert_eq!(until_idle(&mut f), ["new3"]);
    }

    #[test]
    fn refuses_truncation_and_compressed_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grow.tsv");
        fs::write(&path, b"x1\nx2\n").unwrap();
        let mut f = Follow::open(&path, Duration::from_millis(1)).unwrap();
        assert_eq!(until_idle(&mut f), ["x1", "x2"]);
        fs::write(&path, b"y\n").unwrap(); // same inode, shorter
        let err = f.next_line().unwrap_err().to_string();
        assert!(err.contains("truncated while followed"), "{err}");

        let gz = dir.path().join("g.tsv");
        fs::write(&gz, [0x1f, 0x8b, 8, 0]).unwrap();
        let err = Follow::open(&gz, Duration::from_millis(1))
            .unwrap()
            .next_line()
            .unwrap_err()
            .to_string();
        assert!(err.contains("gzip"), "{err}");
        let err = Follow::open(dir.path(), Duration::from_millis(1)).unwrap_err();
        assert!(err.to_string().contains("regular file"), "{err}");
    }
}
