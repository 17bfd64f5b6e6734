//! The Criteo line parser: sans-IO, on byte slices, no allocation per line.
//!
//! A line is 40 tab-separated fields: `label, I1..I13, C1..C26` (no header). What real logs contain, and what
//! this parser therefore accepts:
//! - any field may be empty (lines often start or end with a tab); an empty integer is 0, an empty
//!   categorical is the empty token;
//! - integers may be negative; the dense value is `ln(1 + max(x, 0))` (DESIGN.md, "Read");
//! - categoricals are 8 lowercase hex digits; 1 to 8 digits of either case are accepted, so a line cut in
//!   the middle of a categorical still parses;
//! - a categorical may hold several such tokens separated by `|` (multi-hot input, docs/model-spec.md):
//!   [`Row::sparse`] keeps the first, [`Row::tokens`] all of them; an empty token (`a||b`, a leading or
//!   trailing `|`) is a [`ParseError::EmptyToken`], a bad token a [`ParseError::NotHex`] or
//!   [`ParseError::HexTooLong`] naming that token. What a feature keeps of them is the
//!   [`FeatureLayout`](crate::FeatureLayout)'s business ([`crate::Batch::push_row_in`]);
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

/// One parsed line, reused from line to line by [`parse_line`] (its token buffer too: no allocation per
/// line once it has grown to the longest line's tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The click label, 0.0 or 1.0.
    pub label: f32,
    /// `ln(1 + max(x, 0))` of I1..I13 (0.0 for empty fields).
    pub dense: [f32; NUM_DENSE],
    /// The raw (first) tokens of C1..C26 as integers; `None` for empty fields. A field holding a `|` list
    /// has its first token here and all of them in [`Row::tokens`].
    pub sparse: [Option<u32>; NUM_SPARSE],
    /// Bit `j` set: column `j` held more than one token, `more[spans[j]]`.
    pub(crate) multi: u32,
    /// The tokens of the columns with more than one, in column order.
    pub(crate) more: Vec<u32>,
    /// Where each multi-token column's tokens lie in `more` (start, end); stale for the others.
    pub(crate) spans: [(u32, u32); NUM_SPARSE],
    /// Tokens past the first of each field, over all fields.
    pub(crate) extra: u32,
}

impl Default for Row {
    fn default() -> Self {
        Row {
            label: 0.0,
            dense: [0.0; NUM_DENSE],
            sparse: [None; NUM_SPARSE],
            multi: 0,
            more: Vec::new(),
            spans: [(0, 0); NUM_SPARSE],
            extra: 0,
        }
    }
}

impl Row {
    /// All tokens of column `column` (0-based, C1 = 0) in line order: empty for an empty field.
    ///
    /// # Panics
    /// If `column >= 26`.
    #[inline]
    pub fn tokens(&self, column: usize) -> &[u32] {
        if self.multi & (1 << column) != 0 {
            let (start, end) = self.spans[column];
            &self.more[start as usize..end as usize]
        } else {
            self.sparse[column].as_slice()
        }
    }

    /// Tokens past the first of each field, summed over the fields: what a one-hot layout drops.
    #[inline]
    pub fn extra_tokens(&self) -> u32 {
        self.extra
    }

    /// Sets column `column` to `tokens` (empty: an empty field), as parsing a `|` list would; for tests
    /// and for callers that build rows without text.
    ///
    /// # Panics
    /// If `column >= 26`.
    pub fn set_tokens(&mut self, column: usize, tokens: &[u32]) {
        self.extra -= self.tokens(column).len().saturating_sub(1) as u32;
        self.sparse[column] = tokens.first().copied();
        if tokens.len() > 1 {
            let start = self.more.len() as u32;
            self.more.extend_from_slice(tokens);
            self.spans[column] = (start, self.more.len() as u32);
            self.multi |= 1 << column;
            self.extra += tokens.len() as u32 - 1;
        } else {
            self.multi &= !(1 << column);
        }
    }

    /// Forgets every multi-token field (the start of a line).
    #[inline]
    fn clear_tokens(&mut self) {
        self.multi = 0;
        self.extra = 0;
        self.more.clear();
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
    /// A categorical `|` list held an empty token (`a||b`, or a `|` at either end).
    #[error("column C{column} (field {field}): {text:?} has an empty token between or beside `|`")]
    EmptyToken {
        /// The column number, 1..=26.
        column: usize,
        /// The field number, 15..=40.
        field: usize,
        /// The whole field (cut to 64 bytes).
        text: String,
    },
    /// The line had more than 40 fields.
    #[error("{fields} fields, expected at most 40")]
    TooManyFields {
        /// How many fields the line had.
        fields: usize,
    },
    /// A line without a label ([`parse_unlabeled_line`]) had more than 39 fields.
    #[error("{fields} fields, expected at most 39 (I1..I13, C1..C26; no label)")]
    TooManyUnlabeledFields {
        /// How many fields the line had.
        fields: usize,
    },
}

impl ParseError {
    /// The error with its field number counted from I1 (a line without a label).
    fn unlabeled(mut self) -> ParseError {
        match &mut self {
            ParseError::BadInteger { field, .. }
            | ParseError::NotHex { field, .. }
            | ParseError::HexTooLong { field, .. }
            | ParseError::EmptyToken { field, .. } => *field -= 1,
            ParseError::BadLabel { .. }
            | ParseError::TooManyFields { .. }
            | ParseError::TooManyUnlabeledFields { .. } => {}
        }
        self
    }
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

/// Parses one line without a label, `I1..I13, C1..C26` tab-separated (39 fields; trailing empty fields may be
/// stripped): a row to predict. The row's label is 0; field numbers in errors count I1 as field 1.
pub fn parse_unlabeled_line(line: &[u8], row: &mut Row) -> Result<LineKind, ParseError> {
    let line = trim_line(line);
    if line.is_empty() {
        return Ok(LineKind::Empty);
    }
    row.clear_tokens();
    row.label = 0.0;
    let mut field = 1; // the label's place is field 0
    let mut start = 0;
    for tab in memchr_iter(b'\t', line).chain(std::iter::once(line.len())) {
        if field == NUM_FIELDS {
            return Err(ParseError::TooManyUnlabeledFields {
                fields: 1 + memchr_iter(b'\t', line).count(),
            });
        }
        parse_field(field, &line[start..tab], row).map_err(ParseError::unlabeled)?;
        field += 1;
        start = tab + 1;
    }
    let fields = field - 1;
    for missing in field..NUM_FIELDS {
        parse_field(missing, b"", row)?;
    }
    if fields == NUM_FIELDS - 1 {
        Ok(LineKind::Full)
    } else {
        Ok(LineKind::Padded { fields })
    }
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
    row.clear_tokens();
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
        match parse_hex(text) {
            Ok(token) => row.sparse[column - 1] = token,
            Err(long) => parse_list(column, field + 1, text, long, row)?,
        }
    }
    Ok(())
}

/// Parses a categorical field that is not one token: a `|` list of tokens into `row`, or the error for
/// `text` as one token (`long`: too many hex digits rather than not hex). Off the one-hot hot path.
#[cold]
#[inline(never)]
fn parse_list(
    column: usize,
    field: usize,
    text: &[u8],
    long: bool,
    row: &mut Row,
) -> Result<(), ParseError> {
    let token_error = |token: &[u8], long: bool| {
        let text = snippet(token);
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
    };
    if memchr::memchr(b'|', text).is_none() {
        return Err(token_error(text, long));
    }
    let start = row.more.len();
    for token in text.split(|&b| b == b'|') {
        match parse_hex(token) {
            Ok(Some(value)) => row.more.push(value),
            Ok(None) => {
                row.more.truncate(start);
                return Err(ParseError::EmptyToken {
                    column,
                    field,
                    text: snippet(text),
                });
            }
            Err(long) => {
                row.more.truncate(start);
                return Err(token_error(token, long));
            }
        }
    }
    let j = column - 1;
    row.sparse[j] = Some(row.more[start]);
    row.spans[j] = (start as u32, row.more.len() as u32);
    row.multi |= 1 << j;
    row.extra += (row.more.len() - start - 1) as u32;
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
mod tests;
