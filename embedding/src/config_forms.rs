//! The two serde forms of a config's enums, [`OptimizerConfig`] and [`InitKind`].
//!
//! People and stores read JSON and TOML, where the enums are internally tagged: `{"type": "sgd", "lr": 0.1}`
//! (table config files, configs persisted in the store's metadata). bincode, the wire's format, cannot read
//! internally tagged enums (they need `deserialize_any`), so in a format that is not human-readable the enums
//! are externally tagged, which bincode writes as the variant's position followed by its fields: new variants
//! go last. Each impl picks its form by `is_human_readable()`, which bincode answers `false` and JSON and TOML
//! `true`.
//!
//! The mirrors below repeat the variants for serde's `remote` derive, which checks at compile time that they
//! match the public enums field for field.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{InitKind, OptimizerConfig};

/// [`OptimizerConfig`] in JSON and TOML.
#[derive(Serialize, Deserialize)]
#[serde(
    remote = "OptimizerConfig",
    tag = "type",
    rename_all = "snake_case",
    deny_unknown_fields
)]
enum TaggedOptimizer {
    Sgd {
        lr: f32,
    },
    RowAdagrad {
        lr: f32,
        eps: f32,
        initial_accumulator: f32,
    },
    Adagrad {
        lr: f32,
        eps: f32,
        initial_accumulator: f32,
    },
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
    },
    Ftrl {
        alpha: f32,
        beta: f32,
        l1: f32,
        l2: f32,
    },
}

/// [`OptimizerConfig`] in bincode: variants by position, so new ones go last.
#[derive(Serialize, Deserialize)]
#[serde(remote = "OptimizerConfig")]
enum PositionalOptimizer {
    Sgd {
        lr: f32,
    },
    RowAdagrad {
        lr: f32,
        eps: f32,
        initial_accumulator: f32,
    },
    Adagrad {
        lr: f32,
        eps: f32,
        initial_accumulator: f32,
    },
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
    },
    Ftrl {
        alpha: f32,
        beta: f32,
        l1: f32,
        l2: f32,
    },
}

/// [`InitKind`] in JSON and TOML.
#[derive(Serialize, Deserialize)]
#[serde(
    remote = "InitKind",
    tag = "type",
    rename_all = "snake_case",
    deny_unknown_fields
)]
enum TaggedInit {
    Uniform { scale: f32 },
    Normal { std: f32 },
}

/// [`InitKind`] in bincode: variants by position, so new ones go last.
#[derive(Serialize, Deserialize)]
#[serde(remote = "InitKind")]
enum PositionalInit {
    Uniform { scale: f32 },
    Normal { std: f32 },
}

/// Implements `Serialize` and `Deserialize` of `$ty` through `$tagged` for human-readable formats and
/// `$positional` for the others.
macro_rules! two_forms {
    ($ty:ty, $tagged:ident, $positional:ident) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                if serializer.is_human_readable() {
                    $tagged::serialize(self, serializer)
                } else {
                    $positional::serialize(self, serializer)
                }
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                if deserializer.is_human_readable() {
                    $tagged::deserialize(deserializer)
                } else {
                    $positional::deserialize(deserializer)
                }
            }
        }
    };
}

two_forms!(OptimizerConfig, TaggedOptimizer, PositionalOptimizer);
two_forms!(InitKind, TaggedInit, PositionalInit);
