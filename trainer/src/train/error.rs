//! [`TrainError`]: why training or evaluation stopped, each variant naming the step and the value at fault.

use protocol::ProtocolError;

use crate::checkpoint::CheckpointError;
use crate::config::ConfigError;
use crate::criteo::ReadError;
use crate::model::ModelError;
use crate::step::dense_sync::DenseSyncError;
use protocol::compression::feedback::ImportError;

/// Why a [`super::Trainer`] call failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model flags cannot work.
    #[error("invalid model config: {0}")]
    Config(#[from] ConfigError),
    /// The dense model refused a call: `what` is the step ("build DLRM", "train step", "predict").
    #[error("{what}: {source}")]
    Model {
        /// The step that failed.
        what: &'static str,
        /// The cause.
        source: ModelError,
    },
    /// Training or test data could not be read: `what` says which ("read training data").
    #[error("{what}: {source}")]
    Data {
        /// Which data, and what was being done.
        what: &'static str,
        /// The cause, naming the file.
        source: ReadError,
    },
    /// A request to the parameter servers failed, or a reply did not fit: `what` names the request and
    /// server ("pull embedding rows", "rows from server 127.0.0.1:7000").
    #[error("{what}: {source}")]
    Servers {
        /// The request.
        what: String,
        /// The cause.
        source: ProtocolError,
    },
    /// A stage thread could not be started.
    #[error("start the {what} thread: {source}")]
    Thread {
        /// The stage ("plan", "push").
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// A stage ended without an answer (it panicked or was cancelled: a bug).
    #[error("the {0} stopped without an answer")]
    Stopped(&'static str),
    /// The loss is no longer finite.
    #[error("training loss became {loss} at step {step}: lower --lr")]
    NonFiniteLoss {
        /// The loss.
        loss: f32,
        /// The step it was computed at.
        step: u64,
    },
    /// A checkpoint could not be written, read or used.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// An export could not be written.
    #[error(transparent)]
    Export(#[from] crate::export::ExportError),
    /// A checkpoint's error-feedback residuals do not load.
    #[error("error-feedback residuals in {}: {source}", path.display())]
    Residuals {
        /// The checkpoint file.
        path: std::path::PathBuf,
        /// The cause.
        source: ImportError,
    },
    /// Dense parameters on the servers could not be used.
    #[error(transparent)]
    DenseSync(#[from] DenseSyncError),
    /// The hybrid mode's dense reduce failed.
    #[error(transparent)]
    Reduce(#[from] crate::step::dense_reduce::ReduceError),
}

impl TrainError {
    /// A [`TrainError::Servers`] of request `what`.
    pub fn servers(what: impl Into<String>) -> impl FnOnce(ProtocolError) -> TrainError {
        let what = what.into();
        move |source| TrainError::Servers { what, source }
    }

    /// A [`TrainError::Data`] of `what`.
    pub fn data(what: &'static str) -> impl FnOnce(ReadError) -> TrainError {
        move |source| TrainError::Data { what, source }
    }

    /// A [`TrainError::Model`] of step `what`.
    pub fn model(what: &'static str) -> impl FnOnce(ModelError) -> TrainError {
        move |source| TrainError::Model { what, source }
    }

    /// A [`TrainError::Thread`] of stage `what`.
    pub fn thread(what: &'static str) -> impl FnOnce(std::io::Error) -> TrainError {
        move |source| TrainError::Thread { what, source }
    }
}

/// The result of a [`super::Trainer`] call.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;
