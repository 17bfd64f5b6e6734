//! Table configuration: [`TableConfig`], its optimizer ([`OptimizerConfig`]) and initializer ([`InitConfig`]).
//!
//! A config is persisted as JSON in the store's metadata (key `table/<id>`) so a restarted server rebuilds its
//! tables; changing it for an existing table is a [`EmbeddingError::TableConflict`].

use serde::{Deserialize, Serialize};

use crate::error::EmbeddingError;

/// Largest supported embedding dimension.
pub const MAX_DIM: usize = 4096;

/// Configuration of one embedding table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// Table id, unique per server; the key of its column family (`t<id>`).
    pub id: u32,
    /// Human-readable name (e.g. `"C1"`), for logs and metrics only.
    pub name: String,
    /// Embedding dimension: f32 weights per row, `1..=4096`.
    pub dim: usize,
    /// The optimizer applied to pushed gradients; it decides the per-row state length.
    pub optimizer: OptimizerConfig,
    /// How rows are initialized on first use.
    pub init: InitConfig,
    /// Seed of the deterministic initializer (DESIGN.md: "deterministic from (table seed, id)").
    pub seed: u64,
}

/// The per-table optimizer, applied row by row to pushed gradients (see [`crate::optimizer`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerConfig {
    /// Plain SGD: `w -= lr * g`. No state.
    Sgd {
        /// Learning rate, finite and > 0.
        lr: f32,
    },
    /// Row-wise Adagrad (FBGEMM / TorchRec `EXACT_ROWWISE_ADAGRAD`): one accumulator per row,
    /// `acc += mean(g^2); w -= lr * g / (sqrt(acc) + eps)`.
    RowAdagrad {
        /// Learning rate, finite and > 0.
        lr: f32,
        /// Added to `sqrt(acc)`, finite and > 0.
        eps: f32,
        /// Accumulator value of a new row, finite and >= 0.
        initial_accumulator: f32,
    },
    /// Element-wise Adagrad: one accumulator per weight,
    /// `acc_i += g_i^2; w_i -= lr * g_i / (sqrt(acc_i) + eps)`.
    Adagrad {
        /// Learning rate, finite and > 0.
        lr: f32,
        /// Added to `sqrt(acc_i)`, finite and > 0.
        eps: f32,
        /// Accumulator value of a new row, finite and >= 0.
        initial_accumulator: f32,
    },
}

impl OptimizerConfig {
    /// f32s of optimizer state stored after the weights of each row: SGD 0, row-wise Adagrad 1,
    /// element-wise Adagrad `dim`.
    pub fn state_len(&self, dim: usize) -> usize {
        match self {
            OptimizerConfig::Sgd { .. } => 0,
            OptimizerConfig::RowAdagrad { .. } => 1,
            OptimizerConfig::Adagrad { .. } => dim,
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f32 {
        match *self {
            OptimizerConfig::Sgd { lr }
            | OptimizerConfig::RowAdagrad { lr, .. }
            | OptimizerConfig::Adagrad { lr, .. } => lr,
        }
    }
}

/// How new rows are initialized (see [`crate::init`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitConfig {
    /// The distribution.
    pub kind: InitKind,
}

/// Distribution of initial weights.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum InitKind {
    /// Uniform in `(-scale, scale)`; `scale = 0` gives zeros.
    Uniform {
        /// Half-width, finite and >= 0.
        scale: f32,
    },
    /// Normal with mean 0.
    Normal {
        /// Standard deviation, finite and >= 0.
        std: f32,
    },
}

impl InitConfig {
    /// Uniform in `(-scale, scale)`.
    pub fn uniform(scale: f32) -> Self {
        InitConfig {
            kind: InitKind::Uniform { scale },
        }
    }

    /// Normal with mean 0 and standard deviation `std`.
    pub fn normal(std: f32) -> Self {
        InitConfig {
            kind: InitKind::Normal { std },
        }
    }

    /// The DLRM reference initializer: uniform in `±sqrt(1 / num_rows)` (facebookresearch/dlrm `create_emb`).
    pub fn dlrm(num_rows: u64) -> Self {
        Self::uniform((1.0 / num_rows.max(1) as f64).sqrt() as f32)
    }

    /// The default when the row count is unknown (hashed ids): uniform in `±sqrt(1 / dim)`, which keeps the
    /// pairwise dot products of DLRM's interaction layer of order 1 at the start.
    pub fn for_dim(dim: usize) -> Self {
        Self::uniform((1.0 / dim.max(1) as f64).sqrt() as f32)
    }
}

impl TableConfig {
    /// A config with defaults: row-wise Adagrad (lr 0.01, eps 1e-8, accumulator 0),
    /// [`InitConfig::for_dim`] and seed 0.
    pub fn new(id: u32, name: impl Into<String>, dim: usize) -> Self {
        TableConfig {
            id,
            name: name.into(),
            dim,
            optimizer: OptimizerConfig::RowAdagrad {
                lr: 0.01,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            init: InitConfig::for_dim(dim),
            seed: 0,
        }
    }

    /// f32s of optimizer state per row.
    pub fn state_len(&self) -> usize {
        self.optimizer.state_len(self.dim)
    }

    /// f32s per stored row: `dim` weights followed by the optimizer state.
    pub fn row_len(&self) -> usize {
        self.dim + self.state_len()
    }

    /// Checks every field; the error names the field and the rejected value.
    pub fn validate(&self) -> Result<(), EmbeddingError> {
        let bad = |field: &'static str, value: String, expected: &'static str| {
            Err(EmbeddingError::InvalidConfig {
                table: self.id,
                field,
                value,
                expected,
            })
        };
        if self.dim == 0 || self.dim > MAX_DIM {
            return bad("dim", self.dim.to_string(), "1..=4096");
        }
        if self.name.is_empty() {
            return bad("name", "\"\"".into(), "a non-empty name");
        }
        let positive = |field, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                bad(field, v.to_string(), "a finite value > 0")
            }
        };
        let non_negative = |field, v: f32| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(field, v.to_string(), "a finite value >= 0")
            }
        };
        match self.optimizer {
            OptimizerConfig::Sgd { lr } => positive("optimizer.lr", lr)?,
            OptimizerConfig::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            }
            | OptimizerConfig::Adagrad {
                lr,
                eps,
                initial_accumulator,
            } => {
                positive("optimizer.lr", lr)?;
                positive("optimizer.eps", eps)?;
                non_negative("optimizer.initial_accumulator", initial_accumulator)?;
            }
        }
        match self.init.kind {
            InitKind::Uniform { scale } => non_negative("init.scale", scale),
            InitKind::Normal { std } => non_negative("init.std", std),
        }
    }

    /// Lists the fields that differ from `other`, as `"field: registered A, requested B"` joined by `"; "`,
    /// or an empty string if the configs are equal.
    pub fn differences(&self, other: &TableConfig) -> String {
        let mut out = Vec::new();
        if self.id != other.id {
            out.push(format!(
                "id: registered {}, requested {}",
                self.id, other.id
            ));
        }
        if self.name != other.name {
            out.push(format!(
                "name: registered {:?}, requested {:?}",
                self.name, other.name
            ));
        }
        if self.dim != other.dim {
            out.push(format!(
                "dim: registered {}, requested {}",
                self.dim, other.dim
            ));
        }
        if self.optimizer != other.optimizer {
            out.push(format!(
                "optimizer: registered {:?}, requested {:?}",
                self.optimizer, other.optimizer
            ));
        }
        if self.init != other.init {
            out.push(format!(
                "init: registered {:?}, requested {:?}",
                self.init.kind, other.init.kind
            ));
        }
        if self.seed != other.seed {
            out.push(format!(
                "seed: registered {}, requested {}",
                self.seed, other.seed
            ));
        }
        out.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_len_per_optimizer() {
        let mut c = TableConfig::new(1, "t", 16);
        assert_eq!(c.state_len(), 1);
        assert_eq!(c.row_len(), 17);
        c.optimizer = OptimizerConfig::Sgd { lr: 0.1 };
        assert_eq!(c.state_len(), 0);
        c.optimizer = OptimizerConfig::Adagrad {
            lr: 0.1,
            eps: 1e-8,
            initial_accumulator: 0.0,
        };
        assert_eq!(c.row_len(), 32);
    }

    #[test]
    fn validate_names_field_and_value() {
        let mut c = TableConfig::new(3, "t", 0);
        let e = c.validate().unwrap_err().to_string();
        assert_eq!(e, "table 3: invalid dim = 0, expected 1..=4096");
        c.dim = 4097;
        assert!(c.validate().is_err());
        c.dim = 4096;
        c.validate().unwrap();
        c.optimizer = OptimizerConfig::Sgd { lr: f32::NAN };
        let e = c.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            "table 3: invalid optimizer.lr = NaN, expected a finite value > 0"
        );
        c.optimizer = OptimizerConfig::RowAdagrad {
            lr: 0.1,
            eps: 0.0,
            initial_accumulator: 0.0,
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("optimizer.eps = 0"));
        c.optimizer = OptimizerConfig::Sgd { lr: 0.1 };
        c.init = InitConfig::normal(-1.0);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("init.std = -1"));
    }

    #[test]
    fn json_round_trip() {
        let c = TableConfig::new(7, "C7", 8);
        let s = serde_json::to_string(&c).unwrap();
        assert!(s.contains("\"type\":\"row_adagrad\""), "{s}");
        let back: TableConfig = serde_json::from_str(&s).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn differences_lists_fields() {
        let a = TableConfig::new(1, "a", 16);
        let mut b = a.clone();
        assert_eq!(a.differences(&b), "");
        b.dim = 32;
        b.seed = 5;
        assert_eq!(
            a.differences(&b),
            "dim: registered 16, requested 32; seed: registered 0, requested 5"
        );
    }
}
