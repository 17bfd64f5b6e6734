//! `trainer train --epochs N` with real server processes on loopback: every epoch reads the preprocessed
//! shards in its own seeded order and is evaluated, and a run stopped inside its second epoch resumes there
//! (servers restored from the checkpoint's snapshot) to the model of an uninterrupted run.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

mod support;
use support::{generate, summary, trainer};

/// Rows per epoch and batch size: 16 steps an epoch.
const ROWS: u64 = 8192;
const BATCH: &str = "512";

/// `trainer preprocess` of `input` into `out` (3 shards), returned.
fn preprocess(input: &Path, out: &Path) -> PathBuf {
    let o = trainer()
        .arg("preprocess")
        .arg("--input")
        .arg(input)
        .arg("--out")
        .arg(out)
        .args(["--rows-per-shard", "3000"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "preprocess: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.to_path_buf()
}

/// The `--ps` list of `cluster`.
fn ps_list(cluster: &local_cluster::LocalCluster) -> String {
    let addrs: Vec<String> = cluster.quic.iter().map(|a| a.to_string()).collect();
    addrs.join(",")
}

/// `trainer train` on `cluster` with `extra` flags, synchronous (k = 0), writing `json`.
fn train(
    cluster: &local_cluster::LocalCluster,
    shards: &Path,
    test: &Path,
    json: &Path,
    extra: &[&str],
) -> Output {
    let out = trainer()
        .args(["train", "--ps", &ps_list(cluster), "--batch-size", BATCH])
        .args(["--max-in-flight", "0"])
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .arg("--train")
        .arg(shards)
        .arg("--test")
        .arg(test)
        .arg("--summary-json")
        .arg(json)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "trainer train {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn three_epochs_over_shuffled_shards_are_each_evaluated() {
    let dir = tempfile::tempdir().unwrap();
    let (tsv, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    generate(ROWS, 1, &tsv);
    generate(2000, 2, &test);
    let shards = preprocess(&tsv, &dir.path().join("shards"));
    let cluster = support::start_servers(2, &dir.path().join("run"), &[]);
    let json = dir.path().join("summary.json");
    let out = train(&cluster, &shards, &test, &json, &["--epochs", "3"]);
    cluster.shutdown(Duration::from_secs(30)).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let s = summary(&json);
    assert_eq!(s["samples"], 3 * ROWS, "{s}");
    assert_eq!(s["step"], 3 * 16, "{s}");
    for e in 1..=3 {
        assert!(stderr.contains(&format!("epoch {e} of 3")), "{stderr}");
    }
    // Evaluations after epochs 1 and 2, then the final one (after epoch 3).
    let evals = s["evals"].as_array().unwrap();
    let epochs: Vec<_> = evals.iter().map(|e| e["epoch"].as_u64()).collect();
    assert_eq!(epochs, [Some(1), Some(2), None], "{s}");
    let steps: Vec<_> = evals.iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [16, 32, 48]);
    // The first epoch learns; later ones over these 8192 rows memorize rare ids (train loss 0.03 after three,
    // test logloss up from 0.55 to 1.1: the one-epoch overfitting of CTR models), so only the first is checked
    // for quality. The training loss falls as the same rows come back.
    assert!(evals[0]["auc"].as_f64().unwrap() > 0.6, "{s}");
    assert!(evals
        .iter()
        .all(|e| e["logloss"].as_f64().unwrap().is_finite()));
    assert!(s["train_loss"].as_f64().unwrap() < 0.3, "{s}");
}

#[test]
fn a_run_stopped_in_its_second_epoch_resumes_to_the_uninterrupted_model() {
    let dir = tempfile::tempdir().unwrap();
    let (tsv, test) = (dir.path().join("train.tsv"), dir.path().join("test.tsv"));
    generate(ROWS, 3, &tsv);
    generate(2000, 4, &test);
    let shards = preprocess(&tsv, &dir.path().join("shards"));
    let two = ["--epochs", "2", "--shuffle-seed", "9"];

    let a = support::start_servers(2, &dir.path().join("a"), &[]);
    let whole_json = dir.path().join("whole.json");
    train(&a, &shards, &test, &whole_json, &two);
    a.shutdown(Duration::from_secs(30)).unwrap();
    let whole = summary(&whole_json);
    assert_eq!(whole["step"], 32);

    // Stopped at step 21: five batches into epoch 2 (the checkpoint at the end of the run).
    let ckpt = dir.path().join("ckpt");
    let b = support::start_servers(2, &dir.path().join("b"), &[]);
    let part_json = dir.path().join("part.json");
    let ckpt_arg = ckpt.to_str().unwrap();
    let stop = ["--checkpoint-dir", ckpt_arg, "--max-steps", "21"];
    train(&b, &shards, &test, &part_json, &[&two[..], &stop].concat());
    b.shutdown(Duration::from_secs(30)).unwrap();
    assert_eq!(summary(&part_json)["step"], 21);

    let c_dir = dir.path().join("c");
    support::restore_servers(&ckpt.join("ps"), 2, &c_dir);
    let c = support::start_servers(2, &c_dir, &[]);
    // A job with fewer epochs than the checkpoint's is refused before it trains, naming both.
    let out = trainer()
        .args([
            "train",
            "--ps",
            &ps_list(&c),
            "--batch-size",
            BATCH,
            "--epochs",
            "1",
        ])
        .arg("--tls-dir")
        .arg(&c.tls_dir)
        .arg("--train")
        .arg(&shards)
        .args(["--resume", ckpt_arg])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("taken in epoch 2 but the job has --epochs 1"),
        "{stderr}"
    );
    let resumed_json = dir.path().join("resumed.json");
    let out = train(
        &c,
        &shards,
        &test,
        &resumed_json,
        &[&two[..], &["--resume", ckpt_arg]].concat(),
    );
    c.shutdown(Duration::from_secs(30)).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("epoch 2 of 2"), "{stderr}");
    assert!(!stderr.contains("epoch 1 of 2"), "{stderr}");
    let resumed = summary(&resumed_json);
    // The remaining 11 steps of epoch 2, in the epoch's order: the same model to the last bit.
    assert_eq!(resumed["step"], 32);
    assert_eq!(resumed["samples"], 11 * 512);
    assert_eq!(resumed["logloss"], whole["logloss"], "{resumed} vs {whole}");
    assert_eq!(resumed["auc"], whole["auc"]);
}
