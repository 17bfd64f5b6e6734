//! Real processes on loopback: the memory budget (issue 3's capacity tier) evicts rows to RocksDB and reads
//! them back bit for bit.

mod common;

use std::time::{Duration, Instant};

use common::{client, http_get, pull, push, sigterm_and_wait, start, table};

/// The value of an unlabelled counter in a /metrics page (0 if absent).
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Issue 3 (capacity tier): with a budget of 100 rows, 1000 pushed rows are evicted to RocksDB and read back
/// bit for bit, before and after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue3_rows_past_the_memory_budget_are_evicted_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let budget = [
        "--memory-budget-rows",
        "100",
        "--flush-interval-secs",
        "3600",
    ];
    let s = start(&data, &tls, &budget);
    let c = client(&s, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    let ids: Vec<u64> = (0..1000).map(|i| i * 7_919).collect();
    let grads: Vec<f32> = (0..ids.len() * 8)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.29)
        .collect();
    let (applied, _) = push(&c, &ids, &grads).await;
    assert_eq!(applied, 1000);
    let before = pull(&c, &ids).await.unwrap();

    // The budget timer evicts within a few hundred milliseconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let m = http_get(s.metrics, "/metrics");
        if counter(&m, "ps_evictions_total") >= 900.0 {
            break m;
        }
        assert!(Instant::now() < deadline, "no evictions: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(metrics.contains("# HELP ps_evictions_total"), "{metrics}");
    let after = pull(&c, &ids).await.unwrap();
    assert_eq!(before, after, "rows differ after eviction and read-back");
    let metrics = http_get(s.metrics, "/metrics");
    assert!(
        counter(&metrics, "ps_readback_rows_total") >= 900.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("ps_readback_duration_seconds_bucket"),
        "{metrics}"
    );
    c.close().await;
    sigterm_and_wait(s);

    // Recovery loads at most the budget; the rest is read back on demand.
    let s = start(&data, &tls, &budget);
    let c = client(&s, &tls).await;
    let metrics = http_get(s.metrics, "/metrics");
    assert!(
        counter(&metrics, "ps_rows_recovered_total") <= 100.0,
        "{metrics}"
    );
    let restarted = pull(&c, &ids).await.unwrap();
    assert_eq!(before, restarted, "rows differ after restart");
    c.close().await;
    sigterm_and_wait(s);
}
