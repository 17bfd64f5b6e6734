//! Table configuration: [`TableConfig`], its optimizer ([`OptimizerConfig`]), initializer ([`InitConfig`]) and
//! admission filter ([`AdmissionConfig`]).
//!
//! One type describes a table everywhere: in table config files (TOML or JSON), persisted as JSON in the store's
//! metadata (key `table/<id>`) so a restarted server rebuilds its tables, and on the wire (bincode:
//! `RegisterTables`, `Hello`, replication and resharding, re-exported by `protocol`). A trainer replaying its
//! own pushes builds the same optimizer as the server from the same config. Changing the config of an existing
//! table is a [`EmbeddingError::TableConflict`].
//!
//! Fields added after the first release carry `#[serde(default)]`, so configs stored by earlier versions load
//! with those features off. The enums are internally tagged (`{"type": "sgd", "lr": 0.1}`); on the wire, whose
//! bincode cannot read that, a config travels as its JSON text (protocol's `wire::tables`).

use serde::{Deserialize, Serialize};

use crate::error::EmbeddingError;
use crate::precision::{RowCodec, RowPrecision};

/// Largest supported embedding dimension.
pub const MAX_DIM: usize = 4096;

/// Longest table name, in bytes (UTF-8): names are logged, persisted with the config and sent in every `Hello`.
pub const MAX_NAME_BYTES: usize = 256;

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
    /// L2 weight decay added to every gradient before the optimizer step: `g += weight_decay * w`. Finite and
    /// >= 0; default 0 (off).
    #[serde(default)]
    pub weight_decay: f32,
    /// Gradient clipping: a gradient row whose L2 norm exceeds `clip_norm` is scaled down to norm `clip_norm`
    /// (before weight decay is added). Finite and >= 0; default 0 (off).
    #[serde(default)]
    pub clip_norm: f32,
    /// Frequency admission (count-min sketch): an id gets a row only after `min_count` pushes. Default `None`
    /// (every pushed id gets a row).
    #[serde(default)]
    pub admission: Option<AdmissionConfig>,
    /// Rows not updated for this many seconds are deleted by [`crate::Engine::expire`], from memory and from
    /// the store. `1..=u32::MAX`; default `None` (rows live forever).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// How the weights are stored: `f32` (default), `bf16` or `f16`; the optimizer state is f32 in every case
    /// ([`crate::precision`]). Left out of a serialized f32 config, so configs stored before it read back
    /// equal.
    #[serde(default, skip_serializing_if = "RowPrecision::is_f32")]
    pub precision: RowPrecision,
    /// How the per-element optimizer state (Adam's moments, Adagrad's accumulators) is stored: `f32`
    /// (default) or `bf16`, rounded stochastically after each update ([`crate::precision`], "bf16 state").
    /// Left out of a serialized f32 config.
    #[serde(default, skip_serializing_if = "RowPrecision::is_f32")]
    pub state_precision: RowPrecision,
    /// A cap on the rows each server keeps of this table, enforced by deleting the least frequently updated
    /// rows (from memory and the store) at each expiry pass; default `None` (no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionConfig>,
}

/// A table's row cap and the policy that picks the rows to delete past it (see `table/cap.rs`). Written
/// `{"policy": "lfu", "max_rows": 1000000, "decay_secs": 3600}` or `{"policy": "score", ...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvictionConfig {
    /// Which rows go first.
    pub policy: EvictionPolicy,
    /// Most rows one server keeps of the table, `>= 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<u64>,
    /// Most bytes of memory one server spends on the table (rows, ids, index; as
    /// [`crate::Table::memory_bytes`] counts them), at least 1 MiB. With `max_rows` too, the smaller cap holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// The access counts (or scores) halve every `decay_secs` (so rows that were hot long ago lose to rows hot
    /// now); `None`: they never decay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_secs: Option<u64>,
}

/// What an export leaves out (publish-time pruning, docs/serving.md "Export"): rows untouched for
/// `max_age_secs` (in tables that keep last-update stamps: those with a TTL), rows with fewer than
/// `min_count` updates counted (in tables that keep counts: those with an LFU row cap, whose counts decay), and
/// rows scored below `min_score` (in tables with a score row cap). Rows held only in RocksDB (evicted by a
/// memory budget) keep none of these and are exported. The training servers keep every row; only the export is
/// smaller. Travels in a bincode `Checkpoint` request, so no field is ever skipped when serialized.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportPrune {
    /// Leave out rows untouched for at least this many seconds, `>= 1`.
    pub max_age_secs: Option<u64>,
    /// Leave out rows counted fewer than this many updates, `>= 1`.
    pub min_count: Option<u32>,
    /// Leave out rows whose score (decayed, [`EvictionPolicy::Score`]) is below this, finite and `> 0`.
    #[serde(default)]
    pub min_score: Option<f32>,
}

impl ExportPrune {
    /// Checks that something is asked and each value is in range; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        match (self.max_age_secs, self.min_count, self.min_score) {
            (None, None, None) => {
                Err("export prune: give max_age_secs, min_count, min_score or several".into())
            }
            (Some(0), _, _) => Err("export prune: max_age_secs 0, expected at least 1".into()),
            (_, Some(0), _) => Err("export prune: min_count 0, expected at least 1".into()),
            (_, _, Some(s)) if !(s.is_finite() && s > 0.0) => Err(format!(
                "export prune: min_score {s}, expected a finite score above 0"
            )),
            _ => Ok(()),
        }
    }
}

/// How a capped table picks the rows to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicy {
    /// Least frequently updated first: each row counts its updates (pushes, replicated updates), the counts
    /// decay by halving every `decay_secs`, and the rows with the lowest counts go (ties: by a hash of the id).
    Lfu,
    /// Lowest score first: the trainer attaches scores to ids (`Score` requests: an engagement, a value of its
    /// own), each row keeps its score (added or set, finite and `>= 0`; a new row starts at 0), the scores halve
    /// every `decay_secs`, and the rows with the lowest scores go (ties: by a hash of the id). Pushes do not
    /// change a score.
    Score,
}

/// How a `Score` request changes a row's score ([`EvictionPolicy::Score`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreMode {
    /// The score given is added to the row's (engagement that accumulates, decaying).
    Add,
    /// The score given replaces the row's.
    Set,
}

/// Count-min-sketch frequency admission of a table (see [`crate::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Pushes of an id before it gets a row, `>= 1` (1 admits on the first push, as without admission).
    pub min_count: u32,
    /// Counters per sketch row, `1..=2^26` (4 bytes each). More counters mean fewer hash collisions, i.e.
    /// fewer ids admitted early because of other ids' pushes.
    pub width: usize,
    /// Sketch rows (independent hashes), `1..=8`.
    pub depth: usize,
}

/// Largest [`AdmissionConfig::width`].
pub const MAX_SKETCH_WIDTH: usize = 1 << 26;
/// Largest [`AdmissionConfig::depth`].
pub const MAX_SKETCH_DEPTH: usize = 8;

/// The per-table optimizer, applied row by row to pushed gradients (see [`crate::optimizer`]). Written
/// `{"type": "<variant in snake_case>", <fields>}`.
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
    /// Adam (Kingma & Ba 2015, as `torch.optim.Adam`) with a per-row step count: state is `m[dim]`, `v[dim]`
    /// and the row's step `t`, and bias correction uses the row's own `t` (rows are updated at different
    /// rates, so a global step would over-correct rare rows).
    Adam {
        /// Learning rate, finite and > 0.
        lr: f32,
        /// Decay of the first moment, in `[0, 1)`.
        beta1: f32,
        /// Decay of the second moment, in `[0, 1)`.
        beta2: f32,
        /// Added to `sqrt(v_hat)`, finite and > 0.
        eps: f32,
    },
    /// FTRL-Proximal (McMahan et al. 2013, "Ad Click Prediction: a View from the Trenches", Algorithm 1), per
    /// coordinate: state is `z[dim]` and `n[dim]`; the weights are recomputed from `z` and `n` after each
    /// update.
    Ftrl {
        /// Learning rate `alpha`, finite and > 0.
        alpha: f32,
        /// Learning-rate offset `beta`, finite and >= 0.
        beta: f32,
        /// L1 strength `lambda_1`, finite and >= 0.
        l1: f32,
        /// L2 strength `lambda_2`, finite and >= 0.
        l2: f32,
    },
}

impl OptimizerConfig {
    /// This optimizer with its learning rate multiplied by `scale` (a push's `lr_scale`: a learning-rate schedule
    /// on the trainer reaching a table whose optimizer keeps state). `None` for FTRL unless `scale` is 1: its
    /// per-coordinate rate `alpha / (beta + sqrt(n))` is not a multiplier a schedule can move.
    pub fn with_lr_scale(&self, scale: f32) -> Option<OptimizerConfig> {
        let mut out = *self;
        match &mut out {
            OptimizerConfig::Sgd { lr }
            | OptimizerConfig::RowAdagrad { lr, .. }
            | OptimizerConfig::Adagrad { lr, .. }
            | OptimizerConfig::Adam { lr, .. } => *lr *= scale,
            OptimizerConfig::Ftrl { .. } if scale == 1.0 => {}
            OptimizerConfig::Ftrl { .. } => return None,
        }
        Some(out)
    }

    /// f32s of optimizer state stored after the weights of each row: SGD 0, row-wise Adagrad 1,
    /// element-wise Adagrad `dim`, Adam `2 * dim + 1`, FTRL `2 * dim`.
    pub fn state_len(&self, dim: usize) -> usize {
        match self {
            OptimizerConfig::Sgd { .. } => 0,
            OptimizerConfig::RowAdagrad { .. } => 1,
            OptimizerConfig::Adagrad { .. } => dim,
            OptimizerConfig::Adam { .. } => 2 * dim + 1,
            OptimizerConfig::Ftrl { .. } => 2 * dim,
        }
    }

    /// The optimizer's name as configs write it (`sgd`, `row_adagrad`, `adagrad`, `adam`, `ftrl`).
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerConfig::Sgd { .. } => "sgd",
            OptimizerConfig::RowAdagrad { .. } => "row_adagrad",
            OptimizerConfig::Adagrad { .. } => "adagrad",
            OptimizerConfig::Adam { .. } => "adam",
            OptimizerConfig::Ftrl { .. } => "ftrl",
        }
    }

    /// The leading state values that are per-element moments a table may store in bf16 (`state_precision`):
    /// Adam's `m` and `v` (not its step), Adagrad's accumulators; 0 for the others.
    pub fn moments_len(&self, dim: usize) -> usize {
        match self {
            OptimizerConfig::Adagrad { .. } => dim,
            OptimizerConfig::Adam { .. } => 2 * dim,
            OptimizerConfig::Sgd { .. }
            | OptimizerConfig::RowAdagrad { .. }
            | OptimizerConfig::Ftrl { .. } => 0,
        }
    }

    /// The learning rate (`alpha` for FTRL).
    pub fn lr(&self) -> f32 {
        match *self {
            OptimizerConfig::Sgd { lr }
            | OptimizerConfig::RowAdagrad { lr, .. }
            | OptimizerConfig::Adagrad { lr, .. }
            | OptimizerConfig::Adam { lr, .. } => lr,
            OptimizerConfig::Ftrl { alpha, .. } => alpha,
        }
    }

    /// Every hyper-parameter of this optimizer, in declaration order: for tools that set them all, as the
    /// fuzzers do with edge values (`protocol/tests/fuzz.rs`, `ps-server/tests/fuzz_handler.rs`).
    pub fn params_mut(&mut self) -> Vec<&mut f32> {
        match self {
            OptimizerConfig::Sgd { lr } => vec![lr],
            OptimizerConfig::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            }
            | OptimizerConfig::Adagrad {
                lr,
                eps,
                initial_accumulator,
            } => vec![lr, eps, initial_accumulator],
            OptimizerConfig::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => vec![lr, beta1, beta2, eps],
            OptimizerConfig::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => vec![alpha, beta, l1, l2],
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

/// Distribution of initial weights. Written `{"type": "uniform" | "normal", <field>}`.
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
    /// [`InitConfig::for_dim`], seed 0, no weight decay, clipping, admission or TTL.
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
            weight_decay: 0.0,
            clip_norm: 0.0,
            admission: None,
            ttl_secs: None,
            precision: RowPrecision::F32,
            state_precision: RowPrecision::F32,
            eviction: None,
        }
    }

    /// A table whose rows count what was pushed to them: named `C<id>`, SGD with learning rate 1, every row
    /// starting at zero (seed 1, which zero rows do not use). A push subtracts its gradients exactly (sums of
    /// small integers are exact in f32), so tests, audits and dense-delta tables can read back what was
    /// applied. Other settings by struct update: `TableConfig { optimizer, ..TableConfig::counter(id, dim) }`.
    pub fn counter(id: u32, dim: usize) -> Self {
        TableConfig {
            optimizer: OptimizerConfig::Sgd { lr: 1.0 },
            init: InitConfig::uniform(0.0),
            seed: 1,
            ..TableConfig::new(id, format!("C{id}"), dim)
        }
    }

    /// One config of every optimizer, each plain and with every optional field set (the other initializer,
    /// weight decay, clipping, admission, TTL), ids from 0: for tests of what carries configs (files, the store,
    /// the wire).
    pub fn every_kind() -> Vec<TableConfig> {
        let optimizers = [
            OptimizerConfig::Sgd { lr: 0.5 },
            OptimizerConfig::RowAdagrad {
                lr: 0.1,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            OptimizerConfig::Adagrad {
                lr: 0.1,
                eps: 1e-6,
                initial_accumulator: 0.1,
            },
            OptimizerConfig::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            OptimizerConfig::Ftrl {
                alpha: 0.05,
                beta: 1.0,
                l1: 0.1,
                l2: 0.01,
            },
        ];
        let mut out = Vec::new();
        for (i, optimizer) in optimizers.into_iter().enumerate() {
            let plain = TableConfig {
                optimizer,
                ..TableConfig::counter(i as u32, 16)
            };
            out.push(plain.clone());
            out.push(TableConfig {
                init: InitConfig::normal(0.5),
                seed: 1 << 40,
                weight_decay: 0.01,
                clip_norm: 2.0,
                admission: Some(AdmissionConfig {
                    min_count: 3,
                    width: 1024,
                    depth: 4,
                }),
                ttl_secs: Some(86_400),
                ..plain
            });
        }
        out
    }

    /// f32s of optimizer state per row.
    pub fn state_len(&self) -> usize {
        self.optimizer.state_len(self.dim)
    }

    /// f32s of a whole row as tables hand it out and take it in: `dim` weights followed by the optimizer state.
    pub fn row_len(&self) -> usize {
        self.dim + self.state_len()
    }

    /// How a row of this table is packed in memory and in the store.
    pub fn row_codec(&self) -> RowCodec {
        let half = if self.state_precision.is_f32() {
            0
        } else {
            self.optimizer.moments_len(self.dim)
        };
        RowCodec::new(self.precision, self.dim, self.state_len()).with_half_state(half)
    }

    /// Bytes per stored row (in memory, in the store and in snapshots): [`TableConfig::row_len`] x 4 for f32
    /// weights, about half of the weights' share for bf16 and f16.
    pub fn row_bytes(&self) -> usize {
        self.row_codec().bytes()
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
        if self.name.len() > MAX_NAME_BYTES {
            return bad(
                "name",
                format!("{} bytes", self.name.len()),
                "at most 256 bytes",
            );
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
        match self.state_precision {
            RowPrecision::F32 => {}
            RowPrecision::F16 => {
                return bad(
                    "state_precision",
                    "f16".into(),
                    "f32 or bf16 (f16 would flush small second moments to zero)",
                )
            }
            RowPrecision::Bf16 if self.optimizer.moments_len(self.dim) == 0 => {
                return bad(
                    "state_precision",
                    format!("bf16 with optimizer {}", self.optimizer.name()),
                    "f32: only adam's moments and adagrad's accumulators are stored in bf16 (row_adagrad                      keeps one value per row, sgd none, and ftrl recomputes its weights from its state)",
                )
            }
            RowPrecision::Bf16 => {}
        }
        if !self.precision.is_f32() && matches!(self.optimizer, OptimizerConfig::Sgd { .. }) {
            return bad(
                "precision",
                self.precision.name().into(),
                "f32 for an SGD table (bf16 and f16 rows round stochastically, keyed by the optimizer \
                 state, which SGD does not keep; use row_adagrad, adagrad, adam or ftrl)",
            );
        }
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
            OptimizerConfig::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                positive("optimizer.lr", lr)?;
                let decay = |field, v: f32| {
                    if (0.0..1.0).contains(&v) {
                        Ok(())
                    } else {
                        bad(field, v.to_string(), "a value in [0, 1)")
                    }
                };
                decay("optimizer.beta1", beta1)?;
                decay("optimizer.beta2", beta2)?;
                positive("optimizer.eps", eps)?;
            }
            OptimizerConfig::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => {
                positive("optimizer.alpha", alpha)?;
                non_negative("optimizer.beta", beta)?;
                non_negative("optimizer.l1", l1)?;
                non_negative("optimizer.l2", l2)?;
            }
        }
        match self.init.kind {
            InitKind::Uniform { scale } => non_negative("init.scale", scale)?,
            InitKind::Normal { std } => non_negative("init.std", std)?,
        }
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("clip_norm", self.clip_norm)?;
        if let Some(a) = self.admission {
            if a.min_count == 0 {
                return bad("admission.min_count", "0".into(), "an integer >= 1");
            }
            if a.width == 0 || a.width > MAX_SKETCH_WIDTH {
                return bad("admission.width", a.width.to_string(), "1..=67108864");
            }
            if a.depth == 0 || a.depth > MAX_SKETCH_DEPTH {
                return bad("admission.depth", a.depth.to_string(), "1..=8");
            }
        }
        if let Some(ttl) = self.ttl_secs {
            if ttl == 0 || ttl > u64::from(u32::MAX) {
                return bad("ttl_secs", ttl.to_string(), "1..=4294967295 seconds");
            }
        }
        if let Some(e) = &self.eviction {
            match (e.max_rows, e.max_bytes) {
                (None, None) => {
                    return bad(
                        "eviction",
                        format!("{e:?}"),
                        "max_rows or max_bytes (a cap to enforce)",
                    )
                }
                (Some(0), _) => return bad("eviction.max_rows", "0".into(), "at least 1"),
                (_, Some(b)) if b < 1 << 20 => {
                    return bad(
                        "eviction.max_bytes",
                        b.to_string(),
                        "at least 1048576 (1 MiB)",
                    )
                }
                _ => {}
            }
            if e.decay_secs == Some(0) {
                return bad(
                    "eviction.decay_secs",
                    "0".into(),
                    "at least 1 second, or absent",
                );
            }
        }
        Ok(())
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
        if self.weight_decay != other.weight_decay {
            out.push(format!(
                "weight_decay: registered {}, requested {}",
                self.weight_decay, other.weight_decay
            ));
        }
        if self.clip_norm != other.clip_norm {
            out.push(format!(
                "clip_norm: registered {}, requested {}",
                self.clip_norm, other.clip_norm
            ));
        }
        if self.admission != other.admission {
            out.push(format!(
                "admission: registered {:?}, requested {:?}",
                self.admission, other.admission
            ));
        }
        if self.ttl_secs != other.ttl_secs {
            out.push(format!(
                "ttl_secs: registered {:?}, requested {:?}",
                self.ttl_secs, other.ttl_secs
            ));
        }
        if self.precision != other.precision {
            out.push(format!(
                "precision: registered {}, requested {}",
                self.precision, other.precision
            ));
        }
        if self.state_precision != other.state_precision {
            out.push(format!(
                "state_precision: registered {}, requested {}",
                self.state_precision, other.state_precision
            ));
        }
        if self.eviction != other.eviction {
            out.push(format!(
                "eviction: registered {:?}, requested {:?}",
                self.eviction, other.eviction
            ));
        }
        out.join("; ")
    }
}

#[cfg(test)]
mod tests;
