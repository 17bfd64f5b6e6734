//! Runs the real `gen-criteo` binary.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};

fn gen_criteo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gen-criteo"))
        .args(args)
        .output()
        .expect("run gen-criteo")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn gunzip(p: &Path) -> Vec<u8> {
    let file = std::fs::File::open(p).unwrap();
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut text)
        .unwrap();
    text
}

#[test]
fn writes_gzip_and_oracle_that_match_plain_output() {
    let dir = tempfile::tempdir().unwrap();
    let gz = dir.path().join("train.txt.gz");
    let plain = dir.path().join("train.txt");
    let oracle = dir.path().join("oracle.txt");
    let rows = 20_000;
    let common = ["--rows", "20000", "--seed", "11", "--teacher-seed", "12"];

    let out = gen_criteo(
        &[
            &common[..],
            &["--out", path(&gz), "--oracle", path(&oracle)],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("20000 rows")
            && stderr.contains("positive rate")
            && stderr.contains("rows/s"),
        "{stderr}"
    );

    let text = gunzip(&gz);
    let lines: Vec<&str> = std::str::from_utf8(&text).unwrap().lines().collect();
    assert_eq!(lines.len(), rows);
    assert!(lines.iter().all(|l| l.split('\t').count() == 40));
    let probs = std::fs::read_to_string(&oracle).unwrap();
    assert_eq!(probs.lines().count(), rows);
    assert!(probs
        .lines()
        .all(|l| l.parse::<f64>().is_ok_and(|p| p > 0.0 && p < 1.0)));

    let out = gen_criteo(&[&common[..], &["--out", path(&plain), "--threads", "1"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&plain).unwrap(), text);
}

#[test]
fn gzip_oracle_is_supported() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.txt");
    let oracle = dir.path().join("o.txt.gz");
    let args = [
        "--rows",
        "5000",
        "--seed",
        "1",
        "--teacher-seed",
        "2",
        "--out",
        path(&data),
        "--oracle",
        path(&oracle),
    ];
    let out = gen_criteo(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        gunzip(&oracle).iter().filter(|&&b| b == b'\n').count(),
        5000
    );
}

#[test]
fn unwritable_output_fails_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("no-such-dir").join("train.txt");
    let out = gen_criteo(&[
        "--rows",
        "10",
        "--seed",
        "1",
        "--teacher-seed",
        "2",
        "--out",
        path(&bad),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(path(&bad)), "{stderr}");
}

#[test]
fn missing_arguments_are_rejected() {
    let out = gen_criteo(&["--rows", "10"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seed"));
}

#[test]
fn multi_hot_flag_takes_mlperf_sizes_or_a_list() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let out_path = dir.path().join(name);
        let mut args = vec!["--rows", "50", "--seed", "1", "--teacher-seed", "2"];
        args.extend_from_slice(&["--out", path(&out_path)]);
        args.extend_from_slice(extra);
        let out = gen_criteo(&args);
        (out, std::fs::read_to_string(&out_path).unwrap_or_default())
    };
    let bag_len = |text: &str, column: usize| {
        let line = text.lines().next().unwrap();
        line.split('\t')
            .nth(13 + column)
            .unwrap()
            .split('|')
            .count()
    };
    let (out, mlperf) = run("mlperf.txt", &["--multi-hot"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(bag_len(&mlperf, 21), 100, "C21");
    assert_eq!(bag_len(&mlperf, 1), 3, "C1");
    let twos = vec!["2"; 26].join(",");
    let (out, text) = run("twos.txt", &["--multi-hot", &twos]);
    assert!(out.status.success());
    assert!((1..=26).all(|c| bag_len(&text, c) == 2));
    let (out, _) = run("bad.txt", &["--multi-hot", "1,2,3"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--multi-hot: 3 bag sizes, expected 26"),
        "{stderr}"
    );
}
