//! Real processes on loopback, killed with SIGKILL (no shutdown write-back): with `--durability sync` every
//! acknowledged push survives the restart bit for bit; with `--durability periodic` and a long flush interval
//! the same pushes are lost (the rows read as their initializer again), which is the difference between them.
//!
//! SIGKILL kills the process, not the machine: a write RocksDB has handed to the kernel survives it even
//! unsynced. What these tests show is that `sync` writes the rows before acknowledging; that the write is also
//! fsynced (surviving power loss) is the `sync = true` of the write and is not observable here.

mod common;

use bytes::Bytes;
use common::{client, sigkill_and_wait, sigterm_and_wait, start, table};
use protocol::PsClient;

/// Pulls rows of table 3 as f32 (must succeed).
async fn pull(c: &PsClient, ids: &[u64]) -> Bytes {
    common::pull(c, ids).await.unwrap()
}

async fn push(c: &PsClient, ids: &[u64], salt: usize) {
    let grads: Vec<f32> = (0..ids.len() * 8)
        .map(|i| (((i + salt) % 17) as f32 - 8.0) * 0.37)
        .collect();
    assert_eq!(common::push(c, ids, &grads).await, (ids.len() as u64, 0));
}

/// Pushes twice (overlapping ids) into a fresh server started with `flags`, SIGKILLs it (SIGTERM if `!kill`),
/// restarts it on the same data dir, and returns (rows before any push, rows after the pushes, rows after the
/// restart).
async fn push_kill_restart(flags: &[&str], kill: bool) -> (Bytes, Bytes, Bytes) {
    let dir = tempfile::tempdir().unwrap();
    let (data, tls) = (dir.path().join("data"), dir.path().join("tls"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let s = start(&data, &tls, flags);
    let c = client(&s, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    let ids: Vec<u64> = (0..500).map(|i| i * 1_000_003).collect();
    let initial = pull(&c, &ids).await;
    push(&c, &ids, 0).await;
    push(&c, &ids[100..300], 5).await;
    let pushed = pull(&c, &ids).await;
    assert_ne!(initial, pushed);
    c.close().await;
    if kill {
        sigkill_and_wait(s);
    } else {
        sigterm_and_wait(s);
    }

    let s = start(&data, &tls, &[]);
    let c = client(&s, &tls).await;
    // Idempotent: the config is normally recovered, but nothing here depends on it.
    c.register_tables(&[table()]).await.unwrap();
    let after = pull(&c, &ids).await;
    c.close().await;
    sigterm_and_wait(s);
    (initial, pushed, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_durability_keeps_every_acknowledged_push_through_sigkill() {
    let (_, pushed, after) = push_kill_restart(
        &["--durability", "sync", "--flush-interval-secs", "3600"],
        true,
    )
    .await;
    assert_eq!(pushed, after, "acknowledged pushes lost after SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_durability_loses_pushes_since_the_last_flush_on_sigkill() {
    // The difference: without a write-back between the pushes and the kill, nothing of them reached RocksDB,
    // so the rows read as their initializer again (loss bounded by the flush interval, here the whole run).
    let (initial, pushed, after) = push_kill_restart(
        &["--durability", "periodic", "--flush-interval-secs", "3600"],
        true,
    )
    .await;
    assert_ne!(pushed, after);
    assert_eq!(
        initial, after,
        "rows after restart should be the initializer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_durability_writes_nothing_even_at_a_clean_shutdown() {
    // Loss bound "everything": not even SIGTERM's shutdown write-back runs.
    let (initial, _, after) = push_kill_restart(
        &["--durability", "none", "--flush-interval-secs", "1"],
        false,
    )
    .await;
    assert_eq!(
        initial, after,
        "rows after restart should be the initializer"
    );
}
