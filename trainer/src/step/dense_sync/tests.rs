//! Tests of the parent module.

use super::*;
use crate::model::DenseOptimizer;
use protocol::compression::codec;
use protocol::Encoding;
use std::collections::HashMap;

fn small(opt: DenseOptimizer) -> Dlrm {
    Dlrm::tiny(opt, 3)
}

/// A parameter server's dense table in memory: SGD with learning rate 1 on f32 rows.
#[derive(Default)]
struct FakeServer {
    rows: HashMap<u64, Vec<f32>>,
}

impl FakeServer {
    fn ids(payload: &[u8], n: usize) -> (Vec<u64>, usize) {
        let mut ids = Vec::new();
        let used = protocol::wire::ids::get_ids(payload, n, &mut ids).unwrap();
        (ids, used)
    }

    fn pull(&self, counts: &[TableCount], ids: &Bytes) -> Bytes {
        let (ids, _) = Self::ids(ids, counts[0].count as usize);
        let mut out = Vec::new();
        for id in ids {
            let zero = vec![0.0; DENSE_ROW_DIM];
            codec::encode(self.rows.get(&id).unwrap_or(&zero), Encoding::F32, &mut out);
        }
        Bytes::from(out)
    }

    /// The answers to every pull request of `sync`.
    fn answer(&self, sync: &DenseSync) -> Vec<(usize, Bytes)> {
        sync.pull_requests()
            .into_iter()
            .map(|(s, counts, ids)| (s, self.pull(&counts, &ids)))
            .collect()
    }

    fn push(&mut self, counts: &[TableCount], payload: &Bytes) {
        let n = counts[0].count as usize;
        let (ids, used) = Self::ids(payload, n);
        let mut g = vec![0.0; n * DENSE_ROW_DIM];
        codec::decode(&payload[used..], Encoding::F32, &mut g).unwrap();
        for (id, g) in ids.iter().zip(g.chunks_exact(DENSE_ROW_DIM)) {
            let row = self
                .rows
                .entry(*id)
                .or_insert_with(|| vec![0.0; DENSE_ROW_DIM]);
            for (w, g) in row.iter_mut().zip(g) {
                *w -= g;
            }
        }
    }
}

type Push = Vec<(usize, Vec<TableCount>, Bytes)>;

fn step(model: &mut Dlrm, t: usize) {
    let (b, ns, d) = (4, 2, 4);
    let dense: Vec<f32> = (0..b * 13).map(|i| ((i + t) as f32 * 0.3).sin()).collect();
    let emb: Vec<f32> = (0..b * ns * d)
        .map(|i| ((i * 7 + t) as f32 * 0.1).cos())
        .collect();
    let labels: Vec<f32> = (0..b).map(|i| ((i + t) % 2) as f32).collect();
    let mut g = vec![0.0; emb.len()];
    model.train_step(b, &dense, &emb, &labels, &mut g).unwrap();
}

/// One trainer with its dense parameters on (fake, lagging) servers trains exactly like one with local
/// dense parameters, whatever subset of its pushes each pull sees: the staleness bound's lag, pushes
/// applied before they were acknowledged, and different lags per server.
#[test]
fn own_updates_are_never_stale() {
    for opt in [DenseOptimizer::Sgd { lr: 0.1 }, DenseOptimizer::adam(0.01)] {
        let mut local = small(opt);
        let mut model = small(opt);
        let map = ShardMap::new(3);
        let mut sync = DenseSync::new(&model, &map, 1);
        let mut servers: Vec<FakeServer> = (0..3).map(|_| FakeServer::default()).collect();
        let mut queued: Vec<VecDeque<Push>> = vec![VecDeque::new(); 3];
        for t in 0..30 {
            // Server s has applied all but the last (t + s) % 4 pushes.
            for (s, q) in queued.iter_mut().enumerate() {
                while q.len() > (t + s) % 4 {
                    for (server, counts, payload) in q.pop_front().unwrap() {
                        servers[server].push(&counts, &payload);
                    }
                }
            }
            let replies: Vec<(usize, Bytes)> = sync
                .pull_requests()
                .into_iter()
                .map(|(s, counts, ids)| (s, servers[s].pull(&counts, &ids)))
                .collect();
            sync.apply_pulled(&replies, &mut model).unwrap();
            for (a, b) in model.params().iter().zip(local.params()) {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                        "{opt:?} step {t}: {x} vs {y}"
                    );
                }
            }
            step(&mut model, t);
            step(&mut local, t);
            let push = sync.push_step(&model);
            for (s, q) in queued.iter_mut().enumerate() {
                q.push_back(push.iter().filter(|p| p.0 == s).cloned().collect());
            }
            assert!(sync.pending() <= 5, "{}", sync.pending());
        }
    }
}

fn flat(model: &Dlrm) -> Vec<f32> {
    model.params().concat()
}

/// Top-k: each push carries at most k rows (plus the counter), and what the servers summed plus the
/// residual equals the sum of every local update: nothing is lost.
#[test]
fn top_k_sends_k_rows_and_loses_nothing() {
    let mut model = small(DenseOptimizer::adam(0.01));
    let map = ShardMap::new(2);
    let mut sync = DenseSync::new(&model, &map, 0).with_push_fraction(0.3);
    let rows = sync.rows();
    let k = (rows as f32 * 0.3).ceil() as usize;
    assert!(k < rows, "the test needs a real selection ({k} of {rows})");
    let initial = flat(&model);
    let mut server = FakeServer::default();
    let mut updates = vec![0.0f64; initial.len()];
    for t in 0..12 {
        sync.apply_pulled(&server.answer(&sync), &mut model)
            .unwrap();
        let before = flat(&model);
        step(&mut model, t);
        for ((u, a), b) in updates.iter_mut().zip(flat(&model)).zip(&before) {
            *u += (a - b) as f64;
        }
        let mut sent_rows = 0;
        for (_, counts, payload) in sync.push_step(&model) {
            sent_rows += counts[0].count as usize - 1;
            server.push(&counts, &payload);
        }
        assert_eq!(sent_rows, k, "step {t}");
    }
    sync.apply_pulled(&server.answer(&sync), &mut model)
        .unwrap();
    let now = flat(&model);
    for (i, u) in updates.iter().enumerate() {
        let held = (now[i] - initial[i]) as f64 + sync.residual()[i] as f64;
        assert!(
            (held - u).abs() <= 1e-5 * (1.0 + u.abs()),
            "param {i}: {held} vs {u}"
        );
    }
    assert!(
        sync.residual().iter().any(|&r| r != 0.0),
        "nothing was held back"
    );
    // A checkpoint's residual restores into a fresh sync; one of another size is refused, named.
    let saved = sync.residual().to_vec();
    let mut fresh = DenseSync::new(&model, &map, 0).with_push_fraction(0.3);
    fresh.set_residual(&saved).unwrap();
    assert_eq!(fresh.residual(), &saved[..]);
    let err = fresh.set_residual(&saved[1..]).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{} values", saved.len() - 1)),
        "{err}"
    );
}

#[test]
fn zero_sums_give_the_initial_model_and_a_short_reply_is_named() {
    let map = ShardMap::new(3);
    let mut model = small(DenseOptimizer::Sgd { lr: 0.1 });
    let initial: Vec<Vec<f32>> = model.params().iter().map(|p| p.to_vec()).collect();
    let mut sync = DenseSync::new(&model, &map, 0);
    assert_eq!(sync.rows(), model.num_params().div_ceil(DENSE_ROW_DIM));
    let replies = FakeServer::default().answer(&sync);
    sync.apply_pulled(&replies, &mut model).unwrap();
    let now: Vec<Vec<f32>> = model.params().iter().map(|p| p.to_vec()).collect();
    assert_eq!(now, initial);
    let bad = vec![(replies[0].0, replies[0].1.slice(4..))];
    let err = sync.apply_pulled(&bad, &mut model).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("server {}", replies[0].0)),
        "{err}"
    );
}
