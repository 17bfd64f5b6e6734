//! `trainer demo --trainers N`: N `trainer train` processes (rank r of N) against the demo's servers, their
//! summaries combined: samples add up, the pass lasts as long as the slowest trainer.

use std::path::Path;
use std::process::{Child, Command};

use anyhow::{bail, Context};

use super::DemoArgs;
use crate::config::ClusterArgs;
use crate::run::{Inputs, Summary};

/// Kills (and reaps) the trainer processes still running when dropped, so a failure leaves none behind.
struct Children(Vec<(usize, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the trainers, waits for all, and combines their summaries (no final evaluation: the caller runs it
/// once every trainer is done).
pub fn run(
    args: &DemoArgs,
    cluster: &ClusterArgs,
    inputs: &Inputs,
    run_dir: &Path,
) -> anyhow::Result<Summary> {
    let n = args.trainers;
    let exe = std::env::current_exe().context("locate the running binary")?;
    let model_toml = run_dir.join("model.toml");
    let text = toml::to_string(&trainer_model(args)).context("write the model config")?;
    std::fs::write(&model_toml, text).with_context(|| format!("write {}", model_toml.display()))?;
    let mut children = Children(Vec::new());
    for rank in 0..n {
        let mut cmd = trainer_command(&exe, args, cluster, inputs, run_dir, &model_toml, rank);
        let child = cmd
            .spawn()
            .with_context(|| format!("start trainer rank {rank}"))?;
        eprintln!("  trainer rank {rank} of {n}: pid {}", child.id());
        children.0.push((rank, child));
    }
    // Wait in rank order; a failure kills the rest (Drop).
    while let Some((rank, mut child)) = (!children.0.is_empty()).then(|| children.0.remove(0)) {
        let status = child
            .wait()
            .with_context(|| format!("wait for trainer rank {rank}"))?;
        if !status.success() {
            bail!("trainer rank {rank} failed ({status})");
        }
    }
    let mut c = combine(run_dir, n)?;
    c.samples_per_sec = c.samples as f64 / c.seconds.max(1e-9);
    eprintln!(
        "{n} trainers: {} samples in {:.2} s (slowest trainer) = {:.0} samples/s combined",
        c.samples, c.seconds, c.samples_per_sec
    );
    Ok(c)
}

/// The model config of every trainer: in the hybrid dense mode, `--batch-size` is the global batch, each of the
/// N trainers taking `batch / N` (rounded up) so that N trainers take the steps of one at that batch
/// (step::dense_reduce), and the run gets a reduce group of its own.
fn trainer_model(args: &DemoArgs) -> crate::config::ModelArgs {
    let mut model = args.model.clone();
    let n = args.trainers.max(1);
    if model.dense_mode == crate::config::DenseMode::Hybrid && n > 1 {
        model.batch_size = model.batch_size.div_ceil(n);
        let drawn = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ ((std::process::id() as u64) << 32);
        model.reduce_group.get_or_insert(drawn);
        eprintln!(
            "  hybrid dense mode: global batch {}, {} per trainer",
            args.model.batch_size, model.batch_size
        );
    }
    model
}

/// The command line of trainer `rank` of the demo's `args.trainers`.
fn trainer_command(
    exe: &Path,
    args: &DemoArgs,
    cluster: &ClusterArgs,
    inputs: &Inputs,
    run_dir: &Path,
    model_toml: &Path,
    rank: usize,
) -> Command {
    let n = args.trainers;
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut cmd = Command::new(exe);
    cmd.arg("train")
        .arg("--ps")
        .arg(cluster.ps.join(","))
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .arg("--train")
        .args(&inputs.train)
        .args(["--rank", &rank.to_string(), "--world", &n.to_string()])
        .arg("--config")
        .arg(model_toml)
        .arg("--summary-json")
        .arg(run_dir.join(format!("summary-rank{rank}.json")))
        .arg("--skip-final-eval");
    if rank == 0 && args.job.eval_every > 0 {
        cmd.arg("--test")
            .args(&inputs.test)
            .args(["--eval-every", &args.job.eval_every.to_string()]);
    }
    if let Some(dir) = &args.job.checkpoint_dir {
        cmd.arg("--checkpoint-dir")
            .arg(dir)
            .args(["--checkpoint-every", &args.job.checkpoint_every.to_string()]);
    }
    if let Some(dir) = &args.job.resume {
        cmd.arg("--resume").arg(dir);
    }
    if args.job.max_steps > 0 {
        cmd.args(["--max-steps", &args.job.max_steps.to_string()]);
    }
    cmd.args(["--epochs", &args.job.epochs().to_string()])
        .args(["--shuffle-seed", &args.job.shuffle_seed.to_string()])
        .args(["--helper-threads", &args.job.helper_threads.to_string()]);
    // Always: the demo evaluates the model the servers hold once every trainer is done.
    cmd.arg("--dense-on-ps");
    if let Some(dir) = &args.job.tensorboard_dir {
        // Each rank writes DIR/rank<r>.
        cmd.arg("--tensorboard-dir").arg(dir);
    }
    if rank == 0 && !args.job.local_server_pids.is_empty() {
        let pids: Vec<String> = args
            .job
            .local_server_pids
            .iter()
            .map(u32::to_string)
            .collect();
        cmd.arg("--local-server-pids").arg(pids.join(","));
    }
    if args.pin_trainers {
        cmd.args(["--cpus", &(rank % cpus).to_string()]);
    }
    cmd
}

/// The trainers' summaries (`summary-rankN.json` in `run_dir`) as one: samples, steps, bad lines and rows
/// per table summed, the slowest trainer's seconds, the mean training loss, rank 0's evaluations and time
/// report (which holds the local servers' CPU).
fn combine(run_dir: &Path, n: usize) -> anyhow::Result<Summary> {
    let mut combined: Option<Summary> = None;
    for rank in 0..n {
        let path = run_dir.join(format!("summary-rank{rank}.json"));
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let s: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        let num = |k: &str| s[k].as_f64().unwrap_or(0.0);
        let part = Summary {
            samples: num("samples") as u64,
            seconds: num("seconds"),
            samples_per_sec: 0.0,
            train_loss: num("train_loss"),
            auc: None,
            logloss: None,
            oracle_auc: None,
            test_samples: 0,
            calibration: None,
            bad_lines: num("bad_lines") as u64,
            rejected_nonfinite: num("rejected_nonfinite") as u64,
            step: num("step") as u64,
            trainers: 1,
            evals: Vec::new(),
            wire_bytes: num("wire_bytes") as u64,
            progressive: serde_json::from_value(s["progressive"].clone()).unwrap_or_default(),
            failovers: num("failovers") as u64,
            map_changes: num("map_changes") as u64,
            time: serde_json::from_value(s["time"].clone()).unwrap_or_default(),
            table_rows: serde_json::from_value(s["table_rows"].clone()).unwrap_or_default(),
        };
        if rank == 0 {
            let evals = serde_json::from_value(s["evals"].clone()).unwrap_or_default();
            combined = Some(Summary { evals, ..part });
            continue;
        }
        let c = combined.as_mut().expect("rank 0 first");
        c.train_loss =
            (c.train_loss * c.trainers as f64 + part.train_loss) / (c.trainers + 1) as f64;
        c.samples += part.samples;
        c.seconds = c.seconds.max(part.seconds);
        c.bad_lines += part.bad_lines;
        c.rejected_nonfinite += part.rejected_nonfinite;
        c.step += part.step;
        c.wire_bytes += part.wire_bytes;
        c.trainers += 1;
        for (a, b) in c.table_rows.iter_mut().zip(&part.table_rows) {
            a.pulled += b.pulled;
            a.pushed += b.pushed;
        }
    }
    combined.context("no trainer summaries")
}
