//! Crash recovery with real processes on loopback (issue 7): two parameter servers (`trainer ps-server`, the
//! same code as the `ps-server` binary), a `trainer train` job, and an auditor (`bench::audit`, in this
//! process) that pushes `+1` increments to counter rows on both servers and logs every acknowledged push.
//! Mid-training, server 0 is killed with SIGKILL and restarted on the same port and data directory. Then:
//!
//! - the trainer reconnects (backoff and retries in `PsClient`) and the job completes: exit 0, a test AUC;
//! - the auditor reconnects too (pushes to server 0 are acknowledged after the restart);
//! - `sync` durability: no acknowledged increment is lost (`lost_acked == 0`);
//! - `periodic` durability with flush interval `I`: server 1 (not killed) loses nothing, and every counter of
//!   server 0 loses at most the increments acknowledged to it from `I + 1 s` before the SIGKILL was sent until
//!   the kill was confirmed (the last write-back started at most `I` before the kill; the extra second covers
//!   the write-back's own duration and the time between an acknowledgement and its log record, which is taken
//!   after the acknowledgement arrives).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

mod support;
use support::generate;

use bench::audit::{self, pusher::now_ms, AckLog, AuditRows, LogHeader, PushConfig};
use protocol::{PsClient, PsClientConfig};

/// A child process, killed on drop so a failing test leaves nothing behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts server `index` of 2 on `listen` with `data` and `flags`; returns it and its QUIC address once ready.
fn start_server(dir: &Path, index: usize, listen: &str, flags: &[&str]) -> (Proc, SocketAddr) {
    let log = File::options()
        .create(true)
        .append(true)
        .open(dir.join(format!("ps-{index}.log")))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .arg("ps-server")
        .args(["--listen", listen, "--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.join(format!("ps-{index}")))
        .arg("--tls-dir")
        .arg(dir.join("tls"))
        .args(["--shard-index", &index.to_string(), "--num-shards", "2"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("ps-server ready line");
    let quic = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("quic="))
        .unwrap_or_else(|| panic!("no quic= in {line:?}"))
        .parse()
        .unwrap();
    (proc, quic)
}

/// SIGKILL and reap.
fn sigkill(mut p: Proc) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(p.0.id() as i32, libc::SIGKILL) };
    p.0.wait().unwrap();
}

struct Outcome {
    rows: AuditRows,
    acks: Vec<audit::Ack>,
    verdict: audit::Verdict,
    /// Unix ms just before the SIGKILL was sent, and once it was reaped.
    kill_window: (u64, u64),
}

/// Runs the scenario with server `flags`; returns the audit and the kill window. Asserts that the trainer
/// completes with a test AUC and that the auditor reached the restarted server.
fn train_kill_restart(flags: &[&str]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    generate(24_000, 11, &train);
    generate(4_000, 12, &test);
    protocol::tls::init_dev_certs(&dir.path().join("tls"), &[]).unwrap();
    let (s0, a0) = start_server(dir.path(), 0, "127.0.0.1:0", flags);
    let (s1, a1) = start_server(dir.path(), 1, "127.0.0.1:0", flags);

    // The auditor, in this process.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = Arc::new(
        rt.block_on(PsClient::connect(PsClientConfig::new(
            vec![a0, a1],
            dir.path().join("tls"),
        )))
        .unwrap(),
    );
    rt.block_on(client.register_tables(&[audit::audit_table()]))
        .unwrap();
    let rows = AuditRows::new(2, 16).unwrap();
    let log_path = dir.path().join("acks.log");
    let header = LogHeader {
        servers: 2,
        rows_per_server: 16,
    };
    let log = Arc::new(AckLog::open(&log_path, header).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let pushing = rt.spawn(audit::pusher::run(
        client.clone(),
        Arc::new(rows.clone()),
        log,
        PushConfig {
            pause: Duration::from_millis(5),
            seed: 3,
        },
        stop.clone(),
    ));

    let json = dir.path().join("summary.json");
    let ps = format!("{a0},{a1}");
    let mut trainer = Command::new(env!("CARGO_BIN_EXE_trainer"));
    trainer
        .args(["train", "--ps", &ps, "--batch-size", "256"])
        .args(["--bottom-mlp", "64,16", "--top-mlp", "64,1"])
        .args(["--progress-secs", "0.3"])
        .arg("--tls-dir")
        .arg(dir.path().join("tls"))
        .arg("--train")
        .arg(&train)
        .arg("--test")
        .arg(&test)
        .arg("--summary-json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut trainer = Proc(trainer.spawn().unwrap());
    let stderr = trainer.0.stderr.take().unwrap();
    let (tx, progress) = mpsc::channel();
    let collector = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("samples/s") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // Training is under way (a progress line) before the kill.
    progress
        .recv_timeout(Duration::from_secs(60))
        .expect("no progress line from the trainer");
    assert!(
        trainer.0.try_wait().unwrap().is_none(),
        "the trainer finished before the kill"
    );
    let before = now_ms();
    sigkill(s0);
    let after = now_ms();
    let (s0, again) = start_server(dir.path(), 0, &a0.to_string(), flags);
    assert_eq!(again, a0);

    let status = trainer.0.wait().unwrap();
    let output = collector.join().unwrap();
    assert!(
        status.success(),
        "trainer failed after the restart:\n{output}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let auc = summary["auc"].as_f64().unwrap_or(f64::NAN);
    eprintln!("test AUC {auc}; trainer output:\n{output}");
    assert!(auc > 0.55, "test AUC {auc}:\n{output}");

    stop.store(true, Ordering::Relaxed);
    let totals = rt.block_on(pushing).unwrap().unwrap();
    let found = rt
        .block_on(audit::verify::pull_counters(&client, &rows))
        .unwrap();
    rt.block_on(client.close());
    let (_, acks) = audit::log::read(&log_path).unwrap();
    let verdict = audit::verify::compare(&rows, &acks, &found);
    eprintln!("{totals:?}\n{}", verdict.line());
    assert!(
        acks.iter().any(|a| a.server == 0 && a.t_ms < before),
        "no acknowledged push to server 0 before the kill"
    );
    assert!(
        acks.iter().any(|a| a.server == 0 && a.t_ms > after),
        "the auditor did not reach the restarted server"
    );
    assert_eq!(verdict.non_integral, 0, "{}", verdict.line());
    drop((s0, s1));
    Outcome {
        rows,
        acks,
        verdict,
        kill_window: (before, after),
    }
}

#[test]
fn sync_durability_loses_no_acknowledged_update_when_a_server_is_killed_mid_training() {
    let out = train_kill_restart(&["--durability", "sync", "--flush-interval-secs", "3600"]);
    assert_eq!(
        out.verdict.lost_acked,
        0,
        "acknowledged updates lost in sync durability: {}",
        out.verdict.line()
    );
}

#[test]
fn periodic_durability_loses_at_most_the_last_interval_when_a_server_is_killed_mid_training() {
    const INTERVAL_SECS: u64 = 2;
    let out = train_kill_restart(&[
        "--durability",
        "periodic",
        "--flush-interval-secs",
        &INTERVAL_SECS.to_string(),
    ]);
    let (before, after) = out.kill_window;
    let from = before - (INTERVAL_SECS + 1) * 1000;
    let recent = audit::verify::tally(&out.rows, &out.acks, |a| {
        a.server == 0 && a.t_ms >= from && a.t_ms <= after
    });
    for row in &out.verdict.rows {
        let i = out.rows.per_server[row.server]
            .iter()
            .position(|&id| id == row.id)
            .unwrap();
        let bound = if row.server == 0 { recent[0][i] } else { 0 };
        assert!(
            row.lost() <= bound,
            "server {} row {:#x}: lost {} acknowledged increments, bound {bound} (acknowledged in the last \
             {INTERVAL_SECS} s + 1 s before the kill); {}",
            row.server,
            row.id,
            row.lost(),
            out.verdict.line()
        );
    }
}
