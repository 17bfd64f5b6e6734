//! Every metric the server exports: names in one place, described once.
//!
//! Latency histograms use buckets from 50 µs to 10 s ([`LATENCY_BUCKETS`]), which covers a small pull on
//! loopback up to a RocksDB write-back of a large table.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Requests served, labelled `kind` (pull, push, hello, register, flush).
pub const REQUESTS_TOTAL: &str = "ps_requests_total";
/// Error responses, labelled `code`.
pub const REQUEST_ERRORS_TOTAL: &str = "ps_request_errors_total";
/// Request handling latency, labelled `kind`.
pub const REQUEST_SECONDS: &str = "ps_request_duration_seconds";
/// Rows returned by pulls.
pub const ROWS_PULLED_TOTAL: &str = "ps_rows_pulled_total";
/// Gradient rows applied by pushes.
pub const ROWS_PUSHED_TOTAL: &str = "ps_rows_pushed_total";
/// Gradient rows rejected because they held NaN or infinity.
pub const ROWS_REJECTED_NONFINITE_TOTAL: &str = "ps_rows_rejected_nonfinite_total";
/// Push updates undone because they would have left a non-finite weight or optimizer state in their row
/// (`weight-guard = "refuse"`, or non-finite state under `clamp`).
pub const ROWS_REFUSED_NONFINITE_WEIGHTS_TOTAL: &str = "ps_rows_refused_nonfinite_weights_total";
/// Push updates whose weights were bounded to `weight-clamp-abs` (`weight-guard = "clamp"`).
pub const ROWS_CLAMPED_WEIGHTS_TOTAL: &str = "ps_rows_clamped_weights_total";
/// Gradient rows dropped by frequency admission: their id had no row and fewer than `admission-min-count`
/// pushes.
pub const ROWS_REJECTED_ADMISSION_TOTAL: &str = "ps_rows_rejected_admission_total";
/// Rows deleted by TTL expiry (untouched for `row-ttl-secs`), from memory and RocksDB.
pub const ROWS_EXPIRED_TOTAL: &str = "ps_rows_expired_total";
/// Rows deleted by a table's row cap (its `eviction`: the least frequently updated past `max_rows` or
/// `max_bytes`), from memory and RocksDB.
pub const ROWS_CAPPED_TOTAL: &str = "ps_rows_capped_total";
/// Duration of one expiry pass over the tables with a TTL; buckets 50 µs .. 10 s.
pub const EXPIRE_SECONDS: &str = "ps_expire_duration_seconds";
/// Request bytes received (frames).
pub const BYTES_RECEIVED_TOTAL: &str = "ps_bytes_received_total";
/// Response bytes sent (frames).
pub const BYTES_SENT_TOTAL: &str = "ps_bytes_sent_total";
/// Rows held in memory, labelled `table`.
pub const ROWS_IN_MEMORY: &str = "ps_rows_in_memory";
/// Rows stored in RocksDB, labelled `table` (RocksDB's estimate; refreshed at each write-back).
pub const ROWS_ON_DISK: &str = "ps_rows_on_disk";
/// Bytes of row arenas and indexes.
pub const MEMORY_BYTES: &str = "ps_memory_bytes";
/// Gauge: bytes RocksDB holds in memory, by `kind` (`memtables`, `block_cache`, `table_readers`).
pub const ROCKSDB_MEMORY_BYTES: &str = "ps_rocksdb_memory_bytes";
/// Gauge: the process's resident set size (`VmRSS`), bytes.
pub const PROCESS_RESIDENT_BYTES: &str = "ps_process_resident_bytes";
/// Gauge: jemalloc's statistics, bytes, by `kind`: `allocated` (what the process holds), `active` (its pages),
/// `resident` (physically resident allocator pages, metadata included), `metadata`, `retained` (unmapped but
/// kept virtual). Linux builds only.
pub const ALLOCATOR_BYTES: &str = "ps_allocator_bytes";
/// Rows written back to RocksDB.
pub const WRITEBACK_ROWS_TOTAL: &str = "ps_writeback_rows_total";
/// Writes of dirty rows to RocksDB: a write batch, or a whole table's rows as sorted files.
pub const WRITEBACK_BATCHES_TOTAL: &str = "ps_writeback_batches_total";
/// Duration of one write-back of all dirty rows.
pub const WRITEBACK_SECONDS: &str = "ps_writeback_duration_seconds";
/// Checkpoints refused because the snapshot could not be written (a full or failing disk); answered
/// `Storage`, so the client retries.
pub const CHECKPOINTS_FAILED_TOTAL: &str = "ps_checkpoints_failed_total";
/// Bytes of `tables.safetensors` files written for export snapshots (the tables as SafeTensors).
pub const CHECKPOINT_TENSOR_BYTES_TOTAL: &str = "ps_checkpoint_tensor_bytes_total";
/// Gauge: rows of `sync` pushes applied in memory whose synced write is not done (reads of them wait).
pub const UNSYNCED_ROWS: &str = "ps_unsynced_rows";
/// Reads (pulls, delta-sync answers) that found a row not yet durable and waited for its synced write.
pub const READS_WAITED_FOR_SYNC_TOTAL: &str = "ps_reads_waited_for_sync_total";
/// Failed write-backs.
pub const WRITEBACK_ERRORS_TOTAL: &str = "ps_writeback_errors_total";
/// Duration of the synced RocksDB write of one push (`durability = "sync"`), buckets 50 µs .. 10 s (an fsync
/// is typically 0.1 .. 20 ms).
pub const SYNC_PUSH_WRITE_SECONDS: &str = "ps_sync_push_write_duration_seconds";
/// Rows written by synced push writes (`durability = "sync"`).
pub const SYNC_PUSH_ROWS_TOTAL: &str = "ps_sync_push_rows_total";
/// Deltas cut by the delta sync ([`crate::sync`]).
pub const SYNC_DELTAS_CUT_TOTAL: &str = "ps_sync_deltas_cut_total";
/// Histogram: distinct rows per delta cut; buckets 1 .. 16 Mi, powers of 4 (`ops::http::ROW_COUNT_BUCKETS`).
pub const SYNC_DELTA_ROWS: &str = "ps_sync_delta_rows";
/// Sync requests answered, labelled `answer`: `deltas`, `scan` (a page of a full scan) or `empty` (nothing
/// new when the wait ended).
pub const SYNC_REQUESTS_TOTAL: &str = "ps_sync_requests_total";
/// Rows sent to sync subscribers (deltas and scans).
pub const SYNC_ROWS_SENT_TOTAL: &str = "ps_sync_rows_sent_total";
/// Deletions sent to sync subscribers (ids whose rows expired, went past a cap or were never admitted).
pub const SYNC_DELETIONS_SENT_TOTAL: &str = "ps_sync_deletions_sent_total";
/// Full scans begun (a subscriber of another incarnation, or whose deltas were dropped).
pub const SYNC_SCANS_TOTAL: &str = "ps_sync_scans_total";
/// Gauge: sync long-polls waiting for the next cut.
pub const SYNC_SUBSCRIBERS_WAITING: &str = "ps_sync_subscribers_waiting";
/// Gauge: ids held in retained deltas (bounded by `--sync-retain-rows`).
pub const SYNC_RETAINED_IDS: &str = "ps_sync_retained_ids";
/// Dense parameter publications received.
pub const SYNC_DENSE_PUBLISHED_TOTAL: &str = "ps_sync_dense_published_total";
/// Seconds a reduce contribution waited for the other trainers of its step (hybrid dense mode).
pub const REDUCE_WAIT_SECONDS: &str = "ps_reduce_wait_seconds";
/// Ranks missing from reduce steps finalized at their deadline.
pub const REDUCE_MISSING_TOTAL: &str = "ps_reduce_missing_total";
/// Bytes of sums the reduce groups hold (`max-reduce-bytes` bounds it).
pub const REDUCE_BYTES: &str = "ps_reduce_bytes";
/// Reduce contributions refused by a bound, labelled `reason` (`groups`: `max-reduce-groups`; `bytes`:
/// `max-reduce-bytes`).
pub const REDUCE_REFUSED_TOTAL: &str = "ps_reduce_refused_total";
/// Finalized reduce steps dropped early to make room for a new step (`max-reduce-bytes`).
pub const REDUCE_STEPS_DROPPED_TOTAL: &str = "ps_reduce_steps_dropped_total";
/// Rows whose weights trainers set (`WriteRows`, loading saved weights).
pub const ROWS_WRITTEN_TOTAL: &str = "ps_rows_written_total";
/// Ids trainers gave scores (`Score`, tables that evict by score), labelled `found` (`true`: the id had a row
/// and was scored; `false`: it had none, and the score was dropped).
pub const SCORES_TOTAL: &str = "ps_scores_total";
/// Retried pushes answered from the push window instead of being applied again.
pub const PUSH_RETRIES_ANSWERED_TOTAL: &str = "ps_push_retries_answered_total";
/// Push copies refused by the push window, labelled `reason` (`in_progress`: the first copy is still being
/// applied, transient; `too_old`: older than the window remembers, not applied again; `mismatch`: the id of an
/// earlier push of another shape, not applied).
pub const PUSH_WINDOW_REFUSED_TOTAL: &str = "ps_push_window_refused_total";
/// Clients the push window remembers (`push-window-clients`).
pub const PUSH_WINDOW_CLIENTS: &str = "ps_push_window_clients";
/// Clients forgotten by the push window to make room (their later retries would be applied again).
pub const PUSH_WINDOW_CLIENTS_EVICTED_TOTAL: &str = "ps_push_window_clients_evicted_total";
/// Ids held for the retries of pushes applied in memory whose synced write failed (`sync` durability): each
/// retry writes its push's rows before it is answered (at most 4M ids).
pub const PUSH_WINDOW_UNWRITTEN_IDS: &str = "ps_push_window_unwritten_ids";
/// Push answers read back from the store at start (`sync` durability stores each with its push's rows).
pub const PUSH_WINDOW_RESTORED_TOTAL: &str = "ps_push_window_restored_total";
/// Open connections (QUIC and TCP), counted once their handshake is done.
pub const CONNECTIONS: &str = "ps_connections";
/// Rows evicted from memory to RocksDB by the memory budget.
pub const EVICTIONS_TOTAL: &str = "ps_evictions_total";
/// Dirty rows written to RocksDB by evictions (also counted in [`EVICTIONS_TOTAL`]).
pub const EVICTION_WRITES_TOTAL: &str = "ps_eviction_writes_total";
/// Rows read back from RocksDB on a miss (batched multi-get).
pub const READBACK_ROWS_TOTAL: &str = "ps_readback_rows_total";
/// Duration of one batched read-back (multi-get) from RocksDB.
pub const READBACK_SECONDS: &str = "ps_readback_duration_seconds";
/// Prefetch requests handled (lookahead into the capacity tier).
pub const PREFETCH_REQUESTS_TOTAL: &str = "ps_prefetch_requests_total";
/// Distinct rows of prefetches by outcome: `resident` (in memory already), `read_back` (read from RocksDB by
/// the prefetch), `waited` (another request was reading it), `absent` (no row anywhere yet), `untiered` (a
/// table without a budget).
pub const PREFETCH_ROWS_TOTAL: &str = "ps_prefetch_rows_total";
/// Rows pulled (with or without state) from tables with a memory budget, by outcome: `hit` (in memory), `miss` (read back
/// from RocksDB by the request itself: no prefetch, or one that came too late to start), `late` (a prefetch
/// was still reading it; the request waited for that read).
pub const TIER_ROWS_TOTAL: &str = "ps_tier_rows_total";
/// Rows in memory past the tables' budgets now, summed (eviction brings it back to 0 every 200 ms).
pub const ROWS_OVER_BUDGET: &str = "ps_rows_over_budget";
/// Rows pinned in memory by prefetches now.
pub const PINNED_ROWS: &str = "ps_pinned_rows";
/// Prefetch leases held now.
pub const PREFETCH_LEASES: &str = "ps_prefetch_leases";
/// Prefetch leases that reached their deadline unreleased (a batch never pulled, a trainer gone).
pub const PREFETCH_LEASES_EXPIRED_TOTAL: &str = "ps_prefetch_leases_expired_total";
/// Rows recovered from RocksDB at start.
pub const ROWS_RECOVERED_TOTAL: &str = "ps_rows_recovered_total";
/// 1 while storage writes fail and the server refuses pushes ([`crate::write_health`]), else 0.
pub const STORAGE_WRITES_FAILING: &str = "ps_storage_writes_failing";
/// Times the server found storage writable again after failing writes.
pub const STORAGE_RECOVERIES_TOTAL: &str = "ps_storage_recoveries_total";
/// Request and response bytes admitted and not yet released ([`crate::load_limits`]).
pub const INFLIGHT_BYTES: &str = "ps_inflight_bytes";
/// Time a request waited for admission of its bytes ([`crate::load_limits`]); buckets 50 µs .. 10 s.
pub const INFLIGHT_WAIT_SECONDS: &str = "ps_inflight_wait_seconds";
/// Connections refused because `max-connections` were open.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "ps_connections_refused_total";
/// TLS handshakes (QUIC and TCP) under way now: connections not yet authenticated, which hold no connection
/// slot (bounded by `max-handshakes`).
pub const HANDSHAKES_IN_PROGRESS: &str = "ps_handshakes_in_progress";
/// TLS handshakes ended, by `outcome`: `ok`, `failed` (TLS error, e.g. an unknown CA), `timeout` (not done
/// within `handshake-timeout-secs`), `evicted` (the oldest handshake dropped to make room under
/// `max-handshakes`), `draining` (the server began shutting down).
pub const HANDSHAKES_TOTAL: &str = "ps_handshakes_total";
/// Request streams dropped because they made no progress for `stream-idle-timeout-secs`, by `transport`.
pub const STREAM_IDLE_TIMEOUTS_TOTAL: &str = "ps_stream_idle_timeouts_total";

/// 1 on the shard's primary, 0 on a backup or a replica still starting (`docs/replication.md`).
pub const REPLICA_PRIMARY: &str = "ps_replica_primary";
/// 1 on a primary and on an in-sync backup, 0 while a backup catches up.
pub const REPLICA_IN_SYNC: &str = "ps_replica_in_sync";
/// The shard epoch this replica holds (bumped by every promotion).
pub const SHARD_EPOCH: &str = "ps_shard_epoch";
/// On a primary: backups in sync.
pub const REPLICATION_BACKUPS_IN_SYNC: &str = "ps_replication_backups_in_sync";
/// Backups configured for the shard (replicas - 1).
pub const REPLICATION_BACKUPS_CONFIGURED: &str = "ps_replication_backups_configured";
/// On a primary: most messages (pushes) queued and not yet stored by one backup.
pub const REPLICATION_LAG_PUSHES: &str = "ps_replication_lag_pushes";
/// On a primary: age of the oldest message not yet stored by a backup.
pub const REPLICATION_LAG_SECONDS: &str = "ps_replication_lag_seconds";
/// Rows sent to backups, labelled `phase` (`stream`, `catchup`).
pub const REPLICATION_ROWS_TOTAL: &str = "ps_replication_rows_total";
/// On a backup: rows stored from the primary's stream.
pub const REPLICATION_ROWS_STORED_TOTAL: &str = "ps_replication_rows_stored_total";
/// On a primary with `replicated` durability: time a push waited for its backups.
pub const REPLICATION_WAIT_SECONDS: &str = "ps_replication_wait_seconds";
/// Promotions of this replica to primary.
pub const FAILOVERS_TOTAL: &str = "ps_failovers_total";
/// Backups dropped from the stream, labelled `why`.
pub const REPLICATION_DROPPED_TOTAL: &str = "ps_replication_dropped_total";
/// Certificate failures dialing another server (a peer replica, a reshard destination), labelled `peer`
/// (its index): TLS could not verify its certificate for the name expected, or it refused ours.
pub const PEER_TLS_FAILURES_TOTAL: &str = "ps_peer_tls_failures_total";
/// Gauge, labelled `peer`: 1 while dialing that peer fails over its certificate, 0 once a dial works.
pub const PEER_TLS_FAILING: &str = "ps_peer_tls_failing";
/// Gauge: 1 while this replica is starting and cannot elect a primary because too few of its peers answer
/// (a cold start needs all of them, or a majority after `replica-startup-wait-secs`), else 0.
pub const REPLICA_STARTUP_BLOCKED: &str = "ps_replica_startup_blocked";
/// Gauge: the other replicas of this shard that answered this replica's last census.
pub const REPLICA_PEERS_ANSWERING: &str = "ps_replica_peers_answering";
/// Requests refused because the connection's role may not send them, labelled `role` and `kind`.
pub const REQUESTS_FORBIDDEN_TOTAL: &str = "ps_requests_forbidden_total";
/// 1 while a primary with `replicated` durability has no backup in sync, so acknowledges pushes with no copy
/// (`replicated-without-backup = "degrade"`) or refuses them (`"refuse"`); 0 otherwise.
pub const DURABILITY_DEGRADED: &str = "ps_durability_degraded";
/// Pushes refused because no backup was in sync (`replicated-without-backup = "refuse"`).
pub const PUSHES_REFUSED_NO_BACKUP_TOTAL: &str = "ps_pushes_refused_no_backup_total";
/// Table registrations refused whole for passing a registration limit, labelled `reason` (`tables`:
/// `max-tables`; `dim`: `max-table-dim`; `per_request`: `max-tables-per-request`).
pub const TABLE_REGISTRATIONS_REFUSED_TOTAL: &str = "ps_table_registrations_refused_total";
/// Tables this server holds.
pub const TABLES: &str = "ps_tables";
/// This server's shard-map epoch (bumped by every live reshard).
pub const SHARD_MAP_EPOCH: &str = "ps_shard_map_epoch";
/// Virtual shards this server is moving out (a reshard under way).
pub const RESHARD_VSHARDS_MOVING: &str = "ps_reshard_vshards_moving";
/// Rows sent to other servers by a reshard, labelled `phase` (`scan`, `forward`).
pub const RESHARD_ROWS_SENT_TOTAL: &str = "ps_reshard_rows_sent_total";
/// Rows stored from other servers by a reshard.
pub const RESHARD_ROWS_RECEIVED_TOTAL: &str = "ps_reshard_rows_received_total";
/// Rows deleted after a reshard moved their virtual shards away.
pub const RESHARD_ROWS_DELETED_TOTAL: &str = "ps_reshard_rows_deleted_total";
/// Time a source's commit took: switching the map and draining its streams.
pub const RESHARD_COMMIT_SECONDS: &str = "ps_reshard_commit_seconds";

/// Histogram buckets for every `_seconds` metric: 50 µs .. 10 s (the workspace's one set).
pub use ops::buckets::LATENCY_BUCKETS;

/// Registers HELP text and units for every metric. Call after the recorder is installed: a `describe_*` call
/// made before goes to the no-op recorder and is lost (no `# HELP` lines; `promtool check metrics` refuses).
pub fn describe() {
    // TLS certificate reloads (protocol::transport::tls::reload).
    protocol::metrics::describe();
    describe_requests();
    describe_rows();
    describe_writes();
    describe_load();
    describe_sync();
    describe_replication();
}

/// Replication between the replicas of a shard ([`crate::shard::replica`]).
fn describe_replication() {
    describe_gauge!(REPLICA_PRIMARY, "1 on the shard's primary, else 0.");
    describe_gauge!(
        REPLICA_IN_SYNC,
        "1 on a primary or an in-sync backup, 0 while catching up."
    );
    describe_gauge!(SHARD_EPOCH, "Shard epoch held (bumped by every promotion).");
    describe_gauge!(
        REPLICATION_BACKUPS_IN_SYNC,
        "On a primary: backups in sync."
    );
    describe_gauge!(
        REPLICATION_BACKUPS_CONFIGURED,
        "Backups configured (replicas - 1)."
    );
    describe_gauge!(
        REPLICATION_LAG_PUSHES,
        "On a primary: most messages queued and not yet stored by one backup."
    );
    describe_gauge!(
        REPLICATION_LAG_SECONDS,
        Unit::Seconds,
        "On a primary: age of the oldest message not yet stored by a backup."
    );
    describe_gauge!(
        UNSYNCED_ROWS,
        "Rows of sync pushes applied in memory whose synced write is not done."
    );
    describe_counter!(
        READS_WAITED_FOR_SYNC_TOTAL,
        "Reads that waited for a row's synced write (sync durability)."
    );
    describe_counter!(
        CHECKPOINTS_FAILED_TOTAL,
        "Checkpoints whose snapshot could not be written (full or failing disk)."
    );
    describe_counter!(
        CHECKPOINT_TENSOR_BYTES_TOTAL,
        "Bytes of tables.safetensors files written for export snapshots."
    );
    describe_counter!(REPLICATION_ROWS_TOTAL, "Rows sent to backups, by phase.");
    describe_counter!(
        REPLICATION_ROWS_STORED_TOTAL,
        "On a backup: rows stored from the primary's stream."
    );
    describe_histogram!(
        REPLICATION_WAIT_SECONDS,
        Unit::Seconds,
        "Time a replicated push waited for its in-sync backups."
    );
    describe_counter!(FAILOVERS_TOTAL, "Promotions of this replica to primary.");
    describe_counter!(
        PEER_TLS_FAILURES_TOTAL,
        "Certificate failures dialing another server, by peer index."
    );
    describe_gauge!(
        PEER_TLS_FAILING,
        "1 while dialing that peer fails over its certificate, by peer index."
    );
    describe_gauge!(
        REPLICA_STARTUP_BLOCKED,
        "1 while a starting replica cannot elect a primary: too few peers answer."
    );
    describe_gauge!(
        REPLICA_PEERS_ANSWERING,
        "Other replicas of the shard that answered the last census."
    );
    describe_counter!(
        REQUESTS_FORBIDDEN_TOTAL,
        "Requests refused because the connection's role may not send them, by role and kind."
    );
    describe_counter!(
        REPLICATION_DROPPED_TOTAL,
        "Backups dropped from the stream, by why."
    );
    describe_gauge!(
        DURABILITY_DEGRADED,
        "1 while a replicated primary has no backup in sync (pushes acknowledged without a copy, or refused)."
    );
    describe_counter!(
        PUSHES_REFUSED_NO_BACKUP_TOTAL,
        "Pushes refused because no backup was in sync (replicated-without-backup = refuse)."
    );
    describe_counter!(
        TABLE_REGISTRATIONS_REFUSED_TOTAL,
        "Table registrations refused whole for passing a registration limit, by reason."
    );
    describe_gauge!(TABLES, "Tables this server holds.");
    describe_gauge!(SHARD_MAP_EPOCH, "This server's shard-map epoch.");
    describe_gauge!(
        RESHARD_VSHARDS_MOVING,
        "Virtual shards this server is moving out in a reshard."
    );
    describe_counter!(
        RESHARD_ROWS_SENT_TOTAL,
        "Rows sent to other servers by a reshard, by phase."
    );
    describe_counter!(
        RESHARD_ROWS_RECEIVED_TOTAL,
        "Rows stored from other servers by a reshard."
    );
    describe_counter!(
        RESHARD_ROWS_DELETED_TOTAL,
        "Rows deleted after a reshard moved them away."
    );
    describe_histogram!(
        RESHARD_COMMIT_SECONDS,
        "Time a reshard source took to switch maps and drain its streams."
    );
}

/// Requests and their bytes, rows pulled and pushed, open connections.
fn describe_requests() {
    describe_counter!(REQUESTS_TOTAL, "Requests served, by kind.");
    describe_histogram!(
        REDUCE_WAIT_SECONDS,
        Unit::Seconds,
        "Seconds a reduce contribution waited for the other trainers of its step."
    );
    describe_counter!(
        REDUCE_MISSING_TOTAL,
        "Ranks missing from reduce steps finalized at their deadline."
    );
    describe_gauge!(
        REDUCE_BYTES,
        Unit::Bytes,
        "Bytes of sums the reduce groups hold."
    );
    describe_counter!(
        REDUCE_REFUSED_TOTAL,
        "Reduce contributions refused by a bound, by reason (groups, bytes)."
    );
    describe_counter!(
        REDUCE_STEPS_DROPPED_TOTAL,
        "Finalized reduce steps dropped early to make room for a new step."
    );
    describe_counter!(
        ROWS_WRITTEN_TOTAL,
        "Rows whose weights trainers set (WriteRows, loading saved weights)."
    );
    describe_counter!(
        SCORES_TOTAL,
        "Ids trainers gave scores (Score requests), by whether the id had a row (found) or the score was dropped."
    );
    describe_counter!(
        PUSH_RETRIES_ANSWERED_TOTAL,
        "Retried pushes answered from the push window instead of being applied again."
    );
    describe_counter!(
        PUSH_WINDOW_REFUSED_TOTAL,
        "Push copies refused by the push window, by reason (in_progress, too_old, mismatch)."
    );
    describe_gauge!(
        PUSH_WINDOW_CLIENTS,
        "Clients whose push answers the push window remembers."
    );
    describe_counter!(
        PUSH_WINDOW_CLIENTS_EVICTED_TOTAL,
        "Clients forgotten by the push window to make room."
    );
    describe_gauge!(
        PUSH_WINDOW_UNWRITTEN_IDS,
        "Ids of pushes applied whose synced write failed, held for their retries to write them."
    );
    describe_counter!(
        PUSH_WINDOW_RESTORED_TOTAL,
        "Push answers read back from the store at start (sync durability)."
    );
    describe_counter!(REQUEST_ERRORS_TOTAL, "Error responses, by code.");
    describe_histogram!(
        REQUEST_SECONDS,
        Unit::Seconds,
        "Request handling latency, by kind."
    );
    describe_counter!(ROWS_PULLED_TOTAL, "Rows returned by pulls.");
    describe_counter!(ROWS_PUSHED_TOTAL, "Gradient rows applied by pushes.");
    describe_counter!(
        ROWS_REJECTED_NONFINITE_TOTAL,
        "Gradient rows rejected because they held NaN or infinity."
    );
    describe_counter!(
        ROWS_REJECTED_ADMISSION_TOTAL,
        "Gradient rows dropped by frequency admission (id pushed fewer than admission-min-count times)."
    );
    describe_counter!(
        BYTES_RECEIVED_TOTAL,
        Unit::Bytes,
        "Request frame bytes received."
    );
    describe_counter!(BYTES_SENT_TOTAL, Unit::Bytes, "Response frame bytes sent.");
    describe_gauge!(
        CONNECTIONS,
        "Open connections (QUIC and TCP), after their handshake."
    );
}

/// Rows in memory and on disk: recovery, expiry, eviction and read-back.
fn describe_rows() {
    describe_counter!(
        ROWS_RECOVERED_TOTAL,
        "Rows recovered from RocksDB at start."
    );
    describe_gauge!(ROWS_IN_MEMORY, "Rows held in memory, by table.");
    describe_gauge!(
        ROWS_ON_DISK,
        "Rows stored in RocksDB, by table (RocksDB's estimate, refreshed at each write-back)."
    );
    describe_gauge!(
        MEMORY_BYTES,
        Unit::Bytes,
        "Bytes of row arenas and id indexes, pins and negative caches."
    );
    describe_gauge!(
        ROCKSDB_MEMORY_BYTES,
        Unit::Bytes,
        "Bytes RocksDB holds in memory, by kind: memtables, block_cache, table_readers."
    );
    describe_gauge!(
        PROCESS_RESIDENT_BYTES,
        Unit::Bytes,
        "Resident set size of the process (VmRSS), refreshed with the row gauges."
    );
    describe_gauge!(
        ALLOCATOR_BYTES,
        Unit::Bytes,
        "jemalloc's statistics by kind: allocated, active, resident, metadata, retained."
    );
    describe_counter!(
        ROWS_EXPIRED_TOTAL,
        "Rows deleted from memory and RocksDB by TTL expiry."
    );
    describe_counter!(
        ROWS_CAPPED_TOTAL,
        "Rows deleted from memory and RocksDB by a table's row cap (least frequently updated first)."
    );
    describe_histogram!(
        EXPIRE_SECONDS,
        Unit::Seconds,
        "Duration of one expiry pass over the tables with a TTL."
    );
    describe_counter!(
        EVICTIONS_TOTAL,
        "Rows evicted from memory to RocksDB by the memory budget."
    );
    describe_counter!(
        EVICTION_WRITES_TOTAL,
        "Dirty rows written to RocksDB before their eviction."
    );
    describe_counter!(
        READBACK_ROWS_TOTAL,
        "Evicted rows read back from RocksDB on a miss."
    );
    describe_histogram!(
        READBACK_SECONDS,
        Unit::Seconds,
        "Duration of one batched read-back (multi-get) from RocksDB."
    );
    describe_tier();
}

/// Lookahead prefetch into the capacity tier.
fn describe_tier() {
    describe_counter!(PREFETCH_REQUESTS_TOTAL, "Prefetch requests handled.");
    describe_counter!(
        PREFETCH_ROWS_TOTAL,
        "Distinct rows of prefetches, by outcome (resident, read_back, waited, absent, untiered)."
    );
    describe_counter!(
        TIER_ROWS_TOTAL,
        "Rows pulled from tables with a memory budget, by outcome (hit, miss, late)."
    );
    describe_gauge!(PINNED_ROWS, "Rows pinned in memory by prefetches.");
    describe_gauge!(
        ROWS_OVER_BUDGET,
        "Rows in memory past the tables' memory budgets, summed (evicted every 200 ms)."
    );
    describe_gauge!(PREFETCH_LEASES, "Prefetch leases held.");
    describe_counter!(
        PREFETCH_LEASES_EXPIRED_TOTAL,
        "Prefetch leases released at their deadline, unreleased by their trainer."
    );
}

/// Writes to RocksDB: write-back, synced pushes, and failing storage.
fn describe_writes() {
    describe_counter!(WRITEBACK_ROWS_TOTAL, "Dirty rows written back to RocksDB.");
    describe_counter!(
        WRITEBACK_BATCHES_TOTAL,
        "Writes of dirty rows to RocksDB: write batches (tables with a memory budget), or a whole table's rows ingested as sorted files."
    );
    describe_histogram!(
        WRITEBACK_SECONDS,
        Unit::Seconds,
        "Duration of one write-back of all dirty rows."
    );
    describe_counter!(
        WRITEBACK_ERRORS_TOTAL,
        "Write-backs that failed (timer, flush request, eviction, synced push write)."
    );
    describe_histogram!(
        SYNC_PUSH_WRITE_SECONDS,
        Unit::Seconds,
        "Duration of the synced RocksDB write of one push (durability = sync)."
    );
    describe_counter!(
        SYNC_PUSH_ROWS_TOTAL,
        "Rows written by synced push writes (durability = sync)."
    );
    describe_gauge!(
        STORAGE_WRITES_FAILING,
        "1 while storage writes fail and pushes are refused, else 0."
    );
    describe_counter!(
        STORAGE_RECOVERIES_TOTAL,
        "Times storage became writable again after failing writes."
    );
}

/// The delta sync to serving ([`crate::sync`]).
fn describe_sync() {
    describe_counter!(SYNC_DELTAS_CUT_TOTAL, "Deltas cut by the delta sync.");
    describe_histogram!(SYNC_DELTA_ROWS, "Distinct rows per delta cut.");
    describe_counter!(
        SYNC_REQUESTS_TOTAL,
        "Sync requests answered, by answer: deltas, scan, empty."
    );
    describe_counter!(
        SYNC_ROWS_SENT_TOTAL,
        "Rows sent to sync subscribers (deltas and scans)."
    );
    describe_counter!(
        SYNC_DELETIONS_SENT_TOTAL,
        "Deletions sent to sync subscribers (rows expired, past a cap, or never admitted)."
    );
    describe_counter!(
        SYNC_SCANS_TOTAL,
        "Full scans begun for sync subscribers of another incarnation or with dropped deltas."
    );
    describe_gauge!(
        SYNC_SUBSCRIBERS_WAITING,
        "Sync long-polls waiting for the next cut."
    );
    describe_gauge!(
        SYNC_RETAINED_IDS,
        "Ids held in retained deltas (bounded by sync-retain-rows)."
    );
    describe_counter!(
        SYNC_DENSE_PUBLISHED_TOTAL,
        "Dense parameter publications received."
    );
}

/// Load limits ([`crate::load_limits`]).
fn describe_load() {
    describe_gauge!(
        INFLIGHT_BYTES,
        Unit::Bytes,
        "Request and response bytes admitted and not yet released."
    );
    describe_histogram!(
        INFLIGHT_WAIT_SECONDS,
        Unit::Seconds,
        "Time a request waited for admission of its bytes."
    );
    describe_counter!(
        CONNECTIONS_REFUSED_TOTAL,
        "Connections refused because max-connections were open."
    );
    describe_gauge!(
        HANDSHAKES_IN_PROGRESS,
        "TLS handshakes under way (connections not yet authenticated, holding no connection slot)."
    );
    describe_counter!(
        ROWS_REFUSED_NONFINITE_WEIGHTS_TOTAL,
        "Push updates undone because they would have left a non-finite weight or state."
    );
    describe_counter!(
        ROWS_CLAMPED_WEIGHTS_TOTAL,
        "Push updates whose weights were bounded to weight-clamp-abs."
    );
    describe_counter!(
        HANDSHAKES_TOTAL,
        "TLS handshakes ended, by outcome (ok, failed, timeout, evicted, draining)."
    );
    describe_counter!(
        STREAM_IDLE_TIMEOUTS_TOTAL,
        "Request streams dropped after making no progress for stream-idle-timeout-secs."
    );
}
