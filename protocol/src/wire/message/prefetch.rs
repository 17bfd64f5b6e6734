//! `Prefetch`: lookahead into the capacity tier. A trainer that knows the ids of batch `t + P` while it pulls
//! batch `t` sends them ahead; the server reads the rows it had evicted back from RocksDB (on a blocking
//! thread) and pins them, so that batch's pull finds them in memory and no eviction drops them before its
//! pull and push have passed.
//!
//! The request's payload is the id sections of a pull ([`super::pull::IdSections`], decoded with
//! [`decode`]); the `Prefetched` reply carries only [`LeaseStats`].
//!
//! # Leases
//! Pins belong to a lease `(owner, lease)`: `owner` is a number a client draws once per pass, `lease` a batch
//! index. A prefetch first releases every lease of its owner numbered below `release_below` (the trainer
//! sends the count of its acknowledged pushes), then pins its ids under its own lease. A lease nobody
//! releases (a trainer that died, a batch never pulled) ends at the server's pin deadline, so pins never hold
//! memory forever. A prefetch without tables is a pure release (the end of a pass).

use crate::error::ProtocolError;
use crate::wire::layout::{PayloadLayout, TableCount};
use crate::wire::message::Request;

/// What a server did for one prefetch (and, summed, a client's prefetch over servers): the engine's own
/// counts, which travel as they are.
pub use embedding::{LeaseStats, PrefetchStats};

/// The header of a prefetch of `counts`' tables under lease `(owner, lease)`, releasing `owner`'s leases
/// numbered below `release_below` first.
pub fn request(
    epoch: u64,
    owner: u64,
    lease: u64,
    release_below: u64,
    counts: Vec<TableCount>,
) -> Request {
    Request::Prefetch {
        epoch,
        owner,
        lease,
        release_below,
        tables: counts,
    }
}

/// Decodes a prefetch's ids into `ids` (cleared first), table after table; a malformed section or bytes
/// after the last one refuse the whole prefetch before anything is read.
pub fn decode(
    tables: &[TableCount],
    payload: &[u8],
    ids: &mut Vec<u64>,
) -> Result<PayloadLayout, ProtocolError> {
    let (layout, used) = super::pull::decode_sections("prefetch", tables, payload, ids)?;
    if used != payload.len() {
        return Err(ProtocolError::BadPayload(format!(
            "prefetch: {} trailing bytes after the id sections",
            payload.len() - used
        )));
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ids::IdCoding;
    use crate::wire::message::pull::IdSections;

    #[test]
    fn ids_round_trip_and_trailing_bytes_refuse() {
        let mut s = IdSections::new();
        s.table(2, 16, IdCoding::Plain, &[3, 4, 70]);
        let mut ids = Vec::new();
        let layout = decode(&s.counts, &s.payload, &mut ids).unwrap();
        assert_eq!((layout.ids, ids.as_slice()), (3, &[3u64, 4, 70][..]));
        let mut long = s.payload.clone();
        long.extend_from_slice(&[1, 2]);
        let err = decode(&s.counts, &long, &mut ids).unwrap_err();
        assert!(
            err.to_string().contains("prefetch: 2 trailing bytes"),
            "{err}"
        );
        let err = decode(&s.counts, &s.payload[..1], &mut ids).unwrap_err();
        assert!(err.to_string().contains("prefetch:"), "{err}");
    }

    #[test]
    fn header_round_trips_through_a_frame() {
        let req = request(7, 0xfeed, 12, 10, vec![]);
        let buf = crate::wire::frame::encode_frame(&req, &[]).unwrap();
        let (back, payload, used) = crate::wire::frame::decode_frame::<Request>(&buf, 1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!((back, payload.len(), used), (req, 0, buf.len()));
    }
}
