//! Real processes on loopback: a checkpoint of 2 servers (through `PsClient::checkpoint`) restored onto 3
//! servers with `ps-server restore` serves every row bit for bit; refusals of the checkpoint request and of
//! the restore command.
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{http_get, sigterm_and_wait, table, Server};
use protocol::compression::codec;
use protocol::wire::layout::put_ids;
use protocol::{
    Encoding, ErrorCode, ProtocolError, PsClient, PsClientConfig, ShardMap, TableCount,
};

/// Starts `ps-server` as shard `index` of `num` on `data` (free ports, no periodic flush during the test).
fn start_shard(data: &Path, tls: &Path, index: u32, num: u32) -> Server {
    common::start_shard(data, tls, index, num, &["--flush-interval-secs", "3600"])
}

async fn connect(servers: &[Server], tls: &Path) -> PsClient {
    PsClient::connect(PsClientConfig::new(
        servers.iter().map(|s| s.quic).collect(),
        tls.to_owned(),
    ))
    .await
    .unwrap()
}

/// `ids` grouped by the server they route to, ascending (the wire wants ascending id sections).
fn by_server(c: &PsClient, ids: &[u64]) -> Vec<Vec<u64>> {
    let map = c.shard_map();
    let mut out = vec![Vec::new(); map.num_servers as usize];
    for &id in ids {
        out[map.server_of(id) as usize].push(id);
    }
    out.iter_mut().for_each(|v| v.sort_unstable());
    out
}

fn counts(n: usize) -> Vec<TableCount> {
    vec![TableCount {
        table: 3,
        count: n as u32,
        dim: 8,
    }]
}

/// Pushes a gradient row derived from each id and `round` to every server.
async fn push_all(c: &PsClient, ids: &[u64], round: u32) {
    for (server, ids) in by_server(c, ids).iter().enumerate() {
        let grads: Vec<f32> = ids
            .iter()
            .flat_map(|&id| {
                (0..8).map(move |k| ((id % 13) as f32 - 6.0 + k as f32) * 0.1 * (round + 1) as f32)
            })
            .collect();
        let mut payload = Vec::new();
        put_ids(ids, &mut payload);
        codec::encode(&grads, Encoding::F32, &mut payload);
        let (applied, _) = c
            .push(
                server,
                Encoding::F32,
                1.0,
                counts(ids.len()),
                payload.into(),
            )
            .await
            .unwrap();
        assert_eq!(applied, ids.len() as u64);
    }
}

/// Every row of `ids` as its 32 f32 bytes, pulled from the server that owns it.
async fn pull_all(c: &PsClient, ids: &[u64]) -> BTreeMap<u64, Vec<u8>> {
    let mut out = BTreeMap::new();
    for (server, ids) in by_server(c, ids).iter().enumerate() {
        let mut payload = Vec::new();
        put_ids(ids, &mut payload);
        let rows = c
            .pull(server, Encoding::F32, counts(ids.len()), payload.into())
            .await
            .unwrap();
        for (id, row) in ids.iter().zip(rows.chunks_exact(32)) {
            out.insert(*id, row.to_vec());
        }
    }
    out
}

fn restore_cmd(from: &Path, num: u32, index: u32, out: &Path) -> std::process::Output {
    restore_cmd_with(from, num, index, out, &[])
}

/// `ps-server restore` with `extra` arguments (e.g. `--tensors`).
fn restore_cmd_with(
    from: &Path,
    num: u32,
    index: u32,
    out: &Path,
    extra: &[&str],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .arg("restore")
        .args(extra)
        .arg("--from")
        .arg(from)
        .args([
            "--num-shards",
            &num.to_string(),
            "--shard-index",
            &index.to_string(),
        ])
        .arg("--data-dir")
        .arg(out)
        .output()
        .expect("run ps-server restore")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_of_two_servers_restores_onto_three() {
    let dir = tempfile::tempdir().unwrap();
    // The default checkpoint root: `checkpoints` beside the data directories.
    let (tls, snap) = (dir.path().join("tls"), dir.path().join("checkpoints/snap"));
    protocol::transport::tls::init_dev_certs(&tls, &[]).unwrap();
    let two: Vec<Server> = (0..2)
        .map(|i| start_shard(&dir.path().join(format!("data-{i}")), &tls, i, 2))
        .collect();
    let c = connect(&two, &tls).await;
    c.register_tables(&[table()]).await.unwrap();
    let ids: Vec<u64> = (0..600u64).map(|i| i * 1_000_003 + 7).collect();
    push_all(&c, &ids, 0).await;
    // Half the rows get a second update: the snapshot must hold their latest values (dirty, not yet flushed).
    push_all(&c, &ids[..300], 1).await;
    let want = pull_all(&c, &ids).await;

    let written = c.checkpoint(snap.to_str().unwrap(), 17).await.unwrap();
    assert_eq!(written.iter().map(|w| w.0).sum::<u64>(), 600, "{written:?}");
    assert!(written[1].1.ends_with("shard-1-of-2"), "{written:?}");
    checkpoint_refusals(&c, &snap).await;
    // The same rows as an export's snapshot: each shard also gets tables.safetensors.
    let tsnap = dir.path().join("checkpoints/tsnap");
    c.export_snapshot(tsnap.to_str().unwrap(), 17, None)
        .await
        .unwrap();
    for k in 0..2 {
        assert!(tsnap
            .join(format!("shard-{k}-of-2/tables.safetensors"))
            .is_file());
    }
    // Updates after the checkpoint are not in it.
    push_all(&c, &ids, 2).await;
    c.close().await;
    for s in two {
        sigterm_and_wait(s);
    }

    restore_onto_three(&snap, dir.path(), "new", &[]);
    let three: Vec<Server> = (0..3)
        .map(|i| start_shard(&dir.path().join(format!("new-{i}")), &tls, i, 3))
        .collect();
    let c = connect(&three, &tls).await;
    assert_eq!(c.known_tables(), &[table()], "table config restored");
    assert_eq!(c.shard_map(), ShardMap::new(3));
    let got = pull_all(&c, &ids).await;
    assert_eq!(got.len(), want.len());
    for (id, row) in &want {
        assert_eq!(
            &got[id], row,
            "id {id} differs after restore onto 3 servers"
        );
    }
    // Each restored server recovered exactly its own rows.
    let recovered: u64 = three.iter().map(rows_recovered).sum();
    assert_eq!(recovered, 600);
    c.close().await;
    for s in three {
        sigterm_and_wait(s);
    }

    // `restore --tensors` builds the same servers from the SafeTensors files alone.
    for k in 0..2 {
        std::fs::remove_dir_all(tsnap.join(format!("shard-{k}-of-2/rocksdb"))).unwrap();
    }
    restore_onto_three(&tsnap, dir.path(), "tnew", &["--tensors"]);
    let three: Vec<Server> = (0..3)
        .map(|i| start_shard(&dir.path().join(format!("tnew-{i}")), &tls, i, 3))
        .collect();
    let c = connect(&three, &tls).await;
    assert_eq!(
        c.known_tables(),
        &[table()],
        "table config from the files' metadata"
    );
    assert_eq!(
        pull_all(&c, &ids).await,
        want,
        "rows from the SafeTensors files"
    );
    c.close().await;
    for s in three {
        sigterm_and_wait(s);
    }

    restore_refusals(&snap, dir.path());
}

/// A checkpoint never overwrites a snapshot, and never lands outside the servers' checkpoint root (`snap`'s
/// parent); a relative name lands under it.
async fn checkpoint_refusals(c: &PsClient, snap: &Path) {
    let root = snap.parent().unwrap();
    // Snapshots are never overwritten.
    match c.checkpoint(snap.to_str().unwrap(), 18).await {
        Err(ProtocolError::Remote {
            code: ErrorCode::BadRequest,
            message,
            ..
        }) => assert!(
            message.contains("shard-0-of-2: already exists"),
            "{message}"
        ),
        other => panic!("second checkpoint into the same directory: {other:?}"),
    }
    // Never outside the root, nor up out of it.
    let outside = root.parent().unwrap().join("elsewhere");
    for dir in [outside.to_str().unwrap(), "../elsewhere", "/etc/ps"] {
        match c.checkpoint(dir, 18).await {
            Err(ProtocolError::Remote {
                code: ErrorCode::BadRequest,
                message,
                ..
            }) => assert!(message.contains("checkpoint root"), "{message}"),
            other => panic!("checkpoint into {dir}: {other:?}"),
        }
    }
    assert!(!outside.exists());
    // A relative name is a folder of the root.
    let written = c.checkpoint("job-2/snap", 19).await.unwrap();
    assert!(
        Path::new(&written[0].1).starts_with(root.join("job-2/snap")),
        "{written:?}"
    );
}

/// Restores the snapshot in `snap` onto 3 servers, into `dir/<prefix>-<i>`, with `extra` arguments.
fn restore_onto_three(snap: &Path, dir: &Path, prefix: &str, extra: &[&str]) {
    for i in 0..3 {
        let out = restore_cmd_with(snap, 3, i, &dir.join(format!("{prefix}-{i}")), extra);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "restore {i}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("from a snapshot of 2 servers (step 17)"),
            "{stdout}"
        );
    }
}

/// `ps_rows_recovered_total` of server `s`.
fn rows_recovered(s: &Server) -> u64 {
    let m = http_get(s.metrics, "/metrics");
    m.lines()
        .find_map(|l| l.strip_prefix("ps_rows_recovered_total "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no ps_rows_recovered_total in {m}"))
}

/// The restore command refuses an output directory that is not empty, and a directory that is not a snapshot.
fn restore_refusals(snap: &Path, dir: &Path) {
    let out = restore_cmd(snap, 3, 0, &dir.join("new-0"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("new-0: exists and is not empty; restore into a new directory"),
        "{stderr}"
    );
    let out = restore_cmd(&dir.join("tls"), 3, 0, &dir.join("new-9"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no shard-<k>-of-<n> directories, not a snapshot"),
        "{stderr}"
    );
}

#[test]
fn plan_prints_the_layout_numbers() {
    let out = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args([
            "plan",
            "--rows",
            "10M",
            "--dim",
            "16",
            "--optimizer",
            "row-adagrad",
            "--server-memory",
            "4GiB",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(
            "table: 10000000 rows, dim 16, RowAdagrad, f32 weights, f32 state: 17 values per row = 68 bytes of payload"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("servers needed: 1"), "{stdout}");
    let out = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["plan", "--rows", "0", "--dim", "16"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rows = 0: expected at least 1"));
}
