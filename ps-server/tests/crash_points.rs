//! Crashes of a real `ps-server` process where a crash matters, and what a restart recovers. Each test arms
//! one crash point through the failpoint file the server watches (`PS_FAILPOINTS_FILE`,
//! `ps_server::failpoints`); the point ends the process with `_exit` (no unwinding, no flush), the test sees
//! the process exit with `CRASH_EXIT_CODE` (so it died there and nowhere else), restarts it without the
//! failpoint on the same data, and checks the rows:
//! - after a push's synced write, before its answer (`PUSH_BEFORE_ACK`): the client saw an error, and the
//!   push is there once;
//! - mid-checkpoint, before the manifest (`CHECKPOINT_BEFORE_MANIFEST`): `ps-server restore` refuses the
//!   torn snapshot naming its folder, restores the previous one, and a new checkpoint into the torn folder
//!   succeeds;
//! - mid-eviction, between the store write and the release of memory (`EVICT_BEFORE_RELEASE`): every row
//!   has its last acknowledged value (or the unacknowledged push's);
//! - mid-reshard commit, on the destination after it persisted the new map (`RESHARD_MAP_PERSISTED`): the
//!   cluster has the new layout and every row once, with its value.
//!
//! The tests use counter tables (SGD at learning rate 1, zero rows, gradients of 1): a row's value is minus
//! the number of pushes applied to it. Built with the server's `failpoints` feature, as `disk_errors.rs`
//! (this package's dev-dependency on itself turns it on for `cargo test`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    counter_table, metric, set_failpoints, sigterm_and_wait, spawn_at, wait_for, wait_for_exit,
    Server,
};
use embedding::failpoints::{CHECKPOINT_BEFORE_MANIFEST, CRASH_EXIT_CODE, EVICT_BEFORE_RELEASE};
use protocol::compression::codec;
use protocol::wire::layout::put_ids;
use protocol::{Encoding, ProtocolError, PsClient, PsClientConfig, TableCount};
use ps_server::failpoints::{FILE_ENV, PUSH_BEFORE_ACK, RESHARD_MAP_PERSISTED};

const TABLE: u32 = 6;
const DIM: u32 = 4;

/// A test's directory: TLS material, and per server its data directory and failpoint file.
struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tls: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let tls = root.join("tls");
        protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
        Dirs {
            _tmp: tmp,
            root,
            tls,
        }
    }

    fn data(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn fail(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.fail"))
    }

    /// Starts server `name` as shard `shard` on `listen`, watching its failpoint file.
    fn start(&self, name: &str, listen: &str, shard: (u32, u32), flags: &[&str]) -> Server {
        let fail = self.fail(name);
        spawn_at(
            listen,
            &self.data(name),
            &self.tls,
            shard,
            flags,
            &[(FILE_ENV, fail.as_path())],
        )
    }
}

/// A client of `servers` that does not retry transient failures (a crash is an error at once).
async fn client(servers: &[&Server], tls: &Path) -> PsClient {
    let mut cfg = PsClientConfig::new(servers.iter().map(|s| s.quic).collect(), tls.to_owned());
    cfg.retry_for = Duration::ZERO;
    PsClient::connect(cfg).await.unwrap()
}

fn counts(n: usize) -> Vec<TableCount> {
    vec![TableCount {
        table: TABLE,
        count: n as u32,
        dim: DIM,
    }]
}

/// Pushes a gradient of 1 to every element of the rows of `ids` (ascending, all on `server`).
async fn push_ones(c: &PsClient, server: usize, ids: &[u64]) -> Result<(u64, u64), ProtocolError> {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    codec::encode(
        &vec![1.0; ids.len() * DIM as usize],
        Encoding::F32,
        &mut payload,
    );
    c.push(
        server,
        Encoding::F32,
        1.0,
        counts(ids.len()),
        payload.into(),
    )
    .await
}

/// The rows of `ids` (ascending, all on `server`) as minus their first element: the pushes applied to each.
/// Checks that every element of a row is equal.
async fn applied(c: &PsClient, server: usize, ids: &[u64]) -> Vec<f32> {
    let mut payload = Vec::new();
    put_ids(ids, &mut payload);
    let bytes = c
        .pull(server, Encoding::F32, counts(ids.len()), payload.into())
        .await
        .unwrap();
    let mut out = vec![0.0; ids.len() * DIM as usize];
    codec::decode(&bytes, Encoding::F32, &mut out).unwrap();
    out.chunks(DIM as usize)
        .zip(ids)
        .map(|(row, id)| {
            assert!(row.iter().all(|&x| x == row[0]), "id {id}: row {row:?}");
            -row[0]
        })
        .collect()
}

impl Dirs {
    /// Waits for server `name` to die at its armed crash point, then removes its failpoint file, so its
    /// restart runs without faults.
    fn crashed(&self, name: &str, s: Server) {
        assert_eq!(
            wait_for_exit(s),
            Some(CRASH_EXIT_CODE),
            "the server did not exit at its crash point"
        );
        std::fs::remove_file(self.fail(name)).unwrap();
    }
}

fn arm(fail: &Path, point: &str) {
    set_failpoints(fail, &format!("{point}=return(exit)\n"));
}

/// `durability = "sync"`: a crash after the push's synced write and before its answer. The client sees an
/// error, not a success; the restarted server has the push, applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_synced_write_before_the_ack_keeps_the_push_once() {
    let d = Dirs::new();
    let flags = ["--durability", "sync", "--flush-interval-secs", "3600"];
    let s = d.start("ps", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    c.register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();
    let ids = [1, 2, 3];
    assert_eq!(push_ones(&c, 0, &ids).await.unwrap(), (3, 0));

    arm(&d.fail("ps"), PUSH_BEFORE_ACK);
    let r = push_ones(&c, 0, &ids).await;
    assert!(r.is_err(), "a push whose server died answered {r:?}");
    d.crashed("ps", s);
    c.close().await;

    let s = d.start("ps", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    assert_eq!(applied(&c, 0, &ids).await, [2.0; 3]);
    c.close().await;
    sigterm_and_wait(s);
}

/// `durability = "sync"`: the same crash, and the client retries. The retry reaches the server restarted on its
/// port and data, which answers it from the push answers stored with the rows: the client sees the push
/// succeed, applied once (before the push window was stored, the retry was applied a second time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_retried_across_a_crash_after_its_synced_write_is_applied_once() {
    let d = Dirs::new();
    let flags = ["--durability", "sync", "--flush-interval-secs", "3600"];
    let s = d.start("ps", "127.0.0.1:0", (0, 1), &flags);
    let listen = s.quic.to_string();
    let mut cfg = PsClientConfig::new(vec![s.quic], d.tls.clone());
    cfg.retry_for = Duration::from_secs(120);
    let c = std::sync::Arc::new(PsClient::connect(cfg).await.unwrap());
    c.register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();
    let ids = [1, 2, 3];
    assert_eq!(push_ones(&c, 0, &ids).await.unwrap(), (3, 0));

    arm(&d.fail("ps"), PUSH_BEFORE_ACK);
    let pushing = {
        let c = c.clone();
        tokio::spawn(async move { push_ones(&c, 0, &ids).await })
    };
    let dead = tokio::task::spawn_blocking({
        let fail = d.fail("ps");
        move || {
            let code = wait_for_exit(s);
            std::fs::remove_file(fail).unwrap();
            code
        }
    });
    assert_eq!(dead.await.unwrap(), Some(CRASH_EXIT_CODE));
    let s = d.start("ps", &listen, (0, 1), &flags);
    assert_eq!(
        pushing.await.unwrap().unwrap(),
        (3, 0),
        "the retry gets the first answer"
    );
    assert_eq!(applied(&c, 0, &ids).await, [2.0; 3], "applied once");
    assert!(metric(&s, "ps_push_window_restored_total") >= 1.0);
    assert!(metric(&s, "ps_push_retries_answered_total") >= 1.0);
    c.close().await;
    sigterm_and_wait(s);
}

/// Runs `ps-server restore` of `from` into `out` as the one server.
fn restore(from: &Path, out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .arg("restore")
        .arg("--from")
        .arg(from)
        .args(["--num-shards", "1", "--shard-index", "0", "--data-dir"])
        .arg(out)
        .output()
        .expect("run ps-server restore")
}

/// A crash mid-checkpoint (database and `sync.json` written, no manifest) leaves a snapshot nobody takes as
/// valid: `ps-server restore` refuses it naming the folder and restores the previous one; the restarted
/// server checkpoints into the torn folder again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_checkpoint_leaves_a_snapshot_restore_refuses() {
    let d = Dirs::new();
    let flags = ["--flush-interval-secs", "3600"];
    // The default checkpoint root: `checkpoints` beside the data directory.
    let root = d.root.join("checkpoints");
    let s = d.start("ps", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    c.register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();
    let ids = [1, 2, 3];
    push_ones(&c, 0, &ids).await.unwrap();
    c.checkpoint("first", 1).await.unwrap();
    push_ones(&c, 0, &ids).await.unwrap();

    arm(&d.fail("ps"), CHECKPOINT_BEFORE_MANIFEST);
    let r = c.checkpoint("second", 2).await;
    assert!(r.is_err(), "a checkpoint whose server died answered {r:?}");
    d.crashed("ps", s);
    c.close().await;
    let torn = root.join("second/shard-0-of-1");
    assert!(torn.join("rocksdb").is_dir() && torn.join("sync.json").is_file());
    assert!(!torn.join("manifest.json").exists());

    let out = restore(&root.join("second"), &d.data("from-second"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "restore of a torn snapshot: {stderr}"
    );
    assert!(
        stderr.contains(&format!("{}: no manifest.json", torn.display())),
        "{stderr}"
    );
    assert!(!d.data("from-second").join("rocksdb").exists());
    let out = restore(&root.join("first"), &d.data("from-first"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = d.start("from-first", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    assert_eq!(applied(&c, 0, &ids).await, [1.0; 3]);
    c.close().await;
    sigterm_and_wait(s);

    // The checkpoint's write-back reached the store before the crash: the restarted server has both pushes,
    // and its checkpoint into the torn folder replaces it.
    let s = d.start("ps", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    assert_eq!(applied(&c, 0, &ids).await, [2.0; 3]);
    let written = c.checkpoint("second", 2).await.unwrap();
    assert_eq!(written[0].0, 3, "{written:?}");
    c.close().await;
    sigterm_and_wait(s);
    let out = restore(&root.join("second"), &d.data("from-second"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = d.start("from-second", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    assert_eq!(applied(&c, 0, &ids).await, [2.0; 3]);
    c.close().await;
    sigterm_and_wait(s);
}

/// `durability = "sync"` and a memory budget of 100 rows over 1000: a crash after an eviction batch reached
/// the store and before its rows left memory. Pushes of every row go on until the server dies; after the
/// restart each row has the value of the last acknowledged push, or of the push that was under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_eviction_keeps_every_rows_last_value() {
    let d = Dirs::new();
    let flags = [
        "--durability",
        "sync",
        "--memory-budget-rows",
        "100",
        "--flush-interval-secs",
        "3600",
    ];
    let s = d.start("ps", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    c.register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();
    let ids: Vec<u64> = (0..1000).map(|i| i * 7_919).collect();
    push_ones(&c, 0, &ids).await.unwrap();
    // Evicted to the budget before the crash point is armed: later rounds read rows back from the store.
    wait_for("the first eviction", || {
        metric(&s, "ps_evictions_total") >= 900.0
    });

    arm(&d.fail("ps"), EVICT_BEFORE_RELEASE);
    // Each round reads 900 rows back, over the budget: the budget timer (every 200 ms) evicts, and dies.
    let (mut acked, mut under_way) = (1.0f32, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match push_ones(&c, 0, &ids).await {
            Ok(_) => acked += 1.0,
            Err(_) => {
                under_way = true;
                break;
            }
        }
    }
    assert!(under_way, "the server did not die evicting");
    d.crashed("ps", s);
    c.close().await;

    let s = d.start("ps", "127.0.0.1:0", (0, 1), &flags);
    let c = client(&[&s], &d.tls).await;
    let got = applied(&c, 0, &ids).await;
    for (id, v) in ids.iter().zip(&got) {
        assert!(
            *v == acked || *v == acked + 1.0,
            "id {id}: {v} pushes applied, {acked} acknowledged and one under way"
        );
    }
    c.close().await;
    sigterm_and_wait(s);
}

/// A reshard 1 -> 2 (a standby joins) whose destination crashes in its commit, after it persisted the new
/// map. The source committed before it (switched, and deleted the rows it moved once the destination had
/// them all). The coordinator is stopped (it would wait out the dead connection and commit again); the
/// destination restarts where the map says it is. The cluster has the new layout, and every row is on
/// exactly one server with its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_reshard_commit_keeps_every_row_once() {
    let d = Dirs::new();
    let flags = ["--flush-interval-secs", "3600"];
    let a = d.start("a", "127.0.0.1:0", (0, 1), &flags);
    let standby = [&flags[..], &["--standby"]].concat();
    let b = d.start("b", "127.0.0.1:0", (1, 2), &standby);
    let c = client(&[&a], &d.tls).await;
    c.register_tables(&[counter_table(TABLE, DIM)])
        .await
        .unwrap();
    let ids: Vec<u64> = (0..1000).map(|i| i * 7_919).collect();
    push_ones(&c, 0, &ids).await.unwrap();
    c.close().await;

    arm(&d.fail("b"), RESHARD_MAP_PERSISTED);
    let mut coordinator = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["reshard", "--ps", &a.quic.to_string()])
        .args(["--to", &format!("{},{}", a.quic, b.quic), "--tls-dir"])
        .arg(&d.tls)
        .spawn()
        .expect("run ps-server reshard");
    let b_addr = b.quic.to_string();
    d.crashed("b", b);
    coordinator.kill().unwrap();
    coordinator.wait().unwrap();

    let b = d.start("b", &b_addr, (1, 2), &standby);
    let c = client(&[&a, &b], &d.tls).await;
    let map = c.shard_map();
    assert_eq!((map.epoch, map.num_servers), (2, 2), "{map:?}");
    let mut by_server = vec![Vec::new(); 2];
    for &id in &ids {
        by_server[map.server_of(id) as usize].push(id);
    }
    for (server, ids) in by_server.iter_mut().enumerate() {
        ids.sort_unstable();
        assert!(!ids.is_empty());
        let got = applied(&c, server, ids).await;
        for (id, v) in ids.iter().zip(&got) {
            assert_eq!(*v, 1.0, "id {id} on server {server}");
        }
    }
    // Each server's store holds exactly its rows: a snapshot of each counts them (the source's count once
    // it deleted the rows it gave away; checkpoints wait for that).
    let written = retry_checkpoint(&c).await;
    let rows: Vec<u64> = written.iter().map(|w| w.0).collect();
    assert_eq!(rows, [by_server[0].len() as u64, by_server[1].len() as u64]);
    c.close().await;
    sigterm_and_wait(a);
    sigterm_and_wait(b);
}

/// A checkpoint of every server, asked again while a server refuses it as transient (the source deleting
/// the rows it moved away).
async fn retry_checkpoint(c: &PsClient) -> Vec<(u64, String)> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match c.checkpoint("after-reshard", 1).await {
            Ok(w) => return w,
            Err(e) if Instant::now() < deadline && e.is_transient() => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("checkpoint after the reshard: {e}"),
        }
    }
}
