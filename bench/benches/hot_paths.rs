//! Micro benchmarks of the per-batch hot paths, each against a simple baseline in the same run.
//!
//! One batch of the demo is 2048 samples x 26 tables; after dedup, about 27k unique ids at dim 16.
//! Run: `cargo bench -p bench --bench hot_paths`. Table gather/apply against a `HashMap` baseline moved to
//! `storage.rs` (all optimizers, dims, threads and memory budgets).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use protocol::compression::codec;
use protocol::compression::feedback::{FeedbackConfig, ResidualStore};
use protocol::compression::topk::RowTopK;
use protocol::wire::ids::{self, IdCoding};
use protocol::{Encoding, ShardMap};

const DIM: usize = 16;
const IDS: usize = 27_000;

fn ids() -> Vec<u64> {
    (0..IDS as u64)
        .map(|i| protocol::routing::mix64(i * 7 + 1))
        .collect()
}

fn codecs(c: &mut Criterion) {
    let rows: Vec<f32> = (0..IDS * DIM)
        .map(|i| ((i % 97) as f32 - 48.0) * 0.01)
        .collect();
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(IDS as u64));
    for enc in Encoding::ALL {
        let mut out = Vec::with_capacity(rows.len() * 4);
        g.bench_with_input(BenchmarkId::new("encode_rows", enc), &enc, |b, &enc| {
            b.iter(|| {
                out.clear();
                codec::encode_rows(black_box(&rows), DIM, enc, &mut out);
            })
        });
        let mut bytes = Vec::new();
        codec::encode_rows(&rows, DIM, enc, &mut bytes);
        let mut back = vec![0.0f32; rows.len()];
        g.bench_with_input(BenchmarkId::new("decode_rows", enc), &enc, |b, &enc| {
            b.iter(|| codec::decode_rows(black_box(&bytes), DIM, enc, &mut back).unwrap())
        });
    }
    // Error feedback: encode with the residual added, decode the own bytes, keep the new residual.
    for enc in [Encoding::F16, Encoding::Int8] {
        let ids = ids();
        let mut store = ResidualStore::new(DIM, FeedbackConfig::default());
        let mut out = Vec::with_capacity(rows.len() * 4);
        g.bench_with_input(
            BenchmarkId::new("encode_rows_error_feedback", enc),
            &enc,
            |b, &enc| {
                b.iter(|| {
                    out.clear();
                    store.encode_rows(0, &ids, black_box(&rows), 2048.0, enc, &mut out);
                    store.end_step();
                })
            },
        );
    }
    // The same with a residual store of ~2M rows (ids from a 4M pool, a new window of 27k per step): the index
    // and residual lookups miss the cache as in a real run, unlike the 27k rows above.
    for enc in [Encoding::F16, Encoding::Int8] {
        let pool: Vec<u64> = (0..4 * 1024 * 1024u64)
            .map(|i| protocol::routing::mix64(i * 13 + 5))
            .collect();
        let mut store = ResidualStore::new(DIM, FeedbackConfig::default());
        let mut out = Vec::with_capacity(rows.len() * 4);
        let mut at = 0usize;
        let mut step = |store: &mut ResidualStore, out: &mut Vec<u8>, enc| {
            // Windows overlap by half, so about half the rows of a step hold a residual.
            let ids = &pool[at..at + IDS];
            at = (at + IDS / 2) % (pool.len() - IDS);
            out.clear();
            store.encode_rows(0, ids, black_box(&rows), 2048.0, enc, out);
            store.end_step();
        };
        for _ in 0..200 {
            step(&mut store, &mut out, enc);
        }
        g.bench_with_input(
            BenchmarkId::new("encode_rows_error_feedback_2M_rows_held", enc),
            &enc,
            |b, &enc| b.iter(|| step(&mut store, &mut out, enc)),
        );
    }
    g.finish();

    // Id sections of one batch's unique ids (27k): sort into wire order, encode, decode; against raw u64 LE.
    let mut g = c.benchmark_group("ids");
    g.throughput(Throughput::Elements(IDS as u64));
    let mut sorted = ids();
    ids::sort_for_wire(IdCoding::Unmixed, &mut sorted);
    let mut out = Vec::with_capacity(IDS * 10);
    g.bench_function("sort_for_wire/unmixed", |b| {
        let unsorted = ids();
        let mut v = unsorted.clone();
        b.iter(|| {
            v.copy_from_slice(&unsorted);
            ids::sort_for_wire(IdCoding::Unmixed, black_box(&mut v));
        })
    });
    g.bench_function("encode/unmixed_delta_varint", |b| {
        b.iter(|| {
            out.clear();
            ids::put_ids(IdCoding::Unmixed, black_box(&sorted), &mut out);
        })
    });
    g.bench_function("encode/raw_u64_baseline", |b| {
        b.iter(|| {
            out.clear();
            for id in black_box(&sorted) {
                out.extend_from_slice(&id.to_le_bytes());
            }
        })
    });
    let mut section = Vec::new();
    ids::put_ids(IdCoding::Unmixed, &sorted, &mut section);
    let mut back = Vec::with_capacity(IDS);
    g.bench_function("decode/unmixed_delta_varint", |b| {
        b.iter(|| {
            back.clear();
            ids::get_ids(black_box(&section), IDS, &mut back).unwrap()
        })
    });
    let mut raw = Vec::new();
    for id in &sorted {
        raw.extend_from_slice(&id.to_le_bytes());
    }
    g.bench_function("decode/raw_u64_baseline", |b| {
        b.iter(|| {
            back.clear();
            back.extend(
                black_box(&raw)
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
            );
        })
    });
    g.finish();

    // Row-wise top-k with error feedback of a dense delta the size of DLRM's dense layers (~0.5M values,
    // rows of 64 as in the servers' dense table), 1% of the rows sent (`--dense-push-fraction 0.01`).
    let (rows, row_dim) = (8192, 64);
    let delta: Vec<f32> = (0..rows * row_dim)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let mut t = RowTopK::new(rows, row_dim, rows / 100);
    let mut work = delta.clone();
    let mut g = c.benchmark_group("topk");
    g.throughput(Throughput::Elements(delta.len() as u64));
    g.bench_function("rows_1pct", |b| {
        b.iter(|| {
            work.copy_from_slice(&delta);
            black_box(t.sparsify(black_box(&mut work)));
        })
    });
    g.finish();
}

fn routing(c: &mut Criterion) {
    let ids = ids();
    let map = ShardMap::new(2);
    let mut out = Vec::new();
    let mut g = c.benchmark_group("routing");
    g.throughput(Throughput::Elements(IDS as u64));
    g.bench_function("group_by_server", |b| {
        b.iter(|| map.group(black_box(&ids), &mut out))
    });
    g.finish();
}

/// The role check every request passes since issue 39 (`Access::authorize_request`, at the server's one dispatch
/// point), for a demo-sized pull (26 tables) from a trainer, and a refused one (its message is formatted), against
/// routing the same pull's ids: the check is per request, the routing per id.
fn authorization(c: &mut Criterion) {
    use protocol::wire::layout::TableCount;
    use protocol::wire::message::Request;
    use protocol::{Access, Role};
    let pull = Request::Pull {
        epoch: 1,
        encoding: Encoding::F16,
        tables: (0..26)
            .map(|table| TableCount {
                table,
                count: 1024,
                dim: DIM as u32,
            })
            .collect(),
    };
    let trainer = Access::Role(Role::Trainer);
    let admin_only = Request::Reshard {
        step: protocol::wire::message::reshard::ReshardStep::Status,
    };
    let mut g = c.benchmark_group("authorization");
    g.bench_function("pull_by_trainer", |b| {
        b.iter(|| {
            black_box(&trainer)
                .authorize_request(black_box(&pull))
                .is_ok()
        })
    });
    g.bench_function("reshard_by_trainer_refused", |b| {
        b.iter(|| {
            black_box(&trainer)
                .authorize_request(black_box(&admin_only))
                .is_err()
        })
    });
    g.finish();
}

criterion_group!(benches, codecs, routing, authorization);
criterion_main!(benches);
