//! Lossy and lossless coding of what rows carry: row encodings ([`codec`]: f32, f16, bf16, int8 with a
//! per-row scale) and top-k sparsification ([`topk`]). The error-feedback state that makes lossy pushes
//! unbiased belongs to the sender (the trainer), not to the wire.

pub mod codec;
pub mod topk;
