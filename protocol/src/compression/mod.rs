//! Lossy and lossless coding of what rows carry: row encodings ([`codec`]: f32, f16, bf16, int8 with a
//! per-row scale) and top-k sparsification ([`topk`]). The error-feedback state that makes lossy pushes
//! unbiased ([`feedback`]) belongs to the sender (the trainer's plan), not to the wire: it lives here beside
//! the codecs it wraps, and no server uses it.

pub mod codec;
pub mod feedback;
pub mod topk;
