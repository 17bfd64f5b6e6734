//! The layout of a `POST /v1/predict` body (docs/serving.md): Criteo rows without the label, as TSV lines or
//! JSON objects keyed `I1..I13`, `C1..C26`, parsed into a columnar [`Batch`] of the export's feature layout.
//!
//! JSON rows are turned into the TSV fields they stand for and parsed by the same parser
//! ([`criteo::parse_unlabeled_line`]), so both forms accept and refuse exactly the same values.

use criteo::{parse_unlabeled_line, Batch, FeatureLayout, LineKind, Row, NUM_DENSE};
use serde_json::Value;

/// Criteo's categorical columns.
const NUM_SPARSE: usize = 26;

/// How a body is laid out, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// `text/tab-separated-values` or `text/plain`: one row per line.
    Tsv,
    /// `application/json`: an array of objects, or `{"rows": [...]}`.
    Json,
}

impl BodyFormat {
    /// The format a `Content-Type` header names (parameters such as `charset` ignored); `None` for others.
    /// A missing header is read as TSV.
    pub fn from_content_type(value: Option<&str>) -> Option<BodyFormat> {
        let Some(value) = value else {
            return Some(BodyFormat::Tsv);
        };
        let mime = value.split(';').next().unwrap_or("").trim();
        match mime.to_ascii_lowercase().as_str() {
            "text/tab-separated-values" | "text/plain" | "text/tsv" => Some(BodyFormat::Tsv),
            "application/json" => Some(BodyFormat::Json),
            _ => None,
        }
    }
}

/// Why a body was refused; the message names the row, the column and the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// A row did not parse.
    #[error("row {row}: {reason}")]
    BadRow {
        /// 1-based row (line of a TSV body, element of a JSON array).
        row: usize,
        /// What is wrong.
        reason: String,
    },
    /// The body is not JSON of the expected shape.
    #[error("malformed JSON body: {0}")]
    BadJson(String),
    /// No rows.
    #[error("the body holds no rows")]
    Empty,
    /// More rows than allowed.
    #[error("{rows} rows, more than --max-rows {max}")]
    TooManyRows {
        /// Rows in the body.
        rows: usize,
        /// The limit.
        max: usize,
    },
}

/// Parses `body` into a batch of `layout`, refusing more than `max_rows` rows.
pub fn parse_body(
    body: &[u8],
    format: BodyFormat,
    layout: &FeatureLayout,
    max_rows: usize,
) -> Result<Batch, RequestError> {
    match format {
        BodyFormat::Tsv => parse_tsv(body, layout, max_rows),
        BodyFormat::Json => parse_json(body, layout, max_rows),
    }
}

fn parse_tsv(body: &[u8], layout: &FeatureLayout, max_rows: usize) -> Result<Batch, RequestError> {
    let mut batch = Batch::with_layout(16, layout);
    let mut row = Row::default();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        match parse_unlabeled_line(line, &mut row) {
            Ok(LineKind::Empty) => continue,
            Ok(_) => {}
            Err(e) => {
                return Err(RequestError::BadRow {
                    row: i + 1,
                    reason: e.to_string(),
                })
            }
        }
        if batch.len == max_rows {
            let rows = batch.len + 1 + count_rows_after(body, i);
            return Err(RequestError::TooManyRows {
                rows,
                max: max_rows,
            });
        }
        batch.push_row_in(&row, layout);
    }
    if batch.len == 0 {
        return Err(RequestError::Empty);
    }
    Ok(batch)
}

/// Non-empty lines after line `i` (0-based), for the message of an oversized body.
fn count_rows_after(body: &[u8], i: usize) -> usize {
    body.split(|&b| b == b'\n')
        .skip(i + 1)
        .filter(|l| !l.is_empty() && *l != b"\r")
        .count()
}

/// Parses a JSON body one row at a time (a row's value tree is dropped once its row is in the batch), so memory
/// stays near the body's and the batch's size whatever the body holds; past `max_rows` the remaining elements
/// are only counted.
fn parse_json(body: &[u8], layout: &FeatureLayout, max_rows: usize) -> Result<Batch, RequestError> {
    let mut rows = JsonRows {
        layout,
        max_rows,
        batch: Batch::with_layout(0, layout),
        seen: 0,
        refused: None,
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = serde::de::Deserializer::deserialize_any(&mut de, TopVisitor(&mut rows))
        .and_then(|()| de.end());
    if let Some(refused) = rows.refused {
        return Err(refused);
    }
    parsed.map_err(|e| RequestError::BadJson(e.to_string()))?;
    if rows.seen > max_rows {
        return Err(RequestError::TooManyRows {
            rows: rows.seen,
            max: max_rows,
        });
    }
    if rows.batch.len == 0 {
        return Err(RequestError::Empty);
    }
    Ok(rows.batch)
}

/// The rows of a JSON body as they are read.
struct JsonRows<'a> {
    layout: &'a FeatureLayout,
    max_rows: usize,
    batch: Batch,
    /// Array elements seen, those past `max_rows` included.
    seen: usize,
    /// The typed refusal behind a deserializer error, if any.
    refused: Option<RequestError>,
}

/// A serde error that stops the parse; the reason is in [`JsonRows::refused`].
fn stop<E: serde::de::Error>(rows: &mut JsonRows<'_>, why: RequestError) -> E {
    let e = E::custom(why.to_string());
    rows.refused = Some(why);
    e
}

/// The body: an array of rows, or `{"rows": [...]}`.
struct TopVisitor<'r, 'a>(&'r mut JsonRows<'a>);

impl<'de> serde::de::Visitor<'de> for TopVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of row objects or {\"rows\": [...]}")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        RowsVisitor(self.0).visit_seq(seq)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut rows_seen = false;
        while let Some(key) = map.next_key::<String>()? {
            if key != "rows" {
                let why = RequestError::BadJson(format!("unknown key {key:?} beside \"rows\""));
                return Err(stop(self.0, why));
            }
            map.next_value_seed(RowsSeed(&mut *self.0))?;
            rows_seen = true;
        }
        if !rows_seen {
            let why = RequestError::BadJson(
                "expected an array of row objects or {\"rows\": [...]}".into(),
            );
            return Err(stop(self.0, why));
        }
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        Err(self.refuse_top("a boolean"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        Err(self.refuse_top("a number"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        Err(self.refuse_top("a number"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        Err(self.refuse_top("a number"))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        Err(self.refuse_top("a string"))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Err(self.refuse_top("null"))
    }
}

impl TopVisitor<'_, '_> {
    fn refuse_top<E: serde::de::Error>(self, what: &str) -> E {
        let why = RequestError::BadJson(format!(
            "the body is {what}, expected an array of row objects or {{\"rows\": [...]}}"
        ));
        stop(self.0, why)
    }
}

/// The array of rows under `"rows"`.
struct RowsSeed<'r, 'a>(&'r mut JsonRows<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for RowsSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(RowsVisitor(self.0))
    }
}

/// An array of row objects, each parsed and pushed as it is read.
struct RowsVisitor<'r, 'a>(&'r mut JsonRows<'a>);

impl<'de> serde::de::Visitor<'de> for RowsVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of row objects")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let rows = self.0;
        let mut row = Row::default();
        let mut line = String::new();
        loop {
            if rows.seen >= rows.max_rows {
                // Past the limit: count the rest without keeping them.
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    rows.seen += 1;
                }
                return Ok(());
            }
            let Some(value) = seq.next_element::<Value>()? else {
                return Ok(());
            };
            rows.seen += 1;
            let at = rows.seen;
            let bad = |reason: String| RequestError::BadRow { row: at, reason };
            if let Err(why) = json_row_to_line(&value, &mut line)
                .map_err(bad)
                .and_then(|()| {
                    parse_unlabeled_line(line.as_bytes(), &mut row).map_err(|e| bad(e.to_string()))
                })
            {
                return Err(stop(rows, why));
            }
            rows.batch.push_row_in(&row, rows.layout);
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(self.refuse("an object"))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        Err(self.refuse("a string"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        Err(self.refuse("a number"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        Err(self.refuse("a number"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        Err(self.refuse("a number"))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        Err(self.refuse("a boolean"))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Err(self.refuse("null"))
    }
}

impl RowsVisitor<'_, '_> {
    /// The refusal of a `"rows"` value that is `what`, not an array.
    fn refuse<E: serde::de::Error>(self, what: &str) -> E {
        let why =
            RequestError::BadJson(format!("\"rows\" is {what}, expected an array of objects"));
        stop(self.0, why)
    }
}

/// The TSV line (no label) a JSON row object stands for.
fn json_row_to_line(value: &Value, line: &mut String) -> Result<(), String> {
    let Value::Object(fields) = value else {
        return Err(format!("{}, expected an object", kind(value)));
    };
    let mut cells: [Option<String>; NUM_DENSE + NUM_SPARSE] = std::array::from_fn(|_| None);
    for (key, v) in fields {
        let index = column_index(key).ok_or_else(|| {
            format!("unknown key {key:?} (expected I1..I{NUM_DENSE}, C1..C{NUM_SPARSE})")
        })?;
        let text = if index < NUM_DENSE {
            match v {
                Value::Null => String::new(),
                Value::Number(n) if n.is_i64() => n.to_string(),
                Value::String(s) => s.clone(),
                other => {
                    return Err(format!(
                        "{key} is {}, expected an integer, a string of one or null",
                        kind(other)
                    ))
                }
            }
        } else {
            match v {
                Value::Null => String::new(),
                Value::String(s) => s.clone(),
                Value::Array(tokens) => {
                    let mut joined = Vec::with_capacity(tokens.len());
                    for t in tokens {
                        match t {
                            Value::String(s) => joined.push(s.as_str()),
                            other => {
                                return Err(format!(
                                    "{key} holds {}, expected hex strings",
                                    kind(other)
                                ))
                            }
                        }
                    }
                    joined.join("|")
                }
                other => {
                    return Err(format!(
                        "{key} is {}, expected a hex string, an array of them or null",
                        kind(other)
                    ))
                }
            }
        };
        if text.contains(['\t', '\n', '\r']) {
            return Err(format!("{key} holds a tab or a line break: {text:?}"));
        }
        cells[index] = Some(text);
    }
    line.clear();
    for (i, cell) in cells.iter().enumerate() {
        if i > 0 {
            line.push('\t');
        }
        line.push_str(cell.as_deref().unwrap_or(""));
    }
    Ok(())
}

/// `I1..I13` -> 0..13, `C1..C26` -> 13..39.
fn column_index(key: &str) -> Option<usize> {
    let (first, rest) = key.split_at_checked(1)?;
    if rest.starts_with('0') {
        return None;
    }
    let n: usize = rest.parse().ok()?;
    match first {
        "I" if (1..=NUM_DENSE).contains(&n) => Some(n - 1),
        "C" if (1..=NUM_SPARSE).contains(&n) => Some(NUM_DENSE + n - 1),
        _ => None,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t\
        25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t\
        8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t\
        9727dd16";

    fn tsv(body: &str) -> Result<Batch, RequestError> {
        parse_body(
            body.as_bytes(),
            BodyFormat::Tsv,
            &FeatureLayout::default(),
            4,
        )
    }

    fn json(body: &str) -> Result<Batch, RequestError> {
        parse_body(
            body.as_bytes(),
            BodyFormat::Json,
            &FeatureLayout::default(),
            4,
        )
    }

    /// The JSON object of `LINE`.
    fn line_as_json() -> String {
        let fields: Vec<&str> = LINE.split('\t').collect();
        let mut parts = Vec::new();
        for (i, f) in fields.iter().enumerate() {
            let key = if i < NUM_DENSE {
                format!("I{}", i + 1)
            } else {
                format!("C{}", i - NUM_DENSE + 1)
            };
            if f.is_empty() {
                parts.push(format!("\"{key}\": null"));
            } else if i < NUM_DENSE {
                parts.push(format!("\"{key}\": {f}"));
            } else {
                parts.push(format!("\"{key}\": \"{f}\""));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }

    #[test]
    fn tsv_and_json_give_the_same_batch() {
        let a = tsv(&format!("{LINE}\n{LINE}\r\n\n")).unwrap();
        assert_eq!(a.len, 2);
        let obj = line_as_json();
        let b = json(&format!("[{obj}, {obj}]")).unwrap();
        assert_eq!(a, b);
        let c = json(&format!("{{\"rows\": [{obj}, {obj}]}}")).unwrap();
        assert_eq!(a, c);
        // Missing keys are missing values; integers may come as strings; multi-hot as arrays.
        let d = json(r#"[{"I1": "3", "C1": ["0a", "0b"]}]"#).unwrap();
        let e = tsv("3\t\t\t\t\t\t\t\t\t\t\t\t\ta|b").unwrap();
        assert_eq!(d, e);
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        let msg = |r: Result<Batch, RequestError>| r.unwrap_err().to_string();
        assert_eq!(msg(tsv("")), "the body holds no rows");
        let bad_hex = LINE.replace("68fd1e64", "zzzz");
        assert_eq!(
            msg(tsv(&format!("{LINE}\n{bad_hex}"))),
            "row 2: column C1 (field 14): \"zzzz\" is not hex"
        );
        let too_many = format!("{LINE}\textra");
        assert!(msg(tsv(&too_many)).contains("40 fields, expected at most 39"));
        let five = [LINE; 5].join("\n");
        assert_eq!(msg(tsv(&five)), "5 rows, more than --max-rows 4");
        assert!(msg(json("{")).starts_with("malformed JSON body"));
        assert!(msg(json("3")).contains("the body is a number"));
        assert_eq!(
            msg(json(r#"[{"I14": 1}]"#)),
            "row 1: unknown key \"I14\" (expected I1..I13, C1..C26)"
        );
        assert!(msg(json(r#"[{"I1": 1.5}]"#)).contains("I1 is a number"));
        assert!(msg(json(r#"[{"C2": "xyz"}]"#)).contains("column C2"));
        assert!(msg(json(r#"[1]"#)).contains("row 1: a number, expected an object"));
        assert!(msg(json(r#"{"rows": [], "x": 1}"#)).contains("unknown key \"x\""));
        assert_eq!(msg(json("[]")), "the body holds no rows");
        assert!(msg(json(r#"[{"C1": "a\tb"}]"#)).contains("tab"));
        assert_eq!(
            msg(json(&format!("[{}]", ["{}"; 5].join(",")))),
            "5 rows, more than --max-rows 4"
        );
    }

    /// Bytes this thread holds allocated, and the most it held since [`counting::reset`]: a test allocator
    /// (other tests' threads do not count).
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static NOW: Cell<isize> = const { Cell::new(0) };
            static PEAK: Cell<isize> = const { Cell::new(0) };
        }

        pub struct Counting;

        fn add(delta: isize) {
            let _ = NOW.try_with(|now| {
                let v = now.get() + delta;
                now.set(v);
                let _ = PEAK.try_with(|peak| peak.set(peak.get().max(v)));
            });
        }

        // SAFETY: every call goes to the system allocator with the caller's arguments; the counting touches
        // only const-initialised thread-locals, which never allocate.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let p = unsafe { System.alloc(layout) };
                if !p.is_null() {
                    add(layout.size() as isize);
                }
                p
            }
            unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
                unsafe { System.dealloc(p, layout) };
                add(-(layout.size() as isize));
            }
            unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                let q = unsafe { System.realloc(p, layout, new_size) };
                if !q.is_null() {
                    add(new_size as isize - layout.size() as isize);
                }
                q
            }
        }

        /// Starts a measure: returns the bytes held now.
        pub fn reset() -> isize {
            let now = NOW.with(Cell::get);
            PEAK.with(|p| p.set(now));
            now
        }

        /// The most held since [`reset`] returned `base`, above it.
        pub fn peak_above(base: isize) -> isize {
            PEAK.with(Cell::get) - base
        }
    }

    #[global_allocator]
    static ALLOC: counting::Counting = counting::Counting;

    #[test]
    fn a_json_body_costs_about_its_own_size_however_many_rows_it_holds() {
        // ~6 MB of empty row objects, within --max-body-bytes (8 MiB): parsed whole into a value tree, they
        // took 30 times that.
        let body = format!("[{}]", vec!["{}"; 2_000_000].join(","));
        let base = counting::reset();
        let err = parse_body(
            body.as_bytes(),
            BodyFormat::Json,
            &FeatureLayout::default(),
            8192,
        )
        .unwrap_err();
        let streamed = counting::peak_above(base);
        assert_eq!(err.to_string(), "2000000 rows, more than --max-rows 8192");
        let base = counting::reset();
        let tree: Value = serde_json::from_slice(body.as_bytes()).unwrap();
        let whole = counting::peak_above(base);
        drop(tree);
        eprintln!(
            "JSON body of {} bytes: {streamed} bytes at most while parsed row by row, {whole} as a value tree",
            body.len()
        );
        assert!(
            streamed < body.len() as isize,
            "{streamed} bytes to parse a {}-byte body",
            body.len()
        );
    }

    #[test]
    fn content_types() {
        use BodyFormat::*;
        let f = BodyFormat::from_content_type;
        assert_eq!(f(None), Some(Tsv));
        assert_eq!(f(Some("text/tab-separated-values")), Some(Tsv));
        assert_eq!(f(Some("application/json; charset=utf-8")), Some(Json));
        assert_eq!(f(Some("image/png")), None);
    }

    #[test]
    fn column_names() {
        assert_eq!(column_index("I1"), Some(0));
        assert_eq!(column_index("I13"), Some(12));
        assert_eq!(column_index("C1"), Some(13));
        assert_eq!(column_index("C26"), Some(38));
        for bad in ["I0", "I14", "C27", "C01", "X1", "", "I", "Ié"] {
            assert_eq!(column_index(bad), None, "{bad}");
        }
    }
}
