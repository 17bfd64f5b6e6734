//! Request and response headers, and the layout of their payloads: the enums here, one child module per
//! request type (its header fields' types, payload layout, builder and decoder).
//!
//! Every request travels on its own bidirectional QUIC stream: the client writes one frame ([`crate::wire::frame`]) and
//! finishes its side; the server answers with one frame. Headers carry kinds and counts; payloads carry ids
//! (one id section per table: ascending, delta + varint coded, see [`crate::wire::ids`]) and rows (in the request's
//! [`Encoding`], see [`crate::compression::codec`]) for each table in header order.
//!
//! | request | payload | response | payload |
//! | --- | --- | --- | --- |
//! | [`Request::Hello`] | none | [`Response::Hello`] | none |
//! | [`Request::RegisterTables`] | none | [`Response::Registered`] | none |
//! | [`Request::Pull`] | ids of table 0, ids of table 1, ... | [`Response::Pulled`] | rows of table 0, ... |
//! | [`Request::Push`] | ids of every table, then gradient rows of every table | [`Response::Pushed`] | none |
//! | [`Request::Flush`] | none | [`Response::Flushed`] | none |
//! | [`Request::Checkpoint`] | none | [`Response::Checkpointed`] | none |
//! | [`Request::PullWithState`] | ids of table 0, ... | [`Response::PulledWithState`] | rows of table 0, ..., then optimizer state of table 0, ... (f32 LE) |
//! | [`Request::Prefetch`] | ids of table 0, ids of table 1, ... | [`Response::Prefetched`] | none |
//! | [`Request::Reduce`] | f32 LE values | [`Response::Reduced`] | f32 LE sums |
//! | [`Request::SyncDeltas`] | none | [`Response::Deltas`] | ids of every table, rows of every table, then dense f32 LE values if announced ([`crate::wire::message::sync`]) |
//! | [`Request::PublishDense`] | f32 LE values | [`Response::Published`] | none |
//! | [`Request::Replicate`] | ids then full rows of every table ([`crate::wire::message::replicate`]) | [`Response::Replicated`] | none |
//! | [`Request::Join`] | none | [`Response::Joined`] | none |
//! | [`Request::Promote`] | none | [`Response::Promoted`] | none |
//! | [`Request::GetShardMap`] | none | [`Response::ShardMap`] | none |
//! | [`Request::Reshard`] | none | [`Response::Resharding`] | none |
//! | [`Request::MoveRows`] | ids then full rows of every table ([`crate::wire::message::reshard`]) | [`Response::MovedRows`] | none |
//! | [`Request::WriteRows`] | ids of every table, then f32 LE weights of every table ([`crate::wire::message::write_rows`]) | [`Response::WroteRows`] | none |
//! | [`Request::Score`] | ids of every table, then one f32 LE score per id ([`crate::wire::message::score`]) | [`Response::Scored`] | none |
//!
//! Any request may be answered by [`Response::Error`].

use serde::{Deserialize, Serialize};

pub use embedding::{
    AdmissionConfig, EvictionConfig, EvictionPolicy, InitConfig, InitKind, OptimizerConfig,
    RowPrecision, ScoreMode, TableConfig,
};

use crate::compression::codec::Encoding;
use crate::error::ErrorCode;
use crate::wire::layout::TableCount;

pub mod hello;
pub mod prefetch;
pub mod pull;
pub mod pull_with_state;
pub mod push;
pub mod reduce;
pub mod replicate;
pub mod reshard;
pub mod score;
pub mod sync;
pub mod write_rows;

/// A request header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Handshake: which shard is this, which epoch, which tables.
    Hello {
        /// The client's [`crate::PROTOCOL_VERSION`].
        version: u32,
    },
    /// Create tables (idempotent for identical configs); the server validates each as one from a file.
    RegisterTables {
        /// The tables.
        #[serde(with = "crate::wire::tables")]
        tables: Vec<TableConfig>,
    },
    /// Read rows; unknown ids read as their initializer.
    Pull {
        /// The client's shard-map epoch.
        epoch: u64,
        /// Encoding of the rows in the response.
        encoding: Encoding,
        /// Per-table counts, in payload order.
        tables: Vec<TableCount>,
    },
    /// Apply gradients with each table's optimizer.
    Push {
        /// The client's shard-map epoch.
        epoch: u64,
        /// Encoding of the gradient rows in the payload.
        encoding: Encoding,
        /// The sender multiplied every gradient by this before encoding (loss scaling, so that small gradients
        /// survive f16); the server divides by it. Finite and > 0.
        grad_scale: f32,
        /// Per-table counts, in payload order.
        tables: Vec<TableCount>,
        /// Who sent this push and its number: a retry carries the same id, and the server answers it with
        /// the first answer instead of applying it again ([`push::PushId`]; [`push::PushId::NONE`]: no
        /// de-duplication).
        id: push::PushId,
        /// Every table's learning rate is multiplied by this for this push (a learning-rate schedule on the
        /// trainer; 1: the registered rate). Finite and >= 0; refused for an FTRL table unless 1.
        lr_scale: f32,
    },
    /// Write every dirty row to storage now.
    Flush,
    // Variants below were added after the first release; bincode numbers variants by position, so new ones go
    // last.
    /// Write a consistent snapshot of the server's tables into `<root>/dir/shard-<index>-of-<num_shards>/`
    /// (`root` is the server's checkpoint root, `--checkpoint-root`; the shard folder must not exist yet):
    /// dirty rows, a RocksDB checkpoint and `manifest.json`.
    Checkpoint {
        /// Snapshot directory: a relative name under the server's checkpoint root (no `..`), or an absolute
        /// path inside it. Anything else is refused.
        dir: String,
        /// The caller's training step, recorded in the manifest.
        step: u64,
        /// Also write the snapshot's tables as one SafeTensors file per shard
        /// (`embedding::snapshot::tensors::TABLES_FILE`), readable without our code: an export's.
        tensors: bool,
        /// Rows the snapshot leaves out (an export's publish-time pruning; the server keeps them).
        prune: Option<embedding::ExportPrune>,
    },
    /// Read rows and their optimizer state: a trainer with pushes in flight replays its own unacknowledged
    /// updates on the pulled rows, which needs the state the server applies them with (e.g. row-wise
    /// Adagrad's accumulator).
    PullWithState {
        /// The client's shard-map epoch.
        epoch: u64,
        /// Encoding of the rows in the response (the state is always f32).
        encoding: Encoding,
        /// Per-table counts, in payload order.
        tables: Vec<TableCount>,
    },
    /// Bring the rows of these ids into the server's memory and keep them there until their batch has
    /// passed: lookahead prefetch into the capacity tier ([`crate::wire::message::prefetch`]). Nothing is returned
    /// but counts.
    Prefetch {
        /// The client's shard-map epoch.
        epoch: u64,
        /// Who holds the lease: a number the client draws once (one trainer's pass).
        owner: u64,
        /// The lease's number within `owner` (a batch index); the ids stay pinned until a later prefetch of
        /// `owner` releases it, or the server's pin deadline passes.
        lease: u64,
        /// Releases every lease of `owner` numbered below this (0 releases none) before pinning.
        release_below: u64,
        /// Per-table counts, in payload order (may be empty: a pure release).
        tables: Vec<TableCount>,
    },
    /// Add this trainer's slice of a vector to the other trainers' of the same step, and answer with the sum
    /// once every rank contributed (the hybrid dense mode's all-reduce, [`crate::wire::message::reduce`]).
    Reduce {
        /// Who, which step, how many values.
        header: crate::wire::message::reduce::ReduceHeader,
    },
    /// The current values of the rows changed after `cursor` (or a full scan), for serving
    /// ([`crate::wire::message::sync`]); waits up to `wait_ms` for the next delta when there is none.
    SyncDeltas {
        /// What the subscriber holds: the cursor of its last answer, or [`crate::wire::message::sync::SyncCursor::START`].
        cursor: crate::wire::message::sync::SyncCursor,
        /// Encoding of the rows in the answer: f32, f16 or bf16.
        encoding: Encoding,
        /// Most rows in one answer, `1..=`[`crate::wire::message::sync::MAX_ROWS`].
        max_rows: u32,
        /// Milliseconds to wait for a delta when the subscriber is up to date (cut to
        /// [`crate::wire::message::sync::MAX_WAIT_MS`]; 0 answers at once).
        wait_ms: u32,
        /// The dense version the subscriber holds: a newer one held by the server is appended (0: none held).
        dense_version: u64,
    },
    /// Keep these dense parameters (payload: `len` f32 LE) for sync subscribers; a server keeps the newest
    /// version it was given.
    PublishDense {
        /// The publishing job (a number it draws once): versions must grow within a job.
        job: u64,
        /// The publisher's version, > 0 (newer is larger): the time of publication in Unix microseconds,
        /// no later than the server's clock plus [`crate::wire::message::sync::MAX_DENSE_CLOCK_SKEW_US`].
        version: u64,
        /// The training step of the values.
        step: u64,
        /// Values in the payload, `<=` [`crate::wire::message::sync::MAX_DENSE_VALUES`].
        len: u32,
    },
    /// From a primary to one of its backups: whole rows to store ([`crate::wire::message::replicate`]).
    Replicate {
        /// Epoch, session, sequence, tables.
        header: crate::wire::message::replicate::ReplicateHeader,
    },
    /// From a backup to its primary: stream to me (replica `replica_index` of the shard), starting with every
    /// table and row (a catch-up scan), under `session`.
    Join {
        /// The shard epoch the backup holds: a primary with an older one steps down instead.
        shard_epoch: u64,
        /// The backup's replica index.
        replica_index: u32,
        /// A number the backup draws for this join; the stream's messages carry it.
        session: u64,
    },
    /// From a client to an in-sync backup whose primary it cannot reach: become the primary.
    Promote {
        /// The highest shard epoch the client has seen for this shard.
        shard_epoch: u64,
        /// An operator's cold start (`ps-server promote --force`, admin role only): a replica still starting
        /// because it cannot hear from enough of its peers becomes the primary from its own disk.
        force: bool,
    },
    /// The server's shard map (a client told `WrongEpoch` re-routes with it, [`crate::wire::message::reshard`]).
    GetShardMap,
    /// A step of a live reshard, from its coordinator (`ps-server reshard`).
    Reshard {
        /// Prepare, status, commit or abort.
        step: crate::wire::message::reshard::ReshardStep,
    },
    /// From a source server to a destination during a reshard: whole rows of moving virtual shards.
    MoveRows {
        /// Target epoch, source, sequence, tables.
        header: crate::wire::message::reshard::MoveHeader,
    },
    /// Set the weights of rows (a trainer loading saved weights): the payload is a push's, f32 weights in
    /// place of gradients ([`write_rows`]).
    WriteRows {
        /// The client's shard-map epoch.
        epoch: u64,
        /// Per-table counts, in payload order.
        tables: Vec<TableCount>,
    },
    /// Give ids of tables that evict by score their scores ([`score`]): one f32 per id after the id sections.
    Score {
        /// The client's shard-map epoch.
        epoch: u64,
        /// Whether the scores add to the rows' or replace them.
        mode: ScoreMode,
        /// Per-table counts (`dim` 1: one score per id), in payload order.
        tables: Vec<TableCount>,
    },
}

/// Which request a [`Request`] is, without its fields: what roles are checked against
/// ([`crate::auth::Role::allows`]) and what request metrics are labelled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// [`Request::Hello`].
    Hello,
    /// [`Request::RegisterTables`].
    RegisterTables,
    /// [`Request::Pull`].
    Pull,
    /// [`Request::Push`].
    Push,
    /// [`Request::Flush`].
    Flush,
    /// [`Request::Checkpoint`].
    Checkpoint,
    /// [`Request::PullWithState`].
    PullWithState,
    /// [`Request::Prefetch`].
    Prefetch,
    /// [`Request::Reduce`].
    Reduce,
    /// [`Request::SyncDeltas`].
    SyncDeltas,
    /// [`Request::PublishDense`].
    PublishDense,
    /// [`Request::Replicate`].
    Replicate,
    /// [`Request::Join`].
    Join,
    /// [`Request::Promote`].
    Promote,
    /// [`Request::GetShardMap`].
    GetShardMap,
    /// [`Request::Reshard`].
    Reshard,
    /// [`Request::MoveRows`].
    MoveRows,
    /// [`Request::WriteRows`].
    WriteRows,
    /// [`Request::Score`].
    Score,
}

impl RequestKind {
    /// Every kind, in wire order.
    pub const ALL: [RequestKind; 19] = [
        RequestKind::Hello,
        RequestKind::RegisterTables,
        RequestKind::Pull,
        RequestKind::Push,
        RequestKind::Flush,
        RequestKind::Checkpoint,
        RequestKind::PullWithState,
        RequestKind::Prefetch,
        RequestKind::Reduce,
        RequestKind::SyncDeltas,
        RequestKind::PublishDense,
        RequestKind::Replicate,
        RequestKind::Join,
        RequestKind::Promote,
        RequestKind::GetShardMap,
        RequestKind::Reshard,
        RequestKind::MoveRows,
        RequestKind::WriteRows,
        RequestKind::Score,
    ];

    /// The request's name, for messages (the variant's name).
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Hello => "Hello",
            RequestKind::RegisterTables => "RegisterTables",
            RequestKind::Pull => "Pull",
            RequestKind::Push => "Push",
            RequestKind::Flush => "Flush",
            RequestKind::Checkpoint => "Checkpoint",
            RequestKind::PullWithState => "PullWithState",
            RequestKind::Prefetch => "Prefetch",
            RequestKind::Reduce => "Reduce",
            RequestKind::SyncDeltas => "SyncDeltas",
            RequestKind::PublishDense => "PublishDense",
            RequestKind::Replicate => "Replicate",
            RequestKind::Join => "Join",
            RequestKind::Promote => "Promote",
            RequestKind::GetShardMap => "GetShardMap",
            RequestKind::Reshard => "Reshard",
            RequestKind::MoveRows => "MoveRows",
            RequestKind::WriteRows => "WriteRows",
            RequestKind::Score => "Score",
        }
    }

    /// The `kind` label of the request's metrics. A pull with state is a pull (dashboards and alerts select
    /// `kind="pull"`).
    pub fn label(self) -> &'static str {
        match self {
            RequestKind::Hello => "hello",
            RequestKind::RegisterTables => "register",
            RequestKind::Pull | RequestKind::PullWithState => "pull",
            RequestKind::Push => "push",
            RequestKind::Flush => "flush",
            RequestKind::Checkpoint => "checkpoint",
            RequestKind::Prefetch => "prefetch",
            RequestKind::Reduce => "reduce",
            RequestKind::SyncDeltas => "sync",
            RequestKind::PublishDense => "publish_dense",
            RequestKind::Replicate => "replicate",
            RequestKind::Join => "join",
            RequestKind::Promote => "promote",
            RequestKind::GetShardMap => "get_shard_map",
            RequestKind::Reshard => "reshard",
            RequestKind::MoveRows => "move_rows",
            RequestKind::WriteRows => "write_rows",
            RequestKind::Score => "score",
        }
    }
}

impl Request {
    /// Which request this is.
    pub fn kind(&self) -> RequestKind {
        match self {
            Request::Hello { .. } => RequestKind::Hello,
            Request::RegisterTables { .. } => RequestKind::RegisterTables,
            Request::Pull { .. } => RequestKind::Pull,
            Request::Push { .. } => RequestKind::Push,
            Request::Flush => RequestKind::Flush,
            Request::Checkpoint { .. } => RequestKind::Checkpoint,
            Request::PullWithState { .. } => RequestKind::PullWithState,
            Request::Prefetch { .. } => RequestKind::Prefetch,
            Request::Reduce { .. } => RequestKind::Reduce,
            Request::SyncDeltas { .. } => RequestKind::SyncDeltas,
            Request::PublishDense { .. } => RequestKind::PublishDense,
            Request::Replicate { .. } => RequestKind::Replicate,
            Request::Join { .. } => RequestKind::Join,
            Request::Promote { .. } => RequestKind::Promote,
            Request::GetShardMap => RequestKind::GetShardMap,
            Request::Reshard { .. } => RequestKind::Reshard,
            Request::MoveRows { .. } => RequestKind::MoveRows,
            Request::WriteRows { .. } => RequestKind::WriteRows,
            Request::Score { .. } => RequestKind::Score,
        }
    }
}

/// A response header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello {
        /// This server's shard index.
        shard_index: u32,
        /// Number of servers in the shard map.
        num_shards: u32,
        /// Shard-map epoch.
        epoch: u64,
        /// The server's [`crate::ShardMap::routing_fingerprint`].
        routing: u64,
        /// Tables known to this server, without the admission and TTL its table policy gave them.
        #[serde(with = "crate::wire::tables")]
        tables: Vec<TableConfig>,
        /// Its place among its shard's replicas.
        replica: crate::wire::message::replicate::ReplicaInfo,
    },
    /// Answer to [`Request::RegisterTables`].
    Registered {
        /// Number of tables now registered on the server.
        tables: u32,
    },
    /// Answer to [`Request::Pull`]; rows follow in the payload.
    Pulled {
        /// Encoding of the rows.
        encoding: Encoding,
        /// Per-table counts, in payload order.
        tables: Vec<TableCount>,
    },
    /// Answer to [`Request::Push`].
    Pushed {
        /// Rows updated.
        rows: u64,
        /// Rows refused because their gradient was not finite.
        rejected_nonfinite: u64,
    },
    /// Answer to [`Request::Flush`].
    Flushed {
        /// Rows written.
        rows: u64,
    },
    /// A typed error.
    Error {
        /// The code.
        code: ErrorCode,
        /// A message naming the offending value.
        message: String,
    },
    /// Answer to [`Request::Checkpoint`].
    Checkpointed {
        /// Rows in the snapshot, over all tables.
        rows: u64,
        /// The shard directory written.
        dir: String,
    },
    /// Answer to [`Request::PullWithState`]: the rows of every table in `encoding`, then `count x
    /// state_lens[i]` f32 (LE) of optimizer state for each table `i` of `tables`.
    PulledWithState {
        /// Encoding of the rows.
        encoding: Encoding,
        /// Per-table counts, in payload order.
        tables: Vec<TableCount>,
        /// f32s of optimizer state per row, per table (0 for SGD, 1 for row-wise Adagrad).
        state_lens: Vec<u32>,
    },
    /// Answer to [`Request::Prefetch`], once the rows are in memory.
    Prefetched {
        /// What the server did.
        stats: crate::wire::message::prefetch::LeaseStats,
    },
    /// Answer to [`Request::Reduce`]: the sums follow in the payload.
    Reduced {
        /// Samples, contributors and missing ranks of the sum.
        header: crate::wire::message::reduce::ReducedHeader,
    },
    /// Answer to [`Request::SyncDeltas`]: ids, rows and dense values follow in the payload.
    Deltas {
        /// Cursor, completeness, tables, times, dense version.
        header: crate::wire::message::sync::DeltasHeader,
    },
    /// Answer to [`Request::PublishDense`].
    Published {
        /// The newest version the server holds (the one published, or a newer one published before).
        version: u64,
    },
    /// Answer to [`Request::Replicate`]: the rows are stored (in memory).
    Replicated {
        /// Sequence number of the last message stored.
        seq: u64,
    },
    /// Answer to [`Request::Join`]: the primary starts streaming.
    Joined {
        /// The primary's shard epoch.
        shard_epoch: u64,
    },
    /// Answer to [`Request::Promote`]: the replica is the primary now (or already was).
    Promoted {
        /// Its shard epoch.
        shard_epoch: u64,
    },
    /// Answer to [`Request::GetShardMap`].
    ShardMap {
        /// The map.
        map: crate::wire::message::reshard::MapInfo,
    },
    /// Answer to [`Request::Reshard`].
    Resharding {
        /// Where the server is.
        status: crate::wire::message::reshard::ReshardStatus,
    },
    /// Answer to [`Request::MoveRows`]: the rows are stored (in memory).
    MovedRows {
        /// Sequence number of the request stored.
        seq: u64,
    },
    /// Answer to [`Request::WriteRows`]: the weights are set.
    WroteRows {
        /// Rows written.
        rows: u64,
    },
    /// Answer to [`Request::Score`]: the scores are kept.
    Scored {
        /// Ids that had a row in memory (the others are not scored).
        rows: u64,
    },
}

impl Response {
    /// The variant's name, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Response::Hello { .. } => "Hello",
            Response::Registered { .. } => "Registered",
            Response::Pulled { .. } => "Pulled",
            Response::Pushed { .. } => "Pushed",
            Response::Flushed { .. } => "Flushed",
            Response::Error { .. } => "Error",
            Response::Checkpointed { .. } => "Checkpointed",
            Response::PulledWithState { .. } => "PulledWithState",
            Response::Prefetched { .. } => "Prefetched",
            Response::Reduced { .. } => "Reduced",
            Response::Deltas { .. } => "Deltas",
            Response::Published { .. } => "Published",
            Response::Replicated { .. } => "Replicated",
            Response::Joined { .. } => "Joined",
            Response::Promoted { .. } => "Promoted",
            Response::ShardMap { .. } => "ShardMap",
            Response::Resharding { .. } => "Resharding",
            Response::MovedRows { .. } => "MovedRows",
            Response::WroteRows { .. } => "WroteRows",
            Response::Scored { .. } => "Scored",
        }
    }
}
