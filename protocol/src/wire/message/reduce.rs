//! `Reduce`: a sum of one vector over the trainers of a job, through the parameter servers (the all-reduce of
//! the hybrid dense mode: dense gradients synchronous, embedding rows asynchronous).
//!
//! Every trainer `rank` of `world` sends, for its step `step` of reduce group `group`, its slice of a vector
//! (f32 LE in the payload) weighted by its `samples`; the server adds the contributions of one `(group, step)`
//! and answers each caller, once every rank expected has contributed, with the sum, the total samples and who
//! contributed. A trainer splits its vector across the servers (each server sums one slice), so the exchange
//! costs one round trip in parallel to every server.
//!
//! - A rank may send the same step twice (a retry after a transient failure): the second contribution is not
//!   added again; it gets the same answer.
//! - At `timeout_ms` after the first contribution, the server finalizes the step with whoever arrived and
//!   names the `missing` ranks; a late contribution to a finalized step gets that same answer (so every trainer
//!   applies the same sum and their dense replicas stay identical) and is listed as missing. Ranks missing at
//!   a finalized step are not waited for at the next steps of the group until they contribute again (a dead
//!   trainer costs one timeout, not one per step). Whether a trainer goes on without the missing ranks is its
//!   own choice (`trainer --on-missing-trainer`).
//! - A trainer out of data keeps contributing (zero samples, a zero vector) with `done` set, so every replica
//!   takes the same steps; the answer's `all_done` tells when every contributor is done.

use serde::{Deserialize, Serialize};

use crate::compression::codec::{self, Encoding};
use crate::error::ProtocolError;
use crate::wire::layout::check_len;
use crate::wire::message::Request;

/// Longest `timeout_ms` a server accepts (below the client's request timeout, so a waiting reduce is answered
/// before its request times out).
pub const MAX_TIMEOUT_MS: u32 = 25_000;

/// Largest vector slice per request, in f32 values (the dense parameters of the models here are far smaller).
pub const MAX_VALUES: u32 = 64 << 20;

/// A trainer's contribution to one step of a reduce group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReduceHeader {
    /// The job's reduce group: trainers of one job send the same number, another job another.
    pub group: u64,
    /// The step; contributions of one step are added.
    pub step: u64,
    /// The sender's rank, `< world`.
    pub rank: u32,
    /// Trainers in the group (the same for every contribution of the group).
    pub world: u32,
    /// Samples behind the contribution (the vector is a sum over them, not a mean).
    pub samples: u64,
    /// The sender has no more data: it contributes zeros until every rank is done.
    pub done: bool,
    /// Milliseconds after the step's first contribution at which it is finalized without the missing ranks
    /// (1..=[`MAX_TIMEOUT_MS`]).
    pub timeout_ms: u32,
    /// Values in the payload (the same for every contribution of a step).
    pub len: u32,
    /// How the values travel, both ways: [`Encoding::F32`] or [`Encoding::Bf16`] (half the bytes; the server
    /// sums in f32).
    pub encoding: Encoding,
}

/// The answer to a reduce: the sum over the contributors (payload: `len` f32 LE).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReducedHeader {
    /// Samples over the contributors.
    pub samples: u64,
    /// Ranks whose contribution is in the sum.
    pub contributors: u32,
    /// Ranks of the group not in the sum (finalized at the deadline, or not waited for), ascending.
    pub missing: Vec<u32>,
    /// Every contributor was done (and none missing): the group's last step.
    pub all_done: bool,
}

/// The request of `header`, whose payload is [`encode_values`] of its values.
pub fn request(header: ReduceHeader) -> Request {
    Request::Reduce { header }
}

/// Appends `values` in `encoding` (f32 LE or bf16 LE).
pub fn encode_values(values: &[f32], encoding: Encoding, out: &mut Vec<u8>) {
    codec::encode(values, encoding, out)
}

/// Decodes `len` values in `encoding` of `payload` into `out` (resized); refuses another length.
pub fn decode_values(
    what: &str,
    payload: &[u8],
    len: u32,
    encoding: Encoding,
    out: &mut Vec<f32>,
) -> Result<(), ProtocolError> {
    check_len(
        what,
        payload.len(),
        len as usize * encoding.bytes_per_element(),
    )?;
    out.clear();
    out.resize(len as usize, 0.0);
    codec::decode(payload, encoding, out)
}

/// Decodes `out.len()` values in `encoding` of `payload` into `out`; refuses another length.
pub fn decode_values_into(
    what: &str,
    payload: &[u8],
    encoding: Encoding,
    out: &mut [f32],
) -> Result<(), ProtocolError> {
    check_len(
        what,
        payload.len(),
        out.len() * encoding.bytes_per_element(),
    )?;
    codec::decode(payload, encoding, out)
}

/// Checks a header's fields against each other and the limits; the message names the offending value.
pub fn validate(h: &ReduceHeader) -> Result<(), ProtocolError> {
    let bad = |m: String| Err(ProtocolError::BadPayload(format!("reduce: {m}")));
    if h.world == 0 || h.rank >= h.world {
        return bad(format!("rank {} of world {}", h.rank, h.world));
    }
    if h.world > 4096 {
        return bad(format!("world {} exceeds 4096 trainers", h.world));
    }
    if h.timeout_ms == 0 || h.timeout_ms > MAX_TIMEOUT_MS {
        return bad(format!(
            "timeout_ms {} outside 1..={MAX_TIMEOUT_MS}",
            h.timeout_ms
        ));
    }
    if !matches!(h.encoding, Encoding::F32 | Encoding::Bf16) {
        return bad(format!("encoding {} (f32 or bf16)", h.encoding));
    }
    if h.len > MAX_VALUES {
        return bad(format!("{} values exceed the cap of {MAX_VALUES}", h.len));
    }
    Ok(())
}

/// Splits `n` values into `parts` contiguous slices as even as possible: the ranges, in order (slice `i` goes
/// to server `i`).
pub fn slices(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.max(1);
    let (base, extra) = (n / parts, n % parts);
    let mut at = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = at..at + len;
            at += len;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> ReduceHeader {
        ReduceHeader {
            group: 9,
            step: 3,
            rank: 1,
            world: 2,
            samples: 128,
            done: false,
            timeout_ms: 1000,
            len: 3,
            encoding: Encoding::F32,
        }
    }

    #[test]
    fn header_and_values_round_trip_through_a_frame() {
        let mut payload = Vec::new();
        encode_values(&[1.5, -2.0, f32::MIN_POSITIVE], Encoding::F32, &mut payload);
        let req = request(header());
        let buf = crate::wire::frame::encode_frame(&req, &payload).unwrap();
        let (back, body, _) = crate::wire::frame::decode_frame::<Request>(&buf, 1 << 20)
            .unwrap()
            .unwrap();
        let body = &buf[body];
        assert_eq!(back, req);
        let mut values = Vec::new();
        decode_values("reduce", body, 3, Encoding::F32, &mut values).unwrap();
        assert_eq!(values, [1.5, -2.0, f32::MIN_POSITIVE]);
        let err = decode_values("reduce", &body[..11], 3, Encoding::F32, &mut values).unwrap_err();
        assert!(err.to_string().contains("11 bytes, expected 12"), "{err}");
        let mut half = Vec::new();
        encode_values(&[1.5, -2.0, 3.0], Encoding::Bf16, &mut half);
        assert_eq!(half.len(), 6);
        decode_values("reduce", &half, 3, Encoding::Bf16, &mut values).unwrap();
        assert_eq!(values, [1.5, -2.0, 3.0]);
    }

    #[test]
    fn validation_names_the_bad_field() {
        assert!(validate(&header()).is_ok());
        let cases = [
            (
                ReduceHeader {
                    rank: 2,
                    ..header()
                },
                "rank 2 of world 2",
            ),
            (
                ReduceHeader {
                    world: 0,
                    rank: 0,
                    ..header()
                },
                "world 0",
            ),
            (
                ReduceHeader {
                    timeout_ms: 0,
                    ..header()
                },
                "timeout_ms 0",
            ),
            (
                ReduceHeader {
                    timeout_ms: 99_999,
                    ..header()
                },
                "timeout_ms 99999",
            ),
            (
                ReduceHeader {
                    len: u32::MAX,
                    ..header()
                },
                "values exceed",
            ),
            (
                ReduceHeader {
                    encoding: Encoding::Int8,
                    ..header()
                },
                "encoding int8",
            ),
        ];
        for (h, needle) in cases {
            let err = validate(&h).unwrap_err().to_string();
            assert!(err.contains(needle), "{err} lacks {needle}");
        }
    }

    #[test]
    fn slices_cover_every_value_once() {
        for (n, parts) in [(0, 2), (1, 2), (10, 3), (10, 1), (7, 7), (5, 9)] {
            let s = slices(n, parts);
            assert_eq!(s.len(), parts);
            assert_eq!(s.first().unwrap().start, 0);
            assert_eq!(s.last().unwrap().end, n);
            assert!(s.windows(2).all(|w| w[0].end == w[1].start));
            let lens: Vec<usize> = s.iter().map(|r| r.len()).collect();
            assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
        }
    }
}
