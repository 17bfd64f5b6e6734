//! Labelled Criteo rows read from a test file (`label \t I1..I13 \t C1..C26`, plain or gzip, as `gen-criteo`
//! writes them), kept as text: serving parses the rows itself, so the load generator sends them as they are,
//! only without the label.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// Integer fields of a row (`I1..I13`).
pub const INT_FIELDS: usize = 13;
/// Categorical fields of a row (`C1..C26`).
pub const CAT_FIELDS: usize = 26;
/// Feature fields of a row, the label excluded.
pub const FEATURE_FIELDS: usize = INT_FIELDS + CAT_FIELDS;

/// A malformed test file.
#[derive(Debug, thiserror::Error)]
pub enum RowsError {
    /// The file could not be opened or read.
    #[error("read {path}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A line's first field is not a label.
    #[error(
        "{path} line {line}: label {label:?} is not a number (the file must hold labelled rows)"
    )]
    Label {
        /// The file.
        path: String,
        /// 1-based line number.
        line: u64,
        /// The first field.
        label: String,
    },
    /// A line has more fields than a labelled Criteo row.
    #[error("{path} line {line}: {fields} fields, a labelled Criteo row has at most {}", FEATURE_FIELDS + 1)]
    TooManyFields {
        /// The file.
        path: String,
        /// 1-based line number.
        line: u64,
        /// Fields found.
        fields: usize,
    },
    /// The file holds no rows.
    #[error("{path} holds no rows")]
    Empty {
        /// The file.
        path: String,
    },
}

/// Rows of a test file: each row's features as text (the line without its label) and its label.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelledRows {
    /// Feature text of each row: up to 39 tab-separated fields, no label, no line end.
    pub features: Vec<String>,
    /// Label of each row (0 or 1).
    pub labels: Vec<f32>,
}

impl LabelledRows {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.features.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
    }

    /// Reads `path` (gzip when it ends in `.gz`), at most `limit` rows. Empty lines are skipped.
    pub fn read(path: &Path, limit: Option<usize>) -> Result<LabelledRows, RowsError> {
        let name = path.display().to_string();
        let io = |source| RowsError::Io {
            path: name.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let input: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(flate2::read::MultiGzDecoder::new(file))
        } else {
            Box::new(file)
        };
        let rows = LabelledRows::parse(BufReader::with_capacity(1 << 20, input), &name, limit)?;
        if rows.is_empty() {
            return Err(RowsError::Empty { path: name });
        }
        Ok(rows)
    }

    /// Parses labelled lines from `input`; `name` names it in errors.
    pub fn parse(
        input: impl BufRead,
        name: &str,
        limit: Option<usize>,
    ) -> Result<LabelledRows, RowsError> {
        let mut rows = LabelledRows::default();
        for (i, line) in input.lines().enumerate() {
            if limit.is_some_and(|n| rows.len() >= n) {
                break;
            }
            let line = line.map_err(|source| RowsError::Io {
                path: name.into(),
                source,
            })?;
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                continue;
            }
            let lineno = i as u64 + 1;
            let (label, features) = line.split_once('\t').unwrap_or((line, ""));
            let label = label
                .trim()
                .parse::<f32>()
                .ok()
                .filter(|l| l.is_finite())
                .ok_or_else(|| RowsError::Label {
                    path: name.into(),
                    line: lineno,
                    label: label.chars().take(40).collect(),
                })?;
            let fields = features.split('\t').count();
            if fields > FEATURE_FIELDS {
                return Err(RowsError::TooManyFields {
                    path: name.into(),
                    line: lineno,
                    fields: fields + 1,
                });
            }
            rows.features.push(features.to_string());
            rows.labels.push(label);
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_labels_and_skips_empty_lines() {
        let text = "1\t5\t\t3\tab12cd34\n\n0\t\t2\r\n";
        let rows = LabelledRows::parse(text.as_bytes(), "t", None).unwrap();
        assert_eq!(rows.features, vec!["5\t\t3\tab12cd34", "\t2"]);
        assert_eq!(rows.labels, vec![1.0, 0.0]);
    }

    #[test]
    fn limit_stops_early() {
        let rows = LabelledRows::parse("1\ta\n0\tb\n1\tc\n".as_bytes(), "t", Some(2)).unwrap();
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn refuses_unlabelled_rows() {
        let err = LabelledRows::parse("abc\t1\n".as_bytes(), "f.tsv", None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.tsv line 1: label \"abc\" is not a number (the file must hold labelled rows)"
        );
        let long = format!("1{}\n", "\tx".repeat(40));
        let err = LabelledRows::parse(long.as_bytes(), "f.tsv", None).unwrap_err();
        assert!(
            matches!(err, RowsError::TooManyFields { fields: 41, .. }),
            "{err}"
        );
    }

    #[test]
    fn reads_gzip() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.tsv.gz");
        let mut gz = flate2::write::GzEncoder::new(
            File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(b"0\t1\t2\n1\t3\t4\n").unwrap();
        gz.finish().unwrap();
        let rows = LabelledRows::read(&path, None).unwrap();
        assert_eq!(rows.features, vec!["1\t2", "3\t4"]);
        let empty = dir.path().join("empty.tsv");
        File::create(&empty).unwrap();
        assert!(matches!(
            LabelledRows::read(&empty, None),
            Err(RowsError::Empty { .. })
        ));
    }
}
