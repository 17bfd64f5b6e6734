//! RocksDB's own limit for the capacity tier (issue 17): point writes and reads of one row (dim 16 with
//! row-wise Adagrad: 17 f32 = 68 bytes, key 8 bytes) through [`embedding::RocksStore`], the exact calls the
//! tier makes, with the server's tuning (`point-lookup`) and with RocksDB's defaults, in one run:
//!
//! - `write`: a batch of [`BATCH`] rows (one WriteBatch, not synced: an eviction's write);
//! - `read_memtable`: a multi-get of [`BATCH`] random stored ids while the rows sit in memtables (a read-back of
//!   rows evicted a moment ago);
//! - `read_sst`: the same after the memtables were flushed to SST files (rows evicted long ago);
//! - `read_absent`: a multi-get of ids never written (a first pass's new ids: answered by bloom filters).
//!
//! Throughput is rows per second on one thread; its inverse is the CPU cost per row the tier cannot go below
//! with RocksDB. [`ROWS`] rows per table (the sweep's V).
//!
//! Run: `cargo bench -p bench --bench rocks_limit` (about a minute).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use embedding::{DirtyBatch, RocksStore, RocksTuning, Store};

/// Rows stored per table.
const ROWS: u64 = 500_000;
/// Rows per write batch and per multi-get: a read-back of one pull's misses is a few hundred ids.
const BATCH: usize = 256;
/// f32s per row: dim 16 plus the row-wise Adagrad accumulator.
const ROW_LEN: usize = 17;

/// Ids of the stored rows: spread over the key space like hashed ids.
fn id(k: u64) -> u64 {
    base::rng::SplitMix64::new(k).next_u64()
}

/// A store of [`ROWS`] rows in table 1 with `tuning`; with `flushed`, every row is in SST files.
fn store(dir: &std::path::Path, tuning: RocksTuning, flushed: bool) -> Arc<RocksStore> {
    let store = Arc::new(RocksStore::open_tuned(dir, tuning).unwrap());
    store.ensure_table(1).unwrap();
    let row = vec![0.25f32; ROW_LEN];
    let mut batch = DirtyBatch::new();
    for chunk in (0..ROWS).collect::<Vec<_>>().chunks(4096) {
        batch.reset(ROW_LEN * 4);
        for &k in chunk {
            batch.push_row(id(k), &row);
        }
        store.write_rows(1, &batch, false).unwrap();
    }
    if flushed {
        store.flush_table_memtables(1).unwrap();
    }
    store
}

/// Batches of [`BATCH`] sorted ids: stored ids, or ids never written (`absent`).
fn id_batches(absent: bool) -> Vec<Vec<u64>> {
    let mut rng = base::rng::SplitMix64::new(if absent { 9 } else { 7 });
    (0..64)
        .map(|_| {
            let mut ids: Vec<u64> = (0..BATCH)
                .map(|_| {
                    let k = rng.next_u64() % ROWS;
                    if absent {
                        id(k + ROWS)
                    } else {
                        id(k)
                    }
                })
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        })
        .collect()
}

fn read(c: &mut Criterion, name: &str, store: &RocksStore, batches: &[Vec<u64>]) {
    let mut g = c.benchmark_group("rocks_limit");
    g.throughput(Throughput::Elements(batches[0].len() as u64));
    let mut k = 0;
    g.bench_function(name, |b| {
        b.iter(|| {
            let ids = &batches[k % batches.len()];
            k += 1;
            let mut found = 0usize;
            store
                .get_rows(1, ids, &mut |_, v| {
                    found += usize::from(v.is_some());
                    Ok(())
                })
                .unwrap();
            black_box(found)
        })
    });
    g.finish();
}

fn limits(c: &mut Criterion) {
    for (label, point_lookup) in [("tuned", true), ("defaults", false)] {
        let tuning = RocksTuning {
            point_lookup,
            ..RocksTuning::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let mem = store(&dir.path().join("mem"), tuning, false);
        read(
            c,
            &format!("{label}/read_memtable"),
            &mem,
            &id_batches(false),
        );
        let mut g = c.benchmark_group("rocks_limit");
        g.throughput(Throughput::Elements(BATCH as u64));
        let row = vec![0.5f32; ROW_LEN];
        let mut batch = DirtyBatch::new();
        let mut next = 2 * ROWS;
        g.bench_function(format!("{label}/write"), |b| {
            b.iter(|| {
                batch.reset(ROW_LEN * 4);
                for _ in 0..BATCH {
                    batch.push_row(id(next % (4 * ROWS)), &row);
                    next += 1;
                }
                mem.write_rows(1, &batch, false).unwrap();
            })
        });
        g.finish();
        drop(mem);
        let sst = store(&dir.path().join("sst"), tuning, true);
        read(c, &format!("{label}/read_sst"), &sst, &id_batches(false));
        read(c, &format!("{label}/read_absent"), &sst, &id_batches(true));
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = limits
}
criterion_main!(benches);
