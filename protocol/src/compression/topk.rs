//! Top-k sparsification with error feedback for dense gradients, sans-IO.
//!
//! Each step a [`TopK`] adds its residual to the new gradient, sends the `k` entries of largest magnitude, and
//! keeps everything else (plus the quantization error of the values sent) as the residual for the next step.
//! Nothing is lost: the sum of what was sent plus the residual equals the sum of the gradients (Stich et al.
//! 2018, "Sparsified SGD with memory"; Lin et al. 2018, "Deep gradient compression").
//!
//! Wire chunk ([`TopK::compress`], read back by [`decode_chunk`]): a varint `n` (entries sent), then the `n`
//! indices ascending as an id section ([`crate::wire::ids::put_values`]), then the `n` values as one row of
//! [`Encoding`] `enc` (for int8: one scale for the chunk).

use crate::compression::codec::{decode_rows, encode_rows, Encoding};
use crate::error::ProtocolError;
use crate::wire::ids::{get_values, put_values, put_varint};

/// A top-k compressor for one dense gradient vector of fixed length. Call [`TopK::compress`] once per step.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    residual: Vec<f32>,
    order: Vec<u32>,
    picked: Vec<u64>,
    values: Vec<f32>,
    decoded: Vec<f32>,
}

impl TopK {
    /// A compressor of vectors of `len` elements sending `k` of them per step (`k` is capped at `len`).
    pub fn new(len: usize, k: usize) -> TopK {
        TopK {
            k: k.min(len),
            residual: vec![0.0; len],
            order: Vec::with_capacity(len),
            picked: Vec::with_capacity(k.min(len)),
            values: Vec::with_capacity(k.min(len)),
            decoded: Vec::with_capacity(k.min(len)),
        }
    }

    /// Entries sent per step.
    pub fn k(&self) -> usize {
        self.k
    }

    /// What has not been sent yet.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Adds `grad` to the residual, appends a chunk with the `k` largest-magnitude entries to `out` (values
    /// encoded as `enc`), and keeps the rest, and the values' encoding error, as the residual.
    ///
    /// # Panics
    /// If `grad.len()` differs from the length given to [`TopK::new`] (a programming error).
    pub fn compress(&mut self, grad: &[f32], enc: Encoding, out: &mut Vec<u8>) {
        assert_eq!(grad.len(), self.residual.len(), "gradient length");
        for (r, g) in self.residual.iter_mut().zip(grad) {
            *r += g;
        }
        let k = self.k;
        self.order.clear();
        self.order.extend(0..self.residual.len() as u32);
        if k > 0 && k < self.order.len() {
            let r = &self.residual;
            // Largest magnitude first; NaN sorts as largest so it is sent (and refused) rather than kept.
            self.order.select_nth_unstable_by(k - 1, |&a, &b| {
                r[b as usize].abs().total_cmp(&r[a as usize].abs())
            });
        }
        self.picked.clear();
        self.picked
            .extend(self.order[..k].iter().map(|&i| i as u64));
        self.picked.sort_unstable();
        self.values.clear();
        self.values
            .extend(self.picked.iter().map(|&i| self.residual[i as usize]));
        put_varint(k as u64, out);
        put_values(&self.picked, out);
        let at = out.len();
        encode_rows(&self.values, k, enc, out);
        self.decoded.resize(k, 0.0);
        decode_rows(&out[at..], k, enc, &mut self.decoded).expect("a chunk just encoded decodes");
        for (&i, d) in self.picked.iter().zip(&self.decoded) {
            let r = &mut self.residual[i as usize];
            let e = *r - d;
            *r = if e.is_finite() { e } else { 0.0 };
        }
    }
}

/// Reads a chunk written by [`TopK::compress`] for a vector of `len` elements and adds its entries to `out`
/// (`out.len() == len`). `indices` and `values` are scratch buffers. Returns the bytes consumed.
pub fn decode_chunk(
    bytes: &[u8],
    enc: Encoding,
    out: &mut [f32],
    indices: &mut Vec<u64>,
    values: &mut Vec<f32>,
) -> Result<usize, ProtocolError> {
    let mut n = 0u64;
    let mut at = 0;
    loop {
        let Some(&b) = bytes.get(at) else {
            return Err(ProtocolError::BadPayload(
                "top-k chunk: truncated count".into(),
            ));
        };
        if at == 9 && b > 1 {
            return Err(ProtocolError::BadPayload(
                "top-k chunk: malformed count".into(),
            ));
        }
        n |= ((b & 0x7f) as u64) << (7 * at);
        at += 1;
        if b & 0x80 == 0 {
            break;
        }
    }
    if n > out.len() as u64 {
        return Err(ProtocolError::BadPayload(format!(
            "top-k chunk of {n} entries for a vector of {}",
            out.len()
        )));
    }
    let n = n as usize;
    indices.clear();
    at += get_values(&bytes[at..], n, indices)?;
    if let Some(&last) = indices.last() {
        if last >= out.len() as u64 {
            return Err(ProtocolError::BadPayload(format!(
                "top-k chunk: index {last} out of range for a vector of {}",
                out.len()
            )));
        }
    }
    let width = enc.row_bytes(n);
    let width = if n == 0 { 0 } else { width };
    let Some(rows) = bytes.get(at..at + width) else {
        return Err(ProtocolError::BadPayload(format!(
            "top-k chunk: {} value bytes, expected {width}",
            bytes.len() - at
        )));
    };
    values.resize(n, 0.0);
    decode_rows(rows, n, enc, values)?;
    for (&i, v) in indices.iter().zip(values.iter()) {
        out[i as usize] += v;
    }
    Ok(at + width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Sent (decoded) sums plus the final residual equal the sum of the gradients.
        #[test]
        fn sent_plus_residual_equals_true_sum(
            grads in proptest::collection::vec(proptest::collection::vec(-1.0f32..1.0, 50), 1..20),
            k in 0usize..60,
            enc_i in 0usize..4,
        ) {
            let enc = Encoding::ALL[enc_i];
            let mut t = TopK::new(50, k);
            let mut sent = vec![0.0f32; 50];
            let mut truth = vec![0.0f64; 50];
            let (mut idx, mut vals) = (Vec::new(), Vec::new());
            for g in &grads {
                let mut chunk = Vec::new();
                t.compress(g, enc, &mut chunk);
                let used = decode_chunk(&chunk, enc, &mut sent, &mut idx, &mut vals).unwrap();
                prop_assert_eq!(used, chunk.len());
                prop_assert_eq!(idx.len(), k.min(50));
                for (a, b) in truth.iter_mut().zip(g) { *a += *b as f64; }
            }
            for i in 0..50 {
                let err = (sent[i] as f64 + t.residual()[i] as f64 - truth[i]).abs();
                prop_assert!(err <= 1e-4, "element {}: {}", i, err);
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), enc_i in 0usize..4) {
            let mut out = vec![0.0; 20];
            let _ = decode_chunk(&bytes, Encoding::ALL[enc_i], &mut out, &mut Vec::new(), &mut Vec::new());
        }
    }

    #[test]
    fn sends_the_largest_entries() {
        let mut t = TopK::new(6, 2);
        let mut chunk = Vec::new();
        t.compress(&[0.1, -5.0, 0.2, 3.0, 0.0, -0.3], Encoding::F32, &mut chunk);
        let mut out = vec![0.0; 6];
        decode_chunk(
            &chunk,
            Encoding::F32,
            &mut out,
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .unwrap();
        assert_eq!(out, [0.0, -5.0, 0.0, 3.0, 0.0, 0.0]);
        assert_eq!(t.residual(), [0.1, 0.0, 0.2, 0.0, 0.0, -0.3]);
        // 1 count + 1 coding + 2 indices + 8 value bytes.
        assert_eq!(chunk.len(), 12);
        // Next step: the residual competes with the new gradient.
        chunk.clear();
        t.compress(&[0.0; 6], Encoding::F32, &mut chunk);
        let mut out = vec![0.0; 6];
        decode_chunk(
            &chunk,
            Encoding::F32,
            &mut out,
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .unwrap();
        assert_eq!(out, [0.0, 0.0, 0.2, 0.0, 0.0, -0.3]);
    }

    #[test]
    fn out_of_range_index_is_refused() {
        let mut t = TopK::new(10, 1);
        let mut chunk = Vec::new();
        let mut g = [0.0; 10];
        g[9] = 1.0;
        t.compress(&g, Encoding::F32, &mut chunk);
        let mut small = vec![0.0; 5];
        let err = decode_chunk(
            &chunk,
            Encoding::F32,
            &mut small,
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("index 9 out of range"), "{err}");
    }
}
