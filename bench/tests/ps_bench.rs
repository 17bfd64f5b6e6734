//! `ps-bench` end to end: a local cluster of one real `ps-server` process, a short run, the JSON report.

use std::path::Path;
use std::process::Command;

fn run_json(args: &[&str], json: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_ps-bench"))
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run ps-bench");
    assert!(
        out.status.success(),
        "ps-bench {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(json).expect("read the JSON report")).expect("JSON")
}

fn check_keys(v: &serde_json::Value, transport: &str) {
    assert_eq!(v["transport"], transport);
    assert_eq!(v["codec"], "f16");
    for key in [
        "pull_rows_per_sec",
        "push_rows_per_sec",
        "pull_p50_ms",
        "pull_p99_ms",
        "pull_p999_ms",
        "push_p50_ms",
        "push_p99_ms",
        "wire_bytes_per_pulled_row",
        "wire_mb_per_sec",
    ] {
        assert!(v[key].is_number(), "{key} missing in {v}");
    }
    assert!(v["pull_rows_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["push_rows_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["config"]["tables"], 4);
}

const SMALL: &[&str] = &[
    "--seconds",
    "2",
    "--warmup-seconds",
    "0.2",
    "--tables",
    "4",
    "--ids-per-table",
    "256",
    "--concurrency",
    "2",
    "--pool-batches",
    "4",
    "--quiet",
];

#[test]
fn local_cluster_run_writes_a_json_report() {
    let exe = Path::new(env!("CARGO_BIN_EXE_ps-bench"));
    let server = exe.with_file_name("ps-server");
    if !server.is_file() {
        eprintln!(
            "skipped: {} is missing (build the workspace, e.g. `cargo build -p ps-server`, to run this test)",
            server.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("quic.json");
    let mut args = vec!["--local-cluster", "1"];
    args.extend_from_slice(SMALL);
    let v = run_json(&args, &json);
    check_keys(&v, "quic");
    // f16 dim 16: a pull moves 32 row bytes per row and a push 32, plus the delta-varint id sections (about 1.5
    // bytes per id each way, protocol::wire::ids) and frame headers; raw u64 ids would make it over 80.
    let per_row = v["wire_bytes_per_pulled_row"].as_f64().unwrap();
    assert!((64.0..76.0).contains(&per_row), "{per_row}");
}

#[test]
fn in_process_run_writes_a_json_report() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("inproc.json");
    let mut args = vec!["--in-process"];
    args.extend_from_slice(SMALL);
    let v = run_json(&args, &json);
    check_keys(&v, "in-process");
    assert_eq!(v["wire_bytes_per_pulled_row"], 0.0);
}

#[test]
fn no_target_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ps-bench"))
        .args(["--seconds", "1"])
        .output()
        .expect("run ps-bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--local-cluster"), "{err}");
}

#[test]
fn prefetch_and_populate_rows_against_a_local_cluster() {
    let exe = Path::new(env!("CARGO_BIN_EXE_ps-bench"));
    if !exe.with_file_name("ps-server").is_file() {
        eprintln!("skipped: ps-server is missing (build it, e.g. `cargo build -p ps-server`)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("prefetch.json");
    let mut args = vec!["--local-cluster", "1"];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(&[
        "--prefetch-distance",
        "2",
        "--populate-rows",
        "3000",
        "--vocab",
        "3000",
    ]);
    let v = run_json(&args, &json);
    check_keys(&v, "quic");
    assert!(v["prefetch_requests"].as_u64().unwrap() > 0, "{v}");
    // Local servers have no memory budget: every prefetched id is untiered, none read back or pinned.
    assert!(v["prefetch_untiered"].as_u64().unwrap() > 0, "{v}");
    for key in [
        "prefetch_resident",
        "prefetch_read_back",
        "prefetch_waited",
        "prefetch_absent",
        "prefetch_pinned",
    ] {
        assert_eq!(v[key], 0, "{key} in {v}");
    }
}

#[test]
fn in_process_refuses_prefetch() {
    let out = Command::new(env!("CARGO_BIN_EXE_ps-bench"))
        .args(["--in-process", "--prefetch-distance", "1", "--seconds", "1"])
        .output()
        .expect("run ps-bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--prefetch-distance needs servers"), "{err}");
}

#[test]
fn open_loop_never_starts_more_batches_than_its_schedule() {
    let exe = Path::new(env!("CARGO_BIN_EXE_ps-bench"));
    if !exe.with_file_name("ps-server").is_file() {
        eprintln!("skipped: ps-server is missing (build it, e.g. `cargo build -p ps-server`)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("open.json");
    // 10 batches/s over 2 measured seconds: batches scheduled in the window are at most 21, whatever the
    // machine's speed (a closed loop of such small batches completes hundreds per second).
    let mut args = vec!["--local-cluster", "1", "--rate", "10"];
    args.extend_from_slice(SMALL);
    let v = run_json(&args, &json);
    check_keys(&v, "quic");
    assert_eq!(v["config"]["rate"], 10.0);
    let batches = v["batches"].as_u64().unwrap();
    assert!((1..=21).contains(&batches), "{batches} batches in {v}");
}

#[test]
fn bad_rates_are_refused() {
    for (args, want) in [
        (
            &["--local-cluster", "1", "--rate=-1"][..],
            "--rate must be >= 0",
        ),
        (&["--local-cluster", "1", "--rate", "NaN"][..], "got NaN"),
        (
            &["--in-process", "--rate", "5"][..],
            "--rate (open loop) needs servers",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ps-bench"))
            .args(args)
            .output()
            .expect("run ps-bench");
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
