//! The hybrid dense mode with real processes: several trainers take the steps of one trainer at the global
//! batch, and a trainer that never shows up is named, or gone around, at the reduce deadline.

use std::path::Path;
use std::time::Duration;

mod support;
use support::{generate, summary, trainer};

/// Synchronous (k = 0), SGD everywhere, f32 on the wire: two trainers at batch 512 (rank r reads the lines
/// `index % 2 == r`, so step i's global batch is the same 1024 rows one trainer at batch 1024 reads) must train
/// the same model, up to the order of float sums.
const SAME_STEPS: &[&str] = &[
    "--max-in-flight",
    "0",
    "--optimizer",
    "sgd",
    "--dense-optimizer",
    "sgd",
    "--lr",
    "0.1",
    "--emb-lr",
    "0.5",
    "--encoding",
    "f32",
    "--reduce-encoding",
    "f32",
    "--batch-size",
    "1024",
];

#[test]
fn two_hybrid_trainers_train_the_model_of_one_trainer_at_the_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(30_000, 1, &train);
    generate(5_000, 2, &test);
    let run = |trainers: &str| {
        let sub = dir.path().join(format!("t{trainers}"));
        std::fs::create_dir_all(&sub).unwrap();
        let args = [SAME_STEPS, &["--trainers", trainers]].concat();
        support::run_demo(&sub, &train, &test, &args)
    };
    let (one, _) = run("1");
    let (two, stderr) = run("2");
    assert!(
        stderr.contains("global batch 1024, 512 per trainer"),
        "{stderr}"
    );
    assert_eq!(two["samples"], 30_000, "{two}");
    let (a1, a2) = (one["auc"].as_f64().unwrap(), two["auc"].as_f64().unwrap());
    let (l1, l2) = (
        one["logloss"].as_f64().unwrap(),
        two["logloss"].as_f64().unwrap(),
    );
    // Measured: equal to 4 decimals. The asynchronous dense mode differs by 0.01 or more.
    assert!((a1 - a2).abs() < 1e-3, "AUC one {a1} vs two {a2}");
    assert!((l1 - l2).abs() < 1e-3, "logloss one {l1} vs two {l2}");
    assert!(a1 > 0.5 && l1 < 0.6, "{one}");
}

/// `trainer train` as rank 0 of 2 whose rank 1 never starts.
fn lone_rank(dir: &Path, ps: &str, tls: &Path, on_missing: &str) -> std::process::Output {
    let train = dir.join("train.tsv");
    if !train.exists() {
        generate(4_000, 3, &train);
    }
    trainer()
        .args(["train", "--ps", ps, "--rank", "0", "--world", "2"])
        .args(["--batch-size", "1000", "--reduce-timeout-secs", "0.5"])
        .args(["--on-missing-trainer", on_missing, "--skip-final-eval"])
        .arg("--tls-dir")
        .arg(tls)
        .arg("--train")
        .arg(&train)
        .arg("--summary-json")
        .arg(dir.join(format!("{on_missing}.json")))
        .output()
        .unwrap()
}

#[test]
fn a_missing_trainer_is_named_or_gone_around_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = support::start_servers(2, &dir.path().join("run"), &[]);
    let ps: Vec<String> = cluster.quic.iter().map(|a| a.to_string()).collect();
    let ps = ps.join(",");
    let out = lone_rank(dir.path(), &ps, &cluster.tls_dir, "fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("trainer rank(s) [1] sent nothing"),
        "{stderr}"
    );
    // Going on: the first step waits for the deadline, later ones do not wait for rank 1 at all.
    let out = lone_rank(dir.path(), &ps, &cluster.tls_dir, "continue");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let s = summary(&dir.path().join("continue.json"));
    // Rank 0 of 2 reads every other line.
    assert_eq!(s["samples"], 2_000, "{s}");
    assert!(stderr.contains("went on without some trainers"), "{stderr}");
    cluster.shutdown(Duration::from_secs(30)).unwrap();
}

/// `--dense-staleness 1` (each step's reduce overlapped with the next step): the replicas still apply the same
/// sums in the same order, so the two ranks' final dense parameters are bit-identical, and the model trains.
#[test]
fn overlapped_reduce_keeps_the_replicas_identical() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(20_000, 3, &train);
    generate(4_000, 4, &test);
    let ckpt = dir.path().join("ckpt");
    let args = [
        "--trainers",
        "2",
        "--dense-staleness",
        "1",
        "--max-in-flight",
        "1",
        "--batch-size",
        "1024",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
    ];
    let (s, stderr) = support::run_demo(dir.path(), &train, &test, &args);
    assert_eq!(s["samples"], 20_000, "{s}\n{stderr}");
    assert!(s["auc"].as_f64().unwrap() > 0.55, "{s}");
    let read = |rank| trainer::checkpoint::Checkpoint::read(&ckpt, rank).unwrap();
    let (r0, r1) = (read(0), read(1));
    assert_eq!(r0.meta.optimizer_step, r1.meta.optimizer_step);
    assert!(r0.meta.optimizer_step > 0);
    assert!(r0.params == r1.params, "the ranks' dense parameters differ");
}

/// `trainer train` as rank `rank` of 2 in the hybrid mode, checkpointing every 4 steps into `ckpt`.
fn hybrid_rank(
    dir: &Path,
    ps: &str,
    tls: &Path,
    rank: usize,
    train: &Path,
) -> std::process::Command {
    let mut cmd = trainer();
    cmd.args([
        "train",
        "--ps",
        ps,
        "--rank",
        &rank.to_string(),
        "--world",
        "2",
    ])
    .args(["--batch-size", "500", "--reduce-timeout-secs", "10"])
    .args(["--checkpoint-every", "4", "--skip-final-eval"])
    .arg("--checkpoint-dir")
    .arg(dir.join("ckpt"))
    .arg("--tls-dir")
    .arg(tls)
    .arg("--train")
    .arg(train)
    .arg("--summary-json")
    .arg(dir.join(format!("rank{rank}.json")))
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    cmd
}

/// A trainer SIGKILLed mid-pass does not wedge the other: its reduce times out naming the dead rank; then the
/// job resumes from the last checkpoint both ranks wrote and finishes. Rank 1 reads a FIFO the test feeds 12
/// batches and then leaves open, so rank 1 is alive and blocked in the middle of its pass when it is killed,
/// however fast the machine.
#[test]
fn a_killed_trainer_stops_the_other_with_a_named_error_and_the_job_resumes() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let cluster = support::start_servers(2, &dir.path().join("run"), &[]);
    let ps: Vec<String> = cluster.quic.iter().map(|a| a.to_string()).collect();
    let ps = ps.join(",");
    let train = dir.path().join("train.tsv");
    generate(24_000, 5, &train);
    let fifo = dir.path().join("rank1.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // Rank 1 takes the odd lines: 12,400 lines give it 12 batches of 500 and 200 rows of a 13th.
    let text = std::fs::read_to_string(&train).unwrap();
    let head: String = text
        .lines()
        .take(12_400)
        .map(|l| format!("{l}\n"))
        .collect();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let feeder = std::thread::spawn({
        let fifo = fifo.clone();
        move || {
            let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            w.write_all(head.as_bytes()).unwrap();
            w.flush().unwrap();
            // Held open: rank 1 waits for the rest of its 13th batch until the test is done with it.
            let _ = stop_rx.recv();
        }
    });
    let r0 = hybrid_rank(dir.path(), &ps, &cluster.tls_dir, 0, &train)
        .spawn()
        .unwrap();
    let mut r1 = hybrid_rank(dir.path(), &ps, &cluster.tls_dir, 1, &fifo)
        .spawn()
        .unwrap();
    // Both ranks checkpoint step 12 (the last step rank 1 can take); poll for it.
    let ckpt = dir.path().join("ckpt");
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let at_12 =
        |rank| trainer::checkpoint::Checkpoint::read(&ckpt, rank).is_ok_and(|c| c.meta.step == 12);
    while !(at_12(0) && at_12(1)) {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint at step 12"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(r1.try_wait().unwrap().is_none(), "rank 1 ended early");
    r1.kill().unwrap(); // SIGKILL
    r1.wait().unwrap();
    let _ = stop_tx.send(());
    feeder.join().unwrap();
    let out = r0.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("trainer rank(s) [1] sent nothing"),
        "{stderr}"
    );
    // The job resumes from the checkpoint (both ranks at step 12) and finishes its pass.
    let resumed: Vec<_> = (0..2)
        .map(|rank| {
            hybrid_rank(dir.path(), &ps, &cluster.tls_dir, rank, &train)
                .arg("--resume")
                .arg(&ckpt)
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in resumed.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "rank {rank}: {stderr}");
        assert!(stderr.contains("resumed from"), "{stderr}");
        let s = summary(&dir.path().join(format!("rank{rank}.json")));
        // Each rank's 12,000 rows, of which 12 batches of 500 were in the checkpoint.
        assert_eq!(s["samples"], 6_000, "rank {rank}: {s}");
    }
    cluster.shutdown(Duration::from_secs(30)).unwrap();
}
