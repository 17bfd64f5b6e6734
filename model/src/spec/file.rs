//! [`SpecFile`]: a spec's TOML as written (every `[[feature]]` setting optional, `[sparse]` supplying the
//! defaults), and [`SpecFile::resolve`], which checks every field and names the first bad one.

use serde::{Deserialize, Serialize};

use super::{field, Feature, ModelSpec, Pooling, SpecError, Table, COLUMNS, DENSE_INPUTS, MAX_DIM};
use super::{DenseKind, Ids, OptimizerKind};
use crate::config::InteractionConfig;
use crate::{DlrmConfig, ModelError};
use protocol::{Encoding, EvictionConfig, RowPrecision};

/// A spec file as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    /// The spec's name.
    pub name: String,
    /// Dense inputs: Criteo's 13.
    #[serde(default = "dense_inputs")]
    pub dense_inputs: usize,
    /// Bottom-MLP sizes.
    pub bottom_mlp: Vec<usize>,
    /// Top-MLP sizes.
    pub top_mlp: Vec<usize>,
    /// The interaction (dot when absent).
    #[serde(default)]
    pub interaction: InteractionConfig,
    /// The dense optimizer (the flags' when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense: Option<DenseSection>,
    /// Defaults of the features' settings.
    #[serde(default)]
    pub sparse: SparseDefaults,
    /// The sparse features.
    #[serde(default, rename = "feature")]
    pub features: Vec<FeatureEntry>,
}

fn dense_inputs() -> usize {
    DENSE_INPUTS
}

/// `[dense]`: the dense optimizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseSection {
    /// sgd, adagrad or adam.
    pub optimizer: DenseKind,
    /// Its learning rate (the flags' default for it when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
}

/// The settings a feature may set, each optional: in `[sparse]` the defaults, in `[[feature]]` overrides.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SparseDefaults {
    /// Row dimension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    /// sum or mean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling: Option<Pooling>,
    /// Most tokens per field (1: one-hot; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<usize>,
    /// Token cap (0: none; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_size: Option<u64>,
    /// Row optimizer (default adagrad).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<OptimizerKind>,
    /// Learning rate (default 0.05 for adagrad, 0.5 for sgd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    /// Wire encoding, `ENC` or `PULL/PUSH` (default f16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// How tokens become row ids: `hashed` (default) or `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Ids>,
    /// How the servers store the table's weights: `f32` (default), `bf16` or `f16`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<RowPrecision>,
    /// How the servers store the optimizer's moments: `f32` (default) or `bf16` (Adam only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_precision: Option<RowPrecision>,
    /// The table's row cap per server: `{ policy = "lfu", max_rows = N, max_bytes = B, decay_secs = S }`
    /// (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionConfig>,
}

/// One `[[feature]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureEntry {
    /// The Criteo column, `C1`..`C26`.
    pub column: String,
    /// The table it reads.
    pub table: String,
    /// Overrides of the `[sparse]` defaults.
    #[serde(flatten)]
    pub settings: SparseDefaults,
}

impl SpecFile {
    /// Checks every field and resolves the defaults.
    pub fn resolve(&self) -> Result<ModelSpec, SpecError> {
        if self.dense_inputs != DENSE_INPUTS {
            return Err(field(
                "dense_inputs",
                format!(
                    "{}, this trainer reads Criteo's {DENSE_INPUTS} (I1..I13)",
                    self.dense_inputs
                ),
            ));
        }
        if self.features.is_empty() {
            return Err(field("feature", "the spec has no [[feature]]"));
        }
        let mut features: Vec<Feature> = Vec::new();
        let mut tables: Vec<Table> = Vec::new();
        // Which feature first set each table (for the messages of a conflicting second use).
        let mut first_user: Vec<String> = Vec::new();
        let d = &self.sparse;
        for (i, entry) in self.features.iter().enumerate() {
            let at = format!("feature[{i}] ({})", entry.column);
            let s = &entry.settings;
            let column = entry
                .column
                .strip_prefix('C')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| (1..=COLUMNS).contains(n))
                .ok_or_else(|| {
                    field(
                        format!("feature[{i}].column"),
                        format!("{:?}, expected C1..C{COLUMNS}", entry.column),
                    )
                })?
                - 1;
            if let Some(j) = features.iter().position(|f| f.column == column) {
                return Err(field(
                    format!("{at}.column"),
                    format!("column {} is read by feature[{j}] already", entry.column),
                ));
            }
            if entry.table.trim().is_empty() {
                return Err(field(format!("{at}.table"), "empty table name"));
            }
            let dim = s.dim.or(d.dim).ok_or_else(|| {
                field(format!("{at}.dim"), "missing (set it here or in [sparse])")
            })?;
            if dim == 0 || dim > MAX_DIM {
                return Err(field(
                    format!("{at}.dim"),
                    format!("{dim}, expected 1..={MAX_DIM}"),
                ));
            }
            let tokens = s.tokens.or(d.tokens).unwrap_or(1);
            if tokens == 0 {
                return Err(field(format!("{at}.tokens"), "0, expected at least 1"));
            }
            let optimizer = s
                .optimizer
                .or(d.optimizer)
                .unwrap_or(OptimizerKind::Adagrad);
            let lr = s.lr.or(d.lr).unwrap_or(optimizer.default_lr());
            if !(lr.is_finite() && lr > 0.0) {
                return Err(field(
                    format!("{at}.lr"),
                    format!("{lr}, expected a finite number > 0"),
                ));
            }
            let encoding = s.encoding.as_ref().or(d.encoding.as_ref());
            let (pull, push) = match encoding {
                None => (Encoding::F16, Encoding::F16),
                Some(e) => parse_encoding(e).map_err(|p| field(format!("{at}.encoding"), p))?,
            };
            let table = Table {
                name: entry.table.clone(),
                dim,
                hash_size: s.hash_size.or(d.hash_size).unwrap_or(0),
                optimizer,
                lr,
                pull,
                push,
                ids: s.ids.or(d.ids).unwrap_or_default(),
                precision: s.precision.or(d.precision).unwrap_or_default(),
                state_precision: s.state_precision.or(d.state_precision).unwrap_or_default(),
                eviction: s.eviction.or(d.eviction),
            };
            check_precision(&at, &table)?;
            let t = match tables.iter().position(|t| t.name == entry.table) {
                Some(t) => {
                    check_shared(&at, &tables[t], &table, &first_user[t])?;
                    t
                }
                None => {
                    tables.push(table);
                    first_user.push(at.clone());
                    tables.len() - 1
                }
            };
            features.push(Feature {
                column,
                table: t,
                pooling: s.pooling.or(d.pooling).unwrap_or_default(),
                tokens,
            });
        }
        if let Some(dense) = &self.dense {
            if let Some(lr) = dense.lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
                return Err(field(
                    "dense.lr",
                    format!("{lr}, expected a finite number > 0"),
                ));
            }
        }
        let spec = ModelSpec {
            name: self.name.clone(),
            bottom: self.bottom_mlp.clone(),
            top: self.top_mlp.clone(),
            interaction: self.interaction,
            dense: self.dense.as_ref().map(|d| (d.optimizer, d.lr)),
            features,
            tables,
        };
        check_model(&spec, &spec.dlrm_config())?;
        Ok(spec)
    }
}

/// `ENC` or `PULL/PUSH`.
fn parse_encoding(text: &str) -> Result<(Encoding, Encoding), String> {
    let one = |v: &str| {
        v.trim()
            .parse::<Encoding>()
            .map_err(|e| format!("{text:?}: {e}"))
    };
    match text.split_once('/') {
        Some((a, b)) => Ok((one(a)?, one(b)?)),
        None => Ok((one(text)?, one(text)?)),
    }
}

/// Half-precision rows need an optimizer with state (`embedding::precision`: the stochastic rounding is keyed
/// by it).
pub(crate) fn check_precision(at: &str, table: &Table) -> Result<(), SpecError> {
    if !table.precision.is_f32() && table.optimizer == OptimizerKind::Sgd {
        return Err(field(
            format!("{at}.precision"),
            format!(
                "{}, but table {:?} uses sgd: bf16 and f16 rows need an optimizer with state (adagrad or adam)",
                table.precision, table.name
            ),
        ));
    }
    match table.state_precision {
        RowPrecision::F32 => {}
        RowPrecision::Bf16 if table.optimizer == OptimizerKind::Adam => {}
        p => {
            return Err(field(
                format!("{at}.state_precision"),
                format!(
                    "{p}, but table {:?} uses {:?}: bf16 state is for adam's moments (row-wise adagrad keeps one \
                     value a row, sgd none); f16 state is not supported",
                    table.name, table.optimizer
                ),
            ))
        }
    }
    Ok(())
}

/// A second feature on a table must agree with the first on the table's settings.
fn check_shared(at: &str, have: &Table, new: &Table, first: &str) -> Result<(), SpecError> {
    let differs = |what: &str, a: String, b: String| {
        field(
            format!("{at}.{what}"),
            format!("{b}, but table {:?} has {what} {a} from {first}", have.name),
        )
    };
    if have.dim != new.dim {
        return Err(differs("dim", have.dim.to_string(), new.dim.to_string()));
    }
    if have.hash_size != new.hash_size {
        let (a, b) = (have.hash_size.to_string(), new.hash_size.to_string());
        return Err(differs("hash_size", a, b));
    }
    if have.ids != new.ids {
        let (a, b) = (format!("{:?}", have.ids), format!("{:?}", new.ids));
        return Err(differs("ids", a, b));
    }
    if have.optimizer != new.optimizer || have.lr != new.lr {
        let (a, b) = (
            format!("{:?} lr {}", have.optimizer, have.lr),
            format!("{:?} lr {}", new.optimizer, new.lr),
        );
        return Err(differs("optimizer", a, b));
    }
    if have.eviction != new.eviction {
        let (a, b) = (
            format!("{:?}", have.eviction),
            format!("{:?}", new.eviction),
        );
        return Err(differs("eviction", a, b));
    }
    if have.precision != new.precision {
        let (a, b) = (have.precision.to_string(), new.precision.to_string());
        return Err(differs("precision", a, b));
    }
    if have.state_precision != new.state_precision {
        let (a, b) = (
            have.state_precision.to_string(),
            new.state_precision.to_string(),
        );
        return Err(differs("state_precision", a, b));
    }
    if (have.pull, have.push) != (new.pull, new.push) {
        let (a, b) = (
            format!("{}/{}", have.pull, have.push),
            format!("{}/{}", new.pull, new.push),
        );
        return Err(differs("encoding", a, b));
    }
    Ok(())
}

/// The dense model's checks, with the spec's field names.
fn check_model(spec: &ModelSpec, cfg: &DlrmConfig) -> Result<(), SpecError> {
    let Err(ModelError::Config { field: f, reason }) = cfg.validate() else {
        return Ok(());
    };
    let name = match f {
        "bottom" => "bottom_mlp".to_owned(),
        "top" => "top_mlp".to_owned(),
        "interaction" | "feature_dims" => {
            // Name the first feature whose dimension does not fit a dot interaction.
            let d = cfg.emb_dim;
            if let (InteractionConfig::Dot, Some(i)) = (
                spec.interaction,
                (0..spec.features.len()).find(|&i| spec.feature_dim(i) != d),
            ) {
                return Err(field(
                    "interaction",
                    format!(
                        "dot needs every feature's dim to equal the bottom MLP's last size {d}, \
                         but feature[{i}] (C{}) has dim {}",
                        spec.features[i].column + 1,
                        spec.feature_dim(i)
                    ),
                ));
            }
            "interaction".to_owned()
        }
        other => other.to_owned(),
    };
    Err(field(name, reason))
}
