//! What serving holds once an export is loaded: its rows, its feature layout, and how fresh it is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criteo::FeatureLayout;

use crate::store::RowStore;

/// A loaded export and its freshness.
#[derive(Debug)]
pub struct Loaded {
    /// The export's version (its training step).
    pub export_version: u64,
    /// The export's directory.
    pub export_dir: std::path::PathBuf,
    /// The model's name (from its spec).
    pub model: String,
    /// How request rows become features.
    pub features: FeatureLayout,
    /// The embedding rows.
    pub store: Arc<RowStore>,
    /// Freshness, updated by delta sync.
    pub fresh: Arc<Freshness>,
}

/// How fresh the served state is.
#[derive(Debug, Default)]
pub struct Freshness {
    /// When the newest applied update was cut on a training server (or the export written), Unix µs.
    pub newest_unix_us: AtomicU64,
    /// Deltas applied.
    pub deltas: AtomicU64,
    /// Rows applied from deltas.
    pub delta_rows: AtomicU64,
    /// The dense version in use (Unix µs of its publication or of the export).
    pub dense_version: AtomicU64,
    /// The training step of the dense parameters in use.
    pub dense_step: AtomicU64,
}

impl Freshness {
    /// Records an update cut at `unix_us` (keeps the newest).
    pub fn saw(&self, unix_us: u64) {
        self.newest_unix_us.fetch_max(unix_us, Ordering::Relaxed);
    }

    /// Seconds since the newest update, at `now_us`.
    pub fn age_seconds(&self, now_us: u64) -> f64 {
        now_us.saturating_sub(self.newest_unix_us.load(Ordering::Relaxed)) as f64 / 1e6
    }
}

/// Microseconds since the Unix epoch.
pub fn now_unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Loaded {
    /// `GET /v1/model`'s answer.
    pub fn describe(&self) -> serde_json::Value {
        let f = &self.fresh;
        serde_json::json!({
            "model": self.model,
            "export_version": self.export_version,
            "export_dir": self.export_dir.display().to_string(),
            "dense_version": f.dense_version.load(Ordering::Relaxed),
            "dense_step": f.dense_step.load(Ordering::Relaxed),
            "newest_update_unix_us": f.newest_unix_us.load(Ordering::Relaxed),
            "age_seconds": f.age_seconds(now_unix_us()),
            "deltas_applied": f.deltas.load(Ordering::Relaxed),
            "delta_rows": f.delta_rows.load(Ordering::Relaxed),
            "rows_in_memory": self.store.rows_in_memory(),
            "shards": self.store.shards(),
        })
    }
}
