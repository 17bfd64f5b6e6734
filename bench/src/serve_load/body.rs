//! `POST /v1/predict` request bodies (docs/serving.md): TSV, one row per line without the label, or JSON, an
//! array of objects keyed `I1..I13`, `C1..C26`.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::rows::{FEATURE_FIELDS, INT_FIELDS};

/// Body format of the predict requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `text/tab-separated-values`: the rows as they are in the file, without labels.
    Tsv,
    /// `application/json`: an array of objects, one per row.
    Json,
}

impl Format {
    /// The flag value: `tsv` or `json`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Tsv => "tsv",
            Format::Json => "json",
        }
    }

    /// The `Content-Type` of the bodies.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Tsv => "text/tab-separated-values",
            Format::Json => "application/json",
        }
    }

    /// The body of one request holding `rows` (feature text, see [`super::rows::LabelledRows`]).
    pub fn body<S: AsRef<str>>(self, rows: &[S]) -> Bytes {
        match self {
            Format::Tsv => tsv_body(rows),
            Format::Json => json_body(rows),
        }
    }
}

/// One line per row, each ending in `\n`.
pub fn tsv_body<S: AsRef<str>>(rows: &[S]) -> Bytes {
    let len = rows.iter().map(|r| r.as_ref().len() + 1).sum();
    let mut out = String::with_capacity(len);
    for r in rows {
        out.push_str(r.as_ref());
        out.push('\n');
    }
    Bytes::from(out)
}

/// A JSON array of row objects ([`json_row`]).
pub fn json_body<S: AsRef<str>>(rows: &[S]) -> Bytes {
    let array: Vec<Value> = rows.iter().map(|r| json_row(r.as_ref())).collect();
    Bytes::from(serde_json::to_vec(&array).expect("serializing JSON values cannot fail"))
}

/// One row's features (`I1..I13 \t C1..C26`, trailing fields possibly absent) as a JSON object: every key
/// present; a missing field is `null`; an integer field is a number when it parses as one (a string
/// otherwise, for the server to refuse); a categorical is its hex string, or an array of its tokens when it
/// is multi-hot (`a|b`).
pub fn json_row(features: &str) -> Value {
    let mut fields = features.split('\t');
    let mut obj = Map::with_capacity(FEATURE_FIELDS);
    for f in 0..FEATURE_FIELDS {
        let text = fields.next().unwrap_or("");
        let (key, value) = if f < INT_FIELDS {
            let value = match text {
                "" => Value::Null,
                t => t
                    .parse::<i64>()
                    .map_or_else(|_| Value::String(t.into()), Value::from),
            };
            (format!("I{}", f + 1), value)
        } else {
            let value = match text {
                "" => Value::Null,
                t if t.contains('|') => {
                    Value::Array(t.split('|').map(|s| Value::String(s.into())).collect())
                }
                t => Value::String(t.into()),
            };
            (format!("C{}", f - INT_FIELDS + 1), value)
        };
        obj.insert(key, value);
    }
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsv_is_the_rows_one_per_line() {
        assert_eq!(&Format::Tsv.body(&["1\t2", "\t3"])[..], b"1\t2\n\t3\n");
        assert_eq!(Format::Tsv.content_type(), "text/tab-separated-values");
        assert_eq!(Format::Tsv.name(), "tsv");
    }

    #[test]
    fn json_keys_every_field() {
        let line = format!("5\t\t-1{}\tab12cd34\t\t01|02", "\t".repeat(10));
        let v = json_row(&line);
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 39);
        assert_eq!(o["I1"], Value::from(5));
        assert_eq!(o["I2"], Value::Null);
        assert_eq!(o["I3"], Value::from(-1));
        assert_eq!(o["I13"], Value::Null);
        assert_eq!(o["C1"], Value::from("ab12cd34"));
        assert_eq!(o["C2"], Value::Null);
        assert_eq!(o["C3"], serde_json::json!(["01", "02"]));
        assert_eq!(o["C26"], Value::Null);
    }

    #[test]
    fn json_body_is_an_array_in_order() {
        let body = Format::Json.body(&["1", "2"]);
        let v: Vec<Value> = serde_json::from_slice(&body).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["I1"], Value::from(1));
        assert_eq!(v[1]["I1"], Value::from(2));
        // Not an integer: sent as a string for the server to judge.
        assert_eq!(json_row("1.5")["I1"], Value::from("1.5"));
    }
}
