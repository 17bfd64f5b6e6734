//! The layout of pull and push payloads, shared by every request that carries rows: each table's share
//! ([`TableCount`]), the sizes it implies ([`PayloadLayout`]) and the length check of a payload
//! ([`check_len`]). Every request file ([`crate::wire::message`]) builds on these; they know no request.

use serde::{Deserialize, Serialize};

use crate::compression::codec::Encoding;
use crate::error::ProtocolError;

/// A table's share of a pull or push: its id, how many ids, and the row dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableCount {
    /// Table id.
    pub table: u32,
    /// Number of ids (and rows) of this table in the payload.
    pub count: u32,
    /// Row dimension the sender assumes; the server checks it against the table.
    pub dim: u32,
}

/// Appends one [`crate::wire::ids::IdCoding::Plain`] id section of `ids`, which must be strictly ascending (one call
/// per table, for hand-written requests and tests; the trainer and ps-bench use [`crate::wire::ids::put_ids`] with
/// [`crate::wire::ids::IdCoding::Unmixed`]).
pub fn put_ids(ids: &[u64], out: &mut Vec<u8>) {
    crate::wire::ids::put_ids(crate::wire::ids::IdCoding::Plain, ids, out)
}

/// Sizes of a pull or push payload laid out as the [`crate::wire::message`] docs say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadLayout {
    /// Total ids over all tables.
    pub ids: usize,
    /// Total row elements over all tables (sum of count x dim).
    pub elements: usize,
}

impl PayloadLayout {
    /// Computes the layout, refusing counts that overflow.
    pub fn of(tables: &[TableCount]) -> Result<PayloadLayout, ProtocolError> {
        let mut ids = 0usize;
        let mut elements = 0usize;
        for t in tables {
            ids = ids.checked_add(t.count as usize).ok_or_else(overflow)?;
            let e = (t.count as usize)
                .checked_mul(t.dim as usize)
                .ok_or_else(overflow)?;
            elements = elements.checked_add(e).ok_or_else(overflow)?;
        }
        Ok(PayloadLayout { ids, elements })
    }

    /// Bytes of the rows of every table in `encoding`: the pull response payload, and the part of a push
    /// payload after its id sections (saturates at `usize::MAX`, which no payload matches).
    pub fn rows_bytes(&self, encoding: Encoding) -> usize {
        encoding
            .rows_bytes(self.ids, self.elements)
            .unwrap_or(usize::MAX)
    }

    /// Expected bytes of a pull response payload.
    pub fn pull_response_bytes(&self, encoding: Encoding) -> usize {
        self.rows_bytes(encoding)
    }

    /// Bytes of the optimizer state of a [`Response::PulledWithState`] payload: `count x state_len` f32 per
    /// table (`state_lens[i]` for `tables[i]`; a missing entry refuses the layout).
    pub fn state_bytes(tables: &[TableCount], state_lens: &[u32]) -> Result<usize, ProtocolError> {
        if tables.len() != state_lens.len() {
            return Err(ProtocolError::BadPayload(format!(
                "{} state lengths for {} tables",
                state_lens.len(),
                tables.len()
            )));
        }
        let mut bytes = 0usize;
        for (t, &len) in tables.iter().zip(state_lens) {
            let b = (t.count as usize)
                .checked_mul(len as usize)
                .and_then(|e| e.checked_mul(4))
                .ok_or_else(overflow)?;
            bytes = bytes.checked_add(b).ok_or_else(overflow)?;
        }
        Ok(bytes)
    }
}

fn overflow() -> ProtocolError {
    ProtocolError::BadPayload("table counts overflow".into())
}

/// Checks that a payload has the length its header announces.
pub fn check_len(what: &str, got: usize, expected: usize) -> Result<(), ProtocolError> {
    if got != expected {
        return Err(ProtocolError::BadPayload(format!(
            "{what} payload of {got} bytes, expected {expected}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let ids = [0u64, 1, 0x0123_4567_89ab_cdef, u64::MAX];
        let mut bytes = Vec::new();
        put_ids(&ids, &mut bytes);
        assert_eq!(bytes.len(), 1 + 1 + 1 + 9 + 10);
        let mut back = Vec::new();
        assert_eq!(
            crate::wire::ids::get_ids(&bytes, 4, &mut back).unwrap(),
            bytes.len()
        );
        assert_eq!(back, ids);
        assert!(crate::wire::ids::get_ids(&bytes[..7], 4, &mut back).is_err());
    }

    #[test]
    fn layout_sizes() {
        let t = [
            TableCount {
                table: 0,
                count: 3,
                dim: 16,
            },
            TableCount {
                table: 1,
                count: 2,
                dim: 8,
            },
        ];
        let l = PayloadLayout::of(&t).unwrap();
        assert_eq!(
            l,
            PayloadLayout {
                ids: 5,
                elements: 64
            }
        );
        assert_eq!(l.rows_bytes(Encoding::F16), 128);
        assert_eq!(l.rows_bytes(Encoding::Int8), 64 + 5 * 4);
        assert_eq!(l.pull_response_bytes(Encoding::F32), 256);
        let huge = [TableCount {
            table: 0,
            count: u32::MAX,
            dim: u32::MAX,
        }; 3];
        assert!(PayloadLayout::of(&huge).is_err());
    }
}
