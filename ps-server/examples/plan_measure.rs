//! Loads R rows into a real engine on RocksDB and prints the measured memory (`Engine::memory_bytes`, process
//! RSS) and disk (RocksDB directory) beside what `ps-server plan` predicts.
//!
//! `cargo run --release -p ps-server --example plan_measure -- ROWS DIM [DIR] [PRECISION] [OPTIMIZER]
//! [STATE_PRECISION]` (DIR on a real disk, default a temporary directory under /tmp; PRECISION f32, bf16 or
//! f16, default f32; OPTIMIZER row-adagrad or adam, default row-adagrad; STATE_PRECISION f32 or bf16, default
//! f32).

use std::path::Path;
use std::sync::Arc;

use embedding::{Engine, RocksStore, TableConfig};
use ps_server::plan::{plan, PlanInput, PlanOptimizer};

fn rss_bytes() -> u64 {
    ps_server::writeback::resident_bytes().unwrap_or(0)
}

/// Bytes of every file under `dir` (what `du -sb` reports, without directory entries).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() {
                        dir_bytes(&e.path())
                    } else {
                        m.len()
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let dim: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16);
    let tmp = tempfile::tempdir_in(args.get(3).map_or("/tmp", String::as_str)).unwrap();
    let db = tmp.path().join("rocksdb");
    let precision: embedding::RowPrecision = args
        .get(4)
        .map_or(Ok(Default::default()), |s| s.parse())
        .unwrap();
    let optimizer = match args.get(5).map(String::as_str) {
        None | Some("row-adagrad") => PlanOptimizer::RowAdagrad,
        Some("adam") => PlanOptimizer::Adam,
        Some(other) => panic!("optimizer {other:?}: expected row-adagrad or adam"),
    };
    let state_precision: embedding::RowPrecision = args
        .get(6)
        .map_or(Ok(Default::default()), |s| s.parse())
        .unwrap();
    let p = plan(PlanInput {
        rows,
        dim,
        optimizer,
        precision,
        state_precision,
        memory_budget: None,
        server_memory: 1 << 40,
        block_cache_bytes: embedding::DEFAULT_BLOCK_CACHE_BYTES as u64,
    })
    .unwrap();

    let rss0 = rss_bytes();
    let engine = Engine::open(Arc::new(RocksStore::open(&db).unwrap())).unwrap();
    engine
        .register_table(TableConfig {
            optimizer: optimizer.config(),
            precision,
            state_precision,
            ..TableConfig::new(1, "t", dim)
        })
        .unwrap();
    let rss1 = rss_bytes();
    const BATCH: u64 = 4096;
    let grads = vec![0.01f32; BATCH as usize * dim];
    let mut ids = Vec::with_capacity(BATCH as usize);
    for start in (0..rows).step_by(BATCH as usize) {
        ids.clear();
        ids.extend(
            (start..(start + BATCH).min(rows))
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555),
        );
        engine.apply(1, &ids, &grads[..ids.len() * dim]).unwrap();
    }
    let rss2 = rss_bytes();
    let mem = engine.memory_bytes() as u64;
    engine.flush_dirty().unwrap();
    let disk_after_flush = dir_bytes(&db);
    drop(engine);
    // Reopen and close: recovery moves the write-ahead log into SST files.
    drop(RocksStore::open(&db).unwrap());
    let disk_sst = dir_bytes(&db);
    let engine2 = Engine::open(Arc::new(RocksStore::open(&db).unwrap())).unwrap();
    // A checkpoint with 10% of the rows dirty: the pause pushes see is its final write-back plus hard links.
    ids.clear();
    ids.extend((0..rows / 10).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555));
    let grads = vec![0.01f32; ids.len() * dim];
    engine2.apply(1, &ids, &grads).unwrap();
    let shard = embedding::snapshot::ShardInfo {
        index: 0,
        num_shards: 1,
        epoch: 1,
        num_virtual_shards: 4096,
        routing_fingerprint: 0,
    };
    let started = std::time::Instant::now();
    let m = engine2
        .checkpoint(&tmp.path().join("snap"), 1, shard, 0)
        .unwrap();
    let checkpoint_secs = started.elapsed().as_secs_f64();
    assert_eq!(m.rows(), rows);
    let pct = |a: f64, b: f64| (a / b - 1.0) * 100.0;
    println!(
        "rows {rows} dim {dim} {optimizer:?} {precision} | plan mem {:.2} B/row total {} | Engine::memory_bytes {} ({:.2} B/row, plan {:+.1}%) \
         | RSS growth {} ({:.2} B/row, plan {:+.1}%) | plan disk {:.1} B/row total {} | disk after flush {} ({:.1} B/row) \
         | disk after reopen (SST) {} ({:.1} B/row, plan {:+.1}%) | checkpoint with 10% dirty {:.2} s",
        p.memory_per_row,
        p.memory_total,
        mem,
        mem as f64 / rows as f64,
        pct(p.memory_total as f64, mem as f64),
        rss2 - rss1,
        (rss2 - rss1) as f64 / rows as f64,
        pct(p.memory_total as f64, (rss2 - rss1) as f64),
        p.disk_per_row,
        p.disk_total,
        disk_after_flush,
        disk_after_flush as f64 / rows as f64,
        disk_sst,
        disk_sst as f64 / rows as f64,
        pct(p.disk_total as f64, disk_sst as f64),
        checkpoint_secs,
    );
    let _ = rss0;
}
