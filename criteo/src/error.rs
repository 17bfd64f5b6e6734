//! [`ReadError`]: why reading Criteo input failed, each variant naming the file, line or setting at fault.

use std::path::PathBuf;
use std::{fmt, io};

use super::columnar::ColumnarError;

/// Why reading failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The configuration cannot work.
    #[error("invalid reader config: {0}")]
    InvalidConfig(String),
    /// An input path is missing or unreadable.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// An input directory holds no files.
    #[error("input directory {} holds no files", path.display())]
    EmptyDirectory {
        /// The directory.
        path: PathBuf,
    },
    /// A preprocessed shard is corrupt or truncated, or was written for another feature layout.
    #[error("{}: bad columnar shard: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong (in the message, so not also a `source`).
        reason: ColumnarError,
    },
    /// Reading (or decompressing) a file failed, e.g. a truncated `.gz`.
    #[error("{}: read error after line {line}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The last line read whole.
        line: u64,
        /// The cause.
        source: io::Error,
    },
    /// More lines were bad than the budget allows.
    #[error(
        "{bad} bad lines exceed the error budget of {budget}; the first: {}",
        FirstError(first_errors)
    )]
    ErrorBudgetExceeded {
        /// Bad lines seen (budget + 1).
        bad: u64,
        /// The budget, [`super::ReaderConfig::max_bad_lines`].
        budget: u64,
        /// The first bad lines, as in [`super::ReadStats::first_errors`].
        first_errors: Vec<String>,
    },
    /// Every file was read to its end and not one row could be used (empty, blank, malformed or binary
    /// input): training on nothing must not look like a success.
    #[error(
        "no usable rows in {}{}: {lines} lines read, {bad_lines} malformed, {empty_lines} empty; first malformed: {}",
        Paths(paths),
        RankOf(*rank, *world),
        FirstError(first_errors)
    )]
    NoRows {
        /// The files read, in order.
        paths: Vec<PathBuf>,
        /// This reader's rank and the number of ranks splitting the lines.
        rank: usize,
        /// See `rank`.
        world: usize,
        /// Lines assigned to this rank.
        lines: u64,
        /// Lines that did not parse.
        bad_lines: u64,
        /// Empty lines.
        empty_lines: u64,
        /// The first bad lines, as in [`super::ReadStats::first_errors`].
        first_errors: Vec<String>,
    },
    /// The reader thread could not be started.
    #[error("cannot start the reader thread: {0}")]
    Spawn(io::Error),
    /// The reader thread panicked (a bug).
    #[error("the reader thread panicked: {0}")]
    Panicked(String),
}

/// Formats the first of a list of errors.
struct FirstError<'a>(&'a [String]);

impl fmt::Display for FirstError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.first().map_or("(none recorded)", String::as_str))
    }
}

/// Formats a list of paths, comma-separated.
struct Paths<'a>(&'a [PathBuf]);

impl fmt::Display for Paths<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, path) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", path.display())?;
        }
        Ok(())
    }
}

/// Formats " (rank r of W)" when the input is split among several trainers, nothing otherwise.
struct RankOf(usize, usize);

impl fmt::Display for RankOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankOf(_, 1) => Ok(()),
            RankOf(rank, world) => write!(f, " (rank {rank} of {world})"),
        }
    }
}
