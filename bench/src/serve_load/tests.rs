//! The client loop and the AUC pass end to end against [`super::fake_server`].

use std::sync::atomic::Ordering;

use clap::Parser;

use super::fake_server::{self, prob_of_i1, Behaviour, DENSE_VERSION, VERSION};
use super::rows::LabelledRows;
use super::{run_rows, Report, ServeArgs, ServeConfig};

/// `n` labelled rows whose I1 runs over -20..20 (some missing), labels loosely following I1.
fn rows(n: usize) -> LabelledRows {
    let mut text = String::new();
    for i in 0..n {
        let i1 = (i as i64 * 7) % 41 - 20;
        let label = u8::from((i1 + (i as i64 % 5) * 4 - 8) > 0);
        let i1 = if i % 11 == 0 {
            String::new()
        } else {
            i1.to_string()
        };
        text += &format!("{label}\t{i1}\t3\t\t{}\tab12cd34\t01|02\n", i % 3);
    }
    LabelledRows::parse(text.as_bytes(), "test", None).unwrap()
}

fn config(url: &str, extra: &[&str]) -> ServeConfig {
    let mut argv = vec!["serve-bench", "--data", "unused.tsv", "--url", url];
    argv.extend_from_slice(extra);
    ServeArgs::try_parse_from(argv).unwrap().validate().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_run_counts_requests_on_keep_alive_connections() {
    let (addr, seen) = fake_server::start(Behaviour::Correct).await;
    let url = format!("http://{addr}");
    for format in ["tsv", "json"] {
        let before = seen.connections.load(Ordering::Relaxed);
        let cfg = config(
            &url,
            &[
                "--requests",
                "50",
                "--warmup",
                "0",
                "--concurrency",
                "3",
                "--rows-per-request",
                "4",
                "--format",
                format,
            ],
        );
        let Report::Load(r) = run_rows(&cfg, rows(30)).await.unwrap() else {
            panic!("not a load report");
        };
        assert_eq!(r.requests, 50, "{format}");
        // 30 rows in 4-row requests: 7 of 4 rows and one of 2, cycled.
        let expected_rows: u64 = (0..50).map(|i| if i % 8 == 7 { 2 } else { 4 }).sum();
        assert_eq!(r.rows, expected_rows);
        assert_eq!(r.errors, 0);
        assert_eq!(
            (r.version, r.dense_version),
            (Some(VERSION), Some(DENSE_VERSION))
        );
        assert!(
            r.p50_ms > 0.0 && r.p50_ms <= r.p90_ms && r.p90_ms <= r.p99_ms && r.p99_ms <= r.max_ms
        );
        assert_eq!(
            seen.connections.load(Ordering::Relaxed) - before,
            3,
            "one connection per client"
        );
        let line = r.line();
        assert!(line.starts_with("serve-bench load url=http://"), "{line}");
        assert!(
            line.contains(&format!(
                " format={format} rows_per_request=4 concurrency=3 "
            )),
            "{line}"
        );
        assert!(
            line.contains(" requests=50 ") && line.contains(" errors=0 errors_by_status=none "),
            "{line}"
        );
        assert!(line.ends_with(" version=1234 dense_version=7"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_run_after_warmup() {
    let (addr, _) = fake_server::start(Behaviour::Correct).await;
    let cfg = config(
        &format!("http://{addr}"),
        &["--duration", "0.3", "--warmup", "0.1"],
    );
    let Report::Load(r) = run_rows(&cfg, rows(100)).await.unwrap() else {
        panic!("not a load report");
    };
    assert_eq!(r.seconds, 0.3);
    assert!(r.requests > 0 && r.rows > 0, "{}", r.line());
    assert!((r.rows_per_sec - r.rows as f64 / 0.3).abs() < 1e-6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auc_pass_scores_every_row_once() {
    let (addr, seen) = fake_server::start(Behaviour::Correct).await;
    let data = rows(500);
    let probs: Vec<f32> = data
        .features
        .iter()
        .map(|f| prob_of_i1(f.split('\t').next().unwrap().parse().ok()))
        .collect();
    let want_auc = model::eval::auc(&probs, &data.labels).unwrap();
    let want_ll = model::eval::logloss(&probs, &data.labels);
    for format in ["tsv", "json"] {
        let before = seen.requests.load(Ordering::Relaxed);
        let cfg = config(
            &format!("http://{addr}"),
            &[
                "--auc",
                "--concurrency",
                "3",
                "--rows-per-request",
                "7",
                "--format",
                format,
            ],
        );
        let Report::Auc(r) = run_rows(&cfg, data.clone()).await.unwrap() else {
            panic!("not an AUC report");
        };
        assert_eq!(r.rows, 500);
        assert_eq!(r.requests, 72); // ceil(500 / 7)
        assert_eq!(
            seen.requests.load(Ordering::Relaxed) - before,
            72,
            "each request once"
        );
        assert_eq!(
            r.auc,
            Some(want_auc),
            "{format}: answers put back in row order"
        );
        assert!((r.logloss - want_ll).abs() < 1e-12);
        assert_eq!(
            (r.version, r.min_version, r.dense_version),
            (VERSION, VERSION, DENSE_VERSION)
        );
        let line = r.line();
        assert!(line.contains(&format!(" auc={want_auc:.6} ")), "{line}");
        assert!(line.ends_with(" version=1234 dense_version=7"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_answers_are_named() {
    let cases = [
        (Behaviour::NotReady, "HTTP 503: not ready: no export loaded"),
        (Behaviour::Garbage, "malformed answer: expected value"),
        (Behaviour::Short, "3 probabilities for 4 rows"),
    ];
    for (behaviour, msg) in cases {
        let (addr, _) = fake_server::start(behaviour).await;
        let url = format!("http://{addr}");
        let auc = config(&url, &["--auc", "--rows-per-request", "4"]);
        let err = format!("{:#}", run_rows(&auc, rows(8)).await.unwrap_err());
        assert!(err.contains(msg), "{behaviour:?}: {err}");
        assert!(err.starts_with("request "), "{err}");
        let load = config(
            &url,
            &[
                "--requests",
                "5",
                "--warmup",
                "0",
                "--rows-per-request",
                "4",
            ],
        );
        let err = format!("{:#}", run_rows(&load, rows(8)).await.unwrap_err());
        assert!(err.starts_with("no request succeeded (5 failed: "), "{err}");
        assert!(err.contains(msg), "{behaviour:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_url_fails_at_once() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    for extra in [&["--auc"][..], &["--requests", "1"][..]] {
        let err = format!(
            "{:#}",
            run_rows(&config(&url, extra), rows(4)).await.unwrap_err()
        );
        assert!(
            err.starts_with(&format!("cannot connect to {url}: ")),
            "{err}"
        );
    }
}
