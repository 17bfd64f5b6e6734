//! Batched reading: files in order, lines split among trainer ranks, parsed into [`Batch`]es on a thread of
//! their own (DESIGN.md, "Read": parsing runs ahead of training), with an error budget for bad lines.
//!
//! Each file is read in its own detected form: TSV or Kaggle CSV text (plain, gzip or zstd), or a
//! preprocessed columnar shard, whose rows are copied, not parsed. Batches run across file boundaries; a
//! CSV header is not a line (it takes no index in the rank split).
//!
//! Call order: [`BatchReader::spawn`], iterate to the end (or drop early: the thread notices the closed
//! channel or the stop flag within a line and exits), then [`BatchReader::stats`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvError};

use super::batch::Batch;
use super::columnar::Shard;
use super::error::ReadError;
use super::follow::Follow;
use super::layout::FeatureLayout;
use super::lines::MAX_LINE;
use super::lines::{Next, Source, StreamEnd};
use super::parse::{LineKind, Row, TextFormat};
use super::piped::Piped;
use super::source::{input_files, open, Input, TextFile};

/// The input path that means standard input (`--train -`).
pub const STDIN: &str = "-";

/// How many bad-line messages [`ReadStats::first_errors`] keeps.
pub const MAX_FIRST_ERRORS: usize = 10;

/// What to read and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderConfig {
    /// Files or directories (a directory is its files sorted by name), read in this order.
    pub paths: Vec<PathBuf>,
    /// Rows per batch; the last batch may be shorter. Must be at least 1.
    pub batch_size: usize,
    /// The error budget: how many bad lines are skipped before reading fails. Default 1000.
    pub max_bad_lines: u64,
    /// This trainer's rank: it takes the lines whose index (counted over all files, from 0) is
    /// `rank` modulo `world`. Default 0.
    pub rank: usize,
    /// The number of trainers splitting the input. Default 1.
    pub world: usize,
    /// How many parsed batches may wait for the consumer. Default 4.
    pub queue_depth: usize,
    /// Reads in a seeded random order (one epoch of several): the files in a permuted order, and the rows
    /// of each columnar shard (this rank's share of them) in a permuted order, both from the seed, so every
    /// rank with the same seed splits the rows the same disjoint way. Text files are read line by line in
    /// their own order (a stream cannot be permuted without holding it: preprocess with `trainer
    /// preprocess` for per-epoch shuffling). `None` (the default) reads everything in order.
    pub shuffle_seed: Option<u64>,
    /// The sparse features to produce ([`Batch::sparse`] in this order): which columns, one-hot or
    /// multi-hot, table salts and caps. Default: 26 one-hot features, today's ids. Columnar shards must
    /// have been written for the same layout.
    pub layout: FeatureLayout,
    /// Follow the one input file as it grows (`--follow`, [`Follow`]): at its end, wait for more lines
    /// instead of ending. The read ends when [`stream_end`](Self::stream_end) is ended. One plain-text file,
    /// no shuffle. Default off.
    pub follow: bool,
    /// How long a stream (a followed file, standard input) is waited on at a time: after such a wait
    /// without a complete line, the reader hands out the rows it holds as a short batch (a stream's rows
    /// are trained as they arrive). Default 50 ms.
    pub poll: Duration,
    /// Ends the read early and cleanly ([`StreamEnd`]): the only end of a followed file. Default: a handle
    /// nobody else holds.
    pub stream_end: StreamEnd,
    /// Rows of this rank parsed and dropped before the first batch (counted in [`ReadStats`] like the
    /// others): the position of a resumed stream, whose batches have no fixed size. Streams only (a
    /// followed file or standard input). Default 0.
    pub skip_rows: u64,
}

impl ReaderConfig {
    /// Reads `paths` in batches of `batch_size` with the default budget, rank 0 of 1, and queue depth.
    pub fn new(paths: impl IntoIterator<Item = impl Into<PathBuf>>, batch_size: usize) -> Self {
        ReaderConfig {
            paths: paths.into_iter().map(Into::into).collect(),
            batch_size,
            ..Default::default()
        }
    }

    fn validate(&self) -> Result<(), ReadError> {
        let invalid = |reason: String| Err(ReadError::InvalidConfig(reason));
        if self.paths.is_empty() {
            return invalid("no input paths".into());
        }
        if self.batch_size == 0 {
            return invalid("batch size 0".into());
        }
        if self.rank >= self.world {
            return invalid(format!(
                "rank {} not below world size {}",
                self.rank, self.world
            ));
        }
        if let Err(e) = self.layout.validate() {
            return invalid(e.to_string());
        }
        let stdin = self.paths.iter().any(|p| p.as_os_str() == STDIN);
        if stdin && self.paths.len() > 1 {
            return invalid(format!(
                "standard input ('{STDIN}') must be the only input, got {} paths",
                self.paths.len()
            ));
        }
        if self.follow && self.paths.len() > 1 {
            return invalid(format!(
                "--follow follows one file, got {} paths",
                self.paths.len()
            ));
        }
        if self.follow && stdin {
            return invalid(format!(
                "--follow follows a file; standard input ('{STDIN}') is read until it closes without it"
            ));
        }
        if (self.follow || stdin) && self.shuffle_seed.is_some() {
            return invalid(
                "a stream (--follow or standard input) is read in arrival order: no shuffle (--epochs > 1)"
                    .into(),
            );
        }
        if self.skip_rows > 0 && !(self.follow || stdin) {
            return invalid(
                "skip_rows applies to streams (--follow or standard input) only".into(),
            );
        }
        if self.poll.is_zero() {
            return invalid("poll interval 0".into());
        }
        Ok(())
    }

    /// Whether the input is a stream (a followed file or standard input): the paths are taken as they are.
    pub fn is_stream(&self) -> bool {
        self.follow || self.paths.iter().any(|p| p.as_os_str() == STDIN)
    }

    /// The files to read: the paths expanded ([`input_files`]); a stream's path as it is (a followed one
    /// checked to be a file).
    fn files(&self) -> Result<Vec<PathBuf>, ReadError> {
        if !self.is_stream() {
            return Ok(shuffled(input_files(&self.paths)?, self.shuffle_seed));
        }
        if self.follow {
            let path = &self.paths[0];
            let meta = std::fs::metadata(path).map_err(|source| ReadError::Open {
                path: path.clone(),
                source,
            })?;
            if !meta.is_file() {
                return Err(ReadError::InvalidConfig(format!(
                    "--follow follows one file; {} is not a regular file",
                    path.display()
                )));
            }
        }
        Ok(self.paths.clone())
    }
}

impl Default for ReaderConfig {
    fn default() -> Self {
        ReaderConfig {
            paths: Vec::new(),
            batch_size: 4096,
            max_bad_lines: 1000,
            rank: 0,
            world: 1,
            queue_depth: 4,
            shuffle_seed: None,
            layout: FeatureLayout::default(),
            follow: false,
            poll: Duration::from_millis(50),
            stream_end: StreamEnd::new(),
            skip_rows: 0,
        }
    }
}

/// Counts of what was read. Only this rank's lines are counted: `lines == rows + bad_lines + empty_lines`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Lines assigned to this rank.
    pub lines: u64,
    /// Rows produced (complete and padded lines).
    pub rows: u64,
    /// Lines skipped because they did not parse.
    pub bad_lines: u64,
    /// Lines with fewer than 40 fields, padded with empty ones (also counted in `rows`).
    pub padded_lines: u64,
    /// Empty lines, skipped.
    pub empty_lines: u64,
    /// Tokens dropped because a field held more than its feature's `tokens` (text input only: a shard's
    /// were counted when it was written).
    pub truncated_tokens: u64,
    /// The first bad lines, as `path:line: message` (line numbers 1-based within the file).
    pub first_errors: Vec<String>,
}

/// Parses batches on a thread of its own; iterate over it to get them.
///
/// The iterator yields `Ok` batches, then ends, or yields one `Err` and ends. Dropping it stops the thread
/// and waits for it (at most the time to parse one line and finish a read).
pub struct BatchReader {
    rx: Option<Receiver<Result<Batch, ReadError>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<ReadStats>>,
    busy: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl BatchReader {
    /// Checks the config and the paths (errors name a missing path), then starts the reader thread.
    pub fn spawn(cfg: ReaderConfig) -> Result<BatchReader, ReadError> {
        cfg.validate()?;
        let files = cfg.files()?;
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_depth);
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(ReadStats::default()));
        let (thread_stop, thread_stats) = (Arc::clone(&stop), Arc::clone(&stats));
        let busy = Arc::new(AtomicU64::new(0));
        let thread_busy = Arc::clone(&busy);
        let thread = std::thread::Builder::new()
            .name(format!("criteo-reader-{}", cfg.rank))
            .spawn(move || {
                // A helper of the training loop (base::sched): it must not preempt the compute threads.
                if let Err(e) = base::sched::enter_helper() {
                    tracing::warn!(error = %e, "reader thread keeps the default scheduling policy");
                }
                let mut pipeline = Pipeline::new(&cfg, &thread_stop);
                // Busy time: from the start (or the last hand-over) to the next full batch; the time blocked
                // on a full queue is the consumer's, not the reader's. Two clock reads per batch.
                let mut since = Instant::now();
                let result = pipeline.run(&files, |batch, stats| {
                    *thread_stats.lock().unwrap_or_else(|e| e.into_inner()) = stats.clone();
                    let ready = Instant::now();
                    thread_busy.fetch_add(nanos(ready - since), Ordering::Relaxed);
                    let sent = tx.send(Ok(batch)).is_ok();
                    since = Instant::now();
                    sent
                });
                *thread_stats.lock().unwrap_or_else(|e| e.into_inner()) = pipeline.stats;
                if let Err(e) = result {
                    let _ = tx.send(Err(e));
                }
            })
            .map_err(ReadError::Spawn)?;
        Ok(BatchReader {
            rx: Some(rx),
            stop,
            stats,
            busy,
            thread: Some(thread),
        })
    }

    /// Nanoseconds the reader thread has spent reading and parsing so far (not counting the time it waited
    /// for the consumer to take a batch): a shared counter that stays valid after the reader is dropped, for
    /// a caller reporting where its time goes.
    pub fn busy_nanos(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.busy)
    }

    /// The counts so far; final once the iterator has ended.
    pub fn stats(&self) -> ReadStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Joins the thread, turning a panic into an error.
    fn join(&mut self) -> Option<ReadError> {
        let panic = self.thread.take()?.join().err()?;
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Some(ReadError::Panicked(message))
    }
}

impl Iterator for BatchReader {
    type Item = Result<Batch, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = match self.rx.as_ref()?.recv() {
            Ok(item) => item,
            Err(RecvError) => {
                self.rx = None;
                return self.join().map(Err);
            }
        };
        if item.is_err() {
            self.rx = None;
            self.join();
        }
        Some(item)
    }
}

impl Drop for BatchReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.rx = None; // wakes a thread blocked on a full channel
        self.join();
    }
}

/// Reads everything on the calling thread: for evaluation sets, small enough to hold in memory.
///
/// `queue_depth` is ignored.
pub fn read_all(cfg: &ReaderConfig) -> Result<(Vec<Batch>, ReadStats), ReadError> {
    cfg.validate()?;
    let files = cfg.files()?;
    let stop = AtomicBool::new(false);
    let mut pipeline = Pipeline::new(cfg, &stop);
    let mut batches = Vec::new();
    pipeline.run(&files, |batch, _| {
        batches.push(batch);
        true
    })?;
    Ok((batches, pipeline.stats))
}

/// A duration in whole nanoseconds (saturating: 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A seeded Fisher-Yates shuffle of `items` (`None`: as they are), drawn from splitmix64 of `seed` and a
/// counter so that every rank (and a test) draws the same order.
fn shuffled<T>(mut items: Vec<T>, seed: Option<u64>) -> Vec<T> {
    if let Some(seed) = seed {
        let mut draw = 0u64;
        for i in (1..items.len()).rev() {
            draw += 1;
            let r = base::hash::splitmix64(seed ^ base::hash::splitmix64(draw));
            // Lemire's multiply-shift: uniform enough for a permutation (bias below 2^-32 at these sizes).
            let j = ((u128::from(r) * (i as u128 + 1)) >> 64) as usize;
            items.swap(i, j);
        }
    }
    items
}

/// The reading loop, independent of where the batches go.
struct Pipeline<'a> {
    cfg: &'a ReaderConfig,
    stop: &'a AtomicBool,
    stats: ReadStats,
    /// Index of the next line over all files, for the rank split.
    index: u64,
    /// Whether the layout is the default one (the one-hot fast path).
    default_layout: bool,
    /// Rows still to drop ([`ReaderConfig::skip_rows`]).
    skip_rows: u64,
}

impl<'a> Pipeline<'a> {
    fn new(cfg: &'a ReaderConfig, stop: &'a AtomicBool) -> Self {
        Pipeline {
            cfg,
            stop,
            stats: ReadStats::default(),
            index: 0,
            default_layout: cfg.layout.is_default(),
            skip_rows: cfg.skip_rows,
        }
    }

    /// Reads `files` in order, handing each full batch, then the last short one, to `emit`, which returns
    /// `false` to stop. Returns early (and `Ok`) when stopped; fails with [`ReadError::NoRows`] when the
    /// files, read to their end, held no usable row.
    fn run(
        &mut self,
        files: &[PathBuf],
        mut emit: impl FnMut(Batch, &ReadStats) -> bool,
    ) -> Result<(), ReadError> {
        let mut batch = self.new_batch();
        let open_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReadError::Open { path, source }
        };
        for path in files {
            if self.cfg.stream_end.is_ended() {
                break;
            }
            let go_on = if path.as_os_str() == STDIN {
                let mut stdin = Piped::stdin(self.cfg.poll).map_err(ReadError::Spawn)?;
                self.read_text(&mut stdin, &mut batch, &mut emit)?
            } else if self.cfg.follow {
                let mut file = Follow::open(path, self.cfg.poll).map_err(open_err(path))?;
                self.read_text(&mut file, &mut batch, &mut emit)?
            } else {
                match open(path)? {
                    Input::Text(lines) => {
                        let mut file = TextFile::new(path, lines);
                        self.read_text(&mut file, &mut batch, &mut emit)?
                    }
                    Input::Columnar(map) => {
                        self.read_columnar(path, &map, &mut batch, &mut emit)?
                    }
                }
            };
            if !go_on {
                return Ok(());
            }
        }
        if self.stats.rows == 0 {
            let s = &self.stats;
            return Err(ReadError::NoRows {
                paths: files.to_vec(),
                rank: self.cfg.rank,
                world: self.cfg.world,
                lines: s.lines,
                bad_lines: s.bad_lines,
                empty_lines: s.empty_lines,
                first_errors: s.first_errors.clone(),
            });
        }
        if !batch.is_empty() {
            self.stats.truncated_tokens += batch.truncated;
            emit(batch, &self.stats);
        }
        Ok(())
    }

    /// An empty batch of the layout.
    fn new_batch(&self) -> Batch {
        Batch::with_layout(self.cfg.batch_size, &self.cfg.layout)
    }

    /// Hands `batch` to `emit` if it is full; `false` to stop.
    fn flush_full(
        &mut self,
        batch: &mut Batch,
        emit: &mut impl FnMut(Batch, &ReadStats) -> bool,
    ) -> bool {
        if batch.len < self.cfg.batch_size {
            return true;
        }
        let full = std::mem::replace(batch, self.new_batch());
        self.stats.truncated_tokens += full.truncated;
        emit(full, &self.stats)
    }

    /// Reads the lines of one source (TSV, or CSV if its first line is the Kaggle header) to its end, or
    /// until [`ReaderConfig::stream_end`]; `false` to stop. While a stream is idle, the rows read so far go
    /// out as a short batch.
    fn read_text(
        &mut self,
        source: &mut dyn Source,
        batch: &mut Batch,
        emit: &mut impl FnMut(Batch, &ReadStats) -> bool,
    ) -> Result<bool, ReadError> {
        let (world, rank) = (self.cfg.world as u64, self.cfg.rank as u64);
        let name = source.name().to_string();
        let mut row = Row::default();
        let mut format = TextFormat::Tsv;
        let mut line_no = 0u64;
        loop {
            if self.cfg.stream_end.is_ended() {
                return Ok(true);
            }
            let (line, cut) = match source.next_line() {
                Ok(Next::Line(line, cut)) => (line, cut),
                Ok(Next::End) => return Ok(true),
                Ok(Next::Idle) => {
                    if self.stop.load(Ordering::Relaxed) {
                        return Ok(false);
                    }
                    if !batch.is_empty() {
                        let short = std::mem::replace(batch, self.new_batch());
                        self.stats.truncated_tokens += short.truncated;
                        if !emit(short, &self.stats) {
                            return Ok(false);
                        }
                    }
                    continue;
                }
                Err(source) => {
                    return Err(ReadError::Read {
                        path: PathBuf::from(&name),
                        line: line_no,
                        source,
                    })
                }
            };
            line_no += 1;
            if line_no == 1 && TextFormat::detect(line) == TextFormat::Csv {
                format = TextFormat::Csv;
                continue;
            }
            let index = self.index;
            self.index += 1;
            if index % world != rank {
                continue;
            }
            if self.stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            self.stats.lines += 1;
            let parsed = if cut {
                Err(format!("line longer than {MAX_LINE} bytes"))
            } else {
                format.parse(line, &mut row).map_err(|e| e.to_string())
            };
            match parsed {
                Ok(LineKind::Empty) => self.stats.empty_lines += 1,
                Ok(kind) => {
                    self.stats.padded_lines += u64::from(kind != LineKind::Full);
                    self.stats.rows += 1;
                    if self.skip_rows > 0 {
                        self.skip_rows -= 1;
                        continue;
                    }
                    if self.default_layout {
                        batch.push_row(&row);
                    } else {
                        batch.push_row_in(&row, &self.cfg.layout);
                    }
                    if !self.flush_full(batch, emit) {
                        return Ok(false);
                    }
                }
                Err(message) => self.bad_line(format!("{name}:{line_no}: {message}"))?,
            }
        }
    }

    /// Reads one preprocessed shard: its rows are this rank's when their index (counted on from the
    /// files before) is `rank` modulo `world`. `false` to stop.
    fn read_columnar(
        &mut self,
        path: &Path,
        bytes: &[u8],
        batch: &mut Batch,
        emit: &mut impl FnMut(Batch, &ReadStats) -> bool,
    ) -> Result<bool, ReadError> {
        let corrupt = |reason| ReadError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let shard = Shard::parse(bytes).map_err(corrupt)?;
        shard.check_layout(&self.cfg.layout).map_err(corrupt)?;
        let (world, rank) = (self.cfg.world, self.cfg.rank as u64);
        let rows = shard.rows();
        // The first of this rank's rows in the shard, then every `world`-th.
        let mut next = ((rank + world as u64 - self.index % world as u64) % world as u64) as usize;
        let shard_index = self.index;
        self.index += rows as u64;
        if let Some(seed) = self.cfg.shuffle_seed {
            // This rank's rows, permuted with a seed of their own per shard (its first row's index).
            let mine: Vec<u32> = (next..rows).step_by(world).map(|r| r as u32).collect();
            let order = shuffled(mine, Some(base::hash::splitmix64(seed) ^ shard_index));
            let mut left = &order[..];
            while !left.is_empty() {
                if self.stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                let count = left.len().min(self.cfg.batch_size - batch.len);
                shard.append_picked(&left[..count], batch);
                left = &left[count..];
                self.stats.lines += count as u64;
                self.stats.rows += count as u64;
                if !self.flush_full(batch, emit) {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        while next < rows {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let left = (rows - next - 1) / world + 1;
            let count = left.min(self.cfg.batch_size - batch.len);
            shard.append_rows(next, world, count, batch);
            next += count * world;
            self.stats.lines += count as u64;
            self.stats.rows += count as u64;
            if !self.flush_full(batch, emit) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Counts a bad line; fails once the count exceeds the budget.
    fn bad_line(&mut self, message: String) -> Result<(), ReadError> {
        self.stats.bad_lines += 1;
        if self.stats.first_errors.len() < MAX_FIRST_ERRORS {
            tracing::warn!(%message, "skipping a bad line");
            self.stats.first_errors.push(message);
        }
        if self.stats.bad_lines > self.cfg.max_bad_lines {
            return Err(ReadError::ErrorBudgetExceeded {
                bad: self.stats.bad_lines,
                budget: self.cfg.max_bad_lines,
                first_errors: self.stats.first_errors.clone(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
