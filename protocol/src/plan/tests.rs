//! Tests of [`super::Plan`]: routing, wire order, per-table encodings, error feedback.

use super::*;
use crate::wire::message::pull_with_state::put_state;

/// Serves a pull as if the row of id x were [x mod 1000, -(x mod 1000)], in `enc`.
fn serve(counts: &[TableCount], ids: &[u8], enc: Encoding) -> Vec<u8> {
    let mut all = Vec::new();
    crate::wire::message::pull::decode(counts, ids, &mut all).unwrap();
    let mut rows = Vec::new();
    for id in all {
        let x = (id % 1000) as f32;
        codec::encode_rows(&[x, -x], 2, enc, &mut rows);
    }
    rows
}

#[test]
fn dedup_route_gather_reduce_round_trip() {
    let map = ShardMap::new(2);
    let sparse = vec![vec![5u64, 9, 5, 7], vec![1u64, 1, 1, 1]];
    let mut plan = Plan::default();
    plan.build(&sparse, 2, &map);
    assert_eq!(plan.unique(0), &[5, 9, 7]);
    assert_eq!(plan.unique(1), &[1]);
    assert_eq!(plan.unique_ids(), 4);
    let mut unique_rows = Vec::new();
    for s in 0..2 {
        let (counts, ids) = plan.pull_request(s);
        let rows = serve(&counts, &ids, Encoding::F32);
        plan.scatter_pulled(s, &rows, Encoding::F32, &mut unique_rows)
            .unwrap();
    }
    let mut emb = Vec::new();
    plan.gather_embeddings(&unique_rows, &mut emb);
    assert_eq!(
        emb,
        [5., -5., 1., -1., 9., -9., 1., -1., 5., -5., 1., -1., 7., -7., 1., -1.]
    );
    // Gradients: sample i, table t, element e = i + 10t + 100e.
    let grad: Vec<f32> = (0..4)
        .flat_map(|i| (0..2).flat_map(move |t| (0..2).map(move |e| (i + 10 * t + 100 * e) as f32)))
        .collect();
    let mut sums = Vec::new();
    plan.reduce_gradients(&grad, 2.0, &mut sums);
    assert_eq!(
        sums[0],
        [2.0 * 2., 2.0 * 202., 2.0, 2.0 * 101., 6.0, 2.0 * 103.]
    );
    assert_eq!(sums[1], [2.0 * 46., 2.0 * 446.]);
    let mut pushed = 0;
    for s in 0..2 {
        let (counts, payload) = plan.push_request(s, &sums, Encoding::F32);
        let n: usize = counts.iter().map(|c| c.count as usize).sum();
        let mut ids = Vec::new();
        let rows =
            crate::wire::message::push::decode(&counts, Encoding::F32, &payload, &mut ids).unwrap();
        assert_eq!(rows.len(), n * 2 * 4);
        // Each row travels with its id: the gradient of id 9 is [2, 202] * 2.
        let mut g = vec![0.0; n * 2];
        codec::decode_rows(rows, 2, Encoding::F32, &mut g).unwrap();
        let mut k = 0;
        for c in &counts {
            for _ in 0..c.count {
                let want: &[f32] = match (c.table, ids[k]) {
                    (0, 5) => &sums[0][0..2],
                    (0, 9) => &sums[0][2..4],
                    (0, 7) => &sums[0][4..6],
                    _ => &sums[1][0..2],
                };
                assert_eq!(&g[k * 2..k * 2 + 2], want);
                k += 1;
            }
        }
        pushed += n;
    }
    assert_eq!(pushed, 4);
}

#[test]
fn ids_travel_sorted_by_wire_key() {
    let map = ShardMap::new(1);
    let sparse = vec![(0..200u64).map(|i| crate::routing::mix64(i * 7)).collect()];
    let mut plan = Plan::default();
    plan.build(&sparse, 1, &map);
    let (counts, ids) = plan.pull_request(0);
    assert_eq!(counts[0].count, 200);
    // 200 pre-images 0, 7, .. 1393: one or two varint bytes each, not eight.
    assert!(ids.len() < 1 + 2 * 200, "{}", ids.len());
}

#[test]
fn per_table_encodings_split_requests_and_round_trip() {
    let map = ShardMap::new(2);
    let sparse: Vec<Vec<u64>> = (0..3u64)
        .map(|t| (0..50).map(|i| t * 1_000_000 + i % 37).collect())
        .collect();
    let mut plan = Plan::default();
    plan.build(&sparse, 2, &map);
    let codecs = TableCodecs {
        pull: vec![Encoding::F32, Encoding::Int8, Encoding::F32],
        push: vec![Encoding::F16, Encoding::Int8, Encoding::Int8],
        no_feedback: Vec::new(),
    };
    let reqs = plan.pull_requests(&codecs);
    assert_eq!(reqs.len(), 4, "two encodings x two servers");
    let mut unique_rows = Vec::new();
    for r in &reqs {
        let rows = serve(&r.counts, &r.payload, r.encoding);
        plan.scatter_part(r.server, r.encoding, &r.counts, &rows, &mut unique_rows)
            .unwrap();
    }
    for (t, table_rows) in unique_rows.iter().enumerate() {
        for (u, &id) in plan.unique(t).iter().enumerate() {
            let x = (id % 1000) as f32;
            let got = &table_rows[u * 2..u * 2 + 2];
            // int8 at most max/254 off.
            assert!((got[0] - x).abs() <= x / 254.0 + 1e-6, "{t} {id}: {got:?}");
            assert!((got[1] + x).abs() <= x / 254.0 + 1e-6, "{t} {id}: {got:?}");
        }
    }
    // A reply for the wrong table count is refused.
    let r = &reqs[0];
    let mut bad = r.counts.clone();
    bad[0].count += 1;
    assert!(plan
        .scatter_part(r.server, r.encoding, &bad, &[], &mut unique_rows)
        .is_err());
    // Pushes: residuals kept for lossy tables only.
    let grads: Vec<Vec<f32>> = (0..3)
        .map(|t| {
            (0..plan.unique(t).len() * 2)
                .map(|i| 0.001 * i as f32 + 0.1)
                .collect()
        })
        .collect();
    let mut store = ResidualStore::new(2, crate::compression::feedback::FeedbackConfig::default());
    let mut scratch = crate::plan::PushScratch::default();
    let pushes = plan.push_requests(&codecs, &grads, 8.0, Some(&mut store), &mut scratch);
    assert_eq!(pushes.len(), 4);
    let rows: usize = pushes
        .iter()
        .flat_map(|p| p.counts.iter().map(|c| c.count as usize))
        .sum();
    assert_eq!(rows, plan.unique_ids());
    assert!(store.stats().rows > 0);
}

#[test]
fn short_reply_is_an_error() {
    let map = ShardMap::new(1);
    let mut plan = Plan::default();
    plan.build(&[vec![1, 2]], 4, &map);
    let mut rows = Vec::new();
    let err = plan
        .scatter_pulled(0, &[0u8; 12], Encoding::F16, &mut rows)
        .unwrap_err();
    assert!(err.to_string().contains("12 bytes, expected 16"), "{err}");
}

#[test]
fn gather_and_reduce_match_a_naive_loop_for_specialized_and_generic_dims() {
    // Dims 16 (fixed-size moves), 5 (generic); 300 samples span two parallel chunks of the gather.
    let map = ShardMap::new(2);
    for dim in [16usize, 5] {
        let batch = 300;
        let sparse: Vec<Vec<u64>> = (0..3u64)
            .map(|t| (0..batch as u64).map(|i| (i * 7 + t) % 41).collect())
            .collect();
        let mut plan = Plan::default();
        plan.build(&sparse, dim, &map);
        let unique_rows: Vec<Vec<f32>> = (0..3)
            .map(|t| {
                (0..plan.unique(t).len() * dim)
                    .map(|k| (k * 3 + t) as f32 * 0.25)
                    .collect()
            })
            .collect();
        let mut emb = Vec::new();
        plan.gather_embeddings(&unique_rows, &mut emb);
        let grad: Vec<f32> = (0..batch * 3 * dim)
            .map(|k| (k % 97) as f32 - 48.0)
            .collect();
        let mut sums = Vec::new();
        plan.reduce_gradients(&grad, 0.5, &mut sums);
        for t in 0..3 {
            let mut want = vec![0.0f32; plan.unique(t).len() * dim];
            for (i, &id) in sparse[t].iter().enumerate() {
                let u = plan.unique(t).iter().position(|&x| x == id).unwrap();
                let row = &emb[(i * 3 + t) * dim..][..dim];
                assert_eq!(
                    row,
                    &unique_rows[t][u * dim..(u + 1) * dim],
                    "dim {dim} t {t} i {i}"
                );
                for e in 0..dim {
                    want[u * dim + e] += grad[(i * 3 + t) * dim + e] * 0.5;
                }
            }
            assert_eq!(sums[t], want, "dim {dim} table {t}");
        }
    }
}

/// A layout with everything at once: table 0 (dim 3) read by a one-hot feature and a multi-hot mean
/// feature, table 1 (dim 16) by a multi-hot sum feature, table 2 (dim 2) by a one-hot feature.
fn mixed_layout() -> SparseLayout {
    let f = |table, mean| FeatureShape { table, mean };
    SparseLayout {
        dims: vec![3, 16, 2],
        features: vec![f(0, false), f(1, false), f(0, true), f(2, false)],
    }
}

/// Bags of 300 samples: feature 1 holds 0..4 ids per sample (empty bags included), feature 2 0..3, with
/// repeats inside a bag and ids shared with feature 0 (same table).
fn mixed_batch() -> (usize, Vec<Vec<u64>>, Vec<Vec<u32>>) {
    let batch = 300;
    let mut sparse = vec![Vec::new(); 4];
    let mut offsets = vec![Vec::new(), vec![0u32], vec![0u32], Vec::new()];
    for i in 0..batch as u64 {
        sparse[0].push(i % 13);
        sparse[3].push(i % 5);
        for k in 0..(i % 5) {
            sparse[1].push((i * 3 + k) % 17);
        }
        offsets[1].push(sparse[1].len() as u32);
        for k in 0..(i % 4) {
            sparse[2].push((i + k * k) % 11);
        }
        offsets[2].push(sparse[2].len() as u32);
    }
    (batch, sparse, offsets)
}

/// The pooled input of sample `i`, feature `f`, by the definition.
fn naive_pool(
    plan: &Plan,
    layout: &SparseLayout,
    rows: &[Vec<f32>],
    sparse: &[Vec<u64>],
    offsets: &[Vec<u32>],
    f: usize,
    i: usize,
) -> Vec<f32> {
    let FeatureShape { table, mean } = layout.features[f];
    let dim = layout.dims[table];
    let ids: &[u64] = if offsets[f].is_empty() {
        &sparse[f][i..i + 1]
    } else {
        &sparse[f][offsets[f][i] as usize..offsets[f][i + 1] as usize]
    };
    let mut out = vec![0.0f32; dim];
    for id in ids {
        let u = plan.unique(table).iter().position(|x| x == id).unwrap();
        for e in 0..dim {
            out[e] += rows[table][u * dim + e];
        }
    }
    if mean && !ids.is_empty() {
        out.iter_mut().for_each(|x| *x /= ids.len() as f32);
    }
    out
}

#[test]
fn multi_hot_bags_pool_and_spread_as_defined() {
    let (layout, (batch, sparse, offsets)) = (mixed_layout(), mixed_batch());
    let mut plan = Plan::default();
    plan.build_with(&layout, batch, &sparse, &offsets, &ShardMap::new(2));
    assert_eq!(plan.width(), 3 + 16 + 3 + 2);
    assert_eq!(plan.tables(), 3);
    // Table 0 deduplicates over both of its features.
    let mut want0: Vec<u64> = sparse[0].iter().chain(&sparse[2]).copied().collect();
    want0.sort_unstable();
    want0.dedup();
    let mut have0 = plan.unique(0).to_vec();
    have0.sort_unstable();
    assert_eq!(have0, want0);
    let rows: Vec<Vec<f32>> = (0..3)
        .map(|t| {
            (0..plan.unique(t).len() * layout.dims[t])
                .map(|k| ((k * 7 + t) % 23) as f32 * 0.125 - 1.0)
                .collect()
        })
        .collect();
    let mut emb = Vec::new();
    plan.gather_embeddings(&rows, &mut emb);
    let offset = [0, 3, 19, 22];
    for i in 0..batch {
        for f in 0..4 {
            let want = naive_pool(&plan, &layout, &rows, &sparse, &offsets, f, i);
            let have = &emb[i * 24 + offset[f]..][..want.len()];
            for (h, w) in have.iter().zip(&want) {
                assert!((h - w).abs() <= 1e-6 * w.abs().max(1.0), "i {i} f {f}");
            }
        }
    }
    // Empty bags pool to zeros: sample 0 has no ids in features 1 and 2.
    assert!(emb[3..22].iter().all(|&x| x == 0.0));
    // Gradients: the definition, spread by hand.
    let grad: Vec<f32> = (0..batch * 24).map(|k| (k % 31) as f32 - 15.0).collect();
    let mut sums = Vec::new();
    plan.reduce_gradients(&grad, 0.5, &mut sums);
    let mut want: Vec<Vec<f32>> = (0..3)
        .map(|t| vec![0.0; plan.unique(t).len() * layout.dims[t]])
        .collect();
    for i in 0..batch {
        for f in 0..4 {
            let FeatureShape { table, mean } = layout.features[f];
            let dim = layout.dims[table];
            let ids: &[u64] = if offsets[f].is_empty() {
                &sparse[f][i..i + 1]
            } else {
                &sparse[f][offsets[f][i] as usize..offsets[f][i + 1] as usize]
            };
            let share = if mean { 1.0 / ids.len() as f32 } else { 1.0 };
            for id in ids {
                let u = plan.unique(table).iter().position(|x| x == id).unwrap();
                for e in 0..dim {
                    want[table][u * dim + e] += grad[i * 24 + offset[f] + e] * 0.5 * share;
                }
            }
        }
    }
    for t in 0..3 {
        for (k, (h, w)) in sums[t].iter().zip(&want[t]).enumerate() {
            assert!(
                (h - w).abs() <= 1e-4 * w.abs().max(1.0),
                "table {t} value {k}: {h} vs {w}"
            );
        }
    }
}

#[test]
fn pooling_gradients_match_finite_differences() {
    // L = Σ c · pooled(rows): reduce_gradients(c) must be dL/drows, checked by central differences.
    let (layout, (batch, sparse, offsets)) = (mixed_layout(), mixed_batch());
    let mut plan = Plan::default();
    plan.build_with(&layout, batch, &sparse, &offsets, &ShardMap::new(3));
    let mut rows: Vec<Vec<f64>> = (0..3)
        .map(|t| {
            (0..plan.unique(t).len() * layout.dims[t])
                .map(|k| ((k * 5 + t) % 19) as f64 * 0.1)
                .collect()
        })
        .collect();
    let c: Vec<f32> = (0..batch * 24)
        .map(|k| ((k * 11) % 7) as f32 - 3.0)
        .collect();
    let loss = |rows: &[Vec<f64>]| -> f64 {
        let rows32: Vec<Vec<f32>> = rows
            .iter()
            .map(|r| r.iter().map(|&x| x as f32).collect())
            .collect();
        let mut emb = Vec::new();
        plan.gather_embeddings(&rows32, &mut emb);
        emb.iter().zip(&c).map(|(&e, &c)| e as f64 * c as f64).sum()
    };
    let mut grads = Vec::new();
    plan.reduce_gradients(&c, 1.0, &mut grads);
    let h = 0.25; // exact in f32: pooling is linear, so the difference quotient is exact up to rounding
    for t in 0..3 {
        for k in (0..rows[t].len()).step_by(7) {
            let x = rows[t][k];
            rows[t][k] = x + h;
            let up = loss(&rows);
            rows[t][k] = x - h;
            let down = loss(&rows);
            rows[t][k] = x;
            let numeric = (up - down) / (2.0 * h);
            let analytic = grads[t][k] as f64;
            assert!(
                (numeric - analytic).abs() <= 1e-2 * numeric.abs().max(1.0),
                "table {t} value {k}: numeric {numeric} analytic {analytic}"
            );
        }
    }
}

/// The per-batch cost of a multi-hot batch's plan, pooling and gradient spread at DLRM-v2's sizes (26
/// features of dim 128, MLPerf's bag sizes: 214 ids per sample, batch 2048), against the same batch one-hot.
/// Run: `cargo test --release -p trainer --lib plan::tests::multi_hot_cost -- --ignored --nocapture`
#[test]
#[ignore]
fn multi_hot_cost_per_batch() {
    use std::time::Instant;
    const SIZES: [usize; 26] = [
        3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
    ];
    let (batch, dim) = (2048usize, 128usize);
    let map = ShardMap::new(2);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Zipf-ish: small ids far more often.
        (rng % n) * (rng >> 40 & 7) / 7
    };
    for multi in [false, true] {
        let layout = SparseLayout::uniform(26, dim);
        let mut sparse = vec![Vec::new(); 26];
        let mut offsets = vec![Vec::new(); 26];
        for (f, &size) in SIZES.iter().enumerate() {
            let size = if multi { size } else { 1 };
            if size > 1 {
                offsets[f].push(0u32);
            }
            for _ in 0..batch {
                for _ in 0..size {
                    sparse[f].push(next(400_000));
                }
                if size > 1 {
                    offsets[f].push(sparse[f].len() as u32);
                }
            }
        }
        let mut plan = Plan::default();
        let (mut emb, mut grads) = (Vec::new(), Vec::new());
        let grad: Vec<f32> = (0..batch * 26 * dim).map(|k| (k % 13) as f32).collect();
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..7 {
            let t0 = Instant::now();
            plan.build_with(&layout, batch, &sparse, &offsets, &map);
            times[0].push(t0.elapsed().as_secs_f64() * 1e3);
            let rows: Vec<Vec<f32>> = (0..26)
                .map(|t| vec![0.5; plan.unique(t).len() * dim])
                .collect();
            let t0 = Instant::now();
            plan.gather_embeddings(&rows, &mut emb);
            times[1].push(t0.elapsed().as_secs_f64() * 1e3);
            let t0 = Instant::now();
            plan.reduce_gradients(&grad, 1.0, &mut grads);
            times[2].push(t0.elapsed().as_secs_f64() * 1e3);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let ids: usize = sparse.iter().map(Vec::len).sum();
        eprintln!(
            "{}: {ids} ids, {} unique, dim {dim}, batch {batch}: plan {:.2} ms, pool {:.2} ms, spread {:.2} ms (medians of 7)",
            if multi { "multi-hot (MLPerf sizes)" } else { "one-hot" },
            plan.unique_ids(),
            median(&mut times[0]),
            median(&mut times[1]),
            median(&mut times[2]),
        );
    }
}

/// Every reply of a batch at once (`scatter_replies`, tables decoded in parallel), with optimizer state:
/// tables of many rows, in every encoding, land where one reply at a time puts them, and the state of
/// each row lands beside it.
#[test]
fn scatter_replies_places_every_row_and_its_state() {
    let map = ShardMap::new(2);
    let (dim, tables) = (2, 7);
    let rows_per_table = 5_003;
    let sparse: Vec<Vec<u64>> = (0..tables as u64)
        .map(|t| {
            (0..rows_per_table as u64)
                .map(|i| t * 10_000_000 + i * 3)
                .collect()
        })
        .collect();
    let mut plan = Plan::default();
    plan.build(&sparse, dim, &map);
    for enc in Encoding::ALL {
        let reqs = plan.pull_requests(&TableCodecs::uniform(tables, enc, enc));
        // State: table t's rows have t + 1 f32s each, the id's low bits then the table.
        let answers: Vec<(Vec<u8>, Vec<u8>, Vec<u32>)> = reqs
            .iter()
            .map(|r| {
                let mut ids = Vec::new();
                crate::wire::message::pull::decode(&r.counts, &r.payload, &mut ids).unwrap();
                let mut state = Vec::new();
                let mut at = 0;
                for c in &r.counts {
                    for &id in &ids[at..at + c.count as usize] {
                        for e in 0..=c.table {
                            put_state(&[(id % 4096) as f32 + e as f32 / 10.0], &mut state);
                        }
                    }
                    at += c.count as usize;
                }
                let lens = r.counts.iter().map(|c| c.table + 1).collect();
                (serve(&r.counts, &r.payload, r.encoding), state, lens)
            })
            .collect();
        let parts: Vec<PartReply<'_>> = answers
            .iter()
            .enumerate()
            .map(|(i, (rows, state, lens))| PartReply {
                request: i,
                rows,
                state: Some((state, lens)),
            })
            .collect();
        let (mut all_rows, mut all_state) = (Vec::new(), Vec::new());
        plan.scatter_replies(&parts, &mut all_rows, &mut all_state)
            .unwrap();
        let mut one_by_one = Vec::new();
        for (r, (rows, _, _)) in reqs.iter().zip(&answers) {
            plan.scatter_part(r.server, r.encoding, &r.counts, rows, &mut one_by_one)
                .unwrap();
        }
        assert_eq!(all_rows, one_by_one, "{enc}");
        for t in 0..tables {
            assert_eq!(plan.unique(t).len(), rows_per_table);
            let len = t + 1;
            for (u, &id) in plan.unique(t).iter().enumerate() {
                let x = (id % 1000) as f32;
                let got = &all_rows[t][u * 2..u * 2 + 2];
                let tol = if enc == Encoding::F32 {
                    0.0
                } else {
                    x / 100.0 + 1e-6
                };
                assert!(
                    (got[0] - x).abs() <= tol && (got[1] + x).abs() <= tol,
                    "{enc} {t} {id}: {got:?}"
                );
                let want: Vec<f32> = (0..len)
                    .map(|e| (id % 4096) as f32 + e as f32 / 10.0)
                    .collect();
                assert_eq!(
                    &all_state[t][u * len..(u + 1) * len],
                    want,
                    "{enc} {t} {id}"
                );
            }
        }
    }
}

/// A bad answer is refused before any row is written, naming the answer: a request that was not sent,
/// short rows, short state, and two servers disagreeing on a table's state length.
#[test]
fn scatter_replies_refuses_bad_answers_before_writing() {
    let map = ShardMap::new(2);
    let sparse: Vec<Vec<u64>> = (0..2u64)
        .map(|t| (0..100u64).map(|i| t * 1_000_000 + i).collect())
        .collect();
    let mut plan = Plan::default();
    plan.build(&sparse, 2, &map);
    let reqs = plan.pull_requests(&TableCodecs::uniform(2, Encoding::F32, Encoding::F32));
    assert_eq!(reqs.len(), 2);
    let rows: Vec<Vec<u8>> = reqs
        .iter()
        .map(|r| serve(&r.counts, &r.payload, r.encoding))
        .collect();
    let n = |r: &PartRequest, t: usize| {
        r.counts
            .iter()
            .find(|c| c.table as usize == t)
            .map_or(0, |c| c.count as usize)
    };
    let state_of = |r: &PartRequest, len: usize| vec![0u8; 4 * len * (n(r, 0) + n(r, 1))];
    let (s0, s1) = (state_of(&reqs[0], 1), state_of(&reqs[1], 2));
    let lens0 = vec![1u32; reqs[0].counts.len()];
    let lens1 = vec![2u32; reqs[1].counts.len()];
    let part = |i: usize, rows: &'static [u8]| PartReply {
        request: i,
        rows,
        state: None,
    };
    let cases: Vec<(Vec<PartReply<'_>>, usize, &str)> = vec![
        (
            vec![
                PartReply {
                    rows: &rows[0],
                    ..part(0, &[])
                },
                part(1, &[]),
            ],
            1,
            "pulled rows",
        ),
        (
            vec![
                PartReply {
                    rows: &rows[0],
                    ..part(0, &[])
                },
                PartReply {
                    request: 5,
                    rows: &rows[1],
                    state: None,
                },
            ],
            1,
            "no pull request 5",
        ),
        (
            vec![PartReply {
                request: 0,
                rows: &rows[0],
                state: Some((&s0[4..], &lens0)),
            }],
            0,
            "pulled optimizer state",
        ),
        (
            vec![
                PartReply {
                    request: 0,
                    rows: &rows[0],
                    state: Some((&s0, &lens0)),
                },
                PartReply {
                    request: 1,
                    rows: &rows[1],
                    state: Some((&s1, &lens1)),
                },
            ],
            1,
            "f32s per row, another server sent 1",
        ),
    ];
    for (parts, bad, what) in cases {
        let (mut out_rows, mut out_state) = (vec![vec![7.0f32; 3]], Vec::new());
        let (k, e) = plan
            .scatter_replies(&parts, &mut out_rows, &mut out_state)
            .unwrap_err();
        assert_eq!(k, bad, "{what}: {e}");
        assert!(e.to_string().contains(what), "{what}: {e}");
        assert_eq!(out_rows, vec![vec![7.0f32; 3]], "{what}: nothing written");
    }
}
