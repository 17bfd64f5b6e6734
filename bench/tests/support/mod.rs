//! Helpers shared by the end-to-end process tests: generated Criteo data, the workspace's binaries, `trainer
//! demo` runs, local clusters of `ps-server` processes.
// Each test target uses its own subset.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use bench::gen::{Encoding, Generator, Sink};

/// Seed of the generator's planted click model in every test.
pub const TEACHER_SEED: u64 = 7;

/// Writes `rows` generated rows to `path` and the teacher's probabilities to `path.oracle`, which it returns.
pub fn generate(rows: u64, seed: u64, path: &Path) -> PathBuf {
    let oracle = path.with_extension("oracle");
    let mut data = Sink::new(File::create(path).unwrap(), Encoding::for_path(path)).unwrap();
    let mut probs = Sink::new(File::create(&oracle).unwrap(), Encoding::for_path(&oracle)).unwrap();
    Generator::new(seed, TEACHER_SEED)
        .write(rows, &mut data, Some(&mut probs))
        .unwrap();
    data.finish().unwrap();
    probs.finish().unwrap();
    oracle
}

/// The trainer binary, told to start the workspace's `ps-server` binary for its demo clusters.
pub fn trainer() -> Command {
    let mut cmd = bench::bins::command("trainer");
    cmd.env(
        ops::local_cluster::PS_SERVER_ENV,
        bench::bins::path("ps-server"),
    );
    cmd
}

/// Starts `n` real `ps-server` processes under `run_dir` with `extra` flags (data directories
/// `run_dir/ps-<i>`, which may hold a restored snapshot already).
pub fn start_servers(
    n: usize,
    run_dir: &Path,
    extra: &[String],
) -> ops::local_cluster::LocalCluster {
    let bin = bench::bins::path("ps-server");
    ops::local_cluster::LocalCluster::start_with(&|| Ok(Command::new(&bin)), n, run_dir, extra)
        .unwrap()
}

/// Restores `n` servers' data directories `run_dir/ps-<i>` from the snapshot `snapshot` (a checkpoint's `ps/`)
/// with `ps-server restore`, for [`start_servers`].
pub fn restore_servers(snapshot: &Path, n: usize, run_dir: &Path) {
    for i in 0..n {
        let out = bench::bins::command("ps-server")
            .arg("restore")
            .arg("--from")
            .arg(snapshot)
            .args([
                "--num-shards",
                &n.to_string(),
                "--shard-index",
                &i.to_string(),
            ])
            .arg("--data-dir")
            .arg(run_dir.join(format!("ps-{i}")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ps-server restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Reads a summary JSON.
pub fn summary(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `trainer demo ARGS --train TRAIN --test TEST` with its servers and summary under `dir`, asserts that it
/// succeeded, and returns its summary and standard error.
pub fn run_demo(
    dir: &Path,
    train: &Path,
    test: &Path,
    args: &[&str],
) -> (serde_json::Value, String) {
    let (train, test) = (train.to_str().unwrap(), test.to_str().unwrap());
    demo(dir, &[args, &["--train", train, "--test", test]].concat())
}

/// Runs `trainer demo ARGS` with its data, servers and summary under `dir`, asserts that it succeeded, and returns
/// its summary and standard error.
pub fn demo(dir: &Path, args: &[&str]) -> (serde_json::Value, String) {
    let json = dir.join("summary.json");
    let out = trainer()
        .arg("demo")
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .arg("--summary-json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "trainer demo failed: {stderr}");
    (summary(&json), stderr)
}

/// Exact ROC AUC of `scores` against `labels` (ties count one half), by the trainer's evaluator
/// (`trainer::eval::auc`, the one AUC of the workspace); `None` if a class is absent.
pub fn auc(scores: &[f64], labels: &[bool]) -> Option<f64> {
    let scores: Vec<f32> = scores.iter().map(|&s| s as f32).collect();
    let labels: Vec<f32> = labels.iter().map(|&l| f32::from(u8::from(l))).collect();
    trainer::eval::auc(&scores, &labels)
}
