//! Checkpoint and resume in synchronous mode (k = 0), with real server processes on loopback: a run stopped
//! at a checkpoint and resumed on servers restored from the checkpoint's snapshot (by `ps-server restore`) ends with the parameters and test predictions of an uninterrupted run. Also here,
//! since it needs the same deterministic synchronous runs: a staleness warm-up that covers the whole run trains
//! exactly like k = 0.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod support;
use support::generate;

use local_cluster::LocalCluster;
use model::eval::EvalReport;
use model::spec::OptimizerKind;
use trainer::config::ModelArgs;
use trainer::criteo::ReaderConfig;
use trainer::train::{Event, PassOptions, Trainer};

fn model_args() -> ModelArgs {
    ModelArgs {
        batch_size: 256,
        bottom_mlp: vec![32, 16],
        top_mlp: vec![32, 1],
        optimizer: OptimizerKind::Adagrad, // dense Adam: optimizer state matters
        max_in_flight: Some(0),
        eval_batch_size: 1000,
        // Error feedback on for f16 pushes: its residuals are trainer state the checkpoint must carry; without
        // them a resumed run drifts from the second step on (max |param diff| 2e-4 after 4 steps here).
        error_feedback: trainer::config::FeedbackMode::On,
        ..ModelArgs::default()
    }
}

async fn connect(cluster: &LocalCluster) -> Arc<protocol::PsClient> {
    let cfg = protocol::PsClientConfig::new(cluster.quic.clone(), cluster.tls_dir.clone());
    Arc::new(protocol::PsClient::connect(cfg).await.unwrap())
}

struct Outcome {
    params: Vec<Vec<f32>>,
    eval: EvalReport,
    step: u64,
}

/// Trains on `cluster` with `args` (resuming `resume` if given) up to `max_steps` (0 = the end), optionally
/// checkpointing, then evaluates.
async fn run_with(
    cluster: &LocalCluster,
    train: &Path,
    test: &Path,
    opts: PassOptions,
    resume: Option<&Path>,
    args: ModelArgs,
) -> (Outcome, Vec<Event>) {
    let client = connect(cluster).await;
    let mut t = Trainer::new(client.clone(), args.clone()).await.unwrap();
    if let Some(dir) = resume {
        t.resume(dir).unwrap();
    }
    let mut events = Vec::new();
    t.train_pass(ReaderConfig::new([train], args.batch_size), &opts, |e| {
        events.push(e)
    })
    .await
    .unwrap();
    let eval = t.evaluate(ReaderConfig::new([test], 1000)).await.unwrap();
    let params = t.model().params().iter().map(|p| p.to_vec()).collect();
    let step = t.step();
    client.close().await;
    (Outcome { params, eval, step }, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_from_checkpoint_matches_an_uninterrupted_run() {
    resume_matches_uninterrupted(model_args()).await;
}

/// The same with bf16 and f16 rows on the servers (issue 43; tables alternate): the snapshot holds the packed
/// rows, the restore loads them exactly, and the resumed run rounds its updates as the uninterrupted one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_with_half_precision_rows_matches_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = ModelArgs::default();
    let base = model_args();
    let spec = support::half_precision_spec(dir.path(), &base.bottom_mlp, &base.top_mlp);
    resume_matches_uninterrupted(ModelArgs {
        model_spec: Some(spec),
        bottom_mlp: d.bottom_mlp,
        top_mlp: d.top_mlp,
        ..base
    })
    .await;
}

/// Trains 10 steps uninterrupted, and 6 steps checkpointed every 3 then resumed on servers restored from the
/// checkpoint: same dense parameters and test predictions, bit for bit.
async fn resume_matches_uninterrupted(args: ModelArgs) {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(256 * 10, 11, &train);
    generate(2000, 12, &test);
    let ckpt: PathBuf = dir.path().join("ckpt");

    // Uninterrupted: 10 steps.
    let a = support::start_servers(2, &dir.path().join("a"), &[]);
    let (whole, _) = run_with(
        &a,
        &train,
        &test,
        PassOptions::default(),
        None,
        args.clone(),
    )
    .await;
    a.shutdown(Duration::from_secs(30)).unwrap();
    assert_eq!(whole.step, 10);

    // Interrupted: checkpoints at steps 3 and 6, stop at 6; the servers go away.
    let b = support::start_servers(2, &dir.path().join("b"), &[]);
    let opts = PassOptions {
        checkpoint_dir: Some(ckpt.clone()),
        checkpoint_every: 3,
        max_steps: 6,
        ..PassOptions::default()
    };
    let (part, events) = run_with(&b, &train, &test, opts, None, args.clone()).await;
    b.shutdown(Duration::from_secs(30)).unwrap();
    assert_eq!(part.step, 6);
    let steps: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Checkpoint {
                step, ps_snapshot, ..
            } => {
                assert!(ps_snapshot);
                Some(*step)
            }
            _ => None,
        })
        .collect();
    // Every 3 steps (the end, step 6, was just written).
    assert_eq!(steps, [3, 6]);
    assert_ne!(part.params, whole.params, "6 of 10 steps cannot equal 10");

    // Restore the servers from the snapshot into fresh data directories, and resume.
    let c_dir = dir.path().join("c");
    support::restore_servers(&ckpt.join("ps"), 2, &c_dir);
    let c = support::start_servers(2, &c_dir, &[]);
    let (resumed, _) = run_with(&c, &train, &test, PassOptions::default(), Some(&ckpt), args).await;
    c.shutdown(Duration::from_secs(30)).unwrap();

    assert_eq!(resumed.step, 10);
    assert!(
        resumed.params == whole.params,
        "resumed dense parameters differ from the uninterrupted run's"
    );
    // Same embedding rows on the servers too: identical predictions on the test set.
    assert_eq!(resumed.eval.logloss.to_bits(), whole.eval.logloss.to_bits());
    assert_eq!(resumed.eval.auc, whole.eval.auc);
    assert_eq!(resumed.eval.mean_prediction, whole.eval.mean_prediction);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_refuses_a_checkpoint_of_another_job() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    generate(512, 13, &train);
    let ckpt = dir.path().join("ckpt");
    let a = support::start_servers(2, &dir.path().join("a"), &[]);
    let client = connect(&a).await;
    let mut t = Trainer::new(client.clone(), model_args()).await.unwrap();
    let opts = PassOptions {
        checkpoint_dir: Some(ckpt.clone()),
        ..PassOptions::default()
    };
    t.train_pass(ReaderConfig::new([&train], 256), &opts, |_| {})
        .await
        .unwrap();
    assert!(ckpt.join("trainer-rank0.ckpt").is_file());
    assert!(ckpt.join("ps").is_dir());
    let other = ModelArgs {
        batch_size: 128,
        ..model_args()
    };
    let mut t2 = Trainer::new(client.clone(), other).await.unwrap();
    let err = t2.resume(&ckpt).unwrap_err().to_string();
    assert!(err.contains("batch size 128"), "{err}");
    let mut t3 = Trainer::new(client.clone(), model_args()).await.unwrap();
    let err = t3
        .resume(&dir.path().join("nowhere"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nowhere"), "{err}");
    client.close().await;
    a.shutdown(Duration::from_secs(30)).unwrap();
}

/// Trains `args` from scratch on fresh servers under `dir/name` and evaluates.
async fn fresh_run(dir: &Path, name: &str, train: &Path, test: &Path, args: ModelArgs) -> Outcome {
    let cluster = support::start_servers(2, &dir.join(name), &[]);
    let opts = PassOptions::default();
    let (o, _) = run_with(&cluster, train, test, opts, None, args).await;
    cluster.shutdown(Duration::from_secs(30)).unwrap();
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staleness_warmup_over_the_whole_run_is_synchronous() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(256 * 8, 21, &train);
    generate(1000, 22, &test);
    let outcome = |name: &'static str, k: usize, warmup: u64| {
        let args = ModelArgs {
            max_in_flight: Some(k),
            staleness_warmup_steps: Some(warmup),
            // Without replay: the warm-up alone must make the run synchronous.
            replay_own_updates: false,
            ..model_args()
        };
        fresh_run(dir.path(), name, &train, &test, args)
    };
    let sync = outcome("k0", 0, 0).await;
    let warm = outcome("k4-warm", 4, 8).await;
    let stale = outcome("k4", 4, 0).await;
    assert!(
        sync.params == warm.params,
        "k = 4 with an 8-step warm-up differs from k = 0"
    );
    assert_eq!(sync.eval.logloss.to_bits(), warm.eval.logloss.to_bits());
    // Without the warm-up the first pulls are sent before the first push: stale rows, other parameters.
    assert!(
        sync.params != stale.params,
        "k = 4 trained exactly like k = 0"
    );
}

/// With f32 rows on the wire, one trainer at k = 4 that replays its own pushes in flight on the rows it pulls
/// trains bit for bit like k = 0 (the pushes a pull holds are exact: trainer/src/step/replay.rs); without replay
/// it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_own_updates_makes_asynchronous_training_exact() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let test = dir.path().join("test.tsv");
    generate(256 * 10, 23, &train);
    generate(1000, 24, &test);
    let outcome = |name: &'static str, k: usize, replay: bool| {
        let args = ModelArgs {
            max_in_flight: Some(k),
            staleness_warmup_steps: Some(0),
            replay_own_updates: replay,
            encoding: protocol::Encoding::F32,
            ..model_args()
        };
        fresh_run(dir.path(), name, &train, &test, args)
    };
    let sync = outcome("k0", 0, true).await;
    let replayed = outcome("k4-replay", 4, true).await;
    let stale = outcome("k4-stale", 4, false).await;
    assert_eq!(replayed.step, 10);
    assert!(
        sync.params == replayed.params,
        "k = 4 with replay differs from k = 0"
    );
    assert_eq!(sync.eval.logloss.to_bits(), replayed.eval.logloss.to_bits());
    assert!(
        sync.params != stale.params,
        "k = 4 without replay trained exactly like k = 0"
    );
}
