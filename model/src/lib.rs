//! The model crate: the DLRM dense model on CPU (bottom MLP, interaction — pairwise dot products or DCNv2
//! cross layers —, top MLP, sigmoid + binary cross-entropy, and the dense optimizers; forward and exact
//! backward), the model spec format and its validation ([`spec`]), exact AUC and logloss ([`eval`]) and the
//! export format ([`export`]). The trainer and serving both build on it; it knows nothing of networks,
//! servers or command lines (DESIGN.md, "Crates"). The batch plan that gathers rows into the model's input is
//! `protocol::plan`.
//!
//! What it is not: it does not own embedding tables. The caller gathers and pools the rows a batch needs
//! into `[batch x emb_width]` (per sample, feature after feature, each of its own dimension;
//! [`DlrmConfig::emb_offset`]), and gets back `d loss / d rows` in the same layout to sum per
//! unique id and push to the parameter servers (DESIGN.md, "One training step", step 4).
//!
//! # Layout
//! - [`spec`]: [`spec::ModelSpec`], a model as a TOML file (docs/model-spec.md), checked field by field; the
//!   shipped specs (`model/specs/`).
//! - [`export`]: the export format: [`export::ExportManifest`], [`export::Export::open`], and
//!   [`export::Staging`], the file half of writing a version.
//! - [`eval`]: exact ROC AUC, logloss, and the streaming [`eval::Evaluator`].
//! - [`files`]: crash-safe file replacement, shared by exports and the trainer's checkpoints.
//! - [`config`]: [`DlrmConfig`], the sizes, and its validation and FLOP count.
//! - [`dlrm`]: [`Dlrm`], the whole model: `predict` and `train_step`.
//! - `chunk`: the data-parallel step, one chunk of rows per task through the whole network.
//! - [`mlp`]: [`Mlp`], a stack of [`Linear`] layers with their activation buffers.
//! - [`linear`]: [`Linear`], one fully connected layer with fused bias + ReLU.
//! - [`interaction`]: [`Interaction`], DLRM's pairwise dot interaction.
//! - [`cross`]: [`CrossNet`], DCNv2's low-rank cross layers (the `dcn` interaction).
//! - `interaction_layer`: one or the other, behind one interface for the chunked step.
//! - [`loss`]: numerically stable sigmoid + binary cross-entropy on logits.
//! - [`optim`]: [`DenseOptimizer`] (SGD, Adagrad, Adam) and its state.
//! - `bf16`: bf16 matrix products ([`Precision::Bf16`]) on AMX tiles or with AVX512-BF16 ([`Bf16Kernel`]);
//!   `aligned`: cache-line aligned buffers. Run-time SIMD dispatch (`multiversion!`) is the `base` crate's.
//!
//! # Design decisions
//! - In f32 every matrix product goes through the `gemm` crate (runtime AVX-512 dispatch), row-major, via one
//!   wrapper (`matmul`). In bf16 ([`Dlrm::set_precision`]) the products of layers with 16 or more outputs run
//!   on AMX tiles, or AVX512-BF16 where there is no AMX, instead (`bf16`): each step packs the weights once,
//!   each product packs its activations.
//! - `Dlrm` cuts the batch into chunks of rows that run in parallel on the *current* rayon pool, each through the whole network on one thread (`chunk`); the chunks' gradients are summed
//!   in a fixed order, so results do not depend on the pool. The optimizer loops are split over the pool
//!   too: run `train_step` inside `ThreadPool::install` to bound the threads.
//! - No allocation per step: activation and gradient buffers live in the structs and only grow when a
//!   bigger batch arrives.
//! - Weights are stored like PyTorch's `nn.Linear`: `[out x in]` row-major, then the bias `[out]`.

#![warn(missing_docs)]

mod aligned;
mod bf16;
mod chunk;
pub mod config;
pub mod cross;
pub mod dlrm;
pub mod eval;
pub mod export;
pub mod files;
pub mod interaction;
mod interaction_layer;
pub mod linear;
pub mod loss;
mod matmul;
pub mod mlp;
pub mod optim;
mod rng;
pub mod spec;

pub use bf16::{Kernel as Bf16Kernel, DISABLE_BF16_ENV, DISABLE_ENV as AMX_DISABLE_ENV};
pub use config::{DlrmConfig, InteractionConfig};
pub use cross::CrossNet;
pub use dlrm::{Dlrm, StepTiming};
pub use interaction::Interaction;
pub use linear::Linear;
pub use mlp::Mlp;
pub use optim::{DenseOptimizer, OptimizerState};

/// Errors of the dense model: bad arguments and bad configurations. Numbers never make it fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A slice argument has the wrong length for the batch size and configuration.
    #[error("{arg}: length {len}, expected {expected}")]
    Length {
        /// The argument's name, e.g. `"dense"`.
        arg: &'static str,
        /// Its length.
        len: usize,
        /// The length the batch size and configuration require.
        expected: usize,
    },
    /// A parameter tensor handed to [`Dlrm::set_params`] has the wrong length.
    #[error("params[{tensor}]: length {len}, expected {expected}")]
    ParamLength {
        /// Index of the tensor in [`Dlrm::params`] order.
        tensor: usize,
        /// Its length.
        len: usize,
        /// The model's tensor length.
        expected: usize,
    },
    /// A configuration field is out of range.
    #[error("invalid config: {field}: {reason}")]
    Config {
        /// The field's name, e.g. `"bottom"`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `train_step` was called with zero samples; the mean loss is undefined.
    #[error("empty batch: train_step needs at least one sample")]
    EmptyBatch,
    /// bf16 products were asked for on a machine without AMX-BF16 or AVX512-BF16.
    #[error(
        "dense precision bf16 needs AMX-BF16 tiles (Intel Xeon Sapphire Rapids or later, Linux 5.16+) or \
         AVX512-BF16 (AMD Zen 4 or later, Intel Cooper Lake); this machine has neither (or TRAINER_DISABLE_BF16 \
         is set): use f32 or auto"
    )]
    Bf16Unavailable,
}

/// Arithmetic of the dense layers' matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 everywhere (the `gemm` crate's kernels).
    #[default]
    F32,
    /// Mixed precision: the products' inputs (activations, their gradients, and the weights) are rounded
    /// to bf16 and multiplied on AMX tiles with f32 accumulation; the master weights, optimizer, bias,
    /// ReLU, the dot interaction, the cross layers' element-wise products and the loss stay f32 (`bf16`). The
    /// cross layers' `U` and `V` products run in bf16 like the MLPs'.
    Bf16,
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        })
    }
}

/// Whether this machine can run [`Precision::Bf16`]: AMX-BF16 tiles or AVX512-BF16, and
/// [`DISABLE_BF16_ENV`] unset.
pub fn bf16_available() -> bool {
    bf16::available()
}

/// Whether [`Precision::Bf16`] is expected to run faster than f32 here (what `--dense-precision auto` picks):
/// on AMX tiles, and on AVX512-BF16 except on Intel CPUs. Measured: AVX512-BF16 made the default demo 1.54x
/// faster than f32 on AMD Zen 4, and 1.6x slower on an Intel Xeon (Sapphire Rapids class) whose VM exposes
/// no AMX (55k against 87k samples/s): there `vdpbf16ps` gains nothing over two f32 FMA ports and its
/// operands must be packed.
pub fn bf16_preferred() -> bool {
    match bf16::kernel() {
        Some(Bf16Kernel::Amx) => true,
        Some(Bf16Kernel::Avx512Bf16) => !bf16::intel(),
        None => false,
    }
}

/// The kernel [`Precision::Bf16`] runs on here, if any ([`DISABLE_ENV`](AMX_DISABLE_ENV) turns AMX off,
/// [`DISABLE_BF16_ENV`] both).
pub fn bf16_kernel() -> Option<Bf16Kernel> {
    bf16::kernel()
}

/// Returns [`ModelError::Length`] unless `len == expected`.
pub(crate) fn check_len(arg: &'static str, len: usize, expected: usize) -> Result<(), ModelError> {
    if len == expected {
        Ok(())
    } else {
        Err(ModelError::Length { arg, len, expected })
    }
}

/// Grows `buf` to at least `len` elements (never shrinks, so steady-state steps do not allocate).
pub(crate) fn ensure_len(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod perf;
