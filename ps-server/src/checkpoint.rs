//! The server side of a [`protocol::Request::Checkpoint`]: the shard map and the time for the manifest, then
//! [`embedding::Engine::checkpoint`] (layout and consistency: `embedding::snapshot`).
//!
//! Blocking (a write-back, a memtable flush, hard links and fsyncs): the QUIC loop runs it on a blocking
//! thread, like a flush.

use std::path::Path;

use embedding::snapshot::{shard_dir, Manifest, ShardInfo};
use embedding::SnapshotError;
use protocol::ShardMap;

use crate::handler::Shard;

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

/// Writes a snapshot of `shard` into `dir/shard-<index>-of-<num_shards>/`; returns its manifest and that
/// directory.
pub fn checkpoint(
    shard: &Shard,
    dir: &Path,
    step: u64,
) -> Result<(Manifest, std::path::PathBuf), SnapshotError> {
    let info = shard_info(&shard.shard_map, shard.shard_index);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let manifest = shard.engine.checkpoint(dir, step, info, now)?;
    crate::writeback::update_gauges(&shard.engine);
    Ok((manifest, shard_dir(dir, info.index, info.num_shards)))
}
