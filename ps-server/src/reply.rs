//! What a request is answered with: a [`Reply`] (a response header and its payload), or a [`Refusal`] (the
//! typed error naming what was wrong). Every mechanism that answers requests (request handling, replication,
//! resharding) builds these; this module knows none of them.

use embedding::EmbeddingError;
use protocol::{ErrorCode, Response};

use crate::metrics as m;

/// A response header with its payload.
#[derive(Debug)]
pub struct Reply {
    /// The header.
    pub header: Response,
    /// Raw bytes after the header.
    pub payload: Vec<u8>,
}

/// Why a request is refused: the typed error it is answered with.
#[derive(Debug)]
pub struct Refusal {
    code: ErrorCode,
    message: String,
}

impl Refusal {
    /// The message naming the offending value.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error header this refusal is answered with (not counted: [`Refusal::into_reply`] counts).
    pub fn response(&self) -> Response {
        Response::Error {
            code: self.code,
            message: self.message.clone(),
        }
    }

    /// The error reply, counted in [`m::REQUEST_ERRORS_TOTAL`].
    pub fn into_reply(self) -> Reply {
        metrics::counter!(m::REQUEST_ERRORS_TOTAL, "code" => format!("{:?}", self.code))
            .increment(1);
        tracing::debug!(code = ?self.code, message = %self.message, "refused request");
        Reply {
            header: Response::Error {
                code: self.code,
                message: self.message,
            },
            payload: Vec::new(),
        }
    }
}

pub(crate) fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

impl From<EmbeddingError> for Refusal {
    fn from(e: EmbeddingError) -> Refusal {
        let code = match &e {
            EmbeddingError::UnknownTable(_) => ErrorCode::UnknownTable,
            EmbeddingError::TableConflict { .. } => ErrorCode::TableConflict,
            EmbeddingError::PrefetchTooLarge { .. }
            | EmbeddingError::TooManyTables { .. }
            | EmbeddingError::InexactRow { .. }
            | EmbeddingError::NotScored { .. }
            | EmbeddingError::BadScore { .. } => ErrorCode::BadRequest,
            EmbeddingError::InvalidConfig { .. }
            | EmbeddingError::WrongLength { .. }
            | EmbeddingError::RowLength { .. } => ErrorCode::WrongDimension,
            EmbeddingError::Store(_) => ErrorCode::Storage,
            _ => ErrorCode::Internal,
        };
        refuse(code, e.to_string())
    }
}

impl From<protocol::ProtocolError> for Refusal {
    fn from(e: protocol::ProtocolError) -> Refusal {
        refuse(ErrorCode::BadRequest, e.to_string())
    }
}
