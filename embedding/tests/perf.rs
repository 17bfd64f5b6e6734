//! Rough measurements, not benchmarks: memory per row and gather/apply/flush/recovery rates. Ignored by
//! default and free of timing assertions. Run with
//! `cargo test -p embedding --release --test perf -- --ignored --nocapture`; `PERF_ROWS=10000000` sets the
//! row count (default 1,000,000). Memory is reported three ways: live heap bytes counted by this file's
//! allocator, the engine's own accounting (`Table::memory_bytes`) and the growth of the process RSS
//! (`VmRSS` in `/proc/self/status`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use base::hash::splitmix64;
use embedding::{Engine, RocksStore, Table, TableConfig};

/// Counts live heap bytes, so the table's real footprint can be compared with `Table::memory_bytes`.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates to the system allocator; only adds counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const DIM: usize = 16;
const BATCH: usize = 4096;

/// Rows to create: `PERF_ROWS`, default 1,000,000.
fn rows() -> usize {
    std::env::var("PERF_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn ids(rows: usize) -> Vec<u64> {
    (0..rows as u64).map(|i| splitmix64(i ^ 0xABCD)).collect()
}

/// The process's resident set size in bytes (`VmRSS` in `/proc/self/status`), 0 if unreadable.
fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Runs `f` over batches of `ids` for about `secs` seconds on `threads` threads; returns rows per second.
fn rate(threads: usize, secs: f64, ids: &[u64], f: impl Fn(&[u64]) + Sync) -> f64 {
    let start = Instant::now();
    let rows = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (rows, f) = (&rows, &f);
            s.spawn(move || {
                let mut k = t * 997;
                while start.elapsed().as_secs_f64() < secs {
                    let at = (k * BATCH) % (ids.len() - BATCH);
                    f(&ids[at..at + BATCH]);
                    rows.fetch_add(BATCH, Ordering::Relaxed);
                    k += 1;
                }
            });
        }
    });
    rows.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore = "measurement; run in release with --ignored --nocapture"]
fn measure_memory_and_rates() {
    let rows = rows();
    let ids = ids(rows);
    let cfg = TableConfig::new(1, "perf", DIM);
    assert_eq!(cfg.row_len(), 17);
    let grads = vec![0.01f32; BATCH * DIM];

    let before = LIVE.load(Ordering::Relaxed);
    let rss_before = rss_bytes();
    let table = Table::new(cfg.clone()).unwrap();
    let t0 = Instant::now();
    for chunk in ids.chunks(BATCH) {
        table.apply(chunk, &grads[..chunk.len() * DIM]).unwrap();
    }
    let insert_s = t0.elapsed().as_secs_f64();
    let live = LIVE.load(Ordering::Relaxed) - before;
    let rss = rss_bytes() - rss_before;
    let payload = 17 * 4;
    println!(
        "memory: {} rows dim {DIM} row-wise adagrad: heap {:.2} B/row (memory_bytes {:.2} B/row), payload {payload} B/row, {:.3}x; process RSS {:.1} MB, growth {:.2} B/row",
        table.len(),
        live as f64 / rows as f64,
        table.memory_bytes() as f64 / rows as f64,
        live as f64 / (rows * payload) as f64,
        rss_bytes() as f64 / 1e6,
        rss as f64 / rows as f64
    );
    println!(
        "insert (apply creating rows): {:.2} M rows/s",
        rows as f64 / insert_s / 1e6
    );

    let mut out = vec![0f32; BATCH * DIM];
    for threads in [1, 2] {
        let g = rate(threads, 2.0, &ids, |b| {
            let mut out = vec![0f32; BATCH * DIM];
            table.gather(b, &mut out).unwrap();
        });
        let a = rate(threads, 2.0, &ids, |b| {
            table.apply(b, &grads).unwrap();
        });
        println!(
            "{threads} thread(s): gather {:.2} M rows/s, apply {:.2} M rows/s",
            g / 1e6,
            a / 1e6
        );
    }
    table.gather(&ids[..BATCH], &mut out).unwrap();

    let mut batch = embedding::DirtyBatch::new();
    let t0 = Instant::now();
    let mut taken = 0;
    loop {
        let n = table.take_dirty(BATCH, &mut batch);
        if n == 0 {
            break;
        }
        taken += n;
    }
    println!(
        "take_dirty alone: {taken} rows at {:.2} M rows/s",
        taken as f64 / t0.elapsed().as_secs_f64() / 1e6
    );

    // Write-back and recovery through RocksDB.
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
    engine.register_table(cfg).unwrap();
    let t = engine.table(1).unwrap();
    for chunk in ids.chunks(BATCH) {
        t.apply(chunk, &grads[..chunk.len() * DIM]).unwrap();
    }
    let t0 = Instant::now();
    let stats = engine.flush_dirty().unwrap();
    let flush_s = t0.elapsed().as_secs_f64();
    println!(
        "flush_dirty to rocksdb: {} rows, {} batches, {} MB in {flush_s:.2}s ({:.2} M rows/s)",
        stats.rows,
        stats.batches,
        stats.bytes / 1_000_000,
        stats.rows as f64 / flush_s / 1e6
    );
    drop((t, engine));
    let t0 = Instant::now();
    let engine = Engine::open(Arc::new(RocksStore::open(dir.path()).unwrap())).unwrap();
    let open_s = t0.elapsed().as_secs_f64();
    println!(
        "recovery (Engine::open): {} rows in {open_s:.2}s ({:.2} M rows/s)",
        engine.rows_total(),
        engine.rows_total() as f64 / open_s / 1e6
    );
}

/// A profiling target: gather and apply on a cache-resident table (27k rows, dim 16, row-wise Adagrad), e.g.
/// `perf record -g target/release/deps/perf-* hot_table --ignored`.
#[test]
#[ignore = "measurement; run in release with --ignored --nocapture"]
fn hot_table() {
    let ids = ids(27_000);
    let table = Table::new(TableConfig::new(1, "hot", DIM)).unwrap();
    let grads = vec![0.01f32; BATCH * DIM];
    for chunk in ids.chunks(BATCH) {
        table.apply(chunk, &grads[..chunk.len() * DIM]).unwrap();
    }
    let batch: Vec<u64> = (0..2 * BATCH + 1)
        .map(|i| ids[splitmix64(i as u64) as usize % ids.len()])
        .collect();
    let mut out = vec![0f32; BATCH * DIM];
    let g = rate(1, 2.0, &batch, |b| {
        let mut out = vec![0f32; BATCH * DIM];
        table.gather(b, &mut out).unwrap();
    });
    let a = rate(1, 2.0, &batch, |b| {
        table.apply(b, &grads[..b.len() * DIM]).unwrap();
    });
    table.gather(&batch[..BATCH], &mut out).unwrap();
    println!(
        "hot table: gather {:.2} M rows/s, apply {:.2} M rows/s",
        g / 1e6,
        a / 1e6
    );
}
