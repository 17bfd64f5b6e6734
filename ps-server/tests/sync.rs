//! Real processes on loopback: serving's delta sync through `PsClient::sync_deltas` (a client that
//! registers no table): a first scan, a standing long-poll answered once a push is cut, current values equal
//! to a pull, dense publication, and a long-poll answered at shutdown instead of holding it up.
mod common;

use std::time::Duration;

use common::{sigterm_and_wait, table};
use protocol::wire::message::sync::{DeltaBatch, SyncCursor};
use protocol::{Encoding, PsClient, PsClientConfig};

/// Long-polls until an answer carries id `id` (each poll waits at most 20 s for a cut; a handful suffice).
async fn poll_until(c: &PsClient, mut cursor: SyncCursor, id: u64) -> DeltaBatch {
    for _ in 0..20 {
        let b = c
            .sync_deltas(0, cursor, Encoding::F32, 1000, 20_000, u64::MAX)
            .await
            .unwrap();
        if b.tables.iter().any(|t| t.ids.contains(&id)) {
            return b;
        }
        cursor = b.header.cursor;
    }
    panic!("no id {id} after 20 polls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_the_pushed_rows_after_the_next_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let server = common::start(&data, &tls, &["--sync-interval-secs", "0.05"]);
    let trainer = common::client(&server, &tls).await;
    trainer.register_tables(&[table()]).await.unwrap();
    common::push(&trainer, &[10, 20], &[0.5; 16]).await;

    // Serving: a client that only syncs. Its first answers are a scan of what the server holds.
    let serving = PsClient::connect(serving_config(&server, &tls))
        .await
        .unwrap();
    let mut cursor = SyncCursor::START;
    let mut scanned = Vec::new();
    loop {
        let b = serving
            .sync_deltas(0, cursor, Encoding::F32, 1, 0, 0)
            .await
            .unwrap();
        assert!(b.header.scan);
        scanned.extend(b.tables.iter().flat_map(|t| t.ids.clone()));
        cursor = b.header.cursor;
        if b.header.complete {
            break;
        }
    }
    assert_eq!(scanned, [10, 20]);

    // A standing long-poll: started before the push it returns.
    let poll = {
        let serving = PsClient::connect(serving_config(&server, &tls))
            .await
            .unwrap();
        tokio::spawn(async move { poll_until(&serving, cursor, 30).await })
    };
    common::push(&trainer, &[20, 30], &[1.0; 16]).await;
    let b = poll.await.unwrap();
    assert!(!b.header.scan);
    assert!(b.header.cut_unix_us >= b.header.oldest_change_unix_us);
    // Id 10 too when its push was cut after the scan began (the scan's deltas start from the seq current
    // when it began).
    let ids = &b.tables[0].ids;
    assert!(ids == &[20, 30] || ids == &[10, 20, 30], "{ids:?}");
    let pulled = common::pull(&trainer, ids).await.unwrap();
    let mut want = vec![0.0f32; ids.len() * 8];
    protocol::compression::codec::decode(&pulled, Encoding::F32, &mut want).unwrap();
    assert_eq!(
        b.tables[0].rows, want,
        "current values, as a pull reads them"
    );

    // Dense parameters reach a subscriber holding an older version.
    assert_eq!(
        trainer.publish_dense(3, 300, &[1.0, -2.0]).await.unwrap(),
        3
    );
    let b = serving
        .sync_deltas(0, b.header.cursor, Encoding::F16, 10, 20_000, 2)
        .await
        .unwrap();
    assert_eq!(b.header.dense.map(|d| (d.version, d.step)), Some((3, 300)));
    assert_eq!(b.dense.unwrap(), [1.0, -2.0]);

    // A long-poll waiting at shutdown is answered then, not at the end of its wait.
    let waiting = {
        let cursor = b.header.cursor;
        tokio::spawn(async move {
            serving
                .sync_deltas(0, cursor, Encoding::F32, 10, 25_000, 3)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::task::spawn_blocking(move || sigterm_and_wait(server))
        .await
        .unwrap();
    // Answered empty, or failed with the connection: either way it returned.
    if let Ok(b) = waiting.await.unwrap() {
        assert_eq!(b.rows(), 0);
    }
    trainer.close().await;
}

/// A client of role serving (the delta sync is for serving: docs/security.md).
fn serving_config(server: &common::Server, tls: &std::path::Path) -> PsClientConfig {
    let mut cfg = PsClientConfig::new(vec![server.quic], tls.to_owned());
    cfg.role = protocol::Role::Serving;
    cfg
}
