//! Replicated shards end to end (docs/replication.md): 2 shards x 2 replicas of the real `ps-server` with
//! `durability = "replicated"`, a pusher counting every acknowledged `+1` (the audit table of
//! `bench::audit`) on one client while primaries and backups are SIGKILLed and restarted:
//!
//! - a primary killed while pushes flow: they go on (failover), and no acknowledged push is lost;
//! - the old primary restarts, rejoins as a backup and catches up: every row is bit-identical on both
//!   replicas after a flush;
//! - a backup killed and restarted catches up the same way.
//!
//! Every wait is for an event (a count of acknowledged pushes, a replica's `in_sync`), never for a time.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::audit::{audit_table, AuditRows};
use bytes::Bytes;
use local_cluster::LocalCluster;
use protocol::wire::layout::put_ids;
use protocol::wire::message::replicate::ReplicaInfo;
use protocol::{Encoding, PsClient, PsClientConfig, Request, Response, TableCount};

const ROWS_PER_SHARD: usize = 8;

/// Acknowledged increments per counter id, and the count of acknowledged pushes.
#[derive(Default)]
struct Acks {
    per_id: std::sync::Mutex<HashMap<u64, u64>>,
    pushes: AtomicU64,
}

/// Pushes `+1` to every counter of each shard in turn until `stop`, recording each acknowledged push.
async fn pusher(client: Arc<PsClient>, rows: AuditRows, acks: Arc<Acks>, stop: Arc<AtomicBool>) {
    let table = audit_table();
    while !stop.load(Ordering::Acquire) {
        for (shard, ids) in rows.per_server.iter().enumerate() {
            let mut payload = Vec::new();
            put_ids(ids, &mut payload);
            for _ in ids {
                payload.extend_from_slice(&(-1.0f32).to_le_bytes());
            }
            let counts = vec![TableCount {
                table: table.id,
                count: ids.len() as u32,
                dim: 1,
            }];
            client
                .push(shard, Encoding::F32, 1.0, counts, Bytes::from(payload))
                .await
                .expect("a push fails only after retry_for: no primary came back");
            let mut per_id = acks.per_id.lock().unwrap();
            for &id in ids {
                *per_id.entry(id).or_default() += 1;
            }
            acks.pushes.fetch_add(1, Ordering::Release);
        }
    }
}

/// A client of a replicated cluster with the audit table registered, and a [`pusher`] running on it.
struct Pushing {
    client: Arc<PsClient>,
    rows: AuditRows,
    acks: Arc<Acks>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// Connects to `c` (retrying for a minute), registers the audit table over `shards` shards and starts pushing.
async fn start_pushing(c: &LocalCluster, shards: usize) -> Pushing {
    let mut cfg = PsClientConfig::replicated(c.replicas.clone(), c.tls_dir.clone());
    cfg.retry_for = Duration::from_secs(60);
    let client = Arc::new(PsClient::connect(cfg).await.unwrap());
    client.register_tables(&[audit_table()]).await.unwrap();
    let rows = AuditRows::new(shards, ROWS_PER_SHARD).unwrap();
    let (acks, stop) = (Arc::new(Acks::default()), Arc::new(AtomicBool::new(false)));
    let task = tokio::spawn(pusher(
        client.clone(),
        rows.clone(),
        acks.clone(),
        stop.clone(),
    ));
    Pushing {
        client,
        rows,
        acks,
        stop,
        task,
    }
}

/// Waits until `acks` counts `more` pushes beyond now.
async fn acked_more(acks: &Acks, more: u64) {
    let target = acks.pushes.load(Ordering::Acquire) + more;
    let deadline = Instant::now() + Duration::from_secs(120);
    while acks.pushes.load(Ordering::Acquire) < target {
        assert!(Instant::now() < deadline, "pushes stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends one request to replica `r` of `shard` alone (not through failover), on a fresh connection.
async fn raw_call(
    c: &LocalCluster,
    shard: usize,
    r: usize,
    req: &Request,
    payload: Bytes,
) -> Result<(Response, Bytes), protocol::ProtocolError> {
    use protocol::transport::{Connection, Dialer};
    let addr = c.replicas[shard][r];
    let dialer = protocol::Transport::Quic.dialer(addr, &c.tls_dir, protocol::Role::Trainer)?;
    let conn = tokio::time::timeout(
        Duration::from_secs(5),
        dialer.connect(
            addr,
            protocol::transport::tls::DEFAULT_SERVER_NAME,
            64 << 20,
        ),
    )
    .await
    .map_err(|_| protocol::ProtocolError::Timeout {
        server: addr.to_string(),
        secs: 5.0,
    })??;
    let reply = conn.call(addr, req, &payload).await;
    conn.close();
    dialer.wait_idle().await;
    reply
}

/// What replica `r` of `shard` says about itself (`None` while it does not answer).
async fn info(c: &LocalCluster, shard: usize, r: usize) -> Option<ReplicaInfo> {
    let hello = protocol::wire::message::hello::request();
    match raw_call(c, shard, r, &hello, Bytes::new()).await.ok()? {
        (Response::Hello { replica, .. }, _) => Some(replica),
        _ => None,
    }
}

async fn wait_in_sync(c: &LocalCluster, shard: usize, r: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if info(c, shard, r).await.is_some_and(|i| i.in_sync) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica {shard}/{r} never caught up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The counter rows of `shard` as replica `r` holds them (f32 bits).
async fn rows_of(c: &LocalCluster, shard: usize, r: usize, ids: &[u64]) -> Vec<u32> {
    table_rows_of(c, (shard, r), (audit_table().id, 1), ids).await
}

/// Every shard's rows are the same bits on both replicas, and hold at least every acknowledged increment.
async fn check(c: &LocalCluster, client: &PsClient, rows: &AuditRows, acks: &Acks) {
    client.flush().await.unwrap();
    let per_id = acks.per_id.lock().unwrap().clone();
    for (shard, ids) in rows.per_server.iter().enumerate() {
        for r in 0..2 {
            wait_in_sync(c, shard, r).await;
        }
        let a = rows_of(c, shard, 0, ids).await;
        let b = rows_of(c, shard, 1, ids).await;
        assert_eq!(a, b, "shard {shard}: the replicas diverge");
        for (i, &id) in ids.iter().enumerate() {
            let found = f32::from_bits(a[i]);
            let acked = per_id.get(&id).copied().unwrap_or(0) as f32;
            assert!(
                found >= acked,
                "shard {shard} id {id}: {found} < {acked} acknowledged: lost updates"
            );
        }
    }
}

/// `shards` shards of 2 ps-server replicas each in `replicated` durability (rows written back every second),
/// plus `extra` flags.
fn replicated_cluster(shards: usize, dir: &std::path::Path, extra: &[&str]) -> LocalCluster {
    let bin = bench::bins::path("ps-server");
    let mut args: Vec<String> = ["--durability", "replicated", "--flush-interval-secs", "1"]
        .map(String::from)
        .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    LocalCluster::start_replicated_with(
        &|| Ok(std::process::Command::new(&bin)),
        shards,
        2,
        dir,
        &args,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_primaries_and_backups_lose_no_acknowledged_push_and_replicas_converge() {
    let began = Instant::now();
    let stage = |what: &str| eprintln!("[{:6.2} s] {what}", began.elapsed().as_secs_f64());
    let dir = tempfile::tempdir().unwrap();
    let mut c = replicated_cluster(2, dir.path(), &["--drain-timeout-secs", "5"]);
    stage("started");
    let Pushing {
        client,
        rows,
        acks,
        stop,
        task,
    } = start_pushing(&c, 2).await;
    acked_more(&acks, 60).await;
    stage("pushing");

    // The primary of shard 0 dies while pushes flow; they go on through its backup.
    let old = c.primary_of(0).expect("shard 0 has a primary");
    c.kill_replica(0, old).unwrap();
    acked_more(&acks, 60).await;
    assert!(client.failovers() >= 1, "the client moved shard 0");
    assert_eq!(c.primary_of(0), Some(1 - old), "the backup took over");
    stage("failed over");
    // The old primary comes back: as a backup, which catches up.
    let role = c.restart_replica(0, old).unwrap();
    assert_eq!(role.as_deref(), Some("backup"));
    stage("old primary restarted");
    wait_in_sync(&c, 0, old).await;
    acked_more(&acks, 30).await;
    stage("old primary in sync");

    // A backup of shard 1 dies and comes back; it catches up while pushes flow.
    let primary1 = c.primary_of(1).expect("shard 1 has a primary");
    let backup1 = 1 - primary1;
    c.kill_replica(1, backup1).unwrap();
    acked_more(&acks, 60).await;
    c.restart_replica(1, backup1).unwrap();
    stage("backup restarted");
    wait_in_sync(&c, 1, backup1).await;
    acked_more(&acks, 30).await;
    stage("backup in sync");

    stop.store(true, Ordering::Release);
    task.await.unwrap();
    check(&c, &client, &rows, &acks).await;
    stage("checked");
    assert_eq!(
        c.primary_of(1),
        Some(primary1),
        "a backup's restart moves no primary"
    );
    client.close().await;
    c.shutdown(Duration::from_secs(60)).unwrap();
}

/// Sample `name` on the metrics page of replica `r` of `shard` (0 when absent).
fn metric_of(c: &LocalCluster, shard: usize, r: usize, name: &str) -> f64 {
    local_cluster::http_get(c.replica_metrics[shard][r], "/metrics")
        .ok()
        .and_then(|page| local_cluster::metric(&page, name))
        .unwrap_or(0.0)
}

/// Waits until sample `name` of replica `r` of shard 0 reads `want`.
async fn wait_metric(c: &LocalCluster, r: usize, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric_of(c, 0, r, name) != want {
        assert!(
            Instant::now() < deadline,
            "{name} of replica {r} never read {want} (reads {})",
            metric_of(c, 0, r, name)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One `+1` push of the audit table's first row of shard 0, straight to replica `r`.
async fn push_one(c: &LocalCluster, r: usize) -> Response {
    push_one_as(c, r, protocol::wire::message::push::PushId::NONE).await
}

/// [`push_one`] under push id `push`.
async fn push_one_as(
    c: &LocalCluster,
    r: usize,
    push: protocol::wire::message::push::PushId,
) -> Response {
    let id = AuditRows::new(1, 1).unwrap().per_server[0][0];
    let mut payload = Vec::new();
    put_ids(&[id], &mut payload);
    payload.extend_from_slice(&(-1.0f32).to_le_bytes());
    let counts = vec![TableCount {
        table: audit_table().id,
        count: 1,
        dim: 1,
    }];
    let req = Request::Push {
        lr_scale: 1.0,
        epoch: 1,
        encoding: Encoding::F32,
        grad_scale: 1.0,
        tables: counts,
        id: push,
    };
    raw_call(c, 0, r, &req, Bytes::from(payload))
        .await
        .expect("the primary answers")
        .0
}

/// Issue 40: `replicated` durability with no backup in sync said nothing and acknowledged pushes like
/// `periodic`. With `replicated-without-backup = refuse` the primary refuses them (`NoBackup`) until a backup
/// is in sync again; with `degrade` (the default) it goes on and `ps_durability_degraded` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_without_an_in_sync_backup_refuses_or_says_it_is_degraded() {
    for mode in ["refuse", "degrade"] {
        let dir = tempfile::tempdir().unwrap();
        let extra = [
            "--durability",
            "replicated",
            "--replicated-without-backup",
            mode,
        ]
        .map(String::from);
        let mut c = LocalCluster::start_replicated(1, 2, dir.path(), &extra).unwrap();
        let primary = c.primary_of(0).expect("shard 0 has a primary");
        let backup = 1 - primary;
        let mut cfg = PsClientConfig::replicated(c.replicas.clone(), c.tls_dir.clone());
        cfg.retry_for = Duration::from_secs(60);
        let client = PsClient::connect(cfg).await.unwrap();
        client.register_tables(&[audit_table()]).await.unwrap();
        wait_in_sync(&c, 0, backup).await;
        wait_metric(&c, primary, "ps_durability_degraded", 0.0).await;
        assert!(
            matches!(push_one(&c, primary).await, Response::Pushed { .. }),
            "{mode}: a push with its backup in sync"
        );

        c.kill_replica(0, backup).unwrap();
        wait_metric(&c, primary, "ps_durability_degraded", 1.0).await;
        let resp = push_one(&c, primary).await;
        match mode {
            "refuse" => {
                let Response::Error { code, message } = &resp else {
                    panic!("refuse: a push with no backup in sync was answered {resp:?}")
                };
                assert_eq!(*code, protocol::ErrorCode::NoBackup, "{message}");
                assert!(message.contains("no backup"), "{message}");
                assert!(metric_of(&c, 0, primary, "ps_pushes_refused_no_backup_total") >= 1.0);
            }
            _ => {
                assert!(matches!(resp, Response::Pushed { .. }), "degrade: {resp:?}");
                assert_eq!(
                    metric_of(&c, 0, primary, "ps_pushes_refused_no_backup_total"),
                    0.0
                );
            }
        }

        // The backup comes back and catches up: pushes are acknowledged with a copy again.
        c.restart_replica(0, backup).unwrap();
        wait_in_sync(&c, 0, backup).await;
        wait_metric(&c, primary, "ps_durability_degraded", 0.0).await;
        assert!(
            matches!(push_one(&c, primary).await, Response::Pushed { .. }),
            "{mode}: a push once the backup is back"
        );
        client.close().await;
        c.shutdown(Duration::from_secs(60)).unwrap();
    }
}

/// Issue 40: retried pushes were applied twice (a reply lost, a client closing with a push in flight, a
/// failover). Real servers, 1 shard x 2 replicas, `replicated` durability: a push sent twice under one id (as
/// a retry after a lost reply is) moves its row once and both copies get the same answer; the primary is
/// killed, a client fails over to the backup, and a third copy sent to the new primary is answered from the
/// answers the replication stream carried: the row still moved once. A push under a new id moves it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_retried_on_its_primary_or_after_a_failover_is_applied_once() {
    use protocol::wire::message::push::PushId;
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--durability", "replicated"].map(String::from);
    let mut c = LocalCluster::start_replicated(1, 2, dir.path(), &extra).unwrap();
    let primary = c.primary_of(0).expect("shard 0 has a primary");
    let backup = 1 - primary;
    let mut cfg = PsClientConfig::replicated(c.replicas.clone(), c.tls_dir.clone());
    cfg.retry_for = Duration::from_secs(60);
    let client = PsClient::connect(cfg).await.unwrap();
    client.register_tables(&[audit_table()]).await.unwrap();
    wait_in_sync(&c, 0, backup).await;
    let row = AuditRows::new(1, 1).unwrap().per_server[0][0];
    let value = |bits: Vec<u32>| f32::from_bits(bits[0]);

    let first = PushId {
        client: 0xfeed,
        seq: 1,
    };
    let answer = push_one_as(&c, primary, first).await;
    assert!(
        matches!(answer, Response::Pushed { rows: 1, .. }),
        "{answer:?}"
    );
    assert_eq!(
        push_one_as(&c, primary, first).await,
        answer,
        "the retry gets the first answer"
    );
    assert_eq!(
        value(rows_of(&c, 0, primary, &[row]).await),
        1.0,
        "one application"
    );
    assert!(metric_of(&c, 0, primary, "ps_push_retries_answered_total") >= 1.0);

    c.kill_replica(0, primary).unwrap();
    // The client finds the primary gone and promotes the backup.
    let mut ids = Vec::new();
    put_ids(&[row], &mut ids);
    let counts = vec![TableCount {
        table: audit_table().id,
        count: 1,
        dim: 1,
    }];
    client
        .pull(0, Encoding::F32, counts, Bytes::from(ids))
        .await
        .unwrap();
    assert_eq!(
        info(&c, 0, backup).await.map(|i| i.role.name()),
        Some("primary")
    );
    assert_eq!(
        push_one_as(&c, backup, first).await,
        answer,
        "the promoted backup answers the retry from the stream's answers"
    );
    assert_eq!(
        value(rows_of(&c, 0, backup, &[row]).await),
        1.0,
        "still one application"
    );
    let second = PushId {
        client: 0xfeed,
        seq: 2,
    };
    assert!(matches!(
        push_one_as(&c, backup, second).await,
        Response::Pushed { rows: 1, .. }
    ));
    assert_eq!(value(rows_of(&c, 0, backup, &[row]).await), 2.0);
    client.close().await;
    c.shutdown(Duration::from_secs(60)).unwrap();
}

/// Sends `signal` to replica `r` of shard 0.
fn signal(c: &LocalCluster, r: usize, signal: libc::c_int) {
    let pid = c.pids()[r];
    assert_ne!(pid, 0, "replica {r} is not running");
    // SAFETY: kill(2) with the pid of a child of this process.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, signal) }, 0);
}

/// A primary cut off long enough for the clients to promote its backup (frozen with SIGSTOP: to every other
/// process it is a partition) wakes up believing it is still the primary, its stream to the backup dropped as
/// unreachable. It must step down and catch up from the newer primary; and the newer primary, killed and
/// restarted later, must not follow it. Before, the stale primary stayed primary, the restarted replica joined
/// it, and its catch-up replaced the newer rows: every push the newer primary had acknowledged was lost
/// (`scripts/bench/chaos.sh --partition-faults`, BENCHMARKS.md "Network partitions").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_past_a_failover_steps_down_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = replicated_cluster(1, dir.path(), &[]);
    let Pushing {
        client,
        rows,
        acks,
        stop,
        task,
    } = start_pushing(&c, 1).await;
    acked_more(&acks, 30).await;
    let old = c.primary_of(0).expect("a primary");
    wait_in_sync(&c, 0, 1 - old).await;

    // Cut off: pushes go on through the promoted backup.
    signal(&c, old, libc::SIGSTOP);
    acked_more(&acks, 60).await;
    assert!(client.failovers() >= 1, "the client moved the shard");
    // Back: the stale primary hears of the newer epoch, steps down and catches up.
    signal(&c, old, libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let i = info(&c, 0, old).await;
        if i.is_some_and(|i| {
            i.in_sync && i.role == protocol::wire::message::replicate::Role::Backup
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cut-off primary never stepped down and caught up: {i:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    acked_more(&acks, 30).await;
    // The newer primary dies and comes back; pushes go on through the old one, now in sync.
    let newer = 1 - old;
    c.kill_replica(0, newer).unwrap();
    acked_more(&acks, 30).await;
    let role = c.restart_replica(0, newer).unwrap();
    assert_eq!(role.as_deref(), Some("backup"));
    wait_in_sync(&c, 0, newer).await;
    acked_more(&acks, 30).await;

    stop.store(true, Ordering::Release);
    task.await.unwrap();
    check(&c, &client, &rows, &acks).await;
    client.close().await;
    c.shutdown(Duration::from_secs(60)).unwrap();
}

/// Rows of `table` (`dim` weights) of `shard` as replica `r` holds them, pulled as f32 (f32 bits).
async fn table_rows_of(
    c: &LocalCluster,
    (shard, r): (usize, usize),
    (table, dim): (u32, usize),
    ids: &[u64],
) -> Vec<u32> {
    let mut sections = Vec::new();
    put_ids(ids, &mut sections);
    let counts = vec![TableCount {
        table,
        count: ids.len() as u32,
        dim: dim as u32,
    }];
    let req = protocol::wire::message::pull::request(1, Encoding::F32, counts);
    match raw_call(c, shard, r, &req, Bytes::from(sections)).await {
        Ok((Response::Pulled { .. }, rows)) => rows
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        other => panic!("pull of table {table} from replica {shard}/{r}: {other:?}"),
    }
}

/// bf16 and f16 rows and bf16 Adam moments (issue 43) through a failover: pushes applied one after another by one client, the primary
/// of shard 0 SIGKILLed halfway and later back as a backup. Every replica ends with the rows of the same pushes
/// applied without the fault (an in-process `embedding::Table` each), bit for bit: the backup held the primary's
/// rows exactly (half weights travel as f32 values they convert from exactly) and rounds the pushes after the
/// failover as the dead primary would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_precision_rows_through_a_failover_equal_the_run_without_it() {
    use embedding::{OptimizerConfig, RowPrecision, Table, TableConfig};
    let dir = tempfile::tempdir().unwrap();
    let mut c = replicated_cluster(2, dir.path(), &["--drain-timeout-secs", "5"]);
    let mut cfg = PsClientConfig::replicated(c.replicas.clone(), c.tls_dir.clone());
    cfg.retry_for = Duration::from_secs(60);
    let client = PsClient::connect(cfg).await.unwrap();
    let tables = [
        TableConfig {
            precision: RowPrecision::Bf16,
            optimizer: OptimizerConfig::RowAdagrad {
                lr: 0.05,
                eps: 1e-8,
                initial_accumulator: 0.0,
            },
            seed: 3,
            ..TableConfig::new(11, "half_bf16", 8)
        },
        TableConfig {
            precision: RowPrecision::F16,
            optimizer: OptimizerConfig::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            seed: 4,
            ..TableConfig::new(12, "half_f16", 5)
        },
        TableConfig {
            precision: RowPrecision::Bf16,
            state_precision: RowPrecision::Bf16,
            optimizer: OptimizerConfig::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            seed: 5,
            ..TableConfig::new(13, "half_state", 7)
        },
    ];
    client.register_tables(&tables).await.unwrap();
    let reference: Vec<Table> = tables
        .iter()
        .map(|t| Table::new(t.clone()).unwrap())
        .collect();
    let rows = AuditRows::new(2, 16).unwrap();
    let mut old = None;
    for step in 0..40usize {
        if step == 20 {
            let primary = c.primary_of(0).expect("shard 0 has a primary");
            c.kill_replica(0, primary).unwrap();
            old = Some(primary);
        }
        for (shard, ids) in rows.per_server.iter().enumerate() {
            for (t, table) in tables.iter().enumerate() {
                let grads: Vec<f32> = (0..ids.len() * table.dim)
                    .map(|i| (((i * 7 + step * 13 + t) % 19) as f32 - 9.0) * 0.021)
                    .collect();
                let mut payload = Vec::new();
                put_ids(ids, &mut payload);
                grads
                    .iter()
                    .for_each(|g| payload.extend_from_slice(&g.to_le_bytes()));
                let counts = vec![TableCount {
                    table: table.id,
                    count: ids.len() as u32,
                    dim: table.dim as u32,
                }];
                client
                    .push(shard, Encoding::F32, 1.0, counts, Bytes::from(payload))
                    .await
                    .expect("a push fails only after retry_for: no primary came back");
                reference[t].apply(ids, &grads).unwrap();
            }
        }
    }
    assert!(client.failovers() >= 1, "the client moved shard 0");
    let old = old.unwrap();
    assert_eq!(
        c.restart_replica(0, old).unwrap().as_deref(),
        Some("backup")
    );
    client.flush().await.unwrap();
    for (shard, ids) in rows.per_server.iter().enumerate() {
        for r in 0..2 {
            wait_in_sync(&c, shard, r).await;
        }
        for (t, table) in tables.iter().enumerate() {
            let mut want = vec![0f32; ids.len() * table.dim];
            reference[t].gather(ids, &mut want).unwrap();
            assert!(want.iter().all(|&w| table.precision.holds(w)));
            let want: Vec<u32> = want.iter().map(|w| w.to_bits()).collect();
            for r in 0..2 {
                let got = table_rows_of(&c, (shard, r), (table.id, table.dim), ids).await;
                assert!(
                    got == want,
                    "shard {shard} replica {r} table {}: rows differ from the run without the fault",
                    table.name
                );
            }
        }
    }
    client.close().await;
    c.shutdown(Duration::from_secs(60)).unwrap();
}
