//! `Pull`: read rows. The request's payload is one id section per table of its header (ascending ids,
//! delta + varint coded, [`super::ids`]); the `Pulled` reply's payload is the rows of every table in header
//! order, in the request's [`Encoding`].
//!
//! | side | call |
//! | --- | --- |
//! | client, request | [`IdSections::table`] per table, then [`request`] |
//! | server, request | [`decode`]: every id, or an error before anything is read |
//! | server, reply | rows encoded in header order ([`crate::compression::codec::encode_rows`]) |
//! | client, reply | [`check_rows`], then decode table by table |
//!
//! Push requests start with the same id sections ([`super::push`]); the pull that also returns optimizer
//! state has its own reply layout ([`super::pull_with_state`]).

use crate::compression::codec::Encoding;
use crate::error::ProtocolError;
use crate::wire::ids::{get_sections, put_ids, IdCoding};
use crate::wire::layout::{check_len, PayloadLayout, TableCount};
use crate::wire::message::Request;

/// The id part of a pull or a push: a header count per table and its id section, in the same order.
///
/// Reused across requests ([`IdSections::clear`]) so a trainer allocates nothing per batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdSections {
    /// Header counts, one per table with ids.
    pub counts: Vec<TableCount>,
    /// The payload so far: id sections in `counts` order (a push then appends its rows: [`super::push`]).
    pub payload: Vec<u8>,
    /// Bytes of `payload` the id sections take.
    ids_len: usize,
}

impl IdSections {
    /// Empty sections.
    pub fn new() -> IdSections {
        IdSections::default()
    }

    /// Forgets every table, keeping the buffers.
    pub fn clear(&mut self) {
        self.counts.clear();
        self.payload.clear();
        self.ids_len = 0;
    }

    /// Bytes of [`IdSections::payload`] the id sections take (what follows is a push's rows).
    pub fn ids_len(&self) -> usize {
        self.ids_len
    }

    /// Whether no table has ids.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Appends table `table`'s ids (of rows of `dim` elements), which must be strictly ascending in
    /// `coding`'s wire order ([`crate::wire::ids::sort_for_wire`]); a table with no ids is left out. Every table
    /// goes in before any row.
    pub fn table(&mut self, table: u32, dim: u32, coding: IdCoding, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        debug_assert_eq!(self.ids_len, self.payload.len(), "id sections after rows");
        self.counts.push(TableCount {
            table,
            count: ids.len() as u32,
            dim,
        });
        put_ids(coding, ids, &mut self.payload);
        self.ids_len = self.payload.len();
    }
}

/// The header of a pull of `counts`' tables, answered in `encoding`.
pub fn request(epoch: u64, encoding: Encoding, counts: Vec<TableCount>) -> Request {
    Request::Pull {
        epoch,
        encoding,
        tables: counts,
    }
}

/// Decodes every id of a pull (or a push's id sections, see [`super::push::decode`]) into `ids` (cleared
/// first), table after table, and returns the payload's layout with the bytes the sections took. A
/// malformed section anywhere refuses the whole request before anything is read.
pub fn decode_sections(
    what: &str,
    tables: &[TableCount],
    payload: &[u8],
    ids: &mut Vec<u64>,
) -> Result<(PayloadLayout, usize), ProtocolError> {
    let layout = PayloadLayout::of(tables)?;
    let used = get_sections(payload, tables.iter().map(|t| t.count as usize), ids)
        .map_err(|e| ProtocolError::BadPayload(format!("{what}: {e}")))?;
    Ok((layout, used))
}

/// Decodes a pull's ids (see [`decode_sections`]); bytes after the last section refuse it.
pub fn decode(
    tables: &[TableCount],
    payload: &[u8],
    ids: &mut Vec<u64>,
) -> Result<PayloadLayout, ProtocolError> {
    let (layout, used) = decode_sections("pull", tables, payload, ids)?;
    if used != payload.len() {
        return Err(ProtocolError::BadPayload(format!(
            "pull: {} trailing bytes after the id sections",
            payload.len() - used
        )));
    }
    Ok(layout)
}

/// Checks that a `Pulled` reply's rows have the length the request's `tables` and `encoding` announce.
pub fn check_rows(
    tables: &[TableCount],
    encoding: Encoding,
    rows: &[u8],
) -> Result<(), ProtocolError> {
    let layout = PayloadLayout::of(tables)?;
    check_len(
        "pull response",
        rows.len(),
        layout.pull_response_bytes(encoding),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_round_trip_and_refuse_trailing_bytes() {
        let mut s = IdSections::new();
        s.table(3, 16, IdCoding::Plain, &[1, 5, 9]);
        s.table(4, 16, IdCoding::Plain, &[]);
        s.table(7, 8, IdCoding::Unmixed, &{
            let mut v = vec![10u64, 20, 30];
            crate::wire::ids::sort_for_wire(IdCoding::Unmixed, &mut v);
            v
        });
        assert_eq!(s.counts.len(), 2, "a table without ids is left out");
        let mut ids = Vec::new();
        let layout = decode(&s.counts, &s.payload, &mut ids).unwrap();
        assert_eq!(layout.ids, 6);
        assert_eq!(layout.elements, 3 * 16 + 3 * 8);
        assert_eq!(&ids[..3], &[1, 5, 9]);
        let mut rest = ids[3..].to_vec();
        rest.sort_unstable();
        assert_eq!(rest, [10, 20, 30]);
        let mut long = s.payload.clone();
        long.push(0);
        let err = decode(&s.counts, &long, &mut ids).unwrap_err();
        assert!(err.to_string().contains("1 trailing bytes"), "{err}");
        let err = decode(&s.counts, &s.payload[..2], &mut ids).unwrap_err();
        assert!(err.to_string().starts_with("bad payload: pull:"), "{err}");
        s.clear();
        assert!(s.is_empty() && s.payload.is_empty());
    }

    #[test]
    fn reply_rows_are_checked_for_length() {
        let counts = [TableCount {
            table: 0,
            count: 2,
            dim: 4,
        }];
        assert!(check_rows(&counts, Encoding::F16, &[0; 16]).is_ok());
        let err = check_rows(&counts, Encoding::F16, &[0; 15]).unwrap_err();
        assert!(err.to_string().contains("15 bytes, expected 16"), "{err}");
    }
}
