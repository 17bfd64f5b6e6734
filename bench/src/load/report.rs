//! The end-of-run report: JSON (one flat object) and text.

use serde::Serialize;

use super::config::LoadConfig;
use super::prefetch::PrefetchTotals;
use super::stats::Summary;

/// Totals a run measured (after warm-up), before they become a [`Report`].
#[derive(Debug, Clone)]
pub struct Measured {
    /// Measured seconds.
    pub seconds: f64,
    /// Distinct ids pulled.
    pub pull_rows: u64,
    /// Distinct ids pushed.
    pub push_rows: u64,
    /// Wire bytes sent and received (see [`Report::wire_bytes`]).
    pub wire_bytes: u64,
    /// Batches completed.
    pub batches: u64,
    /// Pull latencies.
    pub pull: Summary,
    /// Push latencies.
    pub push: Summary,
    /// Prefetches (the whole run, warm-up included).
    pub prefetch: PrefetchTotals,
}

/// What `ps-bench` prints and writes. Rows are distinct ids per batch (deduplicated like the trainer).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// "quic" or "in-process".
    pub transport: String,
    /// Row and gradient encoding.
    pub codec: String,
    /// Measured seconds.
    pub seconds: f64,
    /// Batches completed in the measured window.
    pub batches: u64,
    /// Distinct ids pulled per second.
    pub pull_rows_per_sec: f64,
    /// Distinct ids pushed per second.
    pub push_rows_per_sec: f64,
    /// Pull request latency percentiles, ms (one request per server per batch; in process, one per batch).
    pub pull_p50_ms: f64,
    /// See `pull_p50_ms`.
    pub pull_p99_ms: f64,
    /// See `pull_p50_ms`.
    pub pull_p999_ms: f64,
    /// Mean pull latency, ms.
    pub pull_mean_ms: f64,
    /// Push request latency percentiles, ms.
    pub push_p50_ms: f64,
    /// See `push_p50_ms`.
    pub push_p99_ms: f64,
    /// See `push_p50_ms`.
    pub push_p999_ms: f64,
    /// Mean push latency, ms.
    pub push_mean_ms: f64,
    /// Pull requests measured.
    pub pull_requests: usize,
    /// Push requests measured.
    pub push_requests: usize,
    /// Bytes of application frames sent and received: payloads plus each frame's 12-byte prefix and its
    /// bincode header, computed exactly from the requests and the expected responses (not counted from the
    /// socket). QUIC, TLS, UDP and IP overhead are not included. 0 in process.
    pub wire_bytes: u64,
    /// `wire_bytes` (pulls and pushes, both directions) per distinct row pulled.
    pub wire_bytes_per_pulled_row: f64,
    /// `wire_bytes` per second, in MB (10^6 bytes).
    pub wire_mb_per_sec: f64,
    /// Prefetch requests sent (`--prefetch-distance`; one per server with ids per batch), over the whole run,
    /// warm-up included, like the `prefetch_*` row counts below (summed `protocol::LeaseStats`). Not
    /// counted in `wire_bytes`.
    pub prefetch_requests: u64,
    /// Prefetched ids already in memory.
    pub prefetch_resident: u64,
    /// Prefetched rows read back from storage by the prefetch.
    pub prefetch_read_back: u64,
    /// Prefetched rows another request was reading back already.
    pub prefetch_waited: u64,
    /// Prefetched ids with no row anywhere.
    pub prefetch_absent: u64,
    /// Rows pinned by prefetches.
    pub prefetch_pinned: u64,
    /// Rows read back but not pinned (the pin limit was reached).
    pub prefetch_over_pin_limit: u64,
    /// Prefetched ids of tables without a memory budget.
    pub prefetch_untiered: u64,
    /// The run's settings.
    pub config: LoadConfig,
}

impl Report {
    /// Builds the report.
    pub fn new(transport: &str, config: &LoadConfig, m: Measured) -> Report {
        let secs = m.seconds.max(1e-9);
        Report {
            transport: transport.into(),
            codec: config.codec.to_string(),
            seconds: m.seconds,
            batches: m.batches,
            pull_rows_per_sec: m.pull_rows as f64 / secs,
            push_rows_per_sec: m.push_rows as f64 / secs,
            pull_p50_ms: m.pull.ms(0.5),
            pull_p99_ms: m.pull.ms(0.99),
            pull_p999_ms: m.pull.ms(0.999),
            pull_mean_ms: m.pull.mean_ms(),
            push_p50_ms: m.push.ms(0.5),
            push_p99_ms: m.push.ms(0.99),
            push_p999_ms: m.push.ms(0.999),
            push_mean_ms: m.push.mean_ms(),
            pull_requests: m.pull.count(),
            push_requests: m.push.count(),
            wire_bytes: m.wire_bytes,
            wire_bytes_per_pulled_row: if m.pull_rows > 0 {
                m.wire_bytes as f64 / m.pull_rows as f64
            } else {
                0.0
            },
            wire_mb_per_sec: m.wire_bytes as f64 / secs / 1e6,
            prefetch_requests: m.prefetch.requests,
            prefetch_resident: m.prefetch.counts.rows.resident as u64,
            prefetch_read_back: m.prefetch.counts.rows.read_back as u64,
            prefetch_waited: m.prefetch.counts.rows.waited as u64,
            prefetch_absent: m.prefetch.counts.rows.absent as u64,
            prefetch_pinned: m.prefetch.counts.rows.pinned as u64,
            prefetch_over_pin_limit: m.prefetch.counts.rows.over_pin_limit as u64,
            prefetch_untiered: m.prefetch.counts.rows.untiered as u64,
            config: config.clone(),
        }
    }

    /// Human-readable summary.
    pub fn text(&self) -> String {
        let mut out = self.load_text();
        if self.config.rate > 0.0 {
            out += &format!(
                "open loop: offered {offered:.1} batches/s, completed {done:.1} batches/s (pull latency from each \
                 batch's scheduled start)\n",
                offered = self.config.rate,
                done = self.batches as f64 / self.seconds.max(1e-9),
            );
        }
        if self.config.prefetch_distance > 0 {
            let tiered = self.prefetch_resident + self.prefetch_read_back + self.prefetch_waited;
            out += &format!(
                "prefetch: distance {d}, {n} requests; rows resident {r}, read back {b}, waited {w}, absent {a}, \
                 untiered {u}; pinned {p} (over pin limit {o}); resident share {share}\n",
                d = self.config.prefetch_distance,
                n = self.prefetch_requests,
                r = self.prefetch_resident,
                b = self.prefetch_read_back,
                w = self.prefetch_waited,
                a = self.prefetch_absent,
                u = self.prefetch_untiered,
                p = self.prefetch_pinned,
                o = self.prefetch_over_pin_limit,
                share = if tiered > 0 {
                    format!("{:.3}", self.prefetch_resident as f64 / tiered as f64)
                } else {
                    "n/a (no budgeted table)".into()
                },
            );
        }
        out
    }

    fn load_text(&self) -> String {
        let c = &self.config;
        format!(
            "ps-bench: {transport} ({target}, {servers} server(s){repl}), codec {codec}, {tables} tables x {ids} ids \
             ({dist:?}, s {s}, vocab {vocab}), dim {dim}, concurrency {conc}, mix {mix:?}, {secs:.1} s\n\
             pull: {prs:>12.0} rows/s  p50 {p50:.2} ms  p99 {p99:.2} ms  p999 {p999:.2} ms  ({pn} requests)\n\
             push: {ups:>12.0} rows/s  p50 {u50:.2} ms  p99 {u99:.2} ms  p999 {u999:.2} ms  ({un} requests)\n\
             wire: {wmb:.1} MB/s, {wpr:.1} bytes per pulled row; {batches} batches\n",
            transport = self.transport,
            target = c.target,
            servers = c.servers,
            repl = match (c.replicas, &c.durability) {
                (1, None) => String::new(),
                (r, None) => format!(" x {r} replicas"),
                (r, Some(d)) => format!(" x {r} replicas, durability {d}"),
            },
            codec = self.codec,
            tables = c.tables,
            ids = c.ids_per_table,
            dist = c.distribution,
            s = c.zipf_s,
            vocab = c.vocab,
            dim = c.dim,
            conc = c.concurrency,
            mix = c.mix,
            secs = self.seconds,
            prs = self.pull_rows_per_sec,
            p50 = self.pull_p50_ms,
            p99 = self.pull_p99_ms,
            p999 = self.pull_p999_ms,
            pn = self.pull_requests,
            ups = self.push_rows_per_sec,
            u50 = self.push_p50_ms,
            u99 = self.push_p99_ms,
            u999 = self.push_p999_ms,
            un = self.push_requests,
            wmb = self.wire_mb_per_sec,
            wpr = self.wire_bytes_per_pulled_row,
            batches = self.batches,
        )
    }
}
