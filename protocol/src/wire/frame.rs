//! Sans-IO framing.
//!
//! A frame is a fixed 12-byte prefix, a bincode header and raw bulk bytes:
//!
//! ```text
//! magic u32 LE ("PS01") | header_len u32 LE | payload_len u32 LE | header (bincode) | payload (raw LE bytes)
//! ```
//!
//! The header carries the request or response kind and the per-table counts; the payload carries ids and rows
//! as raw little-endian bytes, never serialized element by element (DESIGN.md, "Protocol"). The header is capped
//! at [`MAX_HEADER_LEN`] and the whole frame at a configurable cap; a frame over either is refused before any
//! byte of it is buffered. A magic of `PS` followed by other digits is another protocol version and is refused
//! as such ([`ProtocolError::WrongVersion`]), anything else as [`ProtocolError::BadMagic`].

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ProtocolError;

/// "PS01" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"PS01");
/// Length of the fixed prefix.
pub const PREFIX_LEN: usize = 12;
/// Largest header accepted: headers hold counts, not rows.
pub const MAX_HEADER_LEN: u32 = 1 << 20;
/// Default cap on a whole frame (header + payload): 64 MiB.
pub const DEFAULT_MAX_FRAME: u64 = 64 << 20;

fn bincode_config() -> impl bincode::config::Config {
    // The limit bounds what a hostile length field can make the decoder allocate.
    bincode::config::standard().with_limit::<{ MAX_HEADER_LEN as usize }>()
}

/// The decoded fixed prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// Bytes of bincode header that follow the prefix.
    pub header_len: u32,
    /// Bytes of payload that follow the header.
    pub payload_len: u32,
}

impl Prefix {
    /// Header plus payload bytes.
    pub fn body_len(&self) -> usize {
        self.header_len as usize + self.payload_len as usize
    }
}

/// Parses and checks the fixed prefix against the caps.
pub fn parse_prefix(buf: &[u8; PREFIX_LEN], max_frame: u64) -> Result<Prefix, ProtocolError> {
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let magic = word(0);
    if magic != MAGIC {
        if buf[..2] == MAGIC.to_le_bytes()[..2] {
            // "PS" then other digits: a peer speaking another version of this protocol.
            return Err(ProtocolError::WrongVersion {
                found: String::from_utf8_lossy(&buf[2..4]).into_owned(),
                expected: String::from_utf8_lossy(&MAGIC.to_le_bytes()[2..]).into_owned(),
            });
        }
        return Err(ProtocolError::BadMagic {
            found: magic,
            expected: MAGIC,
        });
    }
    let prefix = Prefix {
        header_len: word(4),
        payload_len: word(8),
    };
    let size = PREFIX_LEN as u64 + prefix.header_len as u64 + prefix.payload_len as u64;
    if size > max_frame {
        return Err(ProtocolError::FrameTooLarge {
            size,
            cap: max_frame,
        });
    }
    if prefix.header_len > MAX_HEADER_LEN {
        return Err(ProtocolError::FrameTooLarge {
            size: prefix.header_len as u64,
            cap: MAX_HEADER_LEN as u64,
        });
    }
    Ok(prefix)
}

/// Encodes the prefix and header of a frame whose payload of `payload_len` bytes the caller sends next.
pub fn encode_head<H: Serialize>(
    header: &H,
    payload_len: usize,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; PREFIX_LEN]);
    bincode::serde::encode_into_std_write(header, out, bincode_config())
        .map_err(|e| ProtocolError::BadHeader(format!("encode: {e}")))?;
    let header_len = out.len() - start - PREFIX_LEN;
    if header_len > MAX_HEADER_LEN as usize {
        return Err(ProtocolError::FrameTooLarge {
            size: header_len as u64,
            cap: MAX_HEADER_LEN as u64,
        });
    }
    let payload_len = u32::try_from(payload_len).map_err(|_| ProtocolError::FrameTooLarge {
        size: payload_len as u64,
        cap: u32::MAX as u64,
    })?;
    out[start..start + 4].copy_from_slice(&MAGIC.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&(header_len as u32).to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&payload_len.to_le_bytes());
    Ok(())
}

/// Encodes a whole frame (prefix, header, payload) into one buffer.
pub fn encode_frame<H: Serialize>(header: &H, payload: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    let mut out = Vec::with_capacity(PREFIX_LEN + 64 + payload.len());
    encode_head(header, payload.len(), &mut out)?;
    out.extend_from_slice(payload);
    Ok(out)
}

/// Decodes a bincode header.
pub fn decode_header<H: DeserializeOwned>(bytes: &[u8]) -> Result<H, ProtocolError> {
    let (header, used) = bincode::serde::decode_from_slice(bytes, bincode_config())
        .map_err(|e| ProtocolError::BadHeader(e.to_string()))?;
    if used != bytes.len() {
        return Err(ProtocolError::BadHeader(format!(
            "{} trailing bytes after a {used}-byte header",
            bytes.len() - used
        )));
    }
    Ok(header)
}

/// Decodes one frame from the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((header, payload_range, consumed)))` for a complete
/// frame, and an error for malformed or oversized input (checked as soon as the prefix is complete).
pub fn decode_frame<H: DeserializeOwned>(
    buf: &[u8],
    max_frame: u64,
) -> Result<Option<(H, std::ops::Range<usize>, usize)>, ProtocolError> {
    let Some(prefix_bytes) = buf.get(..PREFIX_LEN) else {
        return Ok(None);
    };
    let prefix = parse_prefix(prefix_bytes.try_into().expect("12 bytes"), max_frame)?;
    let total = PREFIX_LEN + prefix.body_len();
    if buf.len() < total {
        return Ok(None);
    }
    let header_end = PREFIX_LEN + prefix.header_len as usize;
    let header = decode_header(&buf[PREFIX_LEN..header_end])?;
    Ok(Some((header, header_end..total, total)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::layout::TableCount;
    use crate::wire::message::Request;
    use crate::Encoding;

    fn sample() -> Request {
        Request::Pull {
            epoch: 7,
            encoding: Encoding::F16,
            tables: vec![TableCount {
                table: 3,
                count: 2,
                dim: 4,
            }],
        }
    }

    #[test]
    fn round_trip() {
        let payload = [1u8, 2, 3, 4, 5];
        let frame = encode_frame(&sample(), &payload).unwrap();
        let (h, range, used) = decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME)
            .unwrap()
            .unwrap();
        assert_eq!(h, sample());
        assert_eq!(&frame[range], &payload);
        assert_eq!(used, frame.len());
    }

    /// Table configs travel as their JSON text in this codec (`wire::tables`: bincode cannot read their
    /// tagged form back): every optimizer, both initializers, admission and TTL survive a `RegisterTables`
    /// frame.
    #[test]
    fn table_configs_round_trip() {
        let tables = crate::wire::message::TableConfig::every_kind();
        let req = Request::RegisterTables { tables };
        let frame = encode_frame(&req, &[]).unwrap();
        let (back, _, used) = decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME)
            .unwrap()
            .unwrap();
        assert_eq!((back, used), (req, frame.len()));
    }

    /// A checkpoint's export prune survives a frame with any of its fields unset (bincode reads back only
    /// what was written: a field skipped when unset would misalign the rest).
    #[test]
    fn checkpoint_prunes_round_trip() {
        for (max_age_secs, min_count, min_score) in [
            (None, Some(3), None),
            (Some(60), None, None),
            (Some(1), Some(2), None),
            (None, None, Some(0.5)),
            (Some(1), None, Some(2.0)),
        ] {
            let req = Request::Checkpoint {
                dir: "x".into(),
                step: 7,
                tensors: true,
                prune: Some(embedding::ExportPrune {
                    max_age_secs,
                    min_count,
                    min_score,
                }),
            };
            let frame = encode_frame(&req, &[]).unwrap();
            let (back, _, used) = decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME)
                .unwrap()
                .unwrap();
            assert_eq!((back, used), (req, frame.len()));
        }
    }

    #[test]
    fn incomplete_needs_more_bytes() {
        let frame = encode_frame(&sample(), &[9; 100]).unwrap();
        for cut in 0..frame.len() {
            assert!(decode_frame::<Request>(&frame[..cut], DEFAULT_MAX_FRAME)
                .unwrap()
                .is_none());
        }
    }

    #[test]
    fn oversized_frame_refused_from_prefix_alone() {
        let frame = encode_frame(&sample(), &[0; 2000]).unwrap();
        let err = decode_frame::<Request>(&frame[..PREFIX_LEN], 1024).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err}");
        assert!(
            err.to_string().contains("exceeds the cap of 1024 bytes"),
            "{err}"
        );
    }

    #[test]
    fn another_protocol_version_is_named() {
        let mut frame = encode_frame(&sample(), &[]).unwrap();
        frame[..4].copy_from_slice(b"PS02");
        let err = decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME).unwrap_err();
        assert!(matches!(err, ProtocolError::WrongVersion { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "frame protocol version \"02\", this peer speaks \"01\""
        );
    }

    #[test]
    fn bad_magic_and_garbage_header() {
        let mut frame = encode_frame(&sample(), &[]).unwrap();
        frame[0] ^= 0xff;
        assert!(matches!(
            decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME),
            Err(ProtocolError::BadMagic { .. })
        ));
        let mut frame = encode_frame(&sample(), &[]).unwrap();
        frame[PREFIX_LEN] = 0xff; // an enum tag no variant has
        assert!(matches!(
            decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME),
            Err(ProtocolError::BadHeader(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = decode_frame::<Request>(&bytes, 1 << 16);
        }

        #[test]
        fn arbitrary_header_after_valid_prefix_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..128)) {
            let mut frame = Vec::new();
            frame.extend_from_slice(&MAGIC.to_le_bytes());
            frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
            frame.extend_from_slice(&0u32.to_le_bytes());
            frame.extend_from_slice(&body);
            let _ = decode_frame::<Request>(&frame, 1 << 16);
        }
    }
}
