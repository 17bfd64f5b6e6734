//! [`InteractionLayer`]: the interaction a [`Dlrm`](super::Dlrm) runs — the dot [`Interaction`] or the DCNv2
//! [`CrossNet`] — behind one interface for the chunked step (`chunk`).

use super::bf16;
use super::config::{DlrmConfig, InteractionConfig};
use super::cross::{CrossBuffers, CrossNet};
use super::interaction::Interaction;
use super::linear::Linear;
use super::rng::Rng;

/// The interaction between the bottom-MLP output `z` (`[rows x emb_dim]`) and the pooled embeddings
/// (`[rows x emb_width]`), producing the top MLP's input (`[rows x out_dim]`).
#[derive(Debug, Clone)]
pub(crate) enum InteractionLayer {
    /// Pairwise dot products (no parameters; every feature of dimension `emb_dim`).
    Dot(Interaction),
    /// Low-rank cross layers (parameters: per layer `V_l`, `U_l`, `b_l`).
    Cross(CrossNet),
}

impl InteractionLayer {
    /// The interaction `cfg` asks for (a validated config); the cross layers' weights are drawn from `rng`.
    pub(crate) fn new(cfg: &DlrmConfig, rng: &mut Rng) -> Self {
        match cfg.interaction {
            InteractionConfig::Dot => Self::Dot(Interaction::new(cfg.num_sparse, cfg.emb_dim)),
            InteractionConfig::Dcn { layers, rank } => Self::Cross(CrossNet::init(
                cfg.emb_dim,
                cfg.emb_width(),
                rank,
                layers,
                rng,
            )),
        }
    }

    /// Width of the output per sample.
    pub(crate) fn out_dim(&self) -> usize {
        match self {
            Self::Dot(dot) => dot.out_dim(),
            Self::Cross(cross) => cross.dim(),
        }
    }

    /// The layers holding parameters (none for dot), in parameter order.
    pub(crate) fn layers(&self) -> &[Linear] {
        match self {
            Self::Dot(_) => &[],
            Self::Cross(cross) => cross.layers(),
        }
    }

    /// The layers holding parameters, writable.
    pub(crate) fn layers_mut(&mut self) -> &mut [Linear] {
        match self {
            Self::Dot(_) => &mut [],
            Self::Cross(cross) => cross.layers_mut(),
        }
    }

    /// Room the parameters' gradients take in a chunk's flat gradients.
    pub(crate) fn grads_len(&self) -> usize {
        match self {
            Self::Dot(_) => 0,
            Self::Cross(cross) => cross.grads_len(),
        }
    }

    /// Forward over one chunk of `rows` samples into `out` (`[rows x out_dim]`), keeping what the backward
    /// needs in `bufs`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_chunk(
        &self,
        parallel: bool,
        rows: usize,
        z: &[f32],
        emb: &[f32],
        out: &mut [f32],
        bufs: &mut CrossBuffers,
        scratch: &mut bf16::Scratch,
    ) {
        match self {
            Self::Dot(dot) => dot.forward_on(parallel, rows, z, emb, out),
            Self::Cross(cross) => cross.forward_chunk(parallel, rows, z, emb, out, bufs, scratch),
        }
    }

    /// Backward over the chunk of the last [`forward_chunk`](Self::forward_chunk): from `dout` (`d loss /
    /// d out`, may be overwritten) writes `dz`, `demb` and the parameters' gradients (`grads`,
    /// [`grads_len`](Self::grads_len) long).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_chunk(
        &self,
        parallel: bool,
        rows: usize,
        z: &[f32],
        emb: &[f32],
        dout: &mut [f32],
        dz: &mut [f32],
        demb: &mut [f32],
        grads: &mut [f32],
        bufs: &mut CrossBuffers,
        scratch: &mut bf16::Scratch,
    ) {
        match self {
            Self::Dot(dot) => dot.backward_on(parallel, rows, z, emb, dout, dz, demb),
            Self::Cross(cross) => {
                cross.backward_chunk(parallel, rows, dout, dz, demb, grads, bufs, scratch)
            }
        }
    }
}
