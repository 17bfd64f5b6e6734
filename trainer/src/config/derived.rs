//! What the trainer derives from its [`ModelArgs`]: the model spec, the staleness bound, the per-table wire
//! encodings and the error-feedback store.

use super::{ConfigError, FeedbackMode, ModelArgs};
use crate::model::config::InteractionConfig;
use crate::model::spec::{Feature, ModelSpec, Pooling, Table, COLUMNS};
use protocol::Encoding;

impl ModelArgs {
    /// The model: `--model-spec`, or the spec the flags describe.
    pub fn spec(&self) -> Result<ModelSpec, ConfigError> {
        let mut spec = match &self.model_spec {
            Some(name) => ModelSpec::load(name).map_err(|source| ConfigError::Spec {
                spec: name.clone(),
                source: Box::new(source),
            })?,
            None => self.flag_spec()?,
        };
        if let Some(p) = self.row_precision {
            spec.set_precision(p).map_err(|source| ConfigError::Spec {
                spec: self.model_spec.clone().unwrap_or_else(|| "flags".into()),
                source: Box::new(source),
            })?;
        }
        if let Some(p) = self.state_precision {
            spec.set_state_precision(p)
                .map_err(|source| ConfigError::Spec {
                    spec: self.model_spec.clone().unwrap_or_else(|| "flags".into()),
                    source: Box::new(source),
                })?;
        }
        let scored = spec.tables.iter().find(|t| {
            t.eviction
                .is_some_and(|e| e.policy == embedding::EvictionPolicy::Score)
        });
        if let Some(t) = scored {
            return Err(ConfigError::ScoredTable {
                table: t.name.clone(),
            });
        }
        Ok(spec)
    }

    /// The spec the model flags describe: 26 one-hot features, feature `j` reading table `C(j+1)` of
    /// dimension `--emb-dim`, dot interaction, `--optimizer`/`--emb-lr`, the encoding flags.
    pub fn flag_spec(&self) -> Result<ModelSpec, ConfigError> {
        let codecs = self.table_codecs(COLUMNS)?;
        let tables = (0..COLUMNS)
            .map(|t| Table {
                name: format!("C{}", t + 1),
                dim: self.emb_dim,
                hash_size: 0,
                optimizer: self.optimizer,
                lr: self.emb_lr(),
                pull: codecs.pull_of(t),
                push: codecs.push_of(t),
                ids: Default::default(),
                precision: Default::default(),
                state_precision: Default::default(),
                eviction: None,
            })
            .collect();
        let features = (0..COLUMNS)
            .map(|t| Feature {
                column: t,
                table: t,
                pooling: Pooling::Sum,
                tokens: 1,
            })
            .collect();
        Ok(ModelSpec {
            name: "flags".into(),
            bottom: self.bottom_mlp.clone(),
            top: self.top_mlp.clone(),
            interaction: InteractionConfig::Dot,
            dense: None,
            features,
            tables,
        })
    }

    /// These flags with the spec's settings where it has them: the MLP sizes, the embedding dimension (the
    /// bottom MLP's last size) and, if the spec has `[dense]`, the dense optimizer and its rate.
    pub fn with_spec(&self, spec: &ModelSpec) -> ModelArgs {
        let mut args = self.clone();
        args.bottom_mlp = spec.bottom.clone();
        args.top_mlp = spec.top.clone();
        args.emb_dim = spec.bottom.last().copied().unwrap_or(args.emb_dim);
        if let Some((kind, lr)) = spec.dense {
            args.dense_optimizer = Some(kind);
            args.lr = lr;
        }
        args
    }

    /// With `--model-spec`, the flags the spec replaces must keep their defaults: a `--emb-dim 32` beside a
    /// spec would otherwise be ignored without a word.
    pub(super) fn check_no_model_flags_beside_spec(&self) -> Result<(), ConfigError> {
        let Some(spec) = &self.model_spec else {
            return Ok(());
        };
        let d = ModelArgs::default();
        let set = [
            ("emb-dim", self.emb_dim != d.emb_dim),
            ("bottom-mlp", self.bottom_mlp != d.bottom_mlp),
            ("top-mlp", self.top_mlp != d.top_mlp),
            ("optimizer", self.optimizer != d.optimizer),
            ("emb-lr", self.emb_lr.is_some()),
            ("encoding", self.encoding != d.encoding),
            ("pull-encoding", self.pull_encoding.is_some()),
            ("push-encoding", self.push_encoding.is_some()),
            ("table-encoding", !self.table_encoding.is_empty()),
        ];
        match set.iter().find(|(_, changed)| *changed) {
            None => Ok(()),
            Some((flag, _)) => Err(ConfigError::OutOfRange {
                name: "model-spec",
                value: format!("{spec:?} with --{flag}"),
                expected:
                    "the spec alone: it sets the tables, dimensions, optimizers and encodings \
                           (edit the spec instead of the flag)",
            }),
        }
    }

    /// The staleness bound for a job of `world` trainers: `--max-in-flight`, or its default (2 alone, 0 with
    /// several trainers).
    pub fn staleness_bound(&self, world: usize) -> usize {
        self.max_in_flight.unwrap_or(if world > 1 { 0 } else { 2 })
    }

    /// The synchronous warm-up of a job of `world` trainers: `--staleness-warmup-steps`, or its default (100
    /// where the rows can lack updates the trainer cannot replay, 0 for one trainer replaying its own).
    pub fn staleness_warmup(&self, world: usize) -> u64 {
        self.staleness_warmup_steps
            .unwrap_or(if world > 1 || !self.replay_own_updates {
                100
            } else {
                0
            })
    }

    /// Per-table pull and push encodings for `num_sparse` tables named `C1..`: `--pull-encoding` and
    /// `--push-encoding` (both defaulting to `--encoding`), then the `--table-encoding` overrides.
    pub fn table_codecs(
        &self,
        num_sparse: usize,
    ) -> Result<protocol::plan::TableCodecs, ConfigError> {
        let mut codecs = protocol::plan::TableCodecs::uniform(
            num_sparse,
            self.pull_encoding.unwrap_or(self.encoding),
            self.push_encoding.unwrap_or(self.encoding),
        );
        for entry in self.table_encoding.iter().filter(|e| !e.trim().is_empty()) {
            let bad = |problem: String| ConfigError::TableEncoding {
                entry: entry.clone(),
                problem,
            };
            let (name, value) = entry
                .split_once('=')
                .ok_or_else(|| bad("expected NAME=ENC or NAME=PULL/PUSH".into()))?;
            let name = name.trim();
            let t = name
                .strip_prefix('C')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| (1..=num_sparse).contains(&n))
                .ok_or_else(|| {
                    bad(format!(
                        "unknown table {name:?}, expected C1..C{num_sparse}"
                    ))
                })?
                - 1;
            let parse = |v: &str| v.trim().parse::<Encoding>().map_err(|e| bad(e.to_string()));
            let (pull, push) = match value.split_once('/') {
                Some((a, b)) => (parse(a)?, parse(b)?),
                None => (parse(value)?, parse(value)?),
            };
            codecs.pull[t] = pull;
            codecs.push[t] = push;
        }
        codecs.no_feedback = self.no_feedback();
        Ok(codecs)
    }

    /// The error-feedback store the trainer keeps for lossy pushes, if any table pushes lossily and feedback
    /// is on.
    pub fn residual_store(
        &self,
        codecs: &protocol::plan::TableCodecs,
    ) -> Option<protocol::compression::feedback::ResidualStore> {
        self.residual_store_of_dim(codecs, self.emb_dim)
    }

    /// [`residual_store`](Self::residual_store) for rows of `dim` elements.
    pub fn residual_store_of_dim(
        &self,
        codecs: &protocol::plan::TableCodecs,
        dim: usize,
    ) -> Option<protocol::compression::feedback::ResidualStore> {
        let used = codecs.push.iter().any(|&e| codecs.feedback_for(e));
        (self.error_feedback != FeedbackMode::Off && used).then(|| {
            protocol::compression::feedback::ResidualStore::new(
                dim,
                protocol::compression::feedback::FeedbackConfig {
                    max_age_steps: self.residual_max_age,
                    max_rows: self.residual_max_rows,
                },
            )
        })
    }
}
