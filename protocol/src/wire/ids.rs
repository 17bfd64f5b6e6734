//! Id sections on the wire: ascending ids, delta + LEB128 varint encoded, one section per table.
//!
//! A section is one coding byte ([`IdCoding`]) followed by `count` varints (the count comes from the request
//! header): the first value, then the difference to the previous value. Values must be strictly ascending, so
//! every difference after the first is at least 1; decoding refuses a zero difference (a duplicate id), a sum
//! past `u64::MAX` (ids out of order: an encoder given descending ids wraps around), a varint longer than 10
//! bytes or with bits beyond 64, a non-minimal varint, and a section cut short, each with its own
//! [`IdError`]. Duplicate ids are refused rather than summed: the trainer deduplicates every batch, and a
//! server that summed them would hide a client bug.
//!
//! # Why two codings
//! Ids in this system are *mixed* keys: the trainer's feature ids and ps-bench's ids are the splitmix64
//! finalizer ([`crate::routing::mix64`], a bijection) of a structured key (feature or table in the high bits, a
//! token or rank in the low bits), so that they spread evenly over shards. Sorted random 64-bit values differ
//! by about `2^64 / n`, which costs 8 varint bytes each: delta coding alone saves nothing on them. The
//! [`IdCoding::Unmixed`] coding sends the finalizer's *pre-image* instead (sorted by it), which keeps the key's
//! structure, so differences are small; the server applies the finalizer again. It is lossless for any `u64`
//! (every value has a pre-image), so it is never worse than [`IdCoding::Plain`] by more than rounding. Plain
//! coding is there for hand-written requests and tests, whose ids are small already.

use crate::error::ProtocolError;
use crate::routing::mix64;

/// Longest LEB128 encoding of a `u64`.
pub const MAX_VARINT_BYTES: usize = 10;

/// How the values of an id section relate to the ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IdCoding {
    /// The values are the ids.
    Plain = 0,
    /// The values are [`wire_key`]s of the ids (pre-images under the splitmix64 finalizer).
    Unmixed = 1,
}

impl IdCoding {
    /// The value on the wire of `id`.
    #[inline]
    pub fn key(self, id: u64) -> u64 {
        match self {
            IdCoding::Plain => id,
            IdCoding::Unmixed => wire_key(id),
        }
    }

    /// The id of a value on the wire.
    #[inline]
    pub fn id(self, key: u64) -> u64 {
        match self {
            IdCoding::Plain => key,
            IdCoding::Unmixed => mix64(key),
        }
    }

    /// The coding a section's first byte names.
    pub fn from_byte(b: u8) -> Result<IdCoding, IdError> {
        match b {
            0 => Ok(IdCoding::Plain),
            1 => Ok(IdCoding::Unmixed),
            other => Err(IdError::UnknownCoding(other)),
        }
    }
}

/// Malformed id sections. Messages name the offending position and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The section's coding byte is not an [`IdCoding`].
    #[error("unknown id coding {0}")]
    UnknownCoding(u8),
    /// The section ended before `count` ids were read.
    #[error("id section truncated: {read} of {count} ids read")]
    Truncated {
        /// Ids read.
        read: usize,
        /// Ids the header announced.
        count: usize,
    },
    /// A varint is longer than 10 bytes, carries bits beyond 64, or is not minimal (ends in a zero byte).
    #[error("malformed varint at id {index} (byte offset {offset})")]
    BadVarint {
        /// Position of the id in its section.
        index: usize,
        /// Byte offset of the varint in the section.
        offset: usize,
    },
    /// A difference of zero: the same id twice.
    #[error("duplicate id {id} at position {index}")]
    Duplicate {
        /// Position of the second occurrence.
        index: usize,
        /// The id.
        id: u64,
    },
    /// A difference that carries the value past `u64::MAX`: the sender's ids were not ascending.
    #[error("ids not ascending at position {index}: after value {prev}, a difference of {delta} overflows u64")]
    NotAscending {
        /// Position of the id.
        index: usize,
        /// The previous value on the wire.
        prev: u64,
        /// The difference read.
        delta: u64,
    },
    /// Bytes left after the last section.
    #[error("{0} trailing bytes after the id sections")]
    Trailing(usize),
}

impl From<IdError> for ProtocolError {
    fn from(e: IdError) -> ProtocolError {
        ProtocolError::BadPayload(e.to_string())
    }
}

/// The inverse of the splitmix64 finalizer ([`crate::routing::mix64`]): `mix64(wire_key(id)) == id`.
#[inline]
pub fn wire_key(id: u64) -> u64 {
    base::hash::unmix64(id)
}

/// Appends `v` as an LEB128 varint.
#[inline]
pub fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one varint at `*at`, advancing it. `None` if the bytes end first; `Err(())` if it is malformed.
#[inline]
fn get_varint(bytes: &[u8], at: &mut usize) -> Option<Result<u64, ()>> {
    let mut v = 0u64;
    for i in 0..MAX_VARINT_BYTES {
        let b = *bytes.get(*at + i)?;
        let part = (b & 0x7f) as u64;
        if i == 9 && b > 1 {
            return Some(Err(()));
        }
        v |= part << (7 * i);
        if b & 0x80 == 0 {
            if b == 0 && i > 0 {
                return Some(Err(()));
            }
            *at += i + 1;
            return Some(Ok(v));
        }
    }
    Some(Err(()))
}

/// Appends one [`IdCoding::Plain`] section of `values`, which must be strictly ascending (values out of order
/// are encoded anyway, and the receiver refuses the section).
pub fn put_values(values: &[u64], out: &mut Vec<u8>) {
    out.reserve(1 + values.len() * 4);
    out.push(IdCoding::Plain as u8);
    let mut prev = 0u64;
    for &v in values {
        put_varint(v.wrapping_sub(prev), out);
        prev = v;
    }
}

/// Appends one section of `ids`, which must be strictly ascending by `coding.key(id)` (see [`sort_for_wire`];
/// ids out of order are encoded anyway, and the receiver refuses the section).
pub fn put_ids(coding: IdCoding, ids: &[u64], out: &mut Vec<u8>) {
    out.reserve(1 + ids.len() * 4);
    out.push(coding as u8);
    let mut prev = 0u64;
    for &id in ids {
        let k = coding.key(id);
        put_varint(k.wrapping_sub(prev), out);
        prev = k;
    }
}

/// Sorts `ids` into the order [`put_ids`] needs for `coding`.
pub fn sort_for_wire(coding: IdCoding, ids: &mut [u64]) {
    match coding {
        IdCoding::Plain => ids.sort_unstable(),
        IdCoding::Unmixed => ids.sort_unstable_by_key(|&id| wire_key(id)),
    }
}

/// Reads one section of `count` ids at the start of `bytes`, appending the ids (not the wire values) to `out`.
/// Returns the bytes consumed. On error `out` may hold part of the section.
pub fn get_ids(bytes: &[u8], count: usize, out: &mut Vec<u64>) -> Result<usize, IdError> {
    let Some(&first) = bytes.first() else {
        return Err(IdError::Truncated { read: 0, count });
    };
    let coding = IdCoding::from_byte(first)?;
    // Every id takes at least one byte: a count beyond the bytes left is refused before reserving.
    if count > bytes.len() - 1 {
        return Err(IdError::Truncated {
            read: bytes.len() - 1,
            count,
        });
    }
    out.reserve(count);
    let mut at = 1;
    let mut prev = 0u64;
    for index in 0..count {
        let offset = at;
        let delta = match get_varint(bytes, &mut at) {
            None => return Err(IdError::Truncated { read: index, count }),
            Some(Err(())) => return Err(IdError::BadVarint { index, offset }),
            Some(Ok(d)) => d,
        };
        let v = if index == 0 {
            delta
        } else if delta == 0 {
            return Err(IdError::Duplicate {
                index,
                id: coding.id(prev),
            });
        } else {
            prev.checked_add(delta)
                .ok_or(IdError::NotAscending { index, prev, delta })?
        };
        out.push(coding.id(v));
        prev = v;
    }
    Ok(at)
}

/// Reads one section of `count` strictly ascending values written by [`put_values`], as [`get_ids`] does.
/// Used for the indices of top-k gradient chunks ([`crate::compression::topk`]).
pub fn get_values(bytes: &[u8], count: usize, out: &mut Vec<u64>) -> Result<usize, IdError> {
    match bytes.first() {
        Some(&b) if b != IdCoding::Plain as u8 => Err(IdError::UnknownCoding(b)),
        _ => get_ids(bytes, count, out),
    }
}

/// Reads one section per entry of `counts` from the start of `bytes`, appending all ids to `out` (cleared
/// first). Returns the bytes consumed.
pub fn get_sections(
    bytes: &[u8],
    counts: impl IntoIterator<Item = usize>,
    out: &mut Vec<u64>,
) -> Result<usize, IdError> {
    out.clear();
    let mut at = 0;
    for count in counts {
        at += get_ids(&bytes[at..], count, out)?;
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(coding: IdCoding, ids: &[u64]) -> (Vec<u64>, usize) {
        let mut sorted = ids.to_vec();
        sort_for_wire(coding, &mut sorted);
        sorted.dedup();
        let mut bytes = Vec::new();
        put_ids(coding, &sorted, &mut bytes);
        let mut back = Vec::new();
        let used = get_ids(&bytes, sorted.len(), &mut back).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(back, sorted);
        (sorted, bytes.len())
    }

    proptest! {
        #[test]
        fn sorted_id_sets_round_trip(ids in proptest::collection::vec(any::<u64>(), 0..200), extremes in 0u8..4) {
            let mut ids = ids;
            if extremes & 1 != 0 { ids.push(u64::MAX); }
            if extremes & 2 != 0 { ids.push(0); }
            for coding in [IdCoding::Plain, IdCoding::Unmixed] {
                let (sorted, _) = round_trip(coding, &ids);
                prop_assert!(sorted.len() <= ids.len());
            }
        }

        #[test]
        fn wire_key_inverts_mix64(id in any::<u64>()) {
            prop_assert_eq!(mix64(wire_key(id)), id);
            prop_assert_eq!(wire_key(mix64(id)), id);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), count in 0usize..40) {
            let mut out = Vec::new();
            let _ = get_ids(&bytes, count, &mut out);
        }
    }

    #[test]
    fn extremes_round_trip() {
        for ids in [
            vec![0u64, u64::MAX],
            vec![u64::MAX],
            vec![u64::MAX - 1, u64::MAX],
            vec![],
        ] {
            round_trip(IdCoding::Plain, &ids);
            round_trip(IdCoding::Unmixed, &ids);
        }
        // u64::MAX takes the longest varint.
        let mut b = Vec::new();
        put_varint(u64::MAX, &mut b);
        assert_eq!(b.len(), MAX_VARINT_BYTES);
    }

    #[test]
    fn unmixed_keys_of_mixed_ranks_are_small() {
        // Ids made like ps-bench's (mix64 of table << 40 | rank): 1000 consecutive ranks take one to two
        // bytes each instead of eight or nine.
        let ids: Vec<u64> = (1..=1000u64).map(|r| mix64(3 << 40 | r)).collect();
        let (_, unmixed) = round_trip(IdCoding::Unmixed, &ids);
        let (_, plain) = round_trip(IdCoding::Plain, &ids);
        assert!(unmixed <= 1 + 6 + 1000, "{unmixed}");
        assert!(plain >= 7000, "{plain}");
    }

    #[test]
    fn malformed_sections_are_named() {
        let mut out = Vec::new();
        // Duplicate: delta 0 after the first id.
        let err = get_ids(&[0, 5, 0], 2, &mut out).unwrap_err();
        assert_eq!(err, IdError::Duplicate { index: 1, id: 5 });
        assert!(err.to_string().contains("duplicate id 5"), "{err}");
        // Descending ids wrap around and overflow.
        let mut b = Vec::new();
        put_varint(10, &mut b);
        put_varint(9u64.wrapping_sub(10), &mut b);
        b.insert(0, 0);
        let err = get_ids(&b, 2, &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                IdError::NotAscending {
                    index: 1,
                    prev: 10,
                    ..
                }
            ),
            "{err}"
        );
        // Truncated: the count promises more ids than there are.
        let err = get_ids(&[0, 1, 1], 3, &mut out).unwrap_err();
        assert_eq!(err, IdError::Truncated { read: 2, count: 3 });
        let err = get_ids(&[0, 0x80], 1, &mut out).unwrap_err();
        assert_eq!(err, IdError::Truncated { read: 0, count: 1 });
        assert_eq!(
            get_ids(&[], 0, &mut out).unwrap_err(),
            IdError::Truncated { read: 0, count: 0 }
        );
        // Overlong: 11 bytes, bits beyond 64, non-minimal.
        let mut long = vec![0u8];
        long.extend([0xff; 10]);
        long.push(1);
        assert!(matches!(
            get_ids(&long, 1, &mut out),
            Err(IdError::BadVarint {
                index: 0,
                offset: 1
            })
        ));
        let mut high = vec![0u8];
        high.extend([0xff; 9]);
        high.push(2);
        assert!(matches!(
            get_ids(&high, 1, &mut out),
            Err(IdError::BadVarint { .. })
        ));
        assert!(matches!(
            get_ids(&[0, 0x81, 0x00], 1, &mut out),
            Err(IdError::BadVarint { .. })
        ));
        // Unknown coding byte.
        assert_eq!(
            get_ids(&[7, 1], 1, &mut out).unwrap_err(),
            IdError::UnknownCoding(7)
        );
    }

    #[test]
    fn sections_read_back_to_back() {
        let mut b = Vec::new();
        put_ids(IdCoding::Plain, &[1, 2, 300], &mut b);
        put_ids(IdCoding::Unmixed, &[], &mut b);
        let mut t = vec![mix64(9), mix64(7), mix64(8)];
        sort_for_wire(IdCoding::Unmixed, &mut t);
        put_ids(IdCoding::Unmixed, &t, &mut b);
        let mut out = vec![99];
        let used = get_sections(&b, [3, 0, 3], &mut out).unwrap();
        assert_eq!(used, b.len());
        assert_eq!(out, [1, 2, 300, mix64(7), mix64(8), mix64(9)]);
    }
}
