//! Dense parameters kept on the parameter servers, for several trainers training one model.
//!
//! The dense parameters (every weight and bias, in [`Dlrm::params`] order) are flattened and cut into rows of
//! [`DENSE_ROW_DIM`] f32 values (the last row zero-padded) in the reserved table [`DENSE_TABLE`]; row `i` has id
//! `i` and lives on whichever server the shard map routes it to, so the table is split across the shards.
//!
//! The servers hold *offsets* from the deterministic initial parameters: every trainer builds the same initial
//! model from `--seed`, and the table's rows start at zero (a uniform initializer of half-width 0). A trainer's
//! parameters are `initial + pulled offset`. Because SGD, Adagrad and Adam updates do not depend on where the
//! parameters sit (no weight decay), updating the offsets with the parameters' gradients moves `initial +
//! offset` exactly as updating the parameters would, and no trainer has to upload initial values.
//!
//! The table's server-side optimizer matches the dense optimizer: SGD is SGD; Adam is the engine's Adam with
//! per-row step counts, which equal the global step because every row is pushed at every step; Adagrad becomes
//! the engine's row-wise Adagrad (one accumulator per 64 values, a documented approximation: the engine has no
//! element-wise Adagrad). Dense rows travel as f32 with a gradient scale of 1.
//!
//! Each step, a trainer pulls the rows (with the same staleness gate as its embedding pull), computes its
//! gradients and pushes them; the servers apply every trainer's push as it arrives (asynchronous SGD with the
//! staleness bound `k`).

use bytes::Bytes;
use protocol::{
    codec, Encoding, InitSpec, OptimizerSpec, ProtocolError, ShardMap, TableCount, TableSpec,
};

use crate::model::{DenseOptimizer, Dlrm};

/// The reserved table id of the dense parameters (embedding tables are numbered from 0 by feature).
pub const DENSE_TABLE: u32 = 1_000_000;

/// Values per dense row.
pub const DENSE_ROW_DIM: usize = 64;

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
    /// The pull payload: those ids as one id section ([`protocol::message::put_ids`]).
    ids: Bytes,
}

/// The dense table's layout and the trainer's initial parameters.
#[derive(Debug, Clone)]
pub struct DenseSync {
    sizes: Vec<usize>,
    total: usize,
    initial: Vec<f32>,
    servers: Vec<ServerRows>,
    /// Scratch: the flattened parameters or gradients, padded to whole rows.
    flat: Vec<f32>,
    decoded: Vec<f32>,
}

impl DenseSync {
    /// The layout of `model`'s parameters on the servers of `map`; `model` must hold its initial parameters.
    pub fn new(model: &Dlrm, map: &ShardMap) -> DenseSync {
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
            })
            .collect();
        for id in 0..rows {
            servers[map.server_of(id) as usize].rows.push(id);
        }
        servers.retain(|s| !s.rows.is_empty());
        for s in &mut servers {
            let mut ids = Vec::with_capacity(s.rows.len() * 8);
            protocol::message::put_ids(&s.rows, &mut ids);
            s.ids = Bytes::from(ids);
        }
        DenseSync {
            sizes,
            total,
            initial,
            servers,
            flat: vec![0.0; rows as usize * DENSE_ROW_DIM],
            decoded: Vec::new(),
        }
    }

    /// Rows of the dense table.
    pub fn rows(&self) -> usize {
        self.flat.len() / DENSE_ROW_DIM
    }

    /// The table spec: the server-side optimizer matching `opt`, rows starting at zero.
    pub fn table_spec(opt: DenseOptimizer) -> TableSpec {
        let optimizer = match opt {
            DenseOptimizer::Sgd { lr } => OptimizerSpec::Sgd { lr },
            DenseOptimizer::Adagrad {
                lr,
                eps,
                initial_accumulator,
            } => OptimizerSpec::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            },
            DenseOptimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay: 0.0,
                clip_norm: 0.0,
            },
        };
        TableSpec {
            id: DENSE_TABLE,
            name: "dense".into(),
            dim: DENSE_ROW_DIM as u32,
            optimizer,
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
            .map(|s| (s.server, Self::counts(s.rows.len()), s.ids.clone()))
            .collect()
    }

    /// Decodes the pulled offsets (f32 rows, one reply per server of [`pull_requests`](Self::pull_requests))
    /// and sets `model`'s parameters to `initial + offset`.
    pub fn apply_pulled(
        &mut self,
        replies: &[(usize, Bytes)],
        model: &mut Dlrm,
    ) -> Result<(), DenseSyncError> {
        for (server, bytes) in replies {
            let Some(s) = self.servers.iter().find(|s| s.server == *server) else {
                continue;
            };
            let n = s.rows.len() * DENSE_ROW_DIM;
            let reply = |source| DenseSyncError::Reply {
                server: *server,
                source,
            };
            let expected = Encoding::F32
                .rows_bytes(s.rows.len(), n)
                .unwrap_or(usize::MAX);
            protocol::message::check_len("dense rows", bytes.len(), expected).map_err(reply)?;
            self.decoded.resize(n, 0.0);
            codec::decode(bytes, Encoding::F32, &mut self.decoded).map_err(reply)?;
            for (k, &row) in s.rows.iter().enumerate() {
                let at = row as usize * DENSE_ROW_DIM;
                self.flat[at..at + DENSE_ROW_DIM]
                    .copy_from_slice(&self.decoded[k * DENSE_ROW_DIM..(k + 1) * DENSE_ROW_DIM]);
            }
        }
        for (p, &init) in self.flat[..self.total].iter_mut().zip(&self.initial) {
            *p += init;
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

    /// The push requests of `model`'s last gradients: `(server, table counts, ids then f32 rows)`.
    pub fn push_requests(&mut self, model: &Dlrm) -> Vec<(usize, Vec<TableCount>, Bytes)> {
        let mut at = 0;
        for g in model.grads() {
            self.flat[at..at + g.len()].copy_from_slice(g);
            at += g.len();
        }
        self.flat[at..].iter_mut().for_each(|x| *x = 0.0);
        self.servers
            .iter()
            .map(|s| {
                let mut payload =
                    Vec::with_capacity(s.ids.len() + s.rows.len() * DENSE_ROW_DIM * 4);
                payload.extend_from_slice(&s.ids);
                for &row in &s.rows {
                    let at = row as usize * DENSE_ROW_DIM;
                    codec::encode(
                        &self.flat[at..at + DENSE_ROW_DIM],
                        Encoding::F32,
                        &mut payload,
                    );
                }
                (s.server, Self::counts(s.rows.len()), Bytes::from(payload))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DlrmConfig;

    fn small() -> Dlrm {
        let cfg = DlrmConfig {
            num_sparse: 2,
            emb_dim: 4,
            bottom: vec![8, 4],
            top: vec![6, 1],
            ..DlrmConfig::default()
        };
        Dlrm::new(cfg, DenseOptimizer::Sgd { lr: 0.1 }, 3).unwrap()
    }

    #[test]
    fn zero_offsets_give_the_initial_model_and_offsets_add() {
        let map = ShardMap::new(3);
        let mut model = small();
        let mut sync = DenseSync::new(&model, &map);
        assert_eq!(sync.rows(), model.num_params().div_ceil(DENSE_ROW_DIM));
        let initial: Vec<Vec<f32>> = model.params().iter().map(|p| p.to_vec()).collect();
        // Serve offsets: row id r has every value r.
        let replies: Vec<(usize, Bytes)> = sync
            .pull_requests()
            .into_iter()
            .map(|(s, counts, ids)| {
                let mut decoded = Vec::new();
                let n = counts[0].count as usize;
                let used = protocol::ids::get_ids(&ids, n, &mut decoded).unwrap();
                assert_eq!(used, ids.len());
                let mut rows = Vec::new();
                for &id in &decoded {
                    codec::encode(&[id as f32; DENSE_ROW_DIM], Encoding::F32, &mut rows);
                }
                (s, Bytes::from(rows))
            })
            .collect();
        sync.apply_pulled(&replies, &mut model).unwrap();
        let mut flat_index = 0usize;
        for (now, before) in model.params().iter().zip(&initial) {
            for (a, b) in now.iter().zip(before) {
                assert_eq!(*a, b + (flat_index / DENSE_ROW_DIM) as f32);
                flat_index += 1;
            }
        }
        // A short reply is a typed error naming the server.
        let bad = vec![(replies[0].0, replies[0].1.slice(4..))];
        let err = sync.apply_pulled(&bad, &mut model).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("server {}", replies[0].0)),
            "{err}"
        );
    }

    #[test]
    fn push_carries_every_gradient_once() {
        let map = ShardMap::new(2);
        let mut model = small();
        let (b, ns, d) = (3, 2, 4);
        let dense = vec![0.5; b * 13];
        let emb = vec![0.1; b * ns * d];
        let mut emb_grad = vec![0.0; emb.len()];
        model
            .forward_backward(b, &dense, &emb, &[1.0, 0.0, 1.0], &mut emb_grad)
            .unwrap();
        let want: f64 = model
            .grads()
            .iter()
            .flat_map(|g| g.iter())
            .map(|&g| g as f64)
            .sum();
        let mut sync = DenseSync::new(&model, &map);
        let (mut got, mut rows) = (0.0f64, 0usize);
        for (_, counts, payload) in sync.push_requests(&model) {
            let n = counts[0].count as usize;
            rows += n;
            let mut ids = Vec::new();
            let used = protocol::ids::get_ids(&payload, n, &mut ids).unwrap();
            let mut vals = vec![0.0; n * DENSE_ROW_DIM];
            codec::decode(&payload[used..], Encoding::F32, &mut vals).unwrap();
            assert_eq!(vals.len(), n * DENSE_ROW_DIM);
            got += vals.iter().map(|&v| v as f64).sum::<f64>();
        }
        assert_eq!(rows, sync.rows());
        assert!(
            (got - want).abs() < 1e-6 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
    }
}
