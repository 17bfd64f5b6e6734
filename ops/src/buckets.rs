//! [`LATENCY_BUCKETS`]: the histogram buckets of every `_seconds` metric of every binary (ps-server, trainer,
//! ps-serve), so their latencies compare bucket for bucket on one dashboard. Set explicitly: without buckets
//! the exporter renders summaries (DESIGN.md, "Dependencies and build").

/// Histogram buckets for every `_seconds` metric: 50 µs (a loopback pull of one small batch) .. 10 s (a pull
/// retried across a server restart).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];
