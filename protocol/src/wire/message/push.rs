//! `Push`: apply gradients. The payload is the id sections of every table of the header (as a pull's,
//! [`super::pull::IdSections`]), then the gradient rows of every table in header order, in the request's
//! [`Encoding`], multiplied by the request's `grad_scale`. The `Pushed` reply has no payload.
//!
//! | side | call |
//! | --- | --- |
//! | client | [`IdSections::table`] per table, then encode each table's rows onto `payload`, then [`request`] |
//! | server | [`decode`]: every id and the rows' bytes, checked for length, before anything is applied |
//!
//! **Exactly once.** Every push carries a [`PushId`]: the sending client's random identity and a number it
//! increments per push. A retry (after a lost connection, a timeout, a failover) carries the same id; a server
//! that applied it answers with its first answer instead of applying it again, and a primary's backups learn
//! the answers with the rows ([`super::replicate::ReplicateHeader::pushes`]), so a promoted backup does too.

use serde::{Deserialize, Serialize};

use crate::compression::codec::Encoding;
use crate::error::ProtocolError;
use crate::wire::layout::{check_len, TableCount};
use crate::wire::message::Request;

use super::pull::{decode_sections, IdSections};

/// The identity of one push: `client`, drawn at random by each client (0: none, the push is not
/// de-duplicated), and `seq`, the client's count of pushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PushId {
    /// The sending client, random and non-zero; 0 for senders that do not retry (tools, tests).
    pub client: u64,
    /// The client's number of this push, increasing.
    pub seq: u64,
}

impl PushId {
    /// No identity: the server applies every copy it gets.
    pub const NONE: PushId = PushId { client: 0, seq: 0 };

    /// Whether the server de-duplicates this push.
    pub fn is_some(self) -> bool {
        self.client != 0
    }
}

/// A push's answer, as a primary tells its backups (so that a retry reaching a promoted backup gets it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushAnswer {
    /// The push.
    pub id: PushId,
    /// Rows applied ([`crate::Response::Pushed`]).
    pub rows: u64,
    /// Rows rejected as non-finite.
    pub rejected_nonfinite: u64,
}

/// The header of a push of `tables` under map `epoch`, gradients in `encoding` multiplied by `grad_scale`,
/// applied at `lr_scale` times each table's learning rate: the one builder every sender uses. Refuses a
/// `grad_scale` that is not finite and > 0, or an `lr_scale` that is not finite and >= 0, before anything is
/// sent (the server would refuse them).
pub fn request(
    epoch: u64,
    encoding: Encoding,
    (grad_scale, lr_scale): (f32, f32),
    tables: Vec<TableCount>,
    id: PushId,
) -> Result<Request, ProtocolError> {
    check_grad_scale(grad_scale)?;
    check_lr_scale(lr_scale)?;
    Ok(Request::Push {
        epoch,
        encoding,
        grad_scale,
        tables,
        id,
        lr_scale,
    })
}

/// Refuses a learning-rate multiplier that is not finite and >= 0.
pub fn check_lr_scale(lr_scale: f32) -> Result<(), ProtocolError> {
    if !(lr_scale.is_finite() && lr_scale >= 0.0) {
        return Err(ProtocolError::BadPayload(format!(
            "lr_scale = {lr_scale}, expected a finite number >= 0"
        )));
    }
    Ok(())
}

/// Checks that `sections` (id sections followed by their rows) holds the rows' bytes its counts announce in
/// `encoding`: what [`decode`] will require of the payload on the server.
pub fn check_rows(sections: &IdSections, encoding: Encoding) -> Result<(), ProtocolError> {
    let layout = crate::wire::layout::PayloadLayout::of(&sections.counts)?;
    check_len(
        "push rows",
        sections.payload.len() - sections.ids_len(),
        layout.rows_bytes(encoding),
    )
}

/// Refuses a gradient scale that is not finite and > 0 (the server divides by it).
pub fn check_grad_scale(grad_scale: f32) -> Result<(), ProtocolError> {
    if !(grad_scale.is_finite() && grad_scale > 0.0) {
        return Err(ProtocolError::BadPayload(format!(
            "grad_scale = {grad_scale}, expected a finite number > 0"
        )));
    }
    Ok(())
}

/// Decodes a push: every id into `ids` (cleared first) and the rows' bytes, whose length must match the
/// header; a malformed section or a wrong length refuses the whole push before any row is applied.
pub fn decode<'a>(
    tables: &[TableCount],
    encoding: Encoding,
    payload: &'a [u8],
    ids: &mut Vec<u64>,
) -> Result<&'a [u8], ProtocolError> {
    let (layout, used) = decode_sections("push", tables, payload, ids)?;
    let rows = &payload[used..];
    check_len("push rows", rows.len(), layout.rows_bytes(encoding))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::codec::{decode_rows, encode_rows};
    use crate::wire::ids::IdCoding;

    #[test]
    fn push_round_trip_and_length_checks() {
        let mut s = IdSections::new();
        s.table(1, 2, IdCoding::Plain, &[4, 8]);
        s.table(2, 2, IdCoding::Plain, &[3]);
        encode_rows(&[1.0, 2.0, 3.0, 4.0], 2, Encoding::F32, &mut s.payload);
        let err = check_rows(&s, Encoding::F32).unwrap_err();
        assert!(
            err.to_string().contains("push rows"),
            "table 2's row is missing: {err}"
        );
        encode_rows(&[5.0, 6.0], 2, Encoding::F32, &mut s.payload);
        check_rows(&s, Encoding::F32).unwrap();
        let req = request(7, Encoding::F32, (2.0, 1.0), s.counts.clone(), PushId::NONE).unwrap();
        assert!(matches!(
            req,
            Request::Push {
                epoch: 7,
                grad_scale: 2.0,
                ..
            }
        ));
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let err =
                request(7, Encoding::F32, (bad, 1.0), s.counts.clone(), PushId::NONE).unwrap_err();
            assert!(err.to_string().contains("grad_scale"), "{err}");
        }
        let mut ids = Vec::new();
        let rows = decode(&s.counts, Encoding::F32, &s.payload, &mut ids).unwrap();
        assert_eq!(ids, [4, 8, 3]);
        let mut back = vec![0.0; 6];
        decode_rows(rows, 2, Encoding::F32, &mut back).unwrap();
        assert_eq!(back, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let err = decode(
            &s.counts,
            Encoding::F32,
            &s.payload[..s.payload.len() - 1],
            &mut ids,
        );
        assert!(err.unwrap_err().to_string().contains("push rows"));
    }
}
