//! Delta sync end to end with real processes: a `ps-serve` following two training servers sees what a later
//! training job changes (rows and a published dense version) until its predictions are that job's
//! evaluation; a SIGKILLed `ps-serve` restarts from the export and catches up from the export's sync points;
//! with the training servers gone it keeps answering from the last synced state. Rows the training servers
//! delete (TTL expiry) are deleted from serving too, through deltas, after a restart of `ps-serve`, and
//! through a scan after a restart of the training servers.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{http, predict_lines, Serve};

/// Runs `trainer train` against `ps` with `args`; returns its summary.
fn train(dir: &Path, ps: &str, tls: &Path, name: &str, args: &[&str]) -> serde_json::Value {
    let json = dir.join(format!("{name}.json"));
    let out = support::trainer()
        .args(["train", "--ps", ps, "--batch-size", "512"])
        .arg("--tls-dir")
        .arg(tls)
        .arg("--summary-json")
        .arg(&json)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "trainer train ({name}) failed: {stderr}"
    );
    support::summary(&json)
}

/// The AUC of serving's answers on `lines`.
fn served_auc(serve: &Serve, lines: &[String]) -> f64 {
    let probs = predict_lines(serve.addr, lines, 500);
    let labels: Vec<bool> = lines.iter().map(|l| l.starts_with('1')).collect();
    support::auc(&probs, &labels).unwrap()
}

/// Polls serving's AUC until it is `want` (± 1e-6); panics with the last value after `limit`.
fn wait_for_auc(serve: &Serve, lines: &[String], want: f64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let got = served_auc(serve, lines);
        if (got - want).abs() < 1e-6 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "serving's AUC stayed {got}, the trainer's is {want}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn training_changes_reach_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second, test) = (
        dir.path().join("first.tsv"),
        dir.path().join("second.tsv"),
        dir.path().join("test.tsv"),
    );
    support::generate(6_000, 1, &first);
    support::generate(6_000, 3, &second);
    support::generate(2_000, 2, &test);
    let lines = support::read_lines(&test);
    let cluster = support::start_servers(
        2,
        &dir.path().join("run"),
        &["--sync-interval-secs".into(), "0.2".into()],
    );
    let ps: Vec<String> = cluster.quic.iter().map(|a| a.to_string()).collect();
    let ps = ps.join(",");
    let tls = cluster.tls_dir.clone();
    let export = dir.path().join("export");
    let export_s = export.to_str().unwrap().to_owned();

    // Job 1 trains and exports; serving loads the export and follows the servers.
    let s1 = train(
        dir.path(),
        &ps,
        &tls,
        "first",
        &[
            "--train",
            first.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--export-dir",
            &export_s,
        ],
    );
    let follow = |extra: &[&str]| {
        let mut args = vec![
            "--export",
            &export_s,
            "--subscribe",
            &ps,
            "--tls-dir",
            tls.to_str().unwrap(),
            "--sync-wait-ms",
            "1000",
        ];
        args.extend_from_slice(extra);
        Serve::start(&args)
    };
    let serve = follow(&[]);
    let exported = s1["auc"].as_f64().unwrap();
    assert!((served_auc(&serve, &lines) - exported).abs() < 1e-6);

    // Job 2 changes rows on the servers and publishes its dense parameters: serving converges to exactly
    // what job 2 evaluates at its end.
    let s2 = train(
        dir.path(),
        &ps,
        &tls,
        "second",
        &[
            "--train",
            second.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--publish-dense-every",
            "4",
        ],
    );
    let want = s2["auc"].as_f64().unwrap();
    assert!((want - exported).abs() > 1e-6, "job 2 changed nothing");
    wait_for_auc(&serve, &lines, want, Duration::from_secs(120));
    let (_, model) = http(serve.addr, "GET", "/v1/model", None, b"");
    let model: serde_json::Value = serde_json::from_str(&model).unwrap();
    assert_eq!(model["dense_step"], s2["step"], "{model}");
    assert!(model["deltas_applied"].as_u64().unwrap() > 0, "{model}");
    let (_, metrics) = http(serve.addr, "GET", "/metrics", None, b"");
    assert!(
        metrics.contains("serving_delta_freshness_seconds_bucket"),
        "{metrics}"
    );

    // SIGKILL: a new process loads the (older) export and catches up from its sync points.
    drop(serve);
    let serve = follow(&[]);
    wait_for_auc(&serve, &lines, want, Duration::from_secs(120));

    // The training servers go away: serving keeps answering from what it synced.
    cluster.shutdown(Duration::from_secs(30)).unwrap();
    assert!((served_auc(&serve, &lines) - want).abs() < 1e-6);
    let (status, _) = http(serve.addr, "GET", "/readyz", None, b"");
    assert_eq!(status, 200);
    assert!(serve.terminate().success());
}

/// Up to `n` (table config, id, exported weights) of each table of the export under `export`, read from its
/// shards' `tables.safetensors`.
fn exported_rows(export: &Path, n: usize) -> Vec<(embedding::TableConfig, u64, Vec<f32>)> {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.file_name().is_some_and(|f| f == "tables.safetensors") {
                out.push(p);
            }
        }
    }
    let mut found = Vec::new();
    files(export, &mut found);
    assert!(!found.is_empty(), "no tables.safetensors under {export:?}");
    let mut rows = Vec::new();
    for f in found {
        for t in embedding::snapshot::tensors::read_tables(&f).unwrap() {
            if t.config.id == protocol::wire::dense::DENSE_TABLE {
                continue;
            }
            let dim = t.config.dim;
            for (i, &id) in t.ids.iter().enumerate().take(n) {
                rows.push((
                    t.config.clone(),
                    id,
                    t.weights[i * dim..(i + 1) * dim].to_vec(),
                ));
            }
        }
    }
    rows
}

/// Registers table 777 (dim 2) on the servers of `cluster` and pushes one row to each server.
fn push_to_a_new_table(cluster: &local_cluster::LocalCluster) {
    use protocol::{Encoding, PsClient, PsClientConfig, ShardMap, TableCount};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = PsClientConfig::new(cluster.quic.clone(), cluster.tls_dir.clone());
        let client = PsClient::connect(cfg).await.unwrap();
        client
            .register_tables(&[embedding::TableConfig::counter(777, 2)])
            .await
            .unwrap();
        let map = ShardMap::new(2);
        for server in 0..2 {
            let id = (0u64..)
                .find(|&i| map.server_of(i) as usize == server)
                .unwrap();
            let mut payload = Vec::new();
            protocol::wire::layout::put_ids(&[id], &mut payload);
            protocol::compression::codec::encode(&[1.0, 1.0], Encoding::F32, &mut payload);
            let table = TableCount {
                table: 777,
                count: 1,
                dim: 2,
            };
            client
                .push(server, Encoding::F32, 1.0, vec![table], payload.into())
                .await
                .unwrap();
        }
    });
}

/// Serving's row of `id` in table `table` (`GET /v1/embedding`).
fn served_row(serve: &Serve, table: u32, id: u64) -> Vec<f32> {
    let (status, body) = http(
        serve.addr,
        "GET",
        &format!("/v1/embedding?table={table}&id={id}"),
        None,
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["row"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Polls until serving reads every row of `rows` as its initializer (deleted); panics after `limit` naming a
/// row still held.
fn wait_until_deleted(
    serve: &Serve,
    rows: &[(embedding::TableConfig, u64, Vec<f32>)],
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    loop {
        let held = rows.iter().find(|(cfg, id, _)| {
            let mut init = vec![0.0; cfg.dim];
            embedding::init::fill_weights(cfg, *id, &mut init);
            served_row(serve, cfg.id, *id) != init
        });
        let Some((cfg, id, _)) = held else { return };
        assert!(
            Instant::now() < deadline,
            "serving still holds row {id} of table {} after {limit:?}",
            cfg.id
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn rows_deleted_on_the_training_servers_are_deleted_from_serving_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (train_data, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    support::generate(4_000, 1, &train_data);
    support::generate(500, 2, &test);
    let run = dir.path().join("run");
    // Rows untouched for 10 s are deleted (a pass every 0.5 s); deltas are cut every 0.2 s.
    let flags: Vec<String> = [
        "--sync-interval-secs",
        "0.2",
        "--row-ttl-secs",
        "10",
        "--expire-interval-secs",
        "0.5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cluster = support::start_servers(2, &run, &flags);
    let ps = cluster.ps_arg();
    let tls = cluster.tls_dir.clone();
    let export = dir.path().join("export");
    let export_s = export.to_str().unwrap().to_owned();
    train(
        dir.path(),
        &ps,
        &tls,
        "job",
        &[
            "--train",
            train_data.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--export-dir",
            &export_s,
        ],
    );
    // Rows of the export: trained values, not their initializers.
    let rows = exported_rows(&export, 20);
    assert!(rows.len() >= 20, "{} rows exported", rows.len());
    for (cfg, id, w) in &rows {
        let mut init = vec![0.0; cfg.dim];
        embedding::init::fill_weights(cfg, *id, &mut init);
        assert_ne!(w, &init, "row {id} of table {} was not trained", cfg.id);
    }
    let follow_with = |ps: &str, tls: &Path, extra: &[&str]| {
        let mut args = vec![
            "--export",
            &export_s,
            "--subscribe",
            ps,
            "--tls-dir",
            tls.to_str().unwrap(),
            "--sync-wait-ms",
            "1000",
            "--enable-embedding-api",
        ];
        args.extend_from_slice(extra);
        Serve::start(&args)
    };
    let follow = |ps: &str, tls: &Path| follow_with(ps, tls, &[]);
    // No push touches them again: they expire on the servers, and the deltas delete them from serving. A
    // table registered after the export (so unknown to serving) gets rows meanwhile: serving skips them and
    // keeps following.
    let serve = follow(&ps, &tls);
    push_to_a_new_table(&cluster);
    wait_until_deleted(&serve, &rows, Duration::from_secs(120));
    let (_, metrics) = http(serve.addr, "GET", "/metrics", None, b"");
    let skipped = local_cluster::metric(&metrics, "serving_sync_rows_skipped_total").unwrap_or(0.0);
    assert!(skipped >= 1.0, "skipped {skipped}: {metrics}");
    let (_, metrics) = http(serve.addr, "GET", "/metrics", None, b"");
    let deleted = local_cluster::metric(&metrics, "serving_rows_deleted_total").unwrap_or(0.0);
    assert!(deleted >= rows.len() as f64, "deleted {deleted}: {metrics}");

    // A restarted ps-serve loads the export (the rows again) and replays the deltas after its sync points.
    drop(serve);
    let serve = follow(&ps, &tls);
    wait_until_deleted(&serve, &rows, Duration::from_secs(120));
    drop(serve);

    // Restarted training servers (another incarnation, the rows gone from their RocksDB): a restarted
    // ps-serve's cursors are of the old incarnation, so it scans, and deletes what the scan leaves out; the
    // same with rows held at a serving precision (a deleted row reads as its exact initializer there too).
    cluster.shutdown(Duration::from_secs(30)).unwrap();
    let cluster = support::start_servers(2, &run, &flags);
    let serve = follow(&cluster.ps_arg(), &cluster.tls_dir);
    wait_until_deleted(&serve, &rows, Duration::from_secs(120));
    drop(serve);
    let serve = follow_with(
        &cluster.ps_arg(),
        &cluster.tls_dir,
        &["--row-precision", "int8"],
    );
    wait_until_deleted(&serve, &rows, Duration::from_secs(120));
    assert!(serve.terminate().success());
    cluster.shutdown(Duration::from_secs(30)).unwrap();
}
