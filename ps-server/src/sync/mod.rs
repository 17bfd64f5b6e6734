//! Delta sync, the server side (docs/serving.md, "Delta sync"; the wire side is `protocol::wire::message::sync`).
//!
//! [`SyncState`] holds this process's incarnation (a random `u64` drawn at start), the [`ChangeLog`] pushes
//! record into and a timer cuts, the newest dense parameters published, and a generation counter that wakes
//! waiting long-polls at every cut and publication. Answering a request (gathering the rows' current values)
//! is the handler's (`Shard::sync_deltas`); waiting for the next cut is the server loop's.
//!
//! # What counts as a change
//! - Every id of an accepted push (rows refused as non-finite included: their current value is sent, which
//!   is what a pull would answer).
//! - Every id a TTL expiry or a row cap deletes (`tasks::run_expiry_timer`, through
//!   [`embedding::Engine::expire_telling`]).
//! - Not the dense table ([`protocol::wire::dense::DENSE_TABLE`]); dense parameters travel by
//!   `PublishDense`.
//! - Not eviction to RocksDB (values do not change) nor recovery at start (a new incarnation: subscribers
//!   scan).
//!
//! The answer sends each recorded id as it is then: its row if the server holds one (in memory or RocksDB),
//! else a deletion (`DeltasHeader::deleted`), so serving drops a row the training servers dropped (expired,
//! capped, or a push of an id not admitted) and reads it as its initializer, as a pull would. A row deleted
//! and pushed again before the answer arrives as a row.

mod log;

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

pub use log::{ChangeLog, Delta, DeltaPage, Plan};

/// Default `--sync-retain-rows`: ids kept in retained deltas (16 Mi ids, 128 MiB).
pub const DEFAULT_RETAIN_ROWS: usize = 16 << 20;

/// Bytes of rows one answer carries at most (beside `max_rows`), below the default frame cap of 64 MiB.
pub const MAX_PAGE_BYTES: usize = 32 << 20;

/// Dense parameters published by a trainer.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseVersion {
    /// The publisher's version.
    pub version: u64,
    /// Training step.
    pub step: u64,
    /// When this server received them, Unix microseconds.
    pub published_us: u64,
    /// The values.
    pub values: Vec<f32>,
}

/// The sync state of one server (module docs).
#[derive(Debug)]
pub struct SyncState {
    /// This process's incarnation, never 0.
    pub incarnation: u64,
    /// `None` when tracking is off (`--sync-interval 0`): pushes record nothing, sync requests are refused.
    log: Option<ChangeLog>,
    dense: Mutex<Option<Arc<DenseVersion>>>,
    /// The last version each publishing job gave, at most [`MAX_DENSE_JOBS`] jobs.
    dense_jobs: Mutex<std::collections::HashMap<u64, u64>>,
    /// Bumped at every cut, publication and at shutdown; long-polls wait for it to change.
    generation: watch::Sender<u64>,
    closing: std::sync::atomic::AtomicBool,
}

impl Default for SyncState {
    /// Tracking on, [`DEFAULT_RETAIN_ROWS`], a random incarnation.
    fn default() -> SyncState {
        SyncState::new(true, DEFAULT_RETAIN_ROWS, draw_incarnation())
    }
}

/// Publishing jobs whose last version a server remembers (the oldest is forgotten past it).
pub const MAX_DENSE_JOBS: usize = 1024;

/// A random, non-zero `u64`: std's per-process random hash keys, mixed with the time and process id.
pub fn draw_incarnation() -> u64 {
    base::rng::unique_u64()
}

impl SyncState {
    /// Sync state with tracking on or off, keeping `retain_rows` ids of deltas, as process `incarnation` (> 0).
    pub fn new(tracking: bool, retain_rows: usize, incarnation: u64) -> SyncState {
        SyncState {
            incarnation: incarnation.max(1),
            log: tracking.then(|| ChangeLog::new(retain_rows)),
            dense: Mutex::new(None),
            dense_jobs: Mutex::default(),
            generation: watch::Sender::new(0),
            closing: Default::default(),
        }
    }

    /// The change log, if tracking is on.
    pub fn log(&self) -> Option<&ChangeLog> {
        self.log.as_ref()
    }

    /// Records a push's changed rows ([`ChangeLog::record`]); nothing when tracking is off.
    #[inline]
    pub fn record<'a>(&self, parts: impl IntoIterator<Item = (u32, &'a [u64])>, now_us: u64) {
        if let Some(log) = &self.log {
            log.record(parts, now_us);
        }
    }

    /// Cuts a delta ([`ChangeLog::cut`]) and wakes waiting long-polls if one was cut; returns the newest seq
    /// (0 with tracking off).
    pub fn cut(&self, now_us: u64) -> u64 {
        let Some(log) = &self.log else { return 0 };
        if let Some(delta) = log.cut(now_us) {
            metrics::counter!(crate::metrics::SYNC_DELTAS_CUT_TOTAL).increment(1);
            metrics::histogram!(crate::metrics::SYNC_DELTA_ROWS).record(delta.ids() as f64);
            metrics::gauge!(crate::metrics::SYNC_RETAINED_IDS).set(log.retained_ids() as f64);
            self.wake();
        }
        log.newest()
    }

    /// Keeps `dense`, published by `job`, if it is newer than the version held; returns the version held
    /// afterwards. Refuses a version not above `job`'s last one (versions grow within a job).
    pub fn publish(&self, job: u64, dense: DenseVersion) -> Result<u64, String> {
        let mut jobs = self.dense_jobs.lock();
        if let Some(&last) = jobs.get(&job) {
            if dense.version <= last {
                return Err(format!(
                    "publish dense: job {job:#x} published version {} after version {last}: versions grow \
                     within a job",
                    dense.version
                ));
            }
        }
        if jobs.len() >= MAX_DENSE_JOBS && !jobs.contains_key(&job) {
            // Forget the job that published longest ago (its versions are the smallest).
            if let Some((&oldest, _)) = jobs.iter().min_by_key(|(_, &v)| v) {
                jobs.remove(&oldest);
            }
        }
        jobs.insert(job, dense.version);
        drop(jobs);
        let mut held = self.dense.lock();
        Ok(match &*held {
            Some(d) if d.version >= dense.version => d.version,
            _ => {
                let v = dense.version;
                *held = Some(Arc::new(dense));
                drop(held);
                self.wake();
                v
            }
        })
    }

    /// The dense parameters held, if newer than `version`.
    pub fn dense_newer_than(&self, version: u64) -> Option<Arc<DenseVersion>> {
        self.dense
            .lock()
            .as_ref()
            .filter(|d| d.version > version)
            .cloned()
    }

    /// A receiver that sees the next cut, publication or shutdown (subscribe before planning, so that a cut
    /// between the plan and the wait is not missed).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Whether the server is shutting down (long-polls answer at once).
    pub fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Ends every wait: the server is shutting down.
    pub fn close(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}
