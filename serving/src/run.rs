//! The serving process end to end: the HTTP endpoint first (so probes answer while the export loads), then
//! the export, the predicting thread, delta sync, and a clean stop on shutdown.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use clap::Parser;

use crate::batcher::{BatchLimits, Batcher};
use crate::config::{ServeConfig, ServeOptions};
use crate::http::{HttpLimits, Shared};
use crate::predict::{DenseTemplate, Predictor};
use crate::state::{Freshness, Loaded};
use crate::store::RowStore;

/// `ps-serve`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "ps-serve",
    version,
    about = "Serves click predictions from a trained export"
)]
pub struct Cli {
    /// TOML file of the settings below (kebab-case keys); flags and environment override it.
    #[arg(long, env = "PS_SERVE_CONFIG")]
    pub config: Option<PathBuf>,
    /// The settings.
    #[command(flatten)]
    pub options: ServeOptions,
}

/// The binary's entry point.
pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    ops::logging::init();
    let file = match &cli.config {
        Some(path) => ServeOptions::load(path)?,
        None => ServeOptions::default(),
    };
    let cfg = cli.options.over(file).validate()?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .thread_name(|i| format!("predict-{i}"))
        .build_global()
        .context("start the prediction thread pool")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("serve-io")
        .build()
        .context("start tokio runtime")?;
    rt.block_on(run(cfg, ops::shutdown::signal()))
}

/// Serves until `shutdown` resolves: readiness drops at once, open requests finish (up to the drain
/// timeout), then the process's state is removed (a temporary data directory).
pub async fn run(
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let prometheus = ops::http::install_recorder(ops::buckets::LATENCY_BUCKETS);
    crate::metrics::describe();
    let (listener, bound) = ops::http::bind(cfg.listen)
        .await
        .with_context(|| format!("bind --listen {}", cfg.listen))?;
    let health = Arc::new(ops::http::Health::default());
    let shared = Arc::new(Shared {
        loaded: OnceLock::new(),
        batcher: OnceLock::new(),
        limits: HttpLimits {
            max_body_bytes: cfg.max_body_bytes,
            max_rows: cfg.max_rows,
            max_connections: cfg.max_connections,
            max_connections_per_client: cfg.max_connections_per_client,
            header_timeout: cfg.header_timeout,
            body_timeout: cfg.body_timeout,
            api_token: cfg.api_token.clone(),
            embedding_api: cfg.enable_embedding_api,
        },
        prometheus,
        health: health.clone(),
    });
    let stopping = Arc::new(tokio::sync::Notify::new());
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let on_stop = {
        let (health, stopping, stopped) = (health.clone(), stopping.clone(), stopped.clone());
        async move {
            shutdown.await;
            health.set_ready(false);
            stopped.store(true, std::sync::atomic::Ordering::Relaxed);
            stopping.notify_waiters();
            tracing::info!("shutting down: draining open requests");
        }
    };
    let server = tokio::spawn(crate::http::serve(
        listener,
        shared.clone(),
        on_stop,
        cfg.drain_timeout,
    ));
    println!("ps-serve listening on http://{bound}");
    tracing::info!(%bound, export = %cfg.export.display(), "listening; loading the export");

    let (data_dir, temporary) = match &cfg.data_dir {
        Some(d) => (d.clone(), false),
        None => {
            let tmp = std::env::temp_dir();
            let removed = remove_stale_work_dirs(&tmp, std::process::id());
            if removed > 0 {
                tracing::info!(removed, dir = %tmp.display(), "removed the work directories of dead ps-serve processes");
            }
            (
                tmp.join(format!("{WORK_DIR_PREFIX}{}", std::process::id())),
                true,
            )
        }
    };
    let loaded = {
        let cfg = cfg.clone();
        let data_dir = data_dir.clone();
        let stopped = stopped.clone();
        tokio::task::spawn_blocking(move || load(&cfg, &data_dir, &stopped)).await?
    };
    let (loaded, predictor, template) = match loaded {
        Ok(Some(l)) => l,
        Ok(None) => {
            // Stopped before any export appeared.
            server.await.context("HTTP server task")?;
            return Ok(());
        }
        Err(e) => {
            server.abort();
            if temporary {
                let _ = std::fs::remove_dir_all(&data_dir);
            }
            return Err(e);
        }
    };
    let store = loaded.store.clone();
    let (batcher, predict_thread) = Batcher::spawn(
        predictor,
        store,
        BatchLimits {
            deadline: cfg.batch_deadline,
            max_rows: cfg.max_batch_rows,
            max_queued_rows: cfg.max_queued_rows,
        },
    )
    .context("start the prediction thread")?;
    println!(
        "serving export {} (version {}, model {}): {} rows in memory over {} shards",
        loaded.export_dir.display(),
        loaded.export_version,
        loaded.model,
        loaded.store.rows_in_memory(),
        loaded.store.shards()
    );
    let store = loaded.store.clone();
    let _ = shared.batcher.set(batcher.clone());
    let _ = shared.loaded.set(loaded);
    let loaded = shared.loaded.get().expect("just set");
    let tasks = crate::sync::start(&cfg, loaded, &batcher, template, stopping.clone()).await?;
    health.set_ready(true);
    tracing::info!("ready");
    server.await.context("HTTP server task")?;
    // Close the rows before the process exits: RocksDB must not be open while its statics are destroyed.
    for t in tasks {
        t.abort();
        let _ = t.await;
    }
    drop(batcher);
    drop(shared);
    let _ = tokio::task::spawn_blocking(move || predict_thread.join()).await;
    for _ in 0..500 {
        if Arc::strong_count(&store) == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    if Arc::strong_count(&store) > 1 {
        tracing::warn!("embedding rows still in use at exit");
    }
    drop(store);
    if temporary {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    tracing::info!("stopped");
    Ok(())
}

/// Opens the export, its rows and its model (blocking). While `--export` holds no export yet (a training
/// job has not written its first), waits for one, checking every second, until `stopping` is set.
/// Name of the work directory (its rows' RocksDB copy) a `ps-serve` without `--data-dir` makes in the temporary
/// directory, followed by its process id.
const WORK_DIR_PREFIX: &str = "ps-serve-";

/// Removes from `tmp` the work directories of `ps-serve` processes that are gone (killed: SIGKILL, OOM), which
/// nothing else would remove (each holds a copy of an export's rows, 150 MB for the demo's), and returns how
/// many. A directory whose process is alive (`/proc/<pid>` exists), or whose name is not the prefix and a
/// number, is left. Linux only: elsewhere liveness is not checked and nothing is removed.
fn remove_stale_work_dirs(tmp: &std::path::Path, own: u32) -> usize {
    if !cfg!(target_os = "linux") {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(WORK_DIR_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if pid == own || !is_dir || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => removed += 1,
            Err(err) => {
                tracing::warn!(dir = %e.path().display(), error = %err, "could not remove a dead ps-serve's work directory")
            }
        }
    }
    removed
}

fn load(
    cfg: &ServeConfig,
    data_dir: &std::path::Path,
    stopping: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Option<(Loaded, Predictor, DenseTemplate)>> {
    use model::export::{Export, ExportError};
    let mut logged = false;
    let export = loop {
        match Export::open(&cfg.export) {
            Err(ExportError::NotAnExport { .. }) if cfg.export.is_dir() => {
                if !logged {
                    tracing::info!(export = %cfg.export.display(), "no export yet; waiting for a training job to write one");
                    logged = true;
                }
                if stopping.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(None);
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            other => {
                break other.with_context(|| format!("open --export {}", cfg.export.display()))?
            }
        }
    };
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("create --data-dir {}", data_dir.display()))?;
    let store = match cfg.row_precision {
        Some(precision) => {
            RowStore::open_compact(&export.snapshot_dir(), precision, &export.manifest.tables)
        }
        None => RowStore::open(
            &export.snapshot_dir(),
            data_dir,
            cfg.memory_budget_rows,
            &export.manifest.tables,
        ),
    }
    .with_context(|| format!("open the rows of export {}", export.dir.display()))?;
    tracing::info!(
        rows = store.rows_in_memory(),
        bytes = store.memory_bytes(),
        precision = cfg
            .row_precision
            .map_or("as stored".to_string(), |p| p.to_string()),
        "rows loaded"
    );
    // Dense versions are Unix µs (a trainer's publications, docs/serving.md); the export's is its creation.
    let dense_version = export.manifest.created_unix_ms.saturating_mul(1000);
    let predictor = Predictor::new(&export, dense_version)?;
    let template = DenseTemplate::of(&export);
    let fresh = Arc::new(Freshness::default());
    fresh.saw(export.manifest.created_unix_ms.saturating_mul(1000));
    fresh
        .dense_version
        .store(dense_version, std::sync::atomic::Ordering::Relaxed);
    fresh.dense_step.store(
        export.manifest.version,
        std::sync::atomic::Ordering::Relaxed,
    );
    metrics::gauge!(crate::metrics::EXPORT_VERSION).set(export.manifest.version as f64);
    metrics::gauge!(crate::metrics::DENSE_VERSION).set(dense_version as f64);
    metrics::gauge!(crate::metrics::ROWS_IN_MEMORY).set(store.rows_in_memory() as f64);
    metrics::gauge!(crate::metrics::ROWS_MEMORY_BYTES).set(store.memory_bytes() as f64);
    Ok(Some((
        Loaded {
            export_version: export.manifest.version,
            model: export.manifest.spec.name.clone(),
            features: export.manifest.spec.feature_layout(),
            export_dir: export.dir.clone(),
            store: Arc::new(store),
            fresh,
        },
        predictor,
        template,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work directory of a process that is gone is removed; those of live processes (this one, pid 1),
    /// files and other names are left.
    #[test]
    fn work_dirs_of_dead_processes_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let own = std::process::id();
        for name in [
            format!("{WORK_DIR_PREFIX}{dead}"),
            format!("{WORK_DIR_PREFIX}{own}"),
            format!("{WORK_DIR_PREFIX}1"),
            format!("{WORK_DIR_PREFIX}x"),
            "other".into(),
        ] {
            std::fs::create_dir_all(tmp.path().join(&name).join("rocksdb")).unwrap();
        }
        std::fs::write(
            tmp.path().join(format!("{WORK_DIR_PREFIX}999999999")),
            b"a file",
        )
        .unwrap();
        assert_eq!(remove_stale_work_dirs(tmp.path(), own), 1);
        let left: std::collections::BTreeSet<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            !left.contains(&format!("{WORK_DIR_PREFIX}{dead}")),
            "{left:?}"
        );
        assert_eq!(left.len(), 5, "{left:?}");
    }
}
