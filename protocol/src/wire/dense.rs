//! The dense table: how a model's dense parameters travel as rows of one reserved table, through the same
//! `Pull` and `Push` requests as embedding rows ([`super::pull`], [`super::push`]). The servers see an ordinary
//! SGD table; the conventions below are shared by every trainer of a job (the synchronization itself, which
//! sums parameter deltas, is `trainer::step::dense_sync`).
//!
//! - Table [`DENSE_TABLE`] ([`table_config`]): rows of [`DENSE_ROW_DIM`] f32 values, SGD with learning rate 1,
//!   rows starting at zero, so a push of `-delta` adds `delta`.
//! - Parameter row `i` has id `i`; each trainer rank also has one push-counter row per server
//!   ([`counter_id`], ids from [`COUNTER_BASE`]), pushed with `-1` in its first value by every push.
//! - A request to one server names its rows then its counter row, ids ascending, in one plain id section
//!   ([`ids_payload`]); a pull's reply is those rows in f32 ([`decode_rows`]); a push carries the negated
//!   deltas of the rows then the counter's `-1` ([`put_delta_row`], [`put_counter_row`]).
//!
//! | side | call |
//! | --- | --- |
//! | trainer, pull | [`ids_payload`], [`counts`], then [`super::pull::request`]; [`decode_rows`] on the reply |
//! | trainer, push | [`ids_payload`], [`put_delta_row`] per row, [`put_counter_row`], [`counts`] |
//! | server | nothing of its own: an ordinary table |

use crate::compression::codec::{self, Encoding};
use crate::error::ProtocolError;
use crate::routing::ShardMap;
use crate::wire::ids::IdCoding;
use crate::wire::layout::{check_len, TableCount};
use crate::wire::message::pull::IdSections;
use embedding::TableConfig;

/// The reserved table id of the dense parameters (embedding tables are numbered from 0 by feature).
pub const DENSE_TABLE: u32 = 1_000_000;

/// Values per dense row.
pub const DENSE_ROW_DIM: usize = 64;

/// First id of the push-counter rows (above every parameter row).
pub const COUNTER_BASE: u64 = 1 << 32;

/// The dense table's config: SGD with learning rate 1 (the servers add the pushed deltas), rows starting at
/// zero.
pub fn table_config() -> TableConfig {
    // Seed 0 as before `TableConfig::counter` existed: servers (and checkpoints) holding the table check the
    // config matches.
    TableConfig {
        name: "dense".into(),
        seed: 0,
        ..TableConfig::counter(DENSE_TABLE, DENSE_ROW_DIM)
    }
}

/// The id of the counter row of trainer `rank` that lives on `server` under `map`: the first id at or above
/// `COUNTER_BASE + rank * 4096` that routes there.
pub fn counter_id(map: &ShardMap, rank: usize, server: usize) -> u64 {
    let base = COUNTER_BASE + rank as u64 * 4096;
    (base..)
        .find(|&id| map.server_of(id) as usize == server)
        .expect("some id routes to every server")
}

/// The table counts of a request of `rows` dense rows (the counter row included).
pub fn counts(rows: usize) -> Vec<TableCount> {
    vec![TableCount {
        table: DENSE_TABLE,
        count: rows as u32,
        dim: DENSE_ROW_DIM as u32,
    }]
}

/// The id section of dense rows `ids` (ascending, the counter row last), as pulls and pushes of the dense
/// table start with.
pub fn ids_payload(ids: &[u64]) -> Vec<u8> {
    let mut sections = IdSections::new();
    sections.table(DENSE_TABLE, DENSE_ROW_DIM as u32, IdCoding::Plain, ids);
    sections.payload
}

/// Appends one parameter row of a push: `-delta` in f32 (`delta.len() == DENSE_ROW_DIM`).
pub fn put_delta_row(delta: &[f32], out: &mut Vec<u8>) {
    let mut neg = [0.0f32; DENSE_ROW_DIM];
    for (n, d) in neg.iter_mut().zip(delta) {
        *n = -d;
    }
    codec::encode(&neg, Encoding::F32, out);
}

/// Appends the counter row of a push: `-1` then zeros, so the servers' counter counts the pushes it holds.
pub fn put_counter_row(out: &mut Vec<u8>) {
    let mut counter = [0.0f32; DENSE_ROW_DIM];
    counter[0] = -1.0;
    codec::encode(&counter, Encoding::F32, out);
}

/// Decodes a pull's reply of `rows` dense rows (the counter row last) into `out`, checking its length first.
pub fn decode_rows(bytes: &[u8], rows: usize, out: &mut Vec<f32>) -> Result<(), ProtocolError> {
    let n = rows * DENSE_ROW_DIM;
    let expected = Encoding::F32.rows_bytes(rows, n).unwrap_or(usize::MAX);
    check_len("dense rows", bytes.len(), expected)?;
    out.resize(n, 0.0);
    codec::decode(bytes, Encoding::F32, out)
}

/// The number of pushes a counter row's first value says the pull held (0 for a value that is not a count).
pub fn pushes_held(counter_value: f32) -> u64 {
    if counter_value.is_finite() && counter_value > 0.0 {
        counter_value.round() as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_round_trips_and_a_short_reply_is_named() {
        let ids = [0u64, 5, counter_id(&ShardMap::new(2), 1, 0)];
        let mut payload = ids_payload(&ids);
        let ids_len = payload.len();
        let delta: Vec<f32> = (0..DENSE_ROW_DIM).map(|i| i as f32).collect();
        put_delta_row(&delta, &mut payload);
        put_delta_row(&delta, &mut payload);
        put_counter_row(&mut payload);
        let mut rows = Vec::new();
        decode_rows(&payload[ids_len..], 3, &mut rows).unwrap();
        assert_eq!(rows[1], -1.0);
        assert_eq!(rows[2 * DENSE_ROW_DIM], -1.0);
        assert_eq!(pushes_held(-rows[2 * DENSE_ROW_DIM] * 3.0), 3);
        assert_eq!(pushes_held(f32::NAN), 0);
        let err = decode_rows(&payload[ids_len + 4..], 3, &mut rows).unwrap_err();
        assert!(err.to_string().contains("dense rows payload of"), "{err}");
    }

    #[test]
    fn counter_rows_route_to_their_server_and_differ_per_rank() {
        let map = ShardMap::new(4);
        let ids: Vec<u64> = (0..3)
            .flat_map(|r| (0..4).map(move |s| (r, s)))
            .map(|(r, s)| {
                let id = counter_id(&map, r, s);
                assert_eq!(map.server_of(id) as usize, s);
                assert!(id >= COUNTER_BASE);
                id
            })
            .collect();
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
    }
}
