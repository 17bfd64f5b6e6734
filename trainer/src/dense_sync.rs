//! Dense parameters kept on the parameter servers, for several trainers training one model.
//!
//! The dense parameters (every weight and bias, in [`Dlrm::params`] order) are flattened and cut into rows of
//! [`DENSE_ROW_DIM`] f32 values (the last row zero-padded) in the reserved table [`DENSE_TABLE`]; row `i` has id
//! `i` and lives on whichever server the shard map routes it to, so the table is split across the shards.
//!
//! The servers hold the *sum of every trainer's parameter updates* (offsets from the deterministic initial
//! parameters, which every trainer builds from `--seed`; the table's rows start at zero). Each trainer runs the
//! dense optimizer (SGD, Adagrad or Adam, exactly as on one trainer) locally on its own gradients and pushes the
//! resulting parameter change `delta`; the table's server-side optimizer is SGD with learning rate 1 and the
//! push carries `-delta`, so the servers add it. A trainer's parameters are `initial + pulled sum + its own
//! deltas the pulled sum does not hold yet`.
//!
//! Why deltas and not gradients: with gradients and the optimizer on the servers, a trainer computed on
//! parameters that lacked its own last `k` updates (the staleness bound), which every dense parameter suffers at
//! every step; on the demo data that cost 0.023 AUC at `k = 2` with one trainer (0.7519 vs 0.7746 with local
//! dense parameters) and 0.08 with two. With deltas a trainer never lacks its own updates: only the other
//! trainers' updates are stale, and one trainer with dense parameters on the servers trains like one with local
//! dense parameters (up to f32 rounding of the sum).
//!
//! Which own updates a pulled sum holds is exact, not guessed from acknowledgements (a push sent but not yet
//! acknowledged may or may not be in a pull's answer): each push also adds 1 to a counter row of the trainer's
//! rank on each server ([`counter_id`]), pulled with the rows. A server applying a push while answering a pull may
//! show part of one push without its counter (rows are not applied atomically with respect to pulls); that error
//! lasts one step, since every pull recomputes the parameters from the sum.
//!
//! Top-k with error feedback ([`DenseSync::with_push_fraction`]): a trainer may push only the fraction of rows
//! whose update plus residual has the largest L2 norm, keeping the other rows' updates as a residual added to
//! the next step's (Stich et al. 2018, "Sparsified SGD with memory"). Its own parameters then follow what it
//! has sent, so an update left in the residual reaches the model when it is sent; nothing is dropped.
//!
//! Each step, a trainer pulls the rows (with the same staleness gate as its embedding pull), computes its
//! gradients, takes a local optimizer step and pushes the delta; the servers apply every trainer's push as it
//! arrives. Each trainer's optimizer state (Adam moments, Adagrad accumulators) sees its own gradients only.

use bytes::Bytes;
use std::collections::VecDeque;

use protocol::compression::codec;
use protocol::{Encoding, InitSpec, OptimizerSpec, ProtocolError, ShardMap, TableCount, TableSpec};

use crate::model::Dlrm;

/// The reserved table id of the dense parameters (embedding tables are numbered from 0 by feature).
pub const DENSE_TABLE: u32 = 1_000_000;

/// Values per dense row.
pub const DENSE_ROW_DIM: usize = 64;

/// First id of the push-counter rows (above every parameter row).
const COUNTER_BASE: u64 = 1 << 32;

/// Own updates kept for adding to pulled sums: more than any staleness bound; a server whose counter falls this
/// far behind (it lost pushes) gets the oldest ones dropped.
const MAX_PENDING: usize = 256;

/// The id of the counter row of trainer `rank` that lives on `server` under `map`: the first id at or above
/// `COUNTER_BASE + rank * 4096` that routes there.
pub fn counter_id(map: &ShardMap, rank: usize, server: usize) -> u64 {
    let base = COUNTER_BASE + rank as u64 * 4096;
    (base..)
        .find(|&id| map.server_of(id) as usize == server)
        .expect("some id routes to every server")
}

/// Errors of the dense synchronization.
#[derive(Debug, thiserror::Error)]
pub enum DenseSyncError {
    /// A server's reply has the wrong length or encoding.
    #[error("dense rows from server {server}: {source}")]
    Reply {
        /// The server's index.
        server: usize,
        /// The cause.
        source: ProtocolError,
    },
    /// A saved top-k residual does not fit this model and push fraction.
    #[error(
        "dense top-k residual of {saved} values, this job keeps {expected} (another model or --dense-push-fraction 1?)"
    )]
    Residual {
        /// Values saved.
        saved: usize,
        /// Values this job keeps (0 without top-k).
        expected: usize,
    },
    /// The model refused the parameters (a size mismatch: a bug).
    #[error("set dense parameters: {0}")]
    Model(#[from] crate::model::ModelError),
}

/// One server's share of the dense table.
#[derive(Debug, Clone)]
struct ServerRows {
    server: usize,
    /// Row ids owned by the server, ascending.
    rows: Vec<u64>,
    /// The pull and push id section: those ids, then this rank's counter row on the server
    /// ([`id_section`]).
    ids: Bytes,
    /// How many of this trainer's pushes the last pull from this server held.
    seen: u64,
    /// This rank's counter row on the server.
    counter: u64,
}

/// The dense table's layout and the trainer's initial parameters.
#[derive(Debug, Clone)]
pub struct DenseSync {
    sizes: Vec<usize>,
    initial: Vec<f32>,
    servers: Vec<ServerRows>,
    /// The flattened parameters the model was last given (or stepped to), padded to whole rows.
    flat: Vec<f32>,
    decoded: Vec<f32>,
    /// This trainer's pushes so far (numbered from what the servers' counters said at the first pull).
    pushed: Option<u64>,
    /// Own deltas `(push number, delta)` some server's last pull did not hold yet, oldest first.
    pending: VecDeque<(u64, Vec<f32>)>,
    /// Delta buffers to reuse.
    spare: Vec<Vec<f32>>,
    /// Rows pushed per step, or `None` for all (top-k sparsification off).
    push_rows: Option<usize>,
    /// Updates not sent yet (top-k), one value per parameter.
    residual: Vec<f32>,
    /// Scratch: (norm, row) of every row.
    norms: Vec<(f32, u32)>,
}

/// The id section of dense rows `ids` (ascending, the counter row last), as pulls and pushes of the dense
/// table carry it ([`protocol::wire::pull::IdSections`]).
fn id_section(ids: &[u64]) -> Bytes {
    let mut sections = protocol::wire::pull::IdSections::new();
    sections.table(
        DENSE_TABLE,
        DENSE_ROW_DIM as u32,
        protocol::wire::ids::IdCoding::Plain,
        ids,
    );
    Bytes::from(sections.payload)
}

impl DenseSync {
    /// The layout of `model`'s parameters on the servers of `map` for trainer `rank`; `model` must hold its
    /// initial parameters.
    pub fn new(model: &Dlrm, map: &ShardMap, rank: usize) -> DenseSync {
        let params = model.params();
        let sizes: Vec<usize> = params.iter().map(|p| p.len()).collect();
        let total: usize = sizes.iter().sum();
        let initial: Vec<f32> = params.concat();
        let rows = total.div_ceil(DENSE_ROW_DIM) as u64;
        let mut servers: Vec<ServerRows> = (0..map.num_servers as usize)
            .map(|server| ServerRows {
                server,
                rows: Vec::new(),
                ids: Bytes::new(),
                seen: 0,
                counter: counter_id(map, rank, server),
            })
            .collect();
        for id in 0..rows {
            servers[map.server_of(id) as usize].rows.push(id);
        }
        servers.retain(|s| !s.rows.is_empty());
        for s in &mut servers {
            let with_counter: Vec<u64> = s.rows.iter().copied().chain([s.counter]).collect();
            s.ids = id_section(&with_counter);
        }
        let mut flat = vec![0.0; rows as usize * DENSE_ROW_DIM];
        flat[..total].copy_from_slice(&initial);
        DenseSync {
            sizes,
            initial,
            servers,
            flat,
            decoded: Vec::new(),
            pushed: None,
            pending: VecDeque::new(),
            spare: Vec::new(),
            push_rows: None,
            residual: Vec::new(),
            norms: Vec::new(),
        }
    }

    /// Pushes only `fraction` (in (0, 1]) of the rows each step, top-k with error feedback (module docs); 1
    /// pushes every row.
    pub fn with_push_fraction(mut self, fraction: f32) -> DenseSync {
        let rows = self.rows();
        let k = ((rows as f64 * fraction as f64).ceil() as usize).clamp(1, rows.max(1));
        if k < rows {
            self.push_rows = Some(k);
            self.residual = vec![0.0; self.flat.len()];
        }
        self
    }

    /// Rows of the dense table.
    pub fn rows(&self) -> usize {
        self.flat.len() / DENSE_ROW_DIM
    }

    /// The table spec: SGD with learning rate 1 (the servers add the pushed deltas), rows starting at zero.
    pub fn table_spec() -> TableSpec {
        TableSpec {
            id: DENSE_TABLE,
            name: "dense".into(),
            dim: DENSE_ROW_DIM as u32,
            optimizer: OptimizerSpec::Sgd { lr: 1.0 },
            init: InitSpec::Uniform { scale: 0.0 },
            seed: 0,
        }
    }

    fn counts(n: usize) -> Vec<TableCount> {
        vec![TableCount {
            table: DENSE_TABLE,
            count: n as u32,
            dim: DENSE_ROW_DIM as u32,
        }]
    }

    /// The pull requests: `(server, table counts, id payload)`.
    pub fn pull_requests(&self) -> Vec<(usize, Vec<TableCount>, Bytes)> {
        self.servers
            .iter()
            .map(|s| (s.server, Self::counts(s.rows.len() + 1), s.ids.clone()))
            .collect()
    }

    /// Decodes the pulled sums (f32 rows, one reply per server of [`pull_requests`](Self::pull_requests)) and
    /// sets `model`'s parameters to `initial + sum + own deltas the sum lacks`. A server without a reply keeps
    /// the values it gave last.
    pub fn apply_pulled(
        &mut self,
        replies: &[(usize, Bytes)],
        model: &mut Dlrm,
    ) -> Result<(), DenseSyncError> {
        for (server, bytes) in replies {
            let Some(s) = self.servers.iter_mut().find(|s| s.server == *server) else {
                continue;
            };
            let n = (s.rows.len() + 1) * DENSE_ROW_DIM;
            let reply = |source| DenseSyncError::Reply {
                server: *server,
                source,
            };
            let expected = Encoding::F32
                .rows_bytes(s.rows.len() + 1, n)
                .unwrap_or(usize::MAX);
            protocol::wire::message::check_len("dense rows", bytes.len(), expected)
                .map_err(reply)?;
            self.decoded.resize(n, 0.0);
            codec::decode(bytes, Encoding::F32, &mut self.decoded).map_err(reply)?;
            let counter = self.decoded[n - DENSE_ROW_DIM];
            s.seen = if counter.is_finite() && counter > 0.0 {
                counter.round() as u64
            } else {
                0
            };
            for (k, &row) in s.rows.iter().enumerate() {
                let at = row as usize * DENSE_ROW_DIM;
                let src = &self.decoded[k * DENSE_ROW_DIM..(k + 1) * DENSE_ROW_DIM];
                let dst = &mut self.flat[at..at + DENSE_ROW_DIM];
                for (i, (d, v)) in dst.iter_mut().zip(src).enumerate() {
                    *d = v + self.initial.get(at + i).copied().unwrap_or(0.0);
                }
                for (_, delta) in self.pending.iter().filter(|(j, _)| *j >= s.seen) {
                    for (d, v) in dst.iter_mut().zip(&delta[at..at + DENSE_ROW_DIM]) {
                        *d += v;
                    }
                }
            }
        }
        let held = self.servers.iter().map(|s| s.seen).min().unwrap_or(0);
        if self.pushed.is_none() {
            self.pushed = Some(self.servers.iter().map(|s| s.seen).max().unwrap_or(0));
        }
        while self
            .pending
            .front()
            .is_some_and(|(j, _)| *j < held || self.pending.len() > MAX_PENDING)
        {
            if let Some((_, delta)) = self.pending.pop_front() {
                self.spare.push(delta);
            }
        }
        let mut tensors = Vec::with_capacity(self.sizes.len());
        let mut at = 0;
        for &n in &self.sizes {
            tensors.push(&self.flat[at..at + n]);
            at += n;
        }
        model.set_params(&tensors)?;
        Ok(())
    }

    /// Records the local optimizer step `model` just took (from the parameters [`apply_pulled`] gave it) and
    /// returns its push requests: `(server, table counts, ids then f32 rows of -delta, the counter's -1)`.
    ///
    /// [`apply_pulled`]: Self::apply_pulled
    pub fn push_step(&mut self, model: &Dlrm) -> Vec<(usize, Vec<TableCount>, Bytes)> {
        let mut delta = self.spare.pop().unwrap_or_default();
        delta.clear();
        delta.resize(self.flat.len(), 0.0);
        let mut at = 0;
        for p in model.params() {
            for ((d, now), before) in delta[at..at + p.len()]
                .iter_mut()
                .zip(p)
                .zip(&mut self.flat[at..at + p.len()])
            {
                *d = now - *before;
                *before = *now;
            }
            at += p.len();
        }
        let sent = self.sparsify(&mut delta);
        let number = self.pushed.unwrap_or(0);
        self.pushed = Some(number + 1);
        let mut counter = [0.0f32; DENSE_ROW_DIM];
        counter[0] = -1.0;
        let requests = self
            .servers
            .iter()
            .map(|s| {
                // All rows: the id section computed once in `new`; top-k: this step's rows.
                let (rows, ids): (std::borrow::Cow<[u64]>, _) = match &sent {
                    None => (s.rows.as_slice().into(), s.ids.clone()),
                    Some(mask) => {
                        let rows: Vec<u64> = s
                            .rows
                            .iter()
                            .copied()
                            .filter(|&r| mask[r as usize])
                            .collect();
                        let with_counter: Vec<u64> =
                            rows.iter().copied().chain([s.counter]).collect();
                        (rows.into(), id_section(&with_counter))
                    }
                };
                let mut payload =
                    Vec::with_capacity(ids.len() + (rows.len() + 1) * DENSE_ROW_DIM * 4);
                payload.extend_from_slice(&ids);
                let mut neg = [0.0f32; DENSE_ROW_DIM];
                for &row in rows.iter() {
                    let at = row as usize * DENSE_ROW_DIM;
                    for (n, d) in neg.iter_mut().zip(&delta[at..at + DENSE_ROW_DIM]) {
                        *n = -d;
                    }
                    codec::encode(&neg, Encoding::F32, &mut payload);
                }
                codec::encode(&counter, Encoding::F32, &mut payload);
                (s.server, Self::counts(rows.len() + 1), Bytes::from(payload))
            })
            .collect();
        self.pending.push_back((number, delta));
        requests
    }

    /// Top-k: adds the residual to `delta`, keeps the rows with the largest norms in `delta` and moves the
    /// others into the residual; returns which rows are sent (`None`: all, top-k off).
    fn sparsify(&mut self, delta: &mut [f32]) -> Option<Vec<bool>> {
        let k = self.push_rows?;
        for (d, r) in delta.iter_mut().zip(&self.residual) {
            *d += r;
        }
        self.norms.clear();
        for (row, v) in delta.chunks_exact(DENSE_ROW_DIM).enumerate() {
            self.norms.push((v.iter().map(|x| x * x).sum(), row as u32));
        }
        // Largest norms first; ties by row for determinism.
        self.norms
            .select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut sent = vec![false; self.norms.len()];
        for &(_, row) in &self.norms[..k] {
            sent[row as usize] = true;
        }
        for (row, keep) in sent.iter().enumerate() {
            let range = row * DENSE_ROW_DIM..(row + 1) * DENSE_ROW_DIM;
            if *keep {
                self.residual[range].fill(0.0);
            } else {
                self.residual[range.clone()].copy_from_slice(&delta[range.clone()]);
                delta[range].fill(0.0);
            }
        }
        Some(sent)
    }

    /// What top-k has not sent yet (empty when it is off).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Restores a top-k residual saved from [`residual`](Self::residual) (a resumed run). Empty clears it.
    pub fn set_residual(&mut self, residual: &[f32]) -> Result<(), DenseSyncError> {
        if residual.is_empty() {
            self.residual.fill(0.0);
            return Ok(());
        }
        if residual.len() != self.residual.len() {
            return Err(DenseSyncError::Residual {
                saved: residual.len(),
                expected: self.residual.len(),
            });
        }
        self.residual.copy_from_slice(residual);
        Ok(())
    }

    /// Own pushes not yet held by every server's last pull.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DenseOptimizer;
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
        for opt in [
            DenseOptimizer::Sgd { lr: 0.1 },
            DenseOptimizer::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        ] {
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
        let mut model = small(DenseOptimizer::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        });
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

    #[test]
    fn counter_rows_route_to_their_server_and_differ_per_rank() {
        let map = ShardMap::new(4);
        let ids: Vec<u64> = (0..3)
            .flat_map(|r| (0..4).map(move |s| (r, s)))
            .map(|(r, s)| {
                let id = counter_id(&map, r, s);
                assert_eq!(map.server_of(id) as usize, s);
                assert!(id >= COUNTER_BASE);
                id
            })
            .collect();
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
    }
}
