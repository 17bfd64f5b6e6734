//! What `serve-bench` prints: one line of `key=value` fields (like `ps-audit`'s), and the same fields as JSON
//! with `--json`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::config::ServeConfig;
use crate::load::stats::Summary;

/// `error` and its sources, `: `-separated (as anyhow's `{:#}`).
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// Failed requests by kind (the HTTP status, or `connect`, `io`, `timeout`, `malformed`, `wrong-count`), with
/// the first message of each kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ErrorTally {
    /// Count per kind.
    pub counts: BTreeMap<String, u64>,
    /// The first message of each kind.
    pub first: BTreeMap<String, String>,
}

impl ErrorTally {
    /// Records one failure.
    pub fn record(&mut self, kind: &str, message: impl FnOnce() -> String) {
        *self.counts.entry(kind.to_string()).or_default() += 1;
        self.first.entry(kind.to_string()).or_insert_with(message);
    }

    /// Adds another tally (its first messages count only for kinds not seen here).
    pub fn merge(&mut self, other: ErrorTally) {
        for (k, n) in other.counts {
            *self.counts.entry(k).or_default() += n;
        }
        for (k, m) in other.first {
            self.first.entry(k).or_insert(m);
        }
    }

    /// Total failures.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// `400:3,timeout:1`, or `none`.
    pub fn field(&self) -> String {
        if self.counts.is_empty() {
            return "none".into();
        }
        let parts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect();
        parts.join(",")
    }
}

/// Result of a load run (`--duration` or `--requests`).
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Measured seconds (after the warm-up).
    pub seconds: f64,
    /// Successful requests measured.
    pub requests: u64,
    /// Rows of the successful requests.
    pub rows: u64,
    /// `rows / seconds`.
    pub rows_per_sec: f64,
    /// `requests / seconds`.
    pub requests_per_sec: f64,
    /// Latency percentiles of the successful requests, ms (nearest rank over every sample).
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p90_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// Slowest successful request, ms.
    pub max_ms: f64,
    /// Mean latency, ms.
    pub mean_ms: f64,
    /// Failed requests measured.
    pub errors: u64,
    /// Failed requests by kind, with the first message of each.
    pub errors_by_status: ErrorTally,
    /// Newest export version answered (None without a success).
    pub version: Option<u64>,
    /// Newest dense version answered.
    pub dense_version: Option<u64>,
    /// The run's settings.
    pub config: ServeConfig,
}

impl LoadReport {
    /// Builds the report from the measured totals.
    pub fn new(
        config: &ServeConfig,
        seconds: f64,
        rows: u64,
        latencies: &Summary,
        errors: ErrorTally,
        versions: Option<(u64, u64)>,
    ) -> LoadReport {
        let secs = seconds.max(1e-9);
        let requests = latencies.count() as u64;
        LoadReport {
            seconds,
            requests,
            rows,
            rows_per_sec: rows as f64 / secs,
            requests_per_sec: requests as f64 / secs,
            p50_ms: latencies.ms(0.5),
            p90_ms: latencies.ms(0.9),
            p99_ms: latencies.ms(0.99),
            max_ms: latencies.ms(1.0),
            mean_ms: latencies.mean_ms(),
            errors: errors.total(),
            errors_by_status: errors,
            version: versions.map(|v| v.0),
            dense_version: versions.map(|v| v.1),
            config: config.clone(),
        }
    }

    /// The summary line.
    pub fn line(&self) -> String {
        let c = &self.config;
        format!(
            "serve-bench load url={url} format={format} rows_per_request={rpr} concurrency={conc} \
             seconds={secs:.2} requests={req} rows={rows} rows_per_s={rps:.1} requests_per_s={qps:.1} \
             p50_ms={p50:.3} p90_ms={p90:.3} p99_ms={p99:.3} max_ms={max:.3} errors={errors} \
             errors_by_status={by} version={version} dense_version={dense}",
            url = c.url,
            format = c.format.name(),
            rpr = c.rows_per_request,
            conc = c.concurrency,
            secs = self.seconds,
            req = self.requests,
            rows = self.rows,
            rps = self.rows_per_sec,
            qps = self.requests_per_sec,
            p50 = self.p50_ms,
            p90 = self.p90_ms,
            p99 = self.p99_ms,
            max = self.max_ms,
            errors = self.errors,
            by = self.errors_by_status.field(),
            version = opt(self.version),
            dense = opt(self.dense_version),
        )
    }
}

/// Result of an `--auc` pass.
#[derive(Debug, Clone, Serialize)]
pub struct AucReport {
    /// Rows predicted (every row of the file, or `--limit-rows`).
    pub rows: u64,
    /// Requests sent.
    pub requests: u64,
    /// Seconds the pass took.
    pub seconds: f64,
    /// `rows / seconds`.
    pub rows_per_sec: f64,
    /// Exact ROC AUC of the probabilities against the labels (None when the labels hold one class).
    pub auc: Option<f64>,
    /// Mean clamped log loss.
    pub logloss: f64,
    /// Mean predicted probability.
    pub mean_prediction: f64,
    /// Mean label.
    pub positive_rate: f64,
    /// Newest export version that answered.
    pub version: u64,
    /// Oldest export version that answered (differs from `version` when the model changed mid-pass).
    pub min_version: u64,
    /// Newest dense version that answered.
    pub dense_version: u64,
    /// The run's settings.
    pub config: ServeConfig,
}

impl AucReport {
    /// The summary line.
    pub fn line(&self) -> String {
        let mut out = format!(
            "serve-bench auc url={url} format={format} rows={rows} requests={req} seconds={secs:.2} \
             rows_per_s={rps:.1} auc={auc} logloss={ll:.6} mean_prediction={mp:.6} positive_rate={pr:.6} \
             version={v} dense_version={d}",
            url = self.config.url,
            format = self.config.format.name(),
            rows = self.rows,
            req = self.requests,
            secs = self.seconds,
            rps = self.rows_per_sec,
            auc = self.auc.map_or("n/a".into(), |a| format!("{a:.6}")),
            ll = self.logloss,
            mp = self.mean_prediction,
            pr = self.positive_rate,
            v = self.version,
            d = self.dense_version,
        );
        if self.min_version != self.version {
            let _ = write!(out, " min_version={}", self.min_version);
        }
        out
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or("none".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_and_keeps_first_messages() {
        let mut a = ErrorTally::default();
        assert_eq!(a.field(), "none");
        a.record("503", || "not ready".into());
        a.record("503", || "unused".into());
        let mut b = ErrorTally::default();
        b.record("timeout", || "slow".into());
        b.record("503", || "draining".into());
        a.merge(b);
        assert_eq!(a.total(), 4);
        assert_eq!(a.field(), "503:3,timeout:1");
        assert_eq!(a.first["503"], "not ready");
        assert_eq!(a.first["timeout"], "slow");
    }
}
