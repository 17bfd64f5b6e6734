//! Streaming training (docs/serving.md, "Streaming training") with the real binaries: `trainer train
//! --follow` on a file appended to in pieces, ended by SIGTERM; `trainer train --train -` fed by a pipe;
//! and the flags a stream refuses. Deadlines are timeouts for a broken build, never a stand-in for a
//! condition: the tests wait for the trainer's own counters.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::{generate, summary, trainer};

/// Generous: a loaded 2-core machine builds, starts and trains far within it.
const DEADLINE: Duration = Duration::from_secs(300);

fn ps_list(cluster: &local_cluster::LocalCluster) -> String {
    let addrs: Vec<String> = cluster.quic.iter().map(|a| a.to_string()).collect();
    addrs.join(",")
}

/// `trainer train` on `cluster`, small batches, stderr to a channel of lines.
fn spawn_train(
    cluster: &local_cluster::LocalCluster,
    args: &[&str],
    stdin: Stdio,
) -> (Child, mpsc::Receiver<String>) {
    let mut child = trainer()
        .args(["train", "--ps", &ps_list(cluster)])
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .args(["--batch-size", "256", "--progress-secs", "0.001"])
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

/// Lines so far (kept in `seen`); the trainer's metrics address once it printed it.
fn metrics_addr(rx: &mpsc::Receiver<String>, seen: &mut Vec<String>) -> Option<SocketAddr> {
    seen.extend(rx.try_iter());
    seen.iter().find_map(|l| {
        let rest = l.strip_prefix("trainer metrics: http://")?;
        rest.strip_suffix("/metrics")?.parse().ok()
    })
}

/// `trainer_samples_total` from the trainer's /metrics (0 before the first batch).
fn samples_trained(addr: SocketAddr) -> u64 {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    let mut out = String::new();
    if write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").is_err()
        || s.read_to_string(&mut out).is_err()
    {
        return 0;
    }
    out.lines()
        .find_map(|l| l.strip_prefix("trainer_samples_total "))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

/// Waits until the trainer has trained `rows` rows (its counter, polled), failing with its output after the
/// deadline or if it exits.
fn wait_trained(child: &mut Child, rx: &mpsc::Receiver<String>, seen: &mut Vec<String>, rows: u64) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            seen.extend(rx.try_iter());
            panic!("trainer exited {status}: {}", seen.join("\n"));
        }
        if let Some(addr) = metrics_addr(rx, seen) {
            if samples_trained(addr) >= rows {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not {rows} rows trained: {}",
            seen.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20)); // polling interval, not a condition
    }
}

/// Waits for the trainer to exit; its status, then every stderr line.
fn wait_exit(
    mut child: Child,
    rx: mpsc::Receiver<String>,
    mut seen: Vec<String>,
) -> (ExitStatus, String) {
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("trainer did not exit: {}", seen.join("\n"));
        }
        seen.extend(rx.try_iter());
        std::thread::sleep(Duration::from_millis(20));
    };
    // The reader thread ends at the pipe's end.
    seen.extend(rx.iter());
    (status, seen.join("\n"))
}

/// The lines of a generated file.
fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| format!("{l}\n"))
        .collect()
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

#[test]
fn a_followed_file_is_trained_as_it_grows_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (all, test) = (dir.path().join("all.tsv"), dir.path().join("test.tsv"));
    generate(6000, 1, &all);
    generate(1000, 2, &test);
    let lines = lines_of(&all);
    let grow = dir.path().join("grow.tsv");
    std::fs::write(&grow, "").unwrap();
    let cluster = support::start_servers(2, &dir.path().join("run"), &[]);
    let (ckpt, json) = (dir.path().join("ckpt"), dir.path().join("summary.json"));
    let (mut child, rx) = spawn_train(
        &cluster,
        &[
            "--follow",
            "--train-data",
            grow.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--checkpoint-every",
            "7",
            "--summary-json",
            json.to_str().unwrap(),
        ],
        Stdio::null(),
    );
    let mut seen = Vec::new();
    // Three appends, the trainer catching up with each; the last one ends in half a line, completed later.
    append(&grow, &lines[..1500].concat());
    wait_trained(&mut child, &rx, &mut seen, 1500);
    append(&grow, &lines[1500..4000].concat());
    wait_trained(&mut child, &rx, &mut seen, 4000);
    let (head, tail) = lines[5999].split_at(40);
    append(&grow, &(lines[4000..5999].concat() + head));
    wait_trained(&mut child, &rx, &mut seen, 5999);
    append(&grow, tail);
    wait_trained(&mut child, &rx, &mut seen, 6000);

    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, stderr) = wait_exit(child, rx, seen);
    assert!(status.success(), "{status}: {stderr}");
    cluster.shutdown(Duration::from_secs(30)).unwrap();
    let s = summary(&json);
    assert_eq!(s["samples"], 6000, "{s}");
    assert_eq!(s["bad_lines"], 0, "half a line was parsed alone: {s}");
    let auc = s["progressive"]["auc"].as_f64().expect("progressive AUC");
    assert!(auc > 0.0 && auc < 1.0, "{s}");
    assert_eq!(s["progressive"]["rows"], 6000, "{s}");
    assert!(s["auc"].as_f64().is_some(), "evaluated at the end: {s}");
    assert!(stderr.contains("progressive AUC"), "{stderr}");
    assert!(stderr.contains("stopping:"), "{stderr}");
    // Periodic checkpoints while streaming, and the final one.
    assert!(stderr.contains("checkpoint at step 7:"), "{stderr}");
    let step = s["step"].as_u64().unwrap();
    assert!(
        stderr.contains(&format!("checkpoint at step {step}:")),
        "{stderr}"
    );
    assert!(trainer::checkpoint::file_path(&ckpt, 0).exists());
}

#[test]
fn standard_input_is_trained_until_it_closes() {
    let dir = tempfile::tempdir().unwrap();
    let all = dir.path().join("all.tsv");
    generate(3000, 3, &all);
    let lines = lines_of(&all);
    let cluster = support::start_servers(1, &dir.path().join("run"), &[]);
    let json = dir.path().join("summary.json");
    let (mut child, rx) = spawn_train(
        &cluster,
        &["--train", "-", "--summary-json", json.to_str().unwrap()],
        Stdio::piped(),
    );
    let mut stdin = child.stdin.take().unwrap();
    let mut seen = Vec::new();
    stdin.write_all(lines[..1000].concat().as_bytes()).unwrap();
    stdin.flush().unwrap();
    wait_trained(&mut child, &rx, &mut seen, 1000);
    // The last line without its newline: the end of the input completes it.
    let rest = lines[1000..].concat();
    stdin.write_all(rest.trim_end().as_bytes()).unwrap();
    drop(stdin);
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut out, &mut text).unwrap();
        text
    });
    let (status, stderr) = wait_exit(child, rx, seen);
    let stdout = stdout.join().unwrap();
    assert!(status.success(), "{status}: {stderr}");
    cluster.shutdown(Duration::from_secs(30)).unwrap();
    let s = summary(&json);
    assert_eq!(
        (s["samples"].as_u64(), s["bad_lines"].as_u64()),
        (Some(3000), Some(0)),
        "{s}"
    );
    assert!(stdout.contains("progressive AUC"), "{stdout}");
    assert!(s["progressive"]["auc"].as_f64().is_some(), "{s}");
}

#[test]
fn streams_refuse_flags_they_cannot_honor() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grow.tsv");
    std::fs::write(&file, "").unwrap();
    let f = file.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--train", f, "--follow", "--epochs", "2"],
            "--epochs 2 with --follow",
        ),
        (
            &["--train", "-", "--world", "2"],
            "--train - (standard input) feeds one trainer",
        ),
        (
            &["--train", f, f, "--follow"],
            "--follow follows one text file, got 2",
        ),
        (&["--train", "-", "--follow"], "--follow follows a file"),
        (
            &["--train", f, "--follow", "--world", "2"],
            "needs --dense-mode async",
        ),
    ];
    for (args, want) in cases {
        let out = trainer()
            .args(["train", "--ps", "127.0.0.1:1", "--tls-dir"])
            .arg(dir.path())
            .args(*args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
