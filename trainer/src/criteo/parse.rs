//! The Criteo line parser: sans-IO, on byte slices, no allocation per line.
//!
//! A line is 40 tab-separated fields: `label, I1..I13, C1..C26` (no header). What real logs contain, and what
//! this parser therefore accepts:
//! - any field may be empty (lines often start or end with a tab); an empty integer is 0, an empty
//!   categorical is the empty token;
//! - integers may be negative; the dense value is `ln(1 + max(x, 0))` (DESIGN.md, "Read");
//! - categoricals are 8 lowercase hex digits; 1 to 8 digits of either case are accepted, so a line cut in
//!   the middle of a categorical still parses;
//! - some files strip trailing empty fields: a line with fewer than 40 fields (even a lone label) is padded
//!   with empty fields and reported as [`LineKind::Padded`];
//! - a trailing `\r` (CRLF files) or `\n` is ignored; an empty line is [`LineKind::Empty`].
//!
//! Everything else (a label other than `0`/`1`, a non-integer in an I column, a non-hex or over-long
//! categorical, more than 40 fields) is a [`ParseError`] naming the column, its 1-based field number and the
//! offending text. Only the error path allocates.
//!
//! The Kaggle CSV form (`Id,Label,I1..I13,C1..C26`, with that header) is read by [`parse_csv_line`] under
//! the same rules with commas for tabs, after dropping the leading id column; [`TextFormat::detect`] tells
//! the two apart by a file's first line. Field numbers in CSV errors count as in TSV (the label is field
//! 1; the id column is not counted), so the same bad value gets the same message in either form.

use std::sync::LazyLock;

use memchr::memchr_iter;

/// Dense (integer) features per line: I1..I13.
pub const NUM_DENSE: usize = 13;
/// Sparse (categorical) features per line: C1..C26.
pub const NUM_SPARSE: usize = 26;
/// Fields per complete line: the label, then the dense, then the sparse features.
pub const NUM_FIELDS: usize = 1 + NUM_DENSE + NUM_SPARSE;

/// Error texts longer than this many bytes are cut (a corrupt line can be one huge field).
const MAX_ERROR_TEXT: usize = 64;

/// One parsed line, reused from line to line by [`parse_line`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// The click label, 0.0 or 1.0.
    pub label: f32,
    /// `ln(1 + max(x, 0))` of I1..I13 (0.0 for empty fields).
    pub dense: [f32; NUM_DENSE],
    /// The raw tokens of C1..C26 as integers; `None` for empty fields.
    pub sparse: [Option<u32>; NUM_SPARSE],
}

impl Default for Row {
    fn default() -> Self {
        Row {
            label: 0.0,
            dense: [0.0; NUM_DENSE],
            sparse: [None; NUM_SPARSE],
        }
    }
}

/// What [`parse_line`] found in a line that is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// All 40 fields were present; the row is filled.
    Full,
    /// Only `fields` (1..40) fields were present; the rest were taken as empty. The row is filled.
    Padded {
        /// How many fields the line had.
        fields: usize,
    },
    /// The line was empty (or just `\r`); the row is untouched.
    Empty,
}

/// Why a line could not be parsed. Field numbers are 1-based (the label is field 1, C1 is field 15), as
/// `cut -f` counts them; columns are named as in the Criteo description (`I1`..`I13`, `C1`..`C26`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The label was not `0` or `1` (an empty label included).
    #[error("column label (field 1): {text:?} is not 0 or 1")]
    BadLabel {
        /// The offending text (cut to 64 bytes).
        text: String,
    },
    /// An integer column held something that is not a 64-bit signed integer.
    #[error("column I{column} (field {field}): {text:?} is not a 64-bit integer")]
    BadInteger {
        /// The column number, 1..=13.
        column: usize,
        /// The field number, 2..=14.
        field: usize,
        /// The offending text (cut to 64 bytes).
        text: String,
    },
    /// A categorical column held a non-hex character.
    #[error("column C{column} (field {field}): {text:?} is not hex")]
    NotHex {
        /// The column number, 1..=26.
        column: usize,
        /// The field number, 15..=40.
        field: usize,
        /// The offending text (cut to 64 bytes).
        text: String,
    },
    /// A categorical column held more than 8 hex digits (more than 32 bits).
    #[error("column C{column} (field {field}): {text:?} has more than 8 hex digits")]
    HexTooLong {
        /// The column number, 1..=26.
        column: usize,
        /// The field number, 15..=40.
        field: usize,
        /// The offending text (cut to 64 bytes).
        text: String,
    },
    /// The line had more than 40 fields.
    #[error("{fields} fields, expected at most 40")]
    TooManyFields {
        /// How many fields the line had.
        fields: usize,
    },
}

/// The text form of an input file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    /// Tab-separated, no header: `label, I1..I13, C1..C26` (Kaggle `train.txt`, Terabyte `day_N`).
    Tsv,
    /// Kaggle CSV: a header line starting `Id,Label`, then `id, label, I1..I13, C1..C26` comma-separated.
    Csv,
}

impl TextFormat {
    /// The format of a file whose first line is `first_line`: CSV if it starts with `Id,Label`, else TSV.
    /// A CSV file's first line is its header, which is not a row.
    pub fn detect(first_line: &[u8]) -> TextFormat {
        if first_line.starts_with(b"Id,Label") {
            TextFormat::Csv
        } else {
            TextFormat::Tsv
        }
    }

    /// Parses one line of this format: [`parse_line`] or [`parse_csv_line`].
    #[inline]
    pub fn parse(self, line: &[u8], row: &mut Row) -> Result<LineKind, ParseError> {
        match self {
            TextFormat::Tsv => parse_line(line, row),
            TextFormat::Csv => parse_csv_line(line, row),
        }
    }
}

/// Parses one line (without or with its trailing `\n` / `\r\n`) into `row`.
///
/// On `Ok(Full)` and `Ok(Padded)` every field of `row` is overwritten; on `Ok(Empty)` and on errors `row`
/// holds unspecified values.
pub fn parse_line(line: &[u8], row: &mut Row) -> Result<LineKind, ParseError> {
    parse_fields(trim_line(line), b'\t', row)
}

/// Parses one Kaggle CSV data line (`id,label,I1..,C1..`, not the header) into `row`, as [`parse_line`]
/// does a TSV line: the id is skipped, whatever it holds. A line with no comma has an empty label.
pub fn parse_csv_line(line: &[u8], row: &mut Row) -> Result<LineKind, ParseError> {
    let line = trim_line(line);
    if line.is_empty() {
        return Ok(LineKind::Empty);
    }
    match memchr::memchr(b',', line) {
        Some(comma) => match parse_fields(&line[comma + 1..], b',', row)? {
            // `id,` alone: a lone empty label, which is an error as in TSV.
            LineKind::Empty => Err(ParseError::BadLabel {
                text: String::new(),
            }),
            kind => Ok(kind),
        },
        None => Err(ParseError::BadLabel {
            text: String::new(),
        }),
    }
}

/// `line` without its trailing `\n` and then `\r`.
#[inline]
fn trim_line(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Parses the `sep`-separated fields `label, I1..I13, C1..C26` of a trimmed line into `row`.
#[inline]
fn parse_fields(line: &[u8], sep: u8, row: &mut Row) -> Result<LineKind, ParseError> {
    if line.is_empty() {
        return Ok(LineKind::Empty);
    }
    let mut field = 0; // 0-based index of the field being parsed
    let mut start = 0;
    for tab in memchr_iter(sep, line).chain(std::iter::once(line.len())) {
        if field == NUM_FIELDS {
            return Err(ParseError::TooManyFields {
                fields: 1 + memchr_iter(sep, line).count(),
            });
        }
        parse_field(field, &line[start..tab], row)?;
        field += 1;
        start = tab + 1;
    }
    if field == NUM_FIELDS {
        return Ok(LineKind::Full);
    }
    let fields = field;
    for missing in fields..NUM_FIELDS {
        parse_field(missing, b"", row)?;
    }
    Ok(LineKind::Padded { fields })
}

/// Parses field `field` (0-based) into its place in `row`.
#[inline]
fn parse_field(field: usize, text: &[u8], row: &mut Row) -> Result<(), ParseError> {
    if field == 0 {
        row.label = match text {
            b"0" => 0.0,
            b"1" => 1.0,
            _ => {
                return Err(ParseError::BadLabel {
                    text: snippet(text),
                })
            }
        };
    } else if field <= NUM_DENSE {
        let x = parse_i64(text).ok_or_else(|| ParseError::BadInteger {
            column: field,
            field: field + 1,
            text: snippet(text),
        })?;
        row.dense[field - 1] = log1p_clamped(x);
    } else {
        let column = field - NUM_DENSE;
        row.sparse[column - 1] = parse_hex(text).map_err(|long| {
            let (field, text) = (field + 1, snippet(text));
            if long {
                ParseError::HexTooLong {
                    column,
                    field,
                    text,
                }
            } else {
                ParseError::NotHex {
                    column,
                    field,
                    text,
                }
            }
        })?;
    }
    Ok(())
}

/// Integers below this take their dense value from [`LN1P`] (most Criteo counts are small).
const LN1P_TABLE: usize = 1024;

/// `ln(1 + x)` for `x < LN1P_TABLE`: libm's `log1p` was half the parse time before this table.
static LN1P: LazyLock<[f32; LN1P_TABLE]> =
    LazyLock::new(|| std::array::from_fn(|x| (x as f64).ln_1p() as f32));

/// `ln(1 + max(x, 0))`, computed in f64 and rounded once to f32.
#[inline]
fn log1p_clamped(x: i64) -> f32 {
    if x <= 0 {
        0.0
    } else if x < LN1P_TABLE as i64 {
        LN1P[x as usize]
    } else {
        // 1 + x is exact in f64 below 2^53, and `ln` is cheaper than `ln_1p`.
        (x as f64 + 1.0).ln() as f32
    }
}

/// An optionally signed decimal integer; empty is 0. `None` for anything else or on overflow.
#[inline]
fn parse_i64(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [] => return Some(0),
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulate as a negative number so i64::MIN fits.
    let mut value: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        value = value.checked_mul(10)?.checked_sub(i64::from(d))?;
    }
    if negative {
        Some(value)
    } else {
        value.checked_neg()
    }
}

/// Hex digit values; 0xff marks a non-hex byte.
const HEX: [u8; 256] = {
    let mut table = [0xff; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

/// 1 to 8 hex digits of either case; empty is `None`. `Err(true)` if too long, `Err(false)` if not hex.
#[inline]
fn parse_hex(text: &[u8]) -> Result<Option<u32>, bool> {
    if text.is_empty() {
        return Ok(None);
    }
    let mut value: u32 = 0;
    let mut bad = 0u8;
    for &b in text.iter().take(8) {
        let d = HEX[b as usize];
        bad |= d;
        value = (value << 4) | u32::from(d & 0x0f);
    }
    if bad & 0xf0 != 0 {
        return Err(false);
    }
    if text.len() > 8 {
        // Name the real problem: a long run of hex is "too long", long garbage is "not hex".
        return Err(text.iter().all(|&b| HEX[b as usize] != 0xff));
    }
    Ok(Some(value))
}

/// The text for an error message: lossy UTF-8, cut to [`MAX_ERROR_TEXT`] bytes.
fn snippet(text: &[u8]) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        String::from_utf8_lossy(text).into_owned()
    } else {
        format!("{}...", String::from_utf8_lossy(&text[..MAX_ERROR_TEXT]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A complete line from the Kaggle set (day 0, line 1).
    const KAGGLE: &str = "0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t\
        25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t\
        8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t\
        9727dd16";

    fn parse(line: &str) -> Result<(LineKind, Row), ParseError> {
        let mut row = Row::default();
        parse_line(line.as_bytes(), &mut row).map(|kind| (kind, row))
    }

    fn err(line: &str) -> String {
        parse(line).unwrap_err().to_string()
    }

    /// A line of `fields` fields: label 1, each integer its column number, each categorical `00000c0<col>`.
    fn synthetic(fields: usize) -> String {
        let mut parts = vec!["1".to_string()];
        parts.extend((1..=NUM_DENSE).map(|i| i.to_string()));
        parts.extend((1..=NUM_SPARSE).map(|c| format!("{c:08x}")));
        parts.truncate(fields);
        parts.join("\t")
    }

    #[test]
    fn full_kaggle_line() {
        let (kind, row) = parse(KAGGLE).unwrap();
        assert_eq!(kind, LineKind::Full);
        assert_eq!(row.label, 0.0);
        assert_eq!(row.dense[0], (2f64).ln() as f32);
        assert_eq!(row.dense[4], (1383f64).ln() as f32);
        assert_eq!(row.dense[11], 0.0, "I12 is empty");
        assert_eq!(row.sparse[0], Some(0x68fd1e64));
        assert_eq!(row.sparse[21], None, "C22 is empty");
        assert_eq!(row.sparse[25], Some(0x9727dd16));
    }

    #[test]
    fn leading_and_trailing_tabs() {
        // Empty I1 (leading tab after the label) and empty C25, C26 (trailing tabs).
        let mut fields: Vec<String> = synthetic(NUM_FIELDS)
            .split('\t')
            .map(str::to_string)
            .collect();
        fields[1].clear();
        fields[38].clear();
        fields[39].clear();
        let (kind, row) = parse(&fields.join("\t")).unwrap();
        assert_eq!(kind, LineKind::Full);
        assert_eq!(row.dense[0], 0.0);
        assert_eq!(row.dense[1], (3f64).ln() as f32);
        assert_eq!(&row.sparse[23..], &[Some(24), None, None]);
    }

    #[test]
    fn line_starting_with_a_tab_has_an_empty_label() {
        assert_eq!(
            err(&format!("\t{}", &synthetic(39)[2..])),
            r#"column label (field 1): "" is not 0 or 1"#
        );
    }

    #[test]
    fn negative_and_extreme_integers() {
        let line = synthetic(NUM_FIELDS)
            .replacen("\t2\t", "\t-2\t", 1)
            .replacen("\t3\t", "\t-9223372036854775808\t", 1);
        let (_, row) = parse(&line).unwrap();
        assert_eq!(row.dense[1], 0.0);
        assert_eq!(row.dense[2], 0.0);
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-9223372036854775809"), None);
        assert_eq!(parse_i64(b"+7"), Some(7));
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_i64(b"1.5"), None);
        assert_eq!(log1p_clamped(i64::MAX), (i64::MAX as f64).ln_1p() as f32);
    }

    #[test]
    fn dense_values_match_ln_1p() {
        let xs = (0..3000).chain([1 << 20, 1 << 40, (1 << 53) - 1, 1 << 53, i64::MAX - 1]);
        for x in xs {
            assert_eq!(log1p_clamped(x), (x as f64).ln_1p() as f32, "x = {x}");
        }
        assert_eq!(log1p_clamped(-5), 0.0);
    }

    #[test]
    fn stripped_trailing_fields_are_padded() {
        for fields in 1..NUM_FIELDS {
            let (kind, row) = parse(&synthetic(fields)).unwrap();
            assert_eq!(kind, LineKind::Padded { fields });
            let dense_present = fields.saturating_sub(1).min(NUM_DENSE);
            assert!(row.dense[..dense_present].iter().all(|&x| x > 0.0));
            assert!(row.dense[dense_present..].iter().all(|&x| x == 0.0));
            let sparse_present = fields.saturating_sub(1 + NUM_DENSE);
            assert!(row.sparse[..sparse_present].iter().all(Option::is_some));
            assert!(row.sparse[sparse_present..].iter().all(Option::is_none));
        }
    }

    #[test]
    fn padding_overwrites_the_previous_row() {
        let mut row = Row::default();
        parse_line(synthetic(NUM_FIELDS).as_bytes(), &mut row).unwrap();
        parse_line(b"0", &mut row).unwrap();
        assert_eq!(row, Row::default());
    }

    #[test]
    fn line_cut_mid_categorical_still_parses() {
        let (kind, row) = parse(&KAGGLE[..KAGGLE.find("68fd1e64").unwrap() + 7]).unwrap();
        assert_eq!(kind, LineKind::Padded { fields: 15 });
        assert_eq!(row.sparse[0], Some(0x68fd1e6));
    }

    #[test]
    fn line_cut_and_joined_with_garbage_is_an_error() {
        let line = format!(
            "{}\u{0}\u{0}PK\u{3}",
            &KAGGLE[..KAGGLE.find("68fd1e64").unwrap() + 7]
        );
        assert_eq!(
            err(&line),
            "column C1 (field 15): \"68fd1e6\\0\\0PK\\u{3}\" is not hex"
        );
    }

    #[test]
    fn non_hex_categorical_names_the_column() {
        let line = synthetic(NUM_FIELDS).replace("00000005", "zzzz1234");
        assert_eq!(err(&line), r#"column C5 (field 19): "zzzz1234" is not hex"#);
        let line = synthetic(NUM_FIELDS).replace("00000005", "0000000ab");
        assert_eq!(
            err(&line),
            r#"column C5 (field 19): "0000000ab" has more than 8 hex digits"#
        );
        let line = synthetic(NUM_FIELDS).replace("00000005", "0000000zz");
        assert_eq!(
            err(&line),
            r#"column C5 (field 19): "0000000zz" is not hex"#
        );
    }

    #[test]
    fn hex_accepts_both_cases_and_short_tokens() {
        assert_eq!(parse_hex(b"ABCDEF01"), Ok(Some(0xabcdef01)));
        assert_eq!(parse_hex(b"abcdef01"), Ok(Some(0xabcdef01)));
        assert_eq!(parse_hex(b"f"), Ok(Some(0xf)));
        assert_eq!(parse_hex(b"FfFfFfFf"), Ok(Some(u32::MAX)));
        assert_eq!(parse_hex(b""), Ok(None));
        assert_eq!(parse_hex(b"g"), Err(false));
        assert_eq!(parse_hex(b" 1"), Err(false));
        assert_eq!(parse_hex(b"0x12"), Err(false));
    }

    #[test]
    fn bad_integer_names_the_column() {
        let line = synthetic(NUM_FIELDS).replacen("\t4\t", "\t4.5\t", 1);
        assert_eq!(
            err(&line),
            r#"column I4 (field 5): "4.5" is not a 64-bit integer"#
        );
    }

    #[test]
    fn too_many_fields() {
        assert_eq!(
            err(&format!("{}\t", synthetic(NUM_FIELDS))),
            "41 fields, expected at most 40"
        );
        assert_eq!(
            err(&format!("{}\tx\ty", synthetic(NUM_FIELDS))),
            "42 fields, expected at most 40"
        );
    }

    #[test]
    fn bad_labels() {
        for label in ["2", "-1", "", "00", "1.0", "yes"] {
            let line = format!("{label}{}", &synthetic(NUM_FIELDS)[1..]);
            assert_eq!(
                err(&line),
                format!("column label (field 1): {label:?} is not 0 or 1")
            );
        }
    }

    #[test]
    fn crlf_and_newline_are_stripped() {
        let (kind, row) = parse(&format!("{KAGGLE}\r\n")).unwrap();
        assert_eq!(kind, LineKind::Full);
        assert_eq!(row.sparse[25], Some(0x9727dd16));
        assert_eq!(parse(&format!("{KAGGLE}\r")).unwrap().1, row);
        assert_eq!(parse("1\r").unwrap().0, LineKind::Padded { fields: 1 });
    }

    #[test]
    fn empty_lines() {
        for line in ["", "\n", "\r\n", "\r"] {
            assert_eq!(parse(line).unwrap().0, LineKind::Empty);
        }
    }

    #[test]
    fn csv_header_is_detected() {
        let header = b"Id,Label,I1,I2,I3,I4,I5,I6,I7,I8,I9,I10,I11,I12,I13,C1,C2";
        assert_eq!(TextFormat::detect(header), TextFormat::Csv);
        assert_eq!(TextFormat::detect(b"Id,Label\r"), TextFormat::Csv);
        assert_eq!(TextFormat::detect(KAGGLE.as_bytes()), TextFormat::Tsv);
        assert_eq!(TextFormat::detect(b""), TextFormat::Tsv);
        assert_eq!(TextFormat::detect(b"id,label"), TextFormat::Tsv);
    }

    #[test]
    fn csv_line_parses_like_its_tsv_line() {
        let csv = format!("10000743,{}", KAGGLE.replace('\t', ","));
        let mut row = Row::default();
        let kind = parse_csv_line(csv.as_bytes(), &mut row).unwrap();
        assert_eq!((kind, row), parse(KAGGLE).unwrap());
        let crlf = format!("{csv}\r\n");
        assert_eq!(TextFormat::Csv.parse(crlf.as_bytes(), &mut row), Ok(kind));
        // Padded and empty lines, as in TSV.
        assert_eq!(
            parse_csv_line(b"7,1,2,3", &mut row),
            Ok(LineKind::Padded { fields: 3 })
        );
        assert_eq!(row.dense[1], (4f64).ln() as f32);
        assert_eq!(parse_csv_line(b"\r\n", &mut row), Ok(LineKind::Empty));
    }

    #[test]
    fn bad_csv_lines_name_the_column() {
        let mut row = Row::default();
        let bad_int =
            format!("1,{}", synthetic(NUM_FIELDS).replace('\t', ",")).replacen(",4,", ",4.5,", 1);
        assert_eq!(
            parse_csv_line(bad_int.as_bytes(), &mut row)
                .unwrap_err()
                .to_string(),
            r#"column I4 (field 5): "4.5" is not a 64-bit integer"#
        );
        for line in ["12345", "12345,", "12345,,1"] {
            assert_eq!(
                parse_csv_line(line.as_bytes(), &mut row),
                Err(ParseError::BadLabel {
                    text: String::new()
                }),
                "{line}"
            );
        }
        // A tab-separated line is one long label to the CSV parser.
        assert!(matches!(
            parse_csv_line(KAGGLE.as_bytes(), &mut row),
            Err(ParseError::BadLabel { .. })
        ));
    }

    #[test]
    fn long_garbage_is_cut_in_the_message() {
        let msg = err(&"x".repeat(10_000));
        assert!(msg.len() < 120, "{msg}");
        assert!(msg.contains("...\""), "{msg}");
    }
}
