//! How a failed request becomes a Python exception. The classes live in `pstrain/errors.py` (`PsError`, and
//! `PsTimeoutError`/`PsConnectionError`, which are also the builtin `TimeoutError`/`ConnectionError`:
//! multiple inheritance is simplest written in Python); bad arguments are `ValueError`, unknown tables
//! `KeyError`.

use protocol::{ErrorCode, ProtocolError};
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;

/// The exception class `name` of `pstrain.errors`, or `RuntimeError` if that module cannot be imported.
pub(crate) fn class<'py>(py: Python<'py>, name: &str) -> Bound<'py, PyType> {
    py.import("pstrain.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from))
        .unwrap_or_else(|_| py.get_type::<PyRuntimeError>())
}

/// Which exception a request error is, by class name in `pstrain.errors` (or a builtin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `PsTimeoutError`.
    Timeout,
    /// `PsConnectionError`.
    Connection,
    /// `PsError`.
    Server,
    /// `KeyError`.
    UnknownTable,
    /// `ValueError`.
    BadInput,
}

/// Classifies a protocol error.
pub fn kind(e: &ProtocolError) -> Kind {
    match e {
        ProtocolError::Timeout { .. } => Kind::Timeout,
        ProtocolError::Connect { .. }
        | ProtocolError::Connection { .. }
        | ProtocolError::ConnectionLost { .. }
        | ProtocolError::Write(_)
        | ProtocolError::Read(_)
        | ProtocolError::Closed(_) => Kind::Connection,
        ProtocolError::Remote { code, .. } => match code {
            ErrorCode::UnknownTable => Kind::UnknownTable,
            ErrorCode::WrongDimension | ErrorCode::BadRequest | ErrorCode::TableConflict => {
                Kind::BadInput
            }
            _ => Kind::Server,
        },
        ProtocolError::BadPayload(_) => Kind::BadInput,
        _ => Kind::Server,
    }
}

/// A request error that crosses threads as plain data until it is raised.
#[derive(Debug, Clone)]
pub struct RequestError {
    /// Which exception.
    pub kind: Kind,
    /// Its message.
    pub message: String,
}

impl RequestError {
    /// `what` (the operation and table) failed with `e`.
    pub fn new(what: &str, e: ProtocolError) -> RequestError {
        RequestError {
            kind: kind(&e),
            message: format!("{what}: {e}"),
        }
    }

    /// A timeout of the whole operation.
    pub fn timeout(what: &str, secs: f64) -> RequestError {
        RequestError {
            kind: Kind::Timeout,
            message: format!("{what}: no answer within the client's timeout of {secs:.1} s"),
        }
    }

    /// The Python exception.
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        match self.kind {
            Kind::UnknownTable => PyKeyError::new_err(self.message),
            Kind::BadInput => PyValueError::new_err(self.message),
            Kind::Timeout => PyErr::from_type(class(py, "PsTimeoutError"), self.message),
            Kind::Connection => PyErr::from_type(class(py, "PsConnectionError"), self.message),
            Kind::Server => PyErr::from_type(class(py, "PsError"), self.message),
        }
    }
}
