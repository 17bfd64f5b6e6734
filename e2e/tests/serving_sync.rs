//! Delta sync end to end with real processes: a `ps-serve` following two training servers sees what a later
//! training job changes (rows and a published dense version) until its predictions are that job's
//! evaluation; a SIGKILLed `ps-serve` restarts from the export and catches up from the export's sync points;
//! with the training servers gone it keeps answering from the last synced state.

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
