//! Row encodings on the wire: f32, f16 or bf16, as raw little-endian bytes.
//!
//! Pulled rows and pushed gradients are encoded per request. f16 halves the bytes with a relative error of at
//! most 2^-11 for normal values (|x| in 6.1e-5..65504); bf16 keeps f32's range with a relative error of 2^-8.
//! Values beyond f16's range become infinite, which the server rejects for gradients; trainers that push large
//! gradients pick bf16 or f32.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;

/// Element encoding of rows in a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Encoding {
    /// IEEE binary32, 4 bytes.
    F32,
    /// IEEE binary16, 2 bytes.
    F16,
    /// bfloat16 (the top half of an f32), 2 bytes.
    Bf16,
}

impl Encoding {
    /// Bytes per encoded element.
    pub fn bytes_per_element(self) -> usize {
        match self {
            Encoding::F32 => 4,
            Encoding::F16 | Encoding::Bf16 => 2,
        }
    }
}

impl std::str::FromStr for Encoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Encoding::F32),
            "f16" => Ok(Encoding::F16),
            "bf16" => Ok(Encoding::Bf16),
            other => Err(format!(
                "unknown encoding {other:?}, expected f32, f16 or bf16"
            )),
        }
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encoding::F32 => "f32",
            Encoding::F16 => "f16",
            Encoding::Bf16 => "bf16",
        })
    }
}

/// Appends `src` encoded as `enc` to `out`.
pub fn encode(src: &[f32], enc: Encoding, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + src.len() * enc.bytes_per_element(), 0);
    let dst = &mut out[start..];
    match enc {
        Encoding::F32 => {
            for (d, x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        Encoding::F16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        }
        Encoding::Bf16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
            }
        }
    }
}

/// Decodes `bytes` (exactly `out.len()` elements of `enc`) into `out`.
pub fn decode(bytes: &[u8], enc: Encoding, out: &mut [f32]) -> Result<(), ProtocolError> {
    let expected = out.len() * enc.bytes_per_element();
    if bytes.len() != expected {
        return Err(ProtocolError::BadPayload(format!(
            "{} rows section of {} bytes, expected {expected} ({} elements)",
            enc,
            bytes.len(),
            out.len()
        )));
    }
    match enc {
        Encoding::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes(c.try_into().expect("4 bytes"));
            }
        }
        Encoding::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        Encoding::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(v: &[f32], enc: Encoding) -> Vec<f32> {
        let mut bytes = Vec::new();
        encode(v, enc, &mut bytes);
        assert_eq!(bytes.len(), v.len() * enc.bytes_per_element());
        let mut out = vec![0.0; v.len()];
        decode(&bytes, enc, &mut out).unwrap();
        out
    }

    proptest! {
        #[test]
        fn f32_is_exact(v in proptest::collection::vec(proptest::num::f32::ANY, 0..64)) {
            let back = round_trip(&v, Encoding::F32);
            for (a, b) in v.iter().zip(&back) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }

        #[test]
        fn f16_relative_error_bounded(v in proptest::collection::vec(-60000.0f32..60000.0, 0..64)) {
            let back = round_trip(&v, Encoding::F16);
            for (a, b) in v.iter().zip(&back) {
                // Normal range: relative error 2^-11; subnormals: absolute error 2^-25.
                let tol = (a.abs() * (1.0 / 2048.0)).max(3.0e-8);
                prop_assert!((a - b).abs() <= tol, "{} -> {}", a, b);
            }
        }

        #[test]
        fn bf16_relative_error_bounded(v in proptest::collection::vec(-1.0e30f32..1.0e30, 0..64)) {
            let back = round_trip(&v, Encoding::Bf16);
            for (a, b) in v.iter().zip(&back) {
                prop_assert!((a - b).abs() <= a.abs() / 256.0, "{} -> {}", a, b);
            }
        }
    }

    #[test]
    fn wrong_length_is_an_error() {
        let mut out = vec![0.0; 3];
        let err = decode(&[0u8; 5], Encoding::F16, &mut out).unwrap_err();
        assert!(err.to_string().contains("5 bytes, expected 6"), "{err}");
    }

    #[test]
    fn parse_names() {
        assert_eq!("F16".parse::<Encoding>().unwrap(), Encoding::F16);
        assert!("int4".parse::<Encoding>().unwrap_err().contains("int4"));
    }
}
