//! Hand-written formatting of Criteo lines and oracle probabilities into a byte buffer: no `format!`, no
//! allocation per field.
//!
//! A line is `label \t I1 .. I13 \t C1 .. C26 \n`: 40 fields, integers in decimal, categoricals as 8
//! lowercase hex digits, a missing field as the empty string (Criteo Kaggle `train.txt` layout); a
//! multi-hot field is its tokens joined by `|`.

use super::row::{token, Row};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `x` in decimal.
#[inline]
pub fn push_i64(buf: &mut Vec<u8>, x: i64) {
    if x < 0 {
        buf.push(b'-');
    }
    push_u64(buf, x.unsigned_abs());
}

/// Appends `x` in decimal.
#[inline]
pub fn push_u64(buf: &mut Vec<u8>, mut x: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            break;
        }
    }
    buf.extend_from_slice(&tmp[i..]);
}

/// Appends `x` as exactly 8 lowercase hex digits.
#[inline]
pub fn push_hex8(buf: &mut Vec<u8>, x: u32) {
    let mut out = [0u8; 8];
    for (i, o) in out.iter_mut().enumerate() {
        *o = HEX[((x >> (28 - 4 * i)) & 0xf) as usize];
    }
    buf.extend_from_slice(&out);
}

/// Appends one Criteo line (with its `\n`), categoricals written as [`token`]s.
#[inline]
pub fn push_row(buf: &mut Vec<u8>, label: bool, row: &Row) {
    push_row_with(buf, label, row, token);
}

/// Appends one Criteo line (with its `\n`), rank `r` of column `j` written as `token(j, r)`.
#[inline]
pub fn push_row_with(buf: &mut Vec<u8>, label: bool, row: &Row, token: impl Fn(usize, u64) -> u32) {
    buf.push(if label { b'1' } else { b'0' });
    for x in &row.ints {
        buf.push(b'\t');
        if let Some(x) = *x {
            push_i64(buf, x);
        }
    }
    for (j, rank) in row.cats.iter().enumerate() {
        buf.push(b'\t');
        if let Some(bag) = row.bag(j) {
            for (i, &rank) in bag.iter().enumerate() {
                if i > 0 {
                    buf.push(b'|');
                }
                push_hex8(buf, token(j, rank));
            }
        } else if let Some(rank) = *rank {
            push_hex8(buf, token(j, rank));
        }
    }
    buf.push(b'\n');
}

/// Appends `p` as `0.dddddd\n`, rounded to six decimals and clamped to `[0.000001, 0.999999]` so that every
/// written probability is strictly inside (0, 1).
#[inline]
pub fn push_probability(buf: &mut Vec<u8>, p: f64) {
    let micros = (p * 1e6).round().clamp(1.0, 999_999.0) as u32;
    let mut out = *b"0.000000\n";
    let mut m = micros;
    for o in out[2..8].iter_mut().rev() {
        *o = b'0' + (m % 10) as u8;
        m /= 10;
    }
    buf.extend_from_slice(&out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn probability_formatting() {
        let mut buf = Vec::new();
        for p in [0.123456, 0.0, 1.0, 0.5, 0.0000004, 0.9999996] {
            push_probability(&mut buf, p);
        }
        assert_eq!(
            std::str::from_utf8(&buf).unwrap(),
            "0.123456\n0.000001\n0.999999\n0.500000\n0.000001\n0.999999\n"
        );
    }

    #[test]
    fn row_with_missing_fields_has_40_fields() {
        let mut row = Row::default();
        row.ints[1] = Some(-2);
        row.ints[4] = Some(12345);
        row.cats[0] = Some(1);
        let mut buf = Vec::new();
        push_row(&mut buf, true, &row);
        let line = std::str::from_utf8(&buf).unwrap();
        assert!(line.starts_with("1\t\t-2\t\t\t12345\t"));
        assert!(line.ends_with("\t\n"));
        let fields: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
        assert_eq!(fields.len(), 40);
        assert_eq!(fields[14], format!("{:08x}", token(0, 1)));
    }

    #[test]
    fn bags_are_joined_by_bars() {
        let mut row = Row::default();
        row.cats[2] = Some(5);
        row.bag_ranks = vec![5, 6, 5];
        row.bag_spans[2] = (0, 3);
        let mut buf = Vec::new();
        push_row(&mut buf, false, &row);
        let line = std::str::from_utf8(&buf).unwrap();
        let fields: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
        assert_eq!(fields.len(), 40);
        let t = |r| format!("{:08x}", token(2, r));
        assert_eq!(fields[16], format!("{}|{}|{}", t(5), t(6), t(5)));
    }

    proptest! {
        #[test]
        fn integers_match_std(x: i64) {
            let mut buf = Vec::new();
            push_i64(&mut buf, x);
            prop_assert_eq!(String::from_utf8(buf).unwrap(), x.to_string());
        }

        #[test]
        fn hex_matches_std(x: u32) {
            let mut buf = Vec::new();
            push_hex8(&mut buf, x);
            prop_assert_eq!(String::from_utf8(buf).unwrap(), format!("{x:08x}"));
        }
    }
}
