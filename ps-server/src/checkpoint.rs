//! The server side of a [`protocol::Request::Checkpoint`]: the shard map and the time for the manifest, then
//! [`embedding::Engine::checkpoint`] (layout and consistency: `embedding::snapshot`).
//!
//! The snapshot's shard directory also gets `sync.json`, the delta sync's seq the snapshot is consistent with
//! ([`checkpoint`]).
//!
//! Blocking (a write-back, a memtable flush, hard links and fsyncs): the QUIC loop runs it on a blocking
//! thread, like a flush. Called through [`crate::shard::Shard::checkpoint`].

use std::path::{Path, PathBuf};

use embedding::snapshot::{shard_dir, Manifest, ShardInfo};
use embedding::{Engine, SnapshotError};
use protocol::wire::message::sync::{SyncPoint, SYNC_FILE};
use protocol::ShardMap;

use crate::sync::SyncState;

/// The manifest's description of a server's place in `map`.
pub fn shard_info(map: &ShardMap, index: u32) -> ShardInfo {
    ShardInfo {
        index,
        num_shards: map.num_servers,
        epoch: map.epoch,
        num_virtual_shards: map.num_virtual,
        routing_fingerprint: map.routing_fingerprint(),
    }
}

/// Writes a snapshot of `engine`, the shard `info` describes, into `dir/shard-<index>-of-<num_shards>/`, its
/// manifest created at Unix time `now`; returns the manifest and that directory.
///
/// While pushes are held (every push records its changes under the same gate), the delta sync cuts a delta
/// ([`SyncState::cut`], at `now_us`) and `sync.json` ([`SyncPoint`]) records its seq: the snapshot holds
/// every change up to that seq and none after it, so serving loading the snapshot resumes from there.
pub fn checkpoint(
    engine: &Engine,
    sync: &SyncState,
    info: ShardInfo,
    dir: &Path,
    step: u64,
    now_us: u64,
    prune: Option<&embedding::ExportPrune>,
) -> Result<(Manifest, PathBuf), SnapshotError> {
    let mut paused = || {
        let point = SyncPoint {
            incarnation: sync.incarnation,
            seq: sync.cut(now_us),
        };
        vec![(SYNC_FILE.to_owned(), point.to_json())]
    };
    let manifest =
        engine.checkpoint_with(dir, step, info, now_us / 1_000_000, &mut paused, prune)?;
    crate::writeback::update_gauges(engine);
    Ok((manifest, shard_dir(dir, info.index, info.num_shards)))
}
