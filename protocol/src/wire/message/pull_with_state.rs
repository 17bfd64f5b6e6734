//! `PullWithState`: read rows and their optimizer state, so that a trainer with pushes in flight can replay
//! its own unacknowledged updates on the pulled rows with the state the server applies them with (e.g.
//! row-wise Adagrad's accumulator). The request is a pull's ([`super::pull`]: id sections); the
//! `PulledWithState` reply's payload is the rows of every table in the request's [`Encoding`], then
//! `count x state_lens[i]` f32 (little-endian) of state for each table `i` of the header, in the same order.
//!
//! | side | call |
//! | --- | --- |
//! | client, request | [`super::pull::IdSections`], then [`request`] |
//! | server | [`super::pull::decode`]; rows, then [`put_state`] per row |
//! | client, reply | [`split_reply`], then [`get_state_at`] per table |

use crate::compression::codec::{decode_rows_at, Encoding};
use crate::error::ProtocolError;
use crate::wire::layout::{check_len, PayloadLayout, TableCount};
use crate::wire::message::Request;

/// The header of a pull with state of `counts`' tables, rows answered in `encoding`.
pub fn request(epoch: u64, encoding: Encoding, counts: Vec<TableCount>) -> Request {
    Request::PullWithState {
        epoch,
        encoding,
        tables: counts,
    }
}

/// Appends one row's optimizer state (server side, after every row of the reply).
pub fn put_state(state: &[f32], out: &mut Vec<u8>) {
    out.extend(state.iter().flat_map(|v| v.to_le_bytes()));
}

/// Reads the state of `positions.len()` rows, `len` f32 each (`bytes` holds exactly them), into `out`
/// (`[rows x len]`), row `k`'s at row `positions[k]`: straight into a batch's unique rows, as their rows.
pub fn get_state_at(
    bytes: &[u8],
    len: usize,
    positions: &[u32],
    out: &mut [f32],
) -> Result<(), ProtocolError> {
    decode_rows_at(bytes, len, Encoding::F32, positions, out)
}

/// Splits a reply's payload into its rows and its state, after checking its length against the request's
/// `tables`, `encoding` and the reply's `state_lens`.
pub fn split_reply<'a>(
    tables: &[TableCount],
    encoding: Encoding,
    state_lens: &[u32],
    payload: &'a [u8],
) -> Result<(&'a [u8], &'a [u8]), ProtocolError> {
    let rows = PayloadLayout::of(tables)?.pull_response_bytes(encoding);
    let state = PayloadLayout::state_bytes(tables, state_lens)?;
    check_len(
        "pull response with state",
        payload.len(),
        rows.saturating_add(state),
    )?;
    Ok(payload.split_at(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_splits_into_rows_and_state() {
        let tables = [
            TableCount {
                table: 0,
                count: 2,
                dim: 2,
            },
            TableCount {
                table: 1,
                count: 1,
                dim: 2,
            },
        ];
        let mut payload = vec![0u8; 3 * 2 * 4];
        put_state(&[1.5], &mut payload);
        put_state(&[2.5], &mut payload);
        let (rows, state) = split_reply(&tables, Encoding::F32, &[1, 0], &payload).unwrap();
        assert_eq!((rows.len(), state.len()), (24, 8));
        let mut back = [0.0; 2];
        get_state_at(state, 1, &[1, 0], &mut back).unwrap();
        assert_eq!(back, [2.5, 1.5]);
        assert!(get_state_at(state, 1, &[0, 2], &mut back).is_err());
        assert!(get_state_at(&state[1..], 1, &[1, 0], &mut back).is_err());
        assert!(split_reply(&tables, Encoding::F32, &[1, 1], &payload).is_err());
        assert!(split_reply(&tables, Encoding::F32, &[1], &payload).is_err());
    }
}
