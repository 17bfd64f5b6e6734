//! `Score`: a trainer gives ids of tables that evict by score ([`embedding::EvictionPolicy::Score`]) a score
//! each (an engagement, a value of its own), added to the rows' scores or replacing them
//! ([`embedding::ScoreMode`]). The payload is laid out as a write of rows' ([`super::write_rows`]) with rows of
//! one element: the id sections of every table of the header (each `TableCount::dim` is 1), then one f32 LE
//! score per id, table by table. The `Scored` reply says how many ids had a row in memory; the others are not
//! scored (an id's score is kept only while it has a row).
//!
//! Scores live in memory only: they are neither replicated, synced, checkpointed nor persisted (a restarted or
//! promoted server starts every row at 0, as LFU counts restart), so a trainer scores the ids it sees as it
//! goes. Adding is not idempotent: a retry after a lost reply may add twice, which a decaying score absorbs.
//!
//! | side | call |
//! | --- | --- |
//! | client | [`super::pull::IdSections::table`] per table (dim 1), then every table's scores (f32 LE), then [`request`] |
//! | server | [`decode`]: every id and score, checked for length and dim, before any row changes |

use crate::error::ProtocolError;
use crate::wire::layout::{check_len, TableCount};
use crate::wire::message::{Request, ScoreMode};

/// The header of scores of `tables`' ids under map `epoch`.
pub fn request(epoch: u64, mode: ScoreMode, tables: Vec<TableCount>) -> Request {
    Request::Score {
        epoch,
        mode,
        tables,
    }
}

/// Decodes scores: every id into `ids` and every score into `scores` (both cleared first). A table whose
/// `dim` is not 1, a malformed id section or a wrong length refuses the whole request.
pub fn decode(
    tables: &[TableCount],
    payload: &[u8],
    ids: &mut Vec<u64>,
    scores: &mut Vec<f32>,
) -> Result<(), ProtocolError> {
    if let Some(t) = tables.iter().find(|t| t.dim != 1) {
        return Err(ProtocolError::BadPayload(format!(
            "score: table {} has dim {} in the header, expected 1 (one score per id)",
            t.table, t.dim
        )));
    }
    let (_, used) = super::pull::decode_sections("score", tables, payload, ids)?;
    let rest = &payload[used..];
    check_len("scores", rest.len(), ids.len() * 4)?;
    scores.clear();
    scores.extend(
        rest.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ids::IdCoding;
    use crate::wire::message::pull::IdSections;

    #[test]
    fn scores_round_trip_and_bad_dims_and_lengths_are_refused() {
        let mut s = IdSections::new();
        s.table(1, 1, IdCoding::Plain, &[4, 8]);
        s.table(2, 1, IdCoding::Plain, &[3]);
        for v in [0.5f32, 2.0, 7.0] {
            s.payload.extend_from_slice(&v.to_le_bytes());
        }
        let (mut ids, mut scores) = (Vec::new(), Vec::new());
        decode(&s.counts, &s.payload, &mut ids, &mut scores).unwrap();
        assert_eq!(
            (ids.as_slice(), scores.as_slice()),
            (&[4, 8, 3][..], &[0.5, 2.0, 7.0][..])
        );
        let err = decode(
            &s.counts,
            &s.payload[..s.payload.len() - 1],
            &mut ids,
            &mut scores,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("scores payload"), "{err}");
        let mut wide = s.counts.clone();
        wide[1].dim = 16;
        let err = decode(&wide, &s.payload, &mut ids, &mut scores)
            .unwrap_err()
            .to_string();
        assert!(err.contains("table 2 has dim 16"), "{err}");
        assert_eq!(
            request(5, ScoreMode::Add, s.counts.clone()).kind(),
            crate::wire::message::RequestKind::Score
        );
    }
}
