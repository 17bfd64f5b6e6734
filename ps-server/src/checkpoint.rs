//! The server side of a [`protocol::Request::Checkpoint`]: the shard map and the time for the manifest, then
//! [`embedding::Engine::checkpoint`] (layout and consistency: `embedding::snapshot`).
//!
//! Blocking (a write-back, a memtable flush, hard links and fsyncs): the QUIC loop runs it on a blocking
//! thread, like a flush. Called through [`crate::shard::Shard::checkpoint`].

use std::path::{Path, PathBuf};

use embedding::snapshot::{shard_dir, Manifest, ShardInfo};
use embedding::{Engine, SnapshotError};
use protocol::ShardMap;

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
pub fn checkpoint(
    engine: &Engine,
    info: ShardInfo,
    dir: &Path,
    step: u64,
    now: u64,
) -> Result<(Manifest, PathBuf), SnapshotError> {
    let manifest = engine.checkpoint(dir, step, info, now)?;
    crate::writeback::update_gauges(engine);
    Ok((manifest, shard_dir(dir, info.index, info.num_shards)))
}
