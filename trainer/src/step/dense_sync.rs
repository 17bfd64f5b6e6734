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

use protocol::compression::topk::RowTopK;
use protocol::wire::dense;
pub use protocol::wire::dense::{counter_id, DENSE_ROW_DIM, DENSE_TABLE};
use protocol::{ProtocolError, ShardMap, TableConfig, TableCount};

use crate::model::Dlrm;

/// Own updates kept for adding to pulled sums: more than any staleness bound; a server whose counter falls this
/// far behind (it lost pushes) gets the oldest ones dropped.
const MAX_PENDING: usize = 256;

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
    /// Top-k sparsification of the pushed rows with its residual, or `None` to push every row.
    topk: Option<RowTopK>,
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
            s.ids = Bytes::from(dense::ids_payload(&with_counter));
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
            topk: None,
        }
    }

    /// Pushes only `fraction` (in (0, 1]) of the rows each step, top-k with error feedback (module docs); 1
    /// pushes every row.
    pub fn with_push_fraction(mut self, fraction: f32) -> DenseSync {
        let rows = self.rows();
        let k = ((rows as f64 * fraction as f64).ceil() as usize).clamp(1, rows.max(1));
        if k < rows {
            self.topk = Some(RowTopK::new(rows, DENSE_ROW_DIM, k));
        }
        self
    }

    /// Rows of the dense table.
    pub fn rows(&self) -> usize {
        self.flat.len() / DENSE_ROW_DIM
    }

    /// The table's config: SGD with learning rate 1 (the servers add the pushed deltas), rows starting at zero.
    pub fn table_config() -> TableConfig {
        dense::table_config()
    }

    /// The pull requests: `(server, table counts, id payload)`.
    pub fn pull_requests(&self) -> Vec<(usize, Vec<TableCount>, Bytes)> {
        self.servers
            .iter()
            .map(|s| (s.server, dense::counts(s.rows.len() + 1), s.ids.clone()))
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
            dense::decode_rows(bytes, s.rows.len() + 1, &mut self.decoded).map_err(|source| {
                DenseSyncError::Reply {
                    server: *server,
                    source,
                }
            })?;
            s.seen = dense::pushes_held(self.decoded[n - DENSE_ROW_DIM]);
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

    /// The hybrid mode's publication of the dense parameters (one trainer's, identical on every trainer) to the
    /// servers, for evaluation and serving from the servers: from the servers' current sums (`replies` of
    /// [`pull_requests`](Self::pull_requests)), the push requests that make them `model`'s parameters minus
    /// the initial ones.
    pub fn publish(
        &mut self,
        replies: &[(usize, Bytes)],
        model: &Dlrm,
    ) -> Result<Vec<(usize, Vec<TableCount>, Bytes)>, DenseSyncError> {
        self.pending.clear();
        for (server, bytes) in replies {
            let Some(s) = self.servers.iter().find(|s| s.server == *server) else {
                continue;
            };
            dense::decode_rows(bytes, s.rows.len() + 1, &mut self.decoded).map_err(|source| {
                DenseSyncError::Reply {
                    server: *server,
                    source,
                }
            })?;
            for (k, &row) in s.rows.iter().enumerate() {
                let at = row as usize * DENSE_ROW_DIM;
                let src = &self.decoded[k * DENSE_ROW_DIM..(k + 1) * DENSE_ROW_DIM];
                for (i, (d, v)) in self.flat[at..at + DENSE_ROW_DIM]
                    .iter_mut()
                    .zip(src)
                    .enumerate()
                {
                    *d = v + self.initial.get(at + i).copied().unwrap_or(0.0);
                }
            }
        }
        let requests = self.push_step(model);
        self.pending.clear();
        Ok(requests)
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
        let sent = self.topk.as_mut().map(|t| t.sparsify(&mut delta).to_vec());
        let number = self.pushed.unwrap_or(0);
        self.pushed = Some(number + 1);
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
                        (rows.into(), Bytes::from(dense::ids_payload(&with_counter)))
                    }
                };
                let mut payload =
                    Vec::with_capacity(ids.len() + (rows.len() + 1) * DENSE_ROW_DIM * 4);
                payload.extend_from_slice(&ids);
                for &row in rows.iter() {
                    let at = row as usize * DENSE_ROW_DIM;
                    dense::put_delta_row(&delta[at..at + DENSE_ROW_DIM], &mut payload);
                }
                dense::put_counter_row(&mut payload);
                (
                    s.server,
                    dense::counts(rows.len() + 1),
                    Bytes::from(payload),
                )
            })
            .collect();
        self.pending.push_back((number, delta));
        requests
    }

    /// What top-k has not sent yet (empty when it is off).
    pub fn residual(&self) -> &[f32] {
        self.topk.as_ref().map_or(&[], |t| t.residual())
    }

    /// Restores a top-k residual saved from [`residual`](Self::residual) (a resumed run). Empty clears it.
    pub fn set_residual(&mut self, residual: &[f32]) -> Result<(), DenseSyncError> {
        match &mut self.topk {
            Some(t) => t
                .set_residual(residual)
                .map_err(|e| DenseSyncError::Residual {
                    saved: e.saved,
                    expected: e.expected,
                }),
            None if residual.is_empty() => Ok(()),
            None => Err(DenseSyncError::Residual {
                saved: residual.len(),
                expected: 0,
            }),
        }
    }

    /// Own pushes not yet held by every server's last pull.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests;
