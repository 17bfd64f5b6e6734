//! End to end with real processes on loopback: two parameter servers, a trainer, generated Criteo data.

use std::time::Duration;

mod support;
use support::{generate, summary, trainer};

// The AUC bound: three runs of this configuration (60k training rows, batch 512, dense Adagrad lr 0.005,
// row-wise Adagrad lr 0.05 on the servers, two servers) reached test AUCs of 0.704, 0.708 and 0.711, with an
// oracle AUC of 0.824; chance is 0.5. The test pins its optimizer so that changing the defaults cannot move
// it. The bound sits 0.08 below the measurements so scheduling noise (async pushes) cannot fail it, and well
// above chance so a broken pull, push or gradient path does.
const AUC_BOUND: f64 = 0.62;

/// The configuration the AUC bound was measured with: two servers, batch 512, dense Adagrad lr 0.005,
/// row-wise Adagrad lr 0.05.
const BOUND_ARGS: &[&str] = &[
    "--servers",
    "2",
    "--batch-size",
    "512",
    "--dense-optimizer",
    "adagrad",
    "--lr",
    "0.005",
    "--emb-lr",
    "0.05",
];

#[test]
fn demo_with_given_files_trains_through_two_servers() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(60_000, 1, &train);
    let oracle = generate(10_000, 2, &test);
    // A progress line after every batch: with a longer interval, a machine that trains the 60k rows faster
    // than the interval would print none.
    let args = [BOUND_ARGS, &["--progress-secs", "0.000001"]].concat();
    let (s, stderr) = support::run_demo(dir.path(), &train, &test, &args);
    assert_eq!(s["samples"], 60_000);
    assert_eq!(s["test_samples"], 10_000);
    let auc = s["auc"].as_f64().unwrap();
    let oracle_auc = trainer::run::oracle_auc(&test, &oracle).unwrap().unwrap();
    eprintln!("test AUC {auc}, oracle AUC {oracle_auc}");
    assert!(
        auc > AUC_BOUND,
        "test AUC {auc} (oracle {oracle_auc}); output:\n{stderr}"
    );
    assert!(
        auc < oracle_auc + 0.01,
        "test AUC {auc} above the oracle's {oracle_auc}"
    );
    assert!(s["logloss"].as_f64().unwrap() < 0.60, "{s}");
    assert!(s["train_loss"].as_f64().unwrap().is_finite());
    assert!(stderr.contains("samples/s"), "no progress lines: {stderr}");
    assert!(s["oracle_auc"].is_null());
}

#[test]
fn demo_trains_with_bf16_dense_products_or_refuses_them_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(30_000, 1, &train);
    generate(5_000, 2, &test);
    let args = [BOUND_ARGS, &["--dense-precision", "bf16"]].concat();
    let demo = |env: (&str, &str), sub: &str| {
        trainer()
            .env(env.0, env.1)
            .arg("demo")
            .args(&args)
            .arg("--train")
            .arg(&train)
            .arg("--test")
            .arg(&test)
            .arg("--data-dir")
            .arg(dir.path().join(sub))
            .output()
            .unwrap()
    };
    // Without a bf16 kernel (or with bf16 disabled) bf16 is refused at start-up, naming the flag and the reason.
    let out = demo((model::DISABLE_BF16_ENV, "1"), "refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "bf16 without a bf16 kernel was accepted: {stderr}"
    );
    assert!(
        stderr.contains("--dense-precision")
            && stderr.contains("needs AMX-BF16")
            && stderr.contains("AVX512-BF16"),
        "unclear error: {stderr}"
    );
    let Some(kernel) = model::bf16_kernel() else {
        eprintln!("no bf16 kernel here: only the refusal was tested");
        return;
    };
    // With one: the products run in bf16 on the kernel the job line names, and the model learns as in f32
    // (the AUC bound of the f32 test).
    let (s, stderr) = support::run_demo(dir.path(), &train, &test, &args);
    assert!(
        stderr.contains(&format!("bf16 on {kernel} products")),
        "{stderr}"
    );
    let auc = s["auc"].as_f64().unwrap();
    assert!(auc > AUC_BOUND, "bf16 test AUC {auc}; output:\n{stderr}");
    if kernel == model::Bf16Kernel::Amx {
        // On an AMX machine the AVX512-BF16 kernel runs end to end too, when asked.
        let out = demo((model::AMX_DISABLE_ENV, "1"), "avx512");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("bf16 on AVX512-BF16 products"), "{stderr}");
    }
}

#[test]
fn train_by_hand_against_running_servers() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv.gz");
    let test = dir.path().join("test.tsv");
    generate(20_000, 3, &train);
    generate(5_000, 4, &test);
    // A second, plain file with a malformed line: skipped, counted, within the error budget.
    let extra = dir.path().join("extra.tsv");
    let good = std::fs::read_to_string(&test).unwrap();
    let mut lines: Vec<&str> = good.lines().take(2).collect();
    lines.insert(1, "1\t12\tnot-a-number");
    std::fs::write(&extra, lines.join("\n") + "\n").unwrap();
    let cluster = support::start_servers(
        2,
        &dir.path().join("run"),
        &["--flush-interval-secs".into(), "1".into()],
    );
    let ps: Vec<String> = cluster.quic.iter().map(|a| a.to_string()).collect();
    let json = dir.path().join("summary.json");
    let out = trainer()
        .args([
            "train",
            "--ps",
            &ps.join(","),
            "--batch-size",
            "1024",
            "--max-in-flight",
            "0",
        ])
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .arg("--train")
        .arg(&train)
        .arg(&extra)
        .arg("--test")
        .arg(&test)
        .arg("--summary-json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "trainer train failed: {stderr}");
    let s = summary(&json);
    assert_eq!(s["samples"], 20_002);
    assert_eq!(s["bad_lines"], 1);
    assert!(
        stderr.contains("extra.tsv:2:"),
        "bad line not reported with its line number: {stderr}"
    );
    assert!(s["auc"].as_f64().unwrap() > 0.55, "{s}");
    // Both servers hold rows and report them on /metrics.
    for m in &cluster.metrics {
        let body = http_get(*m, "/metrics");
        assert!(body.contains("ps_rows_pushed_total"), "{body}");
    }
    cluster.shutdown(Duration::from_secs(30)).unwrap();
}

#[test]
fn wrong_server_order_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    generate(100, 5, &train);
    let cluster = support::start_servers(2, &dir.path().join("run"), &[]);
    let ps = format!("{},{}", cluster.quic[1], cluster.quic[0]);
    let out = trainer()
        .args(["train", "--ps", &ps])
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .arg("--train")
        .arg(&train)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("server is shard 1 of 2, but it is listed at position 0"),
        "{stderr}"
    );
    cluster.shutdown(Duration::from_secs(30)).unwrap();
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn demo_with_two_trainer_processes_trains_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(40_000, 1, &train);
    generate(5_000, 2, &test);
    let (s, stderr) = support::run_demo(
        dir.path(),
        &train,
        &test,
        &[
            "--trainers",
            "2",
            "--batch-size",
            "512",
            "--eval-every",
            "20",
            "--max-in-flight",
            "1",
        ],
    );
    // Ranks read disjoint halves: every row once.
    assert_eq!(s["samples"], 40_000, "{s}");
    assert_eq!(s["trainers"], 2, "{s}");
    assert_eq!(s["test_samples"], 5_000, "{s}");
    // Rank 0 evaluated periodically (it trains ~40 steps of 512), then the demo evaluated the servers' model.
    let evals = s["evals"].as_array().unwrap();
    assert!(evals.len() >= 2, "{s}");
    assert!(stderr.contains("eval at step 20"), "{stderr}");
    // The hybrid dense mode (the default): rank 0 published the dense model to the servers, whose model the
    // demo evaluated; chance is 0.5 (how close two trainers come to one: e2e/tests/hybrid.rs).
    let auc = s["auc"].as_f64().unwrap();
    assert!(auc.is_finite() && auc > 0.55, "{s}\n{stderr}");
    assert!(
        stderr.contains("global batch 512, 256 per trainer"),
        "{stderr}"
    );
}
