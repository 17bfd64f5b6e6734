//! Issue 3, admission and TTL configured on a real `ps-server` process: an id pushed fewer than
//! `--admission-min-count` times keeps reading as its initializer; a row no push touched for `--row-ttl-secs`
//! is deleted from memory and RocksDB (gone after a restart too), and both are counted on /metrics.
mod common;

use std::time::{Duration, Instant};

use common::{client, http_get, metric, pull, push, sigterm_and_wait, start, table};

/// The value of an unlabelled counter in a /metrics page (0 if absent).
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_pushed_fewer_than_k_times_read_as_the_initializer() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let s = start(&data, &tls, &["--admission-min-count", "3"]);
    let c = client(&s, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    // A client connecting later learns the table as registered: the server's policy is not in the spec.
    let c2 = client(&s, &tls).await;
    assert_eq!(c2.known_tables(), &[table()]);
    c2.close().await;
    let ids = [11u64, 22];
    let init = pull(&c, &ids).await.unwrap();
    let grad = [0.5f32; 8];
    for _ in 0..2 {
        assert_eq!(push(&c, &[11], &grad).await, (0, 0), "dropped before k");
        assert_eq!(pull(&c, &ids).await.unwrap(), init);
    }
    let metrics = http_get(s.metrics, "/metrics");
    assert_eq!(
        counter(&metrics, "ps_rows_rejected_admission_total"),
        2,
        "{metrics}"
    );
    assert!(metrics.contains("# HELP ps_rows_rejected_admission_total"));
    // The third push admits the id: its row is created and updated; the other id is untouched.
    assert_eq!(push(&c, &[11], &grad).await, (1, 0));
    let after = pull(&c, &ids).await.unwrap();
    assert_ne!(after[..32], init[..32], "id 11 was admitted and updated");
    assert_eq!(
        after[32..],
        init[32..],
        "id 22 still reads as its initializer"
    );
    c.close().await;
    sigterm_and_wait(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_untouched_past_the_ttl_are_deleted_from_memory_and_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let ids = [5u64, 6, 7];
    // The table gets a TTL of 2 s when registered. This first server runs one expiry pass, at start-up, and
    // the next an hour later: once that pass is done, the pushed rows stay until they are in RocksDB, however
    // long the pushes and the flush take.
    let s = start(
        &data,
        &tls,
        &[
            "--row-ttl-secs",
            "2",
            "--expire-interval-secs",
            "3600",
            "--flush-interval-secs",
            "3600",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&s, "ps_expire_duration_seconds_count") < 1.0 {
        assert!(Instant::now() < deadline, "no expiry pass at start-up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = client(&s, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    let init = pull(&c, &[5, 6, 7, 8]).await.unwrap();
    assert_eq!(push(&c, &ids, &[0.25f32; 24]).await, (3, 0));
    assert_ne!(pull(&c, &ids).await.unwrap(), init[..96]);
    assert_eq!(c.flush().await.unwrap(), 3);
    let metrics = http_get(s.metrics, "/metrics");
    assert!(
        metrics.contains("ps_rows_on_disk{table=\"C3\"} 3"),
        "{metrics}"
    );
    c.close().await;
    sigterm_and_wait(s);

    // Expiry passes every 0.2 s: the recovered rows' TTL starts at the first (at start-up); a row pushed at
    // second S expires at the first pass at S + 2 or later.
    let flags = [
        "--row-ttl-secs",
        "2",
        "--expire-interval-secs",
        "0.2",
        "--flush-interval-secs",
        "3600",
    ];
    let s = start(&data, &tls, &flags);
    let c = client(&s, &tls).await;
    let metrics = http_get(s.metrics, "/metrics");
    assert_eq!(counter(&metrics, "ps_rows_recovered_total"), 3, "{metrics}");
    assert!(
        metrics.contains("ps_rows_on_disk{table=\"C3\"} 3"),
        "{metrics}"
    );
    // A row pushed to this server (stamped by the push), in memory only: it must expire too, and not come
    // back through the shutdown write-back.
    assert_eq!(push(&c, &[8], &[0.25f32; 8]).await, (1, 0));

    // The expiry pass counts the deleted rows before it refreshes the row gauges: wait for both.
    let deadline = Instant::now() + Duration::from_secs(15);
    let metrics = loop {
        let metrics = http_get(s.metrics, "/metrics");
        if counter(&metrics, "ps_rows_expired_total") >= 4
            && metrics.contains("ps_rows_in_memory{table=\"C3\"} 0")
        {
            break metrics;
        }
        assert!(Instant::now() < deadline, "rows never expired: {metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(counter(&metrics, "ps_rows_expired_total"), 4, "{metrics}");
    assert!(metrics.contains("# HELP ps_rows_expired_total"));
    assert_eq!(
        pull(&c, &[5, 6, 7, 8]).await.unwrap(),
        init,
        "expired rows read as new"
    );
    c.close().await;
    sigterm_and_wait(s);

    // Deleted from RocksDB too: nothing is recovered, and the ids read as their initializer.
    let s = start(&data, &tls, &flags);
    let c = client(&s, &tls).await;
    let metrics = http_get(s.metrics, "/metrics");
    assert_eq!(counter(&metrics, "ps_rows_recovered_total"), 0, "{metrics}");
    assert_eq!(pull(&c, &[5, 6, 7, 8]).await.unwrap(), init);
    c.close().await;
    sigterm_and_wait(s);
}

/// Issue 43, a row cap on a real `ps-server` process: a table registered with an LFU cap of 4 rows keeps its 4
/// most pushed rows; the others are deleted from memory and RocksDB (they read as new again, after a restart
/// too) and counted on /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_past_a_cap_are_deleted_least_frequently_updated_first() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let capped = protocol::TableConfig {
        eviction: Some(protocol::EvictionConfig {
            policy: protocol::EvictionPolicy::Lfu,
            max_rows: Some(4),
            max_bytes: None,
            decay_secs: None,
        }),
        ..table()
    };
    let flags = [
        "--expire-interval-secs",
        "0.2",
        "--flush-interval-secs",
        "3600",
    ];
    let s = start(&data, &tls, &flags);
    let c = client(&s, &tls).await;
    c.register_tables(&[capped]).await.unwrap();
    let ids: Vec<u64> = (1..=10).collect();
    let init = pull(&c, &ids).await.unwrap();
    // Ids 1..=4 are pushed three times, 5..=10 once.
    assert_eq!(push(&c, &ids, &vec![0.25f32; 80]).await, (10, 0));
    for _ in 0..2 {
        assert_eq!(push(&c, &ids[..4], &[0.25f32; 32]).await, (4, 0));
    }
    assert_eq!(c.flush().await.unwrap(), 10);
    let deadline = Instant::now() + Duration::from_secs(15);
    let metrics = loop {
        let metrics = http_get(s.metrics, "/metrics");
        if counter(&metrics, "ps_rows_capped_total") >= 6
            && metrics.contains("ps_rows_in_memory{table=\"C3\"} 4")
        {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "no rows deleted past the cap: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(counter(&metrics, "ps_rows_capped_total"), 6, "{metrics}");
    assert!(metrics.contains("# HELP ps_rows_capped_total"));
    let now = pull(&c, &ids).await.unwrap();
    let row = |b: &[u8], i: usize| b[i * 32..(i + 1) * 32].to_vec();
    for i in 0..10 {
        if i < 4 {
            assert_ne!(row(&now, i), row(&init, i), "hot id {} was deleted", i + 1);
        } else {
            assert_eq!(row(&now, i), row(&init, i), "cold id {} was kept", i + 1);
        }
    }
    c.close().await;
    sigterm_and_wait(s);
    // After a restart: the 4 kept rows only (the deleted ones are gone from RocksDB too).
    let s = start(&data, &tls, &flags);
    let c = client(&s, &tls).await;
    let metrics = http_get(s.metrics, "/metrics");
    assert_eq!(counter(&metrics, "ps_rows_recovered_total"), 4, "{metrics}");
    assert_eq!(pull(&c, &ids).await.unwrap(), now);
    c.close().await;
    sigterm_and_wait(s);
}

/// Issue 43, a score cap on a real `ps-server` process: a table registered to evict by score (cap 4) keeps
/// the 4 ids its trainer scored highest and deletes the rest, pushed as often, from memory and RocksDB; ids
/// without a row are not scored; a table keeping no scores is refused naming its policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_past_a_score_cap_are_deleted_lowest_score_first() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let scored = protocol::TableConfig {
        eviction: Some(protocol::EvictionConfig {
            policy: protocol::EvictionPolicy::Score,
            max_rows: Some(4),
            max_bytes: None,
            decay_secs: None,
        }),
        ..table()
    };
    let flags = [
        "--expire-interval-secs",
        "0.2",
        "--flush-interval-secs",
        "3600",
    ];
    let s = start(&data, &tls, &flags);
    let c = std::sync::Arc::new(client(&s, &tls).await);
    c.register_tables(&[scored]).await.unwrap();
    let score = |ids: Vec<u64>, scores: Vec<f32>| {
        let c = c.clone();
        async move { protocol::keyed::score_ids(&c, 3, &ids, &scores, protocol::ScoreMode::Add).await }
    };
    // Rounds of 10 fresh ids pushed once each, the last 4 scored (above every earlier round's scores). An
    // expiry pass between the push and the scores may delete some of those 4 (every row scores 0 then): the
    // round is repeated until all 4 are scored; then they, and only they, must stay.
    let mut round = 0u64;
    let (ids, init) = loop {
        let ids: Vec<u64> = (1..=10).map(|i| round * 100 + i).collect();
        let init = pull(&c, &ids).await.unwrap();
        assert_eq!(push(&c, &ids, &vec![0.25f32; 80]).await, (10, 0));
        let top = (1000 * (round + 1)) as f32;
        let found = score(
            ids[6..].to_vec(),
            vec![top, top + 1.0, top + 2.0, top + 3.0],
        )
        .await
        .unwrap();
        if found == 4 {
            break (ids, init);
        }
        round += 1;
        assert!(
            round < 20,
            "an expiry pass ran between every push and its scores"
        );
    };
    // Ids without a row are not scored; a table without the policy is refused by name.
    assert_eq!(score(vec![999_999], vec![5.0]).await.unwrap(), 0);
    let bad = score(ids.clone(), vec![-1.0; 10])
        .await
        .unwrap_err()
        .to_string();
    assert!(bad.contains("not a finite value >= 0"), "{bad}");
    let plain = protocol::TableConfig {
        id: 4,
        name: "plain".into(),
        ..table()
    };
    c.register_tables(&[plain]).await.unwrap();
    let refused = protocol::keyed::score_ids(&c, 4, &[1], &[1.0], protocol::ScoreMode::Set)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("keeps none"), "{refused}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let metrics = loop {
        let metrics = http_get(s.metrics, "/metrics");
        if metrics.contains("ps_rows_in_memory{table=\"C3\"} 4") {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "no rows deleted past the cap: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        metrics.contains("ps_scores_total{found=\"true\"}"),
        "{metrics}"
    );
    let now = pull(&c, &ids).await.unwrap();
    let row = |b: &[u8], i: usize| b[i * 32..(i + 1) * 32].to_vec();
    for (i, id) in ids.iter().enumerate() {
        if i >= 6 {
            assert_ne!(row(&now, i), row(&init, i), "scored id {id} was deleted");
        } else {
            assert_eq!(row(&now, i), row(&init, i), "unscored id {id} was kept");
        }
    }
    c.flush().await.unwrap();
    let c = std::sync::Arc::try_unwrap(c).ok().expect("one client");
    c.close().await;
    sigterm_and_wait(s);
    // After a restart: the 4 kept rows only (the others are gone from RocksDB too).
    let s = start(&data, &tls, &flags);
    let c = client(&s, &tls).await;
    let metrics = http_get(s.metrics, "/metrics");
    assert_eq!(counter(&metrics, "ps_rows_recovered_total"), 4, "{metrics}");
    assert_eq!(pull(&c, &ids).await.unwrap(), now);
    c.close().await;
    sigterm_and_wait(s);
}
