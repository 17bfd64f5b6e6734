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

fn parse_json(body: &[u8], layout: &FeatureLayout, max_rows: usize) -> Result<Batch, RequestError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| RequestError::BadJson(e.to_string()))?;
    let rows = match value {
        Value::Array(rows) => rows,
        Value::Object(mut o) => match o.remove("rows") {
            Some(Value::Array(rows)) if o.is_empty() => rows,
            Some(Value::Array(_)) => {
                let key = o.keys().next().cloned().unwrap_or_default();
                return Err(RequestError::BadJson(format!(
                    "unknown key {key:?} beside \"rows\""
                )));
            }
            Some(other) => {
                return Err(RequestError::BadJson(format!(
                    "\"rows\" is {}, expected an array of objects",
                    kind(&other)
                )))
            }
            None => {
                return Err(RequestError::BadJson(
                    "expected an array of row objects or {\"rows\": [...]}".into(),
                ))
            }
        },
        other => {
            return Err(RequestError::BadJson(format!(
                "the body is {}, expected an array of row objects or {{\"rows\": [...]}}",
                kind(&other)
            )))
        }
    };
    if rows.len() > max_rows {
        return Err(RequestError::TooManyRows {
            rows: rows.len(),
            max: max_rows,
        });
    }
    let mut batch = Batch::with_layout(rows.len(), layout);
    let mut row = Row::default();
    let mut line = String::new();
    for (i, value) in rows.iter().enumerate() {
        let bad = |reason: String| RequestError::BadRow { row: i + 1, reason };
        json_row_to_line(value, &mut line).map_err(bad)?;
        parse_unlabeled_line(line.as_bytes(), &mut row).map_err(|e| bad(e.to_string()))?;
        batch.push_row_in(&row, layout);
    }
    if batch.len == 0 {
        return Err(RequestError::Empty);
    }
    Ok(batch)
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
