//! The trainer's typed config: flags (and environment), optionally a TOML file with the same fields.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::model::spec::{DenseKind, OptimizerKind};
use crate::model::{DenseOptimizer, DlrmConfig, ModelError};
use protocol::{Encoding, InitConfig, RowPrecision, TableConfig};

/// A trainer setting that cannot work, or a config file that cannot be read; each message names the setting
/// or file and the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A numeric setting out of its range: "lr = NaN, expected a finite number > 0".
    #[error("{name} = {value}, expected {expected}")]
    OutOfRange {
        /// The flag's name (kebab-case, as on the command line and in TOML).
        name: &'static str,
        /// The value given.
        value: String,
        /// What the setting accepts.
        expected: &'static str,
    },
    /// A table of the model evicts by score, which this trainer cannot feed.
    #[error(
        "table {table}: eviction policy \"score\" keeps the rows a client scores highest, and this trainer \
         gives no scores (every row would stay at 0 and go in hash order): use policy \"lfu\", or train through \
         pstrain and give scores with Client.score"
    )]
    ScoredTable {
        /// The table's name.
        table: String,
    },
    /// A `--table-encoding` entry that does not parse or names an unknown table.
    #[error("table-encoding {entry:?}: {problem}")]
    TableEncoding {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `--model-spec` cannot be read or is refused.
    #[error("model spec {spec}: {source}")]
    Spec {
        /// The name or path given.
        spec: String,
        /// What is wrong, naming the field (boxed: a TOML error is large).
        source: Box<crate::model::spec::SpecError>,
    },
    /// The model's sizes or dense optimizer are invalid.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// `--config` names a file that cannot be read.
    #[error("read config {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `--config` names a file that is not valid TOML of [`ModelArgs`] fields.
    #[error("parse config {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause, with the line and the field.
        source: toml::de::Error,
    },
}

impl ConfigError {
    /// Whether the message contains `needle` (tests check that errors name what was wrong).
    pub fn mentions(&self, needle: &str) -> bool {
        self.to_string().contains(needle)
    }
}

/// Arithmetic of the dense layers' matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DensePrecision {
    /// bf16 where the CPU has a bf16 kernel expected to beat f32 (AMX-BF16 tiles, or AVX512-BF16 on AMD Zen
    /// 4/5; not AVX512-BF16 on Intel, measured slower than f32 there: [`crate::model::bf16_preferred`]), else
    /// f32.
    Auto,
    /// f32 everywhere.
    F32,
    /// Mixed precision: products on bf16 inputs with f32 sums (AMX tiles, else AVX512-BF16); master weights,
    /// optimizer, interaction and loss in f32. Fails on CPUs with neither.
    Bf16,
}

impl DensePrecision {
    /// The model precision this setting picks on this machine.
    pub fn resolve(self) -> crate::model::Precision {
        use crate::model::{bf16_preferred, Precision};
        match self {
            DensePrecision::Auto if bf16_preferred() => Precision::Bf16,
            DensePrecision::Auto | DensePrecision::F32 => Precision::F32,
            DensePrecision::Bf16 => Precision::Bf16,
        }
    }
}

/// Which lossy pushes keep a quantization residual for the row's next push (error feedback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedbackMode {
    /// Pushes coarser than f16 (bf16, int8). f16 keeps 11 significant bits of the loss-scaled gradients: on the
    /// demo data its residuals changed the test AUC by less than run-to-run noise while their store (one
    /// random memory access per pushed row into tens of MB) took 8% of the CPU samples in a whole-system profile
    /// (BENCHMARKS.md).
    Auto,
    /// Every lossy push encoding, f16 included.
    #[value(alias = "true")]
    On,
    /// None.
    #[value(alias = "false")]
    Off,
}

impl<'de> Deserialize<'de> for FeedbackMode {
    /// `"auto"`, `"on"`, `"off"`, or a bool (`true` = on, as the flag was a bool before).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(true) => Ok(FeedbackMode::On),
            Raw::Bool(false) => Ok(FeedbackMode::Off),
            Raw::Name(n) => FeedbackMode::from_str(&n, true).map_err(|_| {
                serde::de::Error::custom(format!(
                    "error-feedback {n:?}: expected auto, on, off, true or false"
                ))
            }),
        }
    }
}

/// Model and optimizer flags, shared by `train` and `demo`.
#[derive(Debug, Clone, Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ModelArgs {
    /// Samples per training batch.
    #[arg(long, default_value_t = 2048)]
    pub batch_size: usize,
    /// The model as a spec (docs/model-spec.md): a TOML file, or a shipped spec's name (dlrm-kaggle,
    /// dlrm-v2, dlrm-v2-small). It sets the sparse features, tables, dimensions, pooling, caps, embedding
    /// optimizers, wire encodings, interaction and MLP sizes, and the dense optimizer if it has `[dense]`,
    /// in place of the flags for them. Without it the flags describe the model (as dlrm-kaggle).
    #[arg(long)]
    pub model_spec: Option<String>,
    /// Embedding dimension (must equal the bottom MLP's last size).
    #[arg(long, default_value_t = 16)]
    pub emb_dim: usize,
    /// Bottom MLP layer sizes after the 13 dense inputs, comma separated.
    #[arg(long, default_value = "512,256,64,16", value_delimiter = ',')]
    pub bottom_mlp: Vec<usize>,
    /// Top MLP layer sizes after the interaction, comma separated (last must be 1).
    #[arg(long, default_value = "512,256,1", value_delimiter = ',')]
    pub top_mlp: Vec<usize>,
    /// Optimizer of the embedding rows on the servers (sgd, or adagrad: row-wise).
    #[arg(long, value_enum, default_value_t = OptimizerKind::Adagrad)]
    pub optimizer: OptimizerKind,
    /// Optimizer of the dense layers [default: adam with --optimizer adagrad, sgd with --optimizer sgd].
    #[arg(long, value_enum)]
    pub dense_optimizer: Option<DenseKind>,
    /// Learning rate of the dense layers [default: 0.002 for adam, 0.005 for adagrad, 0.1 for sgd].
    #[arg(long)]
    pub lr: Option<f32>,
    /// Learning rate of the embedding rows [default: 0.05 for adagrad, 0.5 for sgd]. Row-wise Adagrad
    /// normalizes each row's step, so it takes a higher rate than the dense layers. The defaults were picked
    /// on the demo data (BENCHMARKS.md).
    #[arg(long)]
    pub emb_lr: Option<f32>,
    /// Half-width of the uniform initializer of embedding rows.
    #[arg(long, default_value_t = 0.05)]
    pub emb_init_scale: f32,
    /// How the servers store embedding weights: f32, bf16 or f16 (the optimizer state stays f32; bf16 and f16
    /// take an optimizer with state, e.g. the default adagrad) [default: f32, or each table's `precision` in
    /// a `--model-spec`, which this flag then replaces].
    #[arg(long)]
    pub row_precision: Option<RowPrecision>,
    /// How the servers store the optimizer's moments: f32 or bf16 (rounded stochastically; `--optimizer adam`
    /// only: row-wise Adagrad keeps one value a row) [default: f32, or each table's `state_precision` in a
    /// `--model-spec`, which this flag then replaces].
    #[arg(long)]
    pub state_precision: Option<RowPrecision>,
    /// Encoding of pulled rows and pushed gradients on the wire: f32, f16, bf16 or int8 (see `--pull-encoding`,
    /// `--push-encoding`, `--table-encoding`).
    #[arg(long, default_value = "f16")]
    pub encoding: Encoding,
    /// Staleness bound: pushes in flight without acknowledgement (0 = synchronous: every push is acknowledged
    /// before the next pull). Default: 2 with one trainer, 0 with several (each trainer's rows already lack
    /// the other trainers' last updates; on the demo data two trainers at 0 are both faster and better than
    /// at 2: BENCHMARKS.md).
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// Train synchronously (staleness bound 0) for the first this many steps of the job, then with
    /// `--max-in-flight`: the first steps take the largest (Adagrad) updates, which stale rows overshoot most.
    /// On the demo data at `--max-in-flight 4` without replay, 100 steps lift the test AUC from 0.7590 to
    /// 0.7722 (k = 0: 0.7783). Default: 100 where rows can lack updates this trainer cannot replay (several
    /// trainers, or `--replay-own-updates false`); 0 for one trainer replaying its own pushes, whose rows lack
    /// none (bit for bit with f32 rows: e2e/tests/resume.rs), so a warm-up would only wait.
    #[arg(long)]
    pub staleness_warmup_steps: Option<u64>,
    /// Lookahead prefetch: send each batch's ids to the servers this many batches before its pull, so
    /// servers whose tables spill to RocksDB (`ps-server --memory-budget-rows`) read the rows back while
    /// earlier batches compute, and pin them until this trainer's push passes (0 = off). Servers without a
    /// budget answer the first prefetch that they need none and are not asked again. Default picked by
    /// measurement (bench/figures/history.md, "Ninth round").
    #[arg(long, default_value_t = 4)]
    pub prefetch_distance: usize,
    /// With pushes in flight (`--max-in-flight` > 0), apply this trainer's own unacknowledged updates to the
    /// rows it pulls, with the tables' optimizers (rows are pulled with their optimizer state): the rows then
    /// lack only other trainers' recent updates (trainer/src/step/replay.rs).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub replay_own_updates: bool,
    /// Arithmetic of the dense layers' matrix products: f32, bf16 (inputs rounded to bf16, f32 sums, on
    /// AMX tiles: about 2x faster steps on Sapphire Rapids; see BENCHMARKS.md for its AUC), or auto (bf16
    /// where the CPU has AMX, else f32).
    #[arg(long, value_enum, default_value_t = DensePrecision::F32)]
    pub dense_precision: DensePrecision,
    /// Seed of the dense parameters and of the embedding initializers.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Malformed input lines skipped before the run fails.
    #[arg(long, default_value_t = 1000)]
    pub max_bad_lines: u64,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 2.0)]
    pub progress_secs: f64,
    /// Samples per evaluation batch.
    #[arg(long, default_value_t = 8192)]
    pub eval_batch_size: usize,
    /// Encoding of pulled rows: f32, f16, bf16 or int8 (int8: one f32 scale per row) [default: --encoding].
    #[arg(long)]
    pub pull_encoding: Option<Encoding>,
    /// Encoding of pushed gradients: f32, f16, bf16 or int8 [default: --encoding]. bf16 and int8 pushes use
    /// error feedback (see `--error-feedback`).
    #[arg(long)]
    pub push_encoding: Option<Encoding>,
    /// Per-table overrides, comma separated: `NAME=ENC` (pull and push) or `NAME=PULL/PUSH`, with NAME a
    /// table name (`C1`..`C26`), e.g. `C3=f32,C7=f16/int8`.
    #[arg(long, value_delimiter = ',')]
    pub table_encoding: Vec<String>,
    /// Keep the quantization residual of each pushed row and add it to the row's next push: `auto` for
    /// bf16 and int8 pushes, `on` (or `true`) for every lossy encoding (f16 too), `off` (or `false`).
    #[arg(long, value_enum, default_value_t = FeedbackMode::Auto)]
    pub error_feedback: FeedbackMode,
    /// Error feedback: drop the residual of a row not pushed for this many batches.
    #[arg(long, default_value_t = 100)]
    pub residual_max_age: u64,
    /// Error feedback: most rows holding a residual (at dim 16 about 85 bytes each); rows beyond it are pushed
    /// without feedback.
    #[arg(long, default_value_t = 4 << 20)]
    pub residual_max_rows: usize,
    /// With dense parameters on the servers: push only this fraction of the dense rows each step, those whose
    /// update (plus what earlier steps left unsent) is largest; the rest waits in a residual for later steps
    /// (top-k sparsification with error feedback). 1 sends every row.
    #[arg(long, default_value_t = 1.0)]
    pub dense_push_fraction: f32,
    /// With several trainers: `hybrid` sums every trainer's dense gradients each step through the servers
    /// before any trainer applies them (synchronous dense, identical dense replicas; embeddings stay
    /// asynchronous under `--max-in-flight`), `async` keeps the dense parameters on the servers, each trainer
    /// pushing its own updates (trainer/src/step/dense_sync.rs). One trainer ignores it.
    #[arg(long, value_enum, default_value_t = DenseMode::Hybrid)]
    pub dense_mode: DenseMode,
    /// Hybrid mode: seconds a step's dense reduce waits for the other trainers before it goes on without the
    /// missing ones (then `--on-missing-trainer` decides). At most 25.
    #[arg(long, default_value_t = 20.0)]
    pub reduce_timeout_secs: f64,
    /// Hybrid mode: what a trainer does when a step's reduce was finalized without some trainer: `fail`
    /// (stop the job, naming the missing ranks) or `continue` (go on with the others' gradients; the missing
    /// trainer is not waited for again until it comes back).
    #[arg(long, value_enum, default_value_t = OnMissing::Fail)]
    pub on_missing_trainer: OnMissing,
    /// Hybrid mode: the job's reduce group, the same for every trainer of the job and different for another
    /// job on the same servers (default: derived from `--seed`, the world size and the batch size; `trainer
    /// demo` draws one per run). A job resumed from a checkpoint mixes the checkpoint's step into it, so the
    /// steps of the run that crashed cannot answer the resumed run's.
    #[arg(long)]
    pub reduce_group: Option<u64>,
    /// Hybrid mode: how the dense gradient sums travel, `bf16` (the default: half the bytes, the servers sum
    /// in f32, master weights stay f32; two pinned trainers 1.73x one against 1.67x with `f32`, at the same
    /// AUC: BENCHMARKS.md) or `f32` (exact sums, for runs that must match one trainer bit for bit).
    #[arg(long, default_value = "bf16")]
    pub reduce_encoding: Encoding,
    /// Hybrid mode: steps a dense gradient may be late, 0 or 1. With 1, step t's reduce travels while step
    /// t+1 pulls and computes (hiding the barrier's round trip and the wait for the slower trainer), and is
    /// applied after step t+1's backward pass; every trainer applies the same sums in the same order, so the
    /// replicas stay identical. 0 applies each step's sum before the next step starts.
    #[arg(long, default_value_t = 0)]
    pub dense_staleness: u32,
    /// Dense learning-rate decay: the optimizer step (of the job, counted from 1) after which the rate falls as
    /// `(1 - t/steps)²` to 0 over `--lr-decay-steps` steps (MLPerf DLRM's schedule). Annealing the last steps
    /// makes the final model an average over many batches: at a constant rate the final model's calibration
    /// is the last batches' label noise. `trainer demo` sets both from `--lr-decay-fraction`.
    #[arg(long, default_value_t = 0)]
    pub lr_decay_start: u64,
    /// Dense learning-rate decay: steps over which the rate falls to 0 (0 = no decay).
    #[arg(long, default_value_t = 0)]
    pub lr_decay_steps: u64,
    /// Before the job's first step, shift the output bias so that the mean prediction on the first batch (of
    /// every trainer) equals its positive rate (a random network starts far from it, and the dense optimizer
    /// needs hundreds of steps to get there: the demo's test predictions ran 14% high without it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub init_output_bias: bool,
}

/// How several trainers combine their dense updates (`--dense-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseMode {
    /// Dense gradients summed over the trainers every step (all-reduce through the servers).
    Hybrid,
    /// Each trainer pushes its own dense updates to the servers, asynchronously.
    Async,
}

/// What a hybrid trainer does when a reduce step misses trainers (`--on-missing-trainer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissing {
    /// Stop with an error naming the missing ranks.
    Fail,
    /// Go on with the trainers that contributed.
    Continue,
}

impl Default for ModelArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            m: ModelArgs,
        }
        Wrapper::parse_from(["x"]).m
    }
}

impl ModelArgs {
    /// Checks the values that clap cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn check(
            ok: bool,
            name: &'static str,
            value: impl ToString,
            expected: &'static str,
        ) -> Result<(), ConfigError> {
            if ok {
                return Ok(());
            }
            let value = value.to_string();
            Err(ConfigError::OutOfRange {
                name,
                value,
                expected,
            })
        }
        let positive =
            |name, v: f32| check(v.is_finite() && v > 0.0, name, v, "a finite number > 0");
        positive("lr", self.dense_lr())?;
        positive("emb-lr", self.emb_lr())?;
        let scale = self.emb_init_scale;
        check(
            scale.is_finite() && scale >= 0.0,
            "emb-init-scale",
            scale,
            "a finite number >= 0",
        )?;
        for (name, v) in [
            ("batch-size", self.batch_size),
            ("eval-batch-size", self.eval_batch_size),
        ] {
            check(v > 0, name, v, "at least 1")?;
        }
        let secs = self.progress_secs;
        check(
            secs.is_finite() && secs > 0.0,
            "progress-secs",
            secs,
            "a finite number > 0",
        )?;
        self.table_codecs(self.dlrm().num_sparse)?;
        self.check_no_model_flags_beside_spec()?;
        let spec = self.spec()?;
        self.check_feedback_dims(&spec)?;
        let f = self.dense_push_fraction;
        check(
            f > 0.0 && f <= 1.0,
            "dense-push-fraction",
            f,
            "a number in (0, 1]",
        )?;
        let e = self.reduce_encoding;
        check(
            matches!(e, Encoding::F32 | Encoding::Bf16),
            "reduce-encoding",
            e,
            "f32 or bf16",
        )?;
        let d = self.dense_staleness;
        check(d <= 1, "dense-staleness", d, "0 or 1")?;
        let t = self.reduce_timeout_secs;
        check(
            (0.001..=25.0).contains(&t),
            "reduce-timeout-secs",
            t,
            "a number of seconds in [0.001, 25]",
        )?;
        let age = self.residual_max_age;
        check(age > 0, "residual-max-age", age, "at least 1")?;
        if self.model_spec.is_none() {
            // (A spec's sizes were checked when it was read, with the spec's field names.)
            self.dlrm().validate()?;
        }
        Ok(())
    }

    /// Error feedback keeps residual rows of one dimension: the tables pushed with feedback must share it.
    fn check_feedback_dims(&self, spec: &crate::model::spec::ModelSpec) -> Result<(), ConfigError> {
        if self.error_feedback == FeedbackMode::Off {
            return Ok(());
        }
        let codecs = spec.codecs(self.no_feedback());
        let mut with = spec.tables.iter().filter(|t| codecs.feedback_for(t.push));
        if let Some(first) = with.next() {
            if let Some(other) = with.find(|t| t.dim != first.dim) {
                return Err(ConfigError::OutOfRange {
                    name: "error-feedback",
                    value: format!(
                        "{:?} (table {} has dim {}, table {} dim {})",
                        self.error_feedback, first.name, first.dim, other.name, other.dim
                    ),
                    expected: "off when tables pushed with a lossy encoding differ in dimension",
                });
            }
        }
        Ok(())
    }

    /// The push encodings sent without error feedback (`--error-feedback auto`: f16).
    pub fn no_feedback(&self) -> Vec<Encoding> {
        if self.error_feedback == FeedbackMode::Auto {
            vec![Encoding::F16]
        } else {
            Vec::new()
        }
    }

    /// The dense model's sizes.
    pub fn dlrm(&self) -> DlrmConfig {
        DlrmConfig {
            emb_dim: self.emb_dim,
            bottom: self.bottom_mlp.clone(),
            top: self.top_mlp.clone(),
            ..DlrmConfig::default()
        }
    }

    /// Which dense optimizer runs.
    pub fn dense_kind(&self) -> DenseKind {
        self.dense_optimizer
            .unwrap_or(self.optimizer.dense_default())
    }

    /// The dense learning rate.
    pub fn dense_lr(&self) -> f32 {
        self.lr.unwrap_or(match self.dense_kind() {
            DenseKind::Adam => 0.002,
            DenseKind::Adagrad => 0.005,
            DenseKind::Sgd => 0.1,
        })
    }

    /// The embedding learning rate.
    pub fn emb_lr(&self) -> f32 {
        self.emb_lr.unwrap_or(self.optimizer.default_lr())
    }

    /// The dense optimizer.
    pub fn dense_optimizer(&self) -> DenseOptimizer {
        let lr = self.dense_lr();
        match self.dense_kind() {
            DenseKind::Sgd => DenseOptimizer::Sgd { lr },
            DenseKind::Adagrad => DenseOptimizer::Adagrad {
                lr,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            DenseKind::Adam => DenseOptimizer::adam(lr),
        }
    }

    /// The embedding tables: one per categorical feature, ids salted by feature.
    pub fn table_configs(&self, num_sparse: usize) -> Vec<TableConfig> {
        let optimizer = self.optimizer.config(self.emb_lr());
        (0..num_sparse)
            .map(|t| TableConfig {
                optimizer,
                init: InitConfig::uniform(self.emb_init_scale),
                seed: self.seed.wrapping_mul(1000).wrapping_add(t as u64),
                precision: self.row_precision.unwrap_or_default(),
                state_precision: self.state_precision.unwrap_or_default(),
                ..TableConfig::new(t as u32, format!("C{}", t + 1), self.emb_dim)
            })
            .collect()
    }

    /// The progress interval.
    pub fn progress_interval(&self) -> Duration {
        Duration::from_secs_f64(self.progress_secs)
    }
}

/// Reads a TOML file of [`ModelArgs`] fields (kebab-case), for `--config`.
pub fn load_model_file(path: &Path) -> Result<ModelArgs, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })
}

mod cluster;
mod derived;

pub use cluster::ClusterArgs;
#[cfg(test)]
mod tests;
