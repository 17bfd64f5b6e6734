//! `trainer demo`: generate Criteo-format data (or use given files), start local parameter servers, train,
//! evaluate, shut the servers down cleanly, and print a summary.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

mod multi;
use crate::config::{ClusterArgs, ModelArgs};
use crate::run::{self, Inputs, JobArgs, Summary};

/// Flags of `trainer demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Training rows to generate.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Test rows to generate.
    #[arg(long, default_value_t = 100_000)]
    pub test_rows: u64,
    /// Parameter-server processes to start.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Directory for generated data (reused when present) and the run's servers, certificates and logs.
    #[arg(long, default_value = "data/demo")]
    pub data_dir: PathBuf,
    /// Train on this Criteo-format file instead of generated data (with --test).
    #[arg(long, requires = "test")]
    pub train: Option<PathBuf>,
    /// Evaluate on this Criteo-format file instead of generated data (with --train).
    #[arg(long, requires = "train")]
    pub test: Option<PathBuf>,
    /// Seed of the generated rows (the test set uses seed + 1).
    #[arg(long, default_value_t = 1)]
    pub data_seed: u64,
    /// Seed of the generator's planted click model.
    #[arg(long, default_value_t = 7)]
    pub teacher_seed: u64,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// HTTP address of the trainer's /metrics.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_listen: SocketAddr,
    /// Trainer processes training one model (rank r of N reads every N-th line; dense parameters on the
    /// servers). With 1, the demo trains in its own process.
    #[arg(long, default_value_t = 1)]
    pub trainers: usize,
    /// Rows each table of each local server keeps in memory (`ps-server --memory-budget-rows`): past it, cold
    /// rows spill to the server's RocksDB and are read back (and prefetched: `--prefetch-distance`) on demand
    /// [default: no budget].
    #[arg(long)]
    pub server_memory_budget_rows: Option<u64>,
    /// One more flag for every local server, repeatable, e.g. `--server-arg=--row-ttl-secs --server-arg=30`
    /// (`ps-server --help` lists them).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Run the trainers as processes (even one) and pin trainer r to CPU r (modulo the CPUs), so each has one
    /// core and one compute thread; the servers are not pinned.
    #[arg(long)]
    pub pin_trainers: bool,
    /// Anneal the dense learning rate over this fraction of the pass's steps, at its end (sets
    /// `--lr-decay-start` and `--lr-decay-steps` from the training rows and the batch size, unless
    /// `--lr-decay-steps` is given; 0 = constant rate).
    #[arg(long, default_value_t = 0.2)]
    pub lr_decay_fraction: f64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub job: JobArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub model: ModelArgs,
}

/// Locates `gen-criteo` next to this binary, building it with cargo when run under cargo and it is missing.
fn gen_criteo() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locate the running binary")?;
    let path = exe.with_file_name("gen-criteo");
    if path.is_file() {
        return Ok(path);
    }
    let Some(cargo) = std::env::var_os("CARGO") else {
        bail!(
            "{} not found: build it with `cargo build --release -p bench` (or `make demo`)",
            path.display()
        );
    };
    let release = exe
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == "release");
    eprintln!("building gen-criteo ...");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "bench", "--bin", "gen-criteo"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("run cargo build")?;
    if !status.success() || !path.is_file() {
        bail!("building gen-criteo failed ({status})");
    }
    Ok(path)
}

/// Generates `rows` rows into `out` (and the oracle probabilities into `oracle`) unless both exist already.
fn generate(
    rows: u64,
    seed: u64,
    teacher_seed: u64,
    multi_hot: Option<&str>,
    out: &Path,
    oracle: &Path,
) -> anyhow::Result<()> {
    if out.is_file() && oracle.is_file() {
        eprintln!("reusing {}", out.display());
        return Ok(());
    }
    let tmp = out.with_extension("tmp");
    let tmp_oracle = oracle.with_extension("tmp-oracle");
    eprintln!("generating {rows} rows into {}", out.display());
    let status = Command::new(gen_criteo()?)
        .args(["--rows", &rows.to_string(), "--seed", &seed.to_string()])
        .args(["--teacher-seed", &teacher_seed.to_string()])
        .args(multi_hot.map(|sizes| format!("--multi-hot={sizes}")))
        .arg("--out")
        .arg(&tmp)
        .arg("--oracle")
        .arg(&tmp_oracle)
        .status()
        .context("run gen-criteo")?;
    if !status.success() {
        bail!("gen-criteo failed ({status})");
    }
    // Renamed only when complete, so an interrupted run is never reused.
    std::fs::rename(&tmp_oracle, oracle)
        .with_context(|| format!("rename to {}", oracle.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("rename to {}", out.display()))?;
    Ok(())
}

/// 64-bit FNV-1a: a stable name for generated files' settings.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Runs the demo; returns the summary (already printed).
pub fn run_demo(mut args: DemoArgs) -> anyhow::Result<Summary> {
    args.model.validate().context("invalid model flags")?;
    let f = args.lr_decay_fraction;
    if !(0.0..=1.0).contains(&f) {
        bail!("--lr-decay-fraction {f}: a fraction of the pass in [0, 1]");
    }
    if args.servers == 0 {
        bail!("--servers 0: at least one parameter server is needed");
    }
    if args.trainers == 0 {
        bail!("--trainers 0: at least one trainer is needed");
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create {}", args.data_dir.display()))?;
    if let Some(dir) = &args.job.tensorboard_dir {
        // Fails before data and servers are made; the trainer creates its event file later.
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--tensorboard-dir {}", dir.display()))?;
    }
    let (train, test, oracle) = match (&args.train, &args.test) {
        (Some(train), Some(test)) => (train.clone(), test.clone(), None),
        _ => {
            let d = &args.data_dir;
            // A multi-hot spec gets fields of as many tokens as its features take (gen-criteo --multi-hot).
            let spec = args.model.spec()?;
            let multi_hot = spec.is_multi_hot().then(|| {
                let mut sizes = vec![1; crate::model::spec::COLUMNS];
                for f in &spec.features {
                    sizes[f.column] = f.tokens;
                }
                sizes
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            });
            let tag = match &multi_hot {
                Some(sizes) => format!("-mh{:08x}", fnv1a(sizes.as_bytes()) as u32),
                None => String::new(),
            };
            let name = |kind: &str, rows: u64, seed: u64, ext: &str| {
                d.join(format!(
                    "{kind}-{rows}-s{seed}-t{}{tag}.{ext}",
                    args.teacher_seed
                ))
            };
            let train = name("train", args.rows, args.data_seed, "tsv");
            let train_oracle = name("train", args.rows, args.data_seed, "oracle");
            let test_seed = args.data_seed + 1;
            let test = name("test", args.test_rows, test_seed, "tsv");
            let test_oracle = name("test", args.test_rows, test_seed, "oracle");
            generate(
                args.rows,
                args.data_seed,
                args.teacher_seed,
                multi_hot.as_deref(),
                &train,
                &train_oracle,
            )?;
            generate(
                args.test_rows,
                test_seed,
                args.teacher_seed,
                multi_hot.as_deref(),
                &test,
                &test_oracle,
            )?;
            (train, test, Some(test_oracle))
        }
    };
    if args.model.lr_decay_steps == 0 && f > 0.0 {
        let rows = match &args.train {
            Some(path) => crate::criteo::count_rows(std::slice::from_ref(path))?,
            None => args.rows,
        };
        // Optimizer steps of the job: in the hybrid mode the trainers share each step (the batch is the global
        // one); in the asynchronous mode each trainer steps through its share of the rows on its own.
        let async_trainers = match args.model.dense_mode {
            crate::config::DenseMode::Async if args.trainers > 1 => args.trainers as u64,
            _ => 1,
        };
        let mut steps = rows
            .div_ceil(async_trainers)
            .div_ceil(args.model.batch_size.max(1) as u64)
            * args.job.epochs();
        if args.job.max_steps > 0 {
            steps = steps.min(args.job.max_steps);
        }
        let decay = ((steps as f64 * f).round() as u64).max(1);
        args.model.lr_decay_start = steps.saturating_sub(decay);
        args.model.lr_decay_steps = decay;
        eprintln!(
            "dense learning rate: constant for {} steps, then decaying to 0 over the last {decay} (--lr-decay-fraction {f})",
            args.model.lr_decay_start
        );
    }

    let run_dir = args.data_dir.join("run");
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)
            .with_context(|| format!("clear {}", run_dir.display()))?;
    }
    eprintln!(
        "starting {} parameter servers (logs in {})",
        args.servers,
        run_dir.display()
    );
    let mut server_flags: Vec<String> = match args.server_memory_budget_rows {
        Some(rows) => vec!["--memory-budget-rows".into(), rows.to_string()],
        None => Vec::new(),
    };
    server_flags.extend(args.server_args.iter().cloned());
    // The demo's servers write the job's snapshots (`--checkpoint-dir DIR` puts them in DIR/ps) and exports:
    // their checkpoint root is the folder that holds those, as an operator would set it.
    let roots: Vec<&std::path::Path> = [&args.job.checkpoint_dir, &args.job.export_dir]
        .into_iter()
        .flatten()
        .map(|d| d.as_path())
        .collect();
    if let Some(root) = common_root(&roots) {
        server_flags.extend(["--checkpoint-root".into(), root.display().to_string()]);
    }
    let cluster = local_cluster::LocalCluster::start(args.servers, &run_dir, &server_flags)?;
    for (i, (q, m)) in cluster.quic.iter().zip(&cluster.metrics).enumerate() {
        eprintln!("  ps-server {i}: quic {q}, metrics http://{m}/metrics");
    }
    // The summary reports the servers' CPU seconds beside the trainer's.
    args.job.local_server_pids = cluster.pids();
    let cluster_args = ClusterArgs {
        ps: cluster.quic.iter().map(|a| a.to_string()).collect(),
        tls_dir: cluster.tls_dir.clone(),
        server_name: protocol::transport::tls::DEFAULT_SERVER_NAME.into(),
        resolve_timeout_secs: 0.0,
        transport: protocol::Transport::default(),
        read_from_backups: false,
    };
    let inputs = Inputs {
        train: vec![train],
        test: vec![test.clone()],
        rank: 0,
        world: 1,
        follow: false,
    };
    let runtime = crate::run::runtime()?;
    let mut summary = if args.trainers > 1 || args.pin_trainers {
        let summary = multi::run(&args, &cluster_args, &inputs, &run_dir)?;
        runtime.block_on(async {
            eprintln!("evaluating the servers' model on {}", test.display());
            let eval = run::evaluate_on_servers(&cluster_args, &args.model, &inputs.test).await?;
            let mut summary = summary;
            let step = summary.step;
            summary.apply_eval(step, &eval);
            eprintln!("eval (final, after every trainer): {}", eval.render());
            if let Some(dir) = &args.job.tensorboard_dir {
                // The ranks' own logs are in DIR/rank<r>; the combined run's goes into DIR.
                let tables = args
                    .model
                    .spec()?
                    .tables
                    .iter()
                    .map(|t| t.name.clone())
                    .collect();
                let mut tb = crate::tensorboard::TrainLog::create(dir, tables)?;
                tb.eval(step, &eval);
                tb.summary(
                    summary.step,
                    summary.samples_per_sec,
                    summary.train_loss,
                    &summary.time,
                );
            }
            anyhow::Ok(summary)
        })?
    } else {
        runtime.block_on(async {
            let addr = crate::run::serve_metrics(args.metrics_listen).await?;
            eprintln!("  trainer: metrics http://{addr}/metrics");
            let shutdown = std::future::pending(); // not a stream: the pass ends with its data
            run::train_and_evaluate(&cluster_args, &args.model, &inputs, &args.job, shutdown).await
        })?
    };
    eprintln!("stopping parameter servers");
    cluster.shutdown(Duration::from_secs(60))?;
    if let Some(oracle) = oracle {
        summary.oracle_auc = run::oracle_auc(&test, &oracle)?;
    }
    Ok(summary)
}

/// The deepest folder holding every path of `paths` (made absolute against the working directory), if any.
fn common_root(paths: &[&std::path::Path]) -> Option<std::path::PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    let mut abs = paths.iter().map(|p| cwd.join(p));
    let mut root = abs.next()?;
    for p in abs {
        while !p.starts_with(&root) {
            root = root.parent()?.to_path_buf();
        }
    }
    Some(root)
}
