//! One prediction over a batch, computed as the trainer's evaluation computes it: the trainer's [`Plan`]
//! deduplicates each table's ids, the rows come from the [`RowStore`] rounded through the table's pull
//! encoding (the trainer evaluates on rows pulled in it), the plan pools them into the model's input, and the
//! exported [`Dlrm`] predicts. So the answers equal the trainer's evaluation of the same rows.

use criteo::Batch;
use model::export::Export;
use model::Dlrm;
use protocol::compression::codec;
use protocol::plan::{Plan, SparseLayout};
use protocol::{Encoding, ShardMap};

use crate::store::{GatherScratch, RowStore};

/// Why a prediction failed (a server-side fault: the request was valid).
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    /// The rows could not be read.
    #[error("read embedding rows of table {table}: {source}")]
    Rows {
        /// The table.
        table: u32,
        /// The cause.
        source: embedding::EmbeddingError,
    },
    /// The model refused the inputs.
    #[error("predict: {0}")]
    Model(#[from] model::ModelError),
}

/// The dense side of one model version: what a delta of dense parameters replaces as a whole.
#[derive(Debug)]
pub struct DenseModel {
    /// The model.
    pub model: Dlrm,
    /// Its version: the export's, or the trainer's published dense version.
    pub version: u64,
}

/// What builds a dense model from a flat parameter vector: the export's sizes and precision.
#[derive(Debug, Clone)]
pub struct DenseTemplate {
    cfg: model::DlrmConfig,
    precision: model::Precision,
    sizes: Vec<usize>,
}

impl DenseTemplate {
    /// The template of `export`'s model.
    pub fn of(export: &Export) -> DenseTemplate {
        DenseTemplate {
            cfg: export.dlrm_config(),
            precision: export.manifest.precision,
            sizes: export.manifest.param_sizes.clone(),
        }
    }

    /// The dense model of `params` (every tensor concatenated in [`Dlrm::params`] order, as a trainer
    /// publishes them), or the model's refusal naming the length.
    pub fn build(&self, params: &[f32], version: u64) -> Result<DenseModel, model::ModelError> {
        let total: usize = self.sizes.iter().sum();
        if params.len() != total {
            return Err(model::ModelError::Length {
                arg: "published dense parameters",
                len: params.len(),
                expected: total,
            });
        }
        let mut model = Dlrm::new(self.cfg.clone(), model::DenseOptimizer::Sgd { lr: 0.0 }, 0)?;
        let mut at = 0;
        let tensors: Vec<&[f32]> = self
            .sizes
            .iter()
            .map(|&n| {
                let t = &params[at..at + n];
                at += n;
                t
            })
            .collect();
        model.set_params(&tensors)?;
        let precision = match self.precision {
            model::Precision::Bf16 if !model::bf16_available() => model::Precision::F32,
            p => p,
        };
        model.set_precision(precision)?;
        Ok(DenseModel { model, version })
    }
}

/// Predicts batches with one dense model at a time (owned by the predicting thread).
pub struct Predictor {
    dense: DenseModel,
    layout: SparseLayout,
    /// Per spec table, its id in the store ([`Export::table_ids`]).
    table_ids: Vec<u32>,
    pull: Vec<Encoding>,
    map: ShardMap,
    plan: Plan,
    unique_rows: Vec<Vec<f32>>,
    emb: Vec<f32>,
    encoded: Vec<u8>,
    scratch: GatherScratch,
}

impl std::fmt::Debug for Predictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Predictor")
            .field("dense_version", &self.dense.version)
            .finish_non_exhaustive()
    }
}

impl Predictor {
    /// The predictor of `export`'s model.
    pub fn new(export: &Export, dense_version: u64) -> Result<Predictor, model::ModelError> {
        let spec = &export.manifest.spec;
        let params: Vec<f32> = export.params.concat();
        Ok(Predictor {
            dense: DenseTemplate::of(export).build(&params, dense_version)?,
            layout: spec.sparse_layout(),
            table_ids: export.table_ids.clone(),
            pull: spec.tables.iter().map(|t| t.pull).collect(),
            map: ShardMap::new(1),
            plan: Plan::default(),
            unique_rows: Vec::new(),
            emb: Vec::new(),
            encoded: Vec::new(),
            scratch: GatherScratch::default(),
        })
    }

    /// The dense model's version.
    pub fn dense_version(&self) -> u64 {
        self.dense.version
    }

    /// Replaces the dense model (between two batches: a prediction never mixes two versions).
    pub fn set_dense(&mut self, dense: DenseModel) {
        self.dense = dense;
    }

    /// The click probabilities of `batch`'s rows.
    pub fn predict(&mut self, store: &RowStore, batch: &Batch) -> Result<&[f32], PredictError> {
        self.plan.build_with(
            &self.layout,
            batch.len,
            &batch.sparse,
            &batch.offsets,
            &self.map,
        );
        let tables = self.layout.tables();
        self.unique_rows.resize_with(tables, Vec::new);
        for t in 0..tables {
            let ids = self.plan.unique(t);
            let dim = self.layout.dims[t];
            let rows = &mut self.unique_rows[t];
            rows.resize(ids.len() * dim, 0.0);
            let table = self.table_ids[t];
            store
                .gather(table, ids, rows, &mut self.scratch)
                .map_err(|source| PredictError::Rows { table, source })?;
            let enc = self.pull[t];
            if enc != Encoding::F32 {
                // What a pull in `enc` would have delivered to the trainer.
                self.encoded.clear();
                codec::encode_rows(rows, dim, enc, &mut self.encoded);
                codec::decode_rows(&self.encoded, dim, enc, rows)
                    .expect("rows just encoded decode");
            }
        }
        self.plan
            .gather_embeddings(&self.unique_rows, &mut self.emb);
        Ok(self
            .dense
            .model
            .predict(batch.len, &batch.dense, &self.emb)?)
    }
}
