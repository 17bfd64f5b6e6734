//! Errors of the protocol layer and the typed error codes carried in [`crate::Response::Error`].

use serde::{Deserialize, Serialize};

/// What went wrong on the server side, as carried on the wire. Clients decide on retries from the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request could not be decoded (bad header, bad payload length).
    BadRequest,
    /// The frame is larger than the server's cap.
    FrameTooLarge,
    /// The table id is not registered on this server.
    UnknownTable,
    /// Dimensions or counts in the request disagree with the table or with each other.
    WrongDimension,
    /// The request's shard-map epoch differs from the server's: refresh the shard map.
    WrongEpoch,
    /// An id in the request does not belong to this server's shard.
    WrongShard,
    /// A table was registered twice with different configs.
    TableConflict,
    /// The protocol version is not supported.
    UnsupportedVersion,
    /// The server is shutting down; retry against the restarted server.
    ShuttingDown,
    /// A storage error on the server (e.g. RocksDB write failure).
    Storage,
    /// Anything else.
    Internal,
    // Codes below were added after the first release (bincode numbers variants by position).
    /// This replica is not its shard's primary (a backup, or a primary that stepped down): find the primary.
    NotPrimary,
    /// The request carries an older shard epoch than this replica holds: the sender is a deposed primary, or
    /// a client that has not seen the last promotion.
    StaleEpoch,
    /// A backup asked to promote itself does not hold every acknowledged row (still catching up), or still
    /// hears from its primary.
    NotInSync,
    /// A reshard step that does not fit the server's state (no reshard prepared, another one under way, a
    /// replicated shard), or a request that must wait until a reshard commits (a checkpoint): transient.
    Resharding,
    /// The connection's role may not send this request (`crate::auth`): the message names both.
    Forbidden,
    /// A primary with `replicated` durability and `replicated-without-backup = "refuse"` has no backup in
    /// sync, so it acknowledges no push: transient, a backup catches up.
    NoBackup,
    /// A retried push whose first copy this server is still applying (or waiting for its backups): transient,
    /// the retry then gets the first copy's answer.
    InProgress,
}

impl ErrorCode {
    /// Whether a client may retry the same request later with a chance of success.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorCode::ShuttingDown
                | ErrorCode::Storage
                | ErrorCode::NotPrimary
                | ErrorCode::Resharding
                | ErrorCode::NoBackup
                | ErrorCode::InProgress
        )
    }
}

/// Errors of framing, codecs, TLS set-up and requests.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A request was addressed to a server index the current shard map does not have (a reshard removed it
    /// since the request's ids were grouped); the client re-routes such requests itself.
    #[error("server index {server} is not in the shard map of {servers} servers")]
    NotInMap {
        /// The index.
        server: usize,
        /// Servers in the current map.
        servers: usize,
    },
    /// A frame announced more bytes than the cap allows.
    #[error("frame of {size} bytes exceeds the cap of {cap} bytes")]
    FrameTooLarge {
        /// Announced frame size (header + payload).
        size: u64,
        /// The configured cap.
        cap: u64,
    },
    /// The frame's fixed prefix is wrong (bad magic).
    #[error("bad frame magic {found:#010x}, expected {expected:#010x} (not a ps/1 peer?)")]
    BadMagic {
        /// What was read.
        found: u32,
        /// What was expected.
        expected: u32,
    },
    /// The stream ended before the announced frame was complete.
    #[error("truncated frame: got {got} of {expected} bytes")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes announced.
        expected: usize,
    },
    /// A stream made no progress for the idle bound (`what`: `read` or `write`): the peer stalled mid-frame
    /// or stopped reading its replies.
    #[error("stream {what} made no progress for {idle:?}")]
    Idle {
        /// `read` or `write`.
        what: &'static str,
        /// The bound.
        idle: std::time::Duration,
    },
    /// The bincode header did not decode.
    #[error("bad frame header: {0}")]
    BadHeader(String),
    /// A payload's length disagrees with its header.
    #[error("bad payload: {0}")]
    BadPayload(String),
    /// The server answered with a typed error.
    #[error("server {server} answered {code:?}: {message}")]
    Remote {
        /// Address of the server.
        server: String,
        /// Typed code.
        code: ErrorCode,
        /// Human-readable message naming the offending value.
        message: String,
    },
    /// The server answered with a response of the wrong kind.
    #[error("server {server}: unexpected response {got}, expected {expected}")]
    UnexpectedResponse {
        /// Address of the server.
        server: String,
        /// What arrived.
        got: String,
        /// What the request expects.
        expected: &'static str,
    },
    /// TLS material could not be created or loaded.
    #[error("tls: {0}")]
    Tls(String),
    /// QUIC connection failure.
    #[error("connection to {server}: {source}")]
    Connection {
        /// Address of the server.
        server: String,
        /// The QUIC error.
        #[source]
        source: quinn::ConnectionError,
    },
    /// Connecting failed before a connection existed.
    #[error("connect to {server}: {message}")]
    Connect {
        /// Address of the server.
        server: String,
        /// Why.
        message: String,
    },
    /// Stream write failure.
    #[error("stream write: {0}")]
    Write(#[from] quinn::WriteError),
    /// Stream read failure.
    #[error("stream read: {0}")]
    Read(#[from] quinn::ReadExactError),
    /// The stream was closed by the peer (e.g. the server died mid-request).
    #[error("stream closed: {0}")]
    Closed(#[from] quinn::ClosedStream),
    /// A TCP connection failed or was closed (the server died, reset the connection, or refused TLS).
    #[error("tcp connection to {server} lost: {reason}")]
    ConnectionLost {
        /// Address of the server.
        server: String,
        /// Why, as the socket or TLS layer reported it.
        reason: String,
    },
    /// The request timed out.
    #[error("request to {server} timed out after {secs:.1}s")]
    Timeout {
        /// Address of the server.
        server: String,
        /// Timeout in seconds.
        secs: f64,
    },
    /// Local I/O (socket creation, certificate files).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path or address.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The frame magic is another version of this protocol (`PS` followed by other digits than ours).
    #[error("frame protocol version {found:?}, this peer speaks {expected:?}")]
    WrongVersion {
        /// The version digits read (the magic's last two bytes, lossily as text).
        found: String,
        /// This peer's version digits.
        expected: String,
    },
    /// A replica is not the primary its client needs: a backup, a replica still starting, or a primary of an
    /// older shard epoch than the client has seen (a deposed primary that came back: fenced). The client
    /// looks for the shard's primary and retries.
    #[error("server {server} is not the primary of its shard: {why}")]
    NotPrimary {
        /// Address of the replica.
        server: String,
        /// Its role and epoch against what the client knows.
        why: String,
    },
}

impl ProtocolError {
    /// Whether retrying (after reconnecting) may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ProtocolError::Remote { code, .. } => code.is_transient(),
            ProtocolError::Connection { .. }
            | ProtocolError::Connect { .. }
            | ProtocolError::Write(_)
            | ProtocolError::Read(_)
            | ProtocolError::Closed(_)
            | ProtocolError::ConnectionLost { .. }
            | ProtocolError::Idle { .. }
            | ProtocolError::NotPrimary { .. }
            | ProtocolError::Timeout { .. } => true,
            _ => false,
        }
    }
}
