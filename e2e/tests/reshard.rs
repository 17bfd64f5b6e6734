//! Live resharding with real server processes on loopback (`ps-server reshard`, docs/replication.md):
//! a synchronous (k = 0) training run whose cluster grows from 2 to 3 servers during its first pass and
//! shrinks back to 2 during its second ends with every embedding row (weights and optimizer state), the
//! dense parameters and the test predictions bit-identical to an undisturbed run's. Also: the command refuses
//! plans that would renumber servers, naming the server, and finishes or aborts a reshard whose coordinator
//! died.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod support;
use support::generate;

use bytes::Bytes;
use local_cluster::LocalCluster;
use model::eval::EvalReport;
use protocol::wire::ids::IdCoding;
use protocol::wire::message::pull::IdSections;
use protocol::wire::message::reshard::{MapInfo, ReshardStep};
use protocol::wire::message::sync::SyncCursor;
use protocol::{Encoding, PsClient, PsClientConfig, Request, Response, ShardMap};
use trainer::config::ModelArgs;
use trainer::criteo::ReaderConfig;
use trainer::train::{PassOptions, Trainer};

fn model_args() -> ModelArgs {
    ModelArgs {
        batch_size: 256,
        bottom_mlp: vec![32, 16],
        top_mlp: vec![32, 1],
        max_in_flight: Some(0),
        eval_batch_size: 1000,
        // f16 pushes with error feedback: the residuals are keyed by id, so re-routed pushes keep them.
        error_feedback: trainer::config::FeedbackMode::On,
        ..ModelArgs::default()
    }
}

/// A client of `servers` presenting the certificate of `role` (the trainer's; an admin's reads every row
/// with the delta sync's scan).
async fn connect(servers: &[SocketAddr], tls_dir: &Path, role: protocol::Role) -> Arc<PsClient> {
    let mut cfg = PsClientConfig::new(servers.to_vec(), tls_dir.to_owned());
    cfg.role = role;
    Arc::new(PsClient::connect(cfg).await.unwrap())
}

fn list(servers: &[SocketAddr]) -> String {
    servers
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs `ps-server reshard --ps from --to to` to the end; returns its stdout.
fn reshard(from: &[SocketAddr], to: &[SocketAddr], tls_dir: &Path) -> String {
    let out = bench::bins::command("ps-server")
        .args([
            "reshard",
            "--ps",
            &list(from),
            "--to",
            &list(to),
            "--tls-dir",
        ])
        .arg(tls_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ps-server reshard failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Every row of every server of `client`'s map: (table, id) -> bits of the weights then the optimizer
/// state. Ids come from each server's full sync scan; rows and state from a pull with state through the
/// client.
async fn rows(client: &PsClient) -> BTreeMap<(u32, u64), Vec<u32>> {
    let mut out = BTreeMap::new();
    for server in 0..client.num_servers() {
        let mut cursor = SyncCursor::START;
        loop {
            let batch = client
                .sync_deltas(server, cursor, Encoding::F32, 100_000, 0, 0)
                .await
                .unwrap();
            for t in &batch.tables {
                let mut s = IdSections::new();
                s.table(t.table, t.dim, IdCoding::Plain, &t.ids);
                let pulled = client
                    .pull_with_state(
                        server,
                        Encoding::F32,
                        s.counts.clone(),
                        Bytes::from(s.payload),
                    )
                    .await
                    .unwrap();
                let dim = t.dim as usize;
                let state_len = pulled.state_lens[0] as usize;
                for (i, &id) in t.ids.iter().enumerate() {
                    let w = &pulled.rows[i * dim * 4..(i + 1) * dim * 4];
                    let st = &pulled.state[i * state_len * 4..(i + 1) * state_len * 4];
                    let bits = w
                        .chunks_exact(4)
                        .chain(st.chunks_exact(4))
                        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                        .collect();
                    assert!(
                        out.insert((t.table, id), bits).is_none(),
                        "row {id} of table {} on two servers",
                        t.table
                    );
                }
            }
            cursor = batch.header.cursor;
            if batch.header.complete {
                break;
            }
        }
    }
    out
}

struct Outcome {
    rows: BTreeMap<(u32, u64), Vec<u32>>,
    params: Vec<Vec<f32>>,
    eval: EvalReport,
    map_changes: u64,
}

/// Two passes over `train` on `cluster` (its first two servers), each beside `during[pass]` (run on a
/// blocking thread), then an evaluation on `test` and every row.
async fn run(
    cluster: &LocalCluster,
    train: &Path,
    test: &Path,
    during: Vec<Box<dyn FnOnce() + Send>>,
    args: ModelArgs,
) -> Outcome {
    let client = connect(
        &cluster.quic[..2],
        &cluster.tls_dir,
        protocol::Role::Trainer,
    )
    .await;
    let mut t = Trainer::new(client.clone(), args.clone()).await.unwrap();
    for (epoch, side) in during.into_iter().enumerate() {
        t.begin_epoch(epoch as u64);
        let side = tokio::task::spawn_blocking(side);
        t.train_pass(
            ReaderConfig::new([train], args.batch_size),
            &PassOptions::default(),
            |_| {},
        )
        .await
        .unwrap();
        side.await.unwrap();
    }
    let eval = t.evaluate(ReaderConfig::new([test], 1000)).await.unwrap();
    let params = t.model().params().iter().map(|p| p.to_vec()).collect();
    let reader = connect(&cluster.quic[..2], &cluster.tls_dir, protocol::Role::Admin).await;
    let rows = rows(&reader).await;
    reader.close().await;
    let map_changes = client.map_changes();
    client.close().await;
    Outcome {
        rows,
        params,
        eval,
        map_changes,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_and_shrinking_mid_training_is_bit_identical_to_an_undisturbed_run() {
    grow_and_shrink_matches_undisturbed(model_args()).await;
}

/// The same with bf16 and f16 rows (issue 43; tables alternate): rows move between servers as f32 values their
/// precision holds exactly, and the delta sync that reads them back sees the same bits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_half_precision_rows_is_bit_identical_to_an_undisturbed_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = ModelArgs::default();
    let base = model_args();
    let spec = support::half_precision_spec(dir.path(), &base.bottom_mlp, &base.top_mlp);
    let rows = grow_and_shrink_matches_undisturbed(ModelArgs {
        model_spec: Some(spec),
        bottom_mlp: d.bottom_mlp,
        top_mlp: d.top_mlp,
        ..base
    })
    .await;
    // The servers stored the spec's precisions: table k (C<k+1>) bf16 for even k, f16 for odd.
    for ((table, id), bits) in &rows {
        let p = if table % 2 == 0 {
            protocol::RowPrecision::Bf16
        } else {
            protocol::RowPrecision::F16
        };
        assert!(
            bits[..16].iter().all(|&b| p.holds(f32::from_bits(b))),
            "table {table} id {id}: weights not {p}"
        );
    }
}

/// Two passes with a 2 -> 3 reshard during the first and 3 -> 2 during the second, against two undisturbed
/// passes: same rows (every one, with its optimizer state), dense parameters and predictions, bit for bit.
async fn grow_and_shrink_matches_undisturbed(args: ModelArgs) -> BTreeMap<(u32, u64), Vec<u32>> {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(256 * 160, 31, &train);
    generate(2000, 32, &test);

    let a = support::start_servers(2, &dir.path().join("a"), &[]);
    let nothing = || -> Box<dyn FnOnce() + Send> { Box::new(|| {}) };
    let undisturbed = run(&a, &train, &test, vec![nothing(), nothing()], args.clone()).await;
    a.shutdown(Duration::from_secs(30)).unwrap();
    assert!(
        undisturbed.rows.len() > 1000,
        "{} rows",
        undisturbed.rows.len()
    );

    let mut b = support::start_servers(2, &dir.path().join("b"), &[]);
    b.add_standby(&[]).unwrap();
    let (two, three): (Vec<SocketAddr>, Vec<SocketAddr>) = (b.quic[..2].to_vec(), b.quic.clone());
    let tls: PathBuf = b.tls_dir.clone();
    let (grow_out, shrink_out) = (
        Arc::new(std::sync::Mutex::new(String::new())),
        Arc::new(std::sync::Mutex::new(String::new())),
    );
    let grow: Box<dyn FnOnce() + Send> = {
        let (two, three, tls, out) = (two.clone(), three.clone(), tls.clone(), grow_out.clone());
        Box::new(move || *out.lock().unwrap() = reshard(&two, &three, &tls))
    };
    let shrink: Box<dyn FnOnce() + Send> = {
        let (two, three, tls, out) = (two.clone(), three.clone(), tls.clone(), shrink_out.clone());
        Box::new(move || *out.lock().unwrap() = reshard(&three, &two, &tls))
    };
    let resharded = run(&b, &train, &test, vec![grow, shrink], args).await;
    // A client connecting afterwards takes the map changed live (its owner table), whether it lists the
    // servers of the map or the three that took part.
    for given in [&two, &three] {
        let fresh = connect(given, &tls, protocol::Role::Admin).await;
        assert_eq!((fresh.shard_map().epoch, fresh.num_servers()), (3, 2));
        assert!(
            rows(&fresh).await == resharded.rows,
            "rows read by a new client"
        );
        fresh.close().await;
    }
    b.shutdown(Duration::from_secs(30)).unwrap();

    let grow_out = grow_out.lock().unwrap().clone();
    let shrink_out = shrink_out.lock().unwrap().clone();
    eprintln!("{grow_out}{shrink_out}");
    assert!(
        grow_out.contains("resharded 2 -> 3 servers: epoch 1 -> 2"),
        "{grow_out}"
    );
    assert!(
        shrink_out.contains("resharded 3 -> 2 servers: epoch 2 -> 3"),
        "{shrink_out}"
    );
    // The second pass followed the grown map, the evaluation the shrunk one.
    assert!(
        resharded.map_changes >= 2,
        "{} map changes",
        resharded.map_changes
    );

    assert_eq!(resharded.rows.len(), undisturbed.rows.len(), "row count");
    let differ = resharded
        .rows
        .iter()
        .filter(|(k, v)| undisturbed.rows.get(k) != Some(v))
        .count();
    assert_eq!(differ, 0, "rows differing from the undisturbed run");
    assert!(
        resharded.params == undisturbed.params,
        "dense parameters differ"
    );
    assert_eq!(
        resharded.eval.logloss.to_bits(),
        undisturbed.eval.logloss.to_bits()
    );
    undisturbed.rows
}

#[test]
fn the_command_refuses_a_plan_that_renumbers_servers() {
    let out = bench::bins::command("ps-server")
        .args([
            "reshard",
            "--ps",
            "127.0.0.1:7000,127.0.0.1:7001",
            "--to",
            "127.0.0.1:7001,127.0.0.1:7000,127.0.0.1:7002",
            "--tls-dir",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server 0 is 127.0.0.1:7000 in --ps but 127.0.0.1:7001 in --to"),
        "{err}"
    );
}

/// Sends one reshard request to server `i` alone, on a fresh connection.
async fn raw(c: &LocalCluster, i: usize, req: Request) -> Response {
    use protocol::transport::{Connection, Dialer};
    let addr = c.quic[i];
    let dialer = protocol::Transport::Quic
        .dialer(addr, &c.tls_dir, protocol::Role::Admin)
        .unwrap();
    let conn = dialer
        .connect(
            addr,
            protocol::transport::tls::DEFAULT_SERVER_NAME,
            64 << 20,
        )
        .await
        .unwrap();
    let (resp, _) = conn.call(addr, &req, &Bytes::new()).await.unwrap();
    conn.close();
    dialer.wait_idle().await;
    resp
}

fn epoch_of(resp: &Response) -> u64 {
    match resp {
        Response::Resharding { status } => status.epoch,
        other => panic!("expected a reshard status, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_reshard_is_aborted_or_finished_by_the_next_command() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = support::start_servers(2, &dir.path().join("c"), &[]);
    c.add_standby(&[]).unwrap();
    let (two, three) = (c.quic[..2].to_vec(), c.quic.clone());
    let names = |v: &[SocketAddr]| v.iter().map(SocketAddr::to_string).collect::<Vec<_>>();
    let prepare = |map: &ShardMap, servers: &[SocketAddr]| Request::Reshard {
        step: ReshardStep::Prepare {
            target: MapInfo::of(map, names(servers)),
        },
    };
    // A coordinator died after preparing the standby and one source: nothing switched, so the next
    // command aborts it, then does its own reshard.
    let grown = ShardMap::new(2).resized(3).unwrap();
    for i in [2, 0] {
        epoch_of(&raw(&c, i, prepare(&grown, &three)).await);
    }
    let out = reshard(&two, &three, &c.tls_dir);
    assert!(
        out.contains("aborting an interrupted reshard prepared on servers [0, 2]"),
        "{out}"
    );
    assert!(
        out.contains("resharded 2 -> 3 servers: epoch 1 -> 2"),
        "{out}"
    );
    // A coordinator died after the source of a shrink committed: the next command finishes the commits
    // (then refuses its own plan, which no longer matches the cluster).
    let shrunk = grown.resized(2).unwrap();
    for i in [0, 1, 2] {
        epoch_of(&raw(&c, i, prepare(&shrunk, &two)).await);
    }
    let commit = Request::Reshard {
        step: ReshardStep::Commit { epoch: 3 },
    };
    assert_eq!(epoch_of(&raw(&c, 2, commit).await), 3);
    let failed = bench::bins::command("ps-server")
        .args([
            "reshard",
            "--ps",
            &list(&three),
            "--to",
            &list(&two),
            "--tls-dir",
        ])
        .arg(&c.tls_dir)
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&failed.stdout),
        String::from_utf8_lossy(&failed.stderr),
    );
    assert!(
        out.contains("finishing an interrupted reshard to map epoch 3"),
        "{out}"
    );
    assert!(!failed.status.success());
    assert!(err.contains("has 2 servers, --ps lists 3"), "{err}");
    for i in 0..3 {
        let status = Request::Reshard {
            step: ReshardStep::Status,
        };
        assert_eq!(epoch_of(&raw(&c, i, status).await), 3, "server {i}");
    }
    c.shutdown(Duration::from_secs(30)).unwrap();
}
