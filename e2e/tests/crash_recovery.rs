//! Crash recovery with real processes on loopback (issue 7): two `ps-server` processes, a `trainer train`
//! job, and an auditor (`bench::audit`, in this
//! process) that pushes `+1` increments to counter rows on both servers and logs every acknowledged push.
//! Mid-training, server 0 is killed with SIGKILL and restarted on the same port and data directory. Then:
//!
//! - the trainer reconnects (backoff and retries in `PsClient`) and the job completes: exit 0, a test AUC;
//! - the auditor reconnects too (pushes to server 0 are acknowledged after the restart);
//! - `sync` durability: no acknowledged increment is lost (`lost_acked == 0`);
//! - `periodic` durability: server 1 (not killed) loses nothing, and every counter of server 0 loses at most the
//!   increments acknowledged to it after its last completed write-back started. The test watches server 0's
//!   count of completed write-backs (`/metrics`) and kills it right after two more completed: the last one
//!   started after the one before it completed, which was after the last poll that still saw neither (a
//!   bound that does not depend on how long a write-back takes). Acknowledgements are logged after they
//!   arrive, and each push task logs one before its next push, so at most one acknowledgement of the killed
//!   process is logged after the kill: the first one logged after it counts too.
//!
//! The trainer reads its training data from its standard input, which this test writes: fresh generated rows,
//! at least as many as the job trains on, and more until server 0 is back, then one more chunk. So the trainer
//! is training when server 0 is killed and still has rows to train once it is back, on any machine.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod support;
use support::generate;

use bench::audit::{self, pusher::now_ms, AckLog, AuditRows, LogHeader, PushConfig};
use bench::gen::Generator;
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

/// A server process and its QUIC and metrics addresses.
type Started = (Proc, SocketAddr, SocketAddr);

/// Starts server `index` of 2 on `listen` with `data` and `flags`; returns it and its addresses once ready, or
/// `None` if it exited without reporting ready (e.g. the port of `listen` was taken).
fn try_start_server(dir: &Path, index: usize, listen: &str, flags: &[&str]) -> Option<Started> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(dir.join(format!("ps-{index}.log")))
        .unwrap();
    let mut child = bench::bins::command("ps-server")
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
    let mut proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("ps-server ready line");
    if line.is_empty() {
        // Its standard output closed without a ready line: it exited.
        proc.0.wait().unwrap();
        return None;
    }
    let field = |key: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            .parse()
            .unwrap()
    };
    let (quic, metrics) = (field("quic="), field("metrics="));
    Some((proc, quic, metrics))
}

/// Starts server `index` of 2 on free ports.
fn start_server(dir: &Path, index: usize, flags: &[&str]) -> Started {
    try_start_server(dir, index, "127.0.0.1:0", flags)
        .unwrap_or_else(|| panic!("ps-server {index} exited at start-up; see ps-{index}.log"))
}

/// Restarts server `index` on the QUIC port it had (the clients know no other). The port was free from the
/// kill on, so another process may have bound it meanwhile: retried until it is free again.
fn restart_server(dir: &Path, index: usize, quic: SocketAddr, flags: &[&str]) -> Started {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(started) = try_start_server(dir, index, &quic.to_string(), flags) {
            return started;
        }
        assert!(
            Instant::now() < deadline,
            "ps-server {index} did not restart on {quic}; see ps-{index}.log"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (up to a minute) until `f` holds.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The acknowledgements logged so far.
fn acks_so_far(log: &Path) -> Vec<audit::Ack> {
    audit::log::read(log).unwrap().1
}

/// The count of write-backs server `metrics` has completed (the count of its write-back duration histogram).
fn write_backs(metrics: SocketAddr) -> f64 {
    let mut s = std::net::TcpStream::connect(metrics).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    page.lines()
        .find_map(|l| l.strip_prefix("ps_writeback_duration_seconds_count "))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Polls the count of completed write-backs of server `metrics` until two more have completed than at the
/// first poll. Returns the Unix ms at which the last poll that saw at most the final count minus 2 was sent:
/// the write-back before the last one completed after that, so the last one started after it too.
fn await_two_write_backs(metrics: SocketAddr) -> u64 {
    let mut polls: Vec<(u64, f64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sent = now_ms();
        let n = write_backs(metrics);
        polls.push((sent, n));
        if n >= polls[0].1 + 2.0 {
            return polls.iter().rev().find(|p| p.1 <= n - 2.0).unwrap().0;
        }
        assert!(Instant::now() < deadline, "no write-backs: {polls:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL and reap.
fn sigkill(mut p: Proc) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(p.0.id() as i32, libc::SIGKILL) };
    p.0.wait().unwrap();
}

/// Rows the trainer trains on at least (more while server 0 is down and restarting).
const MIN_TRAIN_ROWS: u64 = 24_000;

struct Outcome {
    rows: AuditRows,
    acks: Vec<audit::Ack>,
    verdict: audit::Verdict,
    /// Unix ms just before the SIGKILL was sent, and once it was reaped.
    kill_window: (u64, u64),
    /// With `write_backs`: Unix ms at or before the start of server 0's last write-back before the kill.
    write_back_from: Option<u64>,
}

/// Runs the scenario with server `flags`; returns the audit and the kill window. With `write_backs`, server 0
/// is killed right after it completed two write-backs (see the module doc). Asserts that the trainer completes
/// with a test AUC and that the auditor reached the restarted server.
fn train_kill_restart(flags: &[&str], write_backs: bool) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("test.tsv");
    generate(4_000, 12, &test);
    protocol::transport::tls::init_dev_certs(&dir.path().join("tls"), &[]).unwrap();
    let (s0, a0, m0) = start_server(dir.path(), 0, flags);
    let (s1, a1, _) = start_server(dir.path(), 1, flags);

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
    let mut trainer = bench::bins::command("trainer");
    trainer
        .args(["train", "--ps", &ps, "--batch-size", "256"])
        .args(["--bottom-mlp", "64,16", "--top-mlp", "64,1"])
        .args(["--progress-secs", "0.3"])
        .arg("--tls-dir")
        .arg(dir.path().join("tls"))
        .args(["--train", "/dev/stdin"])
        .arg("--test")
        .arg(&test)
        .arg("--summary-json")
        .arg(&json)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut trainer = Proc(trainer.spawn().unwrap());
    let stderr = trainer.0.stderr.take().unwrap();
    // The training data: generated chunks of fresh rows, at least `MIN_TRAIN_ROWS`, and more until server 0
    // is back; the chunk written after that is trained against the restarted server. Closing the pipe ends
    // the trainer's input.
    let restarted = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (mut input, restarted) = (trainer.0.stdin.take().unwrap(), restarted.clone());
        std::thread::spawn(move || -> std::io::Result<u64> {
            let generator = Generator::new(11, support::TEACHER_SEED);
            let (mut chunk, mut rows) = (0, 0);
            loop {
                let last = restarted.load(Ordering::SeqCst) && rows >= MIN_TRAIN_ROWS;
                let c = generator.chunk(chunk, u64::MAX, false);
                input.write_all(&c.data)?;
                (chunk, rows) = (chunk + 1, rows + c.rows);
                if last {
                    return Ok(rows);
                }
            }
        })
    };
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
    // Training is under way (a progress line), and server 0 acknowledged an audit push, before the kill.
    progress
        .recv_timeout(Duration::from_secs(60))
        .expect("no progress line from the trainer");
    wait_for("an acknowledged audit push to server 0", || {
        let now = now_ms();
        acks_so_far(&log_path)
            .iter()
            .any(|a| a.server == 0 && a.t_ms < now)
    });
    let write_back_from = write_backs.then(|| await_two_write_backs(m0));
    assert!(
        trainer.0.try_wait().unwrap().is_none(),
        "the trainer finished before the kill"
    );
    let before = now_ms();
    sigkill(s0);
    let after = now_ms();
    let (s0, again, _) = restart_server(dir.path(), 0, a0, flags);
    assert_eq!(again, a0);
    restarted.store(true, Ordering::SeqCst);

    let status = trainer.0.wait().unwrap();
    let output = collector.join().unwrap();
    assert!(
        status.success(),
        "trainer failed after the restart:\n{output}"
    );
    let fed = feeder.join().unwrap().unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let auc = summary["auc"].as_f64().unwrap_or(f64::NAN);
    eprintln!("test AUC {auc}; trainer output:\n{output}");
    assert_eq!(summary["samples"], fed, "rows given to the trainer");
    assert!(auc > 0.55, "test AUC {auc}:\n{output}");

    // The auditor reconnects to the restarted server in its own time (client backoff).
    wait_for(
        "an audit push acknowledged by the restarted server 0",
        || {
            acks_so_far(&log_path)
                .iter()
                .any(|a| a.server == 0 && a.t_ms > after)
        },
    );
    stop.store(true, Ordering::Relaxed);
    let totals = rt.block_on(pushing).unwrap().unwrap();
    let found = rt
        .block_on(audit::verify::pull_counters(&client, &rows))
        .unwrap();
    rt.block_on(client.close());
    let (header, records) = audit::log::read_records(&log_path).unwrap();
    let acks = audit::log::acks(&records);
    let unacked = audit::verify::unacknowledged(header.servers, &records);
    let verdict = audit::verify::compare(&rows, &acks, &unacked, &found);
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
        write_back_from,
    }
}

#[test]
fn sync_durability_loses_no_acknowledged_update_when_a_server_is_killed_mid_training() {
    let out = train_kill_restart(
        &["--durability", "sync", "--flush-interval-secs", "3600"],
        false,
    );
    assert_eq!(
        out.verdict.lost_acked,
        0,
        "acknowledged updates lost in sync durability: {}",
        out.verdict.line()
    );
}

/// The same with a memory budget of 8 rows per table: the auditor's 16 counter rows per server and the
/// trainer's rows are evicted to RocksDB and read back all along (the trainer's prefetches too, until a batch
/// exceeds the pin limit of 4 rows and the server refuses them).
#[test]
fn sync_durability_with_a_memory_budget_loses_no_acknowledged_update_when_a_server_is_killed() {
    let out = train_kill_restart(
        &[
            "--durability",
            "sync",
            "--flush-interval-secs",
            "3600",
            "--memory-budget-rows",
            "8",
        ],
        false,
    );
    assert_eq!(
        out.verdict.lost_acked,
        0,
        "acknowledged updates lost in sync durability with a memory budget: {}",
        out.verdict.line()
    );
}

#[test]
fn periodic_durability_loses_at_most_the_last_interval_when_a_server_is_killed_mid_training() {
    let out = train_kill_restart(
        &["--durability", "periodic", "--flush-interval-secs", "2"],
        true,
    );
    let from = out.write_back_from.unwrap();
    let after = out.kill_window.1;
    // Acknowledgements of the killed process logged after the kill: at most one, before any of the restarted
    // process (see the module doc).
    let upto = out
        .acks
        .iter()
        .filter(|a| a.server == 0 && a.t_ms > after)
        .map(|a| a.t_ms)
        .min()
        .unwrap();
    let recent = audit::verify::tally(&out.rows, &out.acks, |a| {
        a.server == 0 && a.t_ms >= from && a.t_ms <= upto
    });
    for row in &out.verdict.rows {
        let i = out.rows.per_server[row.server]
            .iter()
            .position(|&id| id == row.id)
            .unwrap();
        let bound = if row.server == 0 { recent[0][i] } else { 0 };
        assert!(
            row.lost() <= bound,
            "server {} row {:#x}: lost {} acknowledged increments, bound {bound} (acknowledged from {from} \
             (before the start of the last write-back) to {upto} (the first logged after the kill at {after})); {}",
            row.server,
            row.id,
            row.lost(),
            out.verdict.line()
        );
    }
    eprintln!(
        "loss window {} ms before the kill, {} ms after",
        out.kill_window.0 - from,
        upto - out.kill_window.0
    );
}
