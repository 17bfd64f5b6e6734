//! [`ModelSpec`]: a model as a TOML file (docs/model-spec.md) — the dense inputs, per sparse feature its
//! table, dimension, pooling, caps, optimizer and wire encoding, the interaction and the MLP sizes — checked
//! field by field, and everything the trainer derives from it: the dense model's sizes, the embedding tables
//! to register, the per-table wire encodings, the plan's sparse layout and the reader's feature layout.
//!
//! Shipped specs live in `model/specs/` and are compiled in ([`SHIPPED`]); without `--model-spec` the
//! trainer builds the spec its flags describe (`trainer::config::ModelArgs::flag_spec`), which is today's
//! model. The format knows no command-line type: the flags use its enums ([`OptimizerKind`], [`DenseKind`];
//! their `clap::ValueEnum` derive is behind this crate's `clap` feature), never the reverse.

use serde::{Deserialize, Serialize};

use crate::config::InteractionConfig;
use crate::DlrmConfig;
use protocol::plan::{FeatureShape, SparseLayout, TableCodecs};
use protocol::{Encoding, EvictionConfig, InitConfig, OptimizerConfig, RowPrecision, TableConfig};

mod file;
#[cfg(test)]
mod tests;

pub use file::{DenseSection, FeatureEntry, SparseDefaults, SpecFile};

/// The shipped specs: `(name, TOML)`.
pub const SHIPPED: [(&str, &str); 3] = [
    ("dlrm-kaggle", include_str!("../specs/dlrm-kaggle.toml")),
    ("dlrm-v2", include_str!("../specs/dlrm-v2.toml")),
    ("dlrm-v2-small", include_str!("../specs/dlrm-v2-small.toml")),
];

/// Criteo's categorical columns.
pub const COLUMNS: usize = 26;
/// Criteo's integer columns.
pub const DENSE_INPUTS: usize = 13;
/// The largest row dimension a server accepts.
pub const MAX_DIM: usize = 4096;

/// Why a spec is refused: the field at fault (`feature[3] (C4).dim`) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Not TOML, or a field that does not exist or has the wrong type (the message names it and its line).
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    /// A field with a value that cannot work.
    #[error("{field}: {problem}")]
    Field {
        /// Where: `dim`, `feature[3] (C4).table`, `interaction`.
        field: String,
        /// What is wrong, with the value found.
        problem: String,
    },
    /// `--model-spec NAME` names no file and no shipped spec.
    #[error("no file {0:?} and no shipped spec of that name (shipped: dlrm-kaggle, dlrm-v2, dlrm-v2-small)")]
    Unknown(String),
    /// The file cannot be read.
    #[error("read {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

fn field(field: impl Into<String>, problem: impl Into<String>) -> SpecError {
    SpecError::Field {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The optimizer of the embedding rows (applied on the servers); it also picks the dense optimizer's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Plain SGD on embedding rows; SGD on the dense layers unless `--dense-optimizer` says otherwise.
    Sgd,
    /// Row-wise Adagrad on embedding rows; Adam on the dense layers unless `--dense-optimizer` says otherwise
    /// (dense Adam measured better than dense Adagrad on the demo data: BENCHMARKS.md).
    Adagrad,
    /// Adam on embedding rows (each row counts its own steps; betas 0.9 / 0.999, eps 1e-8); Adam on the dense
    /// layers unless `--dense-optimizer` says otherwise.
    Adam,
}

impl OptimizerKind {
    /// The rows' optimizer at learning rate `lr` (the one home of each kind's settings).
    pub fn config(self, lr: f32) -> OptimizerConfig {
        match self {
            OptimizerKind::Sgd => OptimizerConfig::Sgd { lr },
            OptimizerKind::Adagrad => OptimizerConfig::RowAdagrad {
                lr,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            OptimizerKind::Adam => OptimizerConfig::Adam {
                lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        }
    }

    /// The rows' learning rate when nothing sets one.
    pub fn default_lr(self) -> f32 {
        match self {
            OptimizerKind::Adagrad => 0.05,
            OptimizerKind::Sgd => 0.5,
            OptimizerKind::Adam => 0.001,
        }
    }

    /// The dense optimizer that goes with it when nothing sets one.
    pub fn dense_default(self) -> DenseKind {
        match self {
            OptimizerKind::Sgd => DenseKind::Sgd,
            OptimizerKind::Adagrad | OptimizerKind::Adam => DenseKind::Adam,
        }
    }
}

/// How a table's rows are keyed by the tokens its features read (docs/model-spec.md, `ids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ids {
    /// The trainer's ids: a bijective hash of the table and the (capped) token; the missing token has its own.
    #[default]
    Hashed,
    /// The capped token's value itself, the missing token read as 0: `int(token or "0", 16) % hash_size`,
    /// TorchRec's Criteo convention (tables of `hash_size` rows indexed from 0).
    Token,
}

impl Ids {
    fn is_hashed(&self) -> bool {
        *self == Ids::Hashed
    }

    /// The reader's scheme.
    pub fn scheme(self) -> criteo::IdScheme {
        match self {
            Ids::Hashed => criteo::IdScheme::Hashed,
            Ids::Token => criteo::IdScheme::Token,
        }
    }
}

/// The optimizer of the dense layers (applied on the trainer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum DenseKind {
    /// Plain SGD.
    Sgd,
    /// Adagrad.
    Adagrad,
    /// Adam (beta1 0.9, beta2 0.999, eps 1e-8).
    Adam,
}

/// How a multi-hot feature's bag pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The sum of the bag's rows.
    #[default]
    Sum,
    /// Their mean (an empty bag stays zero).
    Mean,
}

/// One sparse feature, every setting resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Feature {
    /// The Criteo column it reads, 0-based (C1 is 0).
    pub column: usize,
    /// Its table's index in [`ModelSpec::tables`].
    pub table: usize,
    /// Pooling of its bags.
    pub pooling: Pooling,
    /// Most tokens per field (1: one-hot).
    pub tokens: usize,
}

/// One embedding table, every setting resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// Its name (also its name on the servers).
    pub name: String,
    /// Row dimension.
    pub dim: usize,
    /// Tokens are taken modulo this before hashing (0: no cap).
    pub hash_size: u64,
    /// The row optimizer on the servers.
    pub optimizer: OptimizerKind,
    /// Its learning rate.
    pub lr: f32,
    /// Encoding of pulled rows.
    pub pull: Encoding,
    /// Encoding of pushed gradients.
    pub push: Encoding,
    /// How tokens become row ids (absent in specs and exports written before it existed: hashed).
    #[serde(default, skip_serializing_if = "Ids::is_hashed")]
    pub ids: Ids,
    /// How the servers store its weights: f32 (default; absent in specs written before it existed), bf16 or
    /// f16 (`embedding::precision`).
    #[serde(default, skip_serializing_if = "RowPrecision::is_f32")]
    pub precision: RowPrecision,
    /// How the servers store its optimizer's moments (Adam's): f32 (default) or bf16
    /// (`embedding::precision`, "bf16 state").
    #[serde(default, skip_serializing_if = "RowPrecision::is_f32")]
    pub state_precision: RowPrecision,
    /// Its row cap per server (`embedding::EvictionConfig`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionConfig>,
}

/// A checked model spec (serialized resolved, as an export's manifest records it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Its name (reports, the job line).
    pub name: String,
    /// Bottom-MLP sizes (the last is the bottom output's width).
    pub bottom: Vec<usize>,
    /// Top-MLP sizes (the last is 1).
    pub top: Vec<usize>,
    /// The interaction.
    pub interaction: InteractionConfig,
    /// The dense optimizer and learning rate, when the spec sets them.
    pub dense: Option<(DenseKind, Option<f32>)>,
    /// The sparse features, in model input order.
    pub features: Vec<Feature>,
    /// The tables, in order of first use.
    pub tables: Vec<Table>,
}

impl ModelSpec {
    /// Reads `--model-spec`: a file path, or the name of a shipped spec.
    pub fn load(name_or_path: &str) -> Result<ModelSpec, SpecError> {
        let path = std::path::Path::new(name_or_path);
        if path.is_file() {
            let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
                path: name_or_path.to_owned(),
                source,
            })?;
            return ModelSpec::parse(&text);
        }
        match SHIPPED.iter().find(|(n, _)| *n == name_or_path) {
            Some((_, text)) => ModelSpec::parse(text),
            None => Err(SpecError::Unknown(name_or_path.to_owned())),
        }
    }

    /// Parses and checks a spec's TOML.
    pub fn parse(text: &str) -> Result<ModelSpec, SpecError> {
        let file: SpecFile = toml::from_str(text)?;
        file.resolve()
    }

    /// The row dimension of feature `f`.
    pub fn feature_dim(&self, f: usize) -> usize {
        self.tables[self.features[f].table].dim
    }

    /// The dense model's sizes.
    pub fn dlrm_config(&self) -> DlrmConfig {
        let emb_dim = self.bottom.last().copied().unwrap_or(0);
        let dims: Vec<usize> = (0..self.features.len())
            .map(|f| self.feature_dim(f))
            .collect();
        DlrmConfig {
            num_dense: DENSE_INPUTS,
            num_sparse: self.features.len(),
            emb_dim,
            // Empty when uniform: the same config (and checkpoints) as before per-feature dimensions.
            feature_dims: if dims.iter().all(|&d| d == emb_dim) {
                Vec::new()
            } else {
                dims
            },
            bottom: self.bottom.clone(),
            top: self.top.clone(),
            interaction: self.interaction,
        }
    }

    /// The plan's view: table dimensions and per feature its table and pooling.
    pub fn sparse_layout(&self) -> SparseLayout {
        SparseLayout {
            dims: self.tables.iter().map(|t| t.dim).collect(),
            features: self
                .features
                .iter()
                .map(|f| FeatureShape {
                    table: f.table,
                    mean: f.pooling == Pooling::Mean,
                })
                .collect(),
        }
    }

    /// The reader's view: per feature its column, id salt (its table's index), cap and token limit.
    pub fn feature_layout(&self) -> criteo::FeatureLayout {
        criteo::FeatureLayout {
            features: self
                .features
                .iter()
                .map(|f| criteo::FeatureInput {
                    ids: self.tables[f.table].ids.scheme(),
                    column: f.column,
                    table: f.table as u32,
                    hash_size: self.tables[f.table].hash_size,
                    tokens: f.tokens,
                })
                .collect(),
        }
    }

    /// One line: features, tables, dimensions, bags, interaction, MLPs.
    pub fn describe(&self) -> String {
        let dims: std::collections::BTreeSet<usize> = self.tables.iter().map(|t| t.dim).collect();
        let multi: Vec<usize> = self
            .features
            .iter()
            .map(|f| f.tokens)
            .filter(|&n| n > 1)
            .collect();
        let interaction = match self.interaction {
            InteractionConfig::Dot => "dot".to_owned(),
            InteractionConfig::Dcn { layers, rank } => format!("dcn {layers} layers rank {rank}"),
        };
        format!(
            "{}: {} features in {} tables, dim {:?}, {} multi-hot (up to {} tokens), {interaction}, bottom {:?}, top {:?}",
            self.name,
            self.features.len(),
            self.tables.len(),
            dims,
            multi.len(),
            multi.iter().max().unwrap_or(&1),
            self.bottom,
            self.top
        )
    }

    /// The tables' optimizers, rates and encodings, grouped: `Adagrad lr 0.05, f16 on the wire (26 tables)`.
    pub fn describe_tables(&self) -> String {
        let mut groups: Vec<(String, usize)> = Vec::new();
        for t in &self.tables {
            let wire = if t.pull == t.push {
                t.pull.to_string()
            } else {
                format!("{}/{}", t.pull, t.push)
            };
            let key = format!("{:?} lr {}, {wire} on the wire", t.optimizer, t.lr);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => groups.push((key, 1)),
            }
        }
        let parts: Vec<String> = groups
            .into_iter()
            .map(|(k, n)| format!("{k} ({n} table{})", if n == 1 { "" } else { "s" }))
            .collect();
        parts.join("; ")
    }

    /// Sets every table's row precision (the trainer's `--row-precision`), refusing half precision for a table
    /// whose optimizer keeps no state (SGD), naming it.
    pub fn set_precision(&mut self, precision: RowPrecision) -> Result<(), SpecError> {
        for (t, table) in self.tables.iter_mut().enumerate() {
            table.precision = precision;
            file::check_precision(&format!("table[{t}]"), table)?;
        }
        Ok(())
    }

    /// Sets every table's state precision (the trainer's `--state-precision`), refusing bf16 for a table
    /// whose optimizer keeps no moments (SGD, row-wise Adagrad), naming it.
    pub fn set_state_precision(&mut self, precision: RowPrecision) -> Result<(), SpecError> {
        for (t, table) in self.tables.iter_mut().enumerate() {
            table.state_precision = precision;
            file::check_precision(&format!("table[{t}]"), table)?;
        }
        Ok(())
    }

    /// Whether any feature is multi-hot.
    pub fn is_multi_hot(&self) -> bool {
        self.features.iter().any(|f| f.tokens > 1)
    }

    /// The embedding tables to register: table `t` has id `t`, rows initialized uniformly in
    /// `±init_scale` from seed `seed * 1000 + t` (as before specs).
    pub fn table_configs(&self, seed: u64, init_scale: f32) -> Vec<TableConfig> {
        self.tables
            .iter()
            .enumerate()
            .map(|(t, table)| TableConfig {
                optimizer: table.optimizer.config(table.lr),
                init: InitConfig::uniform(init_scale),
                seed: seed.wrapping_mul(1000).wrapping_add(t as u64),
                precision: table.precision,
                state_precision: table.state_precision,
                eviction: table.eviction,
                ..TableConfig::new(t as u32, table.name.clone(), table.dim)
            })
            .collect()
    }

    /// Per-table wire encodings (`no_feedback` as the flags set it).
    pub fn codecs(&self, no_feedback: Vec<Encoding>) -> TableCodecs {
        TableCodecs {
            pull: self.tables.iter().map(|t| t.pull).collect(),
            push: self.tables.iter().map(|t| t.push).collect(),
            no_feedback,
        }
    }
}
