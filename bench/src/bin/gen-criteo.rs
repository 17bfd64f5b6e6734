//! `gen-criteo`: writes synthetic Criteo Kaggle-format data (`train.txt` layout) whose labels come from a
//! planted teacher, and optionally the teacher's click probability of every row. See `bench::gen`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use bench::gen::{BagSizes, Encoding, Generator, Sink, VocabScale, WriteError, MLPERF_SIZES_TEXT};
use clap::Parser;

/// Write synthetic Criteo-format rows labelled by a planted teacher.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Number of rows to write.
    #[arg(long)]
    rows: u64,
    /// Seed of the rows (features and label draws).
    #[arg(long)]
    seed: u64,
    /// Seed of the teacher (the click model); keep it fixed across train and test files.
    #[arg(long)]
    teacher_seed: u64,
    /// Output file; gzip if it ends in `.gz`.
    #[arg(long)]
    out: PathBuf,
    /// Also write each row's true click probability here, one per line (gzip if it ends in `.gz`).
    #[arg(long)]
    oracle: Option<PathBuf>,
    /// Worker threads (default: one per core). The output does not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Multiply the vocabularies of the columns with at least 1M values (C3, C4, C12, C16, C21) by X, up to
    /// 2^32 values each; 1 = Criteo's sizes (the default output). See `bench::gen::scale` for how many
    /// distinct values a pass touches.
    #[arg(long, default_value_t = 1)]
    vocab_scale: u64,
    /// Zipf exponent of the scaled columns [default: their own, 1.05-1.08]. Lower spreads a pass over more
    /// values: with 0.8 and --vocab-scale 40, 100M rows touch about 55M distinct C3 values.
    #[arg(long)]
    scaled_zipf: Option<f64>,
    /// Multi-hot rows: 26 comma-separated bag sizes, one per column C1..C26; a column of size n > 1 holds
    /// exactly n `|`-separated tokens per field (drawn from its vocabulary), columns of size 1 stay
    /// one-hot. Bare `--multi-hot` takes MLPerf DLRM-v2's sizes (3,2,1,2,6,...,100,27,10,3,1,1). The teacher
    /// pools each bag's tokens, so the oracle file stays exact.
    #[arg(long, value_name = "SIZES", num_args = 0..=1, default_missing_value = MLPERF_SIZES_TEXT)]
    multi_hot: Option<String>,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen-criteo: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let start = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads.unwrap_or(0))
        .build()
        .context("starting worker threads")?;
    let scale = VocabScale {
        factor: args.vocab_scale,
        exponent: args.scaled_zipf,
    };
    let generator = match &args.multi_hot {
        None => Generator::scaled(args.seed, args.teacher_seed, scale).context("--vocab-scale")?,
        Some(sizes) => {
            let bags = BagSizes::parse(sizes).context("--multi-hot")?;
            Generator::multi_hot(args.seed, args.teacher_seed, scale, bags)
                .context("--vocab-scale")?
        }
    };
    let mut data = open(&args.out)?;
    let mut oracle = args.oracle.as_deref().map(open).transpose()?;
    let summary = pool
        .install(|| generator.write(args.rows, &mut data, oracle.as_mut()))
        .map_err(|e| match e {
            WriteError::Data(e) => anyhow::Error::new(e).context(writing(&args.out)),
            WriteError::Oracle(e) => anyhow::Error::new(e)
                .context(writing(args.oracle.as_deref().unwrap_or(Path::new("")))),
        })?;
    data.finish().with_context(|| writing(&args.out))?;
    if let (Some(sink), Some(path)) = (oracle, &args.oracle) {
        sink.finish().with_context(|| writing(path))?;
    }
    let seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "gen-criteo: {} rows, positive rate {:.4}, {:.2} s, {:.0} rows/s (teacher bias {:.3}, {} threads)",
        summary.rows,
        summary.positive_rate(),
        seconds,
        summary.rows as f64 / seconds.max(1e-9),
        generator.teacher().bias(),
        pool.current_num_threads(),
    );
    Ok(())
}

/// Creates `path` and wraps it in a sink with the encoding its name asks for.
fn open(path: &Path) -> anyhow::Result<Sink<File>> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    Sink::new(file, Encoding::for_path(path)).with_context(|| writing(path))
}

fn writing(path: &Path) -> String {
    format!("writing {}", path.display())
}
