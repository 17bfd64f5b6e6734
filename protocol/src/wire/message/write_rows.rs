//! `WriteRows`: set the weights of rows, as a trainer loading saved weights does (PyTorch's `load_state_dict`).
//! The payload is laid out as a push's ([`super::push`]): the id sections of every table of the header, then
//! every table's rows in header order, here f32 weights (`dim` each) where a push has gradients. The server
//! sets each row's weights and keeps its optimizer state (a new row gets the table's initial state); no
//! optimizer runs and no admission applies. The `WroteRows` reply has no payload.
//!
//! Setting weights is idempotent, so a retry needs no identity. It is not atomic with a concurrent push of the
//! same rows (either may win): load weights before training, as PyTorch users do.
//!
//! | side | call |
//! | --- | --- |
//! | client | [`super::pull::IdSections::table`] per table, then every table's weights (f32 LE), then [`request`] |
//! | server | [`decode`]: every id and the weights' bytes, checked for length, before any row changes |

use crate::compression::codec::Encoding;
use crate::error::ProtocolError;
use crate::wire::layout::{check_len, TableCount};
use crate::wire::message::Request;

/// The header of a write of `tables`' rows under map `epoch`.
pub fn request(epoch: u64, tables: Vec<TableCount>) -> Request {
    Request::WriteRows { epoch, tables }
}

/// Decodes a write: every id into `ids` (cleared first) and the weights' bytes (f32 LE, `dim` per row), whose
/// length must match the header; a malformed section or a wrong length refuses the whole write.
pub fn decode<'a>(
    tables: &[TableCount],
    payload: &'a [u8],
    ids: &mut Vec<u64>,
) -> Result<&'a [u8], ProtocolError> {
    let (layout, used) = super::pull::decode_sections("write", tables, payload, ids)?;
    let rows = &payload[used..];
    check_len("write rows", rows.len(), layout.rows_bytes(Encoding::F32))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::codec::encode_rows;
    use crate::wire::ids::IdCoding;
    use crate::wire::message::pull::IdSections;

    #[test]
    fn weights_round_trip_and_a_short_payload_is_refused() {
        let mut s = IdSections::new();
        s.table(1, 2, IdCoding::Plain, &[4, 8]);
        encode_rows(&[1.0, 2.0, 3.0, 4.0], 2, Encoding::F32, &mut s.payload);
        assert_eq!(
            request(3, s.counts.clone()),
            Request::WriteRows {
                epoch: 3,
                tables: s.counts.clone()
            }
        );
        let mut ids = Vec::new();
        let rows = decode(&s.counts, &s.payload, &mut ids).unwrap();
        assert_eq!(ids, [4, 8]);
        assert_eq!(rows.len(), 16);
        let err = decode(&s.counts, &s.payload[..s.payload.len() - 4], &mut ids).unwrap_err();
        assert!(err.to_string().contains("write rows"), "{err}");
    }
}
