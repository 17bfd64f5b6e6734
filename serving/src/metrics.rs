//! Metric names of the serving process (docs/serving.md), with their descriptions, in one place.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Requests answered, labels `route` and `code`.
pub const REQUESTS_TOTAL: &str = "serving_requests_total";
/// Request latency from the first byte read to the answer, label `route`.
pub const REQUEST_SECONDS: &str = "serving_request_duration_seconds";
/// Rows predicted.
pub const PREDICT_ROWS_TOTAL: &str = "serving_predict_rows_total";
/// Rows per micro-batch.
pub const BATCH_ROWS: &str = "serving_batch_rows";
/// Seconds since the cut of the newest applied delta (or the export's creation before any).
pub const MODEL_AGE_SECONDS: &str = "serving_model_age_seconds";
/// Apply time minus the oldest change in the delta.
pub const DELTA_FRESHNESS_SECONDS: &str = "serving_delta_freshness_seconds";
/// Deltas applied.
pub const DELTAS_APPLIED_TOTAL: &str = "serving_deltas_applied_total";
/// Rows applied from deltas.
pub const DELTA_ROWS_TOTAL: &str = "serving_delta_rows_total";
/// Rows deleted by the delta sync (deletions, and rows a scan no longer lists).
pub const ROWS_DELETED_TOTAL: &str = "serving_rows_deleted_total";
/// Synced rows and deletions of tables the export does not have, skipped.
pub const SYNC_ROWS_SKIPPED_TOTAL: &str = "serving_sync_rows_skipped_total";
/// The dense model's version.
pub const DENSE_VERSION: &str = "serving_dense_version";
/// Failed sync requests, label `server`.
pub const SYNC_ERRORS_TOTAL: &str = "serving_sync_errors_total";
/// Embedding rows in memory.
pub const ROWS_IN_MEMORY: &str = "serving_rows_in_memory";
/// Estimated heap bytes of the embedding rows in memory.
pub const ROWS_MEMORY_BYTES: &str = "serving_rows_memory_bytes";
/// The export version loaded.
pub const EXPORT_VERSION: &str = "serving_export_version";

/// HTTP connections open.
pub const CONNECTIONS_OPEN: &str = "serving_connections_open";
/// Connections closed at accept because `--max-connections` were open.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "serving_connections_refused_total";
/// Of those, connections refused because their client address had `--max-connections-per-client` open.
pub const CONNECTIONS_REFUSED_PER_CLIENT_TOTAL: &str =
    "serving_connections_refused_per_client_total";
/// Connections closed because a request's headers did not arrive within `--header-timeout-secs`.
pub const HEADER_TIMEOUTS_TOTAL: &str = "serving_header_timeouts_total";
/// Requests answered 408 because their body did not arrive within `--body-timeout-secs`.
pub const BODY_TIMEOUTS_TOTAL: &str = "serving_body_timeouts_total";
/// Rows of requests waiting for the predicting thread (`--max-queued-rows` bounds it).
pub const QUEUED_ROWS: &str = "serving_queued_rows";
/// Requests answered 503 because the prediction queue was full.
pub const QUEUE_FULL_TOTAL: &str = "serving_queue_full_total";

/// Describes every metric (Prometheus HELP lines).
pub fn describe() {
    // TLS certificate reloads (protocol::transport::tls::reload).
    protocol::metrics::describe();
    describe_gauge!(
        QUEUED_ROWS,
        "Rows of requests waiting for the predicting thread."
    );
    describe_counter!(
        QUEUE_FULL_TOTAL,
        "Requests answered 503 because the prediction queue was full."
    );
    describe_counter!(
        REQUESTS_TOTAL,
        "HTTP requests answered, by route and status code."
    );
    describe_histogram!(
        REQUEST_SECONDS,
        Unit::Seconds,
        "HTTP request latency, body read to answer, by route."
    );
    describe_counter!(PREDICT_ROWS_TOTAL, "Rows predicted.");
    describe_histogram!(BATCH_ROWS, "Rows per micro-batch of concurrent requests.");
    describe_gauge!(
        MODEL_AGE_SECONDS,
        Unit::Seconds,
        "Seconds since the newest applied update was cut on a training server (or the export was written)."
    );
    describe_histogram!(
        DELTA_FRESHNESS_SECONDS,
        Unit::Seconds,
        "Per applied delta: apply time minus the time of the oldest change it holds."
    );
    describe_counter!(DELTAS_APPLIED_TOTAL, "Delta syncs applied.");
    describe_counter!(DELTA_ROWS_TOTAL, "Embedding rows applied from delta syncs.");
    describe_counter!(
        SYNC_ROWS_SKIPPED_TOTAL,
        "Synced rows and deletions of tables the export does not have (registered after it), skipped."
    );
    describe_gauge!(
        ROWS_MEMORY_BYTES,
        Unit::Bytes,
        "Estimated heap bytes of the embedding rows in memory (ids, index, weights, and with the engine store the optimizer state)."
    );
    describe_counter!(
        ROWS_DELETED_TOTAL,
        "Embedding rows deleted by delta syncs (expired, capped or never admitted on the training servers)."
    );
    describe_gauge!(
        DENSE_VERSION,
        "Version of the dense parameters predictions use."
    );
    describe_counter!(
        SYNC_ERRORS_TOTAL,
        "Failed delta sync requests, by training server."
    );
    describe_gauge!(ROWS_IN_MEMORY, "Embedding rows held in memory.");
    describe_gauge!(CONNECTIONS_OPEN, "HTTP connections open.");
    describe_counter!(
        CONNECTIONS_REFUSED_TOTAL,
        "Connections closed at accept because --max-connections (or --max-connections-per-client) were open."
    );
    describe_counter!(
        CONNECTIONS_REFUSED_PER_CLIENT_TOTAL,
        "Connections closed at accept because their client address had --max-connections-per-client open."
    );
    describe_counter!(
        HEADER_TIMEOUTS_TOTAL,
        "Connections closed because a request's headers did not arrive within --header-timeout-secs."
    );
    describe_counter!(
        BODY_TIMEOUTS_TOTAL,
        "Requests answered 408 because their body did not arrive within --body-timeout-secs."
    );
    describe_gauge!(
        EXPORT_VERSION,
        "Version (training step) of the export loaded."
    );
}
