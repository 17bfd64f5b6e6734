//! Parsing `POST /v1/predict` answers (docs/serving.md): `200 {"version", "dense_version", "probabilities"}`,
//! or a 4xx/5xx `{"error": "..."}`.

use serde::Deserialize;

/// A successful prediction.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Prediction {
    /// Export version the server predicted with.
    pub version: u64,
    /// Dense parameter version the server predicted with.
    pub dense_version: u64,
    /// One click probability per row, in order.
    pub probabilities: Vec<f32>,
}

/// Why an answer is not the prediction asked for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnswerError {
    /// A non-200 status, with the body's `error` message (or the body itself when it has none).
    #[error("HTTP {status}: {message}")]
    Status {
        /// The HTTP status code.
        status: u16,
        /// What the server said.
        message: String,
    },
    /// A 200 whose body is not the prediction JSON.
    #[error("malformed answer: {reason}; body: {body}")]
    Malformed {
        /// What is wrong.
        reason: String,
        /// The start of the body.
        body: String,
    },
    /// A prediction with the wrong number of probabilities.
    #[error("{got} probabilities for {sent} rows")]
    WrongCount {
        /// Rows sent.
        sent: usize,
        /// Probabilities answered.
        got: usize,
    },
}

impl AnswerError {
    /// The key this error is counted under in a report: the status code, or `malformed`, `wrong-count`.
    pub fn kind(&self) -> String {
        match self {
            AnswerError::Status { status, .. } => status.to_string(),
            AnswerError::Malformed { .. } => "malformed".into(),
            AnswerError::WrongCount { .. } => "wrong-count".into(),
        }
    }
}

/// The first 200 characters of a body, lossily decoded, for messages.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text.chars().take(200).collect();
    if text.chars().count() > 200 {
        out.push_str("...");
    }
    out
}

#[derive(Deserialize)]
struct ErrorBody {
    error: String,
}

/// Judges an answer to a request of `sent` rows.
pub fn parse(status: u16, body: &[u8], sent: usize) -> Result<Prediction, AnswerError> {
    if status != 200 {
        let message = serde_json::from_slice::<ErrorBody>(body)
            .map(|e| e.error)
            .unwrap_or_else(|_| excerpt(body));
        return Err(AnswerError::Status { status, message });
    }
    let p: Prediction = serde_json::from_slice(body).map_err(|e| AnswerError::Malformed {
        reason: e.to_string(),
        body: excerpt(body),
    })?;
    if p.probabilities.len() != sent {
        return Err(AnswerError::WrongCount {
            sent,
            got: p.probabilities.len(),
        });
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_prediction() {
        let body = br#"{"version": 1234, "dense_version": 7, "probabilities": [0.25, 0.5]}"#;
        let p = parse(200, body, 2).unwrap();
        assert_eq!(p.version, 1234);
        assert_eq!(p.dense_version, 7);
        assert_eq!(p.probabilities, vec![0.25, 0.5]);
    }

    #[test]
    fn error_bodies_give_their_message() {
        let e = parse(400, br#"{"error": "line 2 column 14: not an integer"}"#, 2).unwrap_err();
        assert_eq!(e.to_string(), "HTTP 400: line 2 column 14: not an integer");
        assert_eq!(e.kind(), "400");
        let e = parse(502, b"Bad Gateway", 1).unwrap_err();
        assert_eq!(e.to_string(), "HTTP 502: Bad Gateway");
    }

    #[test]
    fn refuses_malformed_and_short_answers() {
        let e = parse(200, b"{\"version\": 1", 1).unwrap_err();
        assert_eq!(e.kind(), "malformed");
        assert!(e.to_string().contains("body: {\"version\": 1"), "{e}");
        let e = parse(200, br#"{"version": 1, "probabilities": [0.5]}"#, 1).unwrap_err();
        assert_eq!(e.kind(), "malformed"); // no dense_version
        let e = parse(
            200,
            br#"{"version": 1, "dense_version": 1, "probabilities": [0.5]}"#,
            3,
        )
        .unwrap_err();
        assert_eq!(e, AnswerError::WrongCount { sent: 3, got: 1 });
        assert_eq!(e.to_string(), "1 probabilities for 3 rows");
    }
}
