//! Micro benchmarks of the per-batch hot paths, each against a simple baseline in the same run.
//!
//! One batch of the demo is 2048 samples x 26 tables; after dedup, about 27k unique ids at dim 16.
//! Run: `cargo bench -p bench --bench hot_paths`.

use std::collections::HashMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use embedding::{OptimizerConfig, Table, TableConfig};
use protocol::{codec, Encoding, ShardMap};

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
    for enc in [Encoding::F32, Encoding::F16, Encoding::Bf16] {
        let mut out = Vec::with_capacity(rows.len() * 4);
        g.bench_with_input(BenchmarkId::new("encode_rows", enc), &enc, |b, &enc| {
            b.iter(|| {
                out.clear();
                codec::encode(black_box(&rows), enc, &mut out);
            })
        });
        let mut bytes = Vec::new();
        codec::encode(&rows, enc, &mut bytes);
        let mut back = vec![0.0f32; rows.len()];
        g.bench_with_input(BenchmarkId::new("decode_rows", enc), &enc, |b, &enc| {
            b.iter(|| codec::decode(black_box(&bytes), enc, &mut back).unwrap())
        });
    }
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

fn table(c: &mut Criterion) {
    let ids = ids();
    let cfg = TableConfig {
        optimizer: OptimizerConfig::RowAdagrad {
            lr: 0.05,
            eps: 1e-8,
            initial_accumulator: 0.0,
        },
        ..TableConfig::new(0, "C1", DIM)
    };
    let table = Table::new(cfg).unwrap();
    let grads: Vec<f32> = (0..IDS * DIM)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.001)
        .collect();
    table.apply(&ids, &grads).unwrap();
    let mut out = vec![0.0f32; IDS * DIM];
    // Baseline: a HashMap of Vecs, the naive parameter store.
    let mut naive: HashMap<u64, Vec<f32>> =
        ids.iter().map(|&id| (id, vec![0.01; DIM + 1])).collect();

    let mut g = c.benchmark_group("table");
    g.throughput(Throughput::Elements(IDS as u64));
    g.bench_function("gather/arena", |b| {
        b.iter(|| table.gather(black_box(&ids), &mut out).unwrap())
    });
    g.bench_function("gather/hashmap_vec_baseline", |b| {
        b.iter(|| {
            for (k, id) in ids.iter().enumerate() {
                out[k * DIM..(k + 1) * DIM].copy_from_slice(&naive[id][..DIM]);
            }
        })
    });
    g.bench_function("apply_row_adagrad/arena", |b| {
        b.iter(|| table.apply(black_box(&ids), &grads).unwrap())
    });
    g.bench_function("apply_row_adagrad/hashmap_vec_baseline", |b| {
        b.iter(|| {
            for (k, id) in ids.iter().enumerate() {
                let row = naive.get_mut(id).unwrap();
                let g = &grads[k * DIM..(k + 1) * DIM];
                let (w, acc) = row.split_at_mut(DIM);
                acc[0] += g.iter().map(|x| x * x).sum::<f32>() / DIM as f32;
                let step = 0.05 / (acc[0].sqrt() + 1e-8);
                w.iter_mut().zip(g).for_each(|(w, g)| *w -= step * g);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, codecs, routing, table);
criterion_main!(benches);
