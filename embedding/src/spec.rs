//! Table specs: the plain description of a table that travels in `RegisterTables` and `Hello` (its id, name,
//! dimension, optimizer, initializer and seed), and its conversion to and from [`TableConfig`].
//!
//! The types live here, beside the tables they describe, so that the wire crate (`protocol`, which re-exports
//! them) and everything above it share one definition without `protocol` knowing storage internals, and so
//! that a trainer replaying its own pushes builds the same optimizer as the server from the same spec
//! ([`table_config`]), with no server code linked. Their serde form is the wire form: bincode numbers enum
//! variants by position, so new variants go last.

use serde::{Deserialize, Serialize};

use crate::config::{InitConfig, InitKind, OptimizerConfig, TableConfig};

/// The server-side optimizer of a table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum OptimizerSpec {
    /// `w -= lr * g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// Row-wise Adagrad: one accumulator per row, `acc += mean(g^2)`, `w -= lr * g / (sqrt(acc) + eps)`.
    RowAdagrad {
        /// Learning rate.
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
        /// Accumulator of a new row.
        initial_accumulator: f32,
    },
    // Variants below were added after the first release; bincode numbers variants by position, so new ones go
    // last. `weight_decay` (L2, `g += weight_decay * w`, 0 = off) and `clip_norm` (scale the row gradient to
    // L2 norm <= clip_norm before decay, 0 = off) mean the same in every variant.
    /// Adam with a per-row step count (bias correction uses each row's own step).
    Adam {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment, in `[0, 1)`.
        beta1: f32,
        /// Decay of the second moment, in `[0, 1)`.
        beta2: f32,
        /// Added to the root of the bias-corrected second moment.
        eps: f32,
        /// L2 weight decay added to the gradient; 0 is off.
        weight_decay: f32,
        /// Largest L2 norm of a gradient row; 0 is off.
        clip_norm: f32,
    },
    /// FTRL-Proximal (McMahan et al. 2013), per coordinate.
    Ftrl {
        /// Learning rate `alpha`.
        alpha: f32,
        /// Learning-rate offset `beta`.
        beta: f32,
        /// L1 strength.
        l1: f32,
        /// L2 strength (of the FTRL objective, separate from `weight_decay`).
        l2: f32,
        /// L2 weight decay added to the gradient; 0 is off.
        weight_decay: f32,
        /// Largest L2 norm of a gradient row; 0 is off.
        clip_norm: f32,
    },
    /// [`OptimizerSpec::Sgd`] with weight decay and/or gradient clipping.
    SgdRegularized {
        /// Learning rate.
        lr: f32,
        /// L2 weight decay added to the gradient; 0 is off.
        weight_decay: f32,
        /// Largest L2 norm of a gradient row; 0 is off.
        clip_norm: f32,
    },
    /// [`OptimizerSpec::RowAdagrad`] with weight decay and/or gradient clipping.
    RowAdagradRegularized {
        /// Learning rate.
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
        /// Accumulator of a new row.
        initial_accumulator: f32,
        /// L2 weight decay added to the gradient; 0 is off.
        weight_decay: f32,
        /// Largest L2 norm of a gradient row; 0 is off.
        clip_norm: f32,
    },
}

/// How a new row is initialized (deterministically from the table seed and the id).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum InitSpec {
    /// Uniform in `[-scale, scale]`.
    Uniform {
        /// Half-width.
        scale: f32,
    },
    /// Normal with mean 0.
    Normal {
        /// Standard deviation.
        std: f32,
    },
}

/// Everything a server needs to create a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    /// Table id (the trainer uses the categorical feature index).
    pub id: u32,
    /// Human-readable name, e.g. `C5`.
    pub name: String,
    /// Row dimension.
    pub dim: u32,
    /// Server-side optimizer.
    pub optimizer: OptimizerSpec,
    /// Row initializer.
    pub init: InitSpec,
    /// Initializer seed.
    pub seed: u64,
}

impl TableSpec {
    /// A table whose rows count what was pushed to them: named `C<id>`, SGD with learning rate 1, every row
    /// starting at zero (seed 1, which zero rows do not use). A push subtracts its gradients exactly (sums of
    /// small integers are exact in f32), so tests, audits and dense-delta tables can read back what was
    /// applied. Other settings by struct update: `TableSpec { optimizer, ..TableSpec::counter(id, dim) }`.
    pub fn counter(id: u32, dim: u32) -> TableSpec {
        TableSpec {
            id,
            name: format!("C{id}"),
            dim,
            optimizer: OptimizerSpec::Sgd { lr: 1.0 },
            init: InitSpec::Uniform { scale: 0.0 },
            seed: 1,
        }
    }
}

/// Converts a wire table spec into the storage engine's config. Admission and TTL are not on the wire yet:
/// tables registered over the wire have neither.
pub fn table_config(spec: &TableSpec) -> TableConfig {
    let (optimizer, weight_decay, clip_norm) = match spec.optimizer {
        OptimizerSpec::Sgd { lr } => (OptimizerConfig::Sgd { lr }, 0.0, 0.0),
        OptimizerSpec::SgdRegularized {
            lr,
            weight_decay,
            clip_norm,
        } => (OptimizerConfig::Sgd { lr }, weight_decay, clip_norm),
        OptimizerSpec::RowAdagrad {
            lr,
            eps,
            initial_accumulator,
        } => (
            OptimizerConfig::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            },
            0.0,
            0.0,
        ),
        OptimizerSpec::RowAdagradRegularized {
            lr,
            eps,
            initial_accumulator,
            weight_decay,
            clip_norm,
        } => (
            OptimizerConfig::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            },
            weight_decay,
            clip_norm,
        ),
        OptimizerSpec::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            clip_norm,
        } => (
            OptimizerConfig::Adam {
                lr,
                beta1,
                beta2,
                eps,
            },
            weight_decay,
            clip_norm,
        ),
        OptimizerSpec::Ftrl {
            alpha,
            beta,
            l1,
            l2,
            weight_decay,
            clip_norm,
        } => (
            OptimizerConfig::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            },
            weight_decay,
            clip_norm,
        ),
    };
    TableConfig {
        optimizer,
        init: match spec.init {
            InitSpec::Uniform { scale } => InitConfig::uniform(scale),
            InitSpec::Normal { std } => InitConfig::normal(std),
        },
        seed: spec.seed,
        weight_decay,
        clip_norm,
        ..TableConfig::new(spec.id, spec.name.clone(), spec.dim as usize)
    }
}

/// Converts the engine's config back into a wire spec: `None` for configs the wire cannot describe
/// (element-wise Adagrad, admission, TTL). SGD and row-wise Adagrad without weight decay and clipping use their
/// original variants, so older clients still read them.
pub fn table_spec(cfg: &TableConfig) -> Option<TableSpec> {
    if cfg.admission.is_some() || cfg.ttl_secs.is_some() {
        return None;
    }
    let (weight_decay, clip_norm) = (cfg.weight_decay, cfg.clip_norm);
    let plain = weight_decay == 0.0 && clip_norm == 0.0;
    Some(TableSpec {
        id: cfg.id,
        name: cfg.name.clone(),
        dim: cfg.dim as u32,
        optimizer: match cfg.optimizer {
            OptimizerConfig::Sgd { lr } if plain => OptimizerSpec::Sgd { lr },
            OptimizerConfig::Sgd { lr } => OptimizerSpec::SgdRegularized {
                lr,
                weight_decay,
                clip_norm,
            },
            OptimizerConfig::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            } if plain => OptimizerSpec::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            },
            OptimizerConfig::RowAdagrad {
                lr,
                eps,
                initial_accumulator,
            } => OptimizerSpec::RowAdagradRegularized {
                lr,
                eps,
                initial_accumulator,
                weight_decay,
                clip_norm,
            },
            OptimizerConfig::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                clip_norm,
            },
            OptimizerConfig::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => OptimizerSpec::Ftrl {
                alpha,
                beta,
                l1,
                l2,
                weight_decay,
                clip_norm,
            },
            OptimizerConfig::Adagrad { .. } => return None,
        },
        init: match cfg.init.kind {
            InitKind::Uniform { scale } => InitSpec::Uniform { scale },
            InitKind::Normal { std } => InitSpec::Normal { std },
        },
        seed: cfg.seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_table_subtracts_pushes_exactly() {
        let cfg = table_config(&TableSpec::counter(4, 2));
        cfg.validate().unwrap();
        assert_eq!((cfg.id, cfg.name.as_str(), cfg.dim), (4, "C4", 2));
        let mut row = [1f32; 2];
        crate::init::fill_row(&cfg, 99, &mut row);
        assert_eq!(row, [0.0; 2]);
    }

    #[test]
    fn spec_config_round_trip() {
        let s = TableSpec {
            optimizer: OptimizerSpec::RowAdagrad {
                lr: 0.1,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            init: InitSpec::Normal { std: 0.5 },
            ..TableSpec::counter(3, 16)
        };
        assert_eq!(table_spec(&table_config(&s)), Some(s));
    }

    #[test]
    fn spec_config_round_trip_of_every_optimizer() {
        let specs = [
            OptimizerSpec::Sgd { lr: 0.5 },
            OptimizerSpec::SgdRegularized {
                lr: 0.5,
                weight_decay: 1e-4,
                clip_norm: 0.0,
            },
            OptimizerSpec::RowAdagradRegularized {
                lr: 0.1,
                eps: 1e-8,
                initial_accumulator: 0.0,
                weight_decay: 0.0,
                clip_norm: 10.0,
            },
            OptimizerSpec::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                clip_norm: 1.0,
            },
            OptimizerSpec::Ftrl {
                alpha: 0.05,
                beta: 1.0,
                l1: 0.1,
                l2: 0.01,
                weight_decay: 0.0,
                clip_norm: 0.0,
            },
        ];
        for optimizer in specs {
            let s = TableSpec {
                optimizer,
                ..TableSpec::counter(3, 16)
            };
            let cfg = table_config(&s);
            cfg.validate().unwrap();
            assert_eq!(table_spec(&cfg), Some(s), "{optimizer:?}");
        }
    }

    #[test]
    fn spec_config_carries_weight_decay_and_clipping() {
        let s = TableSpec {
            optimizer: OptimizerSpec::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                clip_norm: 2.0,
            },
            ..TableSpec::counter(3, 16)
        };
        let cfg = table_config(&s);
        assert_eq!((cfg.weight_decay, cfg.clip_norm), (0.01, 2.0));
        assert_eq!(cfg.state_len(), 33);
        // SGD and row-wise Adagrad without regularization keep their original wire variants.
        let mut cfg = table_config(&TableSpec::counter(3, 16));
        assert!(matches!(
            table_spec(&cfg).unwrap().optimizer,
            OptimizerSpec::Sgd { .. }
        ));
        cfg.clip_norm = 1.0;
        assert!(matches!(
            table_spec(&cfg).unwrap().optimizer,
            OptimizerSpec::SgdRegularized { clip_norm, .. } if clip_norm == 1.0
        ));
        // Configs the wire cannot describe are left out.
        cfg.ttl_secs = Some(60);
        assert_eq!(table_spec(&cfg), None);
    }
}
