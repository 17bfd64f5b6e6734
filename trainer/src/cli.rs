//! Command line of the `trainer` binary.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::{ClusterArgs, ModelArgs};
use crate::demo::{run_demo, DemoArgs};
use crate::preprocess::{preprocess, PreprocessArgs};
use crate::run::{self, runtime, serve_metrics, Inputs, JobArgs};

/// Trains DLRM on Criteo-format click logs against parameter servers.
#[derive(Debug, Parser)]
#[command(name = "trainer", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate data, start local parameter servers, train, evaluate, stop; no arguments needed.
    Demo(Box<DemoArgs>),
    /// Train against running parameter servers.
    Train(Box<TrainArgs>),
    /// Turn Criteo TSV/CSV (plain, gzip, zstd) into columnar shards that `train` reads memory-mapped.
    Preprocess(PreprocessArgs),
}

#[derive(Debug, clap::Args)]
struct TrainArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Training files or directories (Criteo TSV or Kaggle CSV, plain, gzip or zstd; or preprocessed shards);
    /// `-` reads plain text from standard input, training rows as they arrive until it closes (or until
    /// SIGTERM/SIGINT), one trainer only.
    #[arg(long, alias = "train-data", num_args = 1.., required = true)]
    train: Vec<PathBuf>,
    /// Follow the one training file as it grows (like `tail -F`): rows are trained as they are appended,
    /// and the pass ends on SIGTERM or SIGINT (it trains the rows read, drains its pushes, writes the
    /// checkpoint with --checkpoint-dir, evaluates and prints the summary). Plain text only; not with
    /// --epochs > 1; several trainers (each takes its lines of the file) need --dense-mode async. A file
    /// replaced by a rename is followed from the new file's start; one truncated in place is an error.
    #[arg(long)]
    follow: bool,
    /// Test files or directories for evaluation after training.
    #[arg(long, num_args = 1..)]
    test: Vec<PathBuf>,
    /// This trainer's rank (reads lines with index % world == rank).
    #[arg(long, default_value_t = 0, env = "TRAINER_RANK")]
    rank: usize,
    /// Number of trainers.
    #[arg(long, default_value_t = 1, env = "TRAINER_WORLD")]
    world: usize,
    /// Model and optimizer settings as a TOML file (kebab-case keys, e.g. `batch-size = 4096`); replaces the
    /// model flags.
    #[arg(long)]
    config: Option<PathBuf>,
    /// HTTP address of /metrics, /healthz, /readyz.
    #[arg(long, default_value = "127.0.0.1:0", env = "TRAINER_METRICS_LISTEN")]
    metrics_listen: SocketAddr,
    /// Write the summary as JSON here.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Pin this process (and so all its threads: compute, I/O) to these CPUs, e.g. `0` or `0,1`; the compute
    /// threads are then as many as the CPUs.
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    model: ModelArgs,
}

/// Restricts this process to `cpus` (Linux `sched_setaffinity`); threads started later inherit it, and the
/// thread pools size themselves from it.
pub fn pin_to_cpus(cpus: &[usize]) -> anyhow::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: `set` is a plain bit set owned by this frame; the libc calls only read and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            anyhow::ensure!(c < libc::CPU_SETSIZE as usize, "cpu {c} out of range");
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("pin to cpus {cpus:?}"));
        }
    }
    Ok(())
}

fn run_cli(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Preprocess(args) => {
            print!("{}", preprocess(&args, &args.layout()?)?.render());
            Ok(0)
        }
        Command::Demo(args) => {
            let json = args.summary_json.clone();
            base::sched::set_helper_policy(args.job.helper_threads);
            run::compute_pool();
            let summary = run_demo(*args)?;
            print!("{}", summary.render());
            if let Some(path) = json {
                summary.write_json(&path)?;
            }
            Ok(0)
        }
        Command::Train(args) => {
            let model = match &args.config {
                Some(path) => run::load_model(path)?,
                None => args.model.clone(),
            };
            pin_to_cpus(&args.cpus)?;
            base::sched::set_helper_policy(args.job.helper_threads);
            run::compute_pool();
            let inputs = Inputs {
                train: args.train.clone(),
                test: args.test.clone(),
                rank: args.rank,
                world: args.world,
                follow: args.follow,
            };
            let summary = runtime()?.block_on(async {
                let addr = serve_metrics(args.metrics_listen).await?;
                eprintln!("trainer metrics: http://{addr}/metrics");
                let shutdown = ops::shutdown::signal();
                run::train_and_evaluate(&args.cluster, &model, &inputs, &args.job, shutdown).await
            })?;
            print!("{}", summary.render());
            if let Some(path) = &args.summary_json {
                summary.write_json(path)?;
            }
            Ok(0)
        }
    }
}

/// Entry point of the binary: parses `args`, runs, and returns the exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    ops::logging::init();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match run_cli(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("trainer: error: {e:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--helper-threads` takes `batch` (the default) or `normal`, and refuses anything else naming it.
    #[test]
    fn helper_threads_flag() {
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "trainer",
                "train",
                "--ps",
                "10.0.0.1:1",
                "--tls-dir",
                "t",
                "--train",
                "x",
            ];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        let policy = |cli: Cli| match cli.command {
            Command::Train(a) => a.job.helper_threads,
            _ => unreachable!(),
        };
        assert_eq!(policy(parse(&[]).unwrap()), base::sched::Policy::Batch);
        let normal = parse(&["--helper-threads", "normal"]).unwrap();
        assert_eq!(policy(normal), base::sched::Policy::Normal);
        let e = parse(&["--helper-threads", "idle"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"idle\""), "{e}");
    }
}
